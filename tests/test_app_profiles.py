"""The Profiles page decides: per scope, TopRank's winner starred on the chart, a winner table with margin
and win frequency, a rank / 1 - cosine (log) / dPPL view, hovers with both statistics and their
intervals, FullKV perplexity as metrics. A real small profile of the demo model in the workspace."""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import pytest

from polykv.routing.confidence import NOISE_WARNING, route_confidence
from tests.helpers import open_app, texts


@pytest.fixture
def profile(app_env, demo_model):
    from polykv.profile.build import build_profile
    from polykv.profile.corpus import CorpusSpec

    model, tokenizer = demo_model
    spec = CorpusSpec(num_sequences=2, max_tokens=128)
    return build_profile("demo", model, tokenizer, app_env / "ws" / "profiles", spec)


def array(value) -> np.ndarray:
    """A figure spec's array: a plain list, or plotly's typed array ({dtype, bdata, shape}, base64)."""
    if isinstance(value, dict):
        shape = [int(n) for n in str(value.get("shape", "-1")).split(",")]
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).reshape(shape).astype(float)
    return np.array(value, dtype=float)


def scope_charts(at, profile) -> dict[str, dict]:
    """{scope: the scope's decision chart spec}: the page draws one per scope, in order, then entropy."""
    specs = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    assert len(specs) == len(profile.meta.scopes) + 1, [s["layout"]["title"]["text"] for s in specs]
    return dict(zip(profile.meta.scopes, specs))


@pytest.mark.slow  # the page in every view
def test_profiles_page_marks_winners_shows_the_winner_table_and_switches_views(profile):
    at = open_app("profiles")
    assert texts(at.title) == ["Method profiles"] and not at.error
    assert [s.value for s in at.subheader] == list(profile.meta.scopes)

    # FullKV perplexity: one metric per source
    metrics = {m.label: m.value for m in at.metric}
    for source, ppl in profile.meta.fullkv_ppl.items():
        assert metrics[f"FullKV perplexity · {source}"] == f"{ppl:.2f}"

    # default: ranked by cosine; each scope's winners starred where route_confidence puts them
    assert at.radio(key="profile_statistic").value == "cosine" and at.radio(key="profile_view").value == "rank"
    tables = at.dataframe[: len(profile.meta.scopes)]  # the winner tables, then the raw table in the expander
    for (scope, spec), table in zip(scope_charts(at, profile).items(), tables):
        confidence = route_confidence(profile, scope, "cosine")
        grid, stars = spec["data"]
        assert grid["type"] == "heatmap" and "knorm" in grid["x"]
        assert stars["marker"]["symbol"] == "star"
        layers = array(stars["customdata"]).astype(int).tolist()
        assert list(zip(stars["x"], layers)) == list(zip(confidence["winner"], confidence["layer"]))
        outlines = [(s["x0"] + 0.5, s["y0"] + 0.5) for s in spec["layout"]["shapes"]]  # the winners' cells, outlined
        assert outlines == [(grid["x"].index(w), layer) for w, layer in zip(confidence["winner"], confidence["layer"])]
        assert "win frequency" in stars["hovertext"][0] and "margin" in stars["hovertext"][0]
        ranks = array(grid["z"])
        assert np.nanmin(ranks, axis=1).tolist() == [1.0] * profile.num_layers  # rank 1 = best in each layer
        for row, winner in zip(grid["customdata"], confidence["winner"]):  # the star's cell is of rank 1
            assert "rank 1 by cosine · TopRank winner" in row[grid["x"].index(winner)]
        # the hover gives both statistics, each with its interval, and the rank
        hover = grid["customdata"][0][0]
        cell = profile.table.set_index(["scope", "layer", "method"]).loc[(scope, 0, grid["x"][0])]
        assert f"cosine {cell.cosine:.6f} 95% [{cell.cosine_low:.6f}, {cell.cosine_high:.6f}]" in hover
        assert f"dPPL {cell.dppl:+.3f} 95% [{cell.dppl_low:+.3f}, {cell.dppl_high:+.3f}]" in hover
        assert "rank " in hover
        # the winner table is route_confidence's
        shown = table.value
        assert list(shown.columns) == ["layer", "winner", "runner-up", "margin", "win frequency"]
        assert list(shown["winner"]) == list(confidence["winner"])
        assert list(shown["runner-up"]) == list(confidence["runner_up"])
        assert shown["win frequency"].tolist() == pytest.approx(confidence["win_frequency"].tolist())

    # the log view draws log10(1 - cosine)
    at.radio(key="profile_view").set_value("1 - cosine (log)").run()
    assert not at.exception and not at.error
    for scope, spec in scope_charts(at, profile).items():
        grid = spec["data"][0]
        rows = profile.table[profile.table["scope"] == scope].set_index(["layer", "method"])["cosine"]
        expected = [[math.log10(max(1 - rows[(layer, m)], 1e-9)) for m in grid["x"]] for layer in grid["y"]]
        assert array(grid["z"]) == pytest.approx(np.array(expected))
        assert grid["colorbar"]["title"]["text"] == "1 - cosine"

    # dPPL view and the dPPL statistic: the winners follow route_confidence by dPPL
    at.radio(key="profile_view").set_value("dPPL").run()
    at.radio(key="profile_statistic").set_value("dppl").run()
    assert not at.exception and not at.error
    for scope, spec in scope_charts(at, profile).items():
        grid, stars = spec["data"]
        assert grid["zmid"] == 0.0 and grid["colorbar"]["title"]["text"] == "dPPL"
        assert list(stars["x"]) == list(route_confidence(profile, scope, "dppl")["winner"])
        assert "by dppl" in spec["layout"]["title"]["text"]


def test_profiles_page_warns_of_a_noisy_route_and_explains_missing_win_frequencies(profile, monkeypatch):
    at = open_app("profiles")
    assert not any(NOISE_WARNING in w for w in texts(at.warning))  # 2 sequences, median win frequency ~0.75
    # ... but 2 sequences are too few for any win frequency to be evidence: said for every scope
    few = [w for w in texts(at.warning) if "only 2 calibration sequence(s)" in w]
    assert [w.split(":")[0] for w in few] == list(profile.meta.scopes)

    monkeypatch.setattr("polykv.routing.confidence.NOISY_ROUTE", 1.01)  # now every route counts as noisy
    at.run()
    noisy = [w for w in texts(at.warning) if NOISE_WARNING in w]
    assert [w.split(":")[0] for w in noisy] == list(profile.meta.scopes)

    # a profile saved without per-sequence values: no win frequencies (one line), the winners still starred
    (profile.path / "sequences.csv").unlink()
    at.run()
    assert not at.exception and not at.error
    assert all("no per-sequence values" in i for i in texts(at.info)) and len(at.info) == len(profile.meta.scopes)
    assert len(at.dataframe) == 1  # only the raw table: no winner tables
    for spec in scope_charts(at, profile).values():
        assert spec["data"][1]["marker"]["symbol"] == "star" and len(spec["data"][1]["x"]) == profile.num_layers


def test_a_workload_profile_offers_danswer_and_ranks_its_winners_by_it(app_env, demo_model):
    from polykv.eval.workloads.workload import workload_corpus
    from polykv.plan import Phase
    from polykv.profile.build import build_profile
    from polykv.profile.corpus import CorpusSpec

    model, tokenizer = demo_model
    spec = CorpusSpec(sources=("ruler:niah_single_1@512",), num_sequences=2, max_tokens=512)
    corpus = workload_corpus(tokenizer, model, spec)
    workload = build_profile(
        "demo", model, tokenizer, app_env / "ws" / "profiles", spec, 64, (Phase.DECODE,), workload=corpus
    )
    at = open_app("profiles")
    statistic = at.radio(key="profile_statistic")
    assert statistic.options == ["cosine", "dPPL", "danswer"]
    statistic.set_value("danswer")
    at.run()
    assert not at.exception and not at.error, texts(at.error)
    (table, *_) = at.dataframe
    assert list(table.value["winner"]) == list(route_confidence(workload, "decode", "danswer")["winner"])

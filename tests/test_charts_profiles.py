"""The profile decision chart (pure figures) and the ranked cells it draws, on hand-made profiles."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from app import charts
from app.charts.profiles import COSINE_GAP_FLOOR, STAR_OFFSET
from polykv.methods import for_phase
from polykv.plan import FULL, Phase
from polykv.profile.profiler import PROFILE_REVISION, profiled_methods
from polykv.profile.store import Profile
from polykv.routing.confidence import CELL_COLUMNS, ranked_cells, route_confidence

T = 4  # continuation tokens per sequence
DECODE = for_phase(Phase.DECODE)
PREFILL_ONLY = next(m for m in for_phase(Phase.PREFILL) if m not in DECODE)


def table_of(cells: dict[tuple[int, str], tuple[float, float]], intervals: bool = True) -> pd.DataFrame:
    """{(layer, method): (cosine, dppl)} -> a decode profile table with FullKV rows (and intervals of
    +-0.001 cosine, +-0.5 dPPL around each value)."""
    rows = [{"layer": l, "scope": "decode", "method": m, "cosine": c, "dppl": d} for (l, m), (c, d) in cells.items()]
    rows += [{"layer": l, "scope": "decode", "method": FULL, "cosine": 1.0, "dppl": 0.0} for l in {l for l, _ in cells}]
    table = pd.DataFrame(rows)
    if intervals:
        table["cosine_low"], table["cosine_high"] = table["cosine"] - 0.001, table["cosine"] + 0.001
        table["dppl_low"], table["dppl_high"] = table["dppl"] - 0.5, table["dppl"] + 0.5
    return table


def test_ranked_cells_rank_each_layer_by_the_statistic_ties_sharing_the_better_rank():
    a, b, c = DECODE[:3]  # registry order: a before b before c
    table = table_of(
        {
            (0, a): (0.99, 2.0),
            (0, b): (0.999, 1.0),
            (0, c): (0.9, -1.0),
            (1, a): (0.95, 0.5),
            (1, b): (0.95, 0.5),  # tied with a on both statistics
            (1, c): (0.97, 0.7),
        }
    )
    cosine = ranked_cells(table, "decode", "cosine")
    assert list(cosine.columns) == CELL_COLUMNS and FULL not in set(cosine["method"])
    assert list(cosine["method"]) == [a, b, c, a, b, c]  # registry order within each layer
    assert list(cosine["rank"]) == [2, 1, 3, 2, 2, 1]
    assert list(cosine.loc[cosine["winner"], "method"]) == [b, c]
    dppl = ranked_cells(table, "decode", "dppl")  # lower is better
    assert list(dppl["rank"]) == [3, 2, 1, 1, 1, 3]
    # a tie goes to the earlier method, as TopRank breaks it: one winner per layer, of rank 1
    assert list(dppl.loc[dppl["winner"], "method"]) == [c, a]
    assert dppl.groupby("layer")["winner"].sum().tolist() == [1, 1]


def test_ranked_cells_leave_out_what_cannot_run_and_fill_missing_intervals():
    a, b = DECODE[:2]
    table = table_of({(0, a): (0.9, 1.0), (0, b): (0.8, 2.0), (0, PREFILL_ONLY): (0.99, -5.0)}, intervals=False)
    cells = ranked_cells(table, "decode", "cosine").set_index("method")
    assert math.isnan(cells.loc[PREFILL_ONLY, "rank"]) and not cells.loc[PREFILL_ONLY, "winner"]
    assert cells.loc[a, "rank"] == 1 and cells.loc[a, "winner"]
    assert cells[["cosine_low", "cosine_high", "dppl_low", "dppl_high"]].isna().all().all()
    with pytest.raises(ValueError, match="no prefill rows"):
        ranked_cells(table, "prefill", "cosine")
    with pytest.raises(ValueError, match="unknown statistic"):
        ranked_cells(table, "decode", "kl")


def test_rank_view_draws_the_ranks_and_hovers_give_both_statistics_with_intervals():
    a, b = DECODE[:2]
    table = table_of({(0, a): (0.99, 2.0), (0, b): (0.999, 1.0), (1, a): (0.98, -1.0), (1, b): (0.97, 3.0)})
    cells = ranked_cells(table, "decode", "cosine")
    fig = charts.profile_decision_figure(cells, "decode", "rank", "cosine")
    grid = fig.data[0]
    assert grid.type == "heatmap" and list(grid.x) == [a, b] and list(grid.y) == [0, 1]
    assert np.array(grid.z).tolist() == [[2, 1], [1, 2]]
    assert np.array(grid.text).tolist() == [["2", "1"], ["1", "2"]]
    hover = grid.customdata[0][1]  # layer 0, b
    assert f"layer 0, {b}" in hover
    assert "cosine 0.999000 95% [0.998000, 1.000000]" in hover
    assert "dPPL +1.000 95% [+0.500, +1.500]" in hover
    assert "rank 1 by cosine" in hover and "TopRank winner" in hover
    assert "TopRank winner" not in grid.customdata[0][0]
    no_intervals = ranked_cells(table.drop(columns=["cosine_low", "cosine_high", "dppl_low", "dppl_high"]), "decode")
    assert (
        "95% not estimable"
        in charts.profile_decision_figure(no_intervals, "decode", "rank", "cosine").data[0].customdata[0][0]
    )
    with pytest.raises(ValueError, match="unknown view"):
        charts.profile_decision_figure(cells, "decode", "cosine", "cosine")


def hand_profile(cosines: dict[tuple[int, str], list[float]], layers: int) -> Profile:
    """A current in-memory decode profile: the given per-sequence cosines (0.0 for every other decode
    method), every NLL equal to FullKV's."""
    n = len(next(iter(cosines.values())))
    methods = [FULL, *DECODE]
    sequences = pd.DataFrame(
        [
            {"layer": l, "scope": "decode", "method": m, "sequence": k, "cosine": c, "nll": 10.0}
            for l in range(layers)
            for m in methods
            for k, c in enumerate(cosines.get((l, m), [1.0 if m == FULL else 0.0] * n))
        ]
    )
    table = sequences.groupby(["layer", "scope", "method"], as_index=False).agg(cosine=("cosine", "mean"))
    table["dppl"] = 0.0
    metadata = {
        "key": "hand",
        "model": "demo",
        "num_layers": layers,
        "capacity": 8,
        "scopes": ["decode"],
        "continuation": T,
        "methods": profiled_methods([Phase.DECODE]),
        "profile_revision": PROFILE_REVISION,
        "corpus": {"num_sequences": n},
    }
    reference = pd.DataFrame({"sequence": range(n), "source": ["model"] * n, "nll": [10.0] * n})
    layer_frame = pd.DataFrame({"layer": range(layers), "entropy": [1.0] * layers})
    return Profile(metadata, table, layer_frame, sequences=sequences, reference=reference)


def test_winner_stars_sit_where_route_confidence_says_and_carry_margin_and_win_frequency():
    a, b, c = DECODE[:3]
    profile = hand_profile(
        {(0, a): [0.9, 0.8], (0, b): [0.5, 0.4], (1, b): [0.9, 0.5], (1, c): [0.6, 0.7], (2, c): [0.3, 0.3]}, layers=3
    )
    confidence = route_confidence(profile, "decode", "cosine", replicates=200)
    assert list(confidence["winner"]) == [a, b, c]
    fig = charts.profile_decision_figure(ranked_cells(profile.table, "decode"), "decode", "rank", "cosine", confidence)
    stars = fig.data[1]
    assert stars.type == "scatter" and stars.marker.symbol == "star"
    assert list(zip(stars.x, stars.customdata)) == [(a, 0), (b, 1), (c, 2)]  # customdata: the layer
    assert list(stars.y) == pytest.approx([-STAR_OFFSET, 1 - STAR_OFFSET, 2 - STAR_OFFSET])  # above the number
    methods = list(fig.data[0].x)
    outlines = [(s.type, s.x0 + 0.5, s.x1 - 0.5, s.y0 + 0.5, s.y1 - 0.5) for s in fig.layout.shapes]
    assert outlines == [
        ("rect", methods.index(m), methods.index(m), layer, layer) for m, layer in ((a, 0), (b, 1), (c, 2))
    ]
    row = confidence.iloc[1]
    assert f"runner-up {row.runner_up}, margin {row.margin:.3g} cosine" in stars.hovertext[1]
    assert f"win frequency {row.win_frequency:.0%}" in stars.hovertext[1]
    # without a confidence frame the stars come from the cells' TopRank winners
    plain = charts.profile_decision_figure(ranked_cells(profile.table, "decode"), "decode", "rank", "cosine")
    assert list(zip(plain.data[1].x, plain.data[1].customdata)) == [(a, 0), (b, 1), (c, 2)]


def test_log_view_draws_one_minus_cosine_in_decades_and_floors_an_exact_match():
    a, b = DECODE[:2]
    table = table_of({(0, a): (0.999, 0.0), (0, b): (1.0, 0.0), (1, a): (0.99999, 0.0), (1, b): (0.9, 0.0)})
    fig = charts.profile_decision_figure(ranked_cells(table, "decode"), "decode", "1 - cosine (log)", "cosine")
    z = np.array(fig.data[0].z, dtype=float)
    assert z[0, 0] == pytest.approx(-3) and z[1, 0] == pytest.approx(-5, abs=1e-4) and z[1, 1] == pytest.approx(-1)
    assert z[0, 1] == pytest.approx(math.log10(COSINE_GAP_FLOOR))  # cosine 1: drawn at the floor, not -inf
    bar = fig.data[0].colorbar
    assert list(bar.tickvals) == list(range(-9, 0)) and bar.ticktext[0] == "1e-9" and bar.title.text == "1 - cosine"
    assert (
        fig.data[0].colorscale
        == charts.profile_decision_figure(ranked_cells(table, "decode"), "decode", "rank", "cosine").data[0].colorscale
    )  # lower is better in both: the best cells look alike
    dppl = charts.profile_decision_figure(ranked_cells(table, "decode"), "decode", "dPPL", "cosine")
    assert dppl.data[0].zmid == 0.0 and dppl.data[0].colorbar.title.text == "dPPL"

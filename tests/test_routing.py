"""Routing: TopRank, the profile score, capacity allocators, budget rescaling, random placements."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from polykv.methods import REGISTRY, validate_plan
from polykv.plan import FULL, Phase, Plan, PlanError, Scope
from polykv.routing import (
    allocate_entropy,
    allocate_ppl,
    allocate_uniform,
    plan_from_route,
    ppl_sensitivity,
    route_score,
    sample_placements,
    scale_budget,
    toprank,
)
from tests.helpers import REPO

NAN = math.nan


def profile(rows: dict[tuple[int, str, str], tuple[float, float]]) -> pd.DataFrame:
    """{(layer, scope, method): (cosine, dppl)} -> a profile table."""
    return pd.DataFrame(
        [{"layer": l, "scope": s, "method": m, "cosine": c, "dppl": d} for (l, s, m), (c, d) in rows.items()]
    )


def hand_profile() -> pd.DataFrame:
    return profile(
        {
            # layer 0, prefill: h2o and tova tie on cosine (h2o comes first in the registry); full is best but
            # is the reference; an unregistered method scores higher still.
            (0, "prefill", "full"): (1.0, 0.0),
            (0, "prefill", "streamingllm"): (0.90, 0.50),
            (0, "prefill", "h2o"): (0.95, 0.30),
            (0, "prefill", "tova"): (0.95, 0.20),
            (0, "prefill", "magic"): (0.99, 0.01),
            # layer 1, prefill: snapkv supports prefill and wins; tova's NaN is never chosen.
            (1, "prefill", "streamingllm"): (0.80, 0.90),
            (1, "prefill", "snapkv"): (0.97, 0.40),
            (1, "prefill", "tova"): (NAN, NAN),
            (1, "prefill", "cake"): (0.96, 0.10),
            # layer 2, prefill
            (2, "prefill", "streamingllm"): (0.70, 0.60),
            (2, "prefill", "h2o"): (0.60, 0.70),
            # decode: snapkv has the best scores everywhere but does not support decode.
            (0, "decode", "full"): (1.0, 0.0),
            (0, "decode", "snapkv"): (0.999, -1.0),
            (0, "decode", "streamingllm"): (0.90, 0.40),
            (0, "decode", "tova"): (0.98, 0.30),
            (0, "decode", "d2o"): (0.98, 0.30),
            (1, "decode", "snapkv"): (0.999, -1.0),
            (1, "decode", "streamingllm"): (0.85, 0.45),
            (1, "decode", "d2o"): (0.93, 0.05),
            (1, "decode", "cam"): (0.92, 0.10),
            (2, "decode", "snapkv"): (0.999, -1.0),
            (2, "decode", "streamingllm"): (0.95, 0.20),
            (2, "decode", "h2o"): (0.94, 0.25),
        }
    )


# ---- TopRank -------------------------------------------------------------------------------------
def test_registry_order_used_by_the_tie_tests():
    # The hand profile's ties (layer 0: h2o = tova at prefill, tova = d2o at decode) go to the method
    # listed first in the registry: neither to the first row of the table nor by name (d2o < tova).
    order = list(REGISTRY)
    assert order.index("h2o") < order.index("tova") < order.index("d2o")
    table = hand_profile()
    ties = [
        ("prefill", "cosine", "h2o", "tova"),
        ("decode", "cosine", "tova", "d2o"),
        ("decode", "dppl", "tova", "d2o"),
    ]
    for scope, statistic, first, second in ties:
        layer0 = table[(table.layer == 0) & (table.scope == scope)].set_index("method")[statistic]
        assert layer0[first] == layer0[second], (scope, statistic)  # a real tie
        others = layer0.drop([first, second, FULL, "magic"], errors="ignore")  # no other compatible method is better
        better = others[others > layer0[first]] if statistic == "cosine" else others[others < layer0[first]]
        assert all(Phase(scope) not in REGISTRY[m].phases for m in better.index), (scope, statistic)
        for rows in (table, table.iloc[::-1]):  # in either row order
            assert toprank(rows, scope, statistic)[0] == first, (scope, statistic)


def test_toprank_cosine():
    table = hand_profile()
    assert toprank(table, "prefill") == ["h2o", "snapkv", "streamingllm"]
    # snapkv never leads in decode; the tova / d2o tie goes to the earlier registry entry (tova).
    assert toprank(table, Phase.DECODE, "cosine") == ["tova", "d2o", "streamingllm"]


def test_toprank_dppl_lower_is_better():
    table = hand_profile()
    assert toprank(table, "prefill", "dppl") == ["tova", "cake", "streamingllm"]
    assert toprank(table, "decode", "dppl") == ["tova", "d2o", "streamingllm"]


def test_toprank_never_picks_full_or_incompatible_methods():
    table = hand_profile()
    for scope in ("prefill", "decode"):
        for statistic in ("cosine", "dppl"):
            route = toprank(table, scope, statistic)
            assert FULL not in route and "magic" not in route
            assert all(Phase(scope) in REGISTRY[m].phases for m in route)


def test_toprank_errors():
    table = hand_profile()
    with pytest.raises(ValueError, match="unknown statistic 'ppl'"):
        toprank(table, "prefill", "ppl")
    with pytest.raises(ValueError, match="scope must be 'prefill' or 'decode'"):
        toprank(table, "both")
    with pytest.raises(ValueError, match="toprank: layer 3 has no prefill row") as err:
        toprank(table, "prefill", num_layers=4)
    assert "\n" not in str(err.value)
    only_bad = profile(
        {(0, "decode", "full"): (1.0, 0.0), (0, "decode", "snapkv"): (0.9, 0.1), (0, "decode", "h2o"): (NAN, NAN)}
    )
    with pytest.raises(ValueError, match="layer 0 has no decode row"):
        toprank(only_bad, "decode")


# ---- profile score -------------------------------------------------------------------------------
def test_route_score_by_hand():
    table = hand_profile()
    assert route_score(["streamingllm"] * 3, table, "prefill") == 0.0
    expected = (0.95 - 0.90) + (0.97 - 0.80) + (0.60 - 0.70)
    assert route_score(["h2o", "snapkv", "h2o"], table, "prefill") == pytest.approx(expected)
    # dppl: sign -1, so a route that lowers perplexity change scores positive.
    expected = -((0.30 - 0.40) + (0.05 - 0.45) + (0.25 - 0.20))
    assert route_score(["tova", "d2o", "h2o"], table, "decode", "dppl") == pytest.approx(expected)
    assert route_score(["tova"], table, "decode", reference="d2o") == 0.0  # a tie with the reference
    with pytest.raises(ValueError, match="no decode dppl for layer 1, method 'tova'"):  # the reference row is missing
        route_score(["tova", "d2o", "h2o"], table, "decode", "dppl", reference="tova")
    with pytest.raises(ValueError, match="no decode cosine for layer 1, method 'tova'"):
        route_score(["tova", "tova", "h2o"], table, "decode")
    with pytest.raises(ValueError, match="layer 1, method 'tova'"):  # NaN counts as missing
        route_score(["h2o", "tova", "h2o"], table, "prefill")


# ---- capacity allocators -------------------------------------------------------------------------
def assert_order_preserved(scores, budgets):
    for i in range(len(scores)):
        for j in range(len(scores)):
            if scores[i] > scores[j]:
                assert budgets[i] >= budgets[j], (i, j, scores, budgets)


def test_allocate_uniform():
    assert allocate_uniform(4, 64) == [64] * 4
    assert allocate_uniform(32, 128, minimum=8) == [128] * 32
    budgets = allocate_uniform(2, 64.5)
    assert sum(budgets) == 129 and sorted(budgets) == [64, 65]
    with pytest.raises(ValueError, match="not a whole number"):
        allocate_uniform(3, 64.5)
    with pytest.raises(ValueError, match="cannot split"):
        allocate_uniform(4, 8, minimum=9)


@pytest.mark.parametrize("average, minimum", [(64, 1), (128, 16), (17, 8), (8, 8)])
def test_allocate_entropy(average, minimum):
    entropy = np.random.default_rng(0).gamma(2.0, size=32).tolist()
    entropy[5] = entropy[6] = 0.0  # near-zero layers must still reach the minimum
    budgets = allocate_entropy(entropy, average, minimum)
    assert sum(budgets) == 32 * average
    assert min(budgets) >= minimum
    assert all(isinstance(b, int) for b in budgets)
    assert_order_preserved(entropy, budgets)
    assert allocate_entropy([10 * h for h in entropy], average, minimum) == budgets
    assert allocate_entropy([h / 7 for h in entropy], average, minimum) == budgets


def test_allocate_entropy_is_proportional():
    assert allocate_entropy([1.0, 2.0, 1.0], 40) == [30, 60, 30]
    with pytest.raises(ValueError, match="non-finite"):
        allocate_entropy([1.0, NAN], 8)


def ppl_profile(worst: list[float]) -> pd.DataFrame:
    rows = {}
    for layer, d in enumerate(worst):
        rows[(layer, "decode", "full")] = (1.0, 100.0)  # the reference never counts
        rows[(layer, "decode", "tova")] = (0.9, d)
        rows[(layer, "decode", "h2o")] = (0.9, d / 2)
        rows[(layer, "prefill", "tova")] = (0.9, 1000.0)  # another scope never counts
    return profile(rows)


def test_ppl_sensitivity_clips_the_outlier_at_q95():
    worst = [0.1, 0.2, 0.3, 0.4, 10.0]
    q = np.quantile(np.array(worst), 0.95)  # linear: 0.4 + 0.8 * (10.0 - 0.4)
    assert q == pytest.approx(8.08)
    assert ppl_sensitivity(ppl_profile(worst), "decode") == pytest.approx([0.1, 0.2, 0.3, 0.4, q])


@pytest.mark.parametrize("average, minimum", [(64, 1), (32, 4), (10, 10)])
def test_allocate_ppl(average, minimum):
    worst = np.random.default_rng(1).exponential(size=32).tolist()
    worst[3] = 50.0
    table = ppl_profile(worst)
    budgets = allocate_ppl(table, "decode", average, minimum)
    assert sum(budgets) == 32 * average and min(budgets) >= minimum
    assert_order_preserved(ppl_sensitivity(table, "decode"), budgets)
    assert_order_preserved(worst, budgets)  # clipping is monotone
    assert allocate_ppl(ppl_profile([10 * w for w in worst]), "decode", average, minimum) == budgets


def test_ppl_sensitivity_needs_every_layer():
    table = ppl_profile([0.1, 0.2, 0.3])
    table = table[~((table["layer"] == 1) & (table["scope"] == "decode") & (table["method"] != FULL))]
    with pytest.raises(ValueError, match="layer 1 has no decode dppl row"):
        ppl_sensitivity(table, "decode")


# ---- plans ---------------------------------------------------------------------------------------
def routed_plan() -> Plan:
    return plan_from_route(
        ["snapkv", "tova", "h2o", "streamingllm"],
        ["tova", "full", "d2o", "streamingllm"],
        [64, 256, 128, 64],
        [100, None, 50, 50],
        scope="both",
        name="routed",
        description="test route",
        params={"snapkv": {"window": 32}, "h2o": {"heavy_ratio": 0.25}, "streamingllm": {"sinks": 4}},
    )


def test_plan_from_route():
    plan = routed_plan()
    assert plan.scope is Scope.BOTH and plan.num_layers == 4
    assert [layer.prefill.method for layer in plan.layers] == ["snapkv", "tova", "h2o", "streamingllm"]
    assert plan.layers[1].decode.method == FULL and plan.layers[1].decode.capacity is None
    assert plan.layers[0].prefill.params == {"window": 32} and plan.layers[2].prefill.params == {"heavy_ratio": 0.25}
    assert plan.layers[3].decode.params == {"sinks": 4} and plan.layers[0].decode.params == {}
    assert plan.provenance == {"built_by": "plan_from_route"}

    decode_only = plan_from_route(None, ["tova", "full"], None, [16, 7], "decode", "d", provenance={"route": "toprank"})
    assert all(layer.prefill.method == FULL for layer in decode_only.layers)
    assert decode_only.layers[1].decode.capacity is None and decode_only.provenance == {"route": "toprank"}

    with pytest.raises(PlanError, match="layer 0, decode, method: 'snapkv' does not support the decode phase"):
        plan_from_route(None, ["snapkv", "tova"], None, [16, 16], "decode", "bad")
    with pytest.raises(ValueError, match="needs a prefill route"):
        plan_from_route(None, ["tova"], None, [16], "both", "bad")
    with pytest.raises(ValueError, match="differ in length"):
        plan_from_route(["tova"], ["tova", "tova"], [8], [8, 8], "both", "bad")


def test_scale_budget_keeps_route_and_params():
    plan = routed_plan()
    small = scale_budget(plan, 16)
    validate_plan(small, 4)  # snapkv's window (32) and the sinks (4) still fit
    for old, new in zip(plan.layers, small.layers):
        for phase in Phase:
            assert new[phase].method == old[phase].method and new[phase].params == old[phase].params
    prefill = [layer.prefill.capacity for layer in small.layers]
    assert sum(prefill) == 4 * 16
    # proportional would give snapkv 8 and streamingllm 8; they are held at window + 1 and sinks + 1
    assert prefill == [33, 17, 9, 5]
    decode = [layer.decode.capacity for layer in small.layers]
    assert decode == [24, None, 12, 12]  # the full layer stays full; the bounded layers average 16
    assert small.summary().phases[Phase.DECODE].average_capacity == 16
    assert small.name == "routed-b16"
    assert small.provenance["source"] == "routed" and small.provenance["average"] == 16
    assert small.provenance["source_provenance"] == plan.provenance

    big = scale_budget(plan, 512, name="big")
    assert [layer.prefill.capacity for layer in big.layers] == [256, 1024, 512, 256]
    assert big.name == "big" and sum(layer.decode.capacity or 0 for layer in big.layers) == 3 * 512


def test_scale_budget_homogeneous_and_minimum():
    plan = Plan.homogeneous("snapkv", 128, num_layers=32, scope="prefill")
    scaled = scale_budget(plan, 64)
    assert [layer.prefill.capacity for layer in scaled.layers] == [64] * 32
    assert all(layer.decode.method == FULL for layer in scaled.layers)
    validate_plan(scaled, 32)
    with pytest.raises(ValueError, match="minimum capacities add up to"):
        scale_budget(plan, 16)  # snapkv's default window (32) cannot fit in 16 tokens
    uneven = plan_from_route(["tova", "tova"], None, [10, 90], None, "prefill", "u")
    assert [layer.prefill.capacity for layer in scale_budget(uneven, 10, minimum=4).layers] == [4, 16]


# ---- random placements ---------------------------------------------------------------------------
def test_sample_placements_large_space():
    route = ["d2o"] * 3 + ["tova"] * 29
    draws = sample_placements(route, 200, seed=3)
    assert len(draws) == 200 and len({tuple(d) for d in draws}) == 200
    assert all(Counter(d) == Counter(route) for d in draws)
    assert route not in draws
    assert sample_placements(route, 200, seed=3) == draws
    assert sample_placements(route, 200, seed=4) != draws
    other = draws[0]
    assert other not in sample_placements(route, 200, seed=3, exclude=other)


def test_sample_placements_small_space():
    route = ["a", "b", "b"]  # 3 placements: abb, bab, bba
    with pytest.raises(ValueError, match="only 2 distinct placements of 1 a \\+ 2 b over 3 layers") as err:
        sample_placements(route, 3)
    assert "\n" not in str(err.value)
    draws = sample_placements(route, 2, seed=1)
    assert sorted(map(tuple, draws)) == [("b", "a", "b"), ("b", "b", "a")]
    assert sample_placements(route, 2, seed=1) == draws
    # another exclusion lets the route itself come back; one outside the space excludes nothing
    assert ["a", "b", "b"] in sample_placements(route, 2, exclude=["b", "a", "b"])
    assert len(sample_placements(route, 3, exclude=["a", "a", "b"])) == 3
    assert sample_placements(route, 0) == []
    with pytest.raises(ValueError, match="only 0 distinct placements"):
        sample_placements(["tova"] * 4, 1)


def test_sample_placements_medium_space_is_enumerated_exactly():
    route = ["d2o"] * 2 + ["tova"] * 6  # 28 placements, 27 besides the route
    draws = sample_placements(route, 27, seed=0)
    assert len({tuple(d) for d in draws}) == 27 and route not in draws
    with pytest.raises(ValueError, match="only 27"):
        sample_placements(route, 28)


def test_sample_placements_rejection_sampling_path():
    route = ["cam"] * 4 + ["d2o"] * 8 + ["tova"] * 20  # ~ 10^11 placements: drawn, not enumerated
    draws = sample_placements(route, 500, seed=7)
    assert len({tuple(d) for d in draws}) == 500 and route not in draws
    assert all(Counter(d) == Counter(route) for d in draws)
    assert sample_placements(route, 500, seed=7) == draws


def test_scale_budget_of_a_native_plan_keeps_one_capacity_so_it_stays_valid():
    plan = Plan.homogeneous("pyramidkv", 64, 4, "prefill", allocation="native")
    scaled = scale_budget(plan, 50.5)
    assert {layer.prefill.capacity for layer in scaled.layers} == {round(50.5)}
    assert scaled.allocation == "native"
    validate_plan(scaled, 4)  # unequal capacities would be refused for a native plan


def test_a_toprank_budget_under_a_routed_methods_window_names_the_method_and_the_window():
    """The smollm2 study's decode route has CAKE (window 32) in some layers: every layer needs at least 33. (The
    study's workspace keeps the profile its report used, stale since methods were added, and a current one.)"""
    from polykv.profile.store import profile_named
    from polykv.routing import plan_from_profile

    study = REPO / "docs" / "smollm2-study"
    profiles = [profile_named(str(folder), study) for folder in sorted((study / "profiles").iterdir())]
    (loaded,) = [profile for profile in profiles if not profile.stale_reasons()]
    with pytest.raises(ValueError) as refused:
        plan_from_profile(loaded, "decode", 32)
    assert str(refused.value) == (
        "budget 32 is below 33, the least capacity cake can run at in the decode route (its window (32) must fit "
        "under it): choose a budget of at least 33"
    )
    assert plan_from_profile(loaded, "decode", 33).summary().phases[Phase.DECODE].total_capacity == 30 * 33


def test_a_replay_reads_the_profile_its_routes_were_made_from_and_rebuilds_them_exactly():
    """`polykv experiment study --replay` renders a study again from its database: its TopRank routes must come from
    the profile they were made from (named in their provenance), though methods added since make it stale."""
    import dataclasses
    from types import SimpleNamespace

    from polykv.eval.results.store import Store
    from polykv.eval.running.suite_runner import plan_hash
    from polykv.eval.study.steps import recorded_profile
    from polykv.routing import plan_from_profile

    study = REPO / "docs" / "smollm2-study"
    recorded = recorded_profile(SimpleNamespace(workspace=study))
    assert recorded.key == "smollm2-b128-s0-d9568ebd69" and recorded.stale_reasons() == []
    assert dataclasses.replace(recorded, as_recorded=False).stale_reasons()  # stale by today's methods
    stored = {run.plan_name: run.plan_hash for run in Store.reader(study / "results.sqlite").runs()}
    route = plan_from_profile(recorded, "decode", 128, "cosine", "ppl")
    assert plan_hash(route) == stored[route.name] == stored["toprank-cosine-ppl-decode-b128"]

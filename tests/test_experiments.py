"""Experiments: their plan sets and statistics by hand on injected scores, then end to end on the demo
model at small sizes (fidelity suite, tiny settings)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
import pytest

from polykv.eval.experiments import ExperimentRunner, factorial, placement, sweep, sweep_plans
from polykv.eval.method_protocols import baseline_methods
from polykv.eval.results.store import Store
from polykv.eval.statistics.tasks import spearman
from polykv.eval.suites.fidelity import FidelitySettings
from polykv.methods import REGISTRY
from polykv.plan import FULL, LayerPlan, Phase, Plan, Scope
from polykv.profile import profiler
from polykv.profile.build import build_profile
from polykv.profile.corpus import CorpusSpec
from polykv.profile.store import Profile
from polykv.routing import plan_from_profile
from tests.helpers import assert_one_line_error, fake_run

TINY = FidelitySettings(tasks=("prose", "stories"), samples_per_task=1, prompt_tokens=96, continuation=8, generate=8)


# ---- injected scores --------------------------------------------------------------------------------
@dataclass
class FakeRunner(ExperimentRunner):
    """Runs nothing: each plan becomes a finished run in the real store whose task scores are
    `score_of(plan)` (the same numbers under the names top1 and kl), so the statistics can be checked by hand."""

    score_of: Callable[[Plan], dict[str, float]] | None = None
    launched: list[str] = field(default_factory=list)

    def run_all(self, plans: list[Plan]) -> list[str]:
        ids = []
        for plan in plans:
            self.launched.append(plan.name)
            run_id = f"fake-{plan.name}"
            if self.store.run(run_id) is None:
                scores = {t: {"top1": v, "kl": v} for t, v in self.score_of(plan).items()}
                fake_run(
                    self.store,
                    run_id,
                    scores,
                    model="fake",
                    plan_name=plan.name,
                    samples=False,
                    plan_json=plan.to_json(),
                )
            ids.append(run_id)
        return ids


def fake_runner(tmp_path, metric: str, score_of: Callable[[Plan], dict[str, float]]) -> FakeRunner:
    return FakeRunner(Store(tmp_path / "results.sqlite"), "fake", None, None, metric=metric, score_of=score_of)


def fake_profile(cosine: dict[str, list[float]], entropy: list[float]) -> Profile:
    """A decode-phase profile over len(entropy) layers with the given cosine per method and layer
    (dppl = 1 - cosine, so that the ppl allocation has a sensitivity to work from)."""
    rows = [
        {"layer": layer, "scope": "decode", "method": method, "cosine": value, "dppl": 1.0 - value}
        for method, values in cosine.items()
        for layer, value in enumerate(values)
    ]
    metadata = {
        "key": "fake-profile",
        "model": "fake",
        "num_layers": len(entropy),
        "capacity": 16,
        "scopes": ["decode"],
        "method_params": {},
        "corpus": {"num_sequences": 1},
        # measured with today's methods and profiler, so that the profile is current
        "methods": {name: getattr(cls, "revision", 1) for name, cls in REGISTRY.items()},
        "profile_revision": getattr(profiler, "PROFILE_REVISION", 1),
    }
    return Profile(metadata, pd.DataFrame(rows), pd.DataFrame({"layer": range(len(entropy)), "entropy": entropy}))


def decode_route(methods: list[str], capacity: int, name: str = "route") -> Plan:
    plan = Plan.homogeneous(methods[0], capacity, len(methods), "decode")
    layers = [LayerPlan(decode=lay.decode.model_copy(update={"method": m})) for lay, m in zip(plan.layers, methods)]
    return plan.with_layers(layers, name=name)


# ---- the sweep's plan set -------------------------------------------------------------------------
def test_a_decode_routes_sweep_runs_every_baseline_under_its_own_protocol():
    route = decode_route(["tova", "tova", "h2o", "h2o", "h2o"], 24)
    plans = sweep_plans(route, [16, 32])
    assert list(plans)[-1] == (None, FULL) and [k for k in plans if k[1] == FULL] == [(None, FULL)]  # FullKV once
    assert all(lay[p].method == FULL for lay in plans[(None, FULL)].layers for p in Phase)
    for budget in (16, 32):
        labels = [name for b, name in plans if b == budget]
        alone = [name for name in labels if name.endswith(("-decode", "-decode-native"))]
        assert labels == ["route-uniform", *baseline_methods(), *alone]  # no route-ppl without a profile
        # like with like: every method that runs in decode, alone in the route's scope
        assert {"tova-decode", "h2o-decode", "cake-decode", "cake-decode-native", "d2o-decode-native"} <= set(alone)
        assert all(plans[(budget, name)].scope is Scope.DECODE for name in alone)
        snapkv = plans[(budget, "snapkv")]  # SnapKV compresses the prompt; decode keeps every token
        assert snapkv.scope is Scope.PREFILL
        assert all(
            lay.prefill.method == "snapkv" and lay.prefill.capacity == budget and lay.decode.method == FULL
            for lay in snapkv.layers
        )
        tova = plans[(budget, "tova")]  # TOVA is active in both phases
        assert tova.scope is Scope.BOTH and all(lay[p].method == "tova" for lay in tova.layers for p in Phase)
        d2o = plans[(budget, "d2o")]  # D2O is decode-only, with its own layer budgets
        assert d2o.scope is Scope.DECODE and d2o.allocation == "native"
        assert all(lay.prefill.method == FULL for lay in d2o.layers)
        uniform = plans[(budget, "route-uniform")]  # the route's methods, capacity b in every layer
        assert [lay.decode.method for lay in uniform.layers] == ["tova", "tova", "h2o", "h2o", "h2o"]
        assert [lay.decode.capacity for lay in uniform.layers] == [budget] * 5
        assert all(lay.prefill.method == FULL for lay in uniform.layers)
    assert plans[(16, "snapkv")].layers[0].prefill.params["window"] == 4  # 32 does not fit under 16
    overridden = sweep_plans(route, [16], ["tova", "snapkv"], overrides={"tova": "decode"}, matched=False)
    assert list(overridden) == [(16, "route-uniform"), (16, "tova"), (16, "snapkv"), (None, FULL)]
    assert overridden[(16, "tova")].scope is Scope.DECODE


def test_a_sweeps_like_with_like_comparator_can_be_chosen_or_left_out():
    route = decode_route(["tova", "tova", "h2o", "h2o", "h2o"], 24)
    only = sweep_plans(route, [16], ["tova"], matched=["tova-decode"])
    assert list(only) == [(16, "route-uniform"), (16, "tova"), (16, "tova-decode"), (None, FULL)]
    assert only[(16, "tova-decode")].scope is Scope.DECODE and only[(16, "tova")].scope is Scope.BOTH


def test_the_sweep_of_a_two_phase_route_keeps_both_phases_and_the_prefill_only_baselines():
    both = Plan.homogeneous("h2o", 24, 5, "both", name="both-route")
    plans = sweep_plans(both, [16, 32], ["snapkv", "cake"])
    assert plans[(16, "snapkv")].scope is Scope.PREFILL
    for (budget, _name), plan in plans.items():
        if budget is None:
            continue
        for phase in plan.scope.phases:
            assert plan.summary().phases[phase].total_capacity == budget * plan.num_layers
    assert plans[(32, "route-uniform")].scope is Scope.BOTH


def test_route_ppl_takes_the_profiles_ppl_allocation_at_each_budget():
    profile = fake_profile(
        {"streamingllm": [0.5] * 4, "tova": [0.9, 0.9, 0.6, 0.6], "h2o": [0.6, 0.6, 0.9, 0.9]}, [1.0] * 4
    )
    route = decode_route(["tova", "tova", "h2o", "h2o"], 16)
    plans = sweep_plans(route, [16], ["h2o"], profile=profile, matched=False)
    assert list(plans) == [(16, "route-uniform"), (16, "route-ppl"), (16, "h2o"), (None, FULL)]
    ppl = plans[(16, "route-ppl")]
    caps = [lay.decode.capacity for lay in ppl.layers]
    # sensitivity S_l = max dppl over the methods = 1 - 0.5 = 0.5 in every layer: an even split
    assert caps == [16, 16, 16, 16] and [lay.decode.method for lay in ppl.layers] == ["tova", "tova", "h2o", "h2o"]
    skewed = fake_profile({"streamingllm": [0.9, 0.9, 0.9, 0.1], "tova": [0.9] * 4, "h2o": [0.9] * 4}, [1.0] * 4)
    caps = [lay.decode.capacity for lay in sweep_plans(route, [16], ["h2o"], profile=skewed)[(16, "route-ppl")].layers]
    assert sum(caps) == 64 and caps[3] == max(caps) and caps[0] == caps[1] == caps[2] < caps[3]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"budgets": []}, "at least one budget"),
        ({"budgets": [16, 16]}, "repeat"),
        ({"budgets": [0]}, "positive whole numbers"),
        ({"baselines": ["nope"]}, "unknown method 'nope'"),
        ({"baselines": []}, "at least one baseline"),
        ({"overrides": {"snapkv": "decode"}}, "snapkv runs only in prefill"),
    ],
)
def test_bad_sweep_input_is_a_one_line_error(bad, message):
    route = decode_route(["tova", "h2o"], 16)
    kwargs = {"budgets": [16], **bad}
    with pytest.raises(ValueError, match=message):
        sweep_plans(route, **kwargs)


# ---- the sweep's report (Table 5) -----------------------------------------------------------------
# Per task (t1, t2, t3): the route and two baselines at budgets 8, 16, 32, and FullKV.
SWEEP_SCORES = {
    "route-uniform-b8": (0.25, 0.25, 0.25),
    "h2o-both-8": (0.125, 0.125, 0.125),
    "snapkv-prefill-8": (0.0, 0.0, 0.0),
    "route-uniform-b16": (0.5, 0.5, 0.5),
    "h2o-both-16": (0.25, 0.25, 0.25),
    "snapkv-prefill-16": (0.375, 0.375, 0.375),
    "route-uniform-b32": (0.75, 0.75, 0.75),
    "h2o-both-32": (0.25, 0.75, 0.5),
    "snapkv-prefill-32": (0.25, 0.25, 0.25),
    "full-both": (1.0, 1.0, 1.0),
    # the like-with-like comparator: H2O alone in the route's scope (decode)
    "h2o-decode-8": (0.25, 0.25, 0.25),
    "h2o-decode-16": (0.5, 0.5, 0.5),
    "h2o-decode-32": (0.5, 0.5, 0.5),
}


@pytest.mark.parametrize(
    ("metric", "best", "verdicts"),
    [
        # The fake runs keep no samples, so the verdicts rest on the task bootstrap. top1, higher is better. 2b at
        # 8: route 0.25 vs snapkv@16 0.375 in every task: CI [-0.125, -0.125], falls short. At 16: route 0.5 vs
        # h2o@32 (0.25, 0.75, 0.5): differences (0.25, -0.25, 0), the CI straddles 0.
        ("top1", {8: "h2o", 16: "snapkv", 32: "h2o"}, {8: "falls short", 16: "no significant difference"}),
        # kl, lower is better. 2b at 8: route 0.25 vs h2o@16 0.25: CI [0, 0], no difference (which is no match: a
        # test does not say so). At 16: route 0.5 vs snapkv@32 0.25 everywhere: 0.25 worse, falls short.
        ("kl", {8: "snapkv", 16: "h2o", 32: "snapkv"}, {8: "no significant difference", 16: "falls short"}),
    ],
)
def test_sweep_reports_the_envelope_route_minus_envelope_and_the_2b_verdict(tmp_path, metric, best, verdicts):
    route = decode_route(["tova", "h2o", "h2o"], 16)
    runner = fake_runner(tmp_path, metric, lambda plan: dict(zip(("t1", "t2", "t3"), SWEEP_SCORES[plan.name])))
    report = sweep(runner, route, [8, 16, 32], ["h2o", "snapkv"], matched=["h2o-decode"])
    assert runner.launched.count("full-both") == 1 and len(runner.launched) == 3 * 4 + 1
    assert [r["budget"] for r in report.rows] == [8, 16, 32]
    assert {r["budget"]: r["best baseline"] for r in report.rows} == best
    data = report.data
    assert {b: e.model_dump() for b, e in data.envelope.items()} == {
        b: {"baseline": best[b], "score": sum(SWEEP_SCORES[f"{best[b]}-{suffix}-{b}"]) / 3}
        for b, suffix in ((b, "both" if best[b] == "h2o" else "prefill") for b in best)
    }
    assert (data.full.score, data.full.run, data.full.plan) == (1.0, "fake-full-both", "full-both")
    # route-uniform - envelope, with the interval of route-uniform vs the envelope's method at that budget
    assert data.versus_envelope[8].difference == pytest.approx(0.25 - (0.125 if metric == "top1" else 0.0))
    expected_32 = 0.75 - (0.5 if metric == "top1" else 0.25)
    assert report.rows[2]["route-uniform - envelope"] == pytest.approx(expected_32)
    assert {b: v.match for b, v in data.double.items()} == verdicts  # 32 has no 64: no 2b line
    assert data.double[8].baseline == best[16] and data.double[16].baseline == best[32]
    assert data.double[8].difference == pytest.approx(
        0.25 - sum(SWEEP_SCORES["snapkv-prefill-16" if best[16] == "snapkv" else "h2o-both-16"]) / 3
    )
    # like with like: the route against H2O alone in decode (0.25, 0.5, 0.5): its only method alone in scope here
    assert data.matched == ["h2o-decode"] and data.matched_envelope[16].baseline == "h2o-decode"
    assert data.versus_matched[32].difference == pytest.approx(0.75 - 0.5)
    assert data.double_matched[16].baseline == "h2o-decode" and report.rows[0]["best alone in scope"] == "h2o-decode"
    assert report.lines[0] == f"metric {metric} ({'higher' if metric == 'top1' else 'lower'} is better)"
    assert "route-ppl omitted: no profile given" in report.lines[1]
    assert report.lines[2].startswith("like with like: each method alone in the route's scope (decode)")
    assert report.lines[3].startswith("protocol h2o: prefill + decode") and report.lines[4].startswith(
        "protocol snapkv: prefill"
    )
    assert report.lines[5].startswith("FullKV (budget-independent, one run fake-full-both): 1.0000")
    assert any(
        line.startswith("2b comparison:") and "no significant difference is no match" in line for line in report.lines
    )
    twice = f"2b: route-uniform at 8 - the best baseline under its own protocol at 16 ({best[16]})"
    assert any(line.startswith(twice) and verdicts[8] in line for line in report.lines)
    assert any("(across protocols: the route acts in decode" in line for line in report.lines)  # h2o, snapkv


# ---- the factorial (Table 2) ----------------------------------------------------------------------
# Per task (t1..t4); binary fractions so that every difference is exact.
H_U = (0.5, 0.5, 0.75, 0.5)
H_A = (0.5, 0.75, 0.75, 0.5)
R_U = (0.75, 0.625, 0.75, 0.25)
R_A = (1.0, 0.625, 0.75, 0.5)
FACTORIAL_SCORES = {
    "h2o-decode-uniform-b24": H_U,
    "h2o-decode-entropy-b24": H_A,
    "toprank-cosine-uniform-decode-b24": R_U,
    "toprank-cosine-entropy-decode-b24": R_A,
}


@pytest.mark.parametrize("metric", ["top1", "kl"])
def test_factorial_primary_contrast_is_routing_under_uniform_allocation(tmp_path, metric):
    profile = fake_profile(
        {"streamingllm": [0.5] * 4, "tova": [0.9, 0.9, 0.6, 0.6], "h2o": [0.6, 0.6, 0.9, 0.9]}, [1.0, 2.0, 3.0, 4.0]
    )
    tasks = ("t1", "t2", "t3", "t4")
    runner = fake_runner(tmp_path, metric, lambda plan: dict(zip(tasks, FACTORIAL_SCORES[plan.name])))
    report = factorial(runner, profile, "decode", 24, "h2o", allocation="entropy")

    cells = {(r["routing"], r["allocation"]): r for r in report.rows}
    assert set(cells) == {
        ("homogeneous", "uniform"),
        ("homogeneous", "entropy"),
        ("routed", "uniform"),
        ("routed", "entropy"),
    }
    assert cells[("routed", "uniform")][metric] == pytest.approx(sum(R_U) / 4)
    for row in report.rows:  # the same total capacity everywhere; the homogeneous cells copy the routed capacities
        plan = Plan.from_json(runner.store.run(row["run"]).plan_json)
        assert plan.summary().phases[Phase.DECODE].total_capacity == 4 * 24
    routed = Plan.from_json(runner.store.run(cells[("routed", "entropy")]["run"]).plan_json)
    homogeneous = Plan.from_json(runner.store.run(cells[("homogeneous", "entropy")]["run"]).plan_json)
    assert [lay.decode.capacity for lay in homogeneous.layers] == [lay.decode.capacity for lay in routed.layers]
    assert [lay.decode.method for lay in routed.layers] == ["tova", "tova", "h2o", "h2o"]
    assert {lay.decode.method for lay in homogeneous.layers} == {"h2o"}

    # routed-uniform - homogeneous-uniform per task: (0.25, 0.125, 0, -0.25), mean 0.03125
    primary = report.data.routing_uniform
    assert primary.difference == pytest.approx(0.03125) and primary.tasks == 4
    assert primary.low <= 0.03125 <= primary.high and -0.25 <= primary.low and primary.high <= 0.25
    # leave one out: t1 (0.125 + 0 - 0.25) / 3, t2 0, t3 (0.25 + 0.125 - 0.25) / 3, t4 (0.25 + 0.125 + 0) / 3
    assert primary.leave_one_out == pytest.approx({"t1": -0.125 / 3, "t2": 0.0, "t3": 0.125 / 3, "t4": 0.125})
    if metric == "top1":  # higher is better: wins t1, t2; tie t3; loss t4; LOTO positive for t3, t4
        assert (primary.wins, primary.ties, primary.losses, primary.loto_better) == (2, 1, 1, 2)
    else:  # lower is better: the same differences count the other way
        assert (primary.wins, primary.ties, primary.losses, primary.loto_better) == (1, 1, 2, 1)
    line = next(x for x in report.lines if x.startswith("primary: "))
    assert line.startswith(
        f"primary: routing under uniform allocation (routed-uniform - homogeneous-uniform): "
        f"+0.0312 {metric}, 95% paired bootstrap CI ["
    )
    assert "over 4 tasks" in line and "wins / ties / losses" in line
    loto = next(x for x in report.lines if x.startswith("primary leave-one-task-out"))
    assert "t1 -0.0417, t2 +0.0000, t3 +0.0417, t4 +0.1250" in loto
    assert loto.endswith(f"{2 if metric == 'top1' else 1} of 4 in the better direction")

    # secondary: allocation effects (0, 0.25, 0, 0) and (0.25, 0, 0, 0.25); interaction (0.25, -0.25, 0, 0.25)
    assert report.data.allocation_homogeneous.difference == pytest.approx(0.0625)
    assert report.data.allocation_routed.difference == pytest.approx(0.125)
    interaction = report.data.interaction
    assert interaction.difference == pytest.approx(0.125 - 0.0625)
    assert interaction.leave_one_out == pytest.approx({"t1": 0.0, "t2": 0.5 / 3, "t3": 0.25 / 3, "t4": 0.0})
    secondary = [x for x in report.lines if x.startswith("secondary: ")]
    assert [x.split(":")[1].strip() for x in secondary] == [
        "allocation effect under homogeneous routing (entropy - uniform)",
        "allocation effect under TopRank routing (entropy - uniform)",
        "interaction ((r_a - r_u) - (h_a - h_u))",
    ]
    assert all("95% paired bootstrap CI" in x for x in secondary)
    assert report.data.cells["routed-uniform"].run == "fake-toprank-cosine-uniform-decode-b24"
    assert report.lines[0].startswith(f"metric {metric}") and report.lines[1].startswith(
        "protocol: homogeneous cells run h2o"
    )
    with pytest.raises(ValueError, match="must differ from uniform"):
        factorial(runner, profile, "decode", 24, "h2o", allocation="uniform")


# ---- the placement control (Table 4 / Figure 4) ---------------------------------------------------
# tova beats h2o by 8, 4, 2, 1 (cosine x 100) in layers 0..3, so S(rho) = sum of those weights over the layers
# that run tova minus a constant: every placement of 2 tova + 2 h2o has a different S.
WEIGHTS = (8, 4, 2, 1)
PLACEMENT_PROFILE = {"streamingllm": [0.0] * 4, "h2o": [0.0] * 4, "tova": [w / 100 for w in WEIGHTS]}


def tova_weight(plan: Plan) -> int:
    return sum(w for w, lay in zip(WEIGHTS, plan.layers) if lay.decode.method == "tova")


def test_placement_statistics_exclude_the_guided_route_and_count_one_sided(tmp_path):
    profile = fake_profile(PLACEMENT_PROFILE, [1.0] * 4)
    guided = decode_route(["tova", "tova", "h2o", "h2o"], 16, name="guided")  # S = 12, the largest
    # The random placements score in the order of their S (Spearman +1 over them); the guided route worst.
    runner = fake_runner(
        tmp_path, "top1", lambda plan: {"t1": 0.0 if plan.name == "guided" else tova_weight(plan) / 100, "t2": 0.5}
    )
    report = placement(runner, profile, guided, k=4)
    data = report.data
    assert len(data.random) == 4 and all(r.plan != "guided" for r in data.random)
    assert len({tova_weight(Plan.from_json(runner.store.run(r.run).plan_json)) for r in data.random}) == 4
    assert data.guided.profile_score == pytest.approx(0.12)
    assert [r.profile_score for r in data.random] == pytest.approx([r.score * 2 - 0.5 for r in data.random])
    # Spearman over the 4 random placements only: exactly +1 (with the guided route it would not be)
    assert data.spearman == pytest.approx(1.0)
    with_guided = spearman(
        [data.guided.profile_score] + [r.profile_score for r in data.random],
        [data.guided.score] + [r.score for r in data.random],
    )
    assert with_guided < 0.5
    # one-sided: P(rho_perm >= 1) = 1/24 over the 4! orders (two-sided would be 2/24), p = (1 + count) / (N + 1)
    assert data.permutations == 10_000 and data.spearman_p == pytest.approx(1 / 24, abs=0.01)
    assert data.spearman_p * 10_001 == pytest.approx(round(data.spearman_p * 10_001))
    # secondary: the guided route is the worst of 5: rank 5, p = 5 / 5; gap to the random mean
    assert (data.guided_rank, data.guided_p) == (5, 1.0)
    random_mean = sum(r.score for r in data.random) / 4
    assert data.guided_minus_mean == pytest.approx((0.0 + 0.5) / 2 - random_mean)
    primary = next(x for x in report.lines if x.startswith("primary: "))
    assert "over the 4 random placements = +1.0000" in primary and "one-sided permutation p" in primary
    assert "N = 10000 shuffles; the guided route is not included" in primary
    secondary = next(x for x in report.lines if x.startswith("secondary (descriptive): "))
    assert "rank 5 of 5" in secondary and "corrected Monte Carlo p = rank / (K + 1) = 1.0000" in secondary
    assert [r["role"] for r in report.rows] == ["guided"] + ["random"] * 4
    assert set(report.rows[0]) == {"plan", "role", "run", "top1", "S(rho)"}


def test_placement_with_one_random_route_says_why_there_is_no_spearman(tmp_path):
    profile = fake_profile(PLACEMENT_PROFILE, [1.0] * 4)
    guided = decode_route(["tova", "tova", "h2o", "h2o"], 16, name="guided")
    runner = fake_runner(tmp_path, "kl", lambda plan: {"t1": tova_weight(plan) / 100})
    report = placement(runner, profile, guided, k=1)
    assert "needs at least 2 random placements" in next(x for x in report.lines if x.startswith("primary: "))
    assert report.data.guided_rank == 2  # kl: the guided route's higher score is worse


# ---- end to end on the demo model ------------------------------------------------------------------
@pytest.fixture(scope="module")
def setup(tmp_path_factory, demo_model):
    model, tokenizer = demo_model
    root = tmp_path_factory.mktemp("experiments")
    profile = build_profile("demo", model, tokenizer, root / "profiles", CorpusSpec(num_sequences=2, max_tokens=128))
    runner = ExperimentRunner(Store(root / "results.sqlite"), "demo", model, tokenizer, "fidelity", TINY, metric="kl")
    return profile, runner


def test_factorial_runs_four_cells_at_matched_capacity(setup):
    profile, runner = setup
    report = factorial(runner, profile, "decode", 24, "tova", allocation="entropy")
    assert {(r["routing"], r["allocation"]) for r in report.rows} == {
        ("homogeneous", "uniform"),
        ("homogeneous", "entropy"),
        ("routed", "uniform"),
        ("routed", "entropy"),
    }
    for row in report.rows:  # every cell keeps the same total capacity, L x b
        plan = Plan.from_json(runner.store.run(row["run"]).plan_json)
        assert plan.summary().phases[Phase.DECODE].total_capacity == 5 * 24
    assert any(line.startswith("primary: routing under uniform allocation") for line in report.lines)
    assert any(line.startswith("secondary: interaction") for line in report.lines)


@pytest.mark.slow  # ten or so real runs of the demo model
def test_placement_ranks_the_guided_route_among_nine_placements(setup):
    profile, runner = setup
    guided = plan_from_profile(profile, "decode", 24, "cosine", "uniform")
    report = placement(runner, profile, guided, k=9)
    assert len(report.rows) == 10 and len({r["run"] for r in report.rows}) == 10
    assert [r["role"] for r in report.rows] == ["guided"] + ["random"] * 9
    plans = [Plan.from_json(runner.store.run(r["run"]).plan_json) for r in report.rows]
    assert plans[0].layers == guided.layers  # the guided route itself is ranked among them
    # every placement runs the guided route's decode methods, as many layers each, over the same per-layer
    # capacities and prefill; and the ten routes differ (no placement repeats another or the guided one)
    methods = Counter(lay.decode.method for lay in guided.layers)
    for plan in plans[1:]:
        assert plan.num_layers == guided.num_layers and plan.scope == guided.scope
        assert Counter(lay.decode.method for lay in plan.layers) == methods
        assert [lay.decode.capacity for lay in plan.layers] == [lay.decode.capacity for lay in guided.layers]
        assert [lay.prefill for lay in plan.layers] == [lay.prefill for lay in guided.layers]
    assert len({tuple(lay.decode.method for lay in plan.layers) for plan in plans}) == 10
    assert any(line.startswith("primary: Spearman") for line in report.lines)
    assert any(
        line.startswith("secondary (descriptive): guided route rank ") and "of 10" in line for line in report.lines
    )


@pytest.mark.slow  # ten or so real runs of the demo model
def test_sweep_compares_the_route_with_every_baseline(setup):
    profile, runner = setup
    route = plan_from_profile(profile, "decode", 24, "cosine", "uniform")
    report = sweep(runner, route, [16, 32], ["tova", "d2o"], profile=profile)
    assert [r["budget"] for r in report.rows] == [16, 32]
    for row in report.rows:
        best = min(row[m] for m in ("tova", "d2o"))  # kl: lower is better
        assert row["envelope"] == best and row["best baseline"] in ("tova", "d2o")
        assert "route-ppl" in row and "route-ppl - envelope" in row
    assert 16 in report.data.double and report.data.full.score == pytest.approx(0.0, abs=1e-6)
    tova = Plan.from_json(runner.store.run(report.data.runs["tova"][16]).plan_json)
    assert tova.scope is Scope.BOTH  # the decode route meets TOVA in both phases


def test_placement_refuses_a_two_phase_plan(setup, polykv, tmp_path):
    profile, runner = setup
    both = plan_from_profile(profile, "both", 24, "cosine", "uniform")
    with pytest.raises(ValueError, match="single-phase plan"):
        placement(runner, profile, both, k=3)
    path = tmp_path / "both.json"
    both.save(path)
    result = polykv(
        "experiment",
        "placement",
        "--plan",
        str(path),
        "--profile",
        str(profile.path),
        "--k",
        "3",
        "--samples",
        "1",
        "--tasks",
        "prose",
        "--prompt-tokens",
        "96",
        "-w",
        str(tmp_path),
    )
    assert_one_line_error(result, "single-phase plan")


@pytest.mark.slow  # finds the sweep test's runs again; run alone, it makes them (nine demo-model runs)
def test_experiment_sweep_command_prints_protocols_fullkv_and_the_2b_lines(setup, polykv, tmp_path):
    profile, runner = setup
    path = tmp_path / "route.json"
    plan_from_profile(profile, "decode", 24, "cosine", "uniform").save(path)
    # The library test's workspace and settings: the same runs, found again rather than recomputed.
    common = (
        "--plan",
        str(path),
        "--budgets",
        "16,32",
        "--settings",
        json.dumps(TINY.to_dict()),
        "--metric",
        "kl",
        "-w",
        str(runner.store.path.parent),
    )
    bad = polykv("experiment", "sweep", *common, "--protocol", "snapkv=decode")
    assert_one_line_error(bad, "snapkv runs only in prefill")
    bad = polykv("experiment", "sweep", *common, "--protocol", "tova")
    assert_one_line_error(bad, "expected METHOD=SCOPE")
    result = polykv(
        "experiment",
        "sweep",
        *common,
        "--baselines",
        "tova,d2o",
        "--protocol",
        "tova=both",
        "--profile",
        str(profile.path),
    )
    assert result.returncode == 0, result.stderr
    assert "metric kl (lower is better)" in result.stdout
    assert "protocol tova: prefill + decode" in result.stdout
    assert "protocol d2o: decode (prefill keeps every token), native allocation" in result.stdout
    assert "FullKV (budget-independent, one run" in result.stdout and "2b: route-uniform at 16" in result.stdout
    assert "route-ppl: the same route with capacities from profile" in result.stdout

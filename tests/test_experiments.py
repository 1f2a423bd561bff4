"""Experiments end to end on the demo model at small sizes (fidelity suite, tiny settings)."""

from __future__ import annotations

import pytest
from test_cli import assert_one_line_error, polykv  # noqa: F401  (the fixture)

from polykv.eval.experiments import Runner, baseline_methods, factorial, placement, sweep, sweep_plans
from polykv.eval.store import Store
from polykv.eval.suites.fidelity import FidelitySettings
from polykv.profile.build import build_profile
from polykv.profile.corpus import CorpusSpec
from polykv.plan import Phase, Plan, Scope
from polykv.profile.route import plan_from_profile

TINY = FidelitySettings(tasks=("prose", "stories"), samples_per_task=1, prompt_tokens=96, continuation=8, generate=8)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, demo_model):
    model, tokenizer = demo_model
    root = tmp_path_factory.mktemp("experiments")
    profile = build_profile("demo", model, tokenizer, root / "profiles", CorpusSpec(num_sequences=2, max_tokens=128))
    runner = Runner(Store(root / "results.sqlite"), "demo", model, tokenizer, "fidelity", TINY, metric="kl")
    return profile, runner


def test_factorial_runs_four_cells_at_matched_capacity(setup):
    profile, runner = setup
    report = factorial(runner, profile, "decode", 24, "tova", allocation="entropy")
    assert {(r["routing"], r["allocation"]) for r in report.rows} == {
        ("homogeneous", "uniform"), ("homogeneous", "entropy"), ("routed", "uniform"), ("routed", "entropy")}
    for row in report.rows:  # every cell keeps the same total capacity, L x b
        plan = Plan.from_json(runner.store.run(row["run"])["plan_json"])
        assert plan.summary().phases[Phase.DECODE].total_capacity == 5 * 24
    assert any(line.startswith("interaction:") for line in report.lines)
    assert any("paired bootstrap CI" in line for line in report.lines)


def test_placement_ranks_the_guided_route_among_nine_placements(setup):
    profile, runner = setup
    guided = plan_from_profile(profile, "decode", 24, "cosine", "uniform")
    report = placement(runner, profile, guided, k=9)
    assert len(report.rows) == 10 and len({r["run"] for r in report.rows}) == 10
    routes = [tuple(sorted(runner.store.run(r["run"])["plan_json"].count(m) for m in ("tova", "h2o"))) for r in report.rows]
    assert len(set(routes)) == 1  # the same method counts everywhere
    assert report.lines[0].startswith("guided route rank ") and "of 10" in report.lines[0]
    assert report.lines[1].startswith("Spearman(S(rho), suite score)")


def test_sweep_compares_the_route_with_every_baseline(setup):
    profile, runner = setup
    route = plan_from_profile(profile, "decode", 24, "cosine", "uniform")
    report = sweep(runner, route, [16, 24], ["tova", "h2o", "d2o"])
    assert [r["budget"] for r in report.rows] == [16, 24]
    for row in report.rows:
        best = min(row[m] for m in ("tova", "h2o", "d2o"))  # kl: lower is better
        assert row["envelope"] == best and row["best baseline"] in ("tova", "h2o", "d2o")


def test_placement_refuses_a_two_phase_plan(setup, polykv, tmp_path):  # noqa: F811
    profile, runner = setup
    both = plan_from_profile(profile, "both", 24, "cosine", "uniform")
    with pytest.raises(ValueError, match="single-phase plan"):
        placement(runner, profile, both, k=3)
    path = tmp_path / "both.json"
    both.save(path)
    result = polykv("experiment", "placement", "--plan", str(path), "--profile", str(profile.path), "--k", "3",
                    "--samples", "1", "--tasks", "prose", "--prompt-tokens", "96", "-w", str(tmp_path))
    assert_one_line_error(result, "single-phase plan")


def test_sweep_plans_of_a_two_phase_route_use_baselines_that_run_in_both_phases(setup):
    profile, _ = setup
    both = plan_from_profile(profile, "both", 24, "cosine", "uniform")
    plans = sweep_plans(both, [16, 32])
    baselines = sorted({name for _, name in plans if name != "route"})
    assert baselines == sorted(baseline_methods("both")) and "snapkv" not in baselines and "tova" in baselines
    for (budget, name), plan in plans.items():
        assert plan.scope is Scope.BOTH
        for phase in Phase:
            assert plan.summary().phases[phase].total_capacity == budget * plan.num_layers
    with pytest.raises(ValueError, match="cannot run alone in the both scope"):
        sweep_plans(both, [16], ["snapkv"])

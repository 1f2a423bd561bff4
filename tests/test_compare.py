"""Comparisons from the store (paired runs, sweep tables, placement summaries) and launch plans."""

from __future__ import annotations

import pytest

from polykv.eval.comparing.compare import (
    compare_runs,
    envelope,
    metrics_of,
    paired,
    suite_score,
    sweep_table,
    task_cluster,
)
from polykv.eval.experiments import launch_plans, plan_budget
from polykv.eval.experiments.placement import placement_summary
from polykv.eval.results.store import Store
from polykv.eval.statistics.contrast import direction_text
from polykv.eval.statistics.tasks import paired_bootstrap
from polykv.plan import Phase, Plan
from polykv.plan_edits.painting import paint
from tests.helpers import fake_run


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "results.sqlite")


def test_paired_comparison_reports_in_the_metrics_units_and_direction(store):
    fake_run(
        store, "a", {"t1": {"kl": 0.1, "top1": 0.9}, "t2": {"kl": 0.2, "top1": 0.8}, "t3": {"kl": 0.3, "top1": 0.7}}
    )
    fake_run(
        store, "b", {"t1": {"kl": 0.2, "top1": 0.8}, "t2": {"kl": 0.1, "top1": 0.8}, "t3": {"kl": 0.5, "top1": 0.5}}
    )
    kl = compare_runs(store, "a", "b", "kl")
    assert kl.sign == -1 and kl.difference == pytest.approx((-0.1 + 0.1 - 0.2) / 3)
    assert (kl.wins, kl.ties, kl.losses) == (2, 0, 1)  # lower KL wins on t1 and t3
    boot = paired_bootstrap({"t1": -0.1, "t2": -0.2, "t3": -0.3}, {"t1": -0.2, "t2": -0.1, "t3": -0.5})
    assert (kl.low, kl.high) == pytest.approx(sorted((-boot.low, -boot.high)))
    assert kl.leave_one_out["t3"] == pytest.approx(0.0)
    assert list(kl.table["A - B"]) == pytest.approx([-0.1, 0.1, -0.2])
    top1 = compare_runs(store, "a", "b", "top1")
    assert top1.sign == 1 and (top1.wins, top1.ties, top1.losses) == (2, 1, 0)
    assert metrics_of(store, ["a", "b"]) == ["kl", "top1"]
    assert suite_score(store, "a", "kl") == pytest.approx(0.2)


def test_tasks_at_several_lengths_are_resampled_as_clusters():
    assert task_cluster("niah_single_1@4096") == "niah_single_1" and task_cluster("prose") == "prose"
    a = {"niah@4096": 0.5, "niah@8192": 0.25, "vt@4096": 1.0, "vt@8192": 0.75, "qa@4096": 0.5}
    b = {"niah@4096": 0.25, "niah@8192": 0.25, "vt@4096": 0.5, "vt@8192": 0.5, "qa@4096": 0.5}
    result = paired(a, b, "score")
    assert result.clusters == 3 and result.difference == pytest.approx((0.25 + 0 + 0.5 + 0.25 + 0) / 5)
    assert "resampling 3 task clusters over 5 tasks" in result.lines()[0]
    assert (result.wins, result.ties, result.losses) == (3, 2, 0)  # still per task
    assert set(result.leave_one_out) == set(a)  # leave-one-out stays per task
    boot = paired_bootstrap(a, b, clusters={t: t.split("@")[0] for t in a})
    assert (result.low, result.high) == (boot.low, boot.high)
    plain = paired({"t1": 1.0, "t2": 0.0}, {"t1": 0.0, "t2": 0.0}, "score")
    assert plain.clusters == 0 and "over 2 tasks" in plain.lines()[0] and "clusters" not in plain.lines()[0]
    assert direction_text("kl") == "metric kl (lower is better)"


def test_a_run_without_the_metric_is_a_one_line_error(store):
    fake_run(store, "a", {"t1": {"kl": 0.1}})
    with pytest.raises(ValueError, match="run a has no finished task with metric 'rougeL'"):
        compare_runs(store, "a", "a", "rougeL")


def test_sweep_table_has_one_row_per_budget_with_the_best_baseline_envelope(store):
    runs = []
    for budget, (route, tova, h2o) in {16: (0.30, 0.40, 0.35), 32: (0.20, 0.15, 0.25)}.items():
        for series, value in (("route", route), ("tova", tova), ("h2o", h2o)):
            fake_run(store, f"{series}{budget}", {"t": {"kl": value}})
            runs.append(({"series": series, "budget": budget}, f"{series}{budget}"))
    fake_run(store, "unfinished", {"t": {"kl": 0.0}}, status="running")
    runs.append(({"series": "tova", "budget": 64}, "unfinished"))
    frame = sweep_table(store, runs, "kl")
    assert list(frame.columns) == ["budget", "route", "tova", "h2o", "best baseline", "envelope"]
    assert frame.to_dict("records") == [
        {"budget": 16, "route": 0.30, "tova": 0.40, "h2o": 0.35, "best baseline": "h2o", "envelope": 0.35},
        {"budget": 32, "route": 0.20, "tova": 0.15, "h2o": 0.25, "best baseline": "tova", "envelope": 0.15},
    ]
    higher = envelope([{"budget": 1, "route": 0.5, "x": 0.2, "y": 0.9}], ["x", "y"], "top1")
    assert higher[0]["best baseline"] == "y"


def test_placement_summary_ranks_the_guided_route_among_controls():
    summary = placement_summary(0.1, [0.3, 0.2, 0.05, 0.4], "kl")  # lower is better: only 0.05 beats it
    assert (summary.rank, summary.p_value) == (2, pytest.approx(2 / 5))


def test_a_baseline_keeps_the_plans_own_budget_in_each_phase():
    """A plan keeping 200 tokens per layer in prefill and 234 in decode is compared with baselines that keep 200 and 234
    (issue 56: one average of 217 in both phases mixed a method effect with a budget shift)."""
    plan = paint(Plan.homogeneous("tova", 200, 4, "both"), [0, 1], "decode", None, 269)
    labelled = dict((label["series"], p) for label, p in launch_plans(plan, None, ["tova", "snapkv", "cake"]))
    assert [(lay.prefill.capacity, lay.decode.capacity) for lay in labelled["tova"].layers] == [(200, 234)] * 4
    assert labelled["tova"].name == "tova-both200/234"
    assert {lay.prefill.capacity for lay in labelled["snapkv"].layers} == {200}  # a prefill method: the prefill budget
    cake = labelled["cake"]  # a native split of each phase's own total
    assert cake.allocation == "native" and {(lay.prefill.capacity, lay.decode.capacity) for lay in cake.layers} == {
        (200, 234)
    }
    swept = dict((label["series"], p) for label, p in launch_plans(plan, [100], ["tova"]))
    route = swept["route"].summary().phases
    assert {lay.decode.capacity for lay in swept["tova"].layers} == {round(route[Phase.DECODE].average_capacity)}


def test_launch_plans_label_the_route_baselines_budgets_and_placements():
    plan = Plan.homogeneous("tova", 32, 5, "decode")
    own = launch_plans(plan, None, ["h2o", "snapkv"])
    # baselines run under their own protocols, not in the plan's phase: H2O in both phases, SnapKV in prefill
    assert [(label, p.name) for label, p in own] == [
        ({"series": "route", "budget": 32}, plan.name),
        ({"series": "h2o", "budget": 32}, "h2o-both-32"),
        ({"series": "snapkv", "budget": 32}, "snapkv-prefill-32"),
    ]
    swept = launch_plans(plan, [16, 64], ["h2o", "cake"])
    assert [label for label, _ in swept] == [
        {"series": s, "budget": b} for b in (16, 64) for s in ("route", "h2o", "cake")
    ]
    assert all(plan_budget(p) == label["budget"] for label, p in swept)
    with_fullkv = launch_plans(plan, [16, 64], ["full", "h2o"])  # FullKV once, whatever the budgets: the reference
    assert [label for label, _ in with_fullkv][-1] == {"series": "full"}
    assert [p.name for label, p in with_fullkv if label["series"] == "full"] == ["full-both"]
    assert swept[0][1].scope.value == "decode"  # the route keeps its own phase
    assert swept[2][1].allocation == "native" and swept[2][1].scope.value == "both"  # CAKE alone: its own budgets
    decode_tova = launch_plans(plan, [16], ["tova"], overrides={"tova": "decode"})
    assert decode_tova[1][1].scope.value == "decode"
    mixed_route = (
        Plan.homogeneous("tova", 32, 5, "decode").layers[:2] + Plan.homogeneous("h2o", 32, 5, "decode").layers[2:]
    )
    guided = plan.with_layers(mixed_route, name="guided")
    placed = launch_plans(guided, None, [], placements=3)
    assert placed[0] == ({"series": "route", "budget": 32, "role": "guided"}, guided)
    controls = [p for label, p in placed if label["series"] == "placement"]
    assert len(controls) == 3 and all(
        sorted(lay.decode.method for lay in p.layers) == ["h2o"] * 3 + ["tova"] * 2 for p in controls
    )
    with pytest.raises(ValueError, match="keeps every token"):
        launch_plans(Plan.homogeneous("full", None, 5), None, ["tova"])
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        launch_plans(plan, None, ["nope"])

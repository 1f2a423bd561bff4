"""The Compare page's library decisions: the pair it starts on, better / worse per task by the metric's
direction, log-perplexity comparisons, interval printing and the runs table with the jobs' tags."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pandas as pd
import pytest

from app import charts
from polykv.eval.comparing.compare import TASKS_FOR_INTERVAL, can_log, compare_runs, paired, preferred_metric
from polykv.eval.comparing.default_pair import default_pair
from polykv.eval.comparing.run_table import runs_table
from polykv.eval.results.store import Store
from polykv.eval.statistics.contrast import outcome
from polykv.eval.statistics.render import interval_text, signed
from polykv.eval.statistics.tasks import paired_bootstrap
from tests.helpers import fake_run


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "results.sqlite")


def job(job_id: str, *runs: tuple[str, dict], title: str = "mixed on fidelity"):
    """A job as `polykv.jobs.Job` reads: id, title and runs of (run_id, label)."""
    return SimpleNamespace(
        id=job_id, title=title, kind="eval", runs=[SimpleNamespace(run_id=r, label=label) for r, label in runs]
    )


def newest_first(store: Store) -> list[dict]:
    return [r for r in reversed(store.runs()) if r.status == "finished"]


def kl(value: float, top1: float = 0.5) -> dict:
    return {"t1": {"kl": value, "top1": top1}, "t2": {"kl": value, "top1": top1}}


def test_the_pair_is_the_route_and_its_best_baseline_at_the_routes_budget(store):
    fake_run(store, "route16", kl(0.30))
    fake_run(store, "tova16", kl(0.40, top1=0.9))  # worse KL, better top-1
    fake_run(store, "h2o16", kl(0.35, top1=0.6))  # the best baseline by KL (lower is better)
    fake_run(store, "tova32", kl(0.01))  # better still, but at another budget
    fake_run(store, "p1", kl(0.5))  # the newest runs: two random placements of a later job
    fake_run(store, "p2", kl(0.6))
    sweep = job(
        "sweep",
        ("route16", {"series": "route", "budget": 16}),
        ("tova16", {"series": "tova", "budget": 16}),
        ("h2o16", {"series": "h2o", "budget": 16}),
        ("tova32", {"series": "tova", "budget": 32}),
    )
    placed = job("placed", ("p1", {"series": "placement", "index": 0}), ("p2", {"series": "placement", "index": 1}))
    pair = default_pair(newest_first(store), [placed, sweep], store)
    assert (pair.a, pair.b) == ("route16", "h2o16")
    assert "best baseline at budget 16 (h2o by kl)" in pair.reason and "sweep" in pair.reason
    # on a higher-is-better metric the best baseline is the one with the highest score
    assert default_pair(newest_first(store), [placed, sweep], store, metric="top1").b == "tova16"


def test_a_job_whose_baselines_have_not_finished_gives_way_to_an_older_one(store):
    fake_run(store, "old-route", kl(0.3))
    fake_run(store, "old-tova", kl(0.4))
    fake_run(store, "new-route", kl(0.3))
    fake_run(store, "new-tova", kl(0.4), status="running")
    old = job("old", ("old-route", {"series": "route", "budget": 8}), ("old-tova", {"series": "tova", "budget": 8}))
    new = job("new", ("new-route", {"series": "route", "budget": 8}), ("new-tova", {"series": "tova", "budget": 8}))
    pair = default_pair(newest_first(store), [new, old], store)
    assert (pair.a, pair.b) == ("old-route", "old-tova")


def test_without_a_finished_route_and_baseline_the_newest_runs_that_are_not_both_placements(store):
    fake_run(store, "other-model", kl(0.3), model="other")
    fake_run(store, "guided", kl(0.3))
    fake_run(store, "p1", kl(0.5))
    fake_run(store, "p2", kl(0.6))
    placed = job(
        "placed",
        ("guided", {"series": "route", "budget": 24, "role": "guided"}),
        ("p1", {"series": "placement", "index": 0}),
        ("p2", {"series": "placement", "index": 1}),
    )
    pair = default_pair(newest_first(store), [placed], store)
    assert (pair.a, pair.b) == ("guided", "p2")  # not p2 vs p1: the guided route against the newest placement
    assert "two newest finished runs" in pair.reason
    no_jobs = default_pair(newest_first(store), [], store)  # nothing says what a run is: the two newest
    assert (no_jobs.a, no_jobs.b) == ("p2", "p1")
    only_placements = [r for r in newest_first(store) if r.id in ("p1", "p2", "other-model")]
    pair = default_pair(only_placements, [placed], store)
    assert (pair.a, pair.b) == ("other-model", "p2")  # a non-placement first, whatever its model
    pair = default_pair([r for r in newest_first(store) if r.id in ("p1", "p2")], [placed], store)
    assert (pair.a, pair.b) == ("p2", "p1")  # all placements: the two newest
    single = default_pair([r for r in newest_first(store) if r.id == "p1"], [placed], store)
    assert (single.a, single.b, single.reason) == ("p1", "p1", "the only finished run")
    assert default_pair([], [placed], store) is None


def test_b_prefers_a_run_of_the_same_model(store):
    fake_run(store, "same", kl(0.2))
    fake_run(store, "foreign", kl(0.2), model="other")
    fake_run(store, "newest", kl(0.2))
    pair = default_pair(newest_first(store), [], store)
    assert (pair.a, pair.b) == ("newest", "same")


def test_the_starting_metric_prefers_kl_then_the_task_suites_score():
    assert preferred_metric(["kl", "ppl", "rougeL", "top1"]) == "kl"
    assert preferred_metric(["score"]) == "score" and preferred_metric(["ppl", "top1"]) == "top1"
    assert preferred_metric(["other"]) == "other" and preferred_metric([]) is None


@pytest.mark.parametrize(
    ("metric", "expected"),
    [("top1", ["A better", "B better", "tie"]), ("kl", ["B better", "A better", "tie"])],
)
def test_per_task_bars_are_coloured_by_the_better_run_for_the_metrics_direction(metric, expected):
    a = {"t1": 0.5, "t2": 0.2, "t3": 0.3}
    b = {"t1": 0.4, "t2": 0.3, "t3": 0.3}  # A - B: +0.1, -0.1, 0
    result = paired(a, b, metric)
    assert result.outcomes() == expected
    assert list(result.report_table()["outcome"]) == expected
    assert [outcome(d, metric) for d in (0.1, -0.1, 0.0)] == expected
    fig = charts.difference_figure(result.table, result.difference, result.low, result.high, metric)
    bars = fig.data[0]
    assert list(bars.marker.color) == [charts.OUTCOME_COLORS[o] for o in expected]
    assert [c[0] for c in bars.customdata] == expected  # the hover names the better run
    legend = [(t.name, t.marker.color) for t in fig.data[1:]]
    assert legend == [(o, charts.OUTCOME_COLORS[o]) for o in ("A better", "B better", "tie")]
    assert charts.OUTCOME_COLORS["A better"] != charts.OUTCOME_COLORS["B better"]
    # the summary's colour: the macro-average difference here is 0 (a tie); one task more decides it
    assert result.outcome() == "tie"
    assert paired({**a, "t4": 1.0}, {**b, "t4": 0.0}, metric).outcome() == expected[0]
    assert charts.OUTCOME_DELTA_COLORS == {
        "A better": "green",
        "B better": "red",
        "tie": "gray",
        "no significant difference": "gray",
        "not tested": "gray",  # no shared samples and too few tasks: no verdict, no colour
    }


def test_log_perplexity_compares_log_ratios_and_reports_them_as_ratios(store):
    a = {"t1": 5.0, "t2": 1000.0, "t3": 40.0}
    b = {"t1": 6.0, "t2": 2500.0, "t3": 30.0}
    raw = paired(a, b, "ppl")
    result = paired(a, b, "ppl", log=True)
    assert can_log("ppl") and not can_log("kl") and result.log and result.label == "log ppl"
    ratios = [a[t] / b[t] for t in ("t1", "t2", "t3")]
    assert list(result.table["A - B"]) == pytest.approx([math.log(r) for r in ratios])
    assert result.difference == pytest.approx(sum(math.log(r) for r in ratios) / 3)
    boot = paired_bootstrap({t: -math.log(v) for t, v in a.items()}, {t: -math.log(v) for t, v in b.items()})
    assert (result.low, result.high) == pytest.approx(sorted((-boot.low, -boot.high)))
    geometric = math.prod(ratios) ** (1 / 3)
    assert result.ratio() == pytest.approx((geometric, math.exp(result.low), math.exp(result.high)))
    assert (result.wins, result.ties, result.losses) == (raw.wins, raw.ties, raw.losses) == (2, 0, 1)
    assert raw.high - raw.low > 1000 and result.high - result.low < 2  # the raw interval is one task's tail
    assert result.lines()[0].startswith("macro-average A - B (log ppl): ") and "(log" not in raw.lines()[0]
    assert any(line.startswith(f"A / B (geometric mean over tasks): ×{geometric:.3g}") for line in result.lines())
    table = result.report_table()
    assert list(table.columns) == ["task", "log A", "log B", "log A - log B", "A / B", "outcome"]
    assert list(table["A / B"]) == [f"×{r:.3g}" for r in ratios]
    fig = charts.difference_figure(result.table, result.difference, result.low, result.high, "ppl", log=True)
    assert fig.layout.yaxis.title.text == "log ppl: A - B"
    assert [c[1] for c in fig.data[0].customdata] == [f"×{r:.3g}" for r in ratios]
    notes = [a.text for a in fig.layout.annotations]
    assert any("A / B ×" in n and n.startswith("95% CI [") for n in notes)
    fake_run(store, "a", {t: {"ppl": v} for t, v in a.items()})
    fake_run(store, "b", {t: {"ppl": v} for t, v in b.items()})
    assert compare_runs(store, "a", "b", "ppl", log=True).difference == pytest.approx(result.difference)
    with pytest.raises(ValueError, match="log ppl needs positive scores: task 't1' of run A has 0.0"):
        paired({**a, "t1": 0.0}, b, "ppl", log=True)
    with pytest.raises(ValueError, match="not compared on a log scale"):
        paired(a, b, "kl", log=True)
    with pytest.raises(ValueError, match="not compared on a log scale"):
        raw.ratio()


def test_intervals_are_printed_at_a_precision_their_width_deserves():
    assert interval_text(-12.3, 1583.4) == "[-12, +1583]"
    assert interval_text(-0.0512, 0.1034) == "[-0.05, +0.10]"
    assert interval_text(14.013, 14.031) == "[+14.013, +14.031]"  # narrow: the width's digits
    assert interval_text(0.0, 0.0) == "[+0, +0]"
    assert signed(0.02534, -0.0512, 0.1034) == "+0.03"
    assert "e" not in interval_text(-12.3, 1583.4) and interval_text(-2e7, 3e7) == "[-2e+07, +3e+07]"


def test_the_runs_table_lists_every_run_with_its_jobs_tags(store):
    fake_run(store, "route16", kl(0.3), plan_name="mixed@16")
    fake_run(store, "tova16", kl(0.4), plan_name="tova@16")
    fake_run(store, "guided", kl(0.3), plan_name="mixed", status="running")
    fake_run(store, "loose", kl(0.3), plan_name="by-hand")
    sweep = job(
        "20240101-eval-aaaaaa",
        ("route16", {"series": "route", "budget": 16}),
        ("tova16", {"series": "tova", "budget": 16}),
        title="mixed on fidelity + 1 more",
    )
    placed = job("20240102-eval-bbbbbb", ("guided", {"series": "route", "budget": 24, "role": "guided"}))
    older = job("20231231-eval-cccccc", ("route16", {"series": "route", "budget": 99}), title="older")
    frame = runs_table(store, [placed, sweep, older])
    assert list(frame.columns) == [
        "run",
        "plan",
        "suite",
        "model",
        "status",
        "samples",
        "created",
        "series",
        "budget",
        "role",
        "job",
        "kl",  # each metric's macro-average over the run's tasks
        "top1",
    ]
    rows = {r["run"]: r for r in frame.to_dict("records")}
    assert list(frame["run"]) == ["loose", "guided", "tova16", "route16"]  # the store's order, newest first
    assert (rows["route16"]["plan"], rows["route16"]["series"], rows["route16"]["budget"]) == ("mixed@16", "route", 16)
    assert rows["route16"]["job"] == "mixed on fidelity + 1 more · 20240101-eval-aaaaaa"  # the newest job's tags
    assert (rows["tova16"]["series"], rows["tova16"]["suite"], rows["tova16"]["model"]) == ("tova", "fidelity", "demo")
    assert (rows["guided"]["role"], rows["guided"]["status"], rows["guided"]["budget"]) == ("guided", "running", 24)
    assert pd.isna(rows["loose"]["series"]) and pd.isna(rows["loose"]["job"]) and pd.isna(rows["loose"]["budget"])
    assert str(frame["budget"].dtype) == "Int64"  # sorts as numbers
    assert len(rows["route16"]["created"]) == 19


def test_the_badge_names_a_winner_only_when_the_verdict_does(tmp_path):
    from polykv.eval.comparing.compare import compare_runs
    from polykv.eval.results.store import Store
    from tests.helpers import fake_run

    store = Store(tmp_path / "results.sqlite")
    fake_run(store, "a", {"t1": {"kl": 0.1}, "t2": {"kl": 0.9}})  # A lower on t1, higher on t2: a mixed picture
    fake_run(store, "b", {"t1": {"kl": 0.5}, "t2": {"kl": 0.6}})
    mixed = compare_runs(store, "a", "b", "kl")
    assert mixed.outcome() == "A better" and mixed.verdict() == "no significant difference"
    assert mixed.badge() == "no significant difference"  # not "A better" beside a verdict of none
    fake_run(store, "c", {t: {"kl": 0.1} for t in ("t1", "t2", "t3", "t4", "t5", "t6")})
    fake_run(store, "d", {t: {"kl": 0.5 + 0.01 * i} for i, t in enumerate(("t1", "t2", "t3", "t4", "t5", "t6"))})
    clear = compare_runs(store, "c", "d", "kl")
    assert clear.verdict() == "better" and clear.badge() == "A better"


def test_a_task_interval_needs_enough_tasks_and_the_sample_test_heads_the_lines():
    few = replace(paired({"t1": 1.0, "t2": 2.0}, {"t1": 1.5, "t2": 2.5}, "kl"), interval_tasks=TASKS_FOR_INTERVAL)
    assert not few.task_interval and "too few for an interval over task means: at least 5" in few.task_line()
    assert not any("CI" in line for line in few.lines())  # no interval from two task means
    assert few.badge() == "not tested" and few.verdict_text().startswith("not tested: the runs share no samples")
    apart = replace(paired({"t1": 0.9, "t2": 0.8}, {"t1": 0.5, "t2": 0.4}, "score"), interval_tasks=TASKS_FOR_INTERVAL)
    assert apart.badge() == "not tested" and "detects 0" not in apart.verdict_text()
    tasks = {f"t{i}": float(i) for i in range(6)}
    enough = replace(paired(tasks, {t: v + 0.5 for t, v in tasks.items()}, "kl"), interval_tasks=TASKS_FOR_INTERVAL)
    assert paired({"t1": 1.0}, {"t1": 2.0}, "kl").task_interval  # the paper's protocol (experiments): any count
    assert enough.task_interval and "95% paired bootstrap CI [" in enough.task_line()

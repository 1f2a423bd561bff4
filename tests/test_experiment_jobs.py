"""Experiment jobs: a factorial, placement or sweep of the library run as a background job. The job file
is validated (a bad one is damaged, never fatal), bad arguments are refused before anything starts,
progress counts the experiment's runs, and the report the worker saves reads back as the library made it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polykv import jobs
from polykv.errors import JobError
from polykv.eval.experiments import (
    FACTORIAL_CELLS,
    ExperimentRunner,
    FactorialData,
    PlacementData,
    Report,
    SweepData,
    factorial,
)
from polykv.eval.experiments.report import BestBaseline, RunScore, VersusBaseline
from polykv.eval.method_protocols import homogeneous_plans
from polykv.eval.results.store import Store
from polykv.eval.running.unit import Unit
from polykv.jobs.experiment import launch_job, read_report
from polykv.plan import Plan
from tests.helpers import SLOW_FIDELITY, TINY_FIDELITY, wait_for_job, with_profile


@pytest.fixture
def ws(workspace, small_profile):
    """A workspace whose profiles folder holds `small_profile`."""
    return with_profile(workspace, small_profile)


def factorial_job(ws, profile, settings=TINY_FIDELITY, **changes):
    args = dict(
        profile=profile.key,
        scope="decode",
        budget=24,
        baseline="tova",
        allocation="entropy",
        settings=settings.to_dict(),
        metric="kl",
    )
    return launch_job(ws, "demo", "cpu", "factorial", **{**args, **changes})


def test_an_experiment_job_names_its_experiment_and_counts_its_runs(ws, small_profile):
    job = factorial_job(ws, small_profile)
    assert (job.kind, job.model, job.runs, job.profile) == ("experiment", "demo", [], None)
    assert job.experiment.name == "factorial" and job.experiment.profile == small_profile.key
    assert job.title.startswith("factorial · ") and "(kl, 4 runs)" in job.title
    placement = launch_job(
        ws, "demo", "cpu", "placement", profile=str(small_profile.path), scope="decode", budget=24, k=3
    )
    assert "(top1, 4 runs)" in placement.title  # a path names the profile too; the guided route + 3
    sweep = launch_job(
        ws, "demo", "cpu", "sweep", profile=small_profile.key, scope="decode", budget=24, budgets=[16, 32],
        baselines=["tova", "h2o"],
    )  # fmt: skip
    # per budget: route-uniform, route-ppl (a profile is given), two baselines and every method alone in the
    # route's scope (like with like); then FullKV once
    alone = len(homogeneous_plans("decode", 16, 5))
    assert f"(top1, {2 * (4 + alone) + 1} runs)" in sweep.title and alone >= 8
    jobs.save_job(job, ws)
    assert jobs.load_job(ws, job.id).experiment == job.experiment  # the file round-trips
    assert jobs.state(job, ws).status == "waiting" and jobs.state(job, ws).fraction == 0.0


@pytest.mark.parametrize(
    ("experiment", "changes", "message"),
    [
        ("factorial", {"metric": "score"}, "the fidelity suite reports ppl, kl, top1, rougeL, not 'score'"),
        ("factorial", {"baseline": None}, "a factorial needs a baseline"),
        ("factorial", {"allocation": "uniform"}, "must differ from uniform"),
        ("factorial", {"budget": "24"}, "budget: Input should be a valid integer"),
        ("factorial", {"statistic": "mean"}, "statistic: Input should be 'cosine', 'dppl' or 'danswer'"),
        ("factorial", {"statistic": "danswer"}, "danswer needs a workload profile"),  # a text profile has none
        ("factorial", {"settings": {"samples_per_task": 0}}, "fidelity settings"),
        ("factorial", {"profile": "no-such-profile"}, "not a profile directory"),
        ("placement", {"k": 0}, "at least one random placement"),
        ("placement", {"k": 3, "scope": "both"}, "single-phase plan"),
        ("placement", {"k": 100_000}, "distinct placements"),
        ("sweep", {"budgets": []}, "a sweep needs budgets"),
        ("sweep", {"budgets": [16], "baselines": ["nope"]}, "unknown method 'nope'"),
    ],
)
def test_bad_experiment_arguments_are_refused_in_one_line_before_anything_starts(
    ws, small_profile, experiment, changes, message
):
    args = dict(profile=small_profile.key, scope="decode", budget=24, baseline="tova", allocation="entropy", k=3)
    with pytest.raises((JobError, ValueError)) as caught:
        launch_job(ws, "demo", "cpu", experiment, **{**args, **changes})
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not jobs.jobs_dir(ws).exists()  # nothing written


def test_an_experiment_job_takes_every_statistic_of_the_registry():
    import typing

    from polykv.jobs.spec import ExperimentSpec
    from polykv.profile.statistics import STATISTICS

    assert typing.get_args(ExperimentSpec.model_fields["statistic"].annotation) == tuple(STATISTICS)


def test_a_profile_of_another_model_is_refused(ws, small_profile):
    meta = ws / "profiles" / small_profile.key / "profile.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "model": "other/model"}))
    with pytest.raises(JobError, match="measured on 'other/model', not on 'demo'"):
        factorial_job(ws, small_profile)


def test_a_damaged_experiment_job_file_is_listed_as_damaged_and_the_valid_one_still_listed(ws, small_profile):
    good = factorial_job(ws, small_profile)
    jobs.save_job(good, ws)
    folder = jobs.jobs_dir(ws)
    base = json.loads((folder / f"{good.id}.json").read_text())
    spec = base["experiment"]
    unit = Unit.of("demo", Plan.homogeneous("tova", 24, 5), "fidelity", TINY_FIDELITY)
    run = jobs.eval_job([({}, unit)], "eval").runs[0].model_dump()
    bad = {
        "noexperiment": {**base, "experiment": None},
        "withruns": {**base, "runs": [run]},
        "unknownname": {**base, "experiment": {**spec, "name": "study"}},
        "extrafield": {**base, "experiment": {**spec, "shell": "rm -rf /"}},
        "stringbudget": {**base, "experiment": {**spec, "budget": "24"}},
        "nobaseline": {**base, "experiment": {**spec, "baseline": None}},
        "placementnok": {**base, "experiment": {**spec, "name": "placement", "k": 0}},
    }
    reasons = {
        "noexperiment": "an experiment job has experiment settings",
        "withruns": "an experiment job has experiment settings and no runs",
        "unknownname": "experiment.name: Input should be 'factorial', 'placement' or 'sweep'",
        "extrafield": "experiment.shell: unknown field",
        "stringbudget": "experiment.budget: Input should be a valid integer",
        "nobaseline": "a factorial needs a baseline",
        "placementnok": "at least one random placement",
    }
    for name, data in bad.items():
        (folder / f"{name}.json").write_text(json.dumps({**data, "id": name}))
    (folder / f"{good.id}.report.json").write_text("{not json")  # a report is never taken for a job
    found, damaged = jobs.scan_jobs(ws)
    assert [j.id for j in found] == [good.id]
    assert sorted(d.path.name for d in damaged) == sorted(f"{name}.json" for name in bad)
    for d in damaged:
        assert reasons[d.path.stem] in d.reason and "\n" not in d.reason, d.reason
    with pytest.raises(JobError, match="^job noexperiment: damaged job file"):
        jobs.load_job(ws, "noexperiment")
    with pytest.raises(JobError, match="malformed JSON"):  # a damaged report: one line, no traceback
        read_report(good, ws)
    with pytest.raises(JobError, match="^not a job id"):
        jobs.check_id(f"{good.id}.report")


CONTRAST = dict(difference=0.25, low=0.0, high=0.5, replicates=100, tasks=2, clusters=0, wins=2, ties=0, losses=0)
CONTRAST |= dict(leave_one_out={"t1": 0.5, "t2": 0.0}, loto_better=1)  # no sample-level test: as reports before it


def small_sweep(route_at_32: float) -> SweepData:
    return SweepData(
        metric="kl",
        direction=-1,
        route="r",
        scope="decode",
        budgets=[16, 32],
        baselines=["tova"],
        routes=["route-uniform"],
        scores={"route-uniform": {16: 0.5, 32: route_at_32}, "tova": {16: 0.75, 32: 0.25}},
        runs={"route-uniform": {16: "a", 32: "b"}, "tova": {16: "c", 32: "d"}},
        full=RunScore(run="f", score=0.0),
        envelope={16: BestBaseline(baseline="tova", score=0.75), 32: BestBaseline(baseline="tova", score=0.25)},
        versus_envelope={b: VersusBaseline(baseline="tova", **CONTRAST) for b in (16, 32)},
    )


def test_a_report_is_plain_json_and_reads_back_into_the_same_typed_data():
    report = Report("t", [{"budget": 16, "kl": 0.5}], ["a line"], small_sweep(float("nan")))
    assert report.data.scores["route-uniform"][32] is None  # an undefined number is None before a save, too
    data = report.to_dict()
    assert json.loads(json.dumps(data, allow_nan=False)) == data  # strict JSON: no NaN, string keys
    assert data["data"]["scores"]["route-uniform"] == {"16": 0.5, "32": None}
    assert data["data"]["experiment"] == "sweep" and data["data"]["versus_envelope"]["16"]["verdict"] == ""
    back = Report.from_dict(json.loads(json.dumps(data)))
    assert back == report and isinstance(back.data, SweepData)
    assert back.data.budgets == [16, 32] and set(back.data.envelope) == {16, 32}  # budgets are ints again
    assert back.data.versus_envelope[16].sample is None  # a report saved before samples were paired still reads


SAVED_REPORTS = sorted((Path(__file__).parent / "saved_reports").glob("*.json"))
KINDS = {"factorial": FactorialData, "placement": PlacementData, "sweep": SweepData}


def kept(old, new, where: str = "data") -> list[str]:
    """Where `new` lost or changed something `old` had (dicts: every key of old, recursively)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [p for k, v in old.items() for p in (kept(v, new[k], f"{where}.{k}") if k in new else [f"{where}.{k}"])]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [p for i, (a, b) in enumerate(zip(old, new)) for p in kept(a, b, f"{where}[{i}]")]
    return [] if old == new else [f"{where}: {old!r} -> {new!r}"]


@pytest.mark.parametrize("path", SAVED_REPORTS, ids=lambda path: path.stem)
def test_reports_saved_by_earlier_versions_read_back_typed_and_keep_every_number(path):
    saved = json.loads(path.read_text())
    report = Report.from_dict(saved)
    assert isinstance(report.data, KINDS[path.stem.split("-")[1]])
    again = report.to_dict()
    assert (again["title"], again["rows"], again["lines"]) == (saved["title"], saved["rows"], saved["lines"])
    old = saved["data"]
    if "double" in old:  # the 2b comparison's "matches" / "falls short" was saved as its verdict before it had a test
        old["double"] = {
            b: {**d, "match": d["verdict"], "verdict": ""} if "match" not in d else d for b, d in old["double"].items()
        }
    assert kept(old, again["data"]) == []
    assert Report.from_dict(again) == report


def test_a_report_that_is_not_one_is_refused_in_one_line():
    with pytest.raises(ValueError, match="not an experiment report"):
        Report.from_dict({"rows": []})
    saved = Report("t", data=small_sweep(0.5)).to_dict()
    factorial_saved = json.loads((Path(__file__).parent / "saved_reports" / "01d16e4-factorial.json").read_text())
    damages = [
        (saved, {"experiment": "tournament"}, "experiment"),
        (saved, {"budgets": "all"}, "budgets"),
        (saved, {"envelope": None}, "envelope"),
        (saved, {"budgets": [16, 32, 64]}, "the sweep's envelope has no budget 64"),  # loads, then cannot be drawn
        (saved, {"routes": ["route-uniform", "route-ppl"]}, "no scores or runs of route-ppl"),
        (factorial_saved, {"cells": {}}, "the factorial has no cell homogeneous-allocated"),
        (saved, {"scores": {"route-uniform": {"16": "high", "32": 0.1}, "tova": {"16": 0.1, "32": 0.1}}}, "scores"),
    ]
    for report, damage, said in damages:
        with pytest.raises(ValueError, match="^not an experiment report this version reads") as caught:
            Report.from_dict({**report, "data": {**report["data"], **damage}})
        assert "\n" not in str(caught.value) and said in str(caught.value)
    assert Report.from_dict(Report("being written").to_dict()) == Report("being written")  # no data yet: None


@pytest.mark.slow  # a four-run factorial in a job worker, then again in this process (runs found again)
def test_a_factorial_job_reports_progress_per_run_and_its_report_is_the_librarys(ws, small_profile, demo_model):
    job = factorial_job(ws, small_profile)
    with pytest.raises(JobError, match="has no report yet"):
        read_report(job, ws)
    assert jobs.start(job, ws).wait(timeout=600) == 0, jobs.log_tail(job, ws)
    state = jobs.state(jobs.load_job(ws, job.id), ws)
    assert state.status == "finished" and state.fraction == 1.0 and state.eta_s is None
    assert state.summary().startswith("100% · ") and " elapsed" in state.summary()
    log = jobs.log_tail(job, ws, lines=100)
    for i in range(1, 5):  # each of the four cells named as its run starts, then its samples counted
        assert f"run {i}/4 " in log and "building samples" in log
    assert "run 4/4 " in log and ": 4/4 " in log and log.splitlines()[-1].endswith("finished")
    fractions = [float(line.split("[")[1].split("%")[0]) for line in log.splitlines()]
    assert fractions == sorted(fractions)  # progress never goes back

    saved = read_report(job, ws)
    assert state.result.model_dump(exclude_unset=True) == {
        "report": str(jobs.report_path(ws, job.id)),
        "title": saved.title,
    }
    assert set(saved.data.cells) == set(FACTORIAL_CELLS)
    # the same factorial in this process finds the job's four runs and reports the same numbers
    model, tokenizer = demo_model
    store = Store(ws / "results.sqlite")
    runner = ExperimentRunner(store, "demo", model, tokenizer, "fidelity", TINY_FIDELITY, metric="kl")
    again = factorial(runner, small_profile, "decode", 24, "tova", allocation="entropy")
    assert saved == Report.from_dict(again.to_dict())
    assert len(store.runs()) == 4  # nothing was run twice


@pytest.mark.slow  # a placement job in a worker, cancelled during its first run, then resumed to the end
def test_a_placement_job_cancels_resumes_and_reports_each_placements_plan(ws, small_profile):
    job = launch_job(
        ws, "demo", "cpu", "placement", profile=small_profile.key, scope="decode", budget=24, k=2,
        settings=SLOW_FIDELITY.to_dict(), metric="kl",
    )  # fmt: skip
    jobs.start(job, ws)
    running = wait_for_job(job, ws, lambda s: s.status == "running" and s.fraction > 0)
    assert running.message.startswith("run 1/3 ") and running.fraction < 1 / 3
    assert running.summary().startswith(f"{running.fraction:.0%} · ")
    jobs.cancel(job, ws)
    state = jobs.state(jobs.load_job(ws, job.id), ws)
    assert state.status == "cancelled" and 0 < state.fraction < 1 / 3
    (run,) = Store(ws / "results.sqlite").runs()
    assert run.status == "cancelled"  # the run under way is marked, as in an evaluation job

    jobs.start(jobs.load_job(ws, job.id), ws).wait(timeout=600)
    state = jobs.state(jobs.load_job(ws, job.id), ws)
    assert state.status == "finished" and state.fraction == 1.0, jobs.log_tail(job, ws)
    written = json.loads((jobs.jobs_dir(ws) / f"{job.id}.state.json").read_text())
    assert written["start_fraction"] > 0  # the resumed worker started where the first one stopped
    data = read_report(job, ws).data
    assert [p.index for p in data.random] == [0, 1]
    for entry in [data.guided, *data.random]:
        plan = Plan.from_json(entry.plan_json)
        assert plan.name == entry.plan and isinstance(entry.profile_score, float) and isinstance(entry.score, float)


def test_the_jobs_worker_leaves_an_experiment_job_to_the_experiments_module(ws, small_profile, capsys):
    job = factorial_job(ws, small_profile)
    path = jobs.save_job(job, ws)
    assert jobs.main(["run", str(path), "--workspace", str(ws)]) == 2  # polykv.jobs cannot import the experiments
    assert "runs with python -m polykv.jobs.experiment" in capsys.readouterr().err
    assert jobs.state(job, ws).status == "waiting"  # nothing ran

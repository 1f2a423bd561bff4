"""Each long task has one library entry point: with it replaced (monkeypatch), the CLI command and the job's worker,
each run in this process, hand it the same experiment (the same plans, on the same suite settings, scored the same
way), then only print (the CLI) or save (the job) the report it returns. The study has no job kind: its CLI command
hands `run_study` the settings it parsed and writes the report it returns."""

from __future__ import annotations

import json
import signal

import pytest

from polykv import jobs
from polykv.eval.experiments import Report
from polykv.eval.experiments import run as experiment_run
from polykv.eval.results.store import Store
from polykv.eval.study import run as study_run
from polykv.jobs import experiment as experiment_jobs
from polykv.jobs.experiment import launch_job, read_report
from polykv.routing import plan_from_profile
from tests.helpers import TINY_FIDELITY, with_profile

REPORT = Report("fake experiment", [{"cell": "routed", "kl": 0.5}], ["a line of the report"])


class EntryPoint:
    """Stands in for `run_experiment`: keeps each call, tells the progress callbacks about the first plan, and
    returns `REPORT`."""

    def __init__(self):
        self.calls = []

    def __call__(self, experiment, setup, store, **hooks):
        self.calls.append((experiment, setup, store, hooks))
        hooks["on_run"](experiment.plans[0].name)
        hooks["on_sample"](1, 2, "prose")
        return REPORT


def run_worker(job, workspace) -> None:
    """The experiment job's worker, in this process (`python -m polykv.jobs.experiment run <job file>`)."""
    path = jobs.save_job(job, workspace)
    before = signal.getsignal(signal.SIGTERM)  # the worker takes SIGTERM as a cancel: give it back after
    try:
        assert experiment_jobs.job_main(["run", str(path), "--workspace", str(workspace)]) == 0
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("name", ["factorial", "placement", "sweep"])
def test_the_cli_and_the_job_both_run_an_experiment_through_run_experiment(
    name, polykv, tmp_path, monkeypatch, small_profile, capsys
):
    fake = EntryPoint()
    monkeypatch.setattr(experiment_run, "run_experiment", fake)
    ws = with_profile(tmp_path / "ws", small_profile)
    route = tmp_path / "route.json"
    plan_from_profile(small_profile, "decode", 24, "cosine", "uniform").save(route)
    shared = ("--settings", json.dumps(TINY_FIDELITY.to_dict()), "--metric", "kl", "-w", str(ws))
    profile = ("--profile", str(small_profile.path))
    own = {
        "factorial": (*profile, "--budget", "24", "--baseline", "tova"),
        "placement": (*profile, "--plan", str(route), "--k", "3"),
        "sweep": (*profile, "--plan", str(route), "--budgets", "16,32", "--baselines", "tova,h2o"),
    }[name]
    result = polykv("experiment", name, *own, *shared)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("fake experiment\n") and "a line of the report" in result.stdout  # printed
    assert "run: " in result.stderr  # its runs told to the progress bars (one line each off a terminal)
    (cli, setup, store, hooks), *more = fake.calls
    assert not more and cli.name == name and store == ws / "results.sqlite" and hooks["load"] is not None
    assert (setup.model, setup.suite, setup.settings, setup.metric, setup.seed) == (
        "demo",
        "fidelity",
        TINY_FIDELITY,
        "kl",
        0,
    )
    assert (setup.device, setup.backend, setup.batched) == ("cpu", "local", False)

    job = launch_job(
        ws, "demo", "cpu", name, profile=small_profile.key, scope="decode", budget=24, baseline="tova",
        allocation="entropy" if name == "factorial" else "uniform", k=3, budgets=[16, 32], baselines=["tova", "h2o"],
        settings=TINY_FIDELITY.to_dict(), metric="kl",
    )  # fmt: skip
    run_worker(job, ws)
    log = capsys.readouterr().out  # the worker's log: its stdout
    assert len(fake.calls) == 2
    experiment, setup, store, hooks = fake.calls[1]
    assert [p.to_json() for p in experiment.plans] == [p.to_json() for p in cli.plans]  # the same experiment
    assert setup == fake.calls[0][1] and isinstance(store, Store) and store.path == ws / "results.sqlite"
    state = jobs.state(job, ws)
    assert state.status == "finished" and state.result.model_dump(exclude_unset=True) == {
        "report": str(jobs.report_path(ws, job.id)),
        "title": REPORT.title,
    }
    assert f"run 1/{len(experiment.plans)} {experiment.plans[0].name}: 1/2 prose" in log
    assert read_report(job, ws) == REPORT  # saved as the entry point returned it, read back typed
    written = json.loads((jobs.jobs_dir(ws) / f"{job.id}.state.json").read_text())
    assert written["started"].endswith("+00:00") and written["pace_steps"] >= 0  # the state file's format


def test_the_study_command_runs_the_study_through_run_study(polykv, tmp_path, monkeypatch):
    calls = []
    result_of_the_study = object()

    def fake_study(settings, workspace, progress=None, **hooks):
        calls.append((settings, workspace, hooks))
        progress("profile")
        return result_of_the_study

    def fake_write(result, path, command=""):
        assert result is result_of_the_study
        calls.append((path, command))
        return path

    monkeypatch.setattr(study_run, "run_study", fake_study)
    monkeypatch.setattr(study_run, "write_report", fake_write)
    out, ws = tmp_path / "study.md", tmp_path / "ws"
    result = polykv(
        "experiment", "study", "-o", str(out), "-w", str(ws), "--budget", "32", "--budgets", "16,32", "--k", "2",
        "--samples", "2", "--statistic", "cosine",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (settings, workspace, hooks), (path, command) = calls
    assert (settings.model, settings.suite, settings.budget, settings.budgets) == ("demo", "fidelity", 32, (16, 32))
    assert (settings.placements, settings.samples_per_task, settings.statistic) == (2, 2, "cosine")
    assert workspace == ws and set(hooks) == {"on_run", "on_sample", "on_profile", "on_model"}
    assert path == out and command.startswith("polykv experiment study -o ")
    assert "study: profile" in result.stderr and result.stdout == f"wrote {out}\n"

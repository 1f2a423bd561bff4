"""Each search has one library entry point, and both the CLI and the app's search job call it: with the entry point
replaced (monkeypatch), `polykv search` and the search job's worker, each run in this process, hand it what they
were asked for, then only render (the CLI) or record (the job) the typed report it returns."""

from __future__ import annotations

import signal

import pytest

from polykv import jobs
from polykv.jobs import search as search_jobs
from polykv.jobs.search import launch_search, read_search
from polykv.jobs.spec import report_path
from polykv.search.text import run as text_run
from polykv.search.text.report import SearchReport
from polykv.search.workload import run as workload_run
from polykv.search.workload.report import WorkloadReport
from tests.helpers import REPO, with_profile

NIAH = "ruler:niah_single_1@512"  # the one RULER task whose prompts fit the demo model's 512 tokens


class EntryPoint:
    """Stands in for a search's entry point: keeps each call, writes a committed report where it is asked to and
    returns it, typed, with its searched plans."""

    def __init__(self, report):
        self.report, self.calls = report, []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        out, report_file = kwargs.get("out"), kwargs.get("report_file")
        if report_file is None and out is not None:
            out.mkdir(parents=True, exist_ok=True)
            report_file = out / "report.json"
        if report_file is not None:
            self.report.save(report_file)
        return self.report, self.plans()

    def plans(self):
        if isinstance(self.report, WorkloadReport):
            return [entry.plans["searched"] for entry in self.report.budgets]
        return [entry.plan for entry in self.report.budgets]


def run_worker(job, workspace) -> None:
    """The search job's worker, in this process (`python -m polykv.jobs.search run <job file>`)."""
    path = jobs.save_job(job, workspace)
    before = signal.getsignal(signal.SIGTERM)  # the worker takes SIGTERM as a cancel: give it back after
    try:
        assert search_jobs.main(["run", str(path), "--workspace", str(workspace)]) == 0
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_cli_and_the_job_both_run_the_text_search_through_run_text_search(
    polykv, tmp_path, monkeypatch, small_profile
):
    fake = EntryPoint(SearchReport.load(REPO / "docs" / "search" / "report.json"))
    monkeypatch.setattr(text_run, "run_text_search", fake)
    ws, out = with_profile(tmp_path / "ws", small_profile), tmp_path / "out"
    result = polykv(
        "search", "--profile", small_profile.key, "-b", "16", "--evaluations", "40", "--search-sequences", "2",
        "--held-out", "3", "--max-tokens", "128", "--seed", "3", "--out", str(out), "-w", str(ws),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (args, kwargs), *more = fake.calls
    assert not more
    model, tokenizer, name, profile, settings = args
    assert name == "demo" and profile.key == small_profile.key and kwargs["out"] == out
    assert (settings.budgets, settings.evaluations, settings.seed) == ((16,), 40, 3)
    assert (settings.search_sequences, settings.held_out, settings.max_tokens) == (2, 3, 128)
    # what the CLI prints is the returned report's verdict, read as attributes
    assert "budget 32: held-out, 48 sequences" in result.stdout and "budget 64: held-out" in result.stdout
    assert "searched - toprank" in result.stdout and "wrote" in result.stdout

    job = launch_search(
        ws, "demo", "cpu", profile=small_profile.key, scope="decode", budget=24, evaluations=40,
        search_sequences=2, held_out=2, max_tokens=96,
    )  # fmt: skip
    run_worker(job, ws)
    assert len(fake.calls) == 2
    args, kwargs = fake.calls[1]
    assert args[2] == "demo" and args[3].key == small_profile.key and args[4].budgets == (24,)
    assert kwargs["report_file"] == report_path(ws, job.id) and kwargs["command"] == f"app search job {job.id}"
    state = jobs.state(job, ws)
    assert state.status == "finished" and state.result.report == str(report_path(ws, job.id))
    assert state.result.best == fake.plans()[0].to_json()
    assert read_search(job, ws) == fake.report  # saved by the entry point, read back typed


def test_the_cli_and_the_job_both_run_the_workload_search_through_run_workload_search(polykv, tmp_path, monkeypatch):
    report = REPO / "docs" / "smollm2-workload" / "prefill-in-prompt" / "report.json"
    fake = EntryPoint(WorkloadReport.load(report))
    monkeypatch.setattr(workload_run, "run_workload_search", fake)
    ws, out = tmp_path / "ws", tmp_path / "out"
    result = polykv(
        "search", "--model", "demo", "-o", str(out), "-b", "32", "--objective", "answer_nll", "--sources", NIAH,
        "--search-sequences", "2", "--held-out", "3", "--evaluations", "12", "--competence", "0",
        "--workspace", str(ws),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (args, kwargs), *more = fake.calls
    assert not more
    model, tokenizer, name, workload, profile, settings = args
    assert name == "demo" and tuple(workload.tasks) == ("niah_single_1",) and profile == "auto"
    assert (settings.budgets, settings.search_per_task, settings.held_out, settings.competence) == ((32,), 2, 3, 0)
    assert kwargs["out"] == out and kwargs["time_one"] and kwargs["load_seconds"] is not None
    # the CLI prints the returned report's verdict tables: the committed report's four budgets
    assert all(f"budget {b}:" in result.stdout for b in (64, 128, 256, 512))
    assert "searched - homogeneous" in result.stdout

    job = launch_search(
        ws, "demo", "cpu", profile="auto", scope="decode", budget=32, sources=NIAH, evaluations=12,
        search_sequences=1, held_out=2, max_tokens=512, competence=0.0,
    )  # fmt: skip
    run_worker(job, ws)
    assert len(fake.calls) == 2
    args, kwargs = fake.calls[1]
    assert args[2] == "demo" and args[4] == "auto" and args[5].budgets == (32,) and args[5].held_out == 2
    assert kwargs["report_file"] == report_path(ws, job.id) and kwargs["store"].path == ws / "results.sqlite"
    state = jobs.state(job, ws)
    assert state.status == "finished" and state.result.best == fake.plans()[0].to_json()
    found = read_search(job, ws)
    assert isinstance(found, WorkloadReport) and found == fake.report


def test_a_workload_search_with_nowhere_to_store_its_runs_is_refused_before_any_work():
    from polykv.search.workload.run import run_workload_search

    with pytest.raises(ValueError, match="needs a results store or an output folder"):
        run_workload_search(None, None, "demo", None, None, None)

"""Background jobs: they run detached, report progress per run, can be cancelled, are seen as stopped
when their process dies, and resume without recomputing finished samples."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

from polykv import jobs
from polykv.eval.results.store import Store
from polykv.eval.running.unit import Unit
from polykv.plan import Plan, PlanError
from tests.helpers import SLOW_FIDELITY, TINY_FIDELITY, assert_one_line_error, wait_for_job


@pytest.mark.slow  # runs an eval job's units on the demo model
def test_an_eval_job_runs_units_on_the_same_samples_together_and_reports_progress(workspace):
    tova, h2o = Plan.homogeneous("tova", 24, 5), Plan.homogeneous("h2o", 24, 5)
    units = [
        ({"series": "tova"}, Unit.of("demo", tova, "fidelity", TINY_FIDELITY)),
        ({"series": "h2o"}, Unit.of("demo", h2o, "fidelity", TINY_FIDELITY)),
        ({"series": "tova, seed 1"}, Unit.of("demo", tova, "fidelity", TINY_FIDELITY, seed=1)),  # other samples
    ]
    job = jobs.eval_job(units, "three runs")
    assert [r.label["series"] for r in job.runs] == ["tova", "h2o", "tova, seed 1"]
    assert jobs.state(job, workspace).status == "waiting"
    process = jobs.start(job, workspace)
    assert process.wait(timeout=300) == 0
    state = jobs.state(jobs.load_job(workspace, job.id), workspace)
    assert state.status == "finished" and state.fraction == 1.0
    assert [(r.done, r.total, r.status) for r in state.runs] == [(4, 4, "finished")] * 3
    assert {r.id for r in Store(workspace / "results.sqlite").runs()} == {r.run_id for r in job.runs}
    log = jobs.log_tail(job, workspace, lines=50)
    # the two runs on the same samples share each prompt pass (`run_suites`); the third runs alone
    assert "runs 1-2/3 tova-both-24, h2o-both-24: 4/4" in log and "run 3/3 tova-both-24: 4/4" in log
    assert log.splitlines()[-1].endswith("finished")
    stamp = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00 \[ *\d+\.\d%\] ")
    assert all(stamp.match(line) for line in log.splitlines()), log  # every log line is time-stamped
    assert state.elapsed_s is not None and state.elapsed_s >= 0 and state.eta_s is None  # finished: no ETA
    assert state.summary().startswith("100% · ") and " elapsed" in state.summary()
    written = jobs.spec._read_state(workspace, job.id)  # the pace of real work: 8 samples, the first one aside
    assert written.pace_from is not None and written.pace_steps == 7 and written.pace_fraction == pytest.approx(1 / 6)


def test_progress_says_elapsed_time_and_an_eta_from_this_workers_pace():
    assert [jobs.duration(s) for s in (0, 44.6, 185, 7800)] == ["0 s", "45 s", "3 min 5 s", "2 h 10 min"]
    # a damaged record (a 1e308-second job) says so in words, not in a 312-digit hour count
    assert [jobs.duration(s) for s in (1e308, float("inf"), float("nan"))] == ["over a year", "over a year", "0 s"]
    assert jobs.eta(60.0, 0.25) == pytest.approx(180.0)  # a quarter in a minute: three more minutes
    assert jobs.eta(60.0, 0.75, start_fraction=0.5) == pytest.approx(60.0)  # resumed at half: its own pace
    assert jobs.eta(60.0, 0.5, start_fraction=0.5) is None and jobs.eta(5.0, 1.0) is None
    running = jobs.JobState(status="running", fraction=0.25, elapsed_s=60.0, eta_s=180.0)
    assert running.summary() == "25% · 1 min 0 s elapsed · about 3 min 0 s left"
    assert jobs.JobState(status="waiting", fraction=0.0).summary() == "0%"


def test_a_job_refuses_a_bad_plan_before_it_starts(workspace):
    bad = Plan.homogeneous("snapkv", 24, 5, "prefill")  # default window 32 does not fit under 24
    with pytest.raises(PlanError, match="window"):
        jobs.eval_job([({}, Unit.of("demo", bad, "fidelity", TINY_FIDELITY))], "bad")
    with pytest.raises(ValueError, match="at least one run"):
        jobs.eval_job([], "empty")


@pytest.mark.slow  # spawns a job worker
def test_cancel_stops_the_process_and_marks_the_runs_and_job_cancelled(workspace):
    units = [({}, Unit.of("demo", Plan.homogeneous(m, 24, 5), "fidelity", SLOW_FIDELITY)) for m in ("tova", "h2o")]
    job = jobs.eval_job(units, "slow")
    process = jobs.start(job, workspace)
    wait_for_job(job, workspace, lambda s: s.runs[0].done >= 1)
    jobs.cancel(job, workspace)
    assert process.poll() is not None
    state = jobs.state(jobs.load_job(workspace, job.id), workspace)
    assert state.status == "cancelled" and 1 <= state.runs[0].done < state.runs[0].total
    # both runs were under way (they share each prompt pass): both are marked
    assert [Store(workspace / "results.sqlite").run(r.run_id).status for r in job.runs] == ["cancelled"] * 2


@pytest.mark.slow  # spawns a job worker twice (24 samples)
def test_a_killed_job_is_stopped_and_resumes_without_recomputing(workspace):
    job = jobs.eval_job([({}, Unit.of("demo", Plan.homogeneous("h2o", 24, 5), "fidelity", SLOW_FIDELITY))], "killed")
    process = jobs.start(job, workspace)
    wait_for_job(job, workspace, lambda s: s.runs[0].done >= 2)
    os.killpg(process.pid, signal.SIGKILL)  # no chance to write anything: as if the machine went down
    process.wait()
    state = jobs.state(jobs.load_job(workspace, job.id), workspace)
    assert state.status == "stopped"
    done_before = {
        s.sample + s.task: s.created for s in Store(workspace / "results.sqlite").samples(job.runs[0].run_id)
    }
    assert len(done_before) >= 2
    jobs.start(jobs.load_job(workspace, job.id), workspace).wait(timeout=600)
    state = jobs.state(jobs.load_job(workspace, job.id), workspace)
    assert state.status == "finished" and state.runs[0].done == state.runs[0].total == 24
    after = {s.sample + s.task: s.created for s in Store(workspace / "results.sqlite").samples(job.runs[0].run_id)}
    assert all(after[k] == v for k, v in done_before.items())  # finished samples were kept, not redone


def test_a_job_seen_by_a_new_process_is_read_from_its_files(workspace):
    """An app restart sees the same jobs: everything is in files (and pid liveness is checked by name)."""
    job = jobs.eval_job([({}, Unit.of("demo", Plan.homogeneous("tova", 24, 5), "fidelity", TINY_FIDELITY))], "t")
    job.pid = os.getpid()  # alive, but not this job's worker: must not count as running
    jobs.save_job(job, workspace)
    assert jobs.state(jobs.load_job(workspace, job.id), workspace).status == "stopped"
    (jobs.jobs_dir(workspace) / "garbage.json").write_text("{not json")
    assert [j.id for j in jobs.list_jobs(workspace)] == [job.id]


@pytest.mark.slow  # spawns a job worker
def test_a_profile_job_writes_a_profile_and_reports_it(workspace):
    from polykv.profile.corpus import CorpusSpec
    from polykv.profile.store import load_profile

    spec = CorpusSpec(sources=("kjv",), num_sequences=1, max_tokens=96)
    job = jobs.profile_job("demo", "cpu", spec.to_dict(), None, ["decode"], "profile")
    assert jobs.start(job, workspace).wait(timeout=300) == 0
    state = jobs.state(job, workspace)
    assert state.status == "finished" and state.fraction == 1.0
    profile = load_profile(state.result.profile)
    assert profile.metadata["scopes"] == ["decode"] and profile.key == state.result.key
    state_file = jobs.jobs_dir(workspace) / f"{job.id}.state.json"
    assert json.loads(state_file.read_text())["status"] == "finished"


@pytest.mark.slow  # spawns a job worker
def test_a_failing_job_records_its_error_in_one_line(workspace, tmp_path):
    from polykv.profile.corpus import CorpusSpec

    text = tmp_path / "vanishing.txt"
    text.write_text("Once upon a time. " * 50)
    spec = CorpusSpec(sources=(f"file:{text}",), num_sequences=1, max_tokens=96)  # checked: the file exists
    job = jobs.profile_job("demo", "cpu", spec.to_dict(), None, ["decode"], "bad corpus")
    text.unlink()  # gone before the worker reads it
    assert jobs.start(job, workspace).wait(timeout=300) != 0
    state = jobs.state(job, workspace)
    assert state.status == "failed" and "\n" not in state.error and f"no such file {text}" in state.error


def test_cli_lists_jobs_and_refuses_unknown_ones_in_one_line(workspace, polykv):
    unit = Unit.of("demo", Plan.homogeneous("tova", 24, 5), "fidelity", TINY_FIDELITY)
    job = jobs.eval_job([({}, unit)], "listed job")
    jobs.save_job(job, workspace)
    listed = polykv("jobs", "list", "-w", str(workspace))
    assert listed.returncode == 0
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith(job.id)]
    assert "eval" in row and "listed job" in row and "waiting" in row
    assert_one_line_error(polykv("jobs", "cancel", "nope", "-w", str(workspace)), f"no job 'nope' in {workspace}")
    assert_one_line_error(polykv("jobs", "resume", "nope", "-w", str(workspace)), "no job 'nope'")


def test_the_eta_comes_with_the_first_piece_of_work_and_then_uses_only_their_pace(tmp_path, monkeypatch):
    import datetime

    from polykv.files import atomic_write_json
    from polykv.jobs import progress, spec

    job = spec.profile_job("demo", "cpu", {"sources": ["kjv"]}, None, ["decode"], "p")
    job = job.model_copy(update={"id": "20261204-000000-profile-abcdef"})
    now = datetime.datetime(2026, 12, 4, 12, 0, 0, tzinfo=datetime.UTC)
    clock = lambda: now  # noqa: E731  the state is read at `now`, whatever time it is
    at = lambda seconds: (now - datetime.timedelta(seconds=seconds)).isoformat(timespec="seconds")  # noqa: E731
    state_file = spec._spec_path(tmp_path, job.id).with_suffix(".state.json")
    state_file.parent.mkdir(parents=True)
    monkeypatch.setattr(progress, "_alive", lambda job, workspace: True)
    # 100 s ago the worker started; loading took 80 s; the first piece of work ended 20 s ago at 10%
    written = {"status": "running", "fraction": 0.3, "started": at(100), "pace_from": at(20), "pace_fraction": 0.1}
    atomic_write_json(state_file, {**written, "pace_steps": 1})
    first = jobs.state(job, tmp_path, clock=clock)  # one piece after the first: too few for a pace, but an upper one
    # 30% in 100 s since the worker started, loading included: at most 233 s for the 70% to go
    assert first.elapsed_s == 100.0 and first.eta_upper and first.eta_s == pytest.approx(100 * 0.7 / 0.3)
    assert "at most about 3 min 53 s left" in first.summary()
    atomic_write_json(state_file, {**written, "pace_steps": 2})
    measured = jobs.state(job, tmp_path, clock=clock)
    # 20% in the 20 s since the first piece: 70 s for the 70% to go (from the start's pace it would be 233 s)
    assert not measured.eta_upper and measured.eta_s == pytest.approx(70.0)
    assert measured.summary() == "30% · 1 min 40 s elapsed · about 1 min 10 s left"


def test_a_state_file_of_the_format_the_worker_writes_reads_back_typed_and_is_written_the_same(tmp_path):
    from polykv.files import atomic_write_json
    from polykv.jobs import spec

    job = spec.profile_job("demo", "cpu", {"sources": ["kjv"]}, None, ["decode"], "p")
    # a state file as the worker wrote it before the state was a model (a job resumed at a quarter, then finished)
    saved = {
        "status": "finished",
        "fraction": 1.0,
        "message": "finished",
        "error": None,
        "result": {"profile": "/ws/profiles/p", "key": "p"},
        "started": "2026-12-04T11:58:20+00:00",
        "start_fraction": 0.25,
        "updated": "2026-12-04T12:00:00+00:00",
        "pace_from": "2026-12-04T11:58:40+00:00",
        "pace_fraction": 0.375,
        "pace_steps": 5,
        "measured_s": 101.5,
    }
    atomic_write_json(spec._spec_path(tmp_path, job.id).with_suffix(".state.json"), saved)
    written = spec._read_state(tmp_path, job.id)
    assert isinstance(written, spec.StateFile) and written.pace_steps == 5 and written.start_fraction == 0.25
    assert written.started.tzinfo is not None and written.result.model_dump(exclude_unset=True) == {
        "profile": "/ws/profiles/p",
        "key": "p",
    }
    state = jobs.state(job, tmp_path)
    assert (state.status, state.fraction, state.elapsed_s, state.measured_s) == ("finished", 1.0, 100.0, 101.5)
    assert state.result.key == "p" and state.eta_s is None
    # what the worker writes now (the fields it set, as JSON) is that same file
    assert written.model_dump(mode="json", exclude_unset=True) == saved
    # a file the worker wrote before any piece of work: no pace yet, the reader's defaults
    early = {k: saved[k] for k in ("status", "fraction", "message", "error", "result", "started", "updated")}
    atomic_write_json(spec._spec_path(tmp_path, job.id).with_suffix(".state.json"), {**early, "status": "running"})
    again = spec._read_state(tmp_path, job.id)
    assert (again.pace_from, again.pace_steps, again.start_fraction, again.measured_s) == (None, 0, 0.0, None)

"""Background jobs are safe to cancel, resume and list: only the job's own worker is ever signalled
(pid, start time, host and exact command line must all match), cancel waits until the worker has
exited, a running job is not started twice, job ids cannot name paths, damaged job files are listed
as damaged instead of breaking the listing, and no finished worker is left a zombie."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from polykv import jobs
from polykv.errors import JobError
from polykv.eval.running.unit import Unit
from polykv.plan import Plan
from tests.helpers import (
    SLOW_FIDELITY,
    TINY_FIDELITY,
    assert_one_line_error,
    command_line,
    stop,
    wait_for_job,
    wait_until,
)

POLYKV = Path(sys.executable).with_name("polykv")


def stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (state, ppid, ..., starttime at index 19); None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def start_time(pid: int) -> int:
    return int(stat_fields(pid)[19])


def zombie_children() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = stat_fields(int(entry.name))
            if fields and fields[0] == "Z" and int(fields[1]) == os.getpid():
                found.append(int(entry.name))
    return found


def cli(*args: str) -> subprocess.CompletedProcess:
    """The real console script, in its own process (not a child of the workers' starter)."""
    return subprocess.run(
        [str(POLYKV), *args], capture_output=True, text=True, timeout=120, env=dict(os.environ), check=False
    )


def crafted(ws: Path, job_id: str, **worker) -> jobs.Job:
    job = jobs.profile_job("demo", "cpu", {"sources": ["kjv"]}, None, ["decode"], "crafted")
    job = job.model_copy(update={"id": job_id, **worker})  # as a file could say it: unchecked until read
    jobs.save_job(job, ws)
    return job


def test_cancel_never_signals_a_process_a_job_file_merely_names(tmp_path):
    ws = tmp_path / "ws"
    job_id = "crafted-job"
    spec = str((jobs.jobs_dir(ws) / f"{job_id}.json").resolve())
    # own sessions: even a regression that signalled a process group would not reach pytest
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    # a command line holding the job id, its file and most of the worker command (but not exactly it)
    named = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
            job_id,
            "-m",
            "polykv.jobs",
            "run",
            spec,
            "--workspace",
            str(ws.resolve()),
        ],
        start_new_session=True,
    )
    try:
        wait_until(lambda: command_line(sleeper.pid).startswith("sleep") and job_id in command_line(named.pid), 60)
        host = socket.gethostname()
        cases = [
            {"pid": sleeper.pid},
            {"pid": named.pid},
            {"pid": sleeper.pid, "pid_start": start_time(sleeper.pid), "host": host},
            {"pid": named.pid, "pid_start": start_time(named.pid), "host": host},
        ]
        for worker in cases:
            job = crafted(ws, job_id, **worker)
            assert not jobs._alive(job, ws)
            assert jobs.state(job, ws).status == "stopped"
            result = cli("jobs", "cancel", job_id, "-w", str(ws))
            assert result.returncode == 0, result.stderr
            assert (
                result.stdout.strip() == f"{job_id}: cancelled (no running worker of this job: nothing was signalled)"
            )
            assert sleeper.poll() is None and named.poll() is None, worker  # neither was signalled
            assert jobs.load_job(ws, job_id).cancelled  # the cancel is still recorded
    finally:
        stop(sleeper, named)


@pytest.mark.slow  # spawns a job worker and two CLI processes
def test_cancel_waits_for_the_worker_and_a_running_job_is_not_started_twice(workspace):
    job = jobs.eval_job([({}, Unit.of("demo", Plan.homogeneous("tova", 24, 5), "fidelity", SLOW_FIDELITY))], "slow")
    process = jobs.start(job, workspace)
    try:
        wait_for_job(job, workspace, lambda s: s.runs[0].done >= 1)
        saved = jobs.load_job(workspace, job.id)
        assert (saved.pid, saved.pid_start, saved.host) == (process.pid, start_time(process.pid), socket.gethostname())
        assert jobs._alive(saved, workspace)
        assert not jobs._alive(saved.model_copy(update=dict(host="elsewhere")), workspace)
        assert not jobs._alive(saved.model_copy(update=dict(pid_start=saved.pid_start + 1)), workspace)

        # start / resume while it runs: refused, in this process and from the CLI in another one
        with pytest.raises(JobError, match=rf"^job {job.id} is still running \(pid {process.pid}\): cancel it first$"):
            jobs.start(jobs.load_job(workspace, job.id), workspace)
        resumed = cli("jobs", "resume", job.id, "-w", str(workspace))
        assert_one_line_error(resumed, f"job {job.id} is still running (pid {process.pid}): cancel it first")

        # another job's file that copies this worker's pid, start time and host does not get it signalled
        jobs.save_job(saved.model_copy(update=dict(id="impostor")), workspace)
        result = cli("jobs", "cancel", "impostor", "-w", str(workspace))
        assert result.returncode == 0 and "nothing was signalled" in result.stdout, result
        assert process.poll() is None
        assert jobs.state(jobs.load_job(workspace, job.id), workspace).status == "running"

        assert jobs.cancel(job, workspace) is True
        assert process.returncode is not None  # cancel returned only once the worker had exited (and was reaped)
        assert not Path(f"/proc/{process.pid}").exists()
        state = jobs.state(jobs.load_job(workspace, job.id), workspace)
        assert state.status == "cancelled" and 1 <= state.runs[0].done < state.runs[0].total
        assert json.loads((jobs.jobs_dir(workspace) / f"{job.id}.state.json").read_text())["status"] == "cancelled"
    finally:
        stop(process)


def test_cancel_kills_a_worker_that_has_not_exited_by_the_timeout(workspace):
    job = jobs.eval_job([({}, Unit.of("demo", Plan.homogeneous("tova", 24, 5), "fidelity", SLOW_FIDELITY))], "killed")
    process = jobs.start(job, workspace)
    try:
        assert jobs.cancel(job, workspace, timeout=0.0) is True  # SIGTERM, no grace, then SIGKILL if still there
        assert process.returncode is not None and not Path(f"/proc/{process.pid}").exists()
        assert jobs.state(jobs.load_job(workspace, job.id), workspace).status == "cancelled"
    finally:
        stop(process)


BAD_IDS = ["a/b", "../x", "..", "a..b", "", "x" * 129, "/etc/passwd", ".hidden", "x.state", "a b"]


@pytest.mark.parametrize("command", ["cancel", "resume"])
def test_job_ids_that_are_not_plain_names_are_refused_in_one_line(tmp_path, polykv, command):
    ws = tmp_path / "ws"
    crafted(ws, "real-job")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for bad in BAD_IDS:
        assert_one_line_error(polykv("jobs", command, bad, "-w", str(ws)), "not a job id")
        with pytest.raises(JobError, match="^not a job id"):
            jobs.load_job(ws, bad)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written anywhere
    assert len("x" * 128) == 128 and jobs.check_id("x" * 128)  # the longest id is fine
    with pytest.raises(JobError, match="^not a job id"):
        jobs.start(jobs.load_job(ws, "real-job").model_copy(update={"id": "../escape"}), ws)
    assert not (tmp_path / "escape.json").exists()


def test_damaged_job_files_are_listed_as_damaged_and_valid_jobs_still_listed(tmp_path, polykv):
    ws = tmp_path / "ws"
    good = crafted(ws, "good-job")
    folder = jobs.jobs_dir(ws)
    base = json.loads((folder / "good-job.json").read_text())
    (folder / "notjson.json").write_text("{not json")
    (folder / "alist.json").write_text("[1, 2]")
    (folder / "noruns.json").write_text(
        json.dumps({**base, "id": "noruns", "kind": "eval", "profile": None, "runs": []})
    )
    (folder / "wrongtype.json").write_text(json.dumps({**base, "id": "wrongtype", "pid": "1234"}))
    (folder / "unknownkind.json").write_text(json.dumps({**base, "id": "unknownkind", "kind": "shell"}))
    (folder / "otherid.json").write_text(json.dumps({**base, "id": "good-job"}))
    with open(folder / "huge.json", "wb") as f:
        f.truncate(20 * 1024 * 1024)  # sparse: large to stat, nothing to write
    (folder / "x.json").mkdir()
    os.mkfifo(folder / "y.json")  # opening it for reading would hang: it must never be opened
    (folder / "good-job.state.json").write_text('{"status": "running", "fraction": "lots"}')  # damaged state: no state
    damaged = {
        "notjson": "malformed JSON",
        "alist": "should be a JSON object",
        "noruns": "at least one run",
        "wrongtype": "pid: Input should be a valid integer",
        "unknownkind": "kind:",
        "otherid": "not its file name",
        "huge": "more than",
        "x": "a directory",
        "y": "a FIFO",
    }

    listed = polykv("jobs", "list", "-w", str(ws))
    assert listed.returncode == 0 and "Traceback" not in listed.stdout + listed.stderr, listed
    lines = listed.stdout.splitlines()
    (row,) = [line for line in lines if line.startswith("good-job ")]
    assert "crafted" in row and "waiting" in row
    for name, reason in damaged.items():
        (line,) = [line for line in lines if line.startswith(f"damaged: {folder / name}.json: ")]
        assert reason in line, line
    assert len([line for line in lines if line.startswith("damaged: ")]) == len(damaged)

    found, bad = jobs.scan_jobs(ws)
    assert [j.id for j in found] == ["good-job"] == [j.id for j in jobs.list_jobs(ws)]
    assert sorted(d.path.name for d in bad) == sorted(f"{name}.json" for name in damaged)
    assert all("\n" not in d.reason for d in bad)
    for name in ("noruns", "huge", "y"):
        with pytest.raises(JobError, match=f"^job {name}: damaged job file"):
            jobs.load_job(ws, name)
    with pytest.raises(JobError, match="^no job 'missing'"):
        jobs.load_job(ws, "missing")

    assert jobs.state(good, ws).status == "waiting"  # the damaged state file reads as no state
    (folder / "good-job.state.json").write_text("[]")
    assert jobs.state(good, ws).status == "waiting"
    empty = good.model_copy(
        update=dict(kind="eval", profile=None, runs=[])
    )  # never from a file, but must not divide by 0
    assert jobs.state(empty, ws).fraction == 0.0
    assert not (ws / "results.sqlite").exists()  # reading progress never creates the results database


@pytest.mark.slow  # spawns a job worker and watches it to the end
def test_a_finished_worker_is_reaped_without_anyone_waiting_for_it(workspace):
    job = jobs.eval_job([({}, Unit.of("demo", Plan.homogeneous("tova", 24, 5), "fidelity", TINY_FIDELITY))], "short")
    process = jobs.start(job, workspace)
    pid = process.pid
    try:
        # watch /proc only: no jobs.state (it polls), no wait: the reaper thread alone must reap it
        wait_until(lambda: stat_fields(pid) is None, 600, lambda: f"worker {pid} is still there: {stat_fields(pid)}")
        assert zombie_children() == []
        written = json.loads((jobs.jobs_dir(workspace) / f"{job.id}.state.json").read_text())
        assert written["status"] == "finished", jobs.log_tail(job, workspace)
    finally:
        stop(process)

"""A job's worker process: starting it (detached, one start at a time), reaping it, telling whether
the process a job file names really is this job's worker, signalling it and cancelling the job."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from polykv import processes
from polykv.errors import JobError
from polykv.jobs.spec import (
    Job,
    _job_from_file,
    _read_state,
    _spec_path,
    check_id,
    jobs_dir,
    load_job,
    report_path,
    save_job,
)

_children: dict[int, subprocess.Popen] = {}  # workers this process started (each also has a reaper thread)

# The kinds whose work lives in a module of their own run with that module as the worker command (it hands
# its work to `worker.main`); the generic worker, `python -m polykv.jobs`, refuses them.
WORKER_MODULES = {"experiment": "polykv.jobs.experiment", "search": "polykv.jobs.search"}


def _worker_argv(workspace: Path, job_id: str, kind: str) -> list[str]:
    """The worker command for this job's file: what `start` runs and what `_alive` recognises."""
    workspace = Path(workspace)
    return [
        sys.executable,
        "-m",
        WORKER_MODULES.get(kind, "polykv.jobs"),
        "run",
        str(_spec_path(workspace, job_id).resolve()),
        "--workspace",
        str(workspace.resolve()),
    ]


@contextlib.contextmanager
def _start_lock(workspace: Path, job_id: str) -> Iterator[None]:
    """Serialise starts of one job (two Resume clicks, the app and the CLI) on this machine."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    folder = jobs_dir(workspace)
    folder.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(folder / f".{check_id(job_id)}.lock", flags, 0o644)
    except OSError as exc:
        raise JobError(f"job {job_id}: cannot lock it to start ({exc.strerror or exc.__class__.__name__})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _reap_in_background(process: subprocess.Popen) -> None:
    """Wait for `process` in a daemon thread, so it is reaped the moment it exits (no zombie)."""

    def reap() -> None:
        with contextlib.suppress(Exception):
            process.wait()
        if _children.get(process.pid) is process:  # its pid may now go to another process
            del _children[process.pid]

    threading.Thread(target=reap, name=f"polykv-job-reaper-{process.pid}", daemon=True).start()


def start(job: Job, workspace: Path) -> subprocess.Popen:
    """Save `job` and start its worker, detached (own session), output to its log. Starting a stopped
    job again resumes it: finished samples are not recomputed. JobError while its worker still runs."""
    workspace = Path(workspace)
    path = _spec_path(workspace, job.id)
    with _start_lock(workspace, job.id):
        try:
            saved: Job | None = _job_from_file(path) if path.exists() else None
        except JobError:
            saved = None  # a damaged file names no worker we could verify; it is replaced below
        for known in (saved, job):
            if known is not None and _alive(known, workspace):
                raise JobError(f"job {job.id} is still running (pid {known.pid}): cancel it first")
        log_path = path.with_suffix(".log")
        if log_path.exists() and not log_path.is_file():
            raise JobError(f"job {job.id}: its log {log_path} is not a regular file")
        job.cancelled, job.pid, job.pid_start, job.host = False, None, None, None
        save_job(job, workspace)
        written = _read_state(workspace, job.id)
        if written is None or written.status != "finished":  # a fresh start: forget how the last one ended
            try:
                path.with_suffix(".state.json").unlink(missing_ok=True)
                report_path(workspace, job.id).unlink(missing_ok=True)  # a report says the job finished
            except OSError as exc:
                raise JobError(f"job {job.id}: cannot remove its old state file ({exc.strerror or exc})") from None
        log = open(log_path, "ab")  # noqa: SIM115 - the child keeps it open
        try:
            process = subprocess.Popen(
                _worker_argv(workspace, job.id, job.kind),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        _children[process.pid] = process
        job.pid, job.host = process.pid, socket.gethostname()
        job.pid_start = processes.start_time(process.pid)
        _reap_in_background(process)  # after reading its start time: a reaped pid has no /proc entry
        save_job(job, workspace)
    return process


# ---- is the worker alive, and is it ours -------------------------------------------------------------
def _alive(job: Job, workspace: Path) -> bool:
    """True only when the job's recorded worker runs, here, and is this job's worker: same pid, same
    start time, on this host, with the exact worker command for this job's file (the python may differ)."""
    pid = job.pid
    if type(pid) is not int or pid <= 1 or pid == os.getpid() or job.host != socket.gethostname():
        return False
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        return False  # ours, and it has exited
    if not processes.have_proc():
        return processes.pid_exists(pid)
    before = processes.proc_state(pid)
    if not processes.running(before) or job.pid_start is None or before[1] != job.pid_start:
        return False
    argv = processes.cmdline(pid)
    if argv is None or argv[1:] != _worker_argv(workspace, job.id, job.kind)[1:]:
        return False
    after = processes.proc_state(pid)  # the same process still (not a new one that got the pid between the reads)
    return processes.running(after) and after[1] == job.pid_start


def _exited(job: Job) -> bool:
    """The recorded worker is no longer running (gone, a zombie, or its pid now belongs to another process)."""
    if not processes.have_proc():
        return not processes.pid_exists(job.pid)
    state = processes.proc_state(job.pid)
    return not processes.running(state) or state[1] != job.pid_start


def _wait_exited(job: Job, timeout: float) -> bool:
    deadline = time.monotonic() + max(0.0, timeout)
    child = _children.get(job.pid)
    if child is not None and child.returncode is None:  # ours: wait until it is reaped (by its reaper or here)
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False
    while not _exited(job):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _signal(job: Job, workspace: Path, signum: int) -> bool:
    """Send `signum` to the job's worker if, and only if, it is verifiably ours; True when sent."""
    pidfd = None
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal") and type(job.pid) is int and job.pid > 1:
        try:  # a handle on this very process: the check below and the signal cannot hit a reused pid
            pidfd = os.pidfd_open(job.pid)
        except OSError:
            pidfd = None
    try:
        if not _alive(job, workspace):
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signum)
        else:
            os.kill(job.pid, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def cancel(job: Job, workspace: Path, timeout: float = 10.0) -> bool:
    """Stop the job's worker and record the cancel in its file; True when a worker was signalled.

    Only a process verified to be this job's worker is signalled: SIGTERM (the worker records
    "cancelled"), then up to `timeout` seconds for it to exit, then SIGKILL. Returns once it has exited."""
    workspace = Path(workspace)
    try:
        current = load_job(workspace, job.id)  # the file names the latest worker (a resume may have started one)
    except JobError:
        current = job
    signalled = False
    for known in [current] if current is job else [current, job]:
        if _signal(known, workspace, signal.SIGTERM):
            signalled = True
            if not _wait_exited(known, timeout):
                # not signalled when it is already exiting (a zombie is not alive); wait either way, so that
                # cancel returns only once the worker has exited and, when it is ours, been reaped
                _signal(known, workspace, signal.SIGKILL)
                _wait_exited(known, 5.0)
            break
    current.cancelled = job.cancelled = True
    save_job(current, workspace)
    return signalled

"""Background jobs: evaluations and profiles that run in their own process and outlive whoever started
them (the web app, a CLI call). A job survives page reloads and app restarts because everything about
it lives in files under `<workspace>/jobs/`:

  <id>.json        what to do (written once by the starter, then only to record the worker or a cancel)
  <id>.state.json  how far it got: status, fraction done, last message, error, result (the worker writes it)
  <id>.report.json an experiment job's report (`Report.to_dict`), written when it finishes
  <id>.log         the worker's output

An evaluation job runs its units one after another in one process (the model loads once) through
`run_suite`, so progress per run is the store's sample count, and a stopped job resumes where it
stopped when started again. A profile job runs `build_profile`. An experiment job runs one of the
library's experiments (`polykv.eval.experiments`: factorial, placement or sweep) through an
`ExperimentRunner`; its runs are found again in the store, so it too resumes where it stopped.

A job file records its worker: pid, the process's start time and the host. A process counts as the
job's worker only when all three match and its exact command line is the worker command for this
job's file, so a job file that names some other process (edited by hand, or left over after the pid
was reused) never gets that process signalled. Cancelling sends SIGTERM to that one process (the
worker records "cancelled" before it exits), waits until it has exited, and kills it if it has not
after the timeout. Every worker this process starts is waited for by a daemon thread, so none is left
a zombie under a long-lived starter (the app server).

Job files and state files are read with `polykv.files.read_json` and validated; a damaged one is
reported (`scan_jobs`), never fatal. Job ids are checked wherever a user can give one.

Run a job file by hand with `python -m polykv.jobs run <workspace>/jobs/<id>.json --workspace <workspace>`
(an experiment job: `python -m polykv.eval.experiments run ...`, the module that runs its work).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import typing
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from polykv import processes
from polykv.errors import JobError, PolyKVError, first_line, validation_line
from polykv.eval.store import Store
from polykv.eval.unit import Unit
from polykv.files import atomic_write_json, read_json
from polykv.plan import Phase, Plan

FINAL = ("finished", "failed", "cancelled")
MAX_JOB_BYTES = 16 * 1024 * 1024  # a job with thousands of runs is still far smaller; this bounds memory only
MAX_STATE_BYTES = 1024 * 1024
MAX_REPORT_BYTES = 64 * 1024 * 1024  # a placement report holds K plans: K = 999 of 80 layers is ~20 MB
EXPERIMENTS = ("factorial", "placement", "sweep")
_children: dict[int, subprocess.Popen] = {}  # workers this process started (each also has a reaper thread)
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def check_id(job_id: object) -> str:
    """`job_id` when it is a valid job id (it names files, so no path segments); JobError otherwise."""
    if (
        isinstance(job_id, str)
        and _ID.fullmatch(job_id)
        and ".." not in job_id
        and not job_id.endswith((".state", ".report"))  # <id>.state.json, <id>.report.json are not jobs
    ):
        return job_id
    shown = repr(job_id)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise JobError(
        f"not a job id: {shown} (1 to 128 letters, digits, '.', '_' or '-', starting with a letter or "
        "digit; no '..', not ending in '.state' or '.report')"
    )


@dataclass
class RunUnit:
    """One run of an evaluation job and what it stands for (`label`, e.g. {"series": "tova", "budget": 64})."""

    run_id: str
    plan_name: str
    label: dict[str, Any]
    unit: dict[str, Any]  # the fields of `Unit`


@dataclass
class Job:
    id: str
    kind: str  # "eval", "profile", "experiment" or "search"
    title: str
    model: str
    device: str
    created: str
    runs: list[RunUnit] = field(default_factory=list)
    profile: dict[str, Any] | None = None  # profile jobs: corpus (CorpusSpec dict), capacity, scopes
    experiment: dict[str, Any] | None = None  # experiment jobs: which one and its arguments (`_ExperimentFile`)
    search: dict[str, Any] | None = None  # search jobs: the search's arguments (`_SearchFile`)
    pid: int | None = None  # the worker: its pid, start time (Linux clock ticks since boot) and host
    pid_start: int | None = None
    host: str | None = None
    cancelled: bool = False

    @classmethod
    def from_dict(cls, data: Any) -> Job:
        """A job from its file's data, validated; JobError (one line) when it is not a job."""
        try:
            checked = _JobFile.model_validate(data)
        except ValidationError as exc:
            raise JobError(validation_line(exc)) from None
        values = checked.model_dump()
        runs = [RunUnit(**r) for r in values.pop("runs")]
        return cls(**values, runs=runs)


@dataclass(frozen=True)
class DamagedJob:
    """A file in the jobs folder that is not a readable job, and why (one line)."""

    path: Path
    reason: str


@dataclass
class RunProgress:
    run_id: str
    plan_name: str
    label: dict[str, Any]
    done: int
    total: int | None  # None until the run has built its samples
    status: str  # the store's status, or "waiting"


@dataclass
class JobState:
    status: str  # waiting, running, finished, failed, cancelled, stopped (the process died)
    fraction: float
    message: str
    error: str | None
    result: dict[str, Any]
    runs: list[RunProgress]
    elapsed_s: float | None = None  # seconds the latest worker has run (until its last report once it ended)
    eta_s: float | None = None  # seconds left at the worker's pace so far (running jobs with some progress)

    def summary(self) -> str:
        """`42% · 1 min 3 s elapsed · about 1 min 27 s left`: what a progress bar's text says."""
        parts = [f"{self.fraction:.0%}"]
        if self.elapsed_s is not None:
            parts.append(f"{duration(self.elapsed_s)} elapsed")
        if self.eta_s is not None:
            parts.append(f"about {duration(self.eta_s)} left")
        return " · ".join(parts)


def duration(seconds: float) -> str:
    """A duration as people say it: `45 s`, `3 min 5 s`, `2 h 10 min`."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def eta(elapsed: float, fraction: float, start_fraction: float = 0.0) -> float | None:
    """Seconds left if the rest goes at the pace since the worker started (at `start_fraction`: a resumed
    job does not count work done before); None until there is progress to extrapolate from."""
    gained = fraction - start_fraction
    if gained <= 1e-6 or fraction >= 1.0:
        return None
    return elapsed * (1.0 - fraction) / gained


# ---- what a job file and a state file may hold ------------------------------------------------------
def _unit_model() -> type[BaseModel]:
    """The fields of `Unit` (taken from the dataclass, so the two cannot drift apart), strictly typed."""
    hints = typing.get_type_hints(Unit)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Unit):
        fields[f.name] = (hints[f.name], ... if f.default is dataclasses.MISSING else f.default)
    return create_model("UnitFields", __config__=ConfigDict(extra="forbid", strict=True), **fields)


_UnitFields = _unit_model()


class _RunUnitFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    run_id: str = Field(min_length=1)
    plan_name: str
    label: dict[str, Any]
    unit: _UnitFields  # type: ignore[valid-type]


class _ProfileFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    corpus: dict[str, Any]
    capacity: int | None = None
    scopes: list[Literal[tuple(p.value for p in Phase)]] = Field(min_length=1)  # type: ignore[misc]


class _ExperimentFile(BaseModel):
    """An experiment job's arguments: the route (guided plan) is TopRank by `statistic` from `profile`
    in `scope` at `budget` with `allocation` capacities; the factorial's allocated arm is `allocation`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: Literal[EXPERIMENTS]  # type: ignore[valid-type]
    profile: str = Field(min_length=1, max_length=4096)  # a profile key in <workspace>/profiles, or a path
    scope: Literal["prefill", "decode", "both"]
    budget: int = Field(ge=1)
    budgets: list[int] = Field(default_factory=list)  # the sweep's
    baseline: str | None = None  # the factorial's homogeneous method
    baselines: list[str] | None = None  # the sweep's (None: every method with a protocol)
    statistic: Literal["cosine", "dppl"] = "cosine"
    allocation: Literal["uniform", "entropy", "ppl"] = "uniform"
    k: int = Field(default=0, ge=0)  # the placement control's random placements
    suite: Literal["fidelity", "longbench", "ruler"] = "fidelity"
    settings: dict[str, Any] = Field(default_factory=dict)
    metric: str = "top1"
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _fits(self) -> _ExperimentFile:
        if self.name == "factorial" and not self.baseline:
            raise ValueError("a factorial needs a baseline (its homogeneous method)")
        if self.name == "factorial" and self.allocation == "uniform":
            raise ValueError("the factorial's allocated arm must differ from uniform (entropy or ppl)")
        if self.name == "placement" and self.k < 1:
            raise ValueError("a placement control needs at least one random placement (k)")
        if self.name == "sweep" and (not self.budgets or min(self.budgets) < 1):
            raise ValueError("a sweep needs budgets, positive whole numbers")
        return self


class _SearchFile(BaseModel):
    """A plan search's arguments (`polykv.search`): from `start` (a plan's JSON, the designer's) when it is
    in the search space, TopRank by `statistic` from `profile` and the best homogeneous plan, at `budget`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    profile: str = Field(min_length=1, max_length=4096)  # a profile key in <workspace>/profiles, or a path
    scope: Literal["prefill", "decode", "both"]
    budget: int = Field(ge=2)
    evaluations: int = Field(ge=1, le=1_000_000)
    seed: int = Field(default=0, ge=0)
    search_sequences: int = Field(ge=1, le=10_000)
    held_out: int = Field(ge=2, le=10_000)
    max_tokens: int = Field(ge=16, le=1_048_576)
    candidates: int = Field(default=8, ge=1, le=1000)
    metric: Literal["kl", "dppl"] = "kl"
    statistic: Literal["cosine", "dppl"] = "dppl"
    start: str | None = Field(default=None, max_length=4 * 1024 * 1024)


class _JobFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    id: str
    kind: Literal["eval", "profile", "experiment", "search"]
    title: str
    model: str
    device: str
    created: str
    runs: list[_RunUnitFile] = Field(default_factory=list)
    profile: _ProfileFile | None = None
    experiment: _ExperimentFile | None = None
    search: _SearchFile | None = None
    pid: int | None = Field(default=None, gt=1)
    pid_start: int | None = Field(default=None, ge=0)
    host: str | None = None
    cancelled: bool = False

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        try:
            return check_id(value)
        except JobError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _kind_fits(self) -> _JobFile:
        if self.kind == "eval" and not self.runs:
            raise ValueError("an evaluation job needs at least one run")
        settings = {"profile": self.profile, "experiment": self.experiment, "search": self.search}
        own = None if self.kind == "eval" else self.kind
        article = "an" if self.kind[0] in "aeiou" else "a"
        if own is not None and (settings[own] is None or self.runs):
            raise ValueError(f"{article} {own} job has {own} settings and no runs")
        others = [name for name, value in settings.items() if name != own and value is not None]
        if others:
            raise ValueError(f"{article} {self.kind} job has no {others[0]} settings")
        return self


class _StateFile(BaseModel):
    model_config = ConfigDict(extra="ignore")  # the worker may write more (started, updated)

    status: Literal["running", "finished", "failed", "cancelled"]
    fraction: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    start_fraction: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    message: str = ""
    error: str | None = None
    result: dict[str, Any] = Field(default_factory=dict)
    started: datetime.datetime | None = None
    updated: datetime.datetime | None = None

    @field_validator("started", "updated")
    @classmethod
    def _aware(cls, value: datetime.datetime | None) -> datetime.datetime | None:
        return value.replace(tzinfo=datetime.UTC) if value is not None and value.tzinfo is None else value


# ---- building and starting jobs ----------------------------------------------------------------------
def _new_id(kind: str) -> str:
    return f"{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}-{kind}-{uuid.uuid4().hex[:6]}"


def eval_job(units: list[tuple[dict[str, Any], Unit]], title: str) -> Job:
    """A job that runs `units` (each with its label) in order; they must share model and device."""
    from polykv.eval.runner import run_id_for
    from polykv.methods import validate_plan

    if not units:
        raise ValueError("an evaluation job needs at least one run")
    models = {(u.model, u.device) for _, u in units}
    if len(models) != 1:
        raise ValueError("the runs of one job must use one model on one device")
    model, device = models.pop()
    runs = []
    for label, unit in units:
        plan = validate_plan(Plan.from_json(unit.plan_json))  # refuse a bad plan here, not in the background
        run_id = run_id_for(unit.model, plan, unit.suite, unit.settings().to_dict(), unit.seed)
        runs.append(RunUnit(run_id, plan.name, dict(label), asdict(unit)))
    return Job(_new_id("eval"), "eval", title, model, device, _now(), runs=runs)


def profile_job(
    model: str, device: str, corpus: dict[str, Any], capacity: int | None, scopes: list[str], title: str
) -> Job:
    return Job(
        _new_id("profile"),
        "profile",
        title,
        model,
        device,
        _now(),
        profile={"corpus": corpus, "capacity": capacity, "scopes": list(scopes)},
    )


def experiment_job(model: str, device: str, experiment: dict[str, Any], title: str) -> Job:
    """A job that runs the library's experiment `experiment` describes (see `_ExperimentFile`); JobError (one
    line) when it is not a valid description. `polykv.eval.experiments.launch_job` builds one and checks,
    before anything runs in the background, that the profile, the settings and every plan are good."""
    try:
        spec = _ExperimentFile.model_validate(experiment).model_dump()
    except ValidationError as exc:
        raise JobError(validation_line(exc)) from None
    return Job(_new_id("experiment"), "experiment", title, model, device, _now(), experiment=spec)


def search_job(model: str, device: str, search: dict[str, Any], title: str) -> Job:
    """A job that runs a plan search (`_SearchFile`); JobError (one line) when it is not a valid description.
    `polykv.search.job.launch_search` builds one and checks the profile and the start plan first."""
    try:
        spec = _SearchFile.model_validate(search).model_dump()
    except ValidationError as exc:
        raise JobError(validation_line(exc)) from None
    return Job(_new_id("search"), "search", title, model, device, _now(), search=spec)


def report_path(workspace: Path, job_id: str) -> Path:
    """Where an experiment job's report goes: <workspace>/jobs/<id>.report.json."""
    return jobs_dir(workspace) / f"{check_id(job_id)}.report.json"


def jobs_dir(workspace: Path) -> Path:
    return Path(workspace) / "jobs"


def _spec_path(workspace: Path, job_id: str) -> Path:
    return jobs_dir(workspace) / f"{check_id(job_id)}.json"


# Experiment jobs run in `polykv.eval.experiments`, which calls `main` here: that module imports this one
# (through its backends), so this one never imports it, and names it only as a command.
WORKER_MODULES = {"experiment": "polykv.eval.experiments", "search": "polykv.search.job"}


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


def save_job(job: Job, workspace: Path) -> Path:
    path = _spec_path(workspace, job.id)
    atomic_write_json(path, asdict(job))
    return path


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
        if _read_state(workspace, job.id).get("status") != "finished":  # a fresh start: forget how the last one ended
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


# ---- reading jobs ------------------------------------------------------------------------------------
def _job_from_file(path: Path) -> Job:
    """The job in `path`; JobError whose one line says what is wrong (without the path)."""
    prefix = f"{path}: "
    try:
        data = read_json(path, "job file", max_bytes=MAX_JOB_BYTES, error=JobError)
    except JobError as exc:
        raise JobError(str(exc).removeprefix(prefix)) from None
    job = Job.from_dict(data)
    if path.name != f"{job.id}.json":
        raise JobError(f"its id {job.id!r} is not its file name")
    return job


def load_job(workspace: Path, job_id: str) -> Job:
    """The job `job_id` of `workspace`; JobError (one line) for a bad id, a missing or a damaged job."""
    path = _spec_path(workspace, job_id)
    if not os.path.lexists(path):
        raise JobError(f"no job {job_id!r} in {workspace}")
    try:
        return _job_from_file(path)
    except JobError as exc:
        raise JobError(f"job {job_id}: damaged job file {path}: {exc}") from None


def scan_jobs(workspace: Path) -> tuple[list[Job], list[DamagedJob]]:
    """The jobs of the workspace, newest first, and the files in its jobs folder that are not jobs."""
    folder = jobs_dir(workspace)
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [DamagedJob(folder, f"cannot read the jobs folder ({exc.strerror or exc.__class__.__name__})")]
    found, damaged = [], []
    for name in names:
        if not name.endswith(".json") or name.endswith((".state.json", ".report.json")) or name.startswith("."):
            continue
        path = folder / name
        try:
            check_id(name[: -len(".json")])
            found.append(_job_from_file(path))
        except JobError as exc:
            damaged.append(DamagedJob(path, str(exc)))
    return sorted(found, key=lambda j: j.created + j.id, reverse=True), damaged


def list_jobs(workspace: Path) -> list[Job]:
    """Every valid job in the workspace, newest first (damaged files: `scan_jobs`)."""
    return scan_jobs(workspace)[0]


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


# ---- where a job stands --------------------------------------------------------------------------------
def _read_state(workspace: Path, job_id: str) -> dict[str, Any]:
    """The worker's state file, validated; {} when there is none or it is damaged (never raises)."""
    path = _spec_path(workspace, job_id).with_suffix(".state.json")
    if not os.path.lexists(path):
        return {}
    try:
        return _StateFile.model_validate(
            read_json(path, "job state file", max_bytes=MAX_STATE_BYTES, error=JobError)
        ).model_dump()
    except (PolyKVError, ValidationError, OSError):
        return {}


def _progress(workspace: Path, run_ids: list[str]) -> dict[str, tuple[int, int, str]]:
    path = Path(workspace) / "results.sqlite"
    if not path.is_file():
        return {}
    try:
        return Store(path, readonly=True).progress(run_ids)
    except (PolyKVError, sqlite3.Error, OSError):
        return {}  # a damaged store: no progress to show (the runs themselves report the damage)


def _eval_fraction(runs: list[RunProgress]) -> float:
    parts = [1.0 if r.status == "finished" else min(1.0, r.done / r.total) if r.total else 0.0 for r in runs]
    return sum(parts) / len(parts) if parts else 0.0


def _run_progress(job: Job, workspace: Path) -> list[RunProgress]:
    progress = _progress(workspace, [r.run_id for r in job.runs])
    runs = []
    for r in job.runs:
        done, total, status = progress.get(r.run_id, (0, None, "waiting"))
        runs.append(RunProgress(r.run_id, r.plan_name, r.label, done, total, status))
    return runs


def state(job: Job, workspace: Path) -> JobState:
    """Where a job stands, from its state file, its process and (for evaluations) the results store."""
    workspace = Path(workspace)
    written = _read_state(workspace, job.id)
    runs: list[RunProgress] = []
    if job.kind == "eval":
        runs = _run_progress(job, workspace)
        fraction = _eval_fraction(runs)
    else:
        fraction = float(written.get("fraction", 0.0))
    status = written.get("status", "waiting")
    if status not in FINAL:
        if job.cancelled:
            status = "cancelled"
        elif _alive(job, workspace):
            status = "running"
        elif job.pid is not None:
            status = "stopped"
    elapsed = left = None
    started = written.get("started")
    if started is not None:
        end = datetime.datetime.now(datetime.UTC) if status == "running" else written.get("updated") or started
        elapsed = max(0.0, (end - started).total_seconds())
        if status == "running":
            left = eta(elapsed, fraction, float(written.get("start_fraction", 0.0)))
    return JobState(
        status,
        fraction,
        written.get("message", ""),
        written.get("error"),
        written.get("result", {}),
        runs,
        elapsed,
        left,
    )


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
            if not _wait_exited(known, timeout) and _signal(known, workspace, signal.SIGKILL):
                _wait_exited(known, 5.0)
            break
    current.cancelled = job.cancelled = True
    save_job(current, workspace)
    return signalled


def log_tail(job: Job, workspace: Path, lines: int = 20) -> str:
    path = _spec_path(workspace, job.id).with_suffix(".log")
    try:
        if not path.is_file():  # a FIFO or a device there would block or never end
            return ""
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 16_384))
            text = f.read(16_384).decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.replace("\r", "\n").splitlines()[-lines:])


# ---- the worker ---------------------------------------------------------------------------------------
class _Cancelled(SystemExit):
    pass


def _on_sigterm(signum, frame):
    raise _Cancelled(128 + signal.SIGTERM)


# What runs an experiment or search job's work (`polykv.eval.experiments.run_job`, `polykv.search.job.run_job`):
# given the job, the workspace, the store, `report(**changes)` (updates the state file; returns the state so
# far) and `activate(run_id)` (the run under way, marked cancelled if the job is), it loads the model, runs
# and writes the report.
JobWork = Callable[[Job, Path, Store, Callable[..., dict], Callable[[str | None], None]], None]


def _run(job: Job, workspace: Path, experiment: JobWork | None = None) -> None:
    state_path = _spec_path(workspace, job.id).with_suffix(".state.json")
    current = {
        "status": "running",
        "fraction": 0.0,
        "message": "loading the model",
        "error": None,
        "result": {},
        "started": _now(),
    }

    def report(**changes: Any) -> dict[str, Any]:
        current.update(changes, updated=_now())
        atomic_write_json(state_path, current)
        if "message" in changes:  # the log: one time-stamped line per step
            print(f"{current['updated']} [{current['fraction']:6.1%}] {current['message']}", flush=True)
        return current

    if job.kind == "eval":  # a resumed job starts where it stopped: its ETA counts only this worker's pace
        current["start_fraction"] = current["fraction"] = _eval_fraction(_run_progress(job, workspace))
    report(message="loading the model")
    store = Store(workspace / "results.sqlite")
    active: str | None = None

    def activate(run_id: str | None) -> None:
        nonlocal active
        active = run_id

    try:
        from polykv.models import load_model

        if job.kind in WORKER_MODULES:
            if experiment is None:
                raise JobError(f"a {job.kind} job runs with python -m {WORKER_MODULES[job.kind]} run <job file>")
            experiment(job, workspace, store, report, activate)
        elif job.kind == "eval":
            model, tokenizer = load_model(job.model, device=job.device)  # quiet: no progress bars in the log
            from polykv.eval.runner import run_suite

            for i, r in enumerate(job.runs):
                unit = Unit(**r.unit)
                active = r.run_id

                def progress(done: int, total: int, where: str, i: int = i, r: RunUnit = r) -> None:
                    report(
                        fraction=(i + done / total) / len(job.runs),
                        message=f"run {i + 1}/{len(job.runs)} {r.plan_name}: {done}/{total} {where}",
                    )

                report(message=f"run {i + 1}/{len(job.runs)} {r.plan_name}: building samples")
                run_suite(
                    store,
                    unit.model,
                    model,
                    tokenizer,
                    Plan.from_json(unit.plan_json),
                    unit.suite,
                    unit.settings(),
                    unit.seed,
                    progress=progress,
                )
            active = None
        else:
            model, tokenizer = load_model(job.model, device=job.device)
            from polykv.plan import Phase
            from polykv.profile.build import build_profile
            from polykv.profile.corpus import CorpusSpec

            spec = job.profile or {}
            profile = build_profile(
                job.model,
                model,
                tokenizer,
                workspace / "profiles",
                CorpusSpec.from_dict(spec["corpus"]),
                spec.get("capacity"),
                tuple(Phase(s) for s in spec["scopes"]),
                progress=lambda fraction, message: report(fraction=fraction, message=message),
            )
            report(result={"profile": str(profile.path), "key": profile.key})
        report(status="finished", fraction=1.0, message="finished")
    except _Cancelled:
        run = store.run(active) if active is not None else None
        if run is not None and run["status"] != "finished":  # an experiment's run may have just finished
            store.set_status(active, "cancelled")
        report(status="cancelled", message="cancelled")
        raise
    except BaseException as exc:
        report(status="failed", error=f"{exc.__class__.__name__}: {first_line(exc)}"[:500], message="failed")
        raise


def main(argv: list[str] | None = None, experiment: JobWork | None = None, prog: str = "polykv.jobs") -> int:
    """The worker: run one job file (`experiment`: what runs experiment jobs, given by their module)."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description="Run a PolyKV job file.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("spec", type=Path)
    run.add_argument("--workspace", type=Path, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        job = _job_from_file(args.spec)
    except JobError as exc:
        print(f"error: {args.spec}: {exc}", file=sys.stderr)
        return 2
    if job.kind in WORKER_MODULES and experiment is None:
        print(f"error: {args.spec}: a {job.kind} job runs with python -m {WORKER_MODULES[job.kind]}", file=sys.stderr)
        return 2
    _run(job, args.workspace, experiment)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "EXPERIMENTS",
    "DamagedJob",
    "Job",
    "JobState",
    "RunProgress",
    "RunUnit",
    "cancel",
    "check_id",
    "duration",
    "eta",
    "eval_job",
    "experiment_job",
    "list_jobs",
    "load_job",
    "log_tail",
    "profile_job",
    "report_path",
    "search_job",
    "save_job",
    "scan_jobs",
    "start",
    "state",
]

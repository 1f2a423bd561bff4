"""Where a job stands: its state (status, fraction done, elapsed time and ETA, each run's progress in the
results store) and the tail of its log."""

from __future__ import annotations

import datetime
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from polykv.errors import PolyKVError
from polykv.eval.results.store import Store
from polykv.jobs.process import _alive
from polykv.jobs.spec import FINAL, Job, JobResult, RunUnit, _read_state, _spec_path
from polykv.progress import eta, fraction_of
from polykv.text import duration
from polykv.workspace import results_path

Status = Literal["waiting", "running", "finished", "failed", "cancelled", "stopped"]
Clock = Callable[[], datetime.datetime]  # now, in UTC


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class RunProgress(BaseModel):
    model_config = ConfigDict(frozen=True)

    run_id: str
    plan_name: str
    label: dict[str, Any]
    done: int
    total: int | None  # None until the run has built its samples
    status: str  # the store's status, or "waiting"


class JobState(BaseModel):
    """Where a job stands, as the pages and `polykv jobs` show it (`state` reads it from the job's files)."""

    model_config = ConfigDict(frozen=True)

    status: Status  # the process died: stopped
    fraction: float
    message: str = ""
    error: str | None = None
    result: JobResult = JobResult()  # what the job's kind reports (a profile's key, a report's path, a search's trace)
    runs: list[RunProgress] = []
    elapsed_s: float | None = None  # seconds the latest worker has run (until its last report once it ended)
    eta_s: float | None = None  # seconds left at the worker's pace so far (running jobs with some progress)
    eta_upper: bool = False  # the ETA is the first piece's: loading counted in, so at most that
    estimate_s: float | None = None  # what the launch estimated (`polykv.costs`)
    measured_s: float | None = None  # what a finished job took

    def summary(self) -> str:
        """`42% · 1 min 3 s elapsed · about 1 min 27 s left`: what a progress bar's text says (before the first
        piece of work is done, the launch's estimate)."""
        parts = [f"{self.fraction:.0%}"]
        if self.elapsed_s is not None:
            parts.append(f"{duration(self.elapsed_s)} elapsed")
        if self.eta_s is not None:
            parts.append(f"{'at most ' if self.eta_upper else ''}about {duration(self.eta_s)} left")
        elif self.estimate_s is not None and self.status == "running":
            parts.append(f"estimated about {duration(self.estimate_s)} in all")
        if self.cost_line() is not None:
            parts.append(self.cost_line())
        return " · ".join(parts)

    def cost_line(self) -> str | None:
        """`estimated about 2 min 10 s, took 2 min 31 s (x1.16)` for a finished job that had an estimate."""
        if self.estimate_s is None or self.measured_s is None:
            return None
        ratio = f" (x{self.measured_s / self.estimate_s:.2f})" if self.estimate_s > 0 else ""
        return f"estimated about {duration(self.estimate_s)}, took {duration(self.measured_s)}{ratio}"


# The ETA is the pace of real work once this many pieces (samples, cells, executions) followed the first one,
# never loading the model or building samples. From the first finished piece until then it is the pace since
# the worker started, loading included: an upper estimate, said as one ("at most about ...").
PACE_STEPS = 2


def _progress(workspace: Path, run_ids: list[str]) -> dict[str, tuple[int, int, str]]:
    path = results_path(workspace)
    if not path.is_file():
        return {}
    try:
        return Store(path, readonly=True).progress(run_ids)
    except (PolyKVError, sqlite3.Error, OSError):
        return {}  # a damaged store: no progress to show (the runs themselves report the damage)


def _eval_fraction(runs: list[RunProgress]) -> float:
    parts = [1.0 if r.status == "finished" else fraction_of(r.done, r.total or 0) for r in runs]
    return sum(parts) / len(parts) if parts else 0.0


def _run_progress(job: Job, workspace: Path) -> list[RunProgress]:
    progress = _progress(workspace, [r.run_id for r in job.runs])
    runs = []
    for r in job.runs:
        done, total, status = progress.get(r.run_id, (0, None, "waiting"))
        runs.append(
            RunProgress(run_id=r.run_id, plan_name=r.plan_name, label=r.label, done=done, total=total, status=status)
        )
    return runs


def state(job: Job, workspace: Path, clock: Clock = utc_now) -> JobState:
    """Where a job stands, from its state file, its process and (for evaluations) the results store; `clock`
    says what time it is (the elapsed time and the ETA of a running job count to it)."""
    workspace = Path(workspace)
    written = _read_state(workspace, job.id)
    runs: list[RunProgress] = []
    if job.kind == "eval":
        runs = _run_progress(job, workspace)
        fraction = _eval_fraction(runs)
    else:
        fraction = written.fraction if written is not None else 0.0
    status: Status = written.status if written is not None else "waiting"
    if status not in FINAL:
        if job.cancelled:
            status = "cancelled"
        elif _alive(job, workspace):
            status = "running"
        elif job.pid is not None:
            status = "stopped"
    elapsed = left = None
    upper = False
    if written is not None and written.started is not None:
        end = clock() if status == "running" else written.updated or written.started
        elapsed = max(0.0, (end - written.started).total_seconds())
        pace_from = written.pace_from
        if status == "running" and pace_from is not None and written.pace_steps >= PACE_STEPS:
            left = eta(max(0.0, (end - pace_from).total_seconds()), fraction, written.pace_fraction)
        elif status == "running" and pace_from is not None:  # one piece done: the pace since the start, at most
            left, upper = eta(elapsed, fraction, written.start_fraction), True
    return JobState(
        status=status,
        fraction=fraction,
        message=written.message if written is not None else "",
        error=written.error if written is not None else None,
        result=written.result if written is not None else JobResult(),
        runs=runs,
        elapsed_s=elapsed,
        eta_s=left,
        eta_upper=upper and left is not None,
        estimate_s=job.estimate_s,
        measured_s=written.measured_s if written is not None else None,
    )


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


def same_samples(runs: list[RunUnit]) -> list[list[int]]:
    """An evaluation job's runs in groups that score the same samples (model, suite, settings, seed and device
    alike), each group where its first run appears: the worker runs a group together (`run_suites`) and the
    estimate counts it so."""
    groups: dict[tuple, list[int]] = {}
    for i, run in enumerate(runs):
        unit = run.unit
        groups.setdefault((unit.model, unit.suite, unit.settings_json, unit.seed, unit.device), []).append(i)
    return list(groups.values())

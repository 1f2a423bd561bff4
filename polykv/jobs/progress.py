"""Where a job stands: its state (status, fraction done, elapsed time and ETA, each run's progress in the
results store) and the tail of its log."""

from __future__ import annotations

import datetime
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polykv.errors import PolyKVError
from polykv.eval.store import Store
from polykv.jobs.process import _alive
from polykv.jobs.spec import FINAL, Job, _read_state, _spec_path
from polykv.text import duration


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


def eta(elapsed: float, fraction: float, start_fraction: float = 0.0) -> float | None:
    """Seconds left if the rest goes at the pace since the worker started (at `start_fraction`: a resumed
    job does not count work done before); None until there is progress to extrapolate from."""
    gained = fraction - start_fraction
    if gained <= 1e-6 or fraction >= 1.0:
        return None
    return elapsed * (1.0 - fraction) / gained


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
    upper = False
    started = written.get("started")
    if started is not None:
        end = datetime.datetime.now(datetime.UTC) if status == "running" else written.get("updated") or started
        elapsed = max(0.0, (end - started).total_seconds())
        pace_from = written.get("pace_from")
        if status == "running" and pace_from is not None and written.get("pace_steps", 0) >= PACE_STEPS:
            left = eta(max(0.0, (end - pace_from).total_seconds()), fraction, float(written["pace_fraction"]))
        elif status == "running" and pace_from is not None:  # one piece done: the pace since the start, at most
            left, upper = eta(elapsed, fraction, float(written.get("start_fraction", 0.0))), True
    return JobState(
        status,
        fraction,
        written.get("message", ""),
        written.get("error"),
        written.get("result", {}),
        runs,
        elapsed,
        left,
        upper and left is not None,
        job.estimate_s,
        written.get("measured_s"),
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

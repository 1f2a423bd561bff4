"""Background jobs: evaluations and profiles that run in their own process and outlive whoever started
them (the web app, a CLI call). A job survives page reloads and app restarts because everything about
it lives in files under `<workspace>/jobs/`:

  <id>.json        what to do (written once by the starter, then only to record the pid or a cancel)
  <id>.state.json  how far it got: status, fraction done, last message, error, result (the worker writes it)
  <id>.log         the worker's output

An evaluation job runs its units one after another in one process (the model loads once) through
`run_suite`, so progress per run is the store's sample count, and a stopped job resumes where it
stopped when started again. A profile job runs `build_profile`. Cancelling sends SIGTERM to the job's
process group; the worker records "cancelled" before it exits.

Run a job file by hand with `python -m polykv.jobs run <workspace>/jobs/<id>.json`.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from polykv.eval.backends import Unit
from polykv.eval.runner import run_id_for
from polykv.eval.store import Store
from polykv.methods import validate_plan
from polykv.plan import Plan

FINAL = ("finished", "failed", "cancelled")
_children: dict[int, subprocess.Popen] = {}  # processes this process started: polled so they are reaped


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write then rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    kind: str  # "eval" or "profile"
    title: str
    model: str
    device: str
    created: str
    runs: list[RunUnit] = field(default_factory=list)
    profile: dict[str, Any] | None = None  # profile jobs: corpus (CorpusSpec dict), capacity, scopes
    pid: int | None = None
    cancelled: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        data = dict(data)
        data["runs"] = [RunUnit(**r) for r in data.get("runs", [])]
        return cls(**data)


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


# ---- building and starting jobs ----------------------------------------------------------------------
def _new_id(kind: str) -> str:
    return f"{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}-{kind}-{uuid.uuid4().hex[:6]}"


def eval_job(units: list[tuple[dict[str, Any], Unit]], title: str) -> Job:
    """A job that runs `units` (each with its label) in order; they must share model and device."""
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


def profile_job(model: str, device: str, corpus: dict[str, Any], capacity: int | None, scopes: list[str], title: str) -> Job:
    return Job(_new_id("profile"), "profile", title, model, device, _now(),
               profile={"corpus": corpus, "capacity": capacity, "scopes": list(scopes)})


def jobs_dir(workspace: Path) -> Path:
    return Path(workspace) / "jobs"


def _spec_path(workspace: Path, job_id: str) -> Path:
    return jobs_dir(workspace) / f"{job_id}.json"


def save_job(job: Job, workspace: Path) -> Path:
    path = _spec_path(workspace, job.id)
    _write_json(path, asdict(job))
    return path


def start(job: Job, workspace: Path) -> subprocess.Popen:
    """Save `job` and start its worker, detached (own session), output to its log. Starting a stopped
    job again resumes it: finished samples are not recomputed."""
    workspace = Path(workspace)
    job.cancelled = False
    path = save_job(job, workspace)
    if _read_state(workspace, job.id).get("status") != "finished":  # a fresh start: forget how the last one ended
        path.with_suffix(".state.json").unlink(missing_ok=True)
    log = open(path.with_suffix(".log"), "ab")  # noqa: SIM115 - the child keeps it open
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "polykv.jobs", "run", str(path.resolve()), "--workspace", str(workspace.resolve())],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    finally:
        log.close()
    _children[process.pid] = process
    job.pid = process.pid
    save_job(job, workspace)
    return process


# ---- reading jobs ------------------------------------------------------------------------------------
def load_job(workspace: Path, job_id: str) -> Job:
    path = _spec_path(workspace, job_id)
    if not path.is_file():
        raise ValueError(f"no job {job_id!r} in {workspace}")
    return Job.from_dict(json.loads(path.read_text()))


def list_jobs(workspace: Path) -> list[Job]:
    """Every job in the workspace, newest first (unreadable files are skipped, never fatal)."""
    out = []
    for path in jobs_dir(workspace).glob("*.json"):
        if path.name.endswith(".state.json") or path.name.startswith("."):
            continue
        try:
            out.append(Job.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(out, key=lambda j: j.created + j.id, reverse=True)


def _alive(job: Job) -> bool:
    if job.pid is None:
        return False
    child = _children.get(job.pid)
    if child is not None and child.poll() is not None:
        return False
    try:  # a live process whose command line names this job (pids get reused)
        return job.id in Path(f"/proc/{job.pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        if not Path("/proc").is_dir():
            try:
                os.kill(job.pid, 0)
                return True
            except OSError:
                return False
        return False


def _read_state(workspace: Path, job_id: str) -> dict[str, Any]:
    path = _spec_path(workspace, job_id).with_suffix(".state.json")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def state(job: Job, workspace: Path) -> JobState:
    """Where a job stands, from its state file, its process and (for evaluations) the results store."""
    workspace = Path(workspace)
    written = _read_state(workspace, job.id)
    runs: list[RunProgress] = []
    if job.kind == "eval":
        progress = Store(workspace / "results.sqlite").progress([r.run_id for r in job.runs])
        for r in job.runs:
            done, total, status = progress.get(r.run_id, (0, None, "waiting"))
            runs.append(RunProgress(r.run_id, r.plan_name, r.label, done, total, status))
        fraction = sum(1.0 if r.status == "finished" else r.done / r.total if r.total else 0.0 for r in runs) / len(runs)
    else:
        fraction = float(written.get("fraction", 0.0))
    status = written.get("status", "waiting")
    if status not in FINAL:
        if job.cancelled:
            status = "cancelled"
        elif _alive(job):
            status = "running"
        elif job.pid is not None:
            status = "stopped"
    return JobState(status, fraction, written.get("message", ""), written.get("error"), written.get("result", {}), runs)


def cancel(job: Job, workspace: Path) -> None:
    """Stop the job's process group (the worker records "cancelled"); a finished job is left alone."""
    if _alive(job):
        try:
            os.killpg(job.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        child = _children.get(job.pid)
        if child is not None:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
    job.cancelled = True
    save_job(job, workspace)


def log_tail(job: Job, workspace: Path, lines: int = 20) -> str:
    path = _spec_path(workspace, job.id).with_suffix(".log")
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 16_384))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.replace("\r", "\n").splitlines()[-lines:])


# ---- the worker ---------------------------------------------------------------------------------------
class _Cancelled(SystemExit):
    pass


def _on_sigterm(signum, frame):
    raise _Cancelled(128 + signal.SIGTERM)


def _run(job: Job, workspace: Path) -> None:
    state_path = _spec_path(workspace, job.id).with_suffix(".state.json")
    current = {"status": "running", "fraction": 0.0, "message": "loading the model", "error": None, "result": {},
               "started": _now()}

    def report(**changes: Any) -> None:
        current.update(changes, updated=_now())
        _write_json(state_path, current)
        if "message" in changes:
            print(f"[{current['fraction']:6.1%}] {current['message']}", flush=True)

    report(message="loading the model")
    store = Store(workspace / "results.sqlite")
    active: str | None = None
    try:
        from transformers.utils import logging as transformers_logging

        from polykv.models import load_model

        transformers_logging.disable_progress_bar()
        model, tokenizer = load_model(job.model, device=job.device)
        if job.kind == "eval":
            from polykv.eval.runner import run_suite

            for i, r in enumerate(job.runs):
                unit = Unit(**r.unit)
                active = r.run_id

                def progress(done: int, total: int, where: str, i: int = i, r: RunUnit = r) -> None:
                    report(fraction=(i + done / total) / len(job.runs), message=f"run {i + 1}/{len(job.runs)} {r.plan_name}: {done}/{total} {where}")

                report(message=f"run {i + 1}/{len(job.runs)} {r.plan_name}: building samples")
                run_suite(store, unit.model, model, tokenizer, Plan.from_json(unit.plan_json), unit.suite,
                          unit.settings(), unit.seed, progress=progress)
            active = None
        else:
            from polykv.plan import Phase
            from polykv.profile.build import build_profile
            from polykv.profile.corpus import CorpusSpec

            spec = job.profile or {}
            profile = build_profile(job.model, model, tokenizer, workspace / "profiles", CorpusSpec.from_dict(spec["corpus"]),
                                    spec.get("capacity"), tuple(Phase(s) for s in spec["scopes"]),
                                    progress=lambda fraction, message: report(fraction=fraction, message=message))
            report(result={"profile": str(profile.path), "key": profile.key})
        report(status="finished", fraction=1.0, message="finished")
    except _Cancelled:
        if active is not None:
            store.set_status(active, "cancelled")
        report(status="cancelled", message="cancelled")
        raise
    except BaseException as exc:
        report(status="failed", error=f"{exc.__class__.__name__}: {exc}".splitlines()[0][:500], message="failed")
        raise


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m polykv.jobs", description="Run a PolyKV job file.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("spec", type=Path)
    run.add_argument("--workspace", type=Path, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    job = Job.from_dict(json.loads(args.spec.read_text()))
    _run(job, args.workspace)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Job", "JobState", "RunProgress", "RunUnit", "cancel", "eval_job", "list_jobs", "load_job", "log_tail",
           "profile_job", "save_job", "start", "state"]

"""The worker's main loop: run one job file (an evaluation's units, a profile, or the work an experiment
or search job's module hands it), writing the state file and the log as it goes, and recording a cancel
(SIGTERM) or a failure before it exits."""

from __future__ import annotations

import datetime
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from polykv.errors import JobError, PolyKVError, first_line
from polykv.eval.results.store import Store
from polykv.eval.running.unit import Unit
from polykv.files import atomic_write_json
from polykv.jobs.process import WORKER_MODULES
from polykv.jobs.progress import _eval_fraction, _run_progress, same_samples
from polykv.jobs.spec import Job, JobResult, StateFile, _job_from_file, _spec_path
from polykv.plan import Plan
from polykv.workspace import results_path


# ---- the worker ---------------------------------------------------------------------------------------
class _Cancelled(SystemExit):
    pass


def _on_sigterm(signum, frame):
    raise _Cancelled(128 + signal.SIGTERM)


def _utc() -> datetime.datetime:
    """Now, to the second (as the state file and the log say it)."""
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


# What runs an experiment or search job's work (`polykv.jobs.experiment.run_job`, `polykv.jobs.search.run_job`):
# given the job, the workspace, the store, `report(**changes)` (updates the state file with fields of
# `StateFile`; returns the state so far) and `activate(run_id)` (the run under way, marked cancelled if the job
# is), it loads the model, runs and writes the report.
Reporter = Callable[..., StateFile]
JobWork = Callable[[Job, Path, Store, Reporter, Callable[[str | None], None]], None]


def _run(job: Job, workspace: Path, experiment: JobWork | None = None) -> None:
    state_path = _spec_path(workspace, job.id).with_suffix(".state.json")
    began = time.perf_counter()
    current = StateFile(
        status="running", fraction=0.0, message="loading the model", error=None, result=JobResult(), started=_utc()
    )

    def report(**changes: Any) -> StateFile:
        before = current.fraction
        for name, value in {**changes, "updated": _utc()}.items():
            setattr(current, name, value)
        if current.fraction > before:  # a piece of real work done: the ETA's pace starts at the first one
            if current.pace_from is not None:
                current.pace_steps += 1
            else:
                current.pace_from, current.pace_fraction, current.pace_steps = current.updated, current.fraction, 0
        atomic_write_json(state_path, current.model_dump(mode="json", exclude_unset=True))  # the fields set
        if "message" in changes:  # the log: one time-stamped line per step
            stamp = current.updated.isoformat(timespec="seconds")
            print(f"{stamp} [{current.fraction:6.1%}] {current.message}", flush=True)
        return current

    if job.kind == "eval":  # a resumed job starts where it stopped: its ETA counts only this worker's pace
        current.start_fraction = current.fraction = _eval_fraction(_run_progress(job, workspace))
    report(message="loading the model")
    store = Store(results_path(workspace))
    active: list[str] = []  # the runs under way, marked cancelled if the job is

    def activate(run_id: str | None) -> None:
        nonlocal active
        active = [] if run_id is None else [run_id]

    try:
        from polykv.models import load_model

        if job.kind in WORKER_MODULES:
            if experiment is None:
                raise JobError(f"a {job.kind} job runs with python -m {WORKER_MODULES[job.kind]} run <job file>")
            experiment(job, workspace, store, report, activate)
        elif job.kind == "eval":
            model, tokenizer = load_model(job.model, device=job.device)  # quiet: no progress bars in the log
            from polykv.eval.running.suite_runner import run_suite, run_suites

            done = 0
            for members in same_samples(job.runs):
                units = [Unit(**job.runs[i].unit.model_dump()) for i in members]
                plans = [Plan.from_json(unit.plan_json) for unit in units]
                label = f"{_numbers(members)}/{len(job.runs)} {', '.join(plan.name for plan in plans)}"
                active = [job.runs[i].run_id for i in members]

                def progress(count: int, total: int, where: str, start=done, size=len(members), label=label) -> None:
                    report(
                        fraction=(start + size * count / total) / len(job.runs),
                        message=f"{label}: {count}/{total} {where}",
                    )

                report(message=f"{label}: building samples")
                unit = units[0]
                arguments = (store, unit.model, model, tokenizer)
                if len(plans) == 1:  # a plan alone runs as `run_suite` does: the reference
                    run_suite(*arguments, plans[0], unit.suite, unit.settings(), unit.seed, progress=progress)
                else:  # plans on the same samples: one prompt pass for them all (`run_suites`)
                    run_suites(*arguments, plans, unit.suite, unit.settings(), unit.seed, progress=progress)
                done += len(members)
            active = []
        else:
            model, tokenizer = load_model(job.model, device=job.device)
            report(message="model loaded: building the calibration corpus")
            from polykv.plan import Phase
            from polykv.profile.build import build_profile
            from polykv.profile.corpus import CorpusSpec

            spec = job.profile
            profile = build_profile(
                job.model,
                model,
                tokenizer,
                workspace / "profiles",
                CorpusSpec.from_dict(spec.corpus),
                spec.capacity,
                tuple(Phase(s) for s in spec.scopes),
                progress=lambda fraction, message: report(fraction=fraction, message=message),
            )
            report(result=JobResult(profile=str(profile.path), key=profile.key))
        _record_cost(job, current, began)
        report(status="finished", fraction=1.0, message="finished")
    except _Cancelled:
        for run_id in active:
            run = store.run(run_id)
            if run is not None and run.status != "finished":  # an experiment's run may have just finished
                store.set_status(run_id, "cancelled")
        report(status="cancelled", message="cancelled")
        raise
    except BaseException as exc:
        report(status="failed", error=f"{exc.__class__.__name__}: {first_line(exc)}"[:500], message="failed")
        raise


def _numbers(members: list[int]) -> str:
    """'run 2', 'runs 1-3' or 'runs 1, 3' (counted from 1)."""
    if len(members) == 1:
        return f"run {members[0] + 1}"
    if members == list(range(members[0], members[-1] + 1)):
        return f"runs {members[0] + 1}-{members[-1] + 1}"
    return "runs " + ", ".join(str(i + 1) for i in members)


def _record_cost(job: Job, current: StateFile, started: float) -> None:
    """A finished job's wall time (from `started`, a perf_counter reading) beside its estimate, and its ratio to
    the cost model's own estimate kept to correct later ones (a resumed evaluation ran only part of its work
    here: its time is kept, not its ratio). Best effort: a rates file that cannot be written fails no job."""
    from polykv import costs

    current.measured_s = time.perf_counter() - started
    if job.estimate_model_s and not current.start_fraction:
        try:
            costs.record_ratio(job.model, job.device, job.kind, job.estimate_model_s, current.measured_s)
        except (PolyKVError, OSError) as exc:
            print(f"the time it took was not kept for later estimates: {first_line(exc)}", flush=True)


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

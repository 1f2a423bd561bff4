"""Experiments as background jobs (kind "experiment"): `launch_job` checks an experiment's description and
builds its job, `run_job` is its worker's work (`python -m polykv.jobs.experiment run <job file> --workspace
<workspace>`, started by `polykv.jobs.start`), and `read_report` reads back the report it saves."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from polykv.errors import JobError
from polykv.eval.experiments import Report
from polykv.eval.experiments.experiment_runner import suite_metrics
from polykv.eval.experiments.run import Experiment, factorial_experiment, placement_experiment, sweep_experiment
from polykv.eval.results.store import Store
from polykv.eval.running.settings import suite_settings
from polykv.eval.running.suite_runner import run_id_for
from polykv.files import atomic_write_json, read_json
from polykv.jobs import worker
from polykv.jobs.spec import MAX_REPORT_BYTES, ExperimentSpec, JobResult, experiment_job, report_path
from polykv.methods import validate_plan
from polykv.profile.store import Profile, profile_named
from polykv.progress import fraction_of
from polykv.routing import plan_from_profile


def launch_job(
    workspace: Path,
    model: str,
    device: str,
    experiment: str,
    *,
    profile: str,
    scope: str,
    budget: int,
    budgets: Sequence[int] | None = None,
    baseline: str | None = None,
    baselines: Sequence[str] | None = None,
    statistic: str = "cosine",
    allocation: str = "uniform",
    k: int = 0,
    suite: str = "fidelity",
    settings: Mapping[str, Any] | None = None,
    metric: str = "top1",
    seed: int = 0,
    title: str | None = None,
    loaded: tuple[Any, Any] | None = None,
):
    """The background job (`polykv.jobs.experiment_job`, not started) that runs `experiment` (factorial,
    placement or sweep) of `model` with these arguments. The route (the placement's guided plan, the
    sweep's fixed route) is TopRank by `statistic` from `profile` (a key in <workspace>/profiles or a path)
    in `scope` at `budget` with `allocation` capacities; the factorial's allocated arm is `allocation`.
    Everything is checked before anything runs in the background: the description, the profile (this
    model's), the settings, the metric (one the suite reports) and every plan the experiment would run; with
    `loaded` (the model and tokenizer), that the suite's first sample of each task and every plan fit the model
    (`polykv.eval.running.fit`). JobError or ValueError (one line) when not."""
    spec = {
        "name": experiment,
        "profile": str(profile),
        "scope": scope,
        "budget": budget,
        "budgets": list(budgets or []),
        "baseline": baseline,
        "baselines": None if baselines is None else list(baselines),
        "statistic": statistic,
        "allocation": allocation,
        "k": k,
        "suite": suite,
        "settings": dict(settings or {}),
        "metric": metric,
        "seed": seed,
    }
    job = experiment_job(model, device, spec, title or "")
    found, suite_settings_, described = job_experiment(job.experiment, model, Path(workspace))
    plans = described.plans
    if loaded is not None:
        from polykv.eval.running.fit import check_fits

        check_fits(suite, suite_settings_, *loaded, plans, seed)
    runs = f"{len(plans)} run{'s' * (len(plans) > 1)}"
    job.title = title or f"{experiment} · {found.key} · {scope} b{budget} on {suite} ({metric}, {runs})"
    return job


def profile_for_job(value: str, workspace: Path, model: str) -> Profile:
    """The profile a job names: a key in <workspace>/profiles, else a path; it must be `model`'s."""

    profile = profile_named(value, workspace)
    if profile.meta.model != model:
        raise JobError(f"profile {profile.key} was measured on {profile.meta.model!r}, not on {model!r}")
    return profile


def job_experiment(spec: ExperimentSpec, model: str, workspace: Path) -> tuple[Profile, Any, Experiment]:
    """(profile, suite settings, the `Experiment`: its plans and its call) of an experiment job's description:
    what `launch_job` checks and `run_job` runs."""

    profile = profile_for_job(spec.profile, workspace, model)
    settings = suite_settings(spec.suite, spec.settings)
    metrics = suite_metrics(spec.suite)
    if spec.metric not in metrics:
        raise JobError(f"the {spec.suite} suite reports {', '.join(metrics)}, not {spec.metric!r}")
    name, scope, budget, statistic, k = spec.name, spec.scope, spec.budget, spec.statistic, spec.k
    if name == "factorial":
        experiment = factorial_experiment(profile, scope, budget, spec.baseline, statistic, spec.allocation)
    else:
        route = plan_from_profile(profile, scope, budget, statistic, spec.allocation)
        if name == "placement":
            experiment = placement_experiment(profile, route, k, statistic, spec.seed)
        else:
            experiment = sweep_experiment(route, spec.budgets, spec.baselines, profile)
    for plan in experiment.plans:
        validate_plan(plan, profile.num_layers)
    return profile, settings, experiment


def run_job(job, workspace: Path, store: Store, report: worker.Reporter, activate: Callable[[str | None], None]):
    """The work of an experiment job's worker (`polykv.jobs` keeps its state, log and cancel): the experiment
    run by the library's one entry point (`polykv.eval.experiments.run.run_experiment`, as the CLI runs it) on
    the job's store, its report saved. Progress: the runs done plus the fraction of the run under way, over the
    experiment's runs; runs found finished in the store (a resumed job) are where it starts, so its ETA counts
    only this worker's pace."""
    from polykv.eval.experiments import run

    spec = job.experiment
    _, settings, experiment = job_experiment(spec, job.model, workspace)
    plans = experiment.plans
    run_ids = {p.name: run_id_for(job.model, p, spec.suite, settings.to_dict(), spec.seed) for p in plans}
    found = store.progress(list(run_ids.values()))
    parts = [1.0 if status == "finished" else fraction_of(d, t) for d, t, status in found.values()]
    done = sum(parts) / len(plans)
    report(start_fraction=done, fraction=done, message="loading the model")
    at = {"index": -1, "name": ""}  # the run under way (the runner names each plan before its run)

    def before(name: str) -> None:
        at["index"], at["name"] = at["index"] + 1, name
        activate(run_ids.get(name))
        fraction = max(report().fraction, min(1.0, at["index"] / len(plans)))  # never back: found runs pass again
        report(fraction=fraction, message=f"run {at['index'] + 1}/{len(plans)} {name}: building samples")

    def on_sample(count: int, total: int, where: str) -> None:
        fraction = max(report().fraction, min(1.0, (at["index"] + count / total) / len(plans)))
        report(fraction=fraction, message=f"run {at['index'] + 1}/{len(plans)} {at['name']}: {count}/{total} {where}")

    setup = run.ExperimentSetup(job.model, spec.suite, settings, spec.seed, spec.metric, device=job.device)
    result = run.run_experiment(experiment, setup, store, on_run=before, on_sample=on_sample)
    activate(None)
    path = atomic_write_json(report_path(workspace, job.id), result.to_dict())
    report(result=JobResult(report=str(path), title=result.title), message="report written")


def read_report(job, workspace: Path) -> Report:
    """The report a finished experiment job saved; JobError (one line) when it has none or it is damaged."""

    path = report_path(workspace, job.id)
    if not os.path.lexists(path):
        raise JobError(f"job {job.id} has no report yet")
    data = read_json(path, "experiment report", max_bytes=MAX_REPORT_BYTES, error=JobError)
    try:
        return Report.from_dict(data)
    except ValueError as exc:
        raise JobError(f"{path}: {exc}") from None


def job_main(argv: list[str] | None = None) -> int:
    """`python -m polykv.jobs.experiment run <workspace>/jobs/<id>.json --workspace <workspace>`: the
    worker of an experiment job (what `polykv.jobs.start` runs for one)."""
    return worker.main(argv, experiment=run_job, prog="polykv.jobs.experiment")


if __name__ == "__main__":
    from polykv.jobs.experiment import job_main as main  # the module itself, not this __main__ copy of it

    sys.exit(main())

"""A plan search as a background job (kind "search"): what the app's Search page starts.

`launch_search` builds the job (not started) after checking what it names: the profile (this model's),
the start plan (the designer's, when it is in the search space: `start_problem` says why not) and the
settings. The worker (`python -m polykv.jobs.search run <job file> --workspace W`, started by
`polykv.jobs.start`) runs `report.build_report` at the job's one budget; while it searches, the job's state
holds the trace so far and the best plan so far (`live`), and at the end the report is saved next to the
job (`polykv.jobs.report_path`) and read back by `read_search`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from polykv.errors import JobError
from polykv.files import atomic_write_json, read_json
from polykv.jobs import worker
from polykv.jobs.experiment import profile_for_job
from polykv.jobs.progress import JobState
from polykv.jobs.spec import MAX_REPORT_BYTES, Job, report_path, search_job
from polykv.plan import Plan, Scope
from polykv.search.moves import check_space

LIVE_TRACE = 400  # trace points kept in the job's state file (the report keeps them all)


def start_problem(plan: Plan, scope: Scope | str, budget: int) -> str | None:
    """Why `plan` cannot be a start of a search in `scope` at `budget` (None: it can)."""
    if plan.scope is not Scope(scope):
        return f"its scope is {plan.scope.value}, not {Scope(scope).value}"
    try:
        check_space(plan, budget)
    except ValueError as exc:
        return str(exc)
    return None


def launch_search(
    workspace: Path,
    model: str,
    device: str,
    *,
    profile: str,
    scope: str,
    budget: int,
    start: Plan | None = None,
    evaluations: int = 200,
    seed: int = 0,
    search_sequences: int = 4,
    held_out: int = 8,
    max_tokens: int = 256,
    candidates: int = 8,
    metric: str = "kl",
    statistic: str = "dppl",
) -> Job:
    """The search job these arguments describe, checked (JobError or ValueError, one line); `start` is used
    only when it is in the search space (`start_problem`)."""
    loaded = profile_for_job(profile, Path(workspace), model)
    if start is not None and start.num_layers != loaded.num_layers:
        raise JobError(f"the start plan has {start.num_layers} layers, the profile's model {loaded.num_layers}")
    use_start = start is not None and start_problem(start, scope, budget) is None
    spec = {
        "profile": profile,
        "scope": scope,
        "budget": budget,
        "evaluations": evaluations,
        "seed": seed,
        "search_sequences": search_sequences,
        "held_out": held_out,
        "max_tokens": max_tokens,
        "candidates": candidates,
        "metric": metric,
        "statistic": statistic,
        "start": start.to_json() if use_start else None,
    }
    origin = f"from {start.name}, " if use_start else ""
    title = f"search · {loaded.key} · {scope} b{budget} · {origin}{evaluations} executions"
    return search_job(model, device, spec, title)


def live(state: JobState) -> tuple[list[dict[str, Any]], Plan | None]:
    """(the trace so far, the best plan so far) of a search job, from its state."""
    best = state.result.get("best")
    try:
        plan = Plan.from_json(best) if isinstance(best, str) else None
    except ValueError:
        plan = None
    trace = state.result.get("trace")
    return (trace if isinstance(trace, list) else []), plan


def run_job(job, workspace: Path, store, report: Callable[..., dict], activate: Callable[[str | None], None]):
    """The work of a search job's worker (`polykv.jobs` keeps its state, log and cancel)."""
    from polykv.models import load_model
    from polykv.search.objective import build_sequences
    from polykv.search.report import build_report

    spec = job.search
    profile = profile_for_job(spec["profile"], Path(workspace), job.model)
    start = Plan.from_json(spec["start"]) if spec["start"] else None
    model, tokenizer = load_model(job.model, device=job.device)  # quiet: no progress bars in the log
    report(message="building the search and held-out sequences")
    sequences = build_sequences(
        tokenizer,
        model,
        job.model,
        search=spec["search_sequences"],
        held_out=spec["held_out"],
        max_tokens=spec["max_tokens"],
        seed=spec["seed"],
    )
    trace: list[dict[str, Any]] = []

    def on_step(used: int, total: int, where: str) -> None:
        # the held-out verdict comes after the search: the search is 90% of the work shown
        report(fraction=min(0.9, 0.9 * used / total), message=f"{used}/{total} executions · {where}")

    def on_trace(point, best: Plan) -> None:
        trace.append(point.to_dict())
        report(result={"trace": trace[-LIVE_TRACE:], "best": best.to_json()})

    found, plans = build_report(
        model,
        job.model,
        sequences,
        profile,
        spec["scope"],
        [spec["budget"]],
        evaluations=spec["evaluations"],
        seed=spec["seed"],
        metric=spec["metric"],
        statistic=spec["statistic"],
        candidates=spec["candidates"],
        command=f"app search job {job.id}",
        start=start,
        on_step=on_step,
        on_trace=on_trace,
    )
    path = atomic_write_json(report_path(workspace, job.id), found)
    report(result={"trace": trace[-LIVE_TRACE:], "best": plans[0].to_json(), "report": str(path)}, message="done")


def read_search(job, workspace: Path) -> dict[str, Any]:
    """The report a finished search job saved (`report.build_report`); JobError (one line) when it has none
    or it cannot be read."""
    path = report_path(workspace, job.id)
    if not path.exists():
        raise JobError(f"job {job.id} has no report yet")
    data = read_json(path, "search report", max_bytes=MAX_REPORT_BYTES, error=JobError)
    if not isinstance(data, dict) or not isinstance(data.get("budgets"), list) or not data["budgets"]:
        raise JobError(f"{path}: not a search report")
    return data


def main(argv: list[str] | None = None) -> int:
    return worker.main(argv, experiment=run_job, prog="polykv.jobs.search")


if __name__ == "__main__":
    sys.exit(main())

"""The table of runs both the Runs and the Compare pages show: one row per run of the results store, newest
first, with what it is, its progress, the tags of the job that launched it (series, budget, role) and the
macro-average over its tasks of each metric it reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from polykv.eval.comparing.compare import macro_average
from polykv.eval.results.store import Store

COLUMNS = ["run", "plan", "suite", "model", "status", "samples", "created", "series", "budget", "role", "job"]


def job_labels(jobs: Sequence[Any]) -> dict[str, tuple[Any, Mapping[str, Any]]]:
    """run id -> (the newest job that launched it, its label there). `jobs` newest first."""
    found: dict[str, tuple[Any, Mapping[str, Any]]] = {}
    for job in jobs:
        for r in getattr(job, "runs", []):
            found.setdefault(r.run_id, (job, r.label))
    return found


def _empty(run) -> bool:
    return run.status == "cancelled" and run.done_samples == 0


def empty_runs(store: Store) -> int:
    """How many runs were cancelled before their first sample (left out of `runs_table`)."""
    return sum(_empty(run) for run in store.runs())


def runs_table(store: Store, jobs: Sequence[Any] = ()) -> pd.DataFrame:
    """Every run of `store` but those cancelled before their first sample (nothing to read or compare; `empty_runs`
    counts them), newest first: `COLUMNS`, then one column per metric (the macro-average over the run's tasks that
    report it; empty where none does). `jobs`: the eval jobs, newest first, for the tags."""
    labels = job_labels(jobs)
    rows = []
    for run in reversed(store.runs()):
        if _empty(run):
            continue
        job, label = labels.get(run.id, (None, {}))
        budget = label.get("budget")
        row: dict[str, Any] = {
            "run": run.id,
            "plan": run.plan_name,
            "suite": run.suite,
            "model": run.model,
            "status": run.status,
            "samples": f"{run.done_samples}/{run.total_samples}",
            "created": str(run.created)[:19],
            "series": label.get("series"),
            "budget": int(budget) if isinstance(budget, (int, float)) and not isinstance(budget, bool) else None,
            "role": label.get("role"),
            "job": f"{job.title} · {job.id}" if job is not None else None,
        }
        scores = store.task_scores(run.id)
        for metric in sorted({m for values in scores.values() for m in values}):
            row[metric] = macro_average({task: values[metric] for task, values in scores.items() if metric in values})
        rows.append(row)
    metrics = sorted({key for row in rows for key in row} - set(COLUMNS))
    frame = pd.DataFrame(rows, columns=[*COLUMNS, *metrics])
    frame["budget"] = frame["budget"].astype("Int64")  # sorts as numbers, empty where a run has no budget
    return frame


__all__ = ["COLUMNS", "job_labels", "runs_table"]

"""Which pair of runs the Compare page starts on (a route and its baseline from one job, else the newest two).

Read from the results store and the jobs' labels; the app's Compare page and its tests call these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from polykv.eval.comparing.compare import metrics_of, preferred_metric, suite_score
from polykv.eval.comparing.run_table import job_labels
from polykv.eval.results.store import RunRow, Store
from polykv.eval.statistics.contrast import direction


@dataclass(frozen=True)
class DefaultPair:
    """The pair of runs a comparison starts on and why (one line, for a caption)."""

    a: str
    b: str
    reason: str


def is_baseline(label: Mapping[str, Any]) -> bool:
    return label.get("series") not in ("route", "placement", None)


def _route_vs_baseline(finished: set[str], jobs: Sequence[Any], store: Store, metric: str | None) -> DefaultPair | None:
    """The route against its best baseline at the route's budget, from the newest job that has both
    finished (several budgets: the first the job lists). The baselines are ranked on `metric`, else on
    the `preferred_metric` they all share with the route; a baseline without that metric is passed over."""
    for job in jobs:
        runs = [r for r in getattr(job, "runs", []) if r.run_id in finished and "budget" in r.label]
        for route in (r for r in runs if r.label.get("series") == "route"):
            rivals = [r for r in runs if is_baseline(r.label) and r.label["budget"] == route.label["budget"]]
            if not rivals:
                continue
            chosen = metric or preferred_metric(metrics_of(store, [route.run_id, *(r.run_id for r in rivals)]))
            shared = [r for r in rivals if chosen in metrics_of(store, [route.run_id, r.run_id])]
            if not shared:
                continue
            best = max(shared, key=lambda r: direction(chosen) * suite_score(store, r.run_id, chosen))
            reason = (
                f"the route vs its best baseline at budget {route.label['budget']} ({best.label['series']} "
                f"by {chosen}), from job {job.title} · {job.id}"
            )
            return DefaultPair(route.run_id, best.run_id, reason)
    return None


def default_pair(
    finished_runs: Sequence[RunRow], jobs: Sequence[Any], store: Store, metric: str | None = None
) -> DefaultPair | None:
    """The pair of finished runs a comparison starts on (None when no run has finished):

    1. the route against its best baseline (by `metric`, else the `preferred_metric` the route and its
       baselines share) at the route's budget, from the newest job with a finished route and a finished
       baseline at its budget;
    2. else A = the newest finished run that is not a random placement (the newest run when all are) and
       B = the newest other finished run, preferring one of A's suite and model (so they share metrics)
       that is not a placement: two random placements say little about each other;
    3. a single finished run is compared with itself.
    `finished_runs`: store rows (with "id", "suite", "model"), newest first; `jobs`: newest first, each with
    `runs` of (run_id, label), `title` and `id` (`polykv.jobs.Job`)."""
    if not finished_runs:
        return None
    ids = [r.id for r in finished_runs]
    found = _route_vs_baseline(set(ids), jobs, store, metric)
    if found is not None:
        return found
    labels = job_labels(jobs)

    def placement(run_id: str) -> bool:
        return labels.get(run_id, (None, {}))[1].get("series") == "placement"

    first = next((r for r in finished_runs if not placement(r.id)), finished_runs[0])
    others = [r for r in finished_runs if r.id != first.id]
    if not others:
        return DefaultPair(first.id, first.id, "the only finished run")

    def rank(item: tuple[int, RunRow]) -> tuple[bool, bool, int]:
        index, row = item
        alike = row.suite == first.suite and row.model == first.model
        return (not alike, placement(row.id), index)

    second = min(enumerate(others), key=rank)[1]
    return DefaultPair(first.id, second.id, "the two newest finished runs (no job with a finished route and baseline)")


__all__ = ["DefaultPair", "default_pair", "is_baseline"]

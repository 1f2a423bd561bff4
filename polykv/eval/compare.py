"""Comparisons read from the results store: two runs task by task, a budget sweep, a placement control.

The statistics see "higher is better": a lower-is-better metric (KL, perplexity) is negated before the
bootstrap, wins/ties/losses and leave-one-task-out, and the numbers are reported back in the metric's
own units and sign (A - B). The CLI's `compare` and the web app's Compare page both call these.

Tasks named `<task>@<length>` (RULER at several lengths) are one task measured several times: the
bootstrap resamples the clusters `task_cluster` names (all lengths of a task together); wins/ties/losses
and leave-one-task-out stay per task name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from polykv.eval.stats import leave_one_task_out, paired_bootstrap, rank_among, wins_ties_losses
from polykv.eval.store import Store

# +1: higher is better; -1: lower is better. Metrics not listed are taken as higher-is-better.
METRIC_DIRECTION = {"top1": 1, "rougeL": 1, "kl": -1, "ppl": -1, "score": 1}


def direction(metric: str) -> int:
    return METRIC_DIRECTION.get(metric, 1)


def direction_text(metric: str) -> str:
    """E.g. "metric kl (lower is better)": what every report says about its numbers."""
    return f"metric {metric} ({'higher' if direction(metric) > 0 else 'lower'} is better)"


def task_cluster(task: str) -> str:
    """The task a scored name belongs to: the part before "@" ("niah_single_1@4096" -> "niah_single_1")."""
    return task.split("@", 1)[0]


def task_scores(store: Store, run_id: str, metric: str) -> dict[str, float]:
    """One run's per-task `metric`; a ValueError (one line) when it has none."""
    scores = {task: values[metric] for task, values in store.task_scores(run_id).items() if metric in values}
    if not scores:
        raise ValueError(f"run {run_id} has no finished task with metric {metric!r}")
    return scores


def macro_average(scores: Mapping[str, float]) -> float:
    """A run's suite score from its per-task scores {task: score}: their mean, every task weighing the same."""
    return sum(scores.values()) / len(scores)


def suite_score(store: Store, run_id: str, metric: str) -> float:
    """The macro-average of `metric` over the run's tasks."""
    return macro_average(task_scores(store, run_id, metric))


def metrics_of(store: Store, run_ids: Sequence[str]) -> list[str]:
    """The metrics every one of `run_ids` reports."""
    sets = [{m for values in store.task_scores(r).values() for m in values} for r in run_ids]
    return sorted(set.intersection(*sets)) if sets else []


@dataclass(frozen=True)
class Paired:
    """A vs B over their shared tasks, in the metric's units (difference = A - B)."""

    metric: str
    sign: int  # +1 higher is better, -1 lower is better
    table: pd.DataFrame  # task, A, B, A - B
    difference: float
    low: float
    high: float
    replicates: int
    wins: int
    ties: int
    losses: int
    leave_one_out: dict[str, float]  # task left out -> A - B over the others (empty with one task)
    only_in_a: tuple[str, ...]
    only_in_b: tuple[str, ...]
    clusters: int = 0  # task clusters the bootstrap resampled (0: tasks one by one)

    def resampling(self) -> str:
        """What the bootstrap resampled, e.g. "over 6 tasks" or "resampling 13 task clusters over 39 tasks"."""
        tasks = f"over {len(self.table)} tasks"
        return f"resampling {self.clusters} task clusters {tasks}" if self.clusters else tasks

    def lines(self) -> list[str]:
        out = [
            f"macro-average A - B: {self.difference:+.4f}, 95% paired bootstrap CI [{self.low:+.4f}, {self.high:+.4f}] "
            f"({self.replicates} replicates {self.resampling()})",
            f"A wins / ties / losses: {self.wins} / {self.ties} / {self.losses}",
        ]
        if self.leave_one_out:
            out.append(
                "leave one task out (A - B): " + ", ".join(f"{t} {d:+.4f}" for t, d in self.leave_one_out.items())
            )
        return out


def paired(a: Mapping[str, float], b: Mapping[str, float], metric: str, seed: int = 0) -> Paired:
    """A vs B task by task. When a shared task's name contains "@", the bootstrap resamples the task
    clusters of `task_cluster` (every length of a task together) instead of single tasks."""
    sign = direction(metric)
    better_a, better_b = ({t: sign * v for t, v in s.items()} for s in (a, b))
    shared = set(a) & set(b)
    clusters = {t: task_cluster(t) for t in shared} if any("@" in t for t in shared) else None
    boot = paired_bootstrap(better_a, better_b, seed=seed, clusters=clusters)
    wins, ties, losses = wins_ties_losses(better_a, better_b)
    low, high = sorted((sign * boot.low + 0.0, sign * boot.high + 0.0))  # + 0.0: no "-0" when negated
    table = pd.DataFrame(
        [{"task": t, "A": a[t], "B": b[t], "A - B": a[t] - b[t]} for t in boot.tasks],
        columns=["task", "A", "B", "A - B"],
    )
    loto = leave_one_task_out(better_a, better_b) if len(boot.tasks) > 1 else {}
    return Paired(
        metric,
        sign,
        table,
        sign * boot.difference + 0.0,
        low,
        high,
        boot.replicates,
        wins,
        ties,
        losses,
        {t: sign * d + 0.0 for t, d in loto.items()},
        boot.only_in_a,
        boot.only_in_b,
        boot.clusters,
    )


def compare_runs(store: Store, run_a: str, run_b: str, metric: str, seed: int = 0) -> Paired:
    return paired(task_scores(store, run_a, metric), task_scores(store, run_b, metric), metric, seed)


def envelope(rows: list[dict[str, Any]], baselines: Sequence[str], metric: str) -> list[dict[str, Any]]:
    """Add to each row (one per budget: {"budget", "route", <baseline>: score, ...}) the best baseline
    present at that budget and its score ("envelope")."""
    sign = direction(metric)
    out = []
    for row in rows:
        present = [b for b in baselines if row.get(b) is not None and not pd.isna(row.get(b))]
        row = dict(row)
        if present:
            best = max(present, key=lambda name: sign * row[name])
            row["best baseline"], row["envelope"] = best, row[best]
        else:
            row["best baseline"], row["envelope"] = None, None
        out.append(row)
    return out


def sweep_table(store: Store, runs: Sequence[tuple[Mapping[str, Any], str]], metric: str) -> pd.DataFrame:
    """Budget-sweep lines from labelled runs ({"series": "route" | baseline, "budget": b}, run id): one row
    per budget with each series' suite score, the best baseline and the envelope. Unfinished runs are
    left out (their cells are empty)."""
    cells: dict[int, dict[str, Any]] = {}
    series: list[str] = []
    for label, run_id in runs:
        if "budget" not in label or "series" not in label:
            continue
        run = store.run(run_id)
        if run is None or run["status"] != "finished":
            continue
        name = str(label["series"])
        if name not in series:
            series.append(name)
        cells.setdefault(int(label["budget"]), {"budget": int(label["budget"])})[name] = suite_score(
            store, run_id, metric
        )
    baselines = [s for s in series if s != "route"]
    rows = envelope([cells[b] for b in sorted(cells)], baselines, metric)
    return pd.DataFrame(rows, columns=["budget", "route", *baselines, "best baseline", "envelope"])


@dataclass(frozen=True)
class Placement:
    guided: float
    controls: list[float]
    rank: int  # 1 = best
    p_value: float  # one-sided Monte Carlo p of the guided route against the controls


def placement_summary(guided: float, controls: Sequence[float], metric: str) -> Placement:
    rank, p = rank_among(guided, controls, higher_is_better=direction(metric) > 0)
    return Placement(guided, list(controls), rank, p)


__all__ = [
    "METRIC_DIRECTION",
    "Paired",
    "Placement",
    "compare_runs",
    "direction",
    "direction_text",
    "envelope",
    "macro_average",
    "metrics_of",
    "paired",
    "placement_summary",
    "suite_score",
    "sweep_table",
    "task_cluster",
    "task_scores",
]

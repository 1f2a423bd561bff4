"""Comparisons read from the results store: two runs task by task, a budget sweep, a placement control.

The statistics see "higher is better": a lower-is-better metric (KL, perplexity) is negated before the
bootstrap, wins/ties/losses and leave-one-task-out, and the numbers are reported back in the metric's
own units and sign (A - B). The CLI's `compare` and the web app's Compare page both call these.

Tasks named `<task>@<length>` (RULER at several lengths) are one task measured several times: the
bootstrap resamples the clusters `task_cluster` names (all lengths of a task together); wins/ties/losses
and leave-one-task-out stay per task name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from polykv.eval.stats import leave_one_task_out, paired_bootstrap, rank_among, wins_ties_losses
from polykv.eval.store import Store

# +1: higher is better; -1: lower is better. Metrics not listed are taken as higher-is-better.
METRIC_DIRECTION = {"top1": 1, "rougeL": 1, "kl": -1, "ppl": -1, "score": 1}


# Perplexity-like metrics: multiplicative, heavy-tailed (one task's ppl can be 1000 while another's is 5), so
# they can be compared as log(metric): the difference is then a log-ratio and exp of it a geometric-mean ratio.
LOG_METRICS = ("ppl",)
# The metric a comparison starts on, the first of these a pair of runs reports (else the first reported):
# KL is the fidelity suite's most sensitive metric, "score" the only one of the task suites.
PREFERRED_METRICS = ("kl", "score", "top1", "rougeL", "ppl")
OUTCOMES = ("A better", "B better", "tie")


def direction(metric: str) -> int:
    return METRIC_DIRECTION.get(metric, 1)


def can_log(metric: str) -> bool:
    """Whether `metric` may be compared as log(metric) (see LOG_METRICS)."""
    return metric in LOG_METRICS


def preferred_metric(metrics: Sequence[str]) -> str | None:
    """The metric to compare on first among `metrics` (PREFERRED_METRICS order), None when there is none."""
    return next((m for m in PREFERRED_METRICS if m in metrics), metrics[0] if metrics else None)


def outcome(difference: float, metric: str) -> str:
    """ "A better", "B better" or "tie" for an A - B `difference` in `metric`'s own units and sign."""
    better = direction(metric) * difference
    return "A better" if better > 0 else "B better" if better < 0 else "tie"


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


def log_scores(scores: Mapping[str, float], metric: str, run: str = "") -> dict[str, float]:
    """{task: log(score)}; a ValueError (one line) when a score is not positive (log undefined)."""
    bad = next((t for t, v in scores.items() if not v > 0), None)
    if bad is not None:
        raise ValueError(
            f"log {metric} needs positive scores: task {bad!r}{f' of run {run}' if run else ''} has {scores[bad]}"
        )
    return {t: math.log(v) for t, v in scores.items()}


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
    log: bool = False  # compared as log(metric): the table, difference and interval are in log units

    @property
    def label(self) -> str:
        """What the numbers are in: "kl", or "log ppl" for a log comparison."""
        return f"log {self.metric}" if self.log else self.metric

    def ratio(self) -> tuple[float, float, float]:
        """A log comparison's difference and interval as ratios A / B: exp of the mean log-ratio (the
        geometric mean over tasks of A / B) and of the interval's ends."""
        if not self.log:
            raise ValueError(f"{self.metric} was not compared on a log scale: its differences are not log-ratios")
        return math.exp(self.difference), math.exp(self.low), math.exp(self.high)

    def outcome(self) -> str:
        """ "A better", "B better" or "tie" by the macro-average difference and the metric's direction."""
        return outcome(self.difference, self.metric)

    def outcomes(self) -> list[str]:
        """Per task (the table's rows, in order): "A better", "B better" or "tie" (as wins/ties/losses)."""
        return [outcome(d, self.metric) for d in self.table["A - B"]]

    def report_table(self) -> pd.DataFrame:
        """The per-task table as a page shows it: the outcome per task, and for a log comparison the
        columns named in log units with the ratio A / B beside them."""
        table = self.table.copy()
        if self.log:
            table = table.rename(columns={"A": "log A", "B": "log B", "A - B": "log A - log B"})
            table["A / B"] = [ratio_text(math.exp(d)) for d in self.table["A - B"]]
        table["outcome"] = self.outcomes()
        return table

    def resampling(self) -> str:
        """What the bootstrap resampled, e.g. "over 6 tasks" or "resampling 13 task clusters over 39 tasks"."""
        tasks = f"over {len(self.table)} tasks"
        return f"resampling {self.clusters} task clusters {tasks}" if self.clusters else tasks

    def lines(self) -> list[str]:
        units = f" ({self.label})" if self.log else ""  # a log comparison says its numbers are log-ratios
        out = [
            f"macro-average A - B{units}: {self.difference:+.4f}, "
            f"95% paired bootstrap CI [{self.low:+.4f}, {self.high:+.4f}] "
            f"({self.replicates} replicates {self.resampling()})",
            f"A wins / ties / losses: {self.wins} / {self.ties} / {self.losses}",
        ]
        if self.log:
            ratio, low, high = self.ratio()
            ends = f"[{ratio_text(low)}, {ratio_text(high)}]"
            out.insert(1, f"A / B (geometric mean over tasks): {ratio_text(ratio)}, 95% CI {ends}")
        if self.leave_one_out:
            out.append(
                "leave one task out (A - B): " + ", ".join(f"{t} {d:+.4f}" for t, d in self.leave_one_out.items())
            )
        return out


def paired(a: Mapping[str, float], b: Mapping[str, float], metric: str, seed: int = 0, log: bool = False) -> Paired:
    """A vs B task by task. When a shared task's name contains "@", the bootstrap resamples the task
    clusters of `task_cluster` (every length of a task together) instead of single tasks. `log`: compare
    log(score) per task (a perplexity-like metric, `can_log`), so differences are log-ratios."""
    if log:
        if not can_log(metric):
            raise ValueError(f"metric {metric} is not compared on a log scale (only {', '.join(LOG_METRICS)})")
        a, b = log_scores(a, metric, "A"), log_scores(b, metric, "B")
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
        log,
    )


def compare_runs(store: Store, run_a: str, run_b: str, metric: str, seed: int = 0, log: bool = False) -> Paired:
    return paired(task_scores(store, run_a, metric), task_scores(store, run_b, metric), metric, seed, log)


# ---- numbers as the page prints them --------------------------------------------------------------------
def _decimals(low: float, high: float) -> int | None:
    """Decimals that show an interval's width to 2 significant digits and its largest end to at least 2;
    None when fixed-point would be unreadable (ends of a million or more, or below 1e-6)."""
    size = max(abs(low), abs(high))
    if not (math.isfinite(size) and size < 1e6):
        return None
    if size == 0:
        return 0
    width = high - low
    places = 1 - math.floor(math.log10(size))
    if width > 0:
        places = max(places, 1 - math.floor(math.log10(width)))
    return max(0, places) if places <= 6 else None


def signed(value: float, low: float, high: float) -> str:
    """`value` (+/- signed) at the precision of the interval [low, high]: "+0.025", "-12", "+1583"."""
    places = _decimals(min(low, value), max(high, value))
    return f"{value:+.3g}" if places is None else f"{value:+.{places}f}"


def interval_text(low: float, high: float) -> str:
    """An interval at a precision its width deserves: "[-12, +1583]", "[-0.05, +0.10]" (no exponents
    below a million)."""
    return f"[{signed(low, low, high)}, {signed(high, low, high)}]"


def ratio_text(ratio: float) -> str:
    """A ratio A / B as "×1.12" (3 significant digits)."""
    return f"×{ratio:.3g}"


# ---- which runs the Compare page starts on, and what each run is -------------------------------------
@dataclass(frozen=True)
class DefaultPair:
    """The pair of runs a comparison starts on and why (one line, for a caption)."""

    a: str
    b: str
    reason: str


def _labels(jobs: Sequence[Any]) -> dict[str, tuple[Any, Mapping[str, Any]]]:
    """run id -> (the newest job that launched it, its label there). `jobs` newest first."""
    found: dict[str, tuple[Any, Mapping[str, Any]]] = {}
    for job in jobs:
        for r in getattr(job, "runs", []):
            found.setdefault(r.run_id, (job, r.label))
    return found


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
    finished_runs: Sequence[Mapping[str, Any]], jobs: Sequence[Any], store: Store, metric: str | None = None
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
    ids = [r["id"] for r in finished_runs]
    found = _route_vs_baseline(set(ids), jobs, store, metric)
    if found is not None:
        return found
    labels = _labels(jobs)

    def placement(run_id: str) -> bool:
        return labels.get(run_id, (None, {}))[1].get("series") == "placement"

    first = next((r for r in finished_runs if not placement(r["id"])), finished_runs[0])
    others = [r for r in finished_runs if r["id"] != first["id"]]
    if not others:
        return DefaultPair(first["id"], first["id"], "the only finished run")

    def rank(item: tuple[int, Mapping[str, Any]]) -> tuple[bool, bool, int]:
        index, row = item
        alike = row.get("suite") == first.get("suite") and row.get("model") == first.get("model")
        return (not alike, placement(row["id"]), index)

    second = min(enumerate(others), key=rank)[1]
    return DefaultPair(
        first["id"], second["id"], "the two newest finished runs (no job with a finished route and baseline)"
    )


def runs_table(runs: Sequence[Mapping[str, Any]], jobs: Sequence[Any]) -> pd.DataFrame:
    """One row per run (store rows, in their order) with what it is and its tags: the label of the newest
    job that launched it (series, budget, role) and that job's title and id."""
    labels = _labels(jobs)
    rows = []
    for run in runs:
        job, label = labels.get(run["id"], (None, {}))
        budget = label.get("budget")
        rows.append(
            {
                "run": run["id"],
                "plan": run["plan_name"],
                "suite": run["suite"],
                "model": run["model"],
                "status": run["status"],
                "created": str(run["created"])[:19],
                "series": label.get("series"),
                "budget": int(budget) if isinstance(budget, (int, float)) and not isinstance(budget, bool) else None,
                "role": label.get("role"),
                "job": f"{job.title} · {job.id}" if job is not None else None,
            }
        )
    columns = ["run", "plan", "suite", "model", "status", "created", "series", "budget", "role", "job"]
    frame = pd.DataFrame(rows, columns=columns)
    frame["budget"] = frame["budget"].astype("Int64")  # sorts as numbers, empty where a run has no budget
    return frame


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
    "LOG_METRICS",
    "METRIC_DIRECTION",
    "OUTCOMES",
    "PREFERRED_METRICS",
    "DefaultPair",
    "Paired",
    "Placement",
    "can_log",
    "compare_runs",
    "default_pair",
    "direction",
    "direction_text",
    "envelope",
    "interval_text",
    "is_baseline",
    "log_scores",
    "macro_average",
    "metrics_of",
    "outcome",
    "paired",
    "placement_summary",
    "preferred_metric",
    "ratio_text",
    "runs_table",
    "signed",
    "suite_score",
    "sweep_table",
    "task_cluster",
    "task_scores",
]

"""Comparisons read from the results store: two runs task by task, a budget sweep, a placement control.

The statistics see "higher is better": a lower-is-better metric (KL, perplexity) is negated before the
bootstrap, wins/ties/losses and leave-one-task-out, and the numbers are reported back in the metric's
own units and sign (A - B). The CLI's `compare` and the web app's Compare page both call these.

Beside the paper's bootstrap over tasks, a comparison of two runs in the store is tested at the sample
level (`polykv.eval.statistics.samples`: a sign-flip permutation test and a within-task bootstrap over the
samples both runs scored) and states the minimal detectable difference of both tests; its verdict
("better", "worse", "no significant difference") rests on the sample-level test and names it.

Tasks named `<task>@<length>` (RULER at several lengths) are one task measured several times: the
bootstrap resamples the clusters `task_cluster` names (all lengths of a task together); wins/ties/losses
and leave-one-task-out stay per task name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from polykv.eval.results.store import Store, sample_key
from polykv.eval.statistics.contrast import (
    NO_DIFFERENCE,
    direction,
    interval_verdict,
    outcome,
    verdict,
)
from polykv.eval.statistics.render import NOT_ESTIMABLE as NOT_ESTIMABLE_HERE
from polykv.eval.statistics.render import interval, ratio_text
from polykv.eval.statistics.samples import (
    NO_MDE_WHY,
    SampleScores,
    SampleTest,
    detectable,
    sample_test,
    shares_samples,
    task_mde,
)
from polykv.eval.statistics.tasks import leave_one_task_out, paired_bootstrap, wins_ties_losses

# Perplexity-like metrics: multiplicative, heavy-tailed (one task's ppl can be 1000 while another's is 5), so
# they can be compared as log(metric): the difference is then a log-ratio and exp of it a geometric-mean ratio.
LOG_METRICS = ("ppl",)
# The metric a comparison starts on, the first of these a pair of runs reports (else the first reported):
# KL is the fidelity suite's most sensitive metric, answer_nll the question suites' (dense, where "score"
# flips whole samples).
PREFERRED_METRICS = ("kl", "answer_nll", "score", "agreement", "top1", "rougeL", "ppl")
OUTCOMES = ("A better", "B better", "tie")


def can_log(metric: str) -> bool:
    """Whether `metric` may be compared as log(metric) (see LOG_METRICS)."""
    return metric in LOG_METRICS


def preferred_metric(metrics: Sequence[str]) -> str | None:
    """The metric to compare on first among `metrics` (PREFERRED_METRICS order), None when there is none."""
    return next((m for m in PREFERRED_METRICS if m in metrics), metrics[0] if metrics else None)


def task_cluster(task: str) -> str:
    """The task a scored name belongs to: the part before "@" ("niah_single_1@4096" -> "niah_single_1")."""
    return task.split("@", 1)[0]


def task_scores(store: Store, run_id: str, metric: str) -> dict[str, float]:
    """One run's per-task `metric`; a ValueError (one line) when it has none."""
    scores = {task: values[metric] for task, values in store.task_scores(run_id).items() if metric in values}
    if not scores:
        raise ValueError(f"run {run_id} has no finished task with metric {metric!r}")
    return scores


def sample_scores(store: Store, run_id: str, metric: str) -> dict[str, dict[str, float]]:
    """One run's per-sample `metric`: {task: {sample key: value}} (samples without it are left out), keyed by
    `sample_key`: two runs' samples pair only when they asked the same prompt."""
    seed = _seed(store, run_id)
    out: dict[str, dict[str, float]] = {}
    for row in store.samples(run_id):
        if metric in row.metrics:
            out.setdefault(row.task, {})[sample_key(row, seed)] = row.metrics[metric]
    return out


def _seed(store: Store, run_id: str) -> int:
    run = store.run(run_id)
    if run is None:
        raise ValueError(f"no run {run_id}")
    return int(run.seed)


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
    samples: SampleTest | None = None  # the sample-level test (when the per-sample scores were given)
    task_mde: float = math.nan  # minimal detectable difference of a test over the tasks (80% power)
    # the fewest shared tasks whose bootstrap interval is shown and judged on: 0 (the paper's protocol, any count) in
    # experiments; `TASKS_FOR_INTERVAL` for two runs compared (`compare_runs`), where two task means make no interval
    interval_tasks: int = 0

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

    def verdict(self) -> str:
        """ "better", "worse" (A against B, in the metric's direction) or "no significant difference", by the
        sample-level test when there is one (else by whether the task bootstrap interval excludes 0, when there are
        enough tasks for one: `task_interval`); "not tested" with neither."""
        if self.samples is not None:
            return verdict(self.samples.difference, self.metric, self.samples.significant())
        if not self.task_interval:
            return NOT_TESTED
        return interval_verdict(self.low, self.high, self.metric)

    def verdict_text(self) -> str:
        """The verdict with the test it rests on and the smallest difference that test could have detected."""
        if self.samples is not None:
            mde = self.samples.mde
            power = f"it detects {mde:.3g} {self.label} with 80% power"
            if mde != mde:
                power = f"detectable difference {NOT_ESTIMABLE_HERE} ({NO_MDE_WHY})"
            return f"{self.verdict()} ({self.samples.describe()}; {power})"
        if not self.task_interval:
            return (
                f"{NOT_TESTED}: the runs share no samples, and {len(self.table)} tasks are too few for an interval "
                f"over task means (at least {self.interval_tasks})"
            )
        tasks = f"; it detects {self.task_mde:.3g} with 80% power" if self.task_mde > 0 else ""
        return f"{self.verdict()} (95% paired bootstrap over {len(self.table)} tasks{tasks})"

    def badge(self) -> str:
        """What a page's badge says: "A better" or "B better" only when the verdict says so, "not tested" when there
        is no test, else "no significant difference" (never a winner beside a verdict of none)."""
        verdict = self.verdict()
        return {"better": "A better", "worse": "B better", NOT_TESTED: NOT_TESTED}.get(verdict, NO_DIFFERENCE)

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

    @property
    def task_interval(self) -> bool:
        """Are there enough shared tasks (`interval_tasks`) for a bootstrap interval over task means to mean
        something? With two tasks it is only the range of their two means."""
        return len(self.table) >= self.interval_tasks

    def task_line(self) -> str:
        """The task level in one line: the macro-average difference, with its bootstrap interval over the task
        means only when there are enough tasks, else saying why there is none."""
        units = f" ({self.label})" if self.log else ""  # a log comparison says its numbers are log-ratios
        head = f"macro-average A - B{units}: {self.difference:+.4f}"
        tasks = f"{len(self.table)} task{'s' * (len(self.table) != 1)}"
        if not self.task_interval:
            return f"{head} over {tasks} (too few for an interval over task means: at least {self.interval_tasks})"
        return (
            f"{head}, 95% paired bootstrap CI {interval(self.low, self.high)} of the task means "
            f"({self.replicates} replicates {self.resampling()})"
        )

    def lines(self) -> list[str]:
        """The comparison in lines, the sample-level test first (the headline) when the runs share samples."""
        out = []
        if self.samples is not None:
            test = self.samples
            out.append(
                f"sample level (headline): A - B {test.difference:+.4f} ({self.label}), 95% CI "
                f"{interval(test.low, test.high)} (the shifts the sign-flip test does not reject); {test.describe()}; "
                f"{detectable(test.mde, '.4g')} detectable with 80% power"
            )
        out.append(self.task_line())
        out.append(f"A wins / ties / losses: {self.wins} / {self.ties} / {self.losses} (tasks)")
        if self.log:
            ratio, low, high = self.ratio()
            ends = f", 95% CI [{ratio_text(low)}, {ratio_text(high)}]" if self.task_interval else ""
            out.insert(len(out) - 1, f"A / B (geometric mean over tasks): {ratio_text(ratio)}{ends}")
        if self.leave_one_out:
            out.append(
                "leave one task out (A - B): " + ", ".join(f"{t} {d:+.4f}" for t, d in self.leave_one_out.items())
            )
        mdes = [f"{_detectable(self.task_mde)} over tasks"]
        if self.samples is not None:
            mdes.insert(0, f"{detectable(self.samples.mde, '.4g')} over samples")
        out.append(f"minimal detectable difference (80% power, two-sided 5%): {', '.join(mdes)} ({self.label})")
        verdict = self.verdict_text()
        out.append(f"verdict: A {verdict}" if verdict.startswith(("better", "worse")) else f"verdict: {verdict}")
        return out


# A bootstrap interval over task means is shown from this many shared tasks on (two tasks: the range of two means).
TASKS_FOR_INTERVAL = 5
NOT_TESTED = "not tested"  # no shared samples and too few tasks: no verdict either way


def _detectable(mde: float) -> str:
    return f"{NOT_ESTIMABLE_HERE} (fewer than 2 tasks, or no difference varies)" if mde != mde else f"{mde:.4g}"


def paired(
    a: Mapping[str, float],
    b: Mapping[str, float],
    metric: str,
    seed: int = 0,
    log: bool = False,
    samples: tuple[SampleScores, SampleScores] | None = None,
) -> Paired:
    """A vs B task by task. When a shared task's name contains "@", the bootstrap resamples the task
    clusters of `task_cluster` (every length of a task together) instead of single tasks. `log`: compare
    log(score) per task (a perplexity-like metric, `can_log`), so differences are log-ratios. `samples`:
    both runs' per-sample scores ({task: {sample: value}}), for the sample-level test."""
    if log:
        if not can_log(metric):
            raise ValueError(f"metric {metric} is not compared on a log scale (only {', '.join(LOG_METRICS)})")
        a, b = log_scores(a, metric, "A"), log_scores(b, metric, "B")
        if samples is not None:
            samples = tuple(
                {t: log_scores(values, metric, run) for t, values in side.items()}
                for side, run in zip(samples, ("A", "B"))
            )
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
    # runs that share no sample (other seeds, or samples stored before prompts were) compare over tasks alone
    test = sample_test(*samples, seed=seed) if samples is not None and shares_samples(*samples) else None
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
        test,
        task_mde(table["A - B"]),
    )


def compare_runs(store: Store, run_a: str, run_b: str, metric: str, seed: int = 0, log: bool = False) -> Paired:
    """Two runs of the store, task by task and sample by sample."""
    samples = (sample_scores(store, run_a, metric), sample_scores(store, run_b, metric))
    result = paired(task_scores(store, run_a, metric), task_scores(store, run_b, metric), metric, seed, log, samples)
    return replace(result, interval_tasks=TASKS_FOR_INTERVAL)


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
        if run is None or run.status != "finished":
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


__all__ = [
    "LOG_METRICS",
    "OUTCOMES",
    "PREFERRED_METRICS",
    "Paired",
    "can_log",
    "compare_runs",
    "envelope",
    "log_scores",
    "macro_average",
    "metrics_of",
    "paired",
    "preferred_metric",
    "sample_scores",
    "suite_score",
    "sweep_table",
    "task_cluster",
    "task_scores",
]

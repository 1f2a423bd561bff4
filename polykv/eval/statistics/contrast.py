"""How PolyKV decides a contrast A - B: which way each metric points, and the verdict.

Every comparison (Compare and `polykv compare`, the experiments, the study, the text and workload searches)
reads the direction of its metric from `METRIC_DIRECTION` and states its verdict with `verdict`: "better" or
"worse" (A against B, in the metric's direction) only when its test is significant, else "no significant
difference". A metric missing from the table is refused in one line: guessing its direction could turn a
loss into a win.
"""

from __future__ import annotations

from collections.abc import Mapping

from polykv.errors import PolyKVError

# +1: higher is better; -1: lower is better. Every metric a suite or a search reports.
METRIC_DIRECTION = {
    "kl": -1,  # fidelity: KL(FullKV || plan) per teacher-forced step
    "ppl": -1,  # fidelity: perplexity of the continuation
    "top1": 1,  # fidelity: the next-token argmax agrees with FullKV's
    "rougeL": 1,  # fidelity: ROUGE-L of the generated continuation against FullKV's
    "score": 1,  # RULER, LongBench: the suite's accuracy (0-100)
    "agreement": 1,  # RULER, LongBench: the generated answer agrees with FullKV's
    "answer_nll": -1,  # RULER, LongBench: the gold answer's negative log-likelihood
    "answer_match": 1,  # RULER, LongBench: every gold token is the argmax given the gold before it (0 or 100)
}
NO_DIFFERENCE = "no significant difference"
VERDICTS = ("better", "worse", NO_DIFFERENCE)


class UnknownMetricError(PolyKVError, ValueError):
    """A metric whose direction PolyKV does not know."""


def direction(metric: str) -> int:
    """+1 when a higher `metric` is better, -1 when lower is; an UnknownMetricError (one line) otherwise."""
    try:
        return METRIC_DIRECTION[metric]
    except KeyError:
        raise UnknownMetricError(
            f"unknown metric {metric!r}: its direction is not known (metrics: {', '.join(METRIC_DIRECTION)})"
        ) from None


def direction_text(metric: str) -> str:
    """E.g. "metric kl (lower is better)": what every report says about its numbers."""
    return f"metric {metric} ({'higher' if direction(metric) > 0 else 'lower'} is better)"


def better_by(difference: float, metric: str) -> float:
    """An A - B `difference` in the direction "A better": positive when A is better."""
    return direction(metric) * difference


def verdict(difference: float, metric: str, significant: bool) -> str:
    """The verdict on A - B = `difference` in `metric`'s units: "better" or "worse" (A against B) when the test
    behind it is `significant`, else "no significant difference" (also for a significant zero)."""
    if not significant or difference != difference:
        return NO_DIFFERENCE
    better = better_by(difference, metric)
    return "better" if better > 0 else "worse" if better < 0 else NO_DIFFERENCE


def interval_verdict(low: float, high: float, metric: str) -> str:
    """The verdict from a 95% interval of A - B: significant when it excludes 0 (the task bootstrap's rule)."""
    excludes_zero = low > 0 or high < 0
    return verdict(low if low > 0 else high, metric, excludes_zero)


def outcome(difference: float, metric: str) -> str:
    """ "A better", "B better" or "tie" for one task or sample's A - B `difference` (no test: wins and losses)."""
    better = better_by(difference, metric)
    return "A better" if better > 0 else "B better" if better < 0 else "tie"


def sample_wins(
    a: Mapping[str, Mapping[str, float]], b: Mapping[str, Mapping[str, float]], metric: str
) -> tuple[int, int, int]:
    """Per-sample wins, ties and losses of A against B over the samples both scored ({task: {sample: value}})."""
    counts = {"A better": 0, "tie": 0, "B better": 0}
    for task, values in a.items():
        theirs = b.get(task, {})
        for sample, value in values.items():
            if sample in theirs:
                counts[outcome(value - theirs[sample], metric)] += 1
    return counts["A better"], counts["tie"], counts["B better"]


__all__ = [
    "METRIC_DIRECTION",
    "NO_DIFFERENCE",
    "VERDICTS",
    "UnknownMetricError",
    "better_by",
    "direction",
    "direction_text",
    "interval_verdict",
    "outcome",
    "sample_wins",
    "verdict",
]

"""One rule decides every verdict (`polykv.eval.statistics.contrast`): each metric's direction from one table, an
unknown metric refused, and the same verdict from Compare, the experiments, the text search and the workload search."""

from __future__ import annotations

import pytest

from polykv.eval.comparing.compare import paired
from polykv.eval.experiments.report import Contrast
from polykv.eval.statistics import contrast
from polykv.eval.statistics.contrast import METRIC_DIRECTION, UnknownMetricError, verdict
from polykv.search.text.report import held_out_contrast
from polykv.search.workload.verdict import contrast as workload_contrast

# A beats B on every one of 30 samples by a clear margin in raw units: significant in any direction.
TASKS = ("t1", "t2", "t3")
HIGH = {t: {f"{t}-{i}": 1.0 + 0.01 * i for i in range(10)} for t in TASKS}
LOW = {t: {s: v - 0.5 for s, v in values.items()} for t, values in HIGH.items()}


def task_means(scores):
    return {t: sum(v.values()) / len(v) for t, v in scores.items()}


def test_the_rule_on_every_metric():
    for metric, sign in METRIC_DIRECTION.items():
        up = "better" if sign > 0 else "worse"
        down = "worse" if sign > 0 else "better"
        assert verdict(+0.5, metric, significant=True) == up, metric
        assert verdict(-0.5, metric, significant=True) == down, metric
        assert verdict(+0.5, metric, significant=False) == contrast.NO_DIFFERENCE
        assert verdict(0.0, metric, significant=True) == contrast.NO_DIFFERENCE
        assert verdict(float("nan"), metric, significant=True) == contrast.NO_DIFFERENCE
        assert contrast.interval_verdict(0.1, 0.9, metric) == up
        assert contrast.interval_verdict(-0.9, -0.1, metric) == down
        assert contrast.interval_verdict(-0.1, 0.9, metric) == contrast.NO_DIFFERENCE
        assert contrast.sample_wins(HIGH, LOW, metric) == ((30, 0, 0) if sign > 0 else (0, 0, 30))


def test_an_unknown_metric_is_refused_in_one_line_everywhere():
    with pytest.raises(UnknownMetricError, match=r"^unknown metric 'bleu': its direction is not known \(metrics: kl,"):
        verdict(1.0, "bleu", significant=True)
    for call in (
        lambda: paired(task_means(HIGH), task_means(LOW), "bleu", samples=(HIGH, LOW)),
        lambda: workload_contrast(HIGH, LOW, "bleu"),
        lambda: contrast.direction_text("bleu"),
        lambda: contrast.outcome(1.0, "bleu"),
    ):
        with pytest.raises(UnknownMetricError):
            call()


@pytest.mark.parametrize("metric", sorted(METRIC_DIRECTION))
def test_compare_experiments_and_both_searches_state_the_rule_s_verdict(metric):
    expected = verdict(0.5, metric, significant=True)  # A - B = +0.5 on every sample
    compared = paired(task_means(HIGH), task_means(LOW), metric, samples=(HIGH, LOW))
    assert compared.samples is not None and compared.samples.significant()
    assert compared.verdict() == expected
    assert compared.verdict_text().startswith(expected)
    assert Contrast.fields_of(compared)["verdict"] == expected  # what an experiment's report saves
    assert workload_contrast(HIGH, LOW, metric)["verdict"] == expected
    # the text search: one score per held-out sequence (perplexity compared as a log-ratio, the same direction)
    by_sequence = {
        role: {f"{i:03d}": v for i, v in enumerate(s["t1"].values())} for role, s in (("a", HIGH), ("b", LOW))
    }
    assert held_out_contrast("a", "b", metric, by_sequence, seed=0)["verdict"] == expected

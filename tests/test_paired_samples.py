"""The sample-level test and the minimal detectable difference (polykv.eval.statistics.samples), checked against
direct computations on synthetic paired data with a known effect; the samples a target asks for."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from polykv.eval.statistics import samples as ps


def scores(values_by_task: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {task: {f"{i:03d}": v for i, v in enumerate(values)} for task, values in values_by_task.items()}


def exact_sign_flip_p(diffs: dict[str, np.ndarray]) -> float:
    """Every one of the 2^n sign assignments: the exact two-sided p of the macro difference."""
    values, weights = ps._weights(diffs)
    observed = abs(float(values @ weights))
    hits = sum(
        abs(float((values * signs) @ weights)) >= observed - 1e-12
        for signs in itertools.product((1, -1), repeat=len(values))
    )
    return hits / 2 ** len(values)


def test_the_sign_flip_p_value_is_the_exact_permutation_p_within_monte_carlo_error():
    rng = np.random.default_rng(7)
    diffs = {"a": rng.normal(0.3, 1.0, 6), "b": rng.normal(0.3, 1.0, 5), "c": rng.normal(0.3, 1.0, 4)}
    exact = exact_sign_flip_p(diffs)  # 2^15 assignments
    estimate = ps.sign_flip_p(diffs, permutations=40_000, seed=1)
    # (1 + hits) / (N + 1) has a binomial standard error of about sqrt(p (1 - p) / N) <= 0.0025
    assert estimate == pytest.approx(exact, abs=0.01)
    assert ps.sign_flip_p(diffs, permutations=2000, seed=3) == ps.sign_flip_p(diffs, permutations=2000, seed=3)


def test_the_statistic_is_the_macro_average_every_task_weighing_the_same():
    a = scores({"big": [1.0] * 10, "small": [5.0, 5.0]})
    b = scores({"big": [0.0] * 10, "small": [0.0, 1.0]})
    test = ps.sample_test(a, b, permutations=200)
    assert test.difference == pytest.approx((1.0 + 4.5) / 2)  # not the mean of the 12 differences
    assert (test.samples, test.differing, test.tasks) == (12, 12, 2)


def test_the_minimal_detectable_difference_is_the_power_formula_on_the_observed_spread():
    rng = np.random.default_rng(11)
    tasks, n, sd = 4, 50, 2.0
    diffs = {f"t{i}": rng.normal(0.0, sd, n) for i in range(tasks)}
    se = math.sqrt(sum(float(np.var(d, ddof=1)) / n for d in diffs.values())) / tasks
    df = tasks * (n - 1)
    assert ps.macro_standard_error(diffs) == pytest.approx(se)
    # the test's rejection bound from its own null spread S, which grows with the shift: solved by hand
    weights, values = 1.0 / (tasks * n), np.concatenate(list(diffs.values()))
    spread = math.sqrt(float(np.sum(weights**2 * (values - ps.macro_difference(diffs)) ** 2)))
    a, b, v = stats.norm.ppf(0.975), stats.t.ppf(0.8, df), tasks * n * weights**2
    direct = ps.sample_mde(diffs)
    assert direct == pytest.approx(a * math.sqrt(spread**2 + v * direct**2) + b * se)
    assert direct == pytest.approx((a + b) * se, rel=0.03)  # equal tasks: S is about SE, the usual (t + t) x SE
    assert direct == pytest.approx(2.80 * sd / math.sqrt(tasks * n), rel=0.08)  # the textbook 2.8 sigma / sqrt(N)
    # over tasks: T - 1 degrees of freedom
    task_diffs = [0.1, -0.3, 0.5, 0.2, 0.0]
    expected = (stats.t.ppf(0.975, 4) + stats.t.ppf(0.8, 4)) * np.std(task_diffs, ddof=1) / math.sqrt(5)
    assert ps.task_mde(task_diffs) == pytest.approx(expected)
    assert math.isnan(ps.task_mde([0.3]))


def test_a_true_difference_of_one_mde_is_detected_about_80_percent_of_the_time():
    # Synthetic paired data with a known effect: 3 tasks of 40 samples, SD 1.5; the effect is the MDE computed
    # from the known SD. The sign-flip test at 5% should reject in about 80% of 300 replications.
    tasks, n, sd = 3, 40, 1.5
    effect = (stats.t.ppf(0.975, tasks * (n - 1)) + stats.t.ppf(0.8, tasks * (n - 1))) * sd / math.sqrt(tasks * n)
    rng = np.random.default_rng(5)
    rejections = 0
    for r in range(300):
        diffs = {f"t{i}": rng.normal(effect, sd, n) for i in range(tasks)}
        rejections += ps.sign_flip_p(diffs, permutations=1000, seed=r) < 0.05
    assert 0.72 <= rejections / 300 <= 0.88
    # and with no effect it rejects about 5% of the time
    false = sum(
        ps.sign_flip_p({f"t{i}": rng.normal(0.0, sd, n) for i in range(tasks)}, permutations=1000, seed=r) < 0.05
        for r in range(300)
    )
    assert false / 300 <= 0.09


def test_where_the_tasks_differ_the_mde_is_what_the_sign_flip_test_detects_80_percent_of_the_time():
    """One task strongly one way, two the other (as fwe against the needle tasks): the flips count that spread as
    noise. The MDE with tasks fixed alone ((t + t) x SE, 0.13 here) would be detected almost never; the MDE of the
    test, about 80% of the time."""
    tasks, n, sd, offsets = 3, 40, 0.5, np.array([-2.0, 1.0, 1.0])
    rng = np.random.default_rng(7)
    pilot = {f"t{i}": rng.normal(offsets[i], sd, n) for i in range(tasks)}
    mde = ps.sample_mde(pilot)
    stratified = (stats.t.ppf(0.975, tasks * (n - 1)) + stats.t.ppf(0.8, tasks * (n - 1))) * ps.macro_standard_error(
        pilot
    )
    assert mde > 2 * stratified
    hits = {"mde": 0, "stratified": 0}
    for r in range(200):
        noise = [rng.normal(offsets[i], sd, n) for i in range(tasks)]
        for name, shift in (("mde", mde), ("stratified", stratified)):
            hits[name] += ps.sign_flip_p({f"t{i}": noise[i] + shift for i in range(tasks)}, 1000, seed=r) < 0.05
    assert 0.68 <= hits["mde"] / 200 <= 0.9 and hits["stratified"] / 200 < 0.2


def test_with_few_samples_differing_the_p_value_is_exact():
    one_way = {"a": np.full(8, 0.5), "b": np.full(8, 0.25)}  # 16 samples, all the same way
    assert ps.sign_flip_p(one_way) == 2 / 2**16  # the two extreme assignments of 65,536 (a Monte Carlo p: 1e-4)
    rng = np.random.default_rng(4)
    mixed = {"a": rng.normal(0.2, 1.0, 7), "b": np.concatenate([rng.normal(0.2, 1.0, 5), np.zeros(30)])}
    values, weights = ps._weights(mixed)
    weighted = (values * weights)[values != 0]  # a zero difference is the same whatever its sign
    hits = sum(
        abs(float(np.dot(signs, weighted))) >= abs(float(weighted.sum())) - 1e-12
        for signs in itertools.product((1, -1), repeat=len(weighted))
    )
    assert ps.sign_flip_p(mixed) == hits / 2 ** len(weighted)
    test = ps.sample_test(scores({t: list(v) for t, v in mixed.items()}), scores({"a": [0] * 7, "b": [0] * 35}))
    assert test.exact and test.differing == 12 and "exact sign-flip" in test.describe()


def test_the_interval_is_the_test_inverted_and_agrees_with_it():
    rng = np.random.default_rng(9)
    for trial in range(12):
        n = 6 if trial < 6 else 30  # exact, then Monte Carlo
        diffs = {"a": rng.normal(0.4, 1.0, n), "b": rng.normal(0.4, 1.0, n)}
        low, high = ps.sign_flip_interval(diffs)
        p = ps.sign_flip_p(diffs)
        assert low <= ps.macro_difference(diffs) <= high
        assert (low > 0 or high < 0) == (p < 0.05), (trial, low, high, p)
        # each bound is where the test of the shifted differences turns from rejecting to not rejecting
        for bound, outward in ((low, -1e-3), (high, 1e-3)):
            shifted = {t: d - (bound + outward) for t, d in diffs.items()}
            assert ps.sign_flip_p(shifted) < 0.05 + 0.01


def test_the_interval_is_about_the_normal_interval_for_large_samples():
    rng = np.random.default_rng(2)
    diffs = {f"t{i}": rng.normal(0.5, 1.0, 400) for i in range(3)}
    low, high = ps.sign_flip_interval(diffs)
    mean, se = ps.macro_difference(diffs), ps.macro_standard_error(diffs)
    assert low == pytest.approx(mean - 1.96 * se, abs=0.015) and high == pytest.approx(mean + 1.96 * se, abs=0.015)


def test_two_contrasts_draw_their_own_flips_and_one_contrast_always_the_same():
    rng = np.random.default_rng(3)
    first = {"t": rng.normal(0.1, 1.0, 40)}
    second = {"t": first["t"] + 1e-9}  # other data: other flips, so Monte Carlo errors do not repeat across rows
    signs = lambda d: next(ps._random_signs(ps._rng(0, *ps._weights(d)), 40, 5))  # noqa: E731
    assert not np.array_equal(signs(first), signs(second))
    assert np.array_equal(signs(first), signs(first))
    assert ps.sign_flip_p(first, seed=0) == ps.sign_flip_p(first, seed=0)


def test_samples_for_is_the_smallest_count_reaching_the_target():
    sds = [1.0, 2.0, 0.5]
    n = ps.samples_for(sds, 0.3)

    def mde(count: int) -> float:
        se = math.sqrt(sum(s * s for s in sds) / count) / len(sds)
        return ps.minimal_detectable_difference(se, len(sds) * (count - 1))

    assert mde(n) <= 0.3 < mde(n - 1)
    assert ps.samples_for(sds, 1e-6, most=500) == 500  # unreachable: the most it may take
    with pytest.raises(ValueError, match="positive"):
        ps.samples_for(sds, 0.0)


def test_samples_missing_on_one_side_are_left_out_and_nothing_shared_is_an_error():
    a = scores({"t": [1.0, 2.0, 3.0]})
    b = {"t": {"000": 0.0, "002": 1.0}}
    diffs = ps.paired_differences(a, b)
    assert list(diffs["t"]) == [1.0, 2.0]
    with pytest.raises(ValueError, match="share no sample"):
        ps.paired_differences(a, {"u": {"000": 1.0}})
    test = ps.sample_test(a, a, permutations=100)
    assert test.p_value == 1.0 and test.differing == 0 and math.isnan(test.mde)  # nothing varies: no power to state


def test_no_detectable_difference_is_stated_when_too_few_samples_differ_or_none_varies():
    """With k samples differing the smallest two-sided sign-flip p is 2 / 2^k: at k <= 5 nothing can be
    significant at 5%, so no minimal detectable difference is stated; nor when every difference is equal."""
    five = scores({"t": [100.0] * 5 + [0.0] * 47})  # a 0/100 score that flips on 5 of 52 samples
    zeros = scores({"t": [0.0] * 52})
    test = ps.sample_test(five, zeros, permutations=2000)
    assert test.differing == 5 and math.isnan(test.mde) and test.p_value > 0.05
    assert 2 / 2**5 > 0.05 > 2 / 2**6  # why 6 is the least that can reach 5%
    six = ps.sample_test(scores({"t": [100.0] * 6 + [0.0] * 46}), zeros, permutations=2000)
    assert six.differing == 6 and six.mde > 0
    constant = ps.sample_test(scores({"t": [1.0] * 10}), scores({"t": [0.0] * 10}), permutations=200)
    assert constant.differing == 10 and math.isnan(constant.mde)  # SD 0: no spread to measure power with
    assert ps.detectable(math.nan) == f"not estimable ({ps.NO_MDE_WHY})" and ps.detectable(0.25) == "0.25"

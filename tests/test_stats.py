"""polykv.eval.statistics.tasks: hand-checked values and properties of the run-comparison statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polykv.eval.statistics.tasks import (
    BootstrapResult,
    bootstrap_means,
    leave_one_task_out,
    paired_bootstrap,
    rank_among,
    spearman,
    spearman_permutation,
    wins_ties_losses,
)

A = {"gsm8k": 0.62, "hotpot": 0.41, "lcc": 0.55, "narrative": 0.23, "qasper": 0.37, "trec": 0.70}
B = {"gsm8k": 0.58, "hotpot": 0.43, "lcc": 0.49, "narrative": 0.20, "qasper": 0.31, "trec": 0.66}


# --- paired_bootstrap -------------------------------------------------------------------------------


def test_bootstrap_ci_contains_mean_difference():
    res = paired_bootstrap(A, B, replicates=2000, seed=1)
    assert isinstance(res, BootstrapResult)
    expected = np.mean([A[t] - B[t] for t in A])
    assert res.difference == pytest.approx(expected)
    assert res.low <= res.difference <= res.high
    assert res.low < res.high
    assert res.replicates == 2000
    assert res.tasks == tuple(sorted(A))
    assert 0.0 <= res.fraction_below_zero < 0.05  # a is better on 5 of 6 tasks
    assert res.level == 0.95


def test_bootstrap_identical_runs_zero_width():
    res = paired_bootstrap(A, dict(A), replicates=500)
    assert res.difference == 0.0
    assert res.low == 0.0 and res.high == 0.0
    assert res.fraction_below_zero == 1.0  # every replicate is <= 0


def test_bootstrap_deterministic_for_seed_and_insertion_order():
    r1 = paired_bootstrap(A, B, replicates=1000, seed=7)
    r2 = paired_bootstrap(dict(reversed(list(A.items()))), B, replicates=1000, seed=7)
    assert r1 == r2
    r3 = paired_bootstrap(A, B, replicates=1000, seed=8)
    assert (r3.low, r3.high) != (r1.low, r1.high)


def test_bootstrap_wider_level_gives_wider_interval():
    narrow = paired_bootstrap(A, B, replicates=2000, level=0.5)
    wide = paired_bootstrap(A, B, replicates=2000, level=0.99)
    assert wide.low <= narrow.low <= narrow.high <= wide.high


def test_bootstrap_uses_shared_tasks_and_reports_missing():
    a = {"x": 1.0, "y": 2.0, "only_a": 9.0}
    b = {"x": 0.0, "y": 1.0, "only_b": -9.0}
    res = paired_bootstrap(a, b, replicates=100)
    assert res.tasks == ("x", "y")
    assert res.difference == 1.0 and res.low == 1.0 and res.high == 1.0
    assert res.only_in_a == ("only_a",) and res.only_in_b == ("only_b",)


def test_bootstrap_no_shared_task_names_missing():
    with pytest.raises(ValueError, match=r"share no task.*'p'.*'q'"):
        paired_bootstrap({"p": 1.0}, {"q": 1.0})


@pytest.mark.parametrize("kwargs", [{"replicates": 0}, {"level": 1.0}, {"level": 0.0}])
def test_bootstrap_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        paired_bootstrap(A, B, **kwargs)


def test_bootstrap_rejects_nan_scores():
    with pytest.raises(ValueError, match="finite"):
        paired_bootstrap({"x": math.nan}, {"x": 1.0})


# --- cluster bootstrap (one task at several lengths moves together) --------------------------------


# Cluster "a" has two tasks with difference 1, cluster "b" one task with difference 10. Drawing two clusters
# gives aa -> (1 + 1 + 1 + 1) / 4 = 1, ab -> (1 + 1 + 10) / 3 = 4, bb -> (10 + 10) / 2 = 10: nothing else.
CLUSTER_A = {"a@1": 1.0, "a@2": 1.0, "b@1": 10.0}
CLUSTER_B = {"a@1": 0.0, "a@2": 0.0, "b@1": 0.0}
CLUSTERS = {"a@1": "a", "a@2": "a", "b@1": "b"}


def test_cluster_bootstrap_replicates_contain_only_whole_clusters():
    means = bootstrap_means(CLUSTER_A, CLUSTER_B, replicates=4000, seed=2, clusters=CLUSTERS)
    values, counts = np.unique(np.round(means, 12), return_counts=True)
    assert values.tolist() == [1.0, 4.0, 10.0]
    assert counts / 4000 == pytest.approx([0.25, 0.5, 0.25], abs=0.03)  # aa, ab or ba, bb
    # Task by task, 7 = (1 + 10 + 10) / 3 is possible too: the clusters really change the resampling.
    singles = np.unique(np.round(bootstrap_means(CLUSTER_A, CLUSTER_B, replicates=4000, seed=2), 12))
    assert singles.tolist() == [1.0, 4.0, 7.0, 10.0]


def test_cluster_bootstrap_result_counts_clusters_and_keeps_the_task_mean():
    res = paired_bootstrap(CLUSTER_A, CLUSTER_B, replicates=4000, seed=2, level=0.9, clusters=CLUSTERS)
    assert res.clusters == 2 and res.tasks == ("a@1", "a@2", "b@1")
    assert res.difference == pytest.approx(4.0)  # the plain mean over the 3 tasks
    assert (res.low, res.high) == (1.0, 10.0)  # 25% of the replicates sit at each end
    means = bootstrap_means(CLUSTER_A, CLUSTER_B, replicates=4000, seed=2, clusters=CLUSTERS)
    assert (res.low, res.high) == tuple(np.quantile(means, [0.05, 0.95]))
    assert paired_bootstrap(CLUSTER_A, CLUSTER_B, replicates=100).clusters == 0
    # a task the mapping does not name is a cluster of its own
    assert paired_bootstrap(CLUSTER_A, CLUSTER_B, replicates=100, clusters={"a@1": "a", "a@2": "a"}).clusters == 2


def test_bootstrap_means_match_paired_bootstrap_without_clusters():
    means = bootstrap_means(A, B, replicates=1000, seed=7)
    res = paired_bootstrap(A, B, replicates=1000, seed=7)
    assert (res.low, res.high) == tuple(np.quantile(means, [0.025, 0.975]))


# --- spearman ---------------------------------------------------------------------------------------


def test_spearman_hand_value():
    # d = (0, 1, 1, 0): 1 - 6 * 2 / (4 * 15) = 0.8
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)


def test_spearman_with_ties_hand_value():
    # ranks x = (1, 2.5, 2.5, 4), y = (1, 2, 3, 4); centred: (-1.5, 0, 0, 1.5) and (-1.5, -.5, .5, 1.5)
    # rho = 4.5 / sqrt(4.5 * 5) = sqrt(0.9)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(math.sqrt(0.9))
    # both sides tied: ranks (1.5, 1.5, 3, 4) and (1, 2.5, 2.5, 4); centred (-1, -1, .5, 1.5), (-1.5, 0, 0, 1.5)
    # rho = 3.75 / sqrt(4.5 * 4.5) = 5 / 6
    assert spearman([3, 3, 5, 9], [10, 20, 20, 30]) == pytest.approx(5 / 6)


def test_spearman_monotone_maps():
    x = np.array([0.3, -1.2, 4.0, 2.2, 0.0, 7.5, 1.1])
    assert spearman(x, np.exp(x)) == pytest.approx(1.0)
    assert spearman(x, x**3 + 10) == pytest.approx(1.0)
    assert spearman(x, -np.exp(x)) == pytest.approx(-1.0)


def test_spearman_constant_side_is_nan():
    assert math.isnan(spearman([1, 2, 3], [5, 5, 5]))
    assert math.isnan(spearman([2, 2], [1, 3]))
    rho, p = spearman_permutation([1, 2, 3], [4, 4, 4], permutations=10)
    assert math.isnan(rho) and math.isnan(p)


@pytest.mark.parametrize(("x", "y"), [([1, 2, 3], [1, 2]), ([1], [1]), ([1, math.nan], [1, 2]), ([[1, 2]], [[1, 2]])])
def test_spearman_rejects_bad_input(x, y):
    with pytest.raises(ValueError):
        spearman(x, y)


def test_spearman_permutation_zero_statistic_gives_p_one():
    # symmetric pattern: centred ranks (-2, -1, 0, 1, 2) and (-1.5, .5, 2, .5, -1.5) are orthogonal
    rho, p = spearman_permutation([1, 2, 3, 4, 5], [1, 2, 3, 2, 1], permutations=2000)
    assert rho == pytest.approx(0.0, abs=1e-12)
    assert p == pytest.approx(1.0)


def test_spearman_permutation_perfect_monotone_n10_is_small():
    x = np.arange(10.0)
    rho, p = spearman_permutation(x, x**2, permutations=5000, seed=3)
    assert rho == pytest.approx(1.0)
    assert 1 / 5001 <= p < 0.01
    rho, p = spearman_permutation(x, -x, permutations=5000, seed=3)
    assert rho == pytest.approx(-1.0)
    assert p < 0.01  # two-sided


def test_spearman_permutation_matches_spearman_and_is_deterministic():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=12), rng.normal(size=12)
    r1 = spearman_permutation(x, y, permutations=3000, seed=5)
    r2 = spearman_permutation(x, y, permutations=3000, seed=5)
    assert r1 == r2
    assert r1[0] == pytest.approx(spearman(x, y))
    assert 0.0 < r1[1] <= 1.0
    assert (r1[1] * 3001) == pytest.approx(round(r1[1] * 3001))  # (count + 1) / (permutations + 1)


def test_spearman_permutation_small_n_near_exact():
    # n = 4, x = y order except one swap: rho = 0.8; of the 24 permutations, those with |rho| >= 0.8 are
    # 1 (rho=1), 3 (rho=0.8), and their reverses: 8 of 24, so the exact p is 1/3.
    _, p = spearman_permutation([1, 2, 3, 4], [1, 3, 2, 4], permutations=20_000, seed=0)
    assert p == pytest.approx(1 / 3, abs=0.02)


def test_spearman_permutation_one_sided_small_n_near_exact():
    # The same case one-sided: rho_perm >= 0.8 for 1 + 3 of the 24 permutations, exact p = 1/6.
    rho, p = spearman_permutation([1, 2, 3, 4], [1, 3, 2, 4], permutations=20_000, seed=0, alternative="greater")
    assert rho == pytest.approx(0.8)
    assert p == pytest.approx(1 / 6, abs=0.015)
    assert (p * 20_001) == pytest.approx(round(p * 20_001))  # (1 + count) / (N + 1)


def test_spearman_permutation_one_sided_counts_only_the_upper_tail():
    # rho = -1: every shuffle has rho_perm >= -1, so the one-sided p is exactly (N + 1) / (N + 1) = 1 ...
    rho, p = spearman_permutation([1, 2, 3, 4], [4, 3, 2, 1], permutations=999, alternative="greater")
    assert rho == pytest.approx(-1.0) and p == 1.0
    # ... while two-sided it is small: |rho_perm| = 1 for 2 of the 24 permutations.
    _, p_two = spearman_permutation([1, 2, 3, 4], [4, 3, 2, 1], permutations=20_000)
    assert p_two == pytest.approx(2 / 24, abs=0.01)
    # rho = +1: one-sided 1/24, half the two-sided 2/24
    _, p_up = spearman_permutation([1, 2, 3, 4], [1, 2, 3, 4], permutations=20_000, alternative="greater")
    assert p_up == pytest.approx(1 / 24, abs=0.006)
    with pytest.raises(ValueError, match="alternative"):
        spearman_permutation([1, 2, 3], [1, 2, 3], alternative="less")


# --- leave_one_task_out -----------------------------------------------------------------------------


def test_leave_one_task_out_by_hand():
    a = {"t1": 0.9, "t2": 0.5, "t3": 0.4}
    b = {"t1": 0.6, "t2": 0.6, "t3": 0.2, "extra": 1.0}
    # d = (0.3, -0.1, 0.2)
    loto = leave_one_task_out(a, b)
    assert list(loto) == ["t1", "t2", "t3"]
    assert loto["t1"] == pytest.approx((-0.1 + 0.2) / 2)
    assert loto["t2"] == pytest.approx((0.3 + 0.2) / 2)
    assert loto["t3"] == pytest.approx((0.3 - 0.1) / 2)


def test_leave_one_task_out_needs_two_tasks():
    with pytest.raises(ValueError, match="at least 2"):
        leave_one_task_out({"t": 1.0}, {"t": 0.0})


# --- wins_ties_losses -------------------------------------------------------------------------------


def test_wins_ties_losses():
    a = {"t1": 0.9, "t2": 0.5, "t3": 0.4, "t4": 0.30, "only_a": 1.0}
    b = {"t1": 0.6, "t2": 0.6, "t3": 0.4, "t4": 0.29}
    assert wins_ties_losses(a, b) == (2, 1, 1)
    # d = (0.3, -0.1, 0, 0.01)
    assert wins_ties_losses(a, b, tolerance=0.05) == (1, 2, 1)
    assert wins_ties_losses(a, b, tolerance=0.15) == (1, 3, 0)
    assert wins_ties_losses(b, a, tolerance=0.15) == (0, 3, 1)
    with pytest.raises(ValueError):
        wins_ties_losses(a, b, tolerance=-0.1)


# --- rank_among -------------------------------------------------------------------------------------


def test_rank_among_by_hand():
    others = [0.1, 0.5, 0.3, 0.7, 0.2]
    assert rank_among(0.6, others) == (2, 2 / 6)
    assert rank_among(0.8, others) == (1, 1 / 6)
    assert rank_among(0.0, others) == (6, 1.0)
    # a tie counts against the value
    assert rank_among(0.5, others) == (3, 3 / 6)
    # lower is better
    assert rank_among(0.15, others, higher_is_better=False) == (2, 2 / 6)
    assert rank_among(0.05, others, higher_is_better=False) == (1, 1 / 6)


def test_rank_among_rejects_bad_input():
    with pytest.raises(ValueError):
        rank_among(0.5, [])
    with pytest.raises(ValueError):
        rank_among(math.nan, [0.1])

"""Statistics for comparing runs (model x plan x suite) by their per-task scores.

A run's scores are a mapping task -> score, higher is better unless a function says otherwise; a run's
headline number is the macro-average (the plain mean over tasks). Two runs are always compared on the
tasks both have, in sorted task order, so that results do not depend on the mappings' insertion order.

Every function is pure. The random ones take a `seed` and draw only from `numpy.random.default_rng(seed)`:
the same inputs and seed give the same result.

  paired_bootstrap      percentile CI of mean(a) - mean(b), resampling tasks (pairs) with replacement,
                        or whole clusters of tasks (e.g. one RULER task at several lengths)
  bootstrap_means       the replicate means behind paired_bootstrap's interval
  leave_one_task_out    mean(a) - mean(b) with each task left out in turn
  wins_ties_losses      per-task wins, ties and losses of a against b
  spearman              tie-aware Spearman correlation (NaN when a side is constant)
  spearman_permutation  Spearman with a Monte Carlo permutation p-value (two-sided or one-sided)
  rank_among            rank of one score among K control scores and its one-sided Monte Carlo p-value
  holm                  Holm's step-down adjustment of a family's p-values (family-wise error)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BootstrapResult",
    "bootstrap_means",
    "holm",
    "leave_one_task_out",
    "paired_bootstrap",
    "rank_among",
    "spearman",
    "spearman_permutation",
    "wins_ties_losses",
]

# |rho_perm| >= |rho_obs| - _RHO_TOL counts as "at least as extreme": a permutation that gives the same
# correlation may compute it with different rounding.
_RHO_TOL = 1e-12
# Permutations are drawn in blocks of about this many numbers (memory bound; the seed fixes the result).
_BLOCK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class BootstrapResult:
    """A task-paired bootstrap of the macro-average difference mean(a) - mean(b).

    difference           observed mean over `tasks` of a[t] - b[t]
    low, high            percentile interval of the bootstrap means at `level`
    replicates           number of bootstrap replicates
    tasks                the shared tasks used, sorted
    fraction_below_zero  share of replicates with a mean difference <= 0 (a one-sided, p-value-like
                         number for "a is better than b"; not an exact p-value)
    level                the interval's coverage
    only_in_a, only_in_b tasks that one run has and the other lacks (left out of everything above)
    clusters             how many clusters were resampled (0: tasks were resampled one by one)
    """

    difference: float
    low: float
    high: float
    replicates: int
    tasks: tuple[str, ...]
    fraction_below_zero: float
    level: float
    only_in_a: tuple[str, ...] = ()
    only_in_b: tuple[str, ...] = ()
    clusters: int = 0


def _finite(values: np.ndarray, what: str) -> np.ndarray:
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{what} must be finite numbers")
    return values


def _paired(
    a: Mapping[str, float], b: Mapping[str, float]
) -> tuple[tuple[str, ...], np.ndarray, tuple[str, ...], tuple[str, ...]]:
    """Shared tasks (sorted), the per-task differences a - b on them, and the tasks only in a / only in b."""
    shared = tuple(sorted(set(a) & set(b)))
    only_a = tuple(sorted(set(a) - set(b)))
    only_b = tuple(sorted(set(b) - set(a)))
    if not shared:
        raise ValueError(
            f"the runs share no task: only in a: {list(only_a) or 'none'}; only in b: {list(only_b) or 'none'}"
        )
    diffs = np.array([float(a[t]) - float(b[t]) for t in shared], dtype=float)
    _finite(np.array([float(a[t]) for t in shared] + [float(b[t]) for t in shared]), "scores")
    return shared, diffs, only_a, only_b


def _units(tasks: tuple[str, ...], d: np.ndarray, clusters: Mapping[str, str] | None) -> tuple[np.ndarray, np.ndarray]:
    """Per resampling unit (a task, or a cluster in sorted name order): the sum of d and the task count."""
    if clusters is None:
        return d, np.ones(len(d))
    names = [str(clusters.get(t, t)) for t in tasks]
    index = {name: i for i, name in enumerate(sorted(set(names)))}
    where = [index[n] for n in names]
    sums, counts = np.zeros(len(index)), np.zeros(len(index))
    np.add.at(sums, where, d)
    np.add.at(counts, where, 1.0)
    return sums, counts


def _replicate_means(
    d: np.ndarray, sums: np.ndarray, counts: np.ndarray, replicates: int, seed: int, by_cluster: bool
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    units = len(sums)
    means = np.empty(replicates, dtype=float)
    block = max(1, _BLOCK_ELEMENTS // units)
    for start in range(0, replicates, block):
        stop = min(replicates, start + block)
        idx = rng.integers(0, units, size=(stop - start, units))
        if by_cluster:
            means[start:stop] = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
        else:
            means[start:stop] = d[idx].mean(axis=1)
    return means


def bootstrap_means(
    a: Mapping[str, float],
    b: Mapping[str, float],
    replicates: int = 10_000,
    seed: int = 0,
    clusters: Mapping[str, str] | None = None,
) -> np.ndarray:
    """The `replicates` bootstrap replicate means of a - b that `paired_bootstrap` takes its interval from
    (same procedure, same seed, same numbers)."""
    if replicates < 1:
        raise ValueError(f"replicates must be >= 1, got {replicates}")
    tasks, d, _, _ = _paired(a, b)
    sums, counts = _units(tasks, d, clusters)
    return _replicate_means(d, sums, counts, replicates, seed, clusters is not None)


def paired_bootstrap(
    a: Mapping[str, float],
    b: Mapping[str, float],
    replicates: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
    clusters: Mapping[str, str] | None = None,
) -> BootstrapResult:
    """Task-paired percentile bootstrap CI of the macro-average difference mean(a) - mean(b).

    Procedure: take the n tasks both runs have (sorted; a ValueError naming the missing tasks if there are
    none) and d_t = a[t] - b[t]. Each replicate draws n task indices uniformly with replacement
    (`rng.integers`, rng = numpy.random.default_rng(seed)) and takes the mean of d over them. The interval
    is the (1 - level)/2 and (1 + level)/2 quantiles of the replicate means (numpy's default linear
    interpolation); `fraction_below_zero` is the share of replicate means <= 0.

    With `clusters` (task -> cluster name; a task it does not name is a cluster of its own) each
    replicate draws C cluster indices instead, C being the number of clusters among the shared tasks
    (clusters in sorted name order); every task of a drawn cluster enters together, and the replicate
    statistic is the mean of d over all the drawn tasks (a cluster drawn twice counts twice). Tasks that
    are not independent (the same task at several lengths) then move together, as they would in a new
    draw of tasks. `difference` is still the plain mean over the n tasks.
    """
    if replicates < 1:
        raise ValueError(f"replicates must be >= 1, got {replicates}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    tasks, d, only_a, only_b = _paired(a, b)
    sums, counts = _units(tasks, d, clusters)
    means = _replicate_means(d, sums, counts, replicates, seed, clusters is not None)
    low, high = np.quantile(means, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return BootstrapResult(
        difference=float(d.mean()),
        low=float(low),
        high=float(high),
        replicates=int(replicates),
        tasks=tasks,
        fraction_below_zero=float(np.mean(means <= 0.0)),
        level=float(level),
        only_in_a=only_a,
        only_in_b=only_b,
        clusters=0 if clusters is None else len(sums),
    )


def leave_one_task_out(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    """For each shared task t (sorted), the mean of a[s] - b[s] over the other shared tasks s != t.

    Needs at least two shared tasks (ValueError otherwise); tasks only one run has are ignored.
    """
    tasks, d, _, _ = _paired(a, b)
    n = len(d)
    if n < 2:
        raise ValueError(f"leave-one-task-out needs at least 2 shared tasks, got {n}: {list(tasks)}")
    total = float(d.sum())
    return {t: (total - float(d[i])) / (n - 1) for i, t in enumerate(tasks)}


def wins_ties_losses(a: Mapping[str, float], b: Mapping[str, float], tolerance: float = 0.0) -> tuple[int, int, int]:
    """Count shared tasks where a wins (a - b > tolerance), ties (|a - b| <= tolerance), loses (b - a > tolerance).

    Higher scores are better; `tolerance` must be >= 0; tasks only one run has are ignored.
    """
    if not tolerance >= 0.0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    _, d, _, _ = _paired(a, b)
    wins = int(np.sum(d > tolerance))
    losses = int(np.sum(d < -tolerance))
    return wins, len(d) - wins - losses, losses


def _as_vector(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {arr.shape}")
    return _finite(arr, what)


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n; tied values share the average of the ranks they span."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return (ends - (counts - 1) / 2.0)[inverse]


def _centred_ranks(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray] | None:
    """Centred average ranks of x and y, or None when a side is constant (correlation undefined)."""
    xa, ya = _as_vector(x, "x"), _as_vector(y, "y")
    if len(xa) != len(ya):
        raise ValueError(f"x and y must have the same length, got {len(xa)} and {len(ya)}")
    if len(xa) < 2:
        raise ValueError(f"Spearman needs at least 2 pairs, got {len(xa)}")
    if np.all(xa == xa[0]) or np.all(ya == ya[0]):
        return None
    rx, ry = _average_ranks(xa), _average_ranks(ya)
    return rx - rx.mean(), ry - ry.mean()


def _pearson_centred(cx: np.ndarray, cy: np.ndarray) -> float:
    rho = float(cx @ cy) / math.sqrt(float(cx @ cx) * float(cy @ cy))
    return min(1.0, max(-1.0, rho))


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Tie-aware Spearman correlation: the Pearson correlation of the average ranks of x and y.

    Returns NaN when x or y is constant (the correlation is undefined there). Raises ValueError for
    unequal lengths, fewer than 2 pairs, or non-finite values.
    """
    centred = _centred_ranks(x, y)
    if centred is None:
        return math.nan
    return _pearson_centred(*centred)


def spearman_permutation(
    x: Sequence[float],
    y: Sequence[float],
    permutations: int = 10_000,
    seed: int = 0,
    alternative: str = "two-sided",
) -> tuple[float, float]:
    """Spearman rho and its Monte Carlo permutation p-value.

    Procedure: rho_obs = spearman(x, y). Each of `permutations` draws shuffles y's ranks
    (`rng.permuted`, rng = numpy.random.default_rng(seed)) against x's fixed ranks and computes rho_perm.
    alternative="two-sided": p = (#{|rho_perm| >= |rho_obs|} + 1) / (permutations + 1);
    alternative="greater" (one-sided, "x and y rise together"): p = (#{rho_perm >= rho_obs} + 1) /
    (permutations + 1). ">=" allows 1e-12 of rounding. Returns (nan, nan) when x or y is constant.
    """
    if permutations < 1:
        raise ValueError(f"permutations must be >= 1, got {permutations}")
    if alternative not in ("two-sided", "greater"):
        raise ValueError(f"alternative must be 'two-sided' or 'greater', got {alternative!r}")
    centred = _centred_ranks(x, y)
    if centred is None:
        return math.nan, math.nan
    cx, cy = centred
    rho = _pearson_centred(cx, cy)
    # Shuffling y leaves its centred ranks' mean and norm unchanged: rho_perm = cx . perm(cy) / norm.
    norm = math.sqrt(float(cx @ cx) * float(cy @ cy))
    two_sided = alternative == "two-sided"
    threshold = (abs(rho) if two_sided else rho) - _RHO_TOL
    rng = np.random.default_rng(seed)
    n = len(cx)
    block = max(1, _BLOCK_ELEMENTS // n)
    extreme = 0
    for start in range(0, permutations, block):
        rows = min(block, permutations - start)
        shuffled = rng.permuted(np.broadcast_to(cy, (rows, n)), axis=1)
        perm = (shuffled @ cx) / norm
        extreme += int(np.sum((np.abs(perm) if two_sided else perm) >= threshold))
    return rho, (extreme + 1) / (permutations + 1)


def rank_among(value: float, others: Sequence[float], higher_is_better: bool = True) -> tuple[int, float]:
    """Rank of `value` among K control scores `others` (1 = best) and its one-sided Monte Carlo p-value.

    Ties count against `value` (conservative): with higher_is_better, rank = 1 + #{others >= value} and
    p = (1 + #{others >= value}) / (K + 1) = rank / (K + 1); with lower is better, ">=" becomes "<=".
    Raises ValueError for an empty `others` or non-finite scores.
    """
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"value must be finite, got {value}")
    arr = _as_vector(others, "others")
    if len(arr) == 0:
        raise ValueError("others must hold at least one control score")
    at_least_as_good = int(np.sum(arr >= v)) if higher_is_better else int(np.sum(arr <= v))
    rank = 1 + at_least_as_good
    return rank, rank / (len(arr) + 1)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the given order: the i-th smallest of m (i from 0) times m - i, never
    below an adjusted p of a smaller one, at most 1. A test rejects at family-wise level alpha when its adjusted
    p < alpha. Raises ValueError for a p outside [0, 1]."""
    values = [float(p) for p in p_values]
    if any(not 0.0 <= p <= 1.0 for p in values):
        raise ValueError(f"p-values must lie in [0, 1], got {values}")
    m = len(values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=values.__getitem__)):
        running = max(running, min(1.0, (m - rank) * values[i]))
        adjusted[i] = running
    return adjusted

"""Paired comparisons at the sample level, and how large a difference a comparison can detect.

The paper's interval resamples tasks (`stats.paired_bootstrap`): it asks whether a difference would hold on
other tasks. With few tasks, most of them tied, it says little, and a handful of flipped samples can make
it look significant. The tests here hold the tasks fixed and ask whether the difference is more than the
noise of the samples drawn within them: two runs scored the same samples, so each sample gives a paired
difference d = a - b.

The statistic is the one a report prints, the macro-average difference: the mean over tasks of each task's
mean paired difference (every task weighs the same, whatever its sample count).

  sign_flip_p         two-sided permutation p-value: under "no difference" each sample's d is as likely to
                      be -d. With at most EXACT_DIFFERING samples that differ (d != 0), every one of the 2^k
                      sign assignments of those k is enumerated: p = #{|T*| >= |T|} / 2^k, exact (16 samples
                      all one way: 2 / 2^16 = 3.1e-5). With more, every sign is flipped at random, N times:
                      p = (1 + #{|T*| >= |T|}) / (N + 1); the draws are seeded by the seed and the data, so two
                      contrasts never share their flips
  sign_flip_interval  the interval that agrees with the test: every shift delta of the differences that the
                      sign-flip test at level alpha does not reject (the test inverted); exact for up to
                      EXACT_DIFFERING paired samples, else from N random flips. It holds 0 when the test does not
                      reject, up to the Monte Carlo error when the p is exact (few samples differ) and the
                      interval is not (many samples paired): `SampleTest.agrees` says whether they agree
  macro_standard_error sqrt(sum_t s_t^2 / n_t) / T, s_t the standard deviation of task t's differences
  minimal_detectable_difference
                      (t_{df}(1 - alpha/2) + t_{df}(power)) x SE: the smallest true difference a two-sided
                      level-alpha test detects with probability `power` (normal approximation with a t
                      quantile; df = T - 1 for tasks)
  sample_mde          the same for the sign-flip test over samples (df = sum_t (n_t - 1)), its rejection bound
                      from the test's own null spread: larger than (t + t) x SE where the tasks' mean
                      differences vary, since the flips count that variation as noise
  samples_for         the samples per task that bring the minimal detectable difference down to a target
  sample_test         all of the above for two runs' per-sample scores

Every random function takes a `seed` and draws only from `numpy.random.default_rng` seeded with it (and, for the
sign flips, with the data).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from polykv.eval.statistics import render
from polykv.eval.statistics.render import format_p

# Per task, per sample id, a score: {task: {sample: value}}.
SampleScores = Mapping[str, Mapping[str, float]]

ALPHA, POWER = 0.05, 0.80
PERMUTATIONS = 10_000
EXACT_DIFFERING = 20  # up to this many differing samples the sign-flip test enumerates all 2^k assignments
_BLOCK_ELEMENTS = 1 << 21  # random signs / indices drawn in blocks of about this many numbers


@dataclass(frozen=True)
class SampleTest:
    """Two runs compared sample by sample (a - b, in the metric's own units)."""

    difference: float  # the macro-average of the per-task mean paired differences
    low: float  # the sign-flip test inverted at level alpha (`sign_flip_interval`)
    high: float
    p_value: float  # two-sided sign-flip permutation p (exact for up to EXACT_DIFFERING differing samples)
    mde: float  # minimal detectable |difference| at `power`, two-sided `alpha`
    samples: int  # paired samples
    differing: int  # paired samples whose difference is not 0
    tasks: int
    permutations: int
    alpha: float = ALPHA
    power: float = POWER

    def significant(self) -> bool:
        return self.p_value < self.alpha

    @property
    def exact(self) -> bool:
        """Is the p-value the exact enumeration (few differing samples) rather than a Monte Carlo estimate?"""
        return self.differing <= EXACT_DIFFERING

    @property
    def agrees(self) -> bool:
        """Does the interval exclude 0 exactly when the test rejects? (It may not when the p is exact and the
        interval comes from random flips, near the level.)"""
        tolerance = 1e-9 * max(1.0, abs(self.low), abs(self.high))  # a bound found by bisection, at 0 itself
        excludes = self.low > tolerance or self.high < -tolerance
        return excludes == self.significant()

    def describe(self) -> str:
        """The test in words, for a sentence that rests on it."""
        kind = "exact " if self.exact else ""
        return (
            f"{kind}sign-flip permutation test over {self.samples} paired samples in {self.tasks} tasks "
            f"({self.differing} differ), p = {format_p(self.p_value)}"
        )


def shares_samples(a: SampleScores, b: SampleScores) -> bool:
    """Do the two runs have a sample in common (a task and a sample key both have)?"""
    return any(set(a[task]) & set(b[task]) for task in set(a) & set(b))


def paired_differences(a: SampleScores, b: SampleScores) -> dict[str, np.ndarray]:
    """Per task both runs have, the differences a - b over the samples both have (sorted by task, then sample);
    a ValueError when they share no sample."""
    out = {}
    for task in sorted(set(a) & set(b)):
        shared = sorted(set(a[task]) & set(b[task]))
        if shared:
            out[task] = np.array([float(a[task][s]) - float(b[task][s]) for s in shared], dtype=float)
    if not out:
        raise ValueError("the runs share no sample")
    for task, d in out.items():
        if not np.all(np.isfinite(d)):
            raise ValueError(f"task {task}: sample scores must be finite numbers")
    return out


def macro_difference(diffs: Mapping[str, np.ndarray]) -> float:
    return float(np.mean([d.mean() for d in diffs.values()]))


def _weights(diffs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """All differences in one vector, each weighted 1 / (T n_t): their weighted sum is the macro difference."""
    count = len(diffs)
    values = np.concatenate([d for d in diffs.values()])
    weights = np.concatenate([np.full(len(d), 1.0 / (count * len(d))) for d in diffs.values()])
    return values, weights


def _rng(seed: int, *arrays: np.ndarray) -> np.random.Generator:
    """A generator seeded with `seed` and the data: the same data and seed draw the same flips, other data
    (another contrast) draw others. Seeded with magnitudes, so that A - B and B - A draw the same flips."""
    digest = hashlib.blake2b(digest_size=8)
    for array in arrays:
        digest.update(np.ascontiguousarray(array, dtype=float).tobytes())
    return np.random.default_rng([seed, int.from_bytes(digest.digest(), "little")])


def _all_signs(count: int):
    """Every one of the 2^count sign vectors (+1 / -1), in blocks of rows."""
    block = max(1, _BLOCK_ELEMENTS // max(1, count))
    bits = np.arange(count)
    for start in range(0, 2**count, block):
        rows = np.arange(start, min(2**count, start + block))
        yield ((rows[:, None] >> bits) & 1).astype(np.int8) * 2 - 1


def _random_signs(rng: np.random.Generator, count: int, permutations: int):
    block = max(1, _BLOCK_ELEMENTS // max(1, count))
    for start in range(0, permutations, block):
        yield rng.integers(0, 2, size=(min(block, permutations - start), count), dtype=np.int8) * 2 - 1


def sign_flip_p(diffs: Mapping[str, np.ndarray], permutations: int = PERMUTATIONS, seed: int = 0) -> float:
    """Two-sided sign-flip permutation p of the macro-average difference (module docstring): exact by
    enumeration when at most EXACT_DIFFERING samples differ, else from `permutations` random flips."""
    if permutations < 1:
        raise ValueError(f"permutations must be >= 1, got {permutations}")
    values, weights = _weights(diffs)
    weighted = values * weights
    observed = abs(float(weighted.sum()))
    # |T*| >= |T| allows rounding: a permutation that gives the same sum may add it in another order
    threshold = observed - 1e-12 * max(1.0, float(np.abs(weighted).sum()))
    nonzero = weighted[values != 0]  # a zero difference is the same whatever its sign
    if len(nonzero) <= EXACT_DIFFERING:
        extreme = sum(int(np.sum(np.abs(signs @ nonzero) >= threshold)) for signs in _all_signs(len(nonzero)))
        return extreme / 2 ** len(nonzero)
    rng = _rng(seed, np.abs(values), weights)
    extreme = sum(int(np.sum(np.abs(s @ weighted) >= threshold)) for s in _random_signs(rng, len(values), permutations))
    return (extreme + 1) / (permutations + 1)


def sign_flip_interval(
    diffs: Mapping[str, np.ndarray], permutations: int = PERMUTATIONS, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """The shifts delta that the sign-flip test of (d - delta) at level 1 - `level` does not reject (module
    docstring): the bounds where its p crosses the level, found by bisection on each side of the estimate."""
    values, weights = _weights(diffs)
    exact = len(values) <= EXACT_DIFFERING
    rng = _rng(seed, np.abs(values), weights)
    signs = _all_signs(len(values)) if exact else _random_signs(rng, len(values), permutations)
    flipped, totals = [], []
    for block in signs:  # each row's permuted statistic is A - delta B: linear in the shift
        flipped.append(block @ (values * weights))
        totals.append(block @ weights)
    a, b = np.concatenate(flipped), np.concatenate(totals)
    observed, total = float((values * weights).sum()), float(weights.sum())
    alpha = 1.0 - level
    scale = max(1.0, float(np.abs(values).max()))

    def p_at(delta: float) -> float:
        threshold = abs(observed - delta * total) - 1e-12 * scale
        extreme = int(np.sum(np.abs(a - delta * b) >= threshold))
        return extreme / len(a) if exact else (extreme + 1) / (len(a) + 1)

    estimate = observed / total

    def bound(direction: float) -> float:
        inside, reach = estimate, scale
        while p_at(estimate + direction * reach) >= alpha:  # far enough out to be rejected
            inside, reach = estimate + direction * reach, reach * 2
            if reach > 1e12 * scale:
                return math.inf * direction
        outside = estimate + direction * reach
        for _ in range(60):
            middle = (inside + outside) / 2
            if p_at(middle) >= alpha:
                inside = middle
            else:
                outside = middle
        return 0.0 if abs(inside) < 1e-9 * scale else inside  # a bound at 0 itself, not a rounding hair off it

    return bound(-1.0), bound(1.0)


def macro_standard_error(diffs: Mapping[str, np.ndarray]) -> float:
    """The standard error of the macro difference with the tasks fixed: sqrt(sum_t s_t^2 / n_t) / T (a task
    with one sample contributes no variance estimate: 0)."""
    variances = [float(np.var(d, ddof=1)) / len(d) if len(d) > 1 else 0.0 for d in diffs.values()]
    return math.sqrt(sum(variances)) / len(diffs)


def minimal_detectable_difference(
    standard_error: float, df: float, alpha: float = ALPHA, power: float = POWER
) -> float:
    """(t_df(1 - alpha/2) + t_df(power)) x SE; NaN without degrees of freedom."""
    from scipy.stats import t

    if not df >= 1 or not math.isfinite(standard_error):
        return math.nan
    return float((t.ppf(1.0 - alpha / 2.0, df) + t.ppf(power, df)) * standard_error)


def sample_mde(diffs: Mapping[str, np.ndarray], alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest shift delta of every paired difference that the sign-flip test at level `alpha` detects with
    probability `power`: delta = z(1 - alpha/2) x sqrt(S^2 + delta^2 V) + t(power) x SE.

    SE is the macro difference's sampling error with the tasks fixed (`macro_standard_error`). The test's rejection
    bound comes from its own null distribution, the flipped statistic, whose spread is S (each difference around the
    macro difference, weighted as the statistic weighs it: S^2 = sum w_i^2 (d_i - M)^2, w_i = 1 / (T n_t)) and grows
    with the shift itself (V = sum w_i^2). Where every task's mean difference is alike S is about SE and this is the
    usual (t + t) x SE; where they vary (one task strongly the other way) the flips take that variation for noise and
    the test detects less, which S says (tests/test_paired_samples.py checks the power by simulation, both ways)."""
    df = sum(len(d) - 1 for d in diffs.values())
    se = macro_standard_error(diffs)
    if not df >= 1 or not math.isfinite(se):
        return math.nan
    from scipy.stats import norm, t

    values, weights = _weights(diffs)
    spread = math.sqrt(float(np.sum(weights**2 * (values - macro_difference(diffs)) ** 2)))
    v = float(np.sum(weights**2))
    # the bound: a quantile of the flips' own (near normal) distribution; the push: the statistic's sampling error
    bound, push = float(norm.ppf(1.0 - alpha / 2.0)), float(t.ppf(power, df))
    shrink = 1.0 - bound**2 * v  # the flips' spread grows with the shift: with so few samples no shift is enough
    if shrink <= 0:
        return math.nan
    c = push * se  # (delta - c)^2 = bound^2 (S^2 + v delta^2), the root above c
    return (c + math.sqrt(bound**2 * v * c**2 + shrink * bound**2 * spread**2)) / shrink


def task_mde(task_differences: Sequence[float], alpha: float = ALPHA, power: float = POWER) -> float:
    """The minimal detectable difference of a test over T task-level differences (T - 1 degrees of freedom)."""
    d = np.asarray(task_differences, dtype=float)
    if len(d) < 2:
        return math.nan
    return minimal_detectable_difference(float(np.std(d, ddof=1)) / math.sqrt(len(d)), len(d) - 1, alpha, power)


def expected_mde(
    standard_deviations: Sequence[float], samples_per_task: int, alpha: float = ALPHA, power: float = POWER
) -> float:
    """The minimal detectable macro difference with `samples_per_task` samples in each task whose paired differences
    have these SDs (a test over all the samples: n - 1 degrees of freedom per task)."""
    sds = np.asarray(standard_deviations, dtype=float)
    count = len(sds)
    se = math.sqrt(float(np.sum(sds**2)) / samples_per_task) / count
    return minimal_detectable_difference(se, count * (samples_per_task - 1), alpha, power)


def samples_for(
    standard_deviations: Sequence[float], target: float, alpha: float = ALPHA, power: float = POWER, most: int = 100_000
) -> int:
    """The smallest n such that n samples in every task (per-task SDs of the paired differences as given)
    bring the minimal detectable macro difference down to `target`; `most` when even that does not."""
    if not target > 0:
        raise ValueError(f"the target difference must be positive, got {target}")

    def mde(n: int) -> float:
        return expected_mde(standard_deviations, n, alpha, power)

    if mde(most) > target:
        return most
    low, high = 2, most  # mde falls with n: the smallest n with mde(n) <= target
    while low < high:
        middle = (low + high) // 2
        if mde(middle) <= target:
            high = middle
        else:
            low = middle + 1
    return low


# With k samples differing, the sign-flip test's smallest two-sided p is 2 / 2^k: below 6 no difference can be
# significant at 5%, and so few non-zero differences (a 0/100 score flipping on a handful of samples) are far from
# the normal approximation the minimal detectable difference rests on. Then there is no MDE to state.
MIN_DIFFERING = 6
NO_MDE_WHY = f"fewer than {MIN_DIFFERING} samples differ, or their differences do not vary"


def detectable(mde: float | None, spec: str = ".3g", short: bool = False) -> str:
    """A sample-level minimal detectable difference as text: the number, or why there is none (`short`: "not
    estimable" alone, in a table cell whose note gives the reason)."""
    return render.detectable(mde, spec, "" if short else NO_MDE_WHY)


def sample_test(
    a: SampleScores,
    b: SampleScores,
    seed: int = 0,
    permutations: int = PERMUTATIONS,
    alpha: float = ALPHA,
    power: float = POWER,
) -> SampleTest:
    """a vs b sample by sample over the samples both have (module docstring)."""
    diffs = paired_differences(a, b)
    low, high = sign_flip_interval(diffs, permutations, seed, 1.0 - alpha)
    values = np.concatenate(list(diffs.values()))
    differing = int(np.count_nonzero(values))
    return SampleTest(
        difference=macro_difference(diffs),
        low=low,
        high=high,
        p_value=sign_flip_p(diffs, permutations, seed),
        mde=_estimable(sample_mde(diffs, alpha, power)) if differing >= MIN_DIFFERING else math.nan,
        samples=len(values),
        differing=differing,
        tasks=len(diffs),
        permutations=permutations,
        alpha=alpha,
        power=power,
    )


def _estimable(mde: float) -> float:
    return mde if mde > 0 else math.nan  # differences that never vary give SE 0: no power to speak of


__all__ = [
    "ALPHA",
    "EXACT_DIFFERING",
    "MIN_DIFFERING",
    "NO_MDE_WHY",
    "detectable",
    "expected_mde",
    "shares_samples",
    "PERMUTATIONS",
    "POWER",
    "SampleScores",
    "SampleTest",
    "macro_difference",
    "macro_standard_error",
    "minimal_detectable_difference",
    "paired_differences",
    "sample_mde",
    "sample_test",
    "samples_for",
    "sign_flip_interval",
    "sign_flip_p",
    "task_mde",
]

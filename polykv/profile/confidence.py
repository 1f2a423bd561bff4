"""How much to trust a profile: bootstrap intervals over the calibration sequences.

A profile cell (layer, scope, method) is a mean over the calibration sequences, so a small corpus gives
noisy cells and a route picked from them may be noise. We resample the sequences with replacement
(the same draw for every cell, so methods stay paired: each replicate is one alternative corpus) and
recompute every cell per replicate:
  cosine   the mean of the drawn sequences' cosines;
  dPPL     exp(mean NLL per token under the method) - exp(mean NLL per token under FullKV), both over
           the drawn sequences (each sequence's NLL is summed over its `continuation` tokens).
`cell_intervals` gives each cell's percentile 95% interval; `route_confidence` says, per layer, how
often TopRank's pick stays the best across replicates. Replicates are seeded: the same profile, seed
and count always give the same numbers.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from polykv.plan import Phase
from polykv.profile.profiler import compatible_methods
from polykv.profile.store import Profile, ProfileError
from polykv.routing import STATISTICS, toprank

REPLICATES = 1000
LEVEL = 0.95
# Below this median win frequency the route is mostly resampling noise.
NOISY_ROUTE = 0.6
NOISE_WARNING = "the route is mostly noise at this calibration size; add sequences"


def bootstrap_weights(num_sequences: int, replicates: int = REPLICATES, seed: int = 0) -> np.ndarray:
    """[replicates, num_sequences]: how many times each sequence is drawn in each replicate (n draws with
    replacement per replicate, from numpy's default generator seeded with `seed`)."""
    if num_sequences < 1 or replicates < 1:
        raise ValueError(f"a bootstrap needs at least one sequence and one replicate (got {num_sequences}, {replicates})")
    draws = np.random.default_rng(seed).integers(0, num_sequences, size=(replicates, num_sequences))
    weights = np.zeros((replicates, num_sequences))
    np.add.at(weights, (np.arange(replicates)[:, None], draws), 1.0)
    return weights


def _cell_matrix(sequences: pd.DataFrame, column: str, num_sequences: int) -> tuple[list[tuple], np.ndarray]:
    """The cells (layer, scope, method) in sorted order and their [cells, sequences] values of `column`."""
    wide = sequences.pivot_table(index=["layer", "scope", "method"], columns="sequence", values=column, aggfunc="first")
    wide = wide.reindex(columns=range(num_sequences))
    return [(int(l), str(s), str(m)) for l, s, m in wide.index], wide.to_numpy(dtype=float)


def replicate_values(
    sequences: pd.DataFrame, reference_nll, continuation: int, statistic: str, weights: np.ndarray
) -> tuple[list[tuple], np.ndarray]:
    """Every cell's `statistic` in every replicate: the cells (layer, scope, method) and [cells, replicates].

    `weights` [replicates, sequences] (from `bootstrap_weights`; a row of ones is the full sample)."""
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r} (known: {', '.join(STATISTICS)})")
    reference = np.asarray(reference_nll, dtype=float)
    n = len(reference)
    drawn = weights.sum(axis=1)  # n per replicate
    if statistic == "cosine":
        cells, values = _cell_matrix(sequences, "cosine", n)
        return cells, values @ weights.T / drawn
    cells, nll = _cell_matrix(sequences, "nll", n)
    reference_ppl = np.exp(weights @ reference / (drawn * continuation))
    return cells, np.exp(nll @ weights.T / (drawn * continuation)) - reference_ppl


def cell_intervals(
    sequences: pd.DataFrame, reference_nll, continuation: int, replicates: int = REPLICATES, seed: int = 0
) -> pd.DataFrame:
    """Per cell: layer, scope, method, cosine_low, cosine_high, dppl_low, dppl_high (percentile 95%
    bootstrap intervals over the calibration sequences; one draw of sequences shared by all cells)."""
    weights = bootstrap_weights(len(reference_nll), replicates, seed)
    tail = (1 - LEVEL) / 2
    out = None
    for statistic in STATISTICS:
        cells, values = replicate_values(sequences, reference_nll, continuation, statistic, weights)
        low, high = np.quantile(values, [tail, 1 - tail], axis=1)
        frame = pd.DataFrame(cells, columns=["layer", "scope", "method"])
        frame[f"{statistic}_low"], frame[f"{statistic}_high"] = low, high
        out = frame if out is None else out.merge(frame, on=["layer", "scope", "method"])
    return out


def _best(values: np.ndarray, sign: int) -> np.ndarray:
    """Index of the best row in each column of [methods, columns] under TopRank's rule: NaN is skipped,
    and a tie goes to the earlier row (rows in registry order); -1 where a column is all NaN."""
    valid = ~np.isnan(values)
    signed = np.where(valid, sign * values, -np.inf)
    best = np.argmax(signed, axis=0)  # the first of equal maxima
    # all valid values at -inf: TopRank keeps the first valid one, which argmax over -inf may miss
    stuck = np.isneginf(signed.max(axis=0, initial=-np.inf))
    best = np.where(stuck, np.argmax(valid, axis=0), best)
    return np.where(valid.any(axis=0), best, -1)


def route_confidence(
    profile: Profile, phase: Phase | str, statistic: str = "cosine", replicates: int = REPLICATES, seed: int = 0
) -> pd.DataFrame:
    """Per layer: layer, winner (TopRank's pick), runner_up (the best of the other methods), margin
    (winner minus runner-up in the statistic's better direction, >= 0), win_frequency (share of
    bootstrap replicates in which the winner is still the best of the phase's methods, ties as TopRank)."""
    phase = Phase(phase)
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r} (known: {', '.join(STATISTICS)})")
    if phase.value not in profile.metadata.get("scopes", []):
        raise ProfileError(f"profile {profile.key} has no {phase.value} measurements; profile that scope first")
    profile.check_current([phase])
    if profile.sequences is None or profile.reference is None:
        raise ProfileError(f"profile {profile.key} has no per-sequence values (sequences.csv); profile it again")
    sign = STATISTICS[statistic]
    winners = toprank(profile.table, phase, statistic, profile.num_layers)
    candidates = compatible_methods(phase)  # registry order, the order TopRank breaks ties in
    reference = profile.reference.sort_values("sequence")["nll"].to_numpy(dtype=float)
    rows = profile.sequences[profile.sequences["scope"] == phase.value]
    weights = bootstrap_weights(len(reference), replicates, seed)
    cells, values = replicate_values(rows, reference, int(profile.metadata["continuation"]), statistic, weights)
    where = {(layer, method): i for i, (layer, _, method) in enumerate(cells)}
    points = profile.table[profile.table["scope"] == phase.value].set_index(["layer", "method"])[statistic]
    out = []
    for layer, winner in enumerate(winners):
        stack = np.array([values[where[(layer, m)]] if (layer, m) in where else np.full(replicates, np.nan)
                          for m in candidates])
        win_frequency = float(np.mean(_best(stack, sign) == candidates.index(winner)))
        others = [m for m in candidates if m != winner]
        point = np.array([[points.get((layer, m), math.nan)] for m in others]).reshape(len(others), 1)
        pick = int(_best(point, sign)[0]) if others else -1
        runner_up = others[pick] if pick >= 0 else None
        margin = sign * (points[(layer, winner)] - points[(layer, runner_up)]) if runner_up else math.nan
        out.append({"layer": layer, "winner": winner, "runner_up": runner_up, "margin": float(margin),
                    "win_frequency": win_frequency})
    return pd.DataFrame(out, columns=["layer", "winner", "runner_up", "margin", "win_frequency"])


def is_noisy(confidence: pd.DataFrame) -> bool:
    """True when the median win frequency over layers is below NOISY_ROUTE."""
    return bool(confidence["win_frequency"].median() < NOISY_ROUTE)


def fullkv_perplexity(reference_nll, sources, continuation: int) -> dict[str, float]:
    """{source: FullKV perplexity of the continuations of that source's calibration sequences}, in the
    order sources first appear."""
    nll = np.asarray(reference_nll, dtype=float)
    sources = list(sources)
    if len(sources) != len(nll):
        raise ValueError(f"{len(sources)} sources for {len(nll)} sequences")
    return {
        source: float(math.exp(nll[[s == source for s in sources]].sum() / (sources.count(source) * continuation)))
        for source in dict.fromkeys(sources)
    }


__all__ = [
    "NOISE_WARNING",
    "NOISY_ROUTE",
    "bootstrap_weights",
    "cell_intervals",
    "fullkv_perplexity",
    "is_noisy",
    "replicate_values",
    "route_confidence",
]

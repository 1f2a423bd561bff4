"""How much to trust a route: how often TopRank's pick stays the best when the calibration sequences
are resampled (the bootstrap replicates of `polykv.profile.confidence`, one draw shared by all cells).

`route_confidence` gives, per layer, the winner, the runner-up, the margin between them and the winner's
win frequency over the replicates; `is_noisy` says when the median win frequency is below NOISY_ROUTE.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from polykv.methods import for_phase
from polykv.plan import Phase
from polykv.profile.confidence import REPLICATES, bootstrap_weights, replicate_values
from polykv.profile.store import STATISTICS, Profile, ProfileError
from polykv.routing.toprank import toprank

# Below this median win frequency the route is mostly resampling noise.
NOISY_ROUTE = 0.6
NOISE_WARNING = "the route is mostly noise at this calibration size; add sequences"


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
    meta = profile.meta
    if phase.value not in meta.scopes:
        raise ProfileError(f"profile {profile.key} has no {phase.value} measurements; profile that scope first")
    profile.check_current([phase])
    if profile.sequences is None or profile.reference is None:
        raise ProfileError(f"profile {profile.key} has no per-sequence values (sequences.csv); profile it again")
    sign = STATISTICS[statistic]
    winners = toprank(profile.table, phase, statistic, profile.num_layers)
    candidates = for_phase(phase)  # registry order, the order TopRank breaks ties in
    reference = profile.reference.sort_values("sequence")["nll"].to_numpy(dtype=float)
    rows = profile.sequences[profile.sequences["scope"] == phase.value]
    weights = bootstrap_weights(len(reference), replicates, seed)
    cells, values = replicate_values(rows, reference, meta.continuation, statistic, weights)
    where = {(layer, method): i for i, (layer, _, method) in enumerate(cells)}
    points = profile.table[profile.table["scope"] == phase.value].set_index(["layer", "method"])[statistic]
    out = []
    for layer, winner in enumerate(winners):
        stack = np.array(
            [values[where[(layer, m)]] if (layer, m) in where else np.full(replicates, np.nan) for m in candidates]
        )
        win_frequency = float(np.mean(_best(stack, sign) == candidates.index(winner)))
        others = [m for m in candidates if m != winner]
        point = np.array([[points.get((layer, m), math.nan)] for m in others]).reshape(len(others), 1)
        pick = int(_best(point, sign)[0]) if others else -1
        runner_up = others[pick] if pick >= 0 else None
        margin = sign * (points[(layer, winner)] - points[(layer, runner_up)]) if runner_up else math.nan
        out.append(
            {
                "layer": layer,
                "winner": winner,
                "runner_up": runner_up,
                "margin": float(margin),
                "win_frequency": win_frequency,
            }
        )
    return pd.DataFrame(out, columns=["layer", "winner", "runner_up", "margin", "win_frequency"])


def is_noisy(confidence: pd.DataFrame) -> bool:
    """True when the median win frequency over layers is below NOISY_ROUTE."""
    return bool(confidence["win_frequency"].median() < NOISY_ROUTE)


__all__ = ["NOISE_WARNING", "NOISY_ROUTE", "REPLICATES", "is_noisy", "route_confidence"]

"""How much to trust a route: how often TopRank's pick stays the best when the calibration sequences
are resampled (the bootstrap replicates of `polykv.profile.confidence`, one draw shared by all cells).

`route_confidence` gives, per layer, the winner, the runner-up, the margin between them and the winner's
win frequency over the replicates; `is_noisy` says when the median win frequency is below NOISY_ROUTE.
`ranked_cells` ranks the methods of each layer by a statistic (what a profile chart draws), TopRank's
pick marked.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from polykv.methods import for_phase
from polykv.plan import FULL, Phase
from polykv.profile.confidence import REPLICATES, bootstrap_weights, replicate_values
from polykv.profile.store import INTERVAL_COLUMNS, STATISTICS, Profile, ProfileError
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
    tokens, answer_tokens = profile.per_sequence_tokens()
    cells, values = replicate_values(rows, reference, tokens, statistic, weights, answer_tokens)
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


CELL_COLUMNS = ["layer", "method", "cosine", "dppl", *INTERVAL_COLUMNS, "rank", "winner"]


def ranked_cells(table: pd.DataFrame, phase: Phase | str, statistic: str = "cosine") -> pd.DataFrame:
    """The phase's cells of a profile table, FullKV (the reference) left out, one row per (layer, method)
    sorted by layer: CELL_COLUMNS, that is layer, method, cosine, dppl, the interval columns (NaN where
    the table has none), rank and winner.

    rank: 1 for the best value of `statistic` in the layer among the methods that run in the phase,
    equal values sharing the better rank; NaN for a NaN value or a method that cannot run in the phase.
    winner: True for TopRank's pick (`toprank`, which breaks a tie by registry order, so one winner per
    layer, always of rank 1). Methods come in registry order, then any the registry does not know."""
    phase = Phase(phase)
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r} (known: {', '.join(STATISTICS)})")
    candidates = for_phase(phase)
    rows = table[(table["scope"] == phase.value) & (table["method"] != FULL)].copy()
    if rows.empty:
        raise ValueError(f"the profile table has no {phase.value} rows")
    for column in INTERVAL_COLUMNS:
        if column not in rows.columns:
            rows[column] = math.nan  # profiles saved before intervals were kept
    order = {m: i for i, m in enumerate(candidates)}
    rows["_order"] = [order.get(m, len(order)) for m in rows["method"]]
    rows = rows.sort_values(["layer", "_order", "method"], kind="stable").reset_index(drop=True)
    # ranked on the signed value so 1 is the best whichever way the statistic points
    signed = (STATISTICS[statistic] * rows[statistic]).where(rows["method"].isin(candidates))
    rows["rank"] = signed.groupby(rows["layer"]).rank(method="min", ascending=False)
    winners = toprank(table, phase, statistic, int(rows["layer"].max()) + 1)
    rows["winner"] = [winners[layer] == method for layer, method in zip(rows["layer"], rows["method"])]
    return rows[CELL_COLUMNS]


FEW_SEQUENCES = 8  # below it, resampling the calibration sequences says little: high win frequencies mislead


def few_sequences_warning(count: int) -> str | None:
    """A warning when a profile has too few calibration sequences for its win frequencies to mean much (a
    bootstrap over 2 sequences has 3 distinct resamples: a route can win 100% of them by chance)."""
    if count >= FEW_SEQUENCES:
        return None
    return (
        f"only {count} calibration sequence(s): win frequencies from resampling so few are not evidence "
        f"(profile at least {FEW_SEQUENCES})"
    )


def is_noisy(confidence: pd.DataFrame) -> bool:
    """True when the median win frequency over layers is below NOISY_ROUTE."""
    return bool(confidence["win_frequency"].median() < NOISY_ROUTE)


__all__ = [
    "CELL_COLUMNS",
    "FEW_SEQUENCES",
    "NOISE_WARNING",
    "NOISY_ROUTE",
    "REPLICATES",
    "few_sequences_warning",
    "is_noisy",
    "ranked_cells",
    "route_confidence",
]

"""TopRank and the profile score of a route, read from an offline profile table.

An offline profile is a pandas DataFrame `table` with one row per (layer, scope, method) and columns
  layer   int    the layer l
  scope   str    "prefill" or "decode": the phase the method was applied in
  method  str    a registered method name (`full` rows are the reference: cosine 1, dppl 0)
  cosine  float  cosine between layer l's mean hidden state with the method applied at layer l only and
                 with FullKV (higher is better)
  dppl    float  perplexity change against FullKV (lower is better)

`toprank` picks, per layer, the method with the best statistic among the methods that run in the phase
(`polykv.methods.for_phase`: never `full`; ties go to the earlier method in the registry).
`route_score` is the profile score S(rho) = sum_l sign * (score(l, rho_l) - score(l, ref)), sign +1 for
cosine and -1 for dppl (`STATISTICS`): higher is better and the reference route scores 0. With `ref` the
route's majority method it is the paper's S(rho) of a placement (the sum over the layers given another
method of C(that method) - C(majority)), which the placement control uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from polykv.methods import for_phase
from polykv.plan import Phase
from polykv.profile.store import NO_ANSWER, STATISTICS

if TYPE_CHECKING:
    import pandas as pd

PROFILE_COLUMNS = ("layer", "scope", "method")


# ---- profile tables ------------------------------------------------------------------------------
def _phase(scope: Phase | str) -> Phase:
    try:
        return Phase(scope)
    except ValueError:
        raise ValueError(f"scope must be 'prefill' or 'decode' (a profile row's phase), got {scope!r}") from None


def _sign(statistic: str) -> int:
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r} (known: {', '.join(STATISTICS)})")
    return STATISTICS[statistic]


def _scores(table: pd.DataFrame, phase: Phase, statistic: str) -> dict[tuple[int, str], float]:
    """{(layer, method): statistic} for the rows of one phase; one row per (layer, method)."""
    missing = [c for c in (*PROFILE_COLUMNS, statistic) if c not in table.columns]
    if missing == ["danswer"]:
        raise ValueError(NO_ANSWER)
    if missing:
        has = ", ".join(map(str, table.columns))
        raise ValueError(f"profile table lacks column(s) {', '.join(missing)} (has: {has})")
    rows = table[table["scope"] == phase.value]
    out: dict[tuple[int, str], float] = {}
    for layer, method, value in zip(rows["layer"], rows["method"], rows[statistic]):
        key = (int(layer), str(method))
        if key in out:
            raise ValueError(f"profile table has more than one {phase.value} row for layer {key[0]}, method {key[1]!r}")
        out[key] = float(value)
    return out


def _layers_in(table: pd.DataFrame) -> int:
    if len(table) == 0:
        raise ValueError("the profile table is empty")
    return int(table["layer"].max()) + 1


# ---- routes --------------------------------------------------------------------------------------
def toprank(
    table: pd.DataFrame, scope: Phase | str, statistic: str = "cosine", num_layers: int | None = None
) -> list[str]:
    """Per layer, the method with the best statistic among the scope's registered, phase-compatible
    methods (never `full`). Ties go to the earlier method in the registry; NaN scores are skipped.

    `num_layers` defaults to the largest layer in the table plus one. A table cannot tell a method it
    never measured from one it skipped: check the profile first (`Profile.check_current`, which
    `plan_from_profile` and `route_confidence` call) so a missing or outdated method is refused."""
    sign = _sign(statistic)
    phase = _phase(scope)
    scores = _scores(table, phase, statistic)
    candidates = for_phase(phase)
    route = []
    for layer in range(_layers_in(table) if num_layers is None else num_layers):
        best: str | None = None
        best_value = -math.inf
        for method in candidates:  # registry order: only a strictly better score replaces the best
            value = scores.get((layer, method), math.nan)
            if not math.isnan(value) and (best is None or sign * value > best_value):
                best, best_value = method, sign * value
        if best is None:
            raise ValueError(
                f"toprank: layer {layer} has no {phase.value} row with a {statistic} score for a method that "
                f"supports the {phase.value} phase ({', '.join(candidates)})"
            )
        route.append(best)
    return route


def route_score(
    route: Sequence[str],
    table: pd.DataFrame,
    scope: Phase | str,
    statistic: str = "cosine",
    reference: str = "streamingllm",
) -> float:
    """Profile score S(rho) = sum_l sign * (score(l, rho_l) - score(l, reference)); higher is better."""
    sign = _sign(statistic)
    phase = _phase(scope)
    scores = _scores(table, phase, statistic)

    def score(layer: int, method: str) -> float:
        value = scores.get((layer, method), math.nan)
        if math.isnan(value):
            raise ValueError(
                f"route_score: the profile has no {phase.value} {statistic} for layer {layer}, method {method!r}"
            )
        return value

    return float(sum(sign * (score(layer, method) - score(layer, reference)) for layer, method in enumerate(route)))


__all__ = ["PROFILE_COLUMNS", "STATISTICS", "route_score", "toprank"]

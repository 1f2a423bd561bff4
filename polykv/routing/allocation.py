"""Capacity allocation: how a route's budget is split over the layers, and moving a plan to another budget.

`capacity` is what one layer keeps in one phase (retained tokens per KV head); the `budget` b is a
plan's average capacity, so a phase of L layers keeps L*b tokens per KV head in all. For a fixed route:
`allocate_uniform`, `allocate_entropy` (proportional to the per-layer entropy H_l) and `allocate_ppl`
(proportional to the PPL sensitivity S_l of `ppl_sensitivity`). All go through `split_total`: the
capacities sum exactly to L*b, respect the minimum, never give a layer with a larger score less, and do
not change when the scores are scaled by a positive constant. `scale_budget` moves a plan to another
budget, keeping its route and parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from polykv.methods import REGISTRY
from polykv.methods.shared import split_total
from polykv.plan import FULL, LayerPlan, Phase, PhaseAssignment, Plan, PlanError
from polykv.routing.toprank import _layers_in, _phase, _scores

if TYPE_CHECKING:
    import pandas as pd


# ---- capacity allocation -------------------------------------------------------------------------
def _total(num_layers: int, average: float) -> int:
    total = num_layers * average
    if total != int(total):
        raise ValueError(f"{num_layers} layers x average {average} = {total} is not a whole number of tokens")
    return int(total)


def _check_minimum(minimum: int) -> None:
    if minimum < 1:
        raise ValueError(f"minimum must be at least 1 (a capacity is a positive integer), got {minimum}")


def _split(weights: Sequence[float], average: float, minimum: int) -> list[int]:
    _check_minimum(minimum)
    weights = [float(w) for w in weights]
    bad = [i for i, w in enumerate(weights) if not math.isfinite(w)]
    if bad:
        raise ValueError(f"layer {bad[0]} has a non-finite allocation score ({weights[bad[0]]})")
    return split_total(weights, _total(len(weights), average), minimum=minimum)


def allocate_uniform(num_layers: int, average: float, minimum: int = 1) -> list[int]:
    """The same capacity b in every layer (a fractional b leaves layers one token apart); sums exactly
    to num_layers * average."""
    return _split([1.0] * num_layers, average, minimum)


def allocate_entropy(entropy: Sequence[float], average: float, minimum: int = 1) -> list[int]:
    """Capacities proportional to the per-layer entropy H_l; sum exactly len(entropy) * average."""
    return _split(entropy, average, minimum)


def ppl_sensitivity(table: pd.DataFrame, scope: Phase | str) -> list[float]:
    """S_l = max over the scope's methods r (not `full`) of dPPL_{l,r}, clipped at the 95th percentile
    over layers (numpy quantile, linear) so that one outlier layer does not take the whole budget."""
    phase = _phase(scope)
    scores = _scores(table, phase, "dppl")
    worst: dict[int, float] = {}
    for (layer, method), value in scores.items():
        if method != FULL and not math.isnan(value):
            worst[layer] = max(worst.get(layer, -math.inf), value)
    num_layers = _layers_in(table)
    missing = [layer for layer in range(num_layers) if layer not in worst]
    if missing:
        raise ValueError(f"ppl_sensitivity: layer {missing[0]} has no {phase.value} dppl row for an eviction method")
    sensitivity = np.array([worst[layer] for layer in range(num_layers)], dtype=float)
    return np.minimum(sensitivity, np.quantile(sensitivity, 0.95)).tolist()


def allocate_ppl(table: pd.DataFrame, scope: Phase | str, average: float, minimum: int = 1) -> list[int]:
    """Capacities proportional to `ppl_sensitivity` (negative sensitivities count as 0)."""
    return _split(ppl_sensitivity(table, scope), average, minimum)


def _split_with_floors(weights: Sequence[float], total: int, floors: Sequence[int]) -> list[int]:
    """`split_total` with a minimum per layer: layers that land under their floor are pinned there and
    the rest of the total is split again among the others."""
    if sum(floors) > total:
        raise ValueError(f"the layers' minimum capacities add up to {sum(floors)}, more than the total {total}")
    pinned: dict[int, int] = {}
    while True:
        free = [i for i in range(len(weights)) if i not in pinned]
        got = split_total(
            [weights[i] for i in free], total - sum(pinned.values()), minimum=min(floors[i] for i in free)
        )
        under = {i: floors[i] for i, g in zip(free, got) if g < floors[i]}
        if not under:
            placed = {**dict(zip(free, got)), **pinned}
            return [placed[i] for i in range(len(weights))]
        pinned.update(under)


def _below_capacity(method: str, params: dict) -> dict[str, int]:
    """The method's parameters that must stay under its capacity (windows, sinks), with these values."""
    cls = REGISTRY.get(method)
    if cls is None:
        raise ValueError(f"unknown method {method!r} (known: {', '.join(REGISTRY)})")
    given = cls.Params(**params)
    return {name: int(getattr(given, name)) for name in cls.below_capacity}


def window_floor(assignment: PhaseAssignment) -> int:
    """The least capacity the method runs at with these parameters: 1 + the largest parameter that must stay under
    the capacity (so windows and sinks still fit), or what the method says (`Method.least_capacity`)."""
    _below_capacity(assignment.method, assignment.params)  # an unknown method: one line
    cls = REGISTRY[assignment.method]
    return cls.least_capacity(cls.Params(**assignment.params))


def floor_words(method: str, params: dict) -> str:
    """What sets `window_floor` of a method with these parameters, in words, e.g. "its window (32)"."""
    values = _below_capacity(method, params)
    if not values:
        return "one token"
    name = max(values, key=lambda k: values[k])
    return f"its {name} ({values[name]})"


def scale_budget(
    plan: Plan,
    average: float,
    minimum: int | None = None,
    name: str | None = None,
    description: str | None = None,
) -> Plan:
    """The same route (methods and parameters) at another budget: average capacity `average` per layer.

    In each active phase the bounded layers' new capacities are proportional to the old ones and sum to
    (bounded layers) x average, which is num_layers x average when no layer of the phase is `full`;
    `full` layers stay full. `minimum` defaults per layer to 1 + the largest `below_capacity` parameter
    of the layer's method, so windows and sinks still fit. A native-allocation plan keeps one capacity in
    every layer (the average, rounded), since its method splits the phase's total at run time.

    `name` defaults to "<plan name>-b<average>" and `description` to the plan's with "Rescaled to
    average capacity <average>." appended (the plan designer keeps both as they were). A budget that is
    not positive is a PlanError."""
    if not average > 0:
        raise PlanError(f"the budget (average capacity per layer) must be positive (got {average})")
    if minimum is not None:
        _check_minimum(minimum)
    layers = [{phase: layer[phase] for phase in Phase} for layer in plan.layers]
    for phase in plan.scope.phases:
        written = {i: c for i, layer in enumerate(plan.layers) if (c := layer[phase].capacity) is not None}
        bounded = list(written)
        if not bounded:
            continue
        old = [plan.layers[i][phase] for i in bounded]
        floors = [minimum if minimum is not None else window_floor(a) for a in old]
        if plan.allocation != "fixed":  # one capacity everywhere: a run-time rule splits the total
            new = [max(max(floors), round(average))] * len(bounded)
        else:
            new = _split_with_floors([float(written[i]) for i in bounded], _total(len(bounded), average), floors)
        for i, a, capacity in zip(bounded, old, new):
            layers[i][phase] = a.model_copy(update={"capacity": capacity})
    return plan.with_layers(
        [LayerPlan(prefill=layer[Phase.PREFILL], decode=layer[Phase.DECODE]) for layer in layers],
        name=name or f"{plan.name}-b{average}",
        description=description
        if description is not None
        else (plan.description + " " if plan.description else "") + f"Rescaled to average capacity {average}.",
        provenance={
            "built_by": "scale_budget",
            "source": plan.name,
            "average": average,
            "minimum": minimum,
            "source_provenance": dict(plan.provenance),
        },
    )


__all__ = [
    "allocate_entropy",
    "allocate_ppl",
    "allocate_uniform",
    "ppl_sensitivity",
    "scale_budget",
    "window_floor",
]

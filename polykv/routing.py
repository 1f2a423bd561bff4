"""Routing: from an offline per-layer profile to a plan (which method where, with how many tokens).

An offline profile is a pandas DataFrame `table` with one row per (layer, scope, method) and columns
  layer   int    the layer l
  scope   str    "prefill" or "decode": the phase the method was applied in
  method  str    a registered method name (`full` rows are the reference: cosine 1, dppl 0)
  cosine  float  cosine between layer l's mean hidden state with the method applied at layer l only and
                 with FullKV (higher is better)
  dppl    float  perplexity change against FullKV (lower is better)
A separate per-layer list `entropy` (H_l) may drive the capacity split.

The pieces, each a small pure function:
  route       `toprank` picks, per layer, the method with the best statistic among the methods that
              support the phase (never `full`; ties go to the earlier method in the registry).
              `route_score` is the profile score S(rho) = sum_l sign * (score(l, rho_l) - score(l, ref)),
              sign +1 for cosine and -1 for dppl: higher is better and the reference route scores 0.
  capacity    for a fixed route and a total of L*b retained tokens per KV head: `allocate_uniform`,
              `allocate_entropy` (proportional to H_l) and `allocate_ppl` (proportional to the PPL
              sensitivity S_l of `ppl_sensitivity`). All go through `split_total`: the budgets sum
              exactly to L*b, respect the minimum, never give a layer with a larger score less, and do
              not change when the scores are scaled by a positive constant.
  plans       `plan_from_route` writes a route and its capacities as a `Plan`; `scale_budget` moves a
              plan to another average budget, keeping its route and parameters.
  controls    `sample_placements` draws random placements with the same method counts as a route (the
              "same methods, random layers" control for a routing result).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from polykv.methods import REGISTRY, validate_plan
from polykv.methods.base import split_total
from polykv.plan import FULL, LayerPlan, Phase, PhaseAssignment, Plan, Scope

if TYPE_CHECKING:
    import pandas as pd

# +1: higher is better; -1: lower is better.
STATISTICS: dict[str, int] = {"cosine": 1, "dppl": -1}
PROFILE_COLUMNS = ("layer", "scope", "method")
_ENUMERATE_LIMIT = 10_000  # placement spaces up to this size are enumerated rather than sampled


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


def _phase_methods(phase: Phase) -> list[str]:
    """Eviction methods (not `full`) that support the phase, in registry order."""
    return [name for name, cls in REGISTRY.items() if name != FULL and phase in cls.phases]


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
    candidates = _phase_methods(phase)
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


def window_floor(assignment: PhaseAssignment) -> int:
    """1 + the largest parameter that must stay under the capacity (so windows and sinks still fit)."""
    cls = REGISTRY.get(assignment.method)
    if cls is None:
        raise ValueError(f"unknown method {assignment.method!r} (known: {', '.join(REGISTRY)})")
    params = cls.Params(**assignment.params)
    return 1 + max((int(getattr(params, name)) for name in cls.below_capacity), default=0)


def scale_budget(plan: Plan, average: float, minimum: int | None = None, name: str | None = None) -> Plan:
    """The same route (methods and parameters) at another average budget.

    In each active phase the bounded layers' new capacities are proportional to the old ones and sum to
    (bounded layers) x average, which is num_layers x average when no layer of the phase is `full`;
    `full` layers stay full. `minimum` defaults per layer to 1 + the largest `below_capacity` parameter
    of the layer's method, so windows and sinks still fit. A native-allocation plan keeps one capacity in
    every layer (the average, rounded), since its method splits the phase's total at run time."""
    if minimum is not None:
        _check_minimum(minimum)
    layers = [{phase: layer[phase] for phase in Phase} for layer in plan.layers]
    for phase in plan.scope.phases:
        bounded = [i for i, layer in enumerate(plan.layers) if layer[phase].capacity is not None]
        if not bounded:
            continue
        old = [plan.layers[i][phase] for i in bounded]
        floors = [minimum if minimum is not None else window_floor(a) for a in old]
        if plan.allocation == "native":  # one capacity everywhere: the method's own rule splits the total
            new = [max(max(floors), round(average))] * len(bounded)
        else:
            new = _split_with_floors([float(a.capacity) for a in old], _total(len(bounded), average), floors)
        for i, a, capacity in zip(bounded, old, new):
            layers[i][phase] = a.model_copy(update={"capacity": capacity})
    return plan.with_layers(
        [LayerPlan(prefill=layer[Phase.PREFILL], decode=layer[Phase.DECODE]) for layer in layers],
        name=name or f"{plan.name}-b{average}",
        description=(plan.description + " " if plan.description else "") + f"Rescaled to average capacity {average}.",
        provenance={
            "built_by": "scale_budget",
            "source": plan.name,
            "average": average,
            "minimum": minimum,
            "source_provenance": dict(plan.provenance),
        },
    )


# ---- plans ---------------------------------------------------------------------------------------
def plan_from_route(
    prefill_route: Sequence[str] | None,
    decode_route: Sequence[str] | None,
    prefill_capacities: Sequence[int | None] | None,
    decode_capacities: Sequence[int | None] | None,
    scope: Scope | str,
    name: str,
    description: str = "",
    provenance: Mapping[str, Any] | None = None,
    params: Mapping[str, Mapping[str, Any]] | None = None,
) -> Plan:
    """A validated plan from per-layer routes and capacities of the active phase(s).

    The inactive phase runs `full` (its route and capacities are ignored and may be None); `full`
    layers get no capacity. `params` maps a method name to the parameters it gets wherever it runs."""
    scope = Scope(scope)
    given = {Phase.PREFILL: (prefill_route, prefill_capacities), Phase.DECODE: (decode_route, decode_capacities)}
    lengths = set()
    for phase in scope.phases:
        route, capacities = given[phase]
        if route is None or capacities is None:
            raise ValueError(f"scope {scope.value!r} needs a {phase.value} route and {phase.value} capacities")
        if len(route) != len(capacities):
            raise ValueError(f"the {phase.value} route has {len(route)} layers but {len(capacities)} capacities")
        lengths.add(len(route))
    if len(lengths) != 1:
        raise ValueError(f"the prefill and decode routes differ in length ({', '.join(map(str, sorted(lengths)))})")
    num_layers = lengths.pop()

    def assignment(method: str, capacity: int | None) -> dict[str, Any]:
        if method == FULL:
            return {"method": FULL}
        return {"method": method, "capacity": capacity, "params": dict((params or {}).get(method, {}))}

    plan = Plan.from_dict(
        {
            "name": name,
            "description": description,
            "scope": scope.value,
            "provenance": dict(provenance) if provenance is not None else {"built_by": "plan_from_route"},
            "layers": [
                {phase.value: assignment(given[phase][0][i], given[phase][1][i]) for phase in scope.phases}
                for i in range(num_layers)
            ],
        }
    )
    return validate_plan(plan, num_layers)


# ---- random placements ---------------------------------------------------------------------------
def _placements(counts: Counter[str]) -> int:
    """The multinomial coefficient: how many distinct orderings the method counts allow."""
    out = math.factorial(sum(counts.values()))
    for n in counts.values():
        out //= math.factorial(n)
    return out


def _all_placements(route: Sequence[str]) -> Iterator[tuple[str, ...]]:
    """Every distinct ordering of the route's methods, in lexicographic order."""
    counts = Counter(route)
    methods = sorted(counts)
    prefix: list[str] = []

    def extend() -> Iterator[tuple[str, ...]]:
        if len(prefix) == len(route):
            yield tuple(prefix)
            return
        for method in methods:
            if counts[method]:
                counts[method] -= 1
                prefix.append(method)
                yield from extend()
                prefix.pop()
                counts[method] += 1

    return extend()


def placement_count(route: Sequence[str]) -> int:
    """How many distinct placements with the route's method counts differ from the route itself."""
    return _placements(Counter(route)) - 1


def sample_placements(
    route: Sequence[str], k: int, seed: int = 0, exclude: Sequence[str] | None = None
) -> list[list[str]]:
    """k distinct random placements with exactly the route's method counts, none equal to `exclude`
    (default: the route itself). Deterministic for a seed."""
    if k < 0:
        raise ValueError(f"k must be non-negative, got {k}")
    route = list(route)
    counts = Counter(route)
    excluded = tuple(route if exclude is None else exclude)
    space = _placements(counts)
    available = space - (Counter(excluded) == counts)
    if k > available:
        mix = " + ".join(f"{n} {m}" for m, n in sorted(counts.items()))
        raise ValueError(
            f"asked for {k} placements but only {available} distinct placements of {mix} over {len(route)} layers "
            f"differ from the excluded one"
        )
    rng = random.Random(seed)
    if space <= max(_ENUMERATE_LIMIT, 2 * k):
        pool = [p for p in _all_placements(route) if p != excluded]
        return [list(p) for p in rng.sample(pool, k)]
    seen: set[tuple[str, ...]] = {excluded}
    out: list[list[str]] = []
    while len(out) < k:
        draw = route[:]
        rng.shuffle(draw)
        if tuple(draw) not in seen:
            seen.add(tuple(draw))
            out.append(draw)
    return out


__all__ = [
    "STATISTICS",
    "allocate_entropy",
    "allocate_ppl",
    "allocate_uniform",
    "placement_count",
    "plan_from_route",
    "ppl_sensitivity",
    "route_score",
    "sample_placements",
    "scale_budget",
    "toprank",
]

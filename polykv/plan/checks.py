"""Whether a plan fits a model and the known methods: every problem, one line each (`Plan.problems`).

Validation takes a catalog (name -> phases, params check) so that the dependency stays `methods -> plan`;
`MethodInfo` says what a catalog entry must offer."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from polykv.plan.cells import FULL, LayerPlan, Phase, PhaseAssignment, Scope

# The most layers a plan may have (today's deepest models have well under 1,000); checked before the layers
# are parsed, so an absurd plan is refused at once.
MAX_LAYERS = 4096


class MethodInfo(Protocol):
    """What validation needs to know about a method (the registry in `polykv.methods` provides it).

    `check(params, capacity)` lists the problems of a cell's parameters, one line each; it is called
    with a third argument, the model's context in tokens, only when that is known (so a catalog whose
    `check` takes two arguments still works without a context)."""

    phases: frozenset[Phase]

    def check(
        self, params: Mapping[str, Any], capacity: int | None, context_length: int | None = None
    ) -> list[str]: ...


def plan_problems(
    layers: Sequence[LayerPlan],
    scope: Scope,
    allocation: str,
    num_layers: int | None,
    catalog: Mapping[str, MethodInfo],
    context_length: int | None = None,
    within_context: bool = False,
    least: int | None = None,
) -> list[str]:
    """`Plan.problems` of a plan with these `layers`, `scope` and `allocation`; `least`: the fewest slots a run-time
    rule may give a layer (its cells are checked at that capacity too)."""
    if len(layers) > MAX_LAYERS:
        return [too_many_layers(len(layers))]
    if num_layers is not None and len(layers) != num_layers:
        return [f"layers: the plan has {len(layers)} layers but the model has {num_layers}"]
    found: list[str] = []
    active = set(scope.phases)
    checked: dict[tuple[str, str, int | None], list[str]] = {}  # identical cells are checked once
    for idx, layer in enumerate(layers):
        for phase in Phase:
            a = layer[phase]
            where = f"layer {idx}, {phase.value}"
            info = catalog.get(a.method)
            if info is None:
                found.append(f"{where}, method: unknown method {a.method!r} (known: {', '.join(sorted(catalog))})")
                continue
            if phase not in active and a.method != FULL:
                found.append(
                    f"{where}, method: the plan's scope is {scope.value!r}, so the {phase.value} phase "
                    f"must use 'full' (got {a.method!r})"
                )
                continue
            if phase not in info.phases:
                allowed = ", ".join(p.value for p in Phase if p in info.phases)
                why = getattr(info, "phase_refusal", "")  # why its rule does not extend to that phase, if it says
                found.append(
                    f"{where}, method: {a.method!r} does not support the {phase.value} phase (supported: {allowed})"
                    + (f": {why}" if why else "")
                )
                continue
            if a.method == FULL:
                if a.capacity is not None:
                    found.append(f"{where}, capacity: 'full' keeps every token; leave capacity out (got {a.capacity})")
            elif a.capacity is None:
                found.append(f"{where}, capacity: {a.method!r} needs a capacity (a positive integer)")
            if a.interval != 1 and phase is Phase.PREFILL:
                found.append(
                    f"{where}, interval: an eviction interval applies to the decode phase only (prefill "
                    f"evicts once, at the end of the prompt); leave it out or set 1 (got {a.interval})"
                )
            if within_context and context_length is not None:
                found.extend(f"{where}, {p}" for p in _over_context(a, context_length))
            key = (a.method, _params_key(a.params), a.capacity)
            if key not in checked:
                checked[key] = _check(info, a.params, a.capacity, context_length)
            found.extend(f"{where}, {p}" for p in checked[key])
    if allocation == "native":
        found.extend(_native_problems(layers, scope, catalog))
    elif allocation != "fixed":
        found.extend(_rule_problems(layers, scope, allocation, catalog, least))
    return found


def _rule_problems(
    layers: Sequence[LayerPlan], scope: Scope, rule: str, catalog: Mapping[str, Any], least: int | None
) -> list[str]:
    """A run-time rule splits each active phase's total over its layers, for any method: every layer needs a
    capacity, and its method must run at the least the rule may give it."""
    for phase in scope.phases:
        capacities = [c for c in (layer[phase].capacity for layer in layers) if c is not None]
        if len(capacities) == len(layers) and least is not None and sum(capacities) < least * len(layers):
            return [
                f"allocation: {rule!r} gives every layer at least its window ({least} slots): the {phase.value} "
                f"phase's total {sum(capacities)} is under {least} x {len(layers)} layers"
            ]
    for idx, layer in enumerate(layers):
        for phase in scope.phases:
            a = layer[phase]
            if a.capacity is None:
                return [f"allocation: {rule!r} splits each phase's total: layer {idx}, {phase.value} needs a capacity"]
            if a.method not in catalog:
                continue  # said above: an unknown method
            problems = [] if least is None else catalog[a.method].check(a.params, least)
            if problems:
                return [
                    f"allocation: {rule!r} may give a layer as few as {least} slots (its window), and at that "
                    f"capacity layer {idx}, {phase.value}: {problems[0]}"
                ]
    return []


def _native_problems(layers: Sequence[LayerPlan], scope: Scope, catalog: Mapping[str, MethodInfo]) -> list[str]:
    """Native allocation splits one total (L x the capacity) with one method's rule and one set of
    parameters: every layer of an active phase must run the same method, with the same capacity
    and the same parameters."""
    found = []
    for phase in scope.phases:
        used = sorted({layer[phase].method for layer in layers})
        if len(used) != 1 or not getattr(catalog.get(used[0]), "native_allocation", False):
            rule = ", ".join(sorted(n for n, m in catalog.items() if getattr(m, "native_allocation", False)))
            found.append(
                f"allocation: 'native' needs one method with its own layer-budget rule ({rule}) in every "
                f"layer of the {phase.value} phase (got {', '.join(used)})"
            )
            continue
        # Parameters are compared with the method's defaults filled in ({} is {"window": 8} for PyramidKV).
        defaults = dict(getattr(catalog[used[0]], "defaults", dict)())
        first = layers[0][phase]
        for idx, layer in enumerate(layers[1:], start=1):
            a = layer[phase]
            if a.capacity != first.capacity:
                what, mine, theirs = "capacity", str(a.capacity), str(first.capacity)
            elif a.params != first.params and {**defaults, **a.params} != {**defaults, **first.params}:
                what, mine, theirs = "params", _params_text(a.params), _params_text(first.params)
            else:
                continue
            found.append(
                f"allocation: 'native' splits one total with one rule: layer {idx}, {phase.value} has {what} "
                f"{mine} but layer 0 has {what} {theirs} (give every layer the same capacity and params, "
                f"or use allocation 'fixed')"
            )
            break
    return found


def too_many_layers(count: int) -> str:
    return f"layers: a plan has at most {MAX_LAYERS:,} layers (got {count:,})"


def _check(info: MethodInfo, params: Mapping[str, Any], capacity: int | None, context_length: int | None) -> list[str]:
    if context_length is None:
        return list(info.check(params, capacity))
    return list(info.check(params, capacity, context_length))


def _over_context(a: PhaseAssignment, context_length: int) -> list[str]:
    """A capacity or an interval longer than the model's context: such a layer never evicts, and its
    slots are memory held for tokens that cannot come."""
    return [
        f"{name}: {value} is more than the model's context ({context_length} tokens)"
        for name, value in (("capacity", a.capacity), ("interval", a.interval))
        if value is not None and value > context_length
    ]


def _params_key(params: Mapping[str, Any]) -> str:
    """A hashable key for a cell's parameters (type-exact: True and 1 differ)."""
    return repr(sorted(((k, type(v).__name__, repr(v)) for k, v in params.items()), key=lambda kv: str(kv[0])))


def _params_text(params: Mapping[str, Any]) -> str:
    return json.dumps(dict(params), sort_keys=True, default=repr)[:120]

"""Painting a method and/or a capacity onto chosen layers and phases (`paint`), the rest of the plan kept."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from polykv.methods import REGISTRY, params_that_fit, validate_plan
from polykv.plan import FULL, Phase, Plan, PlanError, Scope
from polykv.plan_edits.choices import _phases, _phases_text
from polykv.plan_edits.edit_history import record_edit

DEFAULT_CAPACITY = 64  # what a layer gets when a bounded method is painted on a `full` cell without a capacity


def _scope_of(layers: list[dict[str, dict[str, Any]]], fallback: Scope) -> Scope:
    """The phases in which some layer evicts; a plan that evicts nowhere keeps its old scope."""
    active = [p for p in Phase if any(layer[p.value]["method"] != FULL for layer in layers)]
    if len(active) == 2:
        return Scope.BOTH
    return Scope(active[0].value) if active else fallback


def _rebuild(plan: Plan, layers: list[dict[str, dict[str, Any]]], **changes: Any) -> Plan:
    data = plan.to_dict()
    data.update(layers=layers, scope=_scope_of(layers, plan.scope).value, **changes)
    if data.get("allocation") != "cake":
        data.pop("allocation_params", None)  # a rule's parameters leave with the rule
    return validate_plan(Plan.from_dict(data), plan.num_layers)


def _layer_dicts(plan: Plan) -> list[dict[str, dict[str, Any]]]:
    return [{p.value: layer[p].model_dump() for p in Phase} for layer in plan.layers]


def paint(
    plan: Plan,
    layers: Sequence[int],
    phases: Phase | str | Iterable[Phase | str],
    method: str | None = None,
    capacity: int | None = None,
) -> Plan:
    """`method` and/or `capacity` on `layers` in `phases`; the rest of the plan stays as it was.

    A new method gets its default parameters, with windows and sinks shrunk to fit the capacity (as in
    profiles); painting `full` removes the capacity. Painted capacities are explicit, so the plan's
    allocation becomes "fixed". The scope follows the phases in which some layer evicts."""
    if method is None and capacity is None:
        raise PlanError("paint: choose a method, a capacity, or both")
    if method is not None and method not in REGISTRY:
        raise PlanError(f"paint: unknown method {method!r} (known: {', '.join(REGISTRY)})")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
        raise PlanError(f"paint: capacity must be a positive integer (got {capacity!r})")
    bad = [i for i in layers if not 0 <= i < plan.num_layers]
    if bad:
        raise PlanError(f"paint: layer {bad[0]} does not exist (the plan has layers 0-{plan.num_layers - 1})")
    if not layers:
        raise PlanError("paint: select at least one layer")
    summary = f"painted {_what(method, capacity)} onto layers {', '.join(map(str, layers))} ({_phases_text(phases)})"
    phases = _phases(phases)
    new = _layer_dicts(plan)
    average = {p: plan.summary().phases[p].average_capacity for p in Phase}
    for i in layers:
        for phase in phases:
            cell = new[i][phase.value]
            name = method or cell["method"]
            if name == FULL:
                new[i][phase.value] = {"method": FULL, "capacity": None, "params": {}}
                continue
            if phase not in REGISTRY[name].phases:
                allowed = ", ".join(p.value for p in REGISTRY[name].phases)
                why = f": {REGISTRY[name].phase_refusal}" if REGISTRY[name].phase_refusal else ""
                raise PlanError(f"paint: {name!r} does not run in the {phase.value} phase (it runs in: {allowed}){why}")
            cap = capacity or cell["capacity"] or round(average[phase] or DEFAULT_CAPACITY)
            params = cell["params"] if name == cell["method"] else params_that_fit(name, cap)
            new[i][phase.value] = {"method": name, "capacity": cap, "params": params}
    return record_edit(plan, _rebuild(plan, new, allocation="fixed"), summary)


def _what(method: str | None, capacity: int | None) -> str:
    """ "h2o@40", "h2o" or "@40": what a paint put on the layers."""
    return f"{method or ''}{'' if capacity is None else f'@{capacity}'}"

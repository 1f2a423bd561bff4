"""How each method runs as a standalone baseline: one table, read by every experiment.

A baseline in a comparison is a method alone in every layer, run the way its authors (or the paper's
sweep) run it, not squeezed into the phase of the route it is compared with. Each method class declares
its row (`standalone`, `standalone_source`, `native_allocation`); each row says

  scope       the phases the method is active in (the other phase keeps every token)
  allocation  "native" when the method brings its own rule for splitting the budget over layers
              (PyramidKV, CAKE, D2O: the `native_allocation` flag of the method class), else "fixed"
              (the same capacity in every layer)
  params      parameters that differ from the method's defaults under this protocol (none today);
              windows and sinks that would not fit under a small budget shrink to a quarter of it
              (`polykv.methods.params_that_fit`)
  source      a short note of where the rule comes from

The rows are listed in the README's method table and by `polykv experiment sweep`'s report.

Per-method overrides (the CLI's `--protocol tova=decode`) change a row's scope, only to a scope the
method can run in; `parse_overrides` reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from polykv.methods import REGISTRY, params_that_fit
from polykv.plan import FULL, Phase, Plan, Scope


@dataclass(frozen=True)
class MethodProtocol:
    """One method's standalone protocol (see the module docstring)."""

    method: str
    scope: Scope
    allocation: str  # "native" | "fixed"
    params: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def _standalone_scope(cls) -> Scope:
    phases = cls.standalone or cls.phases
    return Scope.BOTH if len(phases) == 2 else Scope(next(iter(phases)).value)


# One row per registered method but `full`, from what each method class declares (`standalone`,
# `standalone_source`, `native_allocation`): adding a method adds its row.
PROTOCOLS: dict[str, MethodProtocol] = {
    name: MethodProtocol(
        name, _standalone_scope(cls), "native" if cls.native_allocation else "fixed", {}, cls.standalone_source
    )
    for name, cls in REGISTRY.items()
    if name != FULL
}


def baseline_methods() -> list[str]:
    """Every method with a standalone protocol, in registry order (all registered methods but `full`)."""
    return [name for name in REGISTRY if name in PROTOCOLS]


def _can_run(method: str, scope: Scope) -> bool:
    return all(phase in REGISTRY[method].phases for phase in scope.phases)


def _phases_text(method: str) -> str:
    return ", ".join(p.value for p in sorted(REGISTRY[method].phases, key=lambda p: p.value != "prefill"))


def protocol(method: str, overrides: Mapping[str, Scope | str] | None = None) -> MethodProtocol:
    """The method's protocol row, with its scope replaced when `overrides` names the method."""
    if method == FULL:
        raise ValueError("full keeps every token: it is the reference, not a baseline with a protocol")
    if method not in PROTOCOLS:
        raise ValueError(f"unknown method {method!r} (methods with a protocol: {', '.join(baseline_methods())})")
    row = PROTOCOLS[method]
    if overrides and method in overrides:
        scope = _scope(overrides[method], method)
        if scope is not row.scope:
            row = replace(row, scope=scope, source=f"{row.source}; scope overridden to {scope.value}")
    return row


def _scope(value: Scope | str, method: str) -> Scope:
    try:
        scope = Scope(value)
    except ValueError:
        raise ValueError(f"protocol {method}={value}: the scope must be prefill, decode or both") from None
    if not _can_run(method, scope):
        raise ValueError(f"protocol {method}={scope.value}: {method} runs only in {_phases_text(method)}")
    return scope


def baseline_plan(
    method: str,
    budget: int,
    num_layers: int,
    overrides: Mapping[str, Scope | str] | None = None,
    phase_budgets: Mapping[Phase, int] | None = None,
) -> Plan:
    """The method alone in every layer at average capacity `budget`, under its protocol: its phases,
    its allocation (native: the method splits L x budget itself) and its parameters (defaults with
    windows shrunk to fit, then the protocol's own parameters). `phase_budgets`: a phase's own average capacity
    where the plan compared with keeps different budgets in prefill and decode (like with like, phase by phase)."""
    row = protocol(method, overrides)
    given = {phase: (phase_budgets or {}).get(phase, budget) for phase in row.scope.phases}
    least = min(given.values())
    params = {**params_that_fit(method, least), **row.params}
    plan = Plan.homogeneous(method, budget, num_layers, row.scope, params, allocation=row.allocation)
    if len(set(given.values())) == 1 and least == budget:
        return plan
    cell = lambda phase: {"method": method, "capacity": given[phase], "params": params}  # noqa: E731
    layers = [{phase.value: cell(phase) for phase in row.scope.phases}] * num_layers
    budgets = "/".join(str(given[phase]) for phase in row.scope.phases)
    return Plan.from_dict(
        plan.to_dict()
        | {
            "name": f"{method}-{row.scope.value}{budgets}{'' if row.allocation == 'fixed' else '-' + row.allocation}",
            "description": f"Homogeneous {method} in every layer, "
            + ", ".join(f"{phase.value} capacity {given[phase]}" for phase in row.scope.phases)
            + " (the compared plan's own budget per phase).",
            "layers": layers,
        }
    )


def homogeneous_plans(
    scope: Scope | str, budget: int, num_layers: int, params: Mapping[str, Mapping] | None = None
) -> list[Plan]:
    """One method in every layer of the scope's phases at capacity `budget`, for every method that runs in all of
    them: fixed allocation, and native allocation too for those with their own layer rule. Parameters: `params`
    (a profile's) or the defaults, fitted to the budget; a method whose parameters cannot fit is left out. The
    comparators of like with like: the same scope as a route of that scope."""
    from polykv.methods import fit_params, for_phase, validate_plan
    from polykv.plan import PlanError

    scope = Scope(scope)
    methods = [m for m in for_phase(scope.phases[0]) if all(m in for_phase(p) for p in scope.phases)]
    out = []
    for method in methods:
        kinds = ("fixed", "native") if REGISTRY[method].native_allocation else ("fixed",)
        for allocation in kinds:
            given = (params or {}).get(method, {})
            plan = Plan.homogeneous(
                method, budget, num_layers, scope, fit_params(method, given, budget), allocation=allocation
            )
            try:
                out.append(validate_plan(plan, num_layers))
            except PlanError:
                continue  # a parameter that cannot fit this budget
    return out


def _params_text(row: MethodProtocol) -> str:
    values = {**REGISTRY[row.method].defaults(), **row.params}
    if not values:
        return "no parameters"
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    shrink = REGISTRY[row.method].below_capacity
    note = f" ({', '.join(shrink)} shrunk to a quarter of the budget when it does not fit)" if shrink else ""
    return f"{'defaults ' if not row.params else ''}{shown}{note}"


def protocol_lines(methods: Iterable[str], overrides: Mapping[str, Scope | str] | None = None) -> list[str]:
    """One line per method: its phases, allocation and parameters, and where the rule comes from."""
    out = []
    for method in methods:
        row = protocol(method, overrides)
        phases = " + ".join(p.value for p in row.scope.phases)
        other = (
            ""
            if row.scope is Scope.BOTH
            else f" ({'decode' if row.scope is Scope.PREFILL else 'prefill'} keeps every token)"
        )
        out.append(
            f"protocol {method}: {phases}{other}, {row.allocation} allocation, {_params_text(row)}; {row.source}"
        )
    return out


def parse_overrides(items: Sequence[str] | None) -> dict[str, Scope]:
    """`["tova=decode", "cake=prefill"]` -> {"tova": Scope.DECODE, "cake": Scope.PREFILL}.

    Each item is METHOD=SCOPE with a method that has a protocol and a scope it can run in; a method
    named twice with different scopes is refused. One-line ValueError for anything else."""
    out: dict[str, Scope] = {}
    for item in items or ():
        method, sep, value = (part.strip() for part in str(item).partition("="))
        if not sep or not method or not value:
            raise ValueError(f"--protocol {item!r}: expected METHOD=SCOPE, e.g. tova=decode")
        protocol(method)  # unknown method or full
        scope = _scope(value, method)
        if out.get(method, scope) is not scope:
            raise ValueError(f"--protocol names {method} twice ({out[method].value} and {scope.value})")
        out[method] = scope
    return out


__all__ = [
    "PROTOCOLS",
    "MethodProtocol",
    "baseline_methods",
    "baseline_plan",
    "parse_overrides",
    "protocol",
    "protocol_lines",
]

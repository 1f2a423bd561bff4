"""A new whole plan from the designer's: rescaled to another budget (`rescale`, from `current_budget`), its budget
split by an allocation rule for whatever methods it runs (`split_by_rule`, previewed by `rule_preview`), reset to
full (`reset_to_full`), or built from a profile (`build_from_profile`, for the scopes of `profile_scopes`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from polykv.errors import first_line
from polykv.plan import FULL, Plan, PlanError, Scope
from polykv.plan_edits.edit_history import record_edit
from polykv.plan_edits.painting import DEFAULT_CAPACITY

if TYPE_CHECKING:
    from polykv.profile.store import Profile


def current_budget(plan: Plan) -> float:
    """The plan's budget to start a rescale from: the average capacity of its first active phase that
    has one, else `DEFAULT_CAPACITY`."""
    summary = plan.summary().phases
    return next(
        (summary[p].average_capacity for p in plan.scope.phases if summary[p].average_capacity), float(DEFAULT_CAPACITY)
    )


def rescale(plan: Plan, budget: float) -> Plan:
    """The same plan (route, name and description) at another budget (average capacity per layer);
    PlanError with one line when it cannot be (a budget too small for the layers' windows, ...)."""
    from polykv.routing import scale_budget

    try:
        scaled = scale_budget(plan, budget, name=plan.name, description=plan.description)
    except ValueError as exc:  # a PlanError, or a budget too small for the layers' windows
        raise PlanError(f"rescale to budget {budget:g}: {first_line(exc)}") from None
    return record_edit(plan, scaled, f"rescaled to budget {budget:g}")


# The designer's allocation rules: static ones written as capacities, and CAKE's, decided at run time
RULE_CHOICES = ("uniform", "pyramid", "cake")


def _ruled(plan: Plan, rule: str, budget: float, windows) -> Plan:
    from polykv.routing import scale_budget
    from polykv.routing.rules import apply_rule

    if rule not in RULE_CHOICES:
        raise PlanError(f"unknown rule {rule!r} (the designer's: {', '.join(RULE_CHOICES)})")
    from polykv.methods import validate_plan

    try:
        fixed = plan if plan.allocation == "fixed" else plan.model_copy(update={"allocation": "fixed"})
        scaled = scale_budget(fixed, budget, name=plan.name, description=plan.description)
        if rule == "cake":
            ruled = scaled.model_copy(update={"allocation": "cake", "allocation_params": {}})
        else:
            ruled = apply_rule(scaled, rule, windows=windows).model_copy(update={"name": plan.name})
        return validate_plan(ruled, plan.num_layers)
    except ValueError as exc:  # a PlanError, or a budget too small for the layers' windows
        raise PlanError(f"split by the {rule} rule at budget {budget:g}: {first_line(exc)}") from None


def rule_preview(plan: Plan, rule: str, budget: float, windows=None) -> dict[str, list[int] | None]:
    """Per active phase, the capacities `split_by_rule` would write (None for CAKE's: its split comes from each
    prompt's attention at run time); PlanError with one line when the rule cannot split this plan."""
    ruled = _ruled(plan, rule, budget, windows)
    return {
        phase.value: None if rule == "cake" else [layer[phase].capacity for layer in ruled.layers]
        for phase in ruled.scope.phases
    }


def split_by_rule(plan: Plan, rule: str, budget: float, windows=None) -> Plan:
    """The plan's route at budget `budget` (average capacity per layer), each active phase's total split over the
    layers by `rule` (`polykv.routing.rules`; "cake": at run time, `polykv.runtime.layer_budgets`); a local layer
    (`windows`) never given more than its window less one. PlanError with one line when it cannot be."""
    return record_edit(plan, _ruled(plan, rule, budget, windows), f"split by the {rule} rule at budget {budget:g}")


def reset_to_full(plan: Plan) -> Plan:
    """The plan with every layer `full` in both phases (no eviction), allocation "fixed": a fresh plan
    (its name kept), with a new provenance saying it was reset from the old one."""
    return plan.with_layers(
        Plan.homogeneous(FULL, None, plan.num_layers).layers,
        scope=Scope.BOTH,
        allocation="fixed",
        provenance={"built_by": "reset_to_full", "source": plan.name},
    )


def profile_scopes(profile: Profile) -> list[str]:
    """The scopes a plan can be built for from `profile`: those whose every phase it measured."""
    return [s.value for s in Scope if all(p.value in profile.meta.scopes for p in s.phases)]


def build_from_profile(profile: Profile, scope: Scope | str, budget: int, statistic: str, allocation: str) -> Plan:
    """`polykv.routing.plan_from_profile`, with any refusal (a stale profile, a scope it did not measure,
    a budget too small) as a one-line PlanError."""
    from polykv.routing import plan_from_profile

    try:
        return plan_from_profile(profile, scope, int(budget), statistic, allocation)
    except ValueError as exc:
        raise PlanError(str(exc)) from None

"""A new whole plan from the designer's: rescaled to another budget (`rescale`, from `current_budget`), its budget
split by an allocation rule for whatever methods it runs (`split_by_rule`, previewed by `rule_preview`), reset to
full (`reset_to_full`), or built from a profile (`build_from_profile`, for the scopes of `profile_scopes`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from polykv.errors import first_line
from polykv.plan import FULL, Phase, Plan, PlanError, Scope
from polykv.plan_edits.edit_history import record_edit
from polykv.plan_edits.painting import DEFAULT_CAPACITY

if TYPE_CHECKING:
    from polykv.profile.store import Profile


def current_budget(plan: Plan) -> float:
    """The plan's budget to start a rescale from: the average capacity of its first active phase that
    has one, else `DEFAULT_CAPACITY`."""
    averages = [plan.summary().phases[p].average_capacity for p in plan.scope.phases]
    return next((a for a in averages if a), float(DEFAULT_CAPACITY))


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


def _some(layers, count: int) -> list[int] | None:
    """The chosen layers in order, or None for all of them (or none chosen)."""
    chosen = sorted(set(layers or ()))
    return None if not chosen or chosen == list(range(count)) else chosen


def selection_budget(plan: Plan, layers=None) -> float:
    """`current_budget` of the chosen `layers` alone (all: None): where a split over them starts."""
    chosen = _some(layers, plan.num_layers)
    return current_budget(plan if chosen is None else plan.with_layers([plan.layers[i] for i in chosen]))


def _ruled(plan: Plan, rule: str, budget: float, windows, layers=None) -> Plan:
    from polykv.methods import validate_plan
    from polykv.routing import scale_budget
    from polykv.routing.rules import apply_rule

    if rule not in RULE_CHOICES:
        raise PlanError(f"unknown rule {rule!r} (the designer's: {', '.join(RULE_CHOICES)})")
    chosen = _some(layers, plan.num_layers)
    where = "" if chosen is None else f" over layers {', '.join(map(str, chosen))}"
    try:
        if chosen is not None and rule == "cake":
            raise PlanError("CAKE's rule splits every layer's budget at run time: select all layers (or none)")
        fixed = plan if plan.allocation == "fixed" else plan.model_copy(update={"allocation": "fixed"})
        if chosen is not None:  # the rule over the chosen layers alone (their own windows); the others as they are
            fixed = fixed.with_layers([fixed.layers[i] for i in chosen])
            windows = None if windows is None else [windows[i] for i in chosen]
        scaled = scale_budget(fixed, budget, name=plan.name, description=plan.description)
        if rule == "cake":
            ruled = scaled.model_copy(update={"allocation": "cake", "allocation_params": {}})
        else:
            ruled = apply_rule(scaled, rule, windows=windows).model_copy(update={"name": plan.name})
        if chosen is not None:
            layers_now = list(plan.layers)
            for i, layer in zip(chosen, ruled.layers):
                layers_now[i] = layer
            shrunk = [i for i, layer in zip(chosen, ruled.layers) if _params(layer) != _params(plan.layers[i])]
            named = f"layer{'s' * (len(shrunk) > 1)} {', '.join(map(str, shrunk))}"
            note = (  # apply_rule's own note names the chosen layers by their place among them: say it here
                f" Split by the {rule} rule{where}: {named} got too few tokens for their method's parameters, which"
                " shrink to fit there."
            )
            description = plan.description + note * bool(shrunk)
            ruled = plan.with_layers(layers_now, allocation="fixed", allocation_params={}, description=description)
        return validate_plan(ruled, plan.num_layers)
    except ValueError as exc:  # a PlanError, or a budget too small for the layers' windows
        raise PlanError(f"split by the {rule} rule{where} at budget {budget:g}: {first_line(exc)}") from None


def _params(layer) -> list:
    return [layer[phase].params for phase in Phase]


def rule_preview(plan: Plan, rule: str, budget: float, windows=None, layers=None) -> dict[str, list[int | None] | None]:
    """Per active phase, the capacities `split_by_rule` would write, every layer's (None for CAKE's: its split comes
    from each prompt's attention at run time); PlanError with one line when the rule cannot split this plan."""
    ruled = _ruled(plan, rule, budget, windows, layers)
    return {
        phase.value: None if rule == "cake" else [layer[phase].capacity for layer in ruled.layers]
        for phase in ruled.scope.phases
    }


def split_by_rule(plan: Plan, rule: str, budget: float, windows=None, layers=None) -> Plan:
    """The plan's route at budget `budget` (average capacity per layer), each active phase's total split over the
    layers by `rule` (`polykv.routing.rules`; "cake": at run time, `polykv.runtime.layer_budgets`); a local layer
    (`windows`) never given more than its window less one. With `layers`, over those layers alone (a static rule):
    their total is `budget` x their count, and the others keep their capacities. PlanError with one line when it
    cannot be."""
    chosen = _some(layers, plan.num_layers)
    where = "" if chosen is None else f" over layers {', '.join(map(str, chosen))}"
    summary = f"split by the {rule} rule{where} at budget {budget:g}"
    return record_edit(plan, _ruled(plan, rule, budget, windows, layers), summary)


HEAD_CHOICES = ("uniform", "adakv")  # how each layer's budget splits over its KV heads (`head_allocation`)


def with_head_rule(plan: Plan, heads: str) -> Plan:
    """The plan with each layer's budget split over its KV heads by `heads` ("adakv": Ada-KV at the prefill cut,
    `polykv.methods.head_budgets`); PlanError with one line when the plan cannot take it."""
    from polykv.methods import validate_plan

    if heads not in HEAD_CHOICES:
        raise PlanError(f"unknown head rule {heads!r} (the designer's: {', '.join(HEAD_CHOICES)})")
    ruled = plan.model_copy(update={"head_allocation": heads, "head_allocation_params": {}})
    try:
        validate_plan(ruled, plan.num_layers)
    except PlanError as exc:
        raise PlanError(f"heads {heads}: {first_line(exc)}") from None
    return record_edit(plan, ruled, f"KV heads: {heads}")


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

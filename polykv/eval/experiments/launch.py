"""Launches from the web app: the labelled plans of one evaluation launch (the route at its budgets, the
baselines, the placements) and a plan's budget."""

from __future__ import annotations

from collections.abc import Mapping

from polykv.eval.experiments.placement import placement_plans
from polykv.eval.experiments.sweep import _check_budgets
from polykv.eval.method_protocols import baseline_plan, protocol
from polykv.plan import FULL, Phase, Plan, Scope
from polykv.routing import (
    scale_budget,
)


# ---- launches from the web app --------------------------------------------------------------------
def plan_budget(plan: Plan) -> int | None:
    """The plan's average capacity over its active phases (None when no layer has a capacity)."""
    averages = [plan.summary().phases[p].average_capacity for p in plan.scope.phases]
    averages = [a for a in averages if a is not None]
    return round(sum(averages) / len(averages)) if averages else None


def phase_budgets(plan: Plan) -> dict[Phase, int]:
    """The plan's average capacity in each active phase that has one, rounded: what a like-with-like baseline keeps
    per phase."""
    summary = plan.summary().phases
    return {p: round(summary[p].average_capacity) for p in plan.scope.phases if summary[p].average_capacity}


def launch_plans(
    plan: Plan,
    budgets: list[int] | None = None,
    baselines: list[str] | None = None,
    placements: int = 0,
    seed: int = 0,
    overrides: Mapping[str, Scope | str] | None = None,
) -> list[tuple[dict, Plan]]:
    """The labelled plans of one evaluation launch (what the app's Runs page starts):

      {"series": "route", "budget": b}        the plan itself (no budgets), or rescaled to each budget
                                              (`scale_budget`: its capacity shape kept)
      {"series": <baseline>, "budget": b}     each baseline alone at each budget under its protocol
                                              (`protocols.baseline_plan`), with the route's own average
                                              capacity in each phase both keep (`phase_budgets`): like with like
      {"series": "placement", "index": i}     k count-matched random placements of the plan's route
      {"series": "full"}                      FullKV, once, when `baselines` names `full` (the reference every
                                              answer's agreement is measured against, as a run to read)
    The unscaled plan is also labelled {"role": "guided"} when placements are asked for."""
    fullkv = FULL in (baselines or [])
    baselines = [name for name in baselines or [] if name != FULL]
    for name in baselines:
        protocol(name, overrides)
    own = plan_budget(plan)
    layers = plan.num_layers
    out: list[tuple[dict, Plan]] = []
    if placements:
        out.append(({"series": "route", "budget": own, "role": "guided"}, plan))
    if not budgets:
        if own is None and baselines:
            raise ValueError("the plan keeps every token (no capacity): give budgets to compare baselines at")
        if not placements:
            out.append(({"series": "route", "budget": own}, plan))
        per_phase = phase_budgets(plan)
        out += [
            ({"series": name, "budget": own}, baseline_plan(name, own, layers, overrides, per_phase))
            for name in baselines
        ]
    else:
        if own is None:
            raise ValueError("the plan keeps every token (no capacity), so it cannot be rescaled to budgets")
        for b in _check_budgets(budgets):
            scaled = scale_budget(plan, b)
            out.append(({"series": "route", "budget": b}, scaled))
            per_phase = phase_budgets(scaled)
            out += [
                ({"series": name, "budget": b}, baseline_plan(name, b, layers, overrides, per_phase))
                for name in baselines
            ]
    if placements:
        out += [
            ({"series": "placement", "index": i}, p) for i, p in enumerate(placement_plans(plan, placements, seed)[1:])
        ]
    if fullkv:
        out.append(({"series": FULL}, Plan.homogeneous(FULL, None, layers)))
    return out

"""Plans from profiles: the TopRank route of each phase, with capacities from an allocation rule.

Methods keep the parameters the profile measured them with (windows scaled to fit a small b_cal). A stale
profile (another profiler revision, a registered method it lacks or measured at another revision) is
refused: TopRank would otherwise silently skip the method it never measured."""

from __future__ import annotations

from polykv.plan import Phase, PhaseAssignment, Plan, Scope
from polykv.profile.store import Profile
from polykv.routing import (
    allocate_entropy,
    allocate_ppl,
    allocate_uniform,
    plan_from_route,
    route_score,
    toprank,
    window_floor,
)

ALLOCATIONS = ("uniform", "entropy", "ppl")


def plan_from_profile(
    profile: Profile, scope: Scope | str, budget: int, statistic: str = "cosine", allocation: str = "uniform"
) -> Plan:
    """TopRank by `statistic` in each active phase; capacities averaging `budget` split by `allocation`."""
    scope = Scope(scope)
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation must be one of {', '.join(ALLOCATIONS)} (got {allocation!r})")
    missing = [p.value for p in scope.phases if p.value not in profile.metadata["scopes"]]
    if missing:
        raise ValueError(f"profile {profile.key} has no {' or '.join(missing)} measurements; profile that scope first")
    profile.check_current(scope.phases)
    layers = profile.num_layers
    params = profile.metadata.get("method_params", {})  # the parameters the profile measured
    routes, capacities, scores = {}, {}, {}
    for phase in scope.phases:
        route = toprank(profile.table, phase, statistic, layers)
        minimum = max(window_floor(PhaseAssignment(method=m, capacity=budget, params=params.get(m, {}))) for m in route)
        if allocation == "uniform":
            caps = allocate_uniform(layers, budget, minimum)
        elif allocation == "entropy":
            caps = allocate_entropy(profile.entropy, budget, minimum)
        else:
            caps = allocate_ppl(profile.table, phase, budget, minimum)
        routes[phase], capacities[phase] = route, caps
        scores[phase.value] = route_score(route, profile.table, phase, statistic)
    return plan_from_route(
        routes.get(Phase.PREFILL),
        routes.get(Phase.DECODE),
        capacities.get(Phase.PREFILL),
        capacities.get(Phase.DECODE),
        scope,
        params=params,
        name=f"toprank-{statistic}-{allocation}-{scope.value}-b{budget}",
        description=f"TopRank by {statistic} from profile {profile.key}; {allocation} capacities averaging {budget}.",
        provenance={
            "built_by": "toprank",
            "profile": profile.key,
            "profile_model": profile.metadata["model"],
            "b_cal": profile.metadata["capacity"],
            "statistic": statistic,
            "allocation": allocation,
            "budget": budget,
            "route_score": scores,
        },
    )

"""Plans from routes and from profiles.

`plan_from_route` writes per-layer routes and capacities as a validated `Plan`. `plan_from_profile`
takes the TopRank route of each phase from a profile, with capacities from an allocation rule
(`ALLOCATIONS`). Methods keep the parameters the profile measured them with (windows scaled to fit a
small b_cal). A stale profile (another profiler revision, a registered method it lacks or measured at
another revision) is refused: TopRank would otherwise silently skip the method it never measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from polykv.methods import validate_plan
from polykv.plan import FULL, Phase, PhaseAssignment, Plan, Scope
from polykv.profile.store import Profile
from polykv.routing.allocation import allocate_entropy, allocate_ppl, allocate_uniform, floor_words, window_floor
from polykv.routing.toprank import route_score, toprank

ALLOCATIONS = ("uniform", "entropy", "ppl")  # how plan_from_profile splits the budget over the layers


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
    lengths, active = set(), {}
    for phase in scope.phases:
        route, capacities = given[phase]
        if route is None or capacities is None:
            raise ValueError(f"scope {scope.value!r} needs a {phase.value} route and {phase.value} capacities")
        active[phase] = (route, capacities)
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
                {phase.value: assignment(active[phase][0][i], active[phase][1][i]) for phase in scope.phases}
                for i in range(num_layers)
            ],
        }
    )
    return validate_plan(plan, num_layers)


def plan_from_profile(
    profile: Profile, scope: Scope | str, budget: int, statistic: str = "cosine", allocation: str = "uniform"
) -> Plan:
    """TopRank by `statistic` in each active phase; capacities averaging `budget` split by `allocation`."""
    scope = Scope(scope)
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation must be one of {', '.join(ALLOCATIONS)} (got {allocation!r})")
    meta = profile.meta
    missing = [p.value for p in scope.phases if p.value not in meta.scopes]
    if missing:
        raise ValueError(f"profile {profile.key} has no {' or '.join(missing)} measurements; profile that scope first")
    profile.check_current(scope.phases)
    layers = profile.num_layers
    params = meta.method_params  # the parameters the profile measured
    routes, capacities, scores = {}, {}, {}
    for phase in scope.phases:
        route = toprank(profile.table, phase, statistic, layers)
        floors = {m: window_floor(PhaseAssignment(method=m, capacity=budget, params=params.get(m, {}))) for m in route}
        minimum = max(floors.values())
        if minimum > budget:  # say where the floor comes from (the split itself would only name the numbers)
            method = max(floors, key=lambda m: floors[m])
            raise ValueError(
                f"budget {budget} is below {minimum}, the least capacity {method} can run at in the {phase.value} "
                f"route ({floor_words(method, params.get(method, {}))} must fit under it): choose a budget of at "
                f"least {minimum}"
            )
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
            "profile_model": meta.model,
            "b_cal": meta.b_cal,
            "statistic": statistic,
            "allocation": allocation,
            "budget": budget,
            "route_score": scores,
        },
    )


__all__ = ["ALLOCATIONS", "plan_from_profile", "plan_from_route"]

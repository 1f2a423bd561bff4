"""The factorial (Table 2): routing (homogeneous vs TopRank route) x allocation (uniform vs profile-derived)
at the same total capacity."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polykv.eval.comparing.compare import macro_average
from polykv.eval.experiments.experiment_runner import ExperimentRunner, _ci, contrast
from polykv.eval.experiments.report import FACTORIAL_CELLS, Contrast, FactorialData, Report, RunScore
from polykv.eval.statistics.contrast import direction, direction_text
from polykv.methods import REGISTRY, params_that_fit
from polykv.plan import FULL, Phase, Plan, Scope
from polykv.profile.store import Profile
from polykv.routing import (
    plan_from_profile,
    plan_from_route,
)

# ---- factorial (Table 2) --------------------------------------------------------------------------


def factorial_plans(
    profile: Profile,
    scope: Scope | str,
    budget: int,
    baseline: str,
    statistic: str = "cosine",
    allocation: str = "entropy",
) -> dict[str, Plan]:
    """The four cells of the factorial (`FACTORIAL_CELLS` -> plan), built without running anything."""
    scope = Scope(scope)
    if allocation == "uniform":
        raise ValueError("the factorial's allocated arm must differ from uniform (entropy or ppl)")
    routed_uniform = plan_from_profile(profile, scope, budget, statistic, "uniform")
    routed_allocated = plan_from_profile(profile, scope, budget, statistic, allocation)
    params = profile.meta.method_params.get(baseline)
    return {
        "homogeneous-uniform": _with_route(
            routed_uniform, baseline, f"{baseline}-{scope.value}-uniform-b{budget}", params
        ),
        "homogeneous-allocated": _with_route(
            routed_allocated, baseline, f"{baseline}-{scope.value}-{allocation}-b{budget}", params
        ),
        "routed-uniform": routed_uniform,
        "routed-allocated": routed_allocated,
    }


def factorial(
    runner: ExperimentRunner,
    profile: Profile,
    scope: Scope | str,
    budget: int,
    baseline: str,
    statistic: str = "cosine",
    allocation: str = "entropy",
) -> Report:
    """Routing (`baseline` in every layer vs the TopRank route by `statistic`) x allocation (uniform vs
    `allocation`) in the `scope` phase(s), every cell at the same total capacity L x budget.

    The homogeneous cells take the routed cells' capacities with `baseline` in every active layer, with
    the parameters the profile measured it with (a controlled cell, not the baseline's standalone
    protocol). Primary: routed-uniform - homogeneous-uniform (the macro-average difference, its 95%
    paired bootstrap CI over tasks, wins/ties/losses, every leave-one-task-out value and how many are in
    the better direction). Secondary, each with a paired bootstrap CI over tasks: the allocation effect
    under homogeneous routing (h_a - h_u), under TopRank routing (r_a - r_u), and the interaction
    (r_a - r_u) - (h_a - h_u) (the bootstrap of the per-task contrast, over the tasks all four cells have).
    `report.data` (`FactorialData`) holds the cells (run, plan, score) and each contrast."""
    scope = Scope(scope)
    cells = factorial_plans(profile, scope, budget, baseline, statistic, allocation)
    ids = dict(zip(cells, runner.run_all(list(cells.values()))))
    scores = {cell: runner.scores(run_id) for cell, run_id in ids.items()}
    score = {cell: macro_average(s.tasks) for cell, s in scores.items()}
    metric, seed = runner.metric, runner.seed
    h_u, h_a, r_u, r_a = (scores[c] for c in FACTORIAL_CELLS)

    report = Report(
        f"factorial: routing x allocation ({allocation}) in the {scope.value} phase at average capacity "
        f"{budget} ({metric})"
    )
    for cell, run_id in ids.items():
        routing, alloc = cell.split("-")
        report.rows.append(
            {
                "routing": routing,
                "allocation": allocation if alloc == "allocated" else alloc,
                "plan": cells[cell].name,
                "run": run_id,
                metric: score[cell],
            }
        )

    routing_uniform = contrast(r_u, h_u, metric, seed)
    allocation_homogeneous = contrast(h_a, h_u, metric, seed)
    allocation_routed = contrast(r_a, r_u, metric, seed)
    interaction = contrast(r_a.minus(r_u), h_a.minus(h_u), metric, seed)

    primary = Contrast.of(routing_uniform)
    loto = ", ".join(f"{t} {v:+.4f}" for t, v in routing_uniform.leave_one_out.items()) or "none (one task)"
    report.lines += [
        direction_text(metric),
        f"protocol: homogeneous cells run {baseline} in every {scope.value} layer at the routed cells' capacities "
        f"(fixed allocation, the profile's parameters); routed cells: TopRank by {statistic} from profile "
        f"{profile.key}; "
        f"every cell keeps {budget} tokens per layer on average",
        f"primary: routing under uniform allocation (routed-uniform - homogeneous-uniform): {_ci(routing_uniform)}; "
        f"wins / ties / losses {routing_uniform.wins} / {routing_uniform.ties} / {routing_uniform.losses}",
        f"primary leave-one-task-out (routed-uniform - homogeneous-uniform): {loto}; {primary.loto_better} of "
        f"{len(routing_uniform.leave_one_out)} in the better direction",
        f"secondary: allocation effect under homogeneous routing ({allocation} - uniform): "
        f"{_ci(allocation_homogeneous)}",
        f"secondary: allocation effect under TopRank routing ({allocation} - uniform): {_ci(allocation_routed)}",
        f"secondary: interaction ((r_a - r_u) - (h_a - h_u)): {_ci(interaction)}",
    ]
    report.data = FactorialData(
        metric=metric,
        direction=direction(metric),
        scope=scope.value,
        budget=budget,
        baseline=baseline,
        statistic=statistic,
        allocation=allocation,
        cells={cell: RunScore(plan=cells[cell].name, run=ids[cell], score=score[cell]) for cell in cells},
        routing_uniform=primary,
        allocation_homogeneous=Contrast.of(allocation_homogeneous),
        allocation_routed=Contrast.of(allocation_routed),
        interaction=Contrast.of(interaction),
    )
    return report


def _with_route(plan: Plan, method: str, name: str, params: Mapping[str, Any] | None = None) -> Plan:
    """`plan`'s capacities with `method` in every layer of its active phases (the homogeneous cell);
    `params` default to the method's defaults with windows fitting the smallest capacity."""
    phases = plan.scope.phases
    routes = {p: [method] * plan.num_layers for p in phases}
    caps = {p: [layer[p].capacity for layer in plan.layers] for p in phases}
    if params is None and method in REGISTRY and method != FULL:
        params = params_that_fit(method, min(c for p in phases for c in caps[p] if c is not None))
    return plan_from_route(
        routes.get(Phase.PREFILL),
        routes.get(Phase.DECODE),
        caps.get(Phase.PREFILL),
        caps.get(Phase.DECODE),
        plan.scope,
        name=name,
        params={method: dict(params or {})},
        provenance={"built_by": "factorial", "baseline": method, "capacities_from": plan.name},
    )

"""The placement control (Table 4 / Figure 4): the guided route against K unique random count-matched
placements of its methods over the layers."""

from __future__ import annotations

from polykv.eval.compare import direction, direction_text, placement_summary
from polykv.eval.experiments.runner import PERMUTATIONS, ExperimentRunner, Report, _plain
from polykv.eval.stats import spearman_permutation
from polykv.plan import LayerPlan, Phase, Plan, Scope
from polykv.profile.store import Profile
from polykv.routing import (
    route_score,
    sample_placements,
)


# ---- placement control (Table 4 / Figure 4) --------------------------------------------------------
def placement_plans(guided: Plan, k: int, seed: int = 0) -> list[Plan]:
    """The guided plan first, then k unique random count-matched placements of its active phase's route,
    none equal to the guided one (the capacities stay per layer; each method keeps its parameters)."""
    phase = _active_phase(guided)
    route = [layer[phase].method for layer in guided.layers]
    placements = sample_placements(route, k, seed=seed, exclude=route)
    return [guided] + [_placed(guided, phase, p, f"{guided.name}-placement-{i}") for i, p in enumerate(placements)]


def placement(
    runner: ExperimentRunner,
    profile: Profile,
    guided: Plan,
    k: int,
    statistic: str = "cosine",
    permutations: int = PERMUTATIONS,
) -> Report:
    """The guided plan's route vs k unique random count-matched placements of it.

    Primary: rho = tie-aware Spearman between the profile score S(rho) (`route_score` by `statistic`)
    and the suite score turned so that higher is better, over the k random placements only (the guided
    assignment is excluded), with the one-sided permutation p = (1 + #{rho_perm >= rho_obs}) / (N + 1)
    over N = `permutations` shuffles (seed: the runner's). Secondary, descriptive: the guided route's
    rank among the k + 1 routes (ties count against it), its corrected Monte Carlo p = rank / (k + 1),
    and guided - random mean in the metric's units. `report.data` holds every number."""
    phase = _active_phase(guided)
    plans = placement_plans(guided, k, runner.seed)
    ids = runner.run_all(plans)
    scores = [runner.score(run_id) for run_id in ids]
    profile_scores = [
        route_score([lay[phase].method for lay in plan.layers], profile.table, phase, statistic) for plan in plans
    ]
    metric = runner.metric
    control = placement_summary(scores[0], scores[1:], metric)
    random_mean = sum(scores[1:]) / k
    if k >= 2:
        rho, p_rho = spearman_permutation(
            profile_scores[1:],
            [runner.sign * s for s in scores[1:]],
            permutations=permutations,
            seed=runner.seed,
            alternative="greater",
        )
    else:
        rho, p_rho = float("nan"), float("nan")

    report = Report(f"placement control: guided {phase.value} route vs {k} count-matched random placements ({metric})")
    for i, (plan, run_id, score, s_rho) in enumerate(zip(plans, ids, scores, profile_scores)):
        report.rows.append(
            {"plan": plan.name, "role": "guided" if i == 0 else "random", "run": run_id, metric: score, "S(rho)": s_rho}
        )
    report.lines += [
        direction_text(metric),
        f"protocol: {k} unique random placements of the guided route's methods over its layers (same method counts, "
        f"per-layer capacities and parameters; the guided assignment excluded); S(rho) by {statistic} from profile "
        f"{profile.key}",
    ]
    if rho == rho:  # not NaN
        report.lines.append(
            f"primary: Spearman(S(rho), suite score in the better direction) over the {k} random placements = "
            f"{rho:+.4f}; one-sided permutation p = (1 + #{{rho_perm >= rho_obs}}) / (N + 1) = {p_rho:.4f} "
            f"(N = {permutations} shuffles; the guided route is not included)"
        )
    else:
        why = "needs at least 2 random placements" if k < 2 else "undefined: S(rho) or the suite score is constant"
        report.lines.append(f"primary: Spearman over the {k} random placements {why}")
    report.lines.append(
        f"secondary (descriptive): guided route rank {control.rank} of {k + 1}; corrected Monte Carlo p = "
        f"rank / (K + 1) = {control.p_value:.4f} (ties count against it); guided - random mean = "
        f"{scores[0] - random_mean:+.4f} {metric}"
    )
    report.data = {
        "experiment": "placement",
        "metric": metric,
        "direction": direction(metric),
        "phase": phase.value,
        "statistic": statistic,
        "k": k,
        "permutations": permutations,
        # each placement's plan as JSON too, so that a page can open the one a reader picks
        "guided": {
            "plan": plans[0].name,
            "run": ids[0],
            "score": scores[0],
            "S": profile_scores[0],
            "plan_json": plans[0].to_json(),
        },
        "random": [
            {"index": i, "plan": p.name, "run": r, "score": s, "S": x, "plan_json": p.to_json()}
            for i, (p, r, s, x) in enumerate(zip(plans[1:], ids[1:], scores[1:], profile_scores[1:]))
        ],
        "spearman": rho,
        "spearman_p": p_rho,
        "guided_rank": control.rank,
        "guided_p": control.p_value,
        "random_mean": random_mean,
        "guided_minus_mean": scores[0] - random_mean,
    }
    report.data = _plain(report.data)
    return report


def _active_phase(plan: Plan) -> Phase:
    if plan.scope is Scope.BOTH:
        raise ValueError("the placement control takes a single-phase plan (scope prefill or decode)")
    return plan.scope.phases[0]


def _placed(plan: Plan, phase: Phase, route: list[str], name: str) -> Plan:
    """The same capacities and parameters, methods permuted over the layers."""
    params = {lay[phase].method: lay[phase].params for lay in plan.layers}
    layers = [
        LayerPlan(**{phase.value: lay[phase].model_copy(update={"method": m, "params": params[m]})})
        for lay, m in zip(plan.layers, route)
    ]
    return plan.with_layers(layers, name=name, provenance={"built_by": "placement", "guided": plan.name})

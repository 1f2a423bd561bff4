"""The placement control (Table 4 / Figure 4): the guided route against K unique random count-matched
placements of its methods over the layers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from polykv.eval.experiments.experiment_runner import PERMUTATIONS, ExperimentRunner
from polykv.eval.experiments.report import GUIDED_INDEX, PlacedRun, PlacementData, Report, SampleLevel
from polykv.eval.statistics.contrast import direction, direction_text
from polykv.eval.statistics.render import interval
from polykv.eval.statistics.samples import detectable, sample_test
from polykv.eval.statistics.tasks import rank_among, spearman_permutation
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


@dataclass(frozen=True)
class Placement:
    guided: float
    controls: list[float]
    rank: int  # 1 = best
    p_value: float  # one-sided Monte Carlo p of the guided route against the controls


def placement_summary(guided: float, controls: Sequence[float], metric: str) -> Placement:
    """The guided route's rank among its random placements' scores, and its one-sided Monte Carlo p."""
    rank, p = rank_among(guided, controls, higher_is_better=direction(metric) > 0)
    return Placement(guided, list(controls), rank, p)


def placement(
    runner: ExperimentRunner,
    profile: Profile,
    guided: Plan,
    k: int,
    statistic: str = "cosine",
    permutations: int = PERMUTATIONS,
) -> Report:
    """The guided plan's route vs k unique random count-matched placements of it.

    Primary: rho = tie-aware Spearman between the profile score S(rho) and the suite score turned so that
    higher is better, over the k random placements only (the guided assignment is excluded), with the
    one-sided permutation p = (1 + #{rho_perm >= rho_obs}) / (N + 1) over N = `permutations` shuffles
    (seed: the runner's). S(rho) is the paper's: the sum, over the layers a placement gives a method other
    than the route's majority method, of that method's profile `statistic` minus the majority method's
    (`majority_method`; sign-turned so that higher is better). Secondary, descriptive: the guided route's
    rank among the k + 1 routes (ties count against it), its corrected Monte Carlo p = rank / (k + 1), and
    guided - random mean in the metric's units, with a sample-level test of it (each sample's guided score
    against the mean of the random placements' scores on that sample). `report.data` (`PlacementData`) holds
    every number."""
    phase = _active_phase(guided)
    plans = placement_plans(guided, k, runner.seed)
    ids = runner.run_all(plans)
    scores = [runner.score(run_id) for run_id in ids]
    majority = majority_method([lay[phase].method for lay in guided.layers])
    profile_scores = [
        route_score([lay[phase].method for lay in plan.layers], profile.table, phase, statistic, majority)
        for plan in plans
    ]
    versus_mean = _versus_random_mean([runner.sample_scores(run_id) for run_id in ids], runner.seed)
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
        f"per-layer capacities and parameters; the guided assignment excluded); S(rho) = sum over the layers "
        f"given a method other than the majority method {majority} of {statistic}(method) - {statistic}"
        f"({majority}), from profile {profile.key}",
    ]
    if rho == rho:  # not NaN
        report.lines.append(
            f"primary: Spearman(S(rho), suite score in the better direction) over the {k} random placements = "
            f"{rho:+.4f}; one-sided permutation p = (1 + #{{rho_perm >= rho_obs}}) / (N + 1) = {p_rho:.4f} "
            f"(N = {permutations} shuffles; the guided route is not included)"
        )
    else:
        why = "needs at least 2 random placements" if k < 2 else "not estimable: S(rho) or the suite score is constant"
        report.lines.append(f"primary: Spearman over the {k} random placements {why}")
    report.lines.append(
        f"secondary (descriptive): guided route rank {control.rank} of {k + 1}; corrected Monte Carlo p = "
        f"rank / (K + 1) = {control.p_value:.4f} (ties count against it); guided - random mean = "
        f"{scores[0] - random_mean:+.4f} {metric}"
    )
    if versus_mean is not None:
        report.lines.append(
            f"guided - random mean at the sample level: {versus_mean.difference:+.4f} {metric}, 95% CI "
            f"{interval(versus_mean.low, versus_mean.high)} (the shifts the sign-flip test does not reject); "
            f"{versus_mean.describe()}; minimal detectable difference {detectable(versus_mean.mde, '.4g')}"
        )
    # each placement's plan as JSON too, so that a page can open the one a reader picks
    placed = [
        PlacedRun(
            index=GUIDED_INDEX if i == 0 else i - 1, plan=p.name, run=r, score=v, profile_score=x, plan_json=p.to_json()
        )
        for i, (p, r, v, x) in enumerate(zip(plans, ids, scores, profile_scores))
    ]
    report.data = PlacementData(
        metric=metric,
        direction=direction(metric),
        phase=phase.value,
        statistic=statistic,
        majority=majority,
        k=k,
        permutations=permutations,
        guided=placed[0],
        random=placed[1:],
        spearman=rho,
        spearman_p=p_rho,
        guided_rank=control.rank,
        guided_p=control.p_value,
        random_mean=random_mean,
        guided_minus_mean=scores[0] - random_mean,
        guided_minus_mean_sample=None if versus_mean is None else SampleLevel.of(versus_mean),
    )
    return report


def majority_method(route: list[str]) -> str:
    """The route's most frequent method (ties: the first in alphabetical order), S(rho)'s reference."""
    counts = Counter(route)
    return min(counts, key=lambda method: (-counts[method], method))


def _versus_random_mean(samples: list[dict[str, dict[str, float]]], seed: int):
    """The guided run's per-sample scores against the mean of the random placements' on each sample they all
    have (None when they share none)."""
    guided, randoms = samples[0], samples[1:]
    mean = {}
    for task, values in guided.items():
        shared = [s for s in values if all(s in r.get(task, {}) for r in randoms)]
        mean[task] = {s: sum(r[task][s] for r in randoms) / len(randoms) for s in shared}
    try:
        return sample_test(guided, mean, seed=seed)
    except ValueError:
        return None


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

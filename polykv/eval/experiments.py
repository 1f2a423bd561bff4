"""Controlled experiments. Each creates the runs it needs (through `run_suite`, so finished runs are
reused) and reports from their scores; none scores anything by itself.

  factorial  routing (homogeneous baseline vs profile route) x allocation (uniform vs profile-derived)
             at the same total capacity: four runs, main effects and the interaction.
  placement  the guided route vs K random placements with the same method counts and capacities: the
             guided route's rank and one-sided Monte Carlo p, and the Spearman correlation (permutation
             p) between the profile score S(rho) and the suite score over all K + 1 routes.
  sweep      a fixed route at several average budgets against every homogeneous baseline at each
             budget (standalone methods: native allocation where the method has one), with the
             per-budget best-baseline envelope (any scope; the baselines must run alone in its phases).

`launch_plans` builds the labelled plans of one launch from the web app (the route at its budgets,
baselines, placements), which a background job (`polykv.jobs`) then runs.

A run's suite score is the macro-average over tasks of one metric (`compare.METRIC_DIRECTION` says which way
is better; the reports are in the metric's own units).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from polykv.eval.backends import Unit, backend
from polykv.eval.compare import direction, envelope, paired, placement_summary
from polykv.eval.runner import run_suite
from polykv.eval.stats import spearman_permutation
from polykv.eval.store import Store
from polykv.methods import REGISTRY
from polykv.plan import FULL, LayerPlan, Phase, Plan, Scope
from polykv.profile.profiler import calibration_params
from polykv.profile.route import plan_from_profile
from polykv.profile.store import Profile
from polykv.routing import plan_from_route, route_score, sample_placements, scale_budget



@dataclass
class Runner:
    """Everything needed to execute runs: the model, the store, the suite and its settings."""

    store: Store
    model_name: str
    model: object
    tokenizer: object
    suite: str = "fidelity"
    settings: object = None
    seed: int = 0
    metric: str = "top1"
    progress: Callable[[str], None] | None = None
    backend: str = "local"  # "ray": the runs of an experiment execute in parallel as Ray tasks
    device: str = "cpu"

    def run(self, plan: Plan) -> str:
        return self.run_all([plan])[0]

    def run_all(self, plans: list[Plan]) -> list[str]:
        if self.progress is not None:
            for plan in plans:
                self.progress(plan.name)
        if self.backend == "local":
            return [run_suite(self.store, self.model_name, self.model, self.tokenizer, plan, self.suite,
                              self.settings, self.seed) for plan in plans]
        units = [Unit.of(self.model_name, plan, self.suite, self.settings, self.seed, self.device) for plan in plans]
        return backend(self.backend).run(units, self.store.path)

    def task_scores(self, run_id: str) -> dict[str, float]:
        return {task: values[self.metric] for task, values in self.store.task_scores(run_id).items()}

    def score(self, run_id: str) -> float:
        scores = self.task_scores(run_id)
        return sum(scores.values()) / len(scores)

    @property
    def sign(self) -> int:
        return direction(self.metric)


@dataclass
class Report:
    title: str
    rows: list[dict] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def factorial(runner: Runner, profile: Profile, scope: Scope | str, budget: int, baseline: str,
              statistic: str = "cosine", allocation: str = "entropy") -> Report:
    scope = Scope(scope)
    routed_uniform = plan_from_profile(profile, scope, budget, statistic, "uniform")
    routed_allocated = plan_from_profile(profile, scope, budget, statistic, allocation)
    cells = {
        ("homogeneous", "uniform"): _with_route(routed_uniform, baseline, f"{baseline}-uniform"),
        ("homogeneous", allocation): _with_route(routed_allocated, baseline, f"{baseline}-{allocation}"),
        ("routed", "uniform"): routed_uniform,
        ("routed", allocation): routed_allocated,
    }
    ids = dict(zip(cells, runner.run_all(list(cells.values()))))
    score = {cell: runner.score(run_id) for cell, run_id in ids.items()}
    report = Report(f"factorial: routing x allocation at average capacity {budget} ({runner.metric})")
    for (routing, alloc), run_id in ids.items():
        report.rows.append({"routing": routing, "allocation": alloc, "run": run_id, runner.metric: score[(routing, alloc)]})
    h_u, h_a = score[("homogeneous", "uniform")], score[("homogeneous", allocation)]
    r_u, r_a = score[("routed", "uniform")], score[("routed", allocation)]
    report.lines += [
        f"routing main effect (routed - homogeneous): {((r_u + r_a) - (h_u + h_a)) / 2:+.4f}",
        f"allocation main effect ({allocation} - uniform): {((h_a + r_a) - (h_u + r_u)) / 2:+.4f}",
        f"interaction: {(r_a - r_u) - (h_a - h_u):+.4f}",
    ]
    versus = paired(runner.task_scores(ids[("routed", allocation)]), runner.task_scores(ids[("homogeneous", allocation)]),
                    runner.metric, runner.seed)
    report.lines.append(
        f"routed vs homogeneous ({allocation}): {versus.difference:+.4f} {runner.metric}, 95% paired bootstrap CI "
        f"[{versus.low:+.4f}, {versus.high:+.4f}] over {len(versus.table)} tasks"
    )
    return report


def placement_plans(guided: Plan, k: int, seed: int = 0) -> list[Plan]:
    """The guided plan first, then k random count-matched placements of its active phase's route (the
    capacities stay per layer; each method keeps its parameters)."""
    phase = _active_phase(guided)
    route = [layer[phase].method for layer in guided.layers]
    placements = sample_placements(route, k, seed=seed, exclude=route)
    return [guided] + [_placed(guided, phase, p, f"{guided.name}-placement-{i}") for i, p in enumerate(placements)]


def placement(runner: Runner, profile: Profile, guided: Plan, k: int, statistic: str = "cosine") -> Report:
    """The guided plan's route vs k random count-matched placements of it (capacities stay per layer)."""
    phase = _active_phase(guided)
    plans = placement_plans(guided, k, runner.seed)
    ids = runner.run_all(plans)
    scores = [runner.score(run_id) for run_id in ids]
    profile_scores = [route_score([lay[phase].method for lay in plan.layers], profile.table, phase, statistic) for plan in plans]
    control = placement_summary(scores[0], scores[1:], runner.metric)
    rho, p_rho = spearman_permutation(profile_scores, [runner.sign * s for s in scores], seed=runner.seed)
    report = Report(f"placement control: guided {phase.value} route vs {k} count-matched random placements ({runner.metric})")
    for plan, run_id, score, s_rho in zip(plans, ids, scores, profile_scores):
        report.rows.append({"plan": plan.name, "run": run_id, runner.metric: score, "S(rho)": s_rho})
    report.lines += [
        f"guided route rank {control.rank} of {k + 1}; one-sided Monte Carlo p = {control.p_value:.4f}",
        f"Spearman(S(rho), suite score) = {rho:+.4f}, permutation p = {p_rho:.4f}",
    ]
    return report


def baseline_methods(scope: Scope | str) -> list[str]:
    """The methods that can run alone in every active phase of `scope` (full excluded)."""
    phases = Scope(scope).phases
    return [n for n, c in REGISTRY.items() if n != FULL and all(p in c.phases for p in phases)]


def sweep_plans(route_plan: Plan, budgets: list[int], baselines: list[str] | None = None) -> dict[tuple[int, str], Plan]:
    """(budget, "route" | baseline) -> plan: the route rescaled to each average budget, and each baseline
    alone in the route's phases at that budget (standalone: native allocation where the method has a
    layer-budget rule; windows scaled down where they would not fit)."""
    layers = route_plan.num_layers
    baselines = baseline_methods(route_plan.scope) if baselines is None else baselines
    unfit = [b for b in baselines if b not in baseline_methods(route_plan.scope)]
    if unfit:
        raise ValueError(f"baselines {', '.join(unfit)} cannot run alone in the {route_plan.scope.value} scope "
                         f"(possible: {', '.join(baseline_methods(route_plan.scope))})")
    plans: dict[tuple[int, str], Plan] = {}
    for budget in budgets:
        plans[(budget, "route")] = scale_budget(route_plan, budget)
        for name in baselines:
            native = "native" if REGISTRY[name].native_allocation else "fixed"
            params = calibration_params(name, budget)
            plans[(budget, name)] = Plan.homogeneous(name, budget, layers, route_plan.scope, params, allocation=native)
    return plans


def sweep(runner: Runner, route_plan: Plan, budgets: list[int], baselines: list[str] | None = None) -> Report:
    """The fixed route rescaled to each budget vs every homogeneous baseline, with the envelope."""
    plans = sweep_plans(route_plan, budgets, baselines)
    baselines = list(dict.fromkeys(name for _, name in plans if name != "route"))
    report = Report(f"sweep: {route_plan.name} vs homogeneous baselines ({runner.metric})")
    scores = {key: runner.score(run_id) for key, run_id in zip(plans, runner.run_all(list(plans.values())))}
    rows = [{"budget": b, "route": scores[(b, "route")], **{n: scores[(b, n)] for n in baselines}} for b in budgets]
    for row in envelope(rows, baselines, runner.metric):
        report.rows.append(row)
        lead = runner.sign * (row["route"] - row["envelope"])
        verdict = "route ahead" if lead > 0 else "baseline ahead" if lead < 0 else "tie"
        report.lines.append(
            f"budget {row['budget']}: route {row['route']:.4f} vs best baseline {row['best baseline']} "
            f"{row['envelope']:.4f} ({verdict})"
        )
    return report


def plan_budget(plan: Plan) -> int | None:
    """The plan's average capacity over its active phases (None when no layer has a capacity)."""
    averages = [plan.summary().phases[p].average_capacity for p in plan.scope.phases]
    averages = [a for a in averages if a is not None]
    return round(sum(averages) / len(averages)) if averages else None


def launch_plans(plan: Plan, budgets: list[int] | None = None, baselines: list[str] | None = None,
                 placements: int = 0, seed: int = 0) -> list[tuple[dict, Plan]]:
    """The labelled plans of one evaluation launch (what the app's Runs page starts):

      {"series": "route", "budget": b}        the plan itself (no budgets), or rescaled to each budget
      {"series": <baseline>, "budget": b}     each baseline alone at each budget (as in `sweep_plans`)
      {"series": "placement", "index": i}     k count-matched random placements of the plan's route
    The unscaled plan is also labelled {"role": "guided"} when placements are asked for."""
    baselines = list(baselines or [])
    own = plan_budget(plan)
    out: list[tuple[dict, Plan]] = []
    if placements:
        out.append(({"series": "route", "budget": own, "role": "guided"}, plan))
    if not budgets:
        if own is None and baselines:
            raise ValueError("the plan keeps every token (no capacity): give budgets to compare baselines at")
        if not placements:
            out.append(({"series": "route", "budget": own}, plan))
        if baselines:
            out += [({"series": name, "budget": b}, p) for (b, name), p in sweep_plans(plan, [own], baselines).items()
                    if name != "route"]
    else:
        if own is None:
            raise ValueError("the plan keeps every token (no capacity), so it cannot be rescaled to budgets")
        out += [({"series": name, "budget": b}, p) for (b, name), p in sweep_plans(plan, list(budgets), baselines).items()]
    if placements:
        out += [({"series": "placement", "index": i}, p) for i, p in enumerate(placement_plans(plan, placements, seed)[1:])]
    return out


# ---- helpers --------------------------------------------------------------------------------------
def _active_phase(plan: Plan) -> Phase:
    if plan.scope is Scope.BOTH:
        raise ValueError("placement and sweep take a single-phase plan (scope prefill or decode)")
    return plan.scope.phases[0]


def _with_route(plan: Plan, method: str, name: str) -> Plan:
    """`plan`'s capacities with `method` in every layer of its active phases (the homogeneous cell)."""
    phases = plan.scope.phases
    routes = {p: [method] * plan.num_layers for p in phases}
    caps = {p: [layer[p].capacity for layer in plan.layers] for p in phases}
    return plan_from_route(routes.get(Phase.PREFILL), routes.get(Phase.DECODE), caps.get(Phase.PREFILL),
                           caps.get(Phase.DECODE), plan.scope, name=name,
                           provenance={"built_by": "factorial", "baseline": method, "capacities_from": plan.name})


def _placed(plan: Plan, phase: Phase, route: list[str], name: str) -> Plan:
    """The same capacities and parameters, methods permuted over the layers."""
    params = {lay[phase].method: lay[phase].params for lay in plan.layers}
    layers = [
        LayerPlan(**{phase.value: lay[phase].model_copy(update={"method": m, "params": params[m]})})
        for lay, m in zip(plan.layers, route)
    ]
    return plan.with_layers(layers, name=name, provenance={"built_by": "placement", "guided": plan.name})


"""The budget sweep (Table 5): a fixed route at several budgets against FullKV and every standalone baseline
under its own protocol, with the per-budget best-baseline envelope."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from polykv.eval.compare import direction, direction_text, envelope, macro_average
from polykv.eval.experiments.report import (
    AtDoubleBudget,
    BaselineProtocol,
    BestBaseline,
    Contrast,
    Report,
    RunScore,
    SweepData,
    VersusBaseline,
)
from polykv.eval.experiments.runner import (
    FULLKV,
    ROUTE_PPL,
    ROUTE_UNIFORM,
    ExperimentRunner,
    _ci,
    contrast,
)
from polykv.eval.protocols import baseline_methods, baseline_plan, protocol, protocol_lines
from polykv.methods import REGISTRY, validate_plan
from polykv.plan import FULL, LayerPlan, Phase, Plan, Scope
from polykv.profile.store import Profile
from polykv.routing import (
    allocate_ppl,
    allocate_uniform,
    window_floor,
)


# ---- budget sweep (Table 5) -----------------------------------------------------------------------
def route_uniform(route_plan: Plan, budget: int) -> Plan:
    """The route's methods with the same capacity `budget` in every bounded layer of its active phases
    (`full` layers stay full); windows that would not fit shrink as in `params_that_fit`."""
    caps = {}
    for phase in route_plan.scope.phases:
        bounded = [i for i, lay in enumerate(route_plan.layers) if lay[phase].capacity is not None]
        caps[phase] = dict(zip(bounded, allocate_uniform(len(bounded), budget))) if bounded else {}
    return _route_at(route_plan, budget, caps, f"{route_plan.name}-uniform-b{budget}", "uniform")


def route_ppl(route_plan: Plan, budget: int, profile: Profile) -> Plan:
    """The route's methods with capacities from the profile's PPL allocation at average `budget`
    (`routing.allocate_ppl`, at least 1 + the largest window of the route's methods)."""
    if profile.num_layers != route_plan.num_layers:
        raise ValueError(f"profile {profile.key} has {profile.num_layers} layers, the route {route_plan.num_layers}")
    profile.check_current(route_plan.scope.phases)  # measured with today's methods, as plan_from_profile asks
    caps = {}
    for phase in route_plan.scope.phases:
        if phase.value not in profile.meta.scopes:
            raise ValueError(f"profile {profile.key} has no {phase.value} measurements for the route-ppl allocation")
        if any(lay[phase].capacity is None for lay in route_plan.layers):
            raise ValueError(f"route-ppl needs a route with an eviction method in every {phase.value} layer")
        minimum = max(
            window_floor(
                lay[phase].model_copy(
                    update={"capacity": budget, "params": _fit(lay[phase].method, lay[phase].params, budget)}
                )
            )
            for lay in route_plan.layers
        )
        caps[phase] = dict(enumerate(allocate_ppl(profile.table, phase, budget, minimum)))
    return _route_at(route_plan, budget, caps, f"{route_plan.name}-ppl-b{budget}", "ppl")


def sweep_plans(
    route_plan: Plan,
    budgets: Sequence[int],
    baselines: Sequence[str] | None = None,
    profile: Profile | None = None,
    overrides: Mapping[str, Scope | str] | None = None,
) -> dict[tuple[int | None, str], Plan]:
    """(budget, label) -> plan for every run of a sweep: at each budget b, "route-uniform", "route-ppl"
    (only with a profile) and each baseline alone under its protocol (`protocols.baseline_plan`; default:
    every method with a protocol, whatever the route's scope); then (None, "full"): FullKV, once."""
    budgets = _check_budgets(budgets)
    names = baseline_methods() if baselines is None else list(dict.fromkeys(baselines))
    if not names:
        raise ValueError("a sweep needs at least one baseline (the envelope is their best)")
    for name in names:
        protocol(name, overrides)  # unknown names and bad overrides fail before any run
    layers = route_plan.num_layers
    plans: dict[tuple[int | None, str], Plan] = {}
    for budget in budgets:
        plans[(budget, ROUTE_UNIFORM)] = route_uniform(route_plan, budget)
        if profile is not None:
            plans[(budget, ROUTE_PPL)] = route_ppl(route_plan, budget, profile)
        for name in names:
            plans[(budget, name)] = baseline_plan(name, budget, layers, overrides)
    plans[(None, FULLKV)] = Plan.homogeneous(FULL, None, layers)
    return plans


def sweep(
    runner: ExperimentRunner,
    route_plan: Plan,
    budgets: Sequence[int],
    baselines: Sequence[str] | None = None,
    profile: Profile | None = None,
    overrides: Mapping[str, Scope | str] | None = None,
) -> Report:
    """The route at each budget vs every standalone baseline under its protocol, with FullKV once.

    Per budget b: route-uniform, route-ppl (with a profile), each baseline, the envelope (the best
    baseline at b by the metric's direction) and route-uniform - envelope with a paired bootstrap CI of
    route-uniform vs the envelope's method at b (task scores). The 2b comparison: for every b with 2b
    also swept, route-uniform at b - the envelope at 2b with its CI; the verdict is "matches" when the
    CI's upper end in the better direction is >= 0 (the route at b is not significantly worse than the
    best baseline at 2b), else "falls short". `report.data` (`SweepData`) holds every number."""
    plans = sweep_plans(route_plan, budgets, baselines, profile, overrides)
    budgets = _check_budgets(budgets)
    names = list(dict.fromkeys(name for b, name in plans if b is not None and name not in (ROUTE_UNIFORM, ROUTE_PPL)))
    routes = [ROUTE_UNIFORM] + ([ROUTE_PPL] if profile is not None else [])
    metric, seed = runner.metric, runner.seed
    ids = dict(zip(plans, runner.run_all(list(plans.values()))))
    scores = {key: runner.scores(run_id) for key, run_id in ids.items()}
    score = {key: macro_average(s.tasks) for key, s in scores.items()}

    rows = envelope(
        [{"budget": b, **{label: score[(b, label)] for label in routes + names}} for b in budgets], names, metric
    )
    report = Report(f"sweep: {route_plan.name} ({route_plan.scope.value}) vs standalone baselines ({metric})")
    report.lines += [
        direction_text(metric),
        "route-uniform: the route's methods with capacity b in every layer; "
        + (
            f"route-ppl: the same route with capacities from profile {profile.key}'s PPL allocation"
            if profile is not None
            else "route-ppl omitted: no profile given (--profile enables it)"
        ),
        *protocol_lines(names, overrides),
        f"FullKV (budget-independent, one run {ids[(None, FULLKV)]}): {score[(None, FULLKV)]:.4f}",
    ]
    versus, versus_ppl, double = {}, {}, {}
    for row in rows:
        b, best = row["budget"], row["best baseline"]
        row = dict(row)
        for label in routes:
            result = contrast(scores[(b, label)], scores[(b, best)], metric, seed)
            (versus if label == ROUTE_UNIFORM else versus_ppl)[b] = VersusBaseline.of(result, best)
            row[f"{label} - envelope"] = result.difference
            report.lines.append(
                f"budget {b}: {label} {score[(b, label)]:.4f} - best baseline {best} {row['envelope']:.4f} "
                f"= {_ci(result)}"
            )
        report.rows.append(row)
    pairs = [b for b in budgets if 2 * b in budgets]
    report.lines.append(
        "2b comparison: route-uniform at b vs the best baseline at 2b; matches when the route at b is not "
        "significantly worse (the sample-level test; the minimal detectable difference says how much worse it "
        "could be unseen)" + ("" if pairs else "; no budget b has 2b in the sweep")
    )
    for b in pairs:
        best = next(r["best baseline"] for r in rows if r["budget"] == 2 * b)
        result = contrast(scores[(b, ROUTE_UNIFORM)], scores[(2 * b, best)], metric, seed)
        match = "falls short" if result.verdict() == "worse" else "matches"
        double[b] = AtDoubleBudget(baseline=best, match=match, **Contrast.fields_of(result))
        report.lines.append(f"2b: route-uniform at {b} - best baseline at {2 * b} ({best}) = {_ci(result)}: {match}")
    report.data = SweepData(
        metric=metric,
        direction=direction(metric),
        route=route_plan.name,
        scope=route_plan.scope.value,
        budgets=list(budgets),
        baselines=names,
        routes=routes,
        protocols={n: _protocol_data(n, overrides) for n in names},
        scores={label: {b: score[(b, label)] for b in budgets} for label in routes + names},
        runs={label: {b: ids[(b, label)] for b in budgets} for label in routes + names},
        full=RunScore(plan=plans[(None, FULLKV)].name, run=ids[(None, FULLKV)], score=score[(None, FULLKV)]),
        envelope={r["budget"]: BestBaseline(baseline=r["best baseline"], score=r["envelope"]) for r in rows},
        versus_envelope=versus,
        ppl_versus_envelope=versus_ppl,
        double=double,
    )
    return report


def _protocol_data(method: str, overrides: Mapping[str, Scope | str] | None) -> BaselineProtocol:
    row = protocol(method, overrides)
    return BaselineProtocol(
        scope=row.scope.value, allocation=row.allocation, params=dict(row.params), source=row.source
    )


def _check_budgets(budgets: Sequence[int]) -> list[int]:
    budgets = list(budgets)
    if not budgets:
        raise ValueError("a sweep needs at least one budget")
    bad = [b for b in budgets if isinstance(b, bool) or not isinstance(b, int) or b < 1]
    if bad:
        raise ValueError(f"budgets must be positive whole numbers, got {bad[0]!r}")
    if len(set(budgets)) != len(budgets):
        raise ValueError(f"budgets repeat a value: {budgets}")
    return budgets


def _fit(method: str, params: Mapping[str, Any], capacity: int) -> dict[str, Any]:
    """`params` with every window / sink that would not fit under `capacity` shrunk to a quarter of it
    (the rule of `params_that_fit`, applied to given parameters)."""
    cls = REGISTRY[method]
    out = dict(params)
    for name in cls.below_capacity:
        if out.get(name, cls.defaults()[name]) >= capacity:
            out[name] = max(1, capacity // 4)
    return out


def _route_at(route_plan: Plan, budget: int, caps: dict[Phase, dict[int, int]], name: str, rule: str) -> Plan:
    """The route's methods with the given capacities per active phase and layer (layers not in `caps`
    stay as they are, i.e. full); parameters fitted to `budget`."""
    layers = []
    for i, layer in enumerate(route_plan.layers):
        cells = {phase: layer[phase] for phase in Phase}
        for phase, per_layer in caps.items():
            if i in per_layer:
                cell = cells[phase]
                cells[phase] = cell.model_copy(
                    update={"capacity": per_layer[i], "params": _fit(cell.method, cell.params, budget)}
                )
        layers.append(LayerPlan(prefill=cells[Phase.PREFILL], decode=cells[Phase.DECODE]))
    plan = route_plan.with_layers(
        layers,
        name=name,
        description=f"The route of {route_plan.name} with {rule} capacities averaging {budget}.",
        provenance={
            "built_by": "sweep",
            "route": route_plan.name,
            "capacities": rule,
            "budget": budget,
            "source_provenance": dict(route_plan.provenance),
        },
    )
    return validate_plan(plan, route_plan.num_layers)

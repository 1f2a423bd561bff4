"""The budget sweep (Table 5): a fixed route at several budgets against FullKV and every standalone baseline
under its own protocol, with the per-budget best-baseline envelope."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from polykv.eval.comparing.compare import envelope, macro_average
from polykv.eval.experiments.experiment_runner import (
    FULLKV,
    ROUTE_PPL,
    ROUTE_UNIFORM,
    ROUTES,
    ExperimentRunner,
    _ci,
    contrast,
)
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
from polykv.eval.method_protocols import baseline_methods, baseline_plan, homogeneous_plans, protocol, protocol_lines
from polykv.eval.statistics.contrast import direction, direction_text
from polykv.methods import fit_params, validate_plan
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
                    update={"capacity": budget, "params": fit_params(lay[phase].method, lay[phase].params, budget)}
                )
            )
            for lay in route_plan.layers
        )
        caps[phase] = dict(enumerate(allocate_ppl(profile.table, phase, budget, minimum)))
    return _route_at(route_plan, budget, caps, f"{route_plan.name}-ppl-b{budget}", "ppl")


def matched_label(plan: Plan) -> str:
    """A homogeneous plan's series in a sweep, the same at every budget: method, scope, and native allocation."""
    method = next(layer[phase].method for layer in plan.layers for phase in plan.scope.phases)
    return f"{method}-{plan.scope.value}" + ("-native" if plan.allocation == "native" else "")


def sweep_plans(
    route_plan: Plan,
    budgets: Sequence[int],
    baselines: Sequence[str] | None = None,
    profile: Profile | None = None,
    overrides: Mapping[str, Scope | str] | None = None,
    matched: bool | Sequence[str] = True,
) -> dict[tuple[int | None, str], Plan]:
    """(budget, label) -> plan for every run of a sweep: at each budget b, "route-uniform", "route-ppl"
    (only with a profile), each baseline alone under its protocol (`protocols.baseline_plan`; default:
    every method with a protocol, whatever the route's scope) and, with `matched`, every method alone in the
    route's own scope (`protocols.homogeneous_plans`, labelled by `matched_label`: like with like; a list of
    labels: only those); then (None, "full"): FullKV, once."""
    budgets = _check_budgets(budgets)
    names = baseline_names(baselines)
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
        if matched:
            for plan in homogeneous_plans(route_plan.scope, budget, layers):
                label = matched_label(plan)
                if matched is True or label in matched:
                    plans[(budget, label)] = plan
    plans[(None, FULLKV)] = Plan.homogeneous(FULL, None, layers)
    return plans


def sweep(
    runner: ExperimentRunner,
    route_plan: Plan,
    budgets: Sequence[int],
    baselines: Sequence[str] | None = None,
    profile: Profile | None = None,
    overrides: Mapping[str, Scope | str] | None = None,
    matched: bool | Sequence[str] = True,
) -> Report:
    """The route at each budget vs every method alone in the route's own scope (with `matched`: like with like,
    the primary contrast) and vs every standalone baseline under its protocol (the paper's envelope, across
    protocols wherever a baseline acts in other phases), with FullKV once.

    Per budget b: route-uniform, route-ppl (with a profile), each series, the best homogeneous plan of the scope
    and the envelope (the best baseline) at b by the metric's direction, and route-uniform minus each, with the
    paper's paired bootstrap over tasks and the sample-level test. The 2b comparison: for every b with 2b also
    swept, route-uniform at b against the best of each at 2b; the verdict is the test's ("falls short" when the
    route is significantly worse, "exceeds" when better, else "no significant difference", the minimal
    detectable difference beside it). `report.data` (`SweepData`) holds every number."""
    plans = sweep_plans(route_plan, budgets, baselines, profile, overrides, matched)
    budgets = _check_budgets(budgets)
    names = list(dict.fromkeys(baseline_names(baselines)))
    same = list(dict.fromkeys(name for b, name in plans if b is not None and name not in (*names, *ROUTES)))
    routes = [ROUTE_UNIFORM] + ([ROUTE_PPL] if profile is not None else [])
    metric, seed = runner.metric, runner.seed
    unique = {plan.to_json(): plan for plan in plans.values()}  # a baseline's own protocol may be its scope's too
    made = dict(zip(unique, runner.run_all(list(unique.values()))))
    ids = {key: made[plan.to_json()] for key, plan in plans.items()}
    scores = {key: runner.scores(run_id) for key, run_id in ids.items()}
    score = {key: macro_average(s.tasks) for key, s in scores.items()}

    def best_of(series: list[str]) -> list[dict]:
        return envelope([{"budget": b, **{n: score[(b, n)] for n in routes + series}} for b in budgets], series, metric)

    rows, matched_rows = best_of(names), best_of(same) if same else []
    scope = route_plan.scope.value
    report = Report(f"sweep: {route_plan.name} ({scope}) vs the methods alone ({metric})")
    report.lines += [
        direction_text(metric),
        "route-uniform: the route's methods with capacity b in every layer; "
        + (
            f"route-ppl: the same route with capacities from profile {profile.key}'s PPL allocation"
            if profile is not None
            else "route-ppl omitted: no profile given (--profile enables it)"
        ),
        f"like with like: each method alone in the route's scope ({scope}), the best of them per budget"
        if same
        else "no method alone in the route's scope was run: every comparison below is with the baselines' own "
        "protocols",
        *protocol_lines(names, overrides),
        f"FullKV (budget-independent, one run {ids[(None, FULLKV)]}): {score[(None, FULLKV)]:.4f}",
    ]

    def versus(b: int, label: str, best: str, what: str) -> VersusBaseline:
        result = contrast(scores[(b, label)], scores[(b, best)], metric, seed)
        across = "" if what == "same" else _across(route_plan, plans[(b, best)])
        report.lines.append(
            f"budget {b}: {label} {score[(b, label)]:.4f} - {_BEST[what]} {best} {score[(b, best)]:.4f} "
            f"= {_ci(result)}{across}"
        )
        return VersusBaseline.of(result, best)

    versus_same, versus_envelope, versus_ppl, double, double_same = {}, {}, {}, {}, {}
    for row, same_row in zip(rows, matched_rows or [None] * len(rows)):
        b = row["budget"]
        if same_row is not None:
            versus_same[b] = versus(b, ROUTE_UNIFORM, same_row["best baseline"], "same")
        versus_envelope[b] = versus(b, ROUTE_UNIFORM, row["best baseline"], "envelope")
        if ROUTE_PPL in routes:
            versus_ppl[b] = versus(b, ROUTE_PPL, row["best baseline"], "envelope")
        report.rows.append(
            {
                **row,
                **({"best alone in scope": same_row["best baseline"]} if same_row else {}),
                **({"route-uniform - best in scope": versus_same[b].difference} if same_row else {}),
                "route-uniform - envelope": versus_envelope[b].difference,
                **({"route-ppl - envelope": versus_ppl[b].difference} if b in versus_ppl else {}),
            }
        )
    pairs = [b for b in budgets if 2 * b in budgets]
    report.lines.append(
        "2b comparison: route-uniform at b vs the best at 2b; the sample-level test's verdict, the minimal "
        "detectable difference beside it (no significant difference is no match: it says how large a gap could go "
        "unseen)" + ("" if pairs else "; no budget b has 2b in the sweep")
    )
    for b in pairs:
        for table, best_rows, what in ((double_same, matched_rows, "same"), (double, rows, "envelope")):
            if not best_rows:
                continue
            best = next(r["best baseline"] for r in best_rows if r["budget"] == 2 * b)
            result = contrast(scores[(b, ROUTE_UNIFORM)], scores[(2 * b, best)], metric, seed)
            match = {"worse": "falls short", "better": "exceeds"}.get(result.verdict(), "no significant difference")
            table[b] = AtDoubleBudget(baseline=best, match=match, **Contrast.fields_of(result))
            across = "" if what == "same" else _across(route_plan, plans[(2 * b, best)])
            said = "" if match == "no significant difference" else f": {match}"  # `_ci` ends with the verdict
            report.lines.append(
                f"2b: route-uniform at {b} - {_BEST[what]} at {2 * b} ({best}) = {_ci(result)}{said}{across}"
            )
    series = routes + names + same
    report.data = SweepData(
        metric=metric,
        direction=direction(metric),
        route=route_plan.name,
        scope=scope,
        budgets=list(budgets),
        baselines=names,
        routes=routes,
        protocols={n: _protocol_data(n, overrides) for n in names},
        scores={label: {b: score[(b, label)] for b in budgets} for label in series},
        runs={label: {b: ids[(b, label)] for b in budgets} for label in series},
        full=RunScore(plan=plans[(None, FULLKV)].name, run=ids[(None, FULLKV)], score=score[(None, FULLKV)]),
        envelope={r["budget"]: BestBaseline(baseline=r["best baseline"], score=r["envelope"]) for r in rows},
        versus_envelope=versus_envelope,
        ppl_versus_envelope=versus_ppl,
        double=double,
        matched=same,
        matched_envelope={
            r["budget"]: BestBaseline(baseline=r["best baseline"], score=r["envelope"]) for r in matched_rows
        },
        versus_matched=versus_same,
        double_matched=double_same,
    )
    return report


_BEST = {"same": "the best method alone in the route's scope", "envelope": "the best baseline under its own protocol"}


def _across(route: Plan, other: Plan) -> str:
    """How a comparison's two plans differ in scope, said in the line ("" when they act in the same phases)."""
    if route.scope == other.scope:
        return ""
    return f" (across protocols: the route acts in {route.scope.value}, {other.name} in {other.scope.value})"


def baseline_names(baselines: Sequence[str] | None) -> list[str]:
    return baseline_methods() if baselines is None else list(dict.fromkeys(baselines))


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
                    update={"capacity": per_layer[i], "params": fit_params(cell.method, cell.params, budget)}
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

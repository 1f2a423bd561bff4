"""Controlled experiments, as in the paper. Each creates the runs it needs (through `run_suite`, so
finished runs are reused) and reports from their scores; none scores anything by itself.

  factorial  routing (homogeneous baseline vs TopRank route) x allocation (uniform vs profile-derived)
             at the same total capacity (Table 2). Primary: routing under uniform allocation
             (routed-uniform - homogeneous-uniform) with a paired bootstrap CI over tasks,
             wins/ties/losses and every leave-one-task-out value; secondary: the allocation effect under
             each routing and the interaction.
  placement  the guided route vs K unique random count-matched placements (Table 4 / Figure 4).
             Primary: tie-aware Spearman between the profile score S(rho) and the suite score over the K
             random placements only, one-sided permutation p; secondary (descriptive): the guided
             route's rank among K + 1 and its Monte Carlo p, and its gap to the random mean.
  sweep      a fixed route at several budgets (Table 5): route-uniform, route-ppl (with a
             profile), every standalone baseline under its own protocol (`polykv.eval.protocols`),
             FullKV once, the per-budget best-baseline envelope, route - envelope with a paired CI, and
             whether the route at b matches the best baseline at 2b.

`launch_plans` builds the labelled plans of one launch from the web app (the route at its budgets,
baselines, placements), which a background job (`polykv.jobs`) then runs. `launch_job` builds a background
job that runs one of the experiments above (kind "experiment"); its worker is this module
(`python -m polykv.eval.experiments run <job file> --workspace <workspace>`, started by `polykv.jobs.start`),
which saves the report next to the job (`read_report`).

A run's suite score is the macro-average over tasks of one metric (`compare.METRIC_DIRECTION` says which way
is better; the reports are in the metric's own units, differences are A - B as named). Every report prints
its metric and direction and the protocol it ran, and keeps its numbers in `Report.data` (plain dicts and
lists of Python numbers) for scripts that render them; `Report.to_dict` is its strict-JSON form.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polykv.eval.backends import backend
from polykv.eval.compare import Paired, direction, direction_text, envelope, macro_average, paired, placement_summary
from polykv.eval.protocols import baseline_methods, baseline_plan, protocol, protocol_lines
from polykv.eval.runner import run_suite, run_suites
from polykv.eval.stats import spearman_permutation
from polykv.eval.store import Store
from polykv.eval.unit import Unit
from polykv.methods import REGISTRY, params_that_fit, validate_plan
from polykv.plan import FULL, LayerPlan, Phase, Plan, Scope
from polykv.profile.store import Profile
from polykv.routing import (
    allocate_ppl,
    allocate_uniform,
    plan_from_profile,
    plan_from_route,
    route_score,
    sample_placements,
    scale_budget,
    window_floor,
)

ROUTE_UNIFORM, ROUTE_PPL, FULLKV = "route-uniform", "route-ppl", FULL
PERMUTATIONS = 10_000  # shuffles of the placement control's permutation test


def suite_metrics(suite: str) -> tuple[str, ...]:
    """The task metrics the runs of `suite` report, any of which can score an experiment (fidelity names its
    own; the other suites report one `score`)."""
    from polykv.eval.settings import suite_module

    return tuple(getattr(suite_module(suite), "METRICS", ("score",)))


@dataclass
class ExperimentRunner:
    """Everything an experiment needs to execute its runs: the model, the store, the suite and its settings.
    (Executing one run is `polykv.eval.runner.run_suite`; where runs execute, `polykv.eval.backends`.)"""

    store: Store
    model_name: str
    model: object
    tokenizer: object
    suite: str = "fidelity"
    settings: object = None
    seed: int = 0
    metric: str = "top1"
    progress: Callable[[str], None] | None = None  # told each plan's name before its run starts
    # told (done, total, where) as samples finish within a run (local backend; the callback of `run_suite`)
    on_sample: Callable[[int, int, str], None] | None = None
    backend: str = "local"  # "ray": the runs of an experiment execute in parallel as Ray tasks (`backends.backend`)
    device: str = "cpu"
    # local backend: the runs of one call execute together, sample by sample, in one batch (`run_suites`;
    # equal to one at a time up to float rounding); `progress` is then told once, with the runs' count
    batched: bool = False

    def run(self, plan: Plan) -> str:
        return self.run_all([plan])[0]

    def run_all(self, plans: list[Plan]) -> list[str]:
        chosen = backend(self.backend, waiting=True)  # the scores are read next: a backend that waits for them
        if chosen.name == "local" and self.batched and len(plans) > 1:
            if self.progress is not None:
                self.progress(f"{len(plans)} runs together")
            return run_suites(
                self.store,
                self.model_name,
                self.model,
                self.tokenizer,
                plans,
                self.suite,
                self.settings,
                self.seed,
                progress=self.on_sample,
            )
        if chosen.name == "local":  # this process: the model already loaded, the settings as they are
            ids = []
            for plan in plans:  # one at a time, so that `progress` names the run that `on_sample` reports on
                if self.progress is not None:
                    self.progress(plan.name)
                ids.append(
                    run_suite(
                        self.store,
                        self.model_name,
                        self.model,
                        self.tokenizer,
                        plan,
                        self.suite,
                        self.settings,
                        self.seed,
                        progress=self.on_sample,
                    )
                )
            return ids
        if self.progress is not None:
            for plan in plans:
                self.progress(plan.name)
        units = [Unit.of(self.model_name, plan, self.suite, self.settings, self.seed, self.device) for plan in plans]
        return chosen.run(units, self.store.path)

    def task_scores(self, run_id: str) -> dict[str, float]:
        return {task: values[self.metric] for task, values in self.store.task_scores(run_id).items()}

    def score(self, run_id: str) -> float:
        return macro_average(self.task_scores(run_id))

    @property
    def sign(self) -> int:
        return direction(self.metric)


@dataclass
class Report:
    """What an experiment prints (`rows` as a table, then `lines`) and its numbers as plain data."""

    title: str
    rows: list[dict] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The report as strict JSON data: mapping keys become strings (a sweep's budgets: "16") and NaN
        (an undefined statistic) becomes None, as `json.loads` of a saved report gives them back."""
        return _plain({"title": self.title, "rows": self.rows, "lines": self.lines, "data": self.data}, json_ready=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """A report saved with `to_dict` (ValueError when it is not one)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("title"), str):
            raise ValueError("not an experiment report (no title)")
        rows, lines, numbers = data.get("rows", []), data.get("lines", []), data.get("data", {})
        if not isinstance(rows, list) or not isinstance(lines, list) or not isinstance(numbers, dict):
            raise ValueError("not an experiment report (rows, lines and data are a list, a list and an object)")
        return cls(data["title"], list(rows), [str(line) for line in lines], dict(numbers))


def _plain(value: Any, json_ready: bool = False) -> Any:
    """`value` with numpy scalars and tuples turned into Python ones (so `json.dumps` takes it); with
    `json_ready`, also string keys and None for NaN and infinities (strict JSON)."""
    if isinstance(value, Mapping):
        return {(str(k) if json_ready else k): _plain(v, json_ready) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, json_ready) for v in value]
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        value = value.item()  # a numpy scalar (bool, int or float)
    if json_ready and isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _contrast(result: Paired) -> dict[str, Any]:
    """A paired comparison as plain data; `loto_better` counts leave-one-task-out values in the better
    direction (sign x value > 0)."""
    return {
        "difference": result.difference,
        "low": result.low,
        "high": result.high,
        "replicates": result.replicates,
        "tasks": len(result.table),
        "clusters": result.clusters,
        "wins": result.wins,
        "ties": result.ties,
        "losses": result.losses,
        "leave_one_out": dict(result.leave_one_out),
        "loto_better": sum(1 for v in result.leave_one_out.values() if result.sign * v > 0),
    }


def _ci(result: Paired) -> str:
    return (
        f"{result.difference:+.4f} {result.metric}, 95% paired bootstrap CI [{result.low:+.4f}, {result.high:+.4f}] "
        f"{result.resampling()}"
    )


def _better_interval(result: Paired) -> tuple[float, float]:
    """The CI of A - B turned so that positive means A is better."""
    low, high = sorted((result.sign * result.low, result.sign * result.high))
    return low, high


# ---- factorial (Table 2) --------------------------------------------------------------------------
FACTORIAL_CELLS = ("homogeneous-uniform", "homogeneous-allocated", "routed-uniform", "routed-allocated")


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
    `report.data` holds the cells (run, plan, score) and each contrast (see `_contrast`)."""
    scope = Scope(scope)
    cells = factorial_plans(profile, scope, budget, baseline, statistic, allocation)
    ids = dict(zip(cells, runner.run_all(list(cells.values()))))
    tasks = {cell: runner.task_scores(run_id) for cell, run_id in ids.items()}
    score = {cell: macro_average(t) for cell, t in tasks.items()}
    metric, seed = runner.metric, runner.seed
    h_u, h_a, r_u, r_a = (tasks[c] for c in FACTORIAL_CELLS)

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

    routing_uniform = paired(r_u, h_u, metric, seed)
    allocation_homogeneous = paired(h_a, h_u, metric, seed)
    allocation_routed = paired(r_a, r_u, metric, seed)
    shared = sorted(set(h_u) & set(h_a) & set(r_u) & set(r_a))
    interaction = paired({t: r_a[t] - r_u[t] for t in shared}, {t: h_a[t] - h_u[t] for t in shared}, metric, seed)

    primary = _contrast(routing_uniform)
    loto = ", ".join(f"{t} {v:+.4f}" for t, v in routing_uniform.leave_one_out.items()) or "none (one task)"
    report.lines += [
        direction_text(metric),
        f"protocol: homogeneous cells run {baseline} in every {scope.value} layer at the routed cells' capacities "
        f"(fixed allocation, the profile's parameters); routed cells: TopRank by {statistic} from profile "
        f"{profile.key}; "
        f"every cell keeps {budget} tokens per layer on average",
        f"primary: routing under uniform allocation (routed-uniform - homogeneous-uniform): {_ci(routing_uniform)}; "
        f"wins / ties / losses {routing_uniform.wins} / {routing_uniform.ties} / {routing_uniform.losses}",
        f"primary leave-one-task-out (routed-uniform - homogeneous-uniform): {loto}; {primary['loto_better']} of "
        f"{len(routing_uniform.leave_one_out)} in the better direction",
        f"secondary: allocation effect under homogeneous routing ({allocation} - uniform): "
        f"{_ci(allocation_homogeneous)}",
        f"secondary: allocation effect under TopRank routing ({allocation} - uniform): {_ci(allocation_routed)}",
        f"secondary: interaction ((r_a - r_u) - (h_a - h_u)): {_ci(interaction)}",
    ]
    report.data = {
        "experiment": "factorial",
        "metric": metric,
        "direction": direction(metric),
        "scope": scope.value,
        "budget": budget,
        "baseline": baseline,
        "statistic": statistic,
        "allocation": allocation,
        "cells": {cell: {"plan": cells[cell].name, "run": ids[cell], "score": score[cell]} for cell in cells},
        "routing_uniform": primary,
        "allocation_homogeneous": _contrast(allocation_homogeneous),
        "allocation_routed": _contrast(allocation_routed),
        "interaction": _contrast(interaction),
    }
    report.data = _plain(report.data)
    return report


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
    best baseline at 2b), else "falls short". `report.data` holds every number."""
    plans = sweep_plans(route_plan, budgets, baselines, profile, overrides)
    budgets = _check_budgets(budgets)
    names = list(dict.fromkeys(name for b, name in plans if b is not None and name not in (ROUTE_UNIFORM, ROUTE_PPL)))
    routes = [ROUTE_UNIFORM] + ([ROUTE_PPL] if profile is not None else [])
    metric, seed = runner.metric, runner.seed
    ids = dict(zip(plans, runner.run_all(list(plans.values()))))
    tasks = {key: runner.task_scores(run_id) for key, run_id in ids.items()}
    score = {key: macro_average(t) for key, t in tasks.items()}

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
            result = paired(tasks[(b, label)], tasks[(b, best)], metric, seed)
            (versus if label == ROUTE_UNIFORM else versus_ppl)[b] = {"baseline": best, **_contrast(result)}
            row[f"{label} - envelope"] = result.difference
            report.lines.append(
                f"budget {b}: {label} {score[(b, label)]:.4f} - best baseline {best} {row['envelope']:.4f} "
                f"= {_ci(result)} ({_verdict(result)})"
            )
        report.rows.append(row)
    pairs = [b for b in budgets if 2 * b in budgets]
    report.lines.append(
        "2b comparison: route-uniform at b vs the best baseline at 2b; matches when the 95% CI's upper "
        "end in the better direction is >= 0 (the route at b is not significantly worse)"
        + ("" if pairs else "; no budget b has 2b in the sweep")
    )
    for b in pairs:
        best = next(r["best baseline"] for r in rows if r["budget"] == 2 * b)
        result = paired(tasks[(b, ROUTE_UNIFORM)], tasks[(2 * b, best)], metric, seed)
        verdict = "matches" if _better_interval(result)[1] >= 0 else "falls short"
        double[b] = {"baseline": best, "verdict": verdict, **_contrast(result)}
        report.lines.append(f"2b: route-uniform at {b} - best baseline at {2 * b} ({best}) = {_ci(result)}: {verdict}")
    report.data = {
        "experiment": "sweep",
        "metric": metric,
        "direction": direction(metric),
        "route": route_plan.name,
        "scope": route_plan.scope.value,
        "budgets": list(budgets),
        "baselines": names,
        "routes": routes,
        "protocols": {n: _protocol_data(n, overrides) for n in names},
        "scores": {label: {b: score[(b, label)] for b in budgets} for label in routes + names},
        "runs": {label: {b: ids[(b, label)] for b in budgets} for label in routes + names},
        "full": {"run": ids[(None, FULLKV)], "score": score[(None, FULLKV)]},
        "envelope": {r["budget"]: {"baseline": r["best baseline"], "score": r["envelope"]} for r in rows},
        "versus_envelope": versus,
        "ppl_versus_envelope": versus_ppl,
        "double": double,
    }
    report.data = _plain(report.data)
    return report


def _protocol_data(method: str, overrides: Mapping[str, Scope | str] | None) -> dict[str, Any]:
    row = protocol(method, overrides)
    return {"scope": row.scope.value, "allocation": row.allocation, "params": dict(row.params), "source": row.source}


def _verdict(result: Paired) -> str:
    low, high = _better_interval(result)
    return "route better" if low > 0 else "route worse" if high < 0 else "no significant difference"


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


# ---- launches from the web app --------------------------------------------------------------------
def plan_budget(plan: Plan) -> int | None:
    """The plan's average capacity over its active phases (None when no layer has a capacity)."""
    averages = [plan.summary().phases[p].average_capacity for p in plan.scope.phases]
    averages = [a for a in averages if a is not None]
    return round(sum(averages) / len(averages)) if averages else None


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
                                              (`protocols.baseline_plan`)
      {"series": "placement", "index": i}     k count-matched random placements of the plan's route
    The unscaled plan is also labelled {"role": "guided"} when placements are asked for."""
    baselines = list(baselines or [])
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
        out += [({"series": name, "budget": own}, baseline_plan(name, own, layers, overrides)) for name in baselines]
    else:
        if own is None:
            raise ValueError("the plan keeps every token (no capacity), so it cannot be rescaled to budgets")
        for b in _check_budgets(budgets):
            out.append(({"series": "route", "budget": b}, scale_budget(plan, b)))
            out += [({"series": name, "budget": b}, baseline_plan(name, b, layers, overrides)) for name in baselines]
    if placements:
        out += [
            ({"series": "placement", "index": i}, p) for i, p in enumerate(placement_plans(plan, placements, seed)[1:])
        ]
    return out


# ---- helpers --------------------------------------------------------------------------------------
def _active_phase(plan: Plan) -> Phase:
    if plan.scope is Scope.BOTH:
        raise ValueError("the placement control takes a single-phase plan (scope prefill or decode)")
    return plan.scope.phases[0]


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


def _placed(plan: Plan, phase: Phase, route: list[str], name: str) -> Plan:
    """The same capacities and parameters, methods permuted over the layers."""
    params = {lay[phase].method: lay[phase].params for lay in plan.layers}
    layers = [
        LayerPlan(**{phase.value: lay[phase].model_copy(update={"method": m, "params": params[m]})})
        for lay, m in zip(plan.layers, route)
    ]
    return plan.with_layers(layers, name=name, provenance={"built_by": "placement", "guided": plan.name})


# ---- experiments as background jobs (`polykv.jobs`, kind "experiment") ------------------------------------
def launch_job(
    workspace: Path,
    model: str,
    device: str,
    experiment: str,
    *,
    profile: str,
    scope: str,
    budget: int,
    budgets: Sequence[int] | None = None,
    baseline: str | None = None,
    baselines: Sequence[str] | None = None,
    statistic: str = "cosine",
    allocation: str = "uniform",
    k: int = 0,
    suite: str = "fidelity",
    settings: Mapping[str, Any] | None = None,
    metric: str = "top1",
    seed: int = 0,
    title: str | None = None,
):
    """The background job (`polykv.jobs.experiment_job`, not started) that runs `experiment` (factorial,
    placement or sweep) of `model` with these arguments. The route (the placement's guided plan, the
    sweep's fixed route) is TopRank by `statistic` from `profile` (a key in <workspace>/profiles or a path)
    in `scope` at `budget` with `allocation` capacities; the factorial's allocated arm is `allocation`.
    Everything is checked before anything runs in the background: the description, the profile (this
    model's), the settings, the metric (one the suite reports) and every plan the experiment would run.
    JobError or ValueError (one line) when not."""
    from polykv import jobs

    spec = {
        "name": experiment,
        "profile": str(profile),
        "scope": scope,
        "budget": budget,
        "budgets": list(budgets or []),
        "baseline": baseline,
        "baselines": None if baselines is None else list(baselines),
        "statistic": statistic,
        "allocation": allocation,
        "k": k,
        "suite": suite,
        "settings": dict(settings or {}),
        "metric": metric,
        "seed": seed,
    }
    job = jobs.experiment_job(model, device, spec, title or "")
    loaded, _, plans, _ = job_experiment(job.experiment, model, Path(workspace))
    runs = f"{len(plans)} run{'s' * (len(plans) > 1)}"
    job.title = title or f"{experiment} · {loaded.key} · {scope} b{budget} on {suite} ({metric}, {runs})"
    return job


def profile_for_job(value: str, workspace: Path, model: str) -> Profile:
    """The profile a job names: a key in <workspace>/profiles, else a path; it must be `model`'s."""
    from polykv.errors import JobError
    from polykv.profile.store import profile_named

    profile = profile_named(value, workspace)
    if profile.meta.model != model:
        raise JobError(f"profile {profile.key} was measured on {profile.meta.model!r}, not on {model!r}")
    return profile


def job_experiment(spec: Mapping[str, Any], model: str, workspace: Path):
    """(profile, suite settings, the plans it runs, a call that runs it on an `ExperimentRunner` and returns
    its Report) of an experiment job's description: what `launch_job` checks and `run_job` runs."""
    from polykv.errors import JobError
    from polykv.eval.settings import suite_settings

    profile = profile_for_job(spec["profile"], workspace, model)
    settings = suite_settings(spec["suite"], spec["settings"])
    metrics = suite_metrics(spec["suite"])
    if spec["metric"] not in metrics:
        raise JobError(f"the {spec['suite']} suite reports {', '.join(metrics)}, not {spec['metric']!r}")
    name, scope, budget, statistic, k = spec["name"], spec["scope"], spec["budget"], spec["statistic"], spec["k"]
    if name == "factorial":
        args = (profile, scope, budget, spec["baseline"], statistic, spec["allocation"])
        plans = list(factorial_plans(*args).values())

        def call(runner: ExperimentRunner) -> Report:
            return factorial(runner, *args)
    else:
        route = plan_from_profile(profile, scope, budget, statistic, spec["allocation"])
        if name == "placement":
            plans = placement_plans(route, k, spec["seed"])

            def call(runner: ExperimentRunner) -> Report:
                return placement(runner, profile, route, k, statistic)
        else:
            budgets, baselines = spec["budgets"], spec["baselines"]
            plans = list(sweep_plans(route, budgets, baselines, profile).values())

            def call(runner: ExperimentRunner) -> Report:
                return sweep(runner, route, budgets, baselines, profile)

    for plan in plans:
        validate_plan(plan, profile.num_layers)
    return profile, settings, plans, call


def run_job(job, workspace: Path, store: Store, report: Callable[..., dict], activate: Callable[[str | None], None]):
    """The work of an experiment job's worker (`polykv.jobs` keeps its state, log and cancel): load the
    model, run the experiment through an `ExperimentRunner` on the job's store, save its report. Progress:
    the runs done plus the fraction of the run under way, over the experiment's runs; runs found finished
    in the store (a resumed job) are where it starts, so its ETA counts only this worker's pace."""
    from polykv import jobs
    from polykv.eval.runner import run_id_for
    from polykv.files import atomic_write_json
    from polykv.models import load_model

    spec = job.experiment
    _, settings, plans, call = job_experiment(spec, job.model, workspace)
    run_ids = {p.name: run_id_for(job.model, p, spec["suite"], settings.to_dict(), spec["seed"]) for p in plans}
    found = store.progress(list(run_ids.values()))
    parts = [1.0 if status == "finished" else min(1.0, d / t) if t else 0.0 for d, t, status in found.values()]
    done = sum(parts) / len(plans)
    report(start_fraction=done, fraction=done, message="loading the model")
    model, tokenizer = load_model(job.model, device=job.device)  # quiet: no progress bars in the log
    at = {"index": -1, "name": ""}  # the run under way (the runner names each plan before its run)

    def before(name: str) -> None:
        at["index"], at["name"] = at["index"] + 1, name
        activate(run_ids.get(name))
        fraction = max(report()["fraction"], min(1.0, at["index"] / len(plans)))  # never back: found runs pass again
        report(fraction=fraction, message=f"run {at['index'] + 1}/{len(plans)} {name}: building samples")

    def on_sample(count: int, total: int, where: str) -> None:
        fraction = max(report()["fraction"], min(1.0, (at["index"] + count / total) / len(plans)))
        report(fraction=fraction, message=f"run {at['index'] + 1}/{len(plans)} {at['name']}: {count}/{total} {where}")

    runner = ExperimentRunner(
        store,
        job.model,
        model,
        tokenizer,
        spec["suite"],
        settings,
        spec["seed"],
        spec["metric"],
        progress=before,
        on_sample=on_sample,
        device=job.device,
    )
    result = call(runner)
    activate(None)
    path = atomic_write_json(jobs.report_path(workspace, job.id), result.to_dict())
    report(result={"report": str(path), "title": result.title}, message="report written")


def read_report(job, workspace: Path) -> Report:
    """The report a finished experiment job saved; JobError (one line) when it has none or it is damaged."""
    from polykv import jobs
    from polykv.errors import JobError
    from polykv.files import read_json

    path = jobs.report_path(workspace, job.id)
    if not os.path.lexists(path):
        raise JobError(f"job {job.id} has no report yet")
    data = read_json(path, "experiment report", max_bytes=jobs.MAX_REPORT_BYTES, error=JobError)
    try:
        return Report.from_dict(data)
    except ValueError as exc:
        raise JobError(f"{path}: {exc}") from None


def job_main(argv: list[str] | None = None) -> int:
    """`python -m polykv.eval.experiments run <workspace>/jobs/<id>.json --workspace <workspace>`: the
    worker of an experiment job (what `polykv.jobs.start` runs for one)."""
    from polykv import jobs

    return jobs.main(argv, experiment=run_job, prog="polykv.eval.experiments")


if __name__ == "__main__":
    import sys

    from polykv.eval.experiments import job_main as main  # the module itself, not this __main__ copy of it

    sys.exit(main())

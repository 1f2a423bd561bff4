"""The plan search on text, end to end: its one entry point (`run_text_search`, which `polykv search` and the app's
search job both call) and what it runs.

`search_budget` runs one budget: TopRank (from the profile, uniform capacities), every homogeneous plan of the
scope at the same budget (fixed, and native where the method has its own layer rule), the best of them chosen on
the *search* sequences, the local search from TopRank and from the best fixed homogeneous plan, then the verdict on
the *held-out* sequences (`held_out_verdict`: each plan on every held-out sequence, compared pairwise by a paired
bootstrap over sequences). `build_report` runs several budgets on one pair of sequence sets and returns the typed
report (`polykv.search.text.report.SearchReport`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polykv.eval.method_protocols import homogeneous_plans
from polykv.methods import fit_params
from polykv.plan import Phase, Plan, Scope
from polykv.search.hooks import SearchHooks
from polykv.search.local_search import Progress, SearchResult, SearchSettings, search, with_provenance
from polykv.search.moves import base_params
from polykv.search.objective import Objective, SearchSequences
from polykv.search.report_parts import Machine, ProfileRef, SearchRecord, created_now
from polykv.search.text.report import (
    CONTRASTS,
    FORMAT,
    METRICS,
    VERSION,
    HeldOutContrast,
    HeldOutPlan,
    HeldOutVerdict,
    SearchReport,
    SequenceScores,
    SequencesRecord,
    TextBudget,
    held_out_contrast,
    markdown,
)

AUTO_PROFILE_SEQUENCES = 8  # a search's own text profile ("auto"): enough to rank moves, minutes on a laptop


@dataclass(frozen=True)
class TextSearchSettings:
    """A text search: its scope and budgets (average capacity per layer), the executions a budget's search may run,
    its sequences (search and held-out, `max_tokens` each), the objective's metric, the statistic ranking moves."""

    scope: Scope | str
    budgets: tuple[int, ...]
    evaluations: int = 800
    seed: int = 0
    search_sequences: int = 16
    held_out: int = 48
    max_tokens: int = 512
    candidates: int = 8
    metric: str = "kl"
    statistic: str = "dppl"


# ---- the held-out verdict -------------------------------------------------------------------------------
def held_out_verdict(objective: Objective, plans: Mapping[str, Plan], seed: int = 0) -> HeldOutVerdict:
    """Every plan on every held-out sequence, then the CONTRASTS among the roles present."""
    indices = range(len(objective))
    scores: dict[str, dict[str, dict[str, float]]] = {m: {} for m in METRICS}
    table = {}
    for role, plan in plans.items():
        per = objective.scores(plan, indices)
        for metric in METRICS:
            scores[metric][role] = {f"{i:03d}": getattr(s, metric) for i, s in zip(indices, per)}
        mean_nll = sum(s.nll for s in per) / len(per)
        table[role] = HeldOutPlan(
            name=plan.name,
            kl=sum(s.kl for s in per) / len(per),
            top1=sum(s.top1 for s in per) / len(per),
            ppl=math.exp(mean_nll),  # geometric mean of the per-sequence perplexities
            per_sequence=[SequenceScores(kl=s.kl, top1=s.top1, nll=s.nll) for s in per],
        )
    reference = [objective.reference(i)[2] for i in indices]
    contrasts = [
        HeldOutContrast(**held_out_contrast(a, b, metric, scores[metric], seed))
        for a, b in CONTRASTS
        if a in plans and b in plans
        for metric in METRICS
    ]
    return HeldOutVerdict(
        sequences=len(objective),
        plans=table,
        fullkv_ppl=math.exp(sum(reference) / len(reference)),
        contrasts=contrasts,
    )


# ---- one budget, end to end ----------------------------------------------------------------------------
def toprank_plan(profile, scope: Scope | str, budget: int, statistic: str = "dppl") -> Plan:
    """TopRank by `statistic` in each active phase with `budget` tokens in every layer, the profile's
    parameters fitted to the budget (as `plan_from_profile` with uniform capacities, which refuses a budget
    under a window the profile measured with; the sweep's `route_uniform` fits them the same way)."""
    from polykv.routing import plan_from_route, toprank
    from polykv.routing.toprank import route_score

    scope = Scope(scope)
    profile.check_current(scope.phases)
    layers = profile.num_layers
    routes = {p: toprank(profile.table, p, statistic, layers) for p in scope.phases}
    measured = profile.meta.method_params
    methods = {m for route in routes.values() for m in route}
    return plan_from_route(
        routes.get(Phase.PREFILL),
        routes.get(Phase.DECODE),
        [budget] * layers if Phase.PREFILL in routes else None,
        [budget] * layers if Phase.DECODE in routes else None,
        scope,
        params={m: fit_params(m, measured.get(m, {}), budget) for m in methods},
        name=f"toprank-{statistic}-uniform-{scope.value}-b{budget}",
        description=f"TopRank by {statistic} from profile {profile.key}; {budget} tokens in every layer.",
        provenance={
            "built_by": "toprank",
            "profile": profile.key,
            "profile_model": profile.meta.model,
            "b_cal": profile.meta.b_cal,
            "statistic": statistic,
            "allocation": "uniform",
            "budget": budget,
            "route_score": {p.value: route_score(routes[p], profile.table, p, statistic) for p in scope.phases},
        },
    )


@dataclass
class BudgetResult:
    budget: int
    search: SearchResult
    plan: Plan  # the searched plan with its provenance
    toprank: Plan
    homogeneous: Plan  # the best homogeneous plan on the search sequences
    homogeneous_scores: dict[str, float]  # every homogeneous plan's J on the search sequences
    verdict: HeldOutVerdict
    seconds: float
    selection_evaluations: int  # executions spent choosing the best homogeneous plan

    def record(self) -> TextBudget:
        """The budget as the report keeps it."""
        return TextBudget(
            budget=self.budget,
            seconds=self.seconds,
            search=SearchRecord.of(self.search),
            plan=self.plan,
            toprank=self.toprank,
            homogeneous=self.homogeneous,
            homogeneous_scores=dict(self.homogeneous_scores),
            selection_evaluations=self.selection_evaluations,
            verdict=self.verdict,
        )


def search_budget(
    search_objective: Objective,
    held_out: Objective,
    profile,
    scope: Scope | str,
    settings: SearchSettings,
    start: Plan | None = None,
    progress: Progress | None = None,
    provenance: Mapping[str, Any] | None = None,
    on_trace=None,
) -> BudgetResult:
    """TopRank, the best homogeneous plan (chosen on the search sequences) and the search from both (and
    from `start`, a plan of the search space, when given) at `settings.budget`; then the held-out verdict."""
    started = time.perf_counter()
    scope = Scope(scope)
    budget = settings.budget
    toprank = toprank_plan(profile, scope, budget, settings.statistic)
    params = base_params([toprank], profile)
    before = search_objective.executions
    candidates = homogeneous_plans(scope, budget, toprank.num_layers, params)
    scores = {plan.name: search_objective.value(plan) for plan in candidates}
    best = min(candidates, key=lambda p: (scores[p.name], p.name))
    best_fixed = min((p for p in candidates if p.allocation == "fixed"), key=lambda p: (scores[p.name], p.name))
    selection = search_objective.executions - before
    starts = [toprank, best_fixed] + ([start] if start is not None else [])
    result = search(search_objective, starts, settings, profile, progress, on_trace)
    plan = with_provenance(
        result,
        f"search-{result.metric}-{scope.value}-b{budget}",
        {
            "profile": profile.key,
            "statistic": settings.statistic,
            "scope": scope.value,
            "toprank": toprank.name,
            "homogeneous": best.name,
            **dict(provenance or {}),
        },
    )
    verdict = held_out_verdict(held_out, {"searched": plan, "toprank": toprank, "homogeneous": best}, settings.seed)
    return BudgetResult(budget, result, plan, toprank, best, scores, verdict, time.perf_counter() - started, selection)


def build_report(
    model,
    model_name: str,
    sequences: SearchSequences,
    profile,
    scope: Scope | str,
    budgets: Sequence[int],
    evaluations: int = 800,
    seed: int = 0,
    metric: str = "kl",
    statistic: str = "dppl",
    candidates: int = 8,
    command: str = "",
    start: Plan | None = None,
    on_budget=None,
    on_step: Progress | None = None,
    on_trace=None,
) -> tuple[SearchReport, list[Plan]]:
    """The search at every budget on one pair of sequence sets: (the report, the searched plans).
    `on_budget(budget)` is told when a budget starts; `on_step` sees the search."""
    started = time.perf_counter()
    scope = Scope(scope)
    search_objective = Objective(model, sequences.search, sequences.continuation, metric)
    held_out = Objective(model, sequences.held_out, sequences.continuation, metric)
    results = []
    for budget in budgets:
        if on_budget is not None:
            on_budget(budget)
        settings = SearchSettings(
            budget=budget, evaluations=evaluations, candidates=candidates, seed=seed, statistic=statistic
        )
        results.append(
            search_budget(
                search_objective,
                held_out,
                profile,
                scope,
                settings,
                start,
                on_step,
                {"model": model_name, "search_sequences": sequences.search_corpus["fingerprint"]},
                on_trace,
            )
        )
    report = SearchReport(
        format=FORMAT,
        version=VERSION,
        model=model_name,
        scope=scope.value,
        metric=metric,
        statistic=statistic,
        seed=seed,
        evaluations=evaluations,
        candidates=candidates,
        budgets=[r.record() for r in results],
        profile=ProfileRef(key=profile.key, b_cal=profile.meta.b_cal),
        sequences=SequencesRecord.of(sequences),
        command=command,
        created=created_now(),
        machine=Machine.here(),
        seconds=time.perf_counter() - started,
    )
    return report, [r.plan for r in results]


# ---- the entry point ----------------------------------------------------------------------------------------
def run_text_search(
    model,
    tokenizer,
    model_name: str,
    profile,
    settings: TextSearchSettings,
    *,
    start: Plan | None = None,
    profiles: Path | None = None,
    out: Path | None = None,
    report_file: Path | None = None,
    markdown_file: Path | None = None,
    command: str = "",
    backend: str = "local",
    device: str = "cpu",
    started: float | None = None,
    hooks: SearchHooks = SearchHooks(),
) -> tuple[SearchReport, list[Plan]]:
    """The text search, end to end: (the report, the searched plans). `profile` ranks the moves and gives TopRank:
    a loaded profile, or "auto" (the searched scope on AUTO_PROFILE_SEQUENCES text sequences, computed into
    `profiles` once and reused). The sequences are drawn, then every budget runs (`build_report`, from `start` too),
    its candidates on `backend` (`polykv.search.parallel`; Ray started here unless it runs). Written: with `out`,
    the plans, report.json and report.md there; the report to `report_file`, its Markdown to `markdown_file`
    when given. `started` (a perf_counter reading; default: now) is the clock of `first_candidate_seconds`."""
    from polykv.files import atomic_write_text
    from polykv.search.objective import build_sequences, executing
    from polykv.search.parallel import executor, init_ray

    started = time.perf_counter() if started is None else started
    scope = Scope(settings.scope)
    if isinstance(profile, str) and profile == "auto":
        from polykv.profile.build import build_profile
        from polykv.profile.corpus import CorpusSpec, default_sources

        if profiles is None:
            raise ValueError('a search with profile "auto" needs the folder its profile goes to (profiles)')
        hooks.tell_stage("profile")
        corpus = CorpusSpec(
            sources=default_sources(model_name), num_sequences=AUTO_PROFILE_SEQUENCES, max_tokens=settings.max_tokens
        )
        profile = build_profile(
            model_name, model, tokenizer, profiles, corpus, scopes=tuple(scope.phases), progress=hooks.profile
        )
    hooks.tell_stage("sequences")
    sequences = build_sequences(
        tokenizer,
        model,
        model_name,
        search=settings.search_sequences,
        held_out=settings.held_out,
        max_tokens=settings.max_tokens,
        seed=settings.seed,
    )
    first_step: list[float] = []  # when the first candidate was scored (start-up: load, profile, starts)

    def on_step(used: int, total: int, where: str) -> None:
        if not first_step:
            first_step.append(time.perf_counter() - started)
        if hooks.step is not None:
            hooks.step(used, total, where)

    started_ray = False
    if backend == "ray":
        import ray

        started_ray = not ray.is_initialized()
        init_ray()
    try:
        with executing(executor(backend, model_name, device)):
            report, plans = build_report(
                model,
                model_name,
                sequences,
                profile,
                scope,
                settings.budgets,
                evaluations=settings.evaluations,
                seed=settings.seed,
                metric=settings.metric,
                statistic=settings.statistic,
                candidates=settings.candidates,
                command=command,
                start=start,
                on_budget=hooks.budget,
                on_step=on_step,
                on_trace=hooks.trace,
            )
    finally:
        if started_ray:
            ray.shutdown()
    report.first_candidate_seconds = first_step[0] if first_step else None  # start-up, model load included
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for plan in plans:
            plan.save(out / f"{plan.name}.json")
        report_file = report_file or out / "report.json"
        markdown_file = markdown_file or out / "report.md"
    if report_file is not None:
        report.save(report_file)
    if markdown_file is not None:
        atomic_write_text(markdown_file, markdown(report))
    return report, plans


__all__ = [
    "AUTO_PROFILE_SEQUENCES",
    "BudgetResult",
    "TextSearchSettings",
    "build_report",
    "held_out_verdict",
    "run_text_search",
    "search_budget",
    "toprank_plan",
]

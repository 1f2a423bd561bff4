"""Plans for a workload: searched on the workload's calibration samples, judged on its held-out samples.

`workload_report` runs, at every budget b (average tokens per layer, the searched scope's phases):
  1. the contenders, each built or chosen on the *search* samples (calibration split,
     `polykv.eval.workloads.workload`), scored by answer_nll (`polykv.search.workload.objective`):
       toprank-workload  TopRank by danswer from the workload profile, b tokens in every layer;
       toprank-text      TopRank from a text profile (when one is given), b tokens in every layer;
       homogeneous       the best one-method plan of the scope at b (fixed or native allocation);
       envelope          the best of the nine baselines, each under its own protocol (its phases, its
                         allocation: as the sweep runs them, `polykv.eval.method_protocols`);
       searched          the local search (`polykv.search.local_search`) from toprank-workload and the best fixed
                         homogeneous plan, moves ranked by the workload profile's danswer;
  2. the verdict: every contender and FullKV evaluated by the suite itself on the *held-out* samples (the
     evaluation split: what `polykv eval` draws at the seed), generating and scoring (mode both: accuracy
     and answer_nll), on the searched tasks and on the transfer tasks (tasks the plan never saw). Each
     contender against the envelope, and the searched plan against each other contender, sample by sample:
     the sign-flip permutation test, the within-task bootstrap interval and the minimal detectable
     difference at 80% power (`polykv.eval.statistics.samples`), and per-sample wins, ties and losses.
The runs are kept in `<out>/results.sqlite` (every sample's answer readable with `polykv runs show`).

`run_workload_search`, which `polykv search --objective answer_nll` and the app's search job both call, draws the
samples (`polykv.search.workload.samples`), computes the workload profile when asked for "auto", runs
`workload_report` and writes the report (`polykv.search.workload.report.WorkloadReport`), its page and the plans.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from polykv.eval.method_protocols import homogeneous_plans
from polykv.eval.workloads.competence import COMPETENCE_THRESHOLD
from polykv.kv_memory import kv_dimensions
from polykv.plan import FULL, Plan, Scope
from polykv.search.hooks import SearchHooks
from polykv.search.local_search import SearchSettings, search, with_provenance
from polykv.search.moves import base_params
from polykv.search.objective import plan_key
from polykv.search.report_parts import Machine, ProfileRef, SearchRecord, created_now
from polykv.search.text.run import toprank_plan
from polykv.search.workload.objective import METRIC, AnswerObjective
from polykv.search.workload.report import (
    FORMAT,
    VERSION,
    BudgetSeconds,
    Competence,
    KVDimensions,
    TextProfileRef,
    WorkloadBudget,
    WorkloadReport,
)
from polykv.search.workload.samples import WorkloadSamples, build_workload_profile, draw_samples, verdict_settings
from polykv.search.workload.verdict import FAMILIES, competent_families, majority_method, verdict
from polykv.workspace import results_path

PILOT_SAMPLES = 10  # held-out samples per task FullKV generates on for the competence rule (the study's pilot)


def _best(objective: AnswerObjective, plans: Sequence[Plan]) -> tuple[Plan, dict[str, float]]:
    values = dict(zip((p.name for p in plans), objective.values(plans)))
    return min(plans, key=lambda p: (values[p.name], p.name)), values


def envelope_plans(budget: int, num_layers: int) -> list[Plan]:
    """The nine baselines at `budget`, each under its own protocol (as the sweep runs them)."""
    from polykv.eval.method_protocols import baseline_methods, baseline_plan

    return [baseline_plan(m, budget, num_layers) for m in baseline_methods()]


@dataclasses.dataclass
class Chosen:
    """What chose a budget's contenders on the search samples, and what the search did."""

    homogeneous_scores: dict[str, float]
    envelope_scores: dict[str, float]
    search: SearchRecord
    search_values: dict[str, float]  # every role's answer_nll on the search samples
    seconds: float


def contenders(
    objective: AnswerObjective,
    workload_profile,
    text_profile,
    scope: Scope,
    settings: SearchSettings,
    text_statistic: str = "dppl",
    on_step=None,
    on_trace=None,
) -> tuple[dict[str, Plan], Chosen]:
    """Step 1 of the module docstring at one budget: {role: plan} and what chose them (scores on the search
    samples, the search's result)."""
    budget, started = settings.budget, time.perf_counter()
    toprank = toprank_plan(workload_profile, scope, budget, "danswer")
    toprank = toprank.model_copy(update={"name": f"toprank-workload-{scope.value}-b{budget}"})
    text = None if text_profile is None else toprank_plan(text_profile, scope, budget, text_statistic)
    params = base_params([toprank], workload_profile)
    homogeneous = homogeneous_plans(scope, budget, toprank.num_layers, params)
    baselines = envelope_plans(budget, toprank.num_layers)
    # every plan chosen from, scored in one pass per sample (the starts of the search are then cached)
    objective.values([toprank, *([text] if text else []), *homogeneous, *baselines])
    best_homogeneous, homogeneous_values = _best(objective, homogeneous)
    best_fixed = min((p for p in homogeneous if p.allocation == "fixed"), key=lambda p: homogeneous_values[p.name])
    envelope, envelope_values = _best(objective, baselines)
    found = search(objective, [toprank, best_fixed], settings, workload_profile, on_step, on_trace)
    searched = with_provenance(
        found,
        f"search-answer_nll-{scope.value}-b{budget}",
        {"profile": workload_profile.key, "statistic": "danswer", "scope": scope.value, "workload": True},
    )
    plans = {"searched": searched, "toprank-workload": toprank}
    if text is not None:
        plans["toprank-text"] = text
    plans.update({"homogeneous": best_homogeneous, "envelope": envelope})
    from polykv.models import layer_windows

    majority = majority_method(toprank, layer_windows(objective.model))  # where the methods act
    anchor = next((p for p in homogeneous if p.allocation == "fixed" and majority_method(p) == majority), None)
    tova = next((p for p in baselines if majority_method(p) == "tova"), None)
    plans.update({role: plan for role, plan in (("anchor", anchor), ("tova", tova)) if plan is not None})
    chosen = Chosen(
        homogeneous_scores=homogeneous_values,
        envelope_scores=envelope_values,
        search=SearchRecord.of(found),
        search_values={role: objective.value(plan) for role, plan in plans.items()},
        seconds=time.perf_counter() - started,
    )
    return plans, chosen


def workload_report(
    model,
    model_name: str,
    tokenizer,
    samples: WorkloadSamples,
    workload_profile,
    text_profile,
    scope: Scope | str,
    budgets: Sequence[int],
    store,
    evaluations: int = 200,
    candidates: int = 8,
    seed: int = 0,
    text_statistic: str = "dppl",
    command: str = "",
    say: Callable[[str], None] = lambda message: None,
    on_step=None,
    on_sample=None,
    workers: int = 1,
    on_trace=None,
    competence: float = COMPETENCE_THRESHOLD,
) -> tuple[WorkloadReport, list[Plan]]:
    """The module docstring's procedure at every budget: (the report, the searched plans)."""
    from polykv.eval.experiments import ExperimentRunner

    started = time.perf_counter()
    scope = Scope(scope)
    objective = samples.objective(model)
    layers = workload_profile.num_layers
    # The competence rule before any plan is judged, as the study applies it: FullKV generating on the first
    # PILOT_SAMPLES held-out samples of every task; a task under the threshold leaves the verdict and is not run.
    piloted = min(PILOT_SAMPLES, samples.held_out)
    say(f"competence: FullKV generating on {piloted} held-out samples per task")
    everything = tuple(samples.workload.tasks) + tuple(samples.transfer)
    pilot_settings = dataclasses.replace(samples.workload.with_samples(piloted, "generate"), tasks=everything)
    pilot = ExperimentRunner(
        store, model_name, model, tokenizer, samples.workload.suite, pilot_settings, samples.seed, "score",
        on_sample=on_sample, batched=True, workers=workers,
    ).run(Plan.homogeneous(FULL, None, layers))  # fmt: skip
    fullkv_accuracy = {t: v["score"] for t, v in store.task_scores(pilot).items()}
    families = competent_families(samples.workload.tasks, samples.transfer, fullkv_accuracy, competence)
    judged = tuple(families[FAMILIES[0]] + families[FAMILIES[1]])
    if not families[FAMILIES[0]]:
        raise ValueError("FullKV is under the competence threshold on every searched task: nothing to judge")
    runners = {}  # one runner per distinct settings (score and accuracy share one in mode both)
    for metric, suite_settings in samples.verdict_settings().items():
        suite_settings = dataclasses.replace(suite_settings, tasks=judged)
        runners[metric] = next((r for r in runners.values() if r.settings == suite_settings), None) or ExperimentRunner(
            store,
            model_name,
            model,
            tokenizer,
            samples.workload.suite,
            suite_settings,
            samples.seed,
            metric,
            progress=lambda name: say(f"verdict: {name}"),
            on_sample=on_sample,
            batched=True,
            workers=workers,
        )
    budgets_out, searched_plans = [], []
    for budget in budgets:
        say(f"budget {budget}: contenders on {len(objective)} search samples, then the search")
        # No successive halving here: each call pays one prompt pass per sample, which costs several plan
        # executions, so a round scores every candidate on every sample in one pass per sample.
        settings = SearchSettings(
            budget=budget,
            evaluations=evaluations,
            candidates=candidates,
            first_rung=len(objective),
            seed=seed,
            statistic="danswer",
        )
        plans, chosen = contenders(
            objective, workload_profile, text_profile, scope, settings, text_statistic, on_step, on_trace
        )
        verdict_started = time.perf_counter()
        unique: dict[str, Plan] = {}  # a plan that fills two roles runs once
        for plan in [*plans.values(), Plan.homogeneous(FULL, None, layers)]:
            unique.setdefault(plan_key(plan), plan)
        say(f"budget {budget}: the verdict, {len(unique)} plans on {samples.held_out} held-out samples per task")
        roles = {**plans, "fullkv": Plan.homogeneous(FULL, None, layers)}
        run_ids: dict[str, dict[str, str]] = {}
        done: dict[int, dict[str, str]] = {}  # runner -> {plan key: run}
        for metric, runner in runners.items():
            if id(runner) not in done:
                done[id(runner)] = dict(zip(unique, runner.run_all(list(unique.values()))))
            run_ids[metric] = {role: done[id(runner)][plan_key(plan)] for role, plan in roles.items()}
        budgets_out.append(
            WorkloadBudget(
                budget=budget,
                plans=plans,
                runs=run_ids,
                homogeneous_scores=chosen.homogeneous_scores,
                envelope_scores=chosen.envelope_scores,
                search=chosen.search,
                search_values=chosen.search_values,
                verdict=verdict(store, run_ids, families, seed, {r: p.scope.value for r, p in plans.items()}),
                seconds=BudgetSeconds(contenders=chosen.seconds, verdict=time.perf_counter() - verdict_started),
            )
        )
        searched_plans.append(plans["searched"])
        left = len(budgets) - len(budgets_out)
        took = (budgets_out[-1].seconds.contenders + budgets_out[-1].seconds.verdict) / 60
        if left:
            say(f"budget {budget} took {took:.1f} min: about {took * left:.0f} min more for the {left} budget(s) left")
    report = WorkloadReport(
        format=FORMAT,
        version=VERSION,
        model=model_name,
        kv=KVDimensions(**kv_dimensions(model)),
        scope=scope.value,
        objective=METRIC,
        seed=seed,
        evaluations=evaluations,
        candidates=candidates,
        samples=samples.record(),
        workload_profile=ProfileRef(key=workload_profile.key, b_cal=workload_profile.meta.b_cal),
        text_profile=None
        if text_profile is None
        else TextProfileRef(key=text_profile.key, b_cal=text_profile.meta.b_cal, statistic=text_statistic),
        budgets=budgets_out,
        fullkv_accuracy=fullkv_accuracy,
        competence=Competence(threshold=competence, pilot=pilot, samples=piloted),
        command=command,
        created=created_now(),
        machine=Machine.here(),
        seconds=time.perf_counter() - started,
    )
    return report, searched_plans


@dataclasses.dataclass(frozen=True)
class WorkloadSearchSettings:
    """A workload search: its scope and budgets, the executions a budget's search may run, the search samples and
    held-out samples per task, the transfer tasks, the held-out samples per task that also generate (None: all),
    the workload profile's calibration capacity ("auto"), the text profile's statistic, the verdict's processes
    and FullKV's competence threshold."""

    scope: Scope | str
    budgets: tuple[int, ...]
    evaluations: int = 200
    candidates: int = 8
    seed: int = 0
    search_per_task: int = 16
    held_out: int = 48
    transfer: tuple[str, ...] = ()
    accuracy: int | None = None
    b_cal: int | None = None
    text_statistic: str = "dppl"
    workers: int = 1
    competence: float = COMPETENCE_THRESHOLD


def run_workload_search(
    model,
    tokenizer,
    model_name: str,
    workload,
    profile,
    settings: WorkloadSearchSettings,
    *,
    text_profile=None,
    store=None,
    profiles: Path | None = None,
    out: Path | None = None,
    report_file: Path | None = None,
    markdown_file: Path | None = None,
    command: str = "",
    load_seconds: float | None = None,
    time_one: bool = False,
    hooks: SearchHooks = SearchHooks(),
) -> tuple[WorkloadReport, list[Plan]]:
    """The workload search, end to end: (the report, the searched plans). The samples are drawn (with `time_one`,
    one execution is timed and said); `profile` is the workload profile or "auto" (computed on the search samples
    into `profiles`, once); then `workload_report`, its runs in `store` (default: <out>/results.sqlite). Written:
    with `out`, the plans, report.json, the figure and the page there (the report to `report_file`, the page to
    `markdown_file` when given). `load_seconds` (the model's load, timed by the caller) puts the steps before the
    search in the report (`seconds_steps`)."""
    from polykv.files import atomic_write_text
    from polykv.models import num_layers
    from polykv.search.workload.markdown import figure, markdown

    if store is None and out is None:  # before any work: the runs need a database, in `store` or under `out`
        raise ValueError("run_workload_search needs a results store or an output folder (store= or out=)")
    scope = Scope(settings.scope)
    hooks.tell_stage("samples")
    samples = draw_samples(
        workload, tokenizer, model, settings.search_per_task, settings.held_out, settings.seed, settings.transfer,
        settings.accuracy,
    )  # fmt: skip
    if time_one:  # what the counts said before the start cost on this machine
        timed = time.perf_counter()
        samples.objective(model).value(Plan.homogeneous(FULL, None, num_layers(model)), [0])
        hooks.tell(
            f"one plan execution on one search sample (its prompt pass included) takes "
            f"{time.perf_counter() - timed:.1f} s here; each budget's step reports how long it took"
        )
    profile_started = time.perf_counter()
    if isinstance(profile, str) and profile == "auto":
        if profiles is None:
            raise ValueError('a workload search with profile "auto" needs the folder its profile goes to (profiles)')
        hooks.tell_stage("profile")
        profile = build_workload_profile(
            model_name, model, tokenizer, profiles, samples, scope, settings.b_cal, hooks.profile
        )
    profile_seconds = time.perf_counter() - profile_started
    if store is None:
        from polykv.eval.results.store import Store

        out.mkdir(parents=True, exist_ok=True)
        store = Store(results_path(out))
    report, plans = workload_report(
        model,
        model_name,
        tokenizer,
        samples,
        profile,
        text_profile,
        scope,
        settings.budgets,
        store,
        evaluations=settings.evaluations,
        candidates=settings.candidates,
        seed=settings.seed,
        text_statistic=settings.text_statistic,
        command=command,
        say=hooks.tell,
        on_step=hooks.step,
        on_sample=hooks.sample,
        workers=settings.workers,
        on_trace=hooks.trace,
        competence=settings.competence,
    )
    if load_seconds is not None:
        report.seconds_steps = {"load model": load_seconds, "workload profile": profile_seconds}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for plan in plans:
            plan.save(out / f"{plan.name}.json")
        report_file = report_file or out / "report.json"
    if report_file is not None:
        report.save(report_file)
    if out is not None:
        page = markdown_file or out / "report.md"
        atomic_write_text(page, markdown(report, store_dir=out, figure=out / figure(report, out), page=page))
    return report, plans


__all__ = [
    "FORMAT",
    "PILOT_SAMPLES",
    "Chosen",
    "WorkloadSamples",
    "WorkloadSearchSettings",
    "contenders",
    "envelope_plans",
    "run_workload_search",
    "verdict_settings",
    "workload_report",
]

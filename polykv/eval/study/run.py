"""The paper's study as one call: profile -> TopRank routes -> (workload check) -> factorial -> placement ->
budget sweeps, then a Markdown report with tables and figures (`polykv.eval.study.report`).

Every number in the report comes from a run in the study's results database (its id is printed beside
it), and the report names the database, the profile directory and what ran, so anyone can trace a number
back or rerun the study: finished runs are found again by their ids and not recomputed.

On a question suite (RULER, LongBench) the study first checks the workload, before any plan is judged
(`polykv.eval.workloads.competence`): FullKV runs a pilot of every task, and tasks where FullKV's accuracy is under the
competence threshold leave the macro-average; with `auto_samples` the pilot (FullKV and the homogeneous
anchor) also gives the spread of paired differences from which the samples per task are chosen, to reach
a minimal detectable difference within a time allowance measured on the study's own batch of plans (those that
run at the chosen count: the factorial's, the sweeps' and, on the primary suite without placement_samples, the
placement control's; the accuracy pass comes on top). The
primary metric may be the dense `answer_nll` (the suite then runs in "score" mode, no generation), with
accuracy beside it from a generating pass over fewer samples (`accuracy_samples`).

The experiments themselves are `polykv.eval.experiments` (the same code as `polykv experiment ...`);
this module only chooses their inputs, runs them in order and hands what they return to the report.
With `batched` (the default) the runs of one suite execute together, sample by sample, as one batch
(`polykv.eval.running.suite_runner.run_suites`): every plan shares one prompt pass per sample.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from polykv.eval.study.settings import StudySettings
from polykv.eval.workloads.competence import QUESTION_SUITES, Competence, SamplePlan
from polykv.eval.workloads.workload import CALIBRATION_SEED
from polykv.plan import Phase, Plan
from polykv.progress import Fraction, Progress, Step
from polykv.workspace import results_path

if TYPE_CHECKING:
    from polykv.eval.experiments.report import Report
    from polykv.eval.experiments.run import OnModel  # (model, tokenizer, the primary suite's settings)
    from polykv.profile.store import Profile


@dataclass(kw_only=True)
class StudyResult:
    """What the study found, as its report renders it (`polykv.eval.study.report`)."""

    settings: StudySettings
    profile: Profile
    route: Plan  # the primary route (the factorial, the placement control)
    baseline: str  # the factorial's homogeneous anchor
    factorial: Report
    placement: Report
    sweep: Report  # the primary route's sweep
    seconds: dict[str, float] = field(default_factory=dict)
    store_path: Path | None = None
    suite_settings: dict[str, object] = field(default_factory=dict)  # the primary suite's settings as they ran
    routes: dict[str, Plan] = field(default_factory=dict)  # phase -> route, every swept phase
    sweeps: dict[str, Report] = field(default_factory=dict)  # phase -> its route's sweep report
    placement_settings: dict[str, object] = field(default_factory=dict)
    task_scores: dict[str, dict[str, float]] = field(default_factory=dict)  # run id -> task -> the metric
    chat_template: bool | None = None  # whether the primary suite's prompts are in the chat template
    anchor_rule: str = ""  # how the anchor was chosen
    competence: Competence | None = None  # question suites: the workload check
    sample_plan: SamplePlan | None = None  # auto_samples: how the samples per task were chosen
    accuracy: dict[str, Report] = field(default_factory=dict)  # "factorial" and "sweep <phase>" in accuracy
    accuracy_settings: dict[str, object] = field(default_factory=dict)
    runs_reused: tuple[int, int] = (0, 0)  # (runs cited that were finished before this study started, runs cited)
    revisions: list[dict[str, str]] = field(default_factory=list)  # the code revisions the cited runs were made with


def anchor_for(rule: str, route: Plan, phase: Phase) -> str | None:
    """The factorial's anchor under the paper's rule: homogeneous TOVA for a decode route (its LongBench
    factorial), the route's dominant method for a prefill route (its RULER factorial: "homogeneous SnapKV as
    the dominant-method ablation anchor"); a method's name as given; None for "strongest" (measured)."""
    from polykv.eval.experiments.placement import majority_method

    if rule == "paper":
        return "tova" if phase is Phase.DECODE else majority_method([layer[phase].method for layer in route.layers])
    return None if rule == "strongest" else rule


def anchor_text(rule: str, anchor: str, phase: Phase) -> str:
    if rule == "paper":
        why = (
            "the paper's decode anchor (homogeneous decode-only TOVA, its Table 2)"
            if phase is Phase.DECODE
            else "the paper's prefill anchor: the route's dominant method (its RULER factorial)"
        )
        return f"{anchor}: {why}"
    if rule == "strongest":
        return f"{anchor}: the strongest method alone at the budget on calibration samples (seed + {CALIBRATION_SEED})"
    return f"{anchor}: given"


def best_mean_method(profile, phase: Phase, statistic: str) -> str:
    """The method with the best profile statistic averaged over layers."""
    from polykv.profile.store import STATISTICS

    rows = profile.table[(profile.table["scope"] == phase.value) & (profile.table["method"] != "full")]
    means = rows.groupby("method")[statistic].mean()
    return str((means * STATISTICS[statistic]).idxmax())


def suite_settings_for(
    suite: str, given: dict | None, model: str, samples_per_task: int | None, metric: str | None = None
):
    """A suite's settings on `model` (`polykv.eval.running.defaults.settings_on_model`): `given` (a JSON object)
    over its defaults on the model, the fidelity suite's samples defaulting to `samples_per_task`, else 3;
    `samples_per_task` also sets a question suite's samples when given (over `given`'s), and `metric` its mode
    unless `given` names one."""
    from polykv.eval.running.defaults import settings_on_model

    options = {}
    if suite == "fidelity":
        options = {"samples_per_task": samples_per_task or 3}
    elif samples_per_task is not None:
        given = {**(given or {}), "samples_per_task": samples_per_task}
    return settings_on_model(suite, model, given, options=options, metric=metric)


def run_study(
    settings: StudySettings,
    workspace: Path,
    progress: Step | None = None,
    *,
    on_run: Step | None = None,
    on_sample: Progress | None = None,
    on_profile: Fraction | None = None,
    on_model: OnModel | None = None,
) -> StudyResult:
    """Run the whole study into `workspace` (profiles/ and results.sqlite); finished work is reused.

    `progress` is told each step (and `run <plan>` before each run unless `on_run` is given, which is then
    told the plan's name instead); `on_sample` is `ExperimentRunner.on_sample`, `on_profile` is
    `build_profile(progress=)`: for progress bars. `on_model(model, tokenizer, primary suite settings)` is
    called once the model is loaded and the settings checked, before any work (the CLI says the cost there)."""
    from polykv.eval.experiments import factorial, factorial_plans, placement, placement_plans, sweep, sweep_plans
    from polykv.eval.experiments.experiment_runner import check_metric
    from polykv.eval.method_protocols import protocol
    from polykv.eval.results.store import Store
    from polykv.eval.running.fit import check_fits
    from polykv.eval.study import steps
    from polykv.routing import placement_count, plan_from_profile

    say = progress or (lambda message: None)
    seconds: dict[str, float] = {}
    began = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    questions = settings.suite in QUESTION_SUITES
    check_metric(settings.suite, settings.metric)  # what fails here fails before the model loads
    check_metric(settings.placement_suite or settings.suite, settings.placement_metric or settings.metric)
    given = dict(settings.suite_settings or {})
    primary = suite_settings_for(settings.suite, given, settings.model, settings.samples_per_task, settings.metric)
    if len(getattr(primary, "lengths", ())) > 1:
        lengths = ", ".join(str(n) for n in primary.lengths)
        raise ValueError(f"the study runs one {settings.suite} length at a time; give one length (got {lengths})")
    for name in settings.baselines or ():
        protocol(name)  # an unknown baseline fails before the model loads
    phase = Phase(settings.scope)
    context = steps.StudyContext(settings, workspace, say, on_run, on_sample)  # loads the model
    check_fits(settings.suite, primary, context.model, context.tokenizer, seed=settings.seed)  # before the profile
    if settings.placement_suite:
        placing = suite_settings_for(settings.placement_suite, settings.placement_settings, settings.model, None)
        check_fits(settings.placement_suite, placing, context.model, context.tokenizer, seed=settings.seed)
    if on_model is not None:
        on_model(context.model, context.tokenizer, primary)
    workspace.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    say("profile")
    profile = steps.profile(context, on_profile)
    seconds["profile"] = time.perf_counter() - started

    routes = {s: plan_from_profile(profile, s, settings.budget, settings.statistic, "uniform") for s in settings.swept}
    route = routes[settings.scope]
    store = Store(results_path(workspace))
    context.store = store
    baselines = list(settings.baselines) if settings.baselines else None

    def cells(anchor: str) -> dict[str, Plan]:
        return factorial_plans(
            profile, settings.scope, settings.budget, anchor, settings.statistic, settings.allocation
        )

    competence = sample_plan = pilot = None
    if questions:  # the workload first: FullKV's pilot decides the tasks before any other plan runs
        started = time.perf_counter()
        say("pilot: FullKV on every task")
        competence = steps.competence_pilot(context, primary, route.num_layers)
        primary = dataclasses.replace(primary, tasks=competence.kept)
        seconds["pilot"] = time.perf_counter() - started
    anchor = anchor_for(settings.baseline, route, phase)
    if anchor is None:  # "strongest": measured on calibration samples of the (kept) tasks
        started = time.perf_counter()
        say("anchor: every method alone on calibration samples")
        anchor = steps.strongest_anchor(context, primary, profile, settings)
        seconds["anchor"] = time.perf_counter() - started
    if questions:
        started = time.perf_counter()
        say("pilot: the anchor on the tasks FullKV can do")
        pilot = steps.anchor_spread(context, primary, cells(anchor)["homogeneous-uniform"], competence)
        seconds["pilot"] += time.perf_counter() - started
    placement_suite = settings.placement_suite or settings.suite
    factorial_args = (profile, settings.scope, settings.budget, anchor, settings.statistic, settings.allocation)
    sweep_args = {s: (routes[s], list(settings.budgets), baselines) for s in settings.swept}
    sweep_profile = profile if settings.sweep_ppl else None  # the sweep's route-ppl row needs the profile
    matched = settings.sweep_matched
    main = list(factorial_plans(*factorial_args).values())
    for s in settings.swept:
        main += list(sweep_plans(*sweep_args[s], profile=sweep_profile, matched=matched).values())
    main = list({plan.to_json(): plan for plan in main}.values())
    # A short route may admit fewer distinct count-matched placements than asked for (5 layers with one
    # method twice: 59): then every one of them is run, which makes the control exhaustive, not sampled.
    placements = min(settings.placements, placement_count([layer[phase].method for layer in route.layers]))
    if placements < settings.placements:
        say(f"placement: the route admits only {placements} other placements; running all of them")
    if settings.auto_samples:
        started = time.perf_counter()
        timed = main
        if not settings.placement_suite and settings.placement_samples is None:  # it runs at the chosen count too
            timed = main + placement_plans(route, placements, settings.seed)
        say(f"samples: timing one sample of every task with the {len(timed)} plans that run at the chosen count")
        sample_plan = steps.choose_samples(context, primary, timed, pilot)
        primary = dataclasses.replace(primary, samples_per_task=sample_plan.samples_per_task)
        seconds["samples"] = time.perf_counter() - started
    if not settings.placement_suite:  # on the primary suite: its settings as chosen (a separate one's: above)
        placing = primary
        if settings.placement_samples is not None:
            placing = dataclasses.replace(primary, samples_per_task=settings.placement_samples)

    runner = steps.runner(context, settings.suite, primary, settings.metric)
    placement_runner = steps.runner(context, placement_suite, placing, settings.placement_metric or settings.metric)
    if settings.batched and settings.backend == "local":
        # The factorial's and the sweeps' runs share the primary suite's samples: one batch for them all.
        say(f"{settings.suite} runs (factorial and sweeps, together)")
        started = time.perf_counter()
        runner.run_all(main)
        seconds[f"{settings.suite} runs"] = time.perf_counter() - started
    reports: dict[str, Report] = {}
    named = {
        "factorial": lambda: factorial(runner, *factorial_args),
        "placement": lambda: placement(placement_runner, profile, route, placements, settings.statistic),
        **{
            f"sweep {s}": (lambda s=s: sweep(runner, *sweep_args[s], profile=sweep_profile, matched=matched))
            for s in settings.swept
        },
    }
    for name, step in named.items():
        say(name)
        started = time.perf_counter()
        reports[name] = step()
        seconds[name] = time.perf_counter() - started
    accuracy: dict[str, Report] = {}
    accuracy_settings: dict[str, object] = {}
    if questions and settings.accuracy_samples and settings.metric != "score":
        started = time.perf_counter()
        say("accuracy: the factorial, the routes and the best baselines, generating")
        measured = dataclasses.replace(primary, mode="generate", samples_per_task=settings.accuracy_samples)
        accuracy_runner = steps.runner(context, settings.suite, measured, "score")
        # generation costs far more than scoring the gold answer: the baselines that make the primary metric's
        # envelope at some budget stand for the nine here
        best = {s: sorted({e.baseline for e in reports[f"sweep {s}"].data.envelope.values()}) for s in settings.swept}
        # and the methods alone in the route's scope that are its like-with-like best at some budget
        same = {
            s: sorted({e.baseline for e in reports[f"sweep {s}"].data.matched_envelope.values()})
            for s in settings.swept
        }
        budgets = list(settings.budgets)
        plans = list(factorial_plans(*factorial_args).values())
        for s in settings.swept:
            plans += list(sweep_plans(routes[s], budgets, best[s], profile=sweep_profile, matched=same[s]).values())
        if settings.batched and settings.backend == "local":
            accuracy_runner.run_all(list({plan.to_json(): plan for plan in plans}.values()))
        accuracy["factorial"] = factorial(accuracy_runner, *factorial_args)
        for s in settings.swept:
            accuracy[f"sweep {s}"] = sweep(accuracy_runner, routes[s], budgets, best[s], sweep_profile, matched=same[s])
        accuracy_settings = measured.to_dict()
        seconds["accuracy"] = time.perf_counter() - started
    store.checkpoint()  # the database file alone then holds every run the report cites
    sweeps = {s: reports[f"sweep {s}"] for s in settings.swept}
    cited = {run for report in sweeps.values() for series in report.data.runs.values() for run in series.values()}
    cited |= {report.data.full.run for report in sweeps.values()}
    made = [store.run(run) for run in cited | {cell.run for cell in reports["factorial"].data.cells.values()}]
    reused = sum(1 for run in made if run is not None and run.created < began)
    revisions = [json.loads(run.versions).get("revisions", {}) for run in made if run is not None]
    suites = sorted({r.get("suite") for r in revisions if r.get("suite") is not None})
    return StudyResult(
        settings=settings,
        profile=profile,
        route=route,
        baseline=anchor,
        factorial=reports["factorial"],
        placement=reports["placement"],
        sweep=sweeps[settings.scope],
        seconds=seconds,
        store_path=store.path,
        suite_settings=primary.to_dict(),
        routes=routes,
        sweeps=sweeps,
        placement_settings=placing.to_dict(),
        task_scores={run: runner.task_scores(run) for run in sorted(cited)},
        chat_template=steps.chat_template(context, settings.suite, primary),
        anchor_rule=anchor_text(settings.baseline, anchor, phase),
        competence=competence,
        sample_plan=sample_plan,
        accuracy=accuracy,
        accuracy_settings=accuracy_settings,
        runs_reused=(reused, len(made)),
        revisions=[{"suite": suite} for suite in suites],
    )


def write_report(result: StudyResult, path: Path, command: str = "") -> Path:
    """Write the Markdown report at `path` and its figures beside it (see `polykv.eval.study.report`)."""
    from polykv.eval.study.report import write_report as write

    return write(result, path, command)

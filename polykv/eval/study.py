"""The paper's study as one call: profile -> TopRank routes -> (workload check) -> factorial -> placement ->
budget sweeps, then a Markdown report with tables and figures (`polykv.eval.study_report`).

Every number in the report comes from a run in the study's results database (its id is printed beside
it), and the report names the database, the profile directory and what ran, so anyone can trace a number
back or rerun the study: finished runs are found again by their ids and not recomputed.

On a question suite (RULER, LongBench) the study first checks the workload, before any plan is judged
(`polykv.eval.workload`): FullKV runs a pilot of every task, and tasks where FullKV's accuracy is under the
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
(`polykv.eval.runner.run_suites`): every plan shares one prompt pass per sample.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polykv.eval.study_steps import CALIBRATION_SEED
from polykv.eval.suites.answers import mode_for
from polykv.eval.workload import COMPETENCE_THRESHOLD, QUESTION_SUITES, Competence, SamplePlan
from polykv.plan import Phase, Plan, Scope

ANCHOR_RULES = ("paper", "strongest")


@dataclass(frozen=True)
class StudySettings:
    """What the study runs. Defaults: the demo model, a decode-phase route at average capacity 64, fidelity."""

    model: str = "demo"
    scope: str = "decode"  # the phase of the primary route (the factorial and the placement control)
    budget: int = 64  # average capacity of the routes, the factorial and the placement control
    budgets: tuple[int, ...] = (16, 32, 64, 128, 256)  # the sweep's average capacities
    placements: int = 99  # K random count-matched placements
    statistic: str = "dppl"  # TopRank's profile statistic
    allocation: str = "ppl"  # the factorial's allocated arm (and the sweep's route-ppl row)
    # the factorial's homogeneous anchor: "paper" (TOVA for a decode route, the route's majority method for a
    # prefill route, as the paper chose), "strongest" (the best method alone at the budget on calibration
    # samples of the suite) or a method's name
    baseline: str = "paper"
    metric: str = "kl"  # the primary suite's metric that scores a run
    samples_per_task: int | None = None  # the primary suite's samples per task (None: its settings', fidelity 3)
    calibration_sequences: int = 20
    seed: int = 0
    backend: str = "local"  # "ray": runs as Ray tasks on a local cluster (one per core)
    device: str = "cpu"
    suite: str = "fidelity"  # the primary workload: the factorial and the sweeps
    suite_settings: dict | None = None  # its settings (JSON object); None: the suite's defaults for the model
    placement_suite: str | None = None  # the suite scoring the placement control; None: the primary suite
    placement_settings: dict | None = None
    placement_metric: str | None = None  # None: `metric`
    sweep_scopes: tuple[str, ...] | None = None  # the phases whose TopRank routes are swept; None: (scope,)
    calibration_tokens: int = 2048  # tokens per calibration sequence (clipped to the model's context)
    calibration_sources: tuple[str, ...] | None = None  # None: the model's default sources
    b_cal: int | None = None  # None: 256, scaled down for short contexts
    baselines: tuple[str, ...] | None = None  # the sweep's standalone baselines; None: every method with a protocol
    batched: bool = True  # the runs of a suite execute together (local backend)
    workers: int = 1  # batched, local: the samples shared out over this many processes (`polykv.eval.shards`)
    sweep_ppl: bool = True  # the sweep's route-ppl row (the route with the profile's PPL capacities at each budget)
    # the sweep's like-with-like comparator: every method alone in the route's scope at each budget (False: only
    # the baselines under their own protocols, as studies made before it; its verdicts are then across protocols)
    sweep_matched: bool = True
    # question suites: the workload check before any plan runs
    competence_threshold: float = COMPETENCE_THRESHOLD  # FullKV accuracy (%) a task needs to stay in the macro
    pilot_samples: int = 10  # samples per task of the pilot (FullKV's competence; the anchor's spread)
    auto_samples: bool = False  # choose samples_per_task from the pilot: `mde` within `time_limit`
    mde: float | None = None  # target minimal detectable difference, in the primary metric's units
    time_limit: float | None = None  # minutes the primary runs may take (auto_samples)
    min_samples: int = 1  # auto_samples: at least this many per task (the time limit wins)
    accuracy_samples: int | None = None  # answer_nll primary: also generate on this many samples per task
    placement_samples: int | None = None  # placement control on the primary suite: its samples per task
    # auto_samples: one sample with every plan takes this many seconds (given instead of timed, e.g. the time an
    # earlier run of the same study measured, so that a study rendered again from its database chooses the same
    # samples per task and finds every run it made)
    sample_seconds: float | None = None
    # run nothing: the profile and every run are read from the workspace, the runs whatever code revisions made
    # them (the study rendered again from its database, e.g. with this version's statistics and sentences)
    replay: bool = False

    def __post_init__(self):
        if Scope(self.scope) is Scope.BOTH:
            raise ValueError("the study routes one phase: scope must be prefill or decode")
        if self.budget < 1 or any(b < 1 for b in self.budgets) or not self.budgets:
            raise ValueError("budgets must be positive integers")
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if self.placements < 1:
            raise ValueError("placements must be at least 1")
        for phase in self.swept:
            if Scope(phase) is Scope.BOTH:
                raise ValueError("each swept route routes one phase: prefill or decode")
        if self.auto_samples and self.mde is None and self.time_limit is None:
            raise ValueError("automatic samples need a target (--mde) or a time limit (--time-limit)")
        if self.auto_samples and self.suite not in QUESTION_SUITES:
            raise ValueError("automatic samples need a question suite (ruler, longbench): its pilot sets them")
        if self.sample_seconds is not None and not self.sample_seconds > 0:
            raise ValueError(f"--sample-seconds must be positive, got {self.sample_seconds}")
        if self.mde is not None and not self.mde > 0:
            raise ValueError(f"--mde must be positive, got {self.mde}")
        if self.time_limit is not None and not self.time_limit > 0:
            raise ValueError(f"--time-limit must be positive minutes, got {self.time_limit}")
        if self.baseline not in ANCHOR_RULES:
            from polykv.methods import REGISTRY

            if self.baseline not in REGISTRY or self.baseline == "full":
                methods = ", ".join(m for m in REGISTRY if m != "full")
                raise ValueError(
                    f"--baseline must be {', '.join(ANCHOR_RULES)} or a method ({methods}), got {self.baseline!r}"
                )
        if not 0 <= self.competence_threshold <= 100:
            raise ValueError(f"the competence threshold is a percentage, got {self.competence_threshold}")
        self._check_choices()

    def _check_choices(self) -> None:
        """Every named choice and count checked before anything loads (a bad one is one line at once)."""
        from polykv import limits
        from polykv.eval.backends import BACKENDS
        from polykv.models import check_device
        from polykv.profile.corpus import CorpusSpec, is_workload_source
        from polykv.routing import ALLOCATIONS

        text_statistics = ("cosine", "dppl")  # a text profile's (danswer needs a workload's prompts)
        if self.statistic not in text_statistics:
            raise ValueError(f"--statistic must be one of {', '.join(text_statistics)} (got {self.statistic!r})")
        arms = [a for a in ALLOCATIONS if a != "uniform"]
        if self.allocation not in arms:
            raise ValueError(f"--allocation must be one of {', '.join(arms)} (got {self.allocation!r})")
        backends = [b for b in BACKENDS if b != "subprocess"]
        if self.backend not in backends:
            raise ValueError(f"--backend must be one of {', '.join(backends)} (got {self.backend!r})")
        check_device(self.device)
        for name, value in (("--mde", self.mde), ("--time-limit", self.time_limit)):
            limits.check_finite(name, value)
        limits.check_finite("--sample-seconds", self.sample_seconds)
        limits.check_at_most("--k", self.placements, limits.PLACEMENTS)
        limits.check_at_most("--workers", self.workers, limits.WORKERS)
        limits.check_at_most("--samples", self.samples_per_task, limits.SAMPLES_PER_TASK)
        limits.check_at_most("--calibration-sequences", self.calibration_sequences, limits.SEQUENCES)
        if self.calibration_sources:
            workload = [s for s in self.calibration_sources if is_workload_source(s)]
            if workload:
                raise ValueError(
                    f"--sources {workload[0]}: the study profiles text (kjv, jargon, stdlib, model, file:PATH); a "
                    "workload's own prompts rank plans in `polykv search --sources`"
                )
            CorpusSpec(sources=self.calibration_sources, num_sequences=1, max_tokens=16)  # the sources' own checks

    @property
    def swept(self) -> tuple[str, ...]:
        """The phases whose routes the sweep runs, the primary one first."""
        return tuple(dict.fromkeys((self.scope, *(self.sweep_scopes or ()))))

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}


@dataclass(kw_only=True)
class StudyResult:
    settings: StudySettings
    profile: Any
    route: Plan  # the primary route (the factorial, the placement control)
    baseline: str  # the factorial's homogeneous anchor
    factorial: Any
    placement: Any
    sweep: Any  # the primary route's sweep
    seconds: dict[str, float] = field(default_factory=dict)
    store_path: Path | None = None
    suite_settings: dict = field(default_factory=dict)  # the primary suite's settings as they ran
    routes: dict[str, Plan] = field(default_factory=dict)  # phase -> route, every swept phase
    sweeps: dict[str, Any] = field(default_factory=dict)  # phase -> its route's sweep report
    placement_settings: dict = field(default_factory=dict)
    task_scores: dict[str, dict[str, float]] = field(default_factory=dict)  # run id -> task -> the metric
    chat_template: bool | None = None  # whether the primary suite's prompts are in the chat template
    anchor_rule: str = ""  # how the anchor was chosen
    competence: Competence | None = None  # question suites: the workload check
    sample_plan: SamplePlan | None = None  # auto_samples: how the samples per task were chosen
    accuracy: dict[str, Any] = field(default_factory=dict)  # "factorial" and "sweep <phase>" in accuracy
    accuracy_settings: dict = field(default_factory=dict)
    runs_reused: tuple[int, int] = (0, 0)  # (runs cited that were finished before this study started, runs cited)
    revisions: list[dict] = field(default_factory=list)  # the code revisions the cited runs were made with


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


def suite_settings_for(suite: str, given: dict | None, model: str, samples_per_task: int | None):
    """A suite's settings: `given` (a JSON object) over its defaults, the fidelity suite's tasks defaulting to
    the model's (and its samples to `samples_per_task`, else 3); `samples_per_task` also sets a question
    suite's samples when given."""
    from polykv.eval.settings import suite_settings
    from polykv.eval.suites.fidelity import default_tasks

    if suite == "fidelity":
        given = {"tasks": list(default_tasks(model)), "samples_per_task": samples_per_task or 3, **(given or {})}
    elif samples_per_task is not None:
        given = {**(given or {}), "samples_per_task": samples_per_task}
    return suite_settings(suite, given)


def run_study(
    settings: StudySettings,
    workspace: Path,
    progress: Callable[[str], None] | None = None,
    *,
    on_run: Callable[[str], None] | None = None,
    on_sample: Callable[[int, int, str], None] | None = None,
    on_profile: Callable[[float, str], None] | None = None,
    on_model: Callable[[Any, Any, Any], None] | None = None,
) -> StudyResult:
    """Run the whole study into `workspace` (profiles/ and results.sqlite); finished work is reused.

    `progress` is told each step (and `run <plan>` before each run unless `on_run` is given, which is then
    told the plan's name instead); `on_sample` is `ExperimentRunner.on_sample`, `on_profile` is
    `build_profile(progress=)`: for progress bars. `on_model(model, tokenizer, primary suite settings)` is
    called once the model is loaded and the settings checked, before any work (the CLI says the cost there)."""
    from polykv.eval import study_steps as steps
    from polykv.eval.experiments import factorial, factorial_plans, placement, placement_plans, sweep, sweep_plans
    from polykv.eval.experiments.runner import check_metric
    from polykv.eval.fit import check_fits
    from polykv.eval.protocols import protocol
    from polykv.eval.store import Store
    from polykv.routing import placement_count, plan_from_profile

    say = progress or (lambda message: None)
    seconds: dict[str, float] = {}
    began = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    questions = settings.suite in QUESTION_SUITES
    check_metric(settings.suite, settings.metric)  # what fails here fails before the model loads
    check_metric(settings.placement_suite or settings.suite, settings.placement_metric or settings.metric)
    given = dict(settings.suite_settings or {})
    if questions:
        given["mode"] = mode_for(settings.metric, given.get("mode"))
    primary = suite_settings_for(settings.suite, given, settings.model, settings.samples_per_task)
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
    store = Store(workspace / "results.sqlite")
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
    reports: dict[str, Any] = {}
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
    accuracy, accuracy_settings = {}, {}
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
    reused = sum(1 for run in made if run is not None and run["created"] < began)
    revisions = [json.loads(run["versions"]).get("revisions", {}) for run in made if run is not None]
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
    """Write the Markdown report at `path` and its figures beside it (see `polykv.eval.study_report`)."""
    from polykv.eval.study_report import write_report as write

    return write(result, path, command)

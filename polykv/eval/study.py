"""The paper's study as one call: profile -> TopRank routes -> factorial -> placement -> budget sweeps, then a
Markdown report with tables and figures (`polykv.eval.study_report`).

Every number in the report comes from a run in the study's results database (its id is printed beside
it), and the report names the database, the profile directory and the exact settings, so anyone can
trace a number back or rerun the study: finished runs are found again by their ids and not recomputed.

The experiments themselves are `polykv.eval.experiments` (the same code as `polykv experiment ...`);
this module only chooses their inputs, runs them in order and hands what they return to the report.
With `batched` (the default) the runs of one suite execute together, sample by sample, as one batch
(`polykv.eval.runner.run_suites`): every plan of the factorial and the sweeps shares one prompt pass per
sample, which is what makes a 30-layer model's study fit in an hour and a half on two CPU cores.

Defaults are the demo study's (the embedded 5-layer model on the fidelity suite); a real model's study
names its suite (RULER), the suite that scores the placement control (the fidelity KL suite when the
primary suite is too slow for K runs), its calibration corpus and the phases whose routes are swept.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polykv.plan import Phase, Plan, Scope


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
    baseline: str | None = None  # the factorial's homogeneous method; None: best mean profile score
    metric: str = "kl"  # the primary suite's metric that scores a run
    samples_per_task: int = 3  # fidelity samples per task, when `suite_settings` does not say
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

    def __post_init__(self):
        if Scope(self.scope) is Scope.BOTH:
            raise ValueError("the study routes one phase: scope must be prefill or decode")
        if self.budget < 1 or any(b < 1 for b in self.budgets) or not self.budgets:
            raise ValueError("budgets must be positive integers")
        if self.placements < 1:
            raise ValueError("placements must be at least 1")
        for phase in self.swept:
            if Scope(phase) is Scope.BOTH:
                raise ValueError("each swept route routes one phase: prefill or decode")

    @property
    def swept(self) -> tuple[str, ...]:
        """The phases whose routes the sweep runs, the primary one first."""
        return tuple(dict.fromkeys((self.scope, *(self.sweep_scopes or ()))))

    def to_dict(self) -> dict:
        from dataclasses import asdict

        data = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}


@dataclass
class StudyResult:
    settings: StudySettings
    profile: Any
    route: Plan  # the primary route (the factorial, the placement control)
    baseline: str
    factorial: Any
    placement: Any
    sweep: Any  # the primary route's sweep
    seconds: dict[str, float] = field(default_factory=dict)
    store_path: Path | None = None
    suite_settings: dict = field(default_factory=dict)
    routes: dict[str, Plan] = field(default_factory=dict)  # phase -> route, every swept phase
    sweeps: dict[str, Any] = field(default_factory=dict)  # phase -> its route's sweep report
    placement_settings: dict = field(default_factory=dict)
    task_scores: dict[str, dict[str, float]] = field(default_factory=dict)  # run id -> task -> the metric
    chat_template: bool | None = None  # whether the primary suite's prompts are in the chat template


def best_mean_method(profile, phase: Phase, statistic: str) -> str:
    """The method with the best profile statistic averaged over layers (the factorial's homogeneous arm
    when none is given): the strongest single method by the same evidence TopRank uses."""
    from polykv.profile.store import STATISTICS

    rows = profile.table[(profile.table["scope"] == phase.value) & (profile.table["method"] != "full")]
    means = rows.groupby("method")[statistic].mean()
    return str((means * STATISTICS[statistic]).idxmax())


def suite_settings_for(suite: str, given: dict | None, model: str, samples_per_task: int):
    """A suite's settings: `given` (a JSON object) over its defaults, the fidelity suite's tasks defaulting to
    the model's (and its samples to `samples_per_task`)."""
    from polykv.eval.settings import suite_settings
    from polykv.eval.suites.fidelity import default_tasks

    if suite == "fidelity":
        given = {"tasks": list(default_tasks(model)), "samples_per_task": samples_per_task, **(given or {})}
    return suite_settings(suite, given)


def run_study(
    settings: StudySettings,
    workspace: Path,
    progress: Callable[[str], None] | None = None,
    *,
    on_run: Callable[[str], None] | None = None,
    on_sample: Callable[[int, int, str], None] | None = None,
    on_profile: Callable[[float, str], None] | None = None,
) -> StudyResult:
    """Run the whole study into `workspace` (profiles/ and results.sqlite); finished work is reused.

    `progress` is told each step (and `run <plan>` before each run unless `on_run` is given, which is then
    told the plan's name instead); `on_sample` is `ExperimentRunner.on_sample`, `on_profile` is
    `build_profile(progress=)`: for progress bars."""
    from polykv.eval.experiments import ExperimentRunner, factorial, factorial_plans, placement, sweep, sweep_plans
    from polykv.eval.runner import SUITES
    from polykv.eval.store import Store
    from polykv.models import load_model
    from polykv.profile.build import build_profile
    from polykv.profile.corpus import CorpusSpec, default_sources
    from polykv.routing import placement_count, plan_from_profile

    say = progress or (lambda message: None)
    seconds: dict[str, float] = {}
    workspace.mkdir(parents=True, exist_ok=True)
    primary = suite_settings_for(settings.suite, settings.suite_settings, settings.model, settings.samples_per_task)
    placement_suite = settings.placement_suite or settings.suite
    placing = suite_settings_for(
        placement_suite,
        settings.placement_settings if settings.placement_suite else settings.suite_settings,
        settings.model,
        settings.samples_per_task,
    )
    from polykv.eval.protocols import protocol

    for name in settings.baselines or ():
        protocol(name)  # an unknown baseline fails before the model loads
    model, tokenizer = load_model(settings.model, device=settings.device)  # quiet: no progress bars
    phase = Phase(settings.scope)

    started = time.perf_counter()
    say("profile")
    spec = CorpusSpec(
        sources=settings.calibration_sources or default_sources(settings.model),
        num_sequences=settings.calibration_sequences,
        max_tokens=settings.calibration_tokens,
        seed=settings.seed,
    )
    profile = build_profile(
        settings.model,
        model,
        tokenizer,
        workspace / "profiles",
        spec,
        capacity=settings.b_cal,
        scopes=(Phase.PREFILL, Phase.DECODE),
        progress=on_profile,
    )
    seconds["profile"] = time.perf_counter() - started

    routes = {s: plan_from_profile(profile, s, settings.budget, settings.statistic, "uniform") for s in settings.swept}
    route = routes[settings.scope]
    baseline = settings.baseline or best_mean_method(profile, phase, settings.statistic)
    store = Store(workspace / "results.sqlite")

    def runner_for(suite: str, suite_settings, metric: str) -> ExperimentRunner:
        return ExperimentRunner(
            store,
            settings.model,
            model,
            tokenizer,
            suite,
            suite_settings,
            settings.seed,
            metric,
            progress=on_run or (lambda name: say(f"run {name}")),
            on_sample=on_sample,
            backend=settings.backend,
            device=settings.device,
            batched=settings.batched,
        )

    runner = runner_for(settings.suite, primary, settings.metric)
    placement_runner = runner_for(placement_suite, placing, settings.placement_metric or settings.metric)

    # A short route may admit fewer distinct count-matched placements than asked for (5 layers with one
    # method twice: 59): then every one of them is run, which makes the control exhaustive, not sampled.
    placements = min(settings.placements, placement_count([layer[phase].method for layer in route.layers]))
    if placements < settings.placements:
        say(f"placement: the route admits only {placements} other placements; running all of them")
    factorial_args = (profile, settings.scope, settings.budget, baseline, settings.statistic, settings.allocation)
    baselines = list(settings.baselines) if settings.baselines else None
    sweep_args = {s: (routes[s], list(settings.budgets), baselines) for s in settings.swept}
    if settings.batched and settings.backend == "local":
        # The factorial's and the sweeps' runs share the primary suite's samples: one batch for them all.
        say(f"{settings.suite} runs (factorial and sweeps, together)")
        started = time.perf_counter()
        plans = list(factorial_plans(*factorial_args).values())
        for s in settings.swept:
            plans += list(sweep_plans(*sweep_args[s], profile=profile).values())
        runner.run_all(list({plan.to_json(): plan for plan in plans}.values()))
        seconds[f"{settings.suite} runs"] = time.perf_counter() - started
    reports: dict[str, Any] = {}
    steps = {
        "factorial": lambda: factorial(runner, *factorial_args),
        "placement": lambda: placement(placement_runner, profile, route, placements, settings.statistic),
        **{f"sweep {s}": (lambda s=s: sweep(runner, *sweep_args[s], profile=profile)) for s in settings.swept},
    }
    for name, step in steps.items():
        say(name)
        started = time.perf_counter()
        reports[name] = step()
        seconds[name] = time.perf_counter() - started
    store.checkpoint()  # the database file alone then holds every run the report cites
    sweeps = {s: reports[f"sweep {s}"] for s in settings.swept}
    cited = {run for report in sweeps.values() for series in report.data["runs"].values() for run in series.values()}
    cited |= {report.data["full"]["run"] for report in sweeps.values()}
    uses_chat = getattr(SUITES[settings.suite], "uses_chat_template", None)
    return StudyResult(
        settings,
        profile,
        route,
        baseline,
        reports["factorial"],
        reports["placement"],
        sweeps[settings.scope],
        seconds,
        store.path,
        primary.to_dict(),
        routes,
        sweeps,
        placing.to_dict(),
        {run: runner.task_scores(run) for run in sorted(cited)},
        None if uses_chat is None else bool(uses_chat(tokenizer, primary)),
    )


def write_report(result: StudyResult, path: Path, command: str = "") -> Path:
    """Write the Markdown report at `path` and its figures beside it (see `polykv.eval.study_report`)."""
    from polykv.eval.study_report import write_report as write

    return write(result, path, command)

"""The study's steps that do more than call an experiment: the profile, the anchor measured on calibration
samples, the workload pilot (competence, the spread of paired differences) and the choice of samples per task.
`polykv.eval.study.run.run_study` calls them in order; each reads and writes the study's store and model."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from polykv.eval.workloads.competence import Competence, SamplePlan, competent_tasks, plan_samples
from polykv.eval.workloads.workload import CALIBRATION_SEED
from polykv.plan import FULL, Phase, Plan
from polykv.progress import Fraction, Progress, Step
from polykv.workspace import results_path

if TYPE_CHECKING:
    from polykv.eval.results.store import Store
    from polykv.eval.study.settings import StudySettings


@dataclass
class StudyContext:
    """What every step needs: the settings, where results go, how to report progress, and the model."""

    settings: StudySettings
    workspace: Path
    say: Step
    on_run: Step | None = None
    on_sample: Progress | None = None
    store: Store | None = None  # the results store, once opened
    model: Any = field(default=None, repr=False)
    tokenizer: Any = field(default=None, repr=False)

    def __post_init__(self):
        from polykv.models import load_model

        if self.model is None:
            self.model, self.tokenizer = load_model(self.settings.model, device=self.settings.device)  # quiet


def profile(context: StudyContext, on_profile: Fraction | None = None):
    """The study's profile: the swept phases only, on the calibration corpus."""
    from polykv.profile.build import build_profile
    from polykv.profile.corpus import CorpusSpec, default_sources

    s = context.settings
    recorded = recorded_profile(context) if s.replay else None
    if recorded is not None:
        return recorded
    spec = CorpusSpec(
        sources=s.calibration_sources or default_sources(s.model),
        num_sequences=s.calibration_sequences,
        max_tokens=s.calibration_tokens,
        seed=s.seed,
    )
    return build_profile(
        s.model,
        context.model,
        context.tokenizer,
        context.workspace / "profiles",
        spec,
        capacity=s.b_cal,
        scopes=tuple(Phase(p) for p in sorted(s.swept, key=lambda p: p != "prefill")),
        progress=on_profile,
        compute=not s.replay,
    )


def recorded_profile(context: StudyContext):
    """The profile the study's stored routes were built from (their plans' provenance), as it was recorded: a
    replay reads it even where today's methods would make it stale; None where no stored route names one."""
    import dataclasses
    import json

    from polykv.eval.results.store import Store
    from polykv.profile.store import load_profile

    database = results_path(context.workspace)
    for run in reversed(Store.reader(database).runs()) if database.is_file() else []:  # the newest route first
        provenance = json.loads(run.plan_json).get("provenance") or {}
        folder = context.workspace / "profiles" / str(provenance.get("profile", ""))
        if provenance.get("built_by") == "toprank" and provenance.get("profile") and folder.is_dir():
            return dataclasses.replace(load_profile(folder), as_recorded=True)
    return None


def runner(context: StudyContext, suite: str, suite_settings, metric: str, seed: int | None = None):
    from polykv.eval.experiments import ExperimentRunner

    s = context.settings
    return ExperimentRunner(
        context.store,
        s.model,
        context.model,
        context.tokenizer,
        suite,
        suite_settings,
        s.seed if seed is None else seed,
        metric,
        progress=context.on_run or (lambda name: context.say(f"run {name}")),
        on_sample=context.on_sample,
        backend=s.backend,
        device=s.device,
        batched=s.batched,
        workers=s.workers,
        replay=s.replay,
    )


def chat_template(context: StudyContext, suite: str, suite_settings) -> bool | None:
    from polykv.eval.running.suite_runner import SUITES

    uses = getattr(SUITES[suite], "uses_chat_template", None)
    return None if uses is None else bool(uses(context.tokenizer, suite_settings))


def strongest_anchor(context: StudyContext, primary, profile, settings) -> str:
    """The method that scores best alone (as the factorial's homogeneous cell: the routed cells' capacities,
    the profile's parameters) on calibration samples of the suite: the evaluation seed + CALIBRATION_SEED,
    never an evaluation sample (refused if a calibration prompt is an evaluation prompt)."""
    from polykv.eval.comparing.compare import macro_average
    from polykv.eval.experiments import factorial_plans
    from polykv.eval.statistics.contrast import direction
    from polykv.eval.workloads.competence import QUESTION_SUITES
    from polykv.methods import for_phase

    if settings.suite not in QUESTION_SUITES:
        raise ValueError(
            "the strongest anchor is measured on a question suite's calibration samples (ruler, longbench)"
        )
    phase = Phase(settings.scope)
    calibration = dataclasses.replace(primary, samples_per_task=settings.pilot_samples)
    seed = settings.seed + CALIBRATION_SEED
    _refuse_overlap(context, settings.suite, calibration, seed, primary, settings.seed)
    candidates = {}
    for method in for_phase(phase):
        cells = factorial_plans(profile, phase.value, settings.budget, method, settings.statistic, settings.allocation)
        candidates[method] = cells["homogeneous-uniform"]
    measure = runner(context, settings.suite, calibration, settings.metric, seed)
    ids = dict(zip(candidates, measure.run_all(list(candidates.values()))))
    sign = direction(settings.metric)
    return max(ids, key=lambda method: sign * macro_average(measure.task_scores(ids[method])))


def _refuse_overlap(context: StudyContext, suite: str, calibration, seed: int, evaluation, evaluation_seed: int):
    from polykv.eval.running.suite_runner import SUITES, prompt_id

    module = SUITES[suite]

    def hashes(suite_settings, s):
        samples = module.build_samples(context.tokenizer, context.model, suite_settings, s)
        return {prompt_id(module, task, sample, s, payload)["sha256"] for task, sample, payload in samples}

    if hashes(calibration, seed) & hashes(evaluation, evaluation_seed):
        raise ValueError("a calibration sample of the anchor is also an evaluation sample: choose another seed")


def competence_pilot(context: StudyContext, primary, layers: int) -> Competence:
    """FullKV (generating and scoring) on `pilot_samples` samples of every task: its accuracy decides which
    tasks stay (`workload.competent_tasks`), and when none does the study stops here (ValueError), before any
    other plan runs."""
    s = context.settings
    fullkv = Plan.homogeneous(FULL, None, layers)
    piloted = dataclasses.replace(primary, samples_per_task=s.pilot_samples)
    pilot = runner(context, s.suite, dataclasses.replace(piloted, mode="both"), "score")
    (full_run,) = pilot.run_all([fullkv])
    accuracy = pilot.task_scores(full_run)  # the pilot's tasks (a replayed run may hold more)
    ordered = {task: accuracy[task] for task in sorted(accuracy, key=list(piloted.tasks).index)}
    kept, excluded = competent_tasks(ordered, s.competence_threshold)
    competence = Competence(s.competence_threshold, ordered, tuple(kept), tuple(excluded), s.pilot_samples, full_run)
    if not kept:
        raise ValueError(
            f"FullKV is under {s.competence_threshold:g}% on every task of the pilot ({competence.excluded_text()}): "
            "nothing to compare plans on"
        )
    return competence


def anchor_spread(context: StudyContext, kept, anchor_plan: Plan, competence: Competence) -> dict[str, np.ndarray]:
    """The anchor (in the primary mode) on the pilot's samples of the kept tasks (`kept`: the primary settings
    on those tasks): the paired differences anchor - FullKV in the primary metric, per task, are the spread
    `choose_samples` plans with."""
    from polykv.eval.comparing.compare import sample_scores

    s = context.settings
    piloted = dataclasses.replace(kept, samples_per_task=s.pilot_samples)
    (anchor_run,) = runner(context, s.suite, piloted, s.metric).run_all([anchor_plan])
    full_samples = sample_scores(context.store, competence.run, s.metric)
    anchor_samples = sample_scores(context.store, anchor_run, s.metric)
    return {
        task: np.array([anchor_samples[task][k] - full_samples[task][k] for k in sorted(anchor_samples[task])])
        for task in competence.kept
    }


def choose_samples(context: StudyContext, primary, plans: list[Plan], pilot_diffs: dict[str, np.ndarray]) -> SamplePlan:
    """Samples per task for the primary runs: the pilot's spread against the target minimal detectable
    difference, within the time limit at the measured time of one sample with every plan of the study."""
    import torch

    from polykv.eval.running.suite_runner import SUITES

    s = context.settings
    allowed = None if s.time_limit is None else s.time_limit * 60.0
    if s.sample_seconds is not None:  # measured before (the study rendered again from its database)
        return plan_samples(pilot_diffs, s.mde, s.sample_seconds, allowed, s.min_samples)
    if s.replay:
        raise ValueError("a replay times nothing: give --sample-seconds (the time the study's first run measured)")
    module = SUITES[s.suite]
    one = dataclasses.replace(primary, samples_per_task=1)
    samples = module.build_samples(context.tokenizer, context.model, one, s.seed)
    times = []
    threads = torch.get_num_threads()
    if s.workers > 1:  # timed as a worker runs (one thread); the workers then take samples in parallel
        torch.set_num_threads(1)
    try:
        for _, _, payload in samples:  # not stored: these runs are not the study's (their sample count differs)
            started = time.perf_counter()
            module.score_samples(context.model, plans, payload, one)
            times.append(time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads)
    return plan_samples(pilot_diffs, s.mde, float(np.mean(times)) / s.workers, allowed, s.min_samples)


__all__ = [
    "StudyContext",
    "anchor_spread",
    "chat_template",
    "choose_samples",
    "competence_pilot",
    "profile",
    "runner",
    "strongest_anchor",
]

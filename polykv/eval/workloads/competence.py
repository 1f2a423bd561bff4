"""Before any plan is judged on a workload: which tasks the model can do at all, and how many samples a study
needs to see the differences it asks about.

Competence. A task the model fails with its whole cache (FullKV) cannot tell eviction plans apart: every
plan scores 0 there, and the macro-average only shrinks. The rule, fixed before any plan runs: a task whose
FullKV accuracy is under `threshold` (default 20%) is left out of the macro-average (and listed, with its
FullKV score). `floor_tasks` applies the same rule to any run of the store, for the pages that show runs.

Samples. The minimal detectable difference of a paired comparison falls as 1 / sqrt(samples); a pilot of
FullKV and the homogeneous anchor gives the spread of paired per-sample differences in each task, from
which `plan_samples` picks the samples per task that reach a target difference, within a time allowance
measured on the study's own batch of plans (`polykv.eval.statistics.samples.samples_for`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from polykv.eval.results.rows import RunRow
from polykv.eval.running.settings import COMPETENCE_THRESHOLD
from polykv.eval.statistics.samples import expected_mde, samples_for

QUESTION_SUITES = ("ruler", "longbench")  # suites whose `score` is an accuracy a model can fail at


@dataclass(frozen=True)
class Competence:
    """The competence rule applied to FullKV's pilot: which tasks stay in the macro-average."""

    threshold: float
    fullkv: dict[str, float]  # task -> FullKV accuracy (0-100)
    kept: tuple[str, ...]
    excluded: tuple[str, ...]
    samples: int  # pilot samples per task
    run: str  # the FullKV pilot run

    def rule(self) -> str:
        return (
            f"a task whose FullKV accuracy is under {self.threshold:g}% on the pilot ({self.samples} samples per "
            f"task, run {self.run}) is left out of the macro-average; the rule was fixed before any plan ran"
        )

    def excluded_text(self) -> str:
        if not self.excluded:
            return "none"
        return ", ".join(f"{task} (FullKV {self.fullkv[task]:.1f})" for task in self.excluded)


def competent_tasks(
    fullkv: Mapping[str, float], threshold: float = COMPETENCE_THRESHOLD
) -> tuple[list[str], list[str]]:
    """(kept, excluded) tasks, each in the given order: kept when FullKV's accuracy is at least `threshold`."""
    kept = [task for task, value in fullkv.items() if value >= threshold]
    return kept, [task for task in fullkv if task not in kept]


def floor_tasks(store, run: RunRow, threshold: float = COMPETENCE_THRESHOLD) -> dict[str, float]:
    """The tasks of a question-suite run at which FullKV, on the same model, suite and settings, scores under
    `threshold`: {task: FullKV's accuracy}. Empty when the store holds no such finished FullKV run."""
    from polykv.eval.comparing.answers import fullkv_twin

    if run.suite not in QUESTION_SUITES:
        return {}
    fullkv = fullkv_twin(store, run)
    if fullkv is None:
        return {}
    scores = {task: values["score"] for task, values in store.task_scores(fullkv).items() if "score" in values}
    return {task: value for task, value in sorted(scores.items()) if value < threshold}


def floor_warnings(store, threshold: float = COMPETENCE_THRESHOLD) -> list[str]:
    """One line per FullKV run of a question suite with tasks at the floor: which tasks, FullKV's accuracy
    there, and how many finished runs of the same model, suite and settings they weigh on."""
    from polykv.eval.comparing.answers import is_fullkv, settings_of

    groups: dict[tuple, list[RunRow]] = {}
    for run in store.runs():
        if run.status == "finished" and run.suite in QUESTION_SUITES:
            key = (run.model, run.suite, json.dumps(settings_of(run), sort_keys=True))
            groups.setdefault(key, []).append(run)
    out = []
    for members in groups.values():
        full = next((run for run in members if is_fullkv(run.plan_json)), None)
        floor = floor_tasks(store, full, threshold) if full is not None else {}
        if floor:
            tasks = ", ".join(f"{task} ({value:.0f}%)" for task, value in floor.items())
            out.append(
                f"FullKV run {full.id} scores under {threshold:g}% on {tasks}: at the floor, those tasks cannot "
                f"tell plans apart; leave them out of comparisons ({len(members)} runs share these settings)"
            )
    return out


# ---- how many samples ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplePlan:
    """The samples per task a study uses, and why."""

    samples_per_task: int
    expected_mde: float  # minimal detectable macro difference at that count, from the pilot's spread
    target_mde: float | None  # what was asked for (None: no target)
    for_target: int | None  # the count the target needs
    for_time: int | None  # the most the time allowance affords
    seconds_per_sample: float | None  # one sample with all the study's plans, measured (mean over tasks)
    pilot_sd: dict[str, float]  # per task, the SD of the pilot's paired differences
    reason: str


def plan_samples(
    pilot: Mapping[str, Sequence[float]],
    target: float | None,
    seconds_per_sample: float | None,
    seconds_allowed: float | None,
    minimum: int = 1,
    maximum: int = 10_000,
) -> SamplePlan:
    """Samples per task from the pilot's paired differences (task -> differences): enough to bring the minimal
    detectable difference down to `target`, at least `minimum`, and no more than `seconds_allowed` affords at
    `seconds_per_sample` (one sample, every plan; the mean over tasks); the time bound wins over the target and the
    minimum, and the report says so."""
    sds = {task: float(np.std(np.asarray(d, dtype=float), ddof=1)) if len(d) > 1 else 0.0 for task, d in pilot.items()}
    if not sds:
        raise ValueError("the pilot has no task to plan samples for")
    spreads = list(sds.values())
    # a task whose pilot differences are all equal gives no spread: the others' decide
    for_target = samples_for(spreads, target, most=maximum) if target is not None and any(spreads) else None
    for_time = affordable = None
    if seconds_allowed is not None and seconds_per_sample:
        affordable = int(seconds_allowed // (seconds_per_sample * len(sds)))
        for_time = max(2, affordable)  # a paired test needs 2 samples a task, even past the allowance
    if for_target is not None:
        wanted = max(minimum, for_target)
    else:  # no target (or no spread to plan with): as many as the time affords, else the minimum
        wanted = max(minimum, for_time) if for_time is not None else minimum
    chosen = max(2, min(min(wanted, for_time) if for_time is not None else wanted, maximum))
    mde = expected_mde(spreads, chosen)
    if affordable is not None and affordable < 2:
        reason = (
            f"2 samples per task, the least a paired test needs, exceed the time allowance (it affords {affordable})"
        )
    elif for_time is not None and for_time < wanted:
        reason = f"the time allowance affords {for_time} samples per task (wanted {wanted})"
    elif for_target is None and for_time is not None:
        reason = f"the time allowance affords {for_time} samples per task" + (
            " (no target given)" if target is None else " (the pilot shows no spread to plan a target with)"
        )
    elif for_target is not None and not mde <= target:
        reason = f"{chosen} samples per task, the most allowed, do not reach the target {target:g}"
    elif for_target is not None and for_target >= minimum:
        reason = f"{for_target} samples per task reach the target minimal detectable difference {target:g}"
    else:
        reason = f"the minimum of {minimum} samples per task" + (
            f" (the target {target:g} needs only {for_target})" if for_target is not None else ""
        )
    return SamplePlan(
        chosen,
        mde,
        target,
        for_target,
        for_time,
        seconds_per_sample,
        sds,
        reason,
    )


__all__ = [
    "COMPETENCE_THRESHOLD",
    "QUESTION_SUITES",
    "Competence",
    "SamplePlan",
    "competent_tasks",
    "floor_tasks",
    "floor_warnings",
    "plan_samples",
]

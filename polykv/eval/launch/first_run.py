"""The first run the Runs page proposes: one that can tell the designer's plan from a homogeneous one.

One generated sample of a few tasks cannot (a 0/100 score flipping on three samples is no evidence). What can,
on a laptop, is the dense `answer_nll` (RULER in score mode: the gold answer's likelihood, no generation) on
enough samples of tasks where FullKV itself succeeds, against the best homogeneous plan of the plan's own scope
and budget (like with like), with FullKV beside them. It goes in two steps:

1. **the pilot**: the plan and that baseline on `PILOT_SAMPLES` samples per task (its own seed, so the decisive
   run's samples are fresh): their paired differences give the spread;
2. **the decisive run**: as many samples per task as bring the minimal detectable difference down to the target,
   or as the time allowance affords (`polykv.eval.workloads.competence.plan_samples`), said before it starts.

Tasks: those where FullKV's accuracy clears the competence rule in the workspace's own FullKV runs of RULER at
that length, else on record for an embedded model (its committed competence pilot), else the needle tasks
(unchecked, and said so). The baseline: the best homogeneous plan in the workspace's runs of these settings, else
the best method of a profile of the model in that scope, else the paper's anchor (TOVA; SnapKV for prefill).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import numpy as np

from polykv.eval.running.settings import COMPETENCE_THRESHOLD
from polykv.plan import Phase, Plan, Scope

PILOT_SAMPLES = 4  # per task: enough for a spread, minutes on a laptop
PILOT_SEED_OFFSET = 1000  # the pilot's samples are not the decisive run's
LENGTH = 1024  # RULER's standard length a first run uses on a CPU (the largest standard one up to it that fits)
TARGET_MDE = 0.05  # nats of answer_nll: a fifth of the differences between methods seen at small budgets
ALLOWANCE_S = 600.0  # what a first run may take here, by default
NEEDLES = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1")
# FullKV's competence on record (RULER at 1,024 tokens, generating): tasks at or over the 20% rule in the
# committed pilots (docs/smollm2-study/results.sqlite run 9479488bf3d89f9d, 10 samples per task;
# docs/gemma3-workload/competence/results.sqlite run 978dde6ff49a4525, 4 samples per task)
ON_RECORD = {
    "smollm2": ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "fwe"),
    "gemma3": ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "fwe"),
}
PAPER_ANCHOR = {Scope.DECODE: "tova", Scope.BOTH: "tova", Scope.PREFILL: "snapkv"}


@dataclasses.dataclass(frozen=True)
class FirstRun:
    """What the Runs page proposes: `pilot` True for step 1 (no spread measured yet), else the decisive run."""

    settings: object  # RulerSettings, score mode
    seed: int
    baseline: str  # the homogeneous method
    plans: tuple[tuple[dict, Plan], ...]  # labelled as the Runs page labels them (route, baseline, full)
    pilot: bool
    samples: object | None  # the decisive run's `SamplePlan` (None for the pilot)
    reasons: tuple[str, ...]  # where the tasks, the baseline and the sample count come from, one line each


def _budget(plan: Plan) -> int | None:
    from polykv.eval.experiments import plan_budget

    return plan_budget(plan)


def competent(model_name: str, store, length: int) -> tuple[tuple[str, ...], str]:
    """The tasks where FullKV succeeds at `length`, and where that is known from."""
    from polykv.eval.suites.answers import keeps_everything
    from polykv.eval.workloads.competence import competent_tasks

    for run in reversed(store.runs() if store is not None else []):
        if run.model != model_name or run.suite != "ruler" or run.status != "finished":
            continue
        settings = json.loads(run.settings)
        if settings.get("length") != length or settings.get("mode", "generate") == "score":
            continue
        if not keeps_everything(Plan.from_json(run.plan_json)):
            continue
        scores = {task: values["score"] for task, values in store.task_scores(run.id).items() if "score" in values}
        kept, _ = competent_tasks(scores)
        kept = [t for t in kept if "@" not in t]
        if kept:
            return tuple(kept), f"tasks where FullKV's accuracy is at least {COMPETENCE_THRESHOLD:g}% in run {run.id}"
    if model_name in ON_RECORD:
        return ON_RECORD[model_name], (
            f"tasks where FullKV's accuracy clears {COMPETENCE_THRESHOLD:g}% in {model_name}'s committed "
            "competence pilot"
        )
    return NEEDLES, "the needle tasks (FullKV's competence on them unchecked here: launch full, generating, to check)"


def rivals(plan: Plan) -> dict[str, Plan]:
    """Method -> the homogeneous plan of `plan`'s scope at its budget (parameters fitted to it; a method that
    cannot run there, or whose plan is `plan` itself, left out): the like-with-like baselines."""
    from polykv.eval.method_protocols import homogeneous_plans

    found = {}
    for rival in homogeneous_plans(plan.scope, _budget(plan), plan.num_layers):
        method = rival.layers[0][plan.scope.phases[0]].method
        if rival.allocation == "fixed" and method not in found and rival.layers != plan.layers:
            found[method] = rival
    return found


def best_homogeneous(
    plan: Plan, store, settings_dict: dict, model_name: str, seed: int, profile=None
) -> tuple[str, str]:
    """The homogeneous method to beat in the plan's scope and budget, and why."""
    from polykv.eval.comparing.compare import sample_scores
    from polykv.eval.running.suite_runner import run_id_for

    candidates = rivals(plan)
    if not candidates:
        raise ValueError(f"no homogeneous plan runs in the {plan.scope.value} scope at budget {_budget(plan)}")
    found = []
    for method, rival in candidates.items():
        run_id = run_id_for(model_name, rival, "ruler", settings_dict, seed)
        row = store.run(run_id) if store is not None else None
        if row is not None and row.status == "finished":
            values = [v for task in sample_scores(store, run_id, "answer_nll").values() for v in task.values()]
            if values:
                found.append((float(np.mean(values)), method, run_id))
    if found:
        value, method, run_id = min(found)
        which = f"the best of the {len(found)} homogeneous plans" if len(found) > 1 else "the only homogeneous plan"
        return method, f"{method}: {which} in this workspace's pilots (answer_nll {value:.3f}, run {run_id})"
    if profile is not None:
        from polykv.eval.study.run import best_mean_method

        phase = Phase.PREFILL if plan.scope is Scope.PREFILL else Phase.DECODE
        method = best_mean_method(profile, phase, "cosine")
        if method in candidates:
            return (
                method,
                f"{method}: the best method alone in profile {profile.key} ({phase.value}, mean cosine over layers)",
            )
    preferred = [PAPER_ANCHOR[plan.scope], *candidates]
    method = next(m for m in preferred if m in candidates)
    why = "the paper's homogeneous anchor" if method == PAPER_ANCHOR[plan.scope] else "a homogeneous plan"
    return method, f"{method}: {why} for a {plan.scope.value} plan (no pilot or profile here)"


def settings_for(tasks: Sequence[str], length: int, samples: int):
    from polykv.eval.suites.ruler import RulerSettings
    from polykv.eval.workloads.workload import ANSWER_TOKENS

    return RulerSettings(
        tasks=tuple(tasks), length=length, samples_per_task=samples, mode="score", answer_tokens=ANSWER_TOKENS
    )


def labelled(plan: Plan, baseline: str) -> tuple[tuple[dict, Plan], ...]:
    """The plan, the baseline in the plan's own scope at its budget, and FullKV, labelled as the Runs page does."""
    from polykv.plan import FULL

    budget = _budget(plan)
    rival = rivals(plan)[baseline]
    full = Plan.homogeneous(FULL, None, plan.num_layers)
    return (
        ({"series": "route", "budget": budget}, plan),
        ({"series": baseline, "budget": budget}, rival),
        ({"series": "full"}, full),
    )


def pilot_seconds(store, model_name: str, plans: Sequence[Plan], settings, seed: int) -> float | None:
    """Seconds one pilot sample took with all of `plans` (the mean over samples), as the runs recorded them."""
    from polykv.eval.running.suite_runner import run_id_for

    per_plan = []
    for plan in plans:
        rows = store.samples(run_id_for(model_name, plan, "ruler", settings.to_dict(), seed))
        if not rows:
            return None
        per_plan.append(float(np.mean([row.seconds for row in rows])))
    return sum(per_plan)


def pilot_differences(
    store, model_name: str, plan: Plan, rival: Plan, settings, seed: int
) -> dict[str, np.ndarray] | None:
    """Per task, the pilot's paired answer_nll differences (plan - rival); None until both pilot runs finished."""
    from polykv.eval.comparing.compare import sample_scores
    from polykv.eval.running.suite_runner import run_id_for
    from polykv.eval.statistics.samples import paired_differences

    ids = [run_id_for(model_name, p, "ruler", settings.to_dict(), seed) for p in (plan, rival)]
    rows = [store.run(i) if store is not None else None for i in ids]
    if any(r is None or r.status != "finished" for r in rows):
        return None
    return paired_differences(*(sample_scores(store, i, "answer_nll") for i in ids))


_PER_SAMPLE: dict[tuple, float] = {}  # (model, device, tasks, length, rates' date) -> seconds: a page asks often


def cost_per_sample(model_name: str, device: str, model, tokenizer, tasks: Sequence[str], length: int) -> float | None:
    """The cost model's seconds for one sample of the decisive run (its three plans), the mean over `tasks`;
    None until the model's speed here is measured (`polykv.costs`)."""
    from polykv import costs
    from polykv.eval.launch.work import sample_shapes, suite_work

    rates = costs.stored_rates(model_name, device)
    if rates is None:
        return None
    learned = tuple((kind, tuple(r)) for kind, r in sorted(rates.ratios.items()))
    key = (model_name, device, tuple(tasks), length, rates.measured, learned)
    if key not in _PER_SAMPLE:
        shapes = sample_shapes("ruler", settings_for(tasks, length, 1), model, tokenizer)
        work = suite_work("eval", shapes, 3, batched=False).loaded(0)
        _PER_SAMPLE[key] = costs.estimate(work, rates).seconds / len(tasks)
    return _PER_SAMPLE[key]


def propose(
    model_name: str,
    plan: Plan,
    store,
    length: int,
    seed: int = 0,
    profile=None,
    seconds_per_sample: float | None = None,
    allowance_s: float = ALLOWANCE_S,
    target: float = TARGET_MDE,
) -> FirstRun:
    """The proposed first run for `plan` on `model_name` (see the module docstring). The decisive run's samples
    fit `allowance_s` at the pilot's own measured seconds per sample (its two plans, scaled to three with FullKV),
    else at `seconds_per_sample` (the cost model's, three plans)."""
    from polykv.eval.workloads.competence import plan_samples

    if _budget(plan) is None:
        raise ValueError("the plan keeps every token: give it capacities to compare it with a homogeneous plan")
    tasks, why_tasks = competent(model_name, store, length)
    pilot_seed = seed + PILOT_SEED_OFFSET
    pilot_settings = settings_for(tasks, length, PILOT_SAMPLES)
    baseline, why_baseline = best_homogeneous(plan, store, pilot_settings.to_dict(), model_name, pilot_seed, profile)
    plans = labelled(plan, baseline)
    diffs = pilot_differences(store, model_name, plan, plans[1][1], pilot_settings, pilot_seed)
    if diffs is None:
        reasons = (
            f"tasks: {why_tasks}",
            f"baseline: {why_baseline}",
            f"step 1, the pilot: {PILOT_SAMPLES} samples per task (seed {pilot_seed}) measure how much the plan and "
            "the baseline differ sample by sample; the decisive run's size and what it can detect follow from it",
        )
        return FirstRun(pilot_settings, pilot_seed, baseline, plans[:2], True, None, reasons)
    if not any(np.any(d != 0) for d in diffs.values()):
        raise ValueError(
            f"the plan and {baseline} gave the same answer_nll on every pilot sample: there is no difference to size "
            "a run for"
        )
    measured = pilot_seconds(store, model_name, [p for _, p in plans[:2]], pilot_settings, pilot_seed)
    per_sample = measured * 1.5 if measured is not None else seconds_per_sample  # FullKV joins the two plans
    chosen = plan_samples(diffs, target, per_sample, allowance_s, minimum=PILOT_SAMPLES)
    reasons = (
        f"tasks: {why_tasks}",
        f"baseline: {why_baseline}",
        f"samples: {chosen.reason} (from the pilot's spread; seed {seed}, fresh samples)",
    )
    return FirstRun(settings_for(tasks, length, chosen.samples_per_task), seed, baseline, plans, False, chosen, reasons)


__all__ = [
    "ALLOWANCE_S",
    "cost_per_sample",
    "PILOT_SAMPLES",
    "TARGET_MDE",
    "FirstRun",
    "best_homogeneous",
    "competent",
    "propose",
]

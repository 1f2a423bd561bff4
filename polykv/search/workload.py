"""Plans for a workload: searched on the workload's calibration samples, judged on its held-out samples.

`workload_report` runs, at every budget b (average tokens per layer, the searched scope's phases):
  1. the contenders, each built or chosen on the *search* samples (calibration split,
     `polykv.eval.calibration`), scored by answer_nll (`polykv.search.answer_objective`):
       toprank-workload  TopRank by danswer from the workload profile, b tokens in every layer;
       toprank-text      TopRank from a text profile (when one is given), b tokens in every layer;
       homogeneous       the best one-method plan of the scope at b (fixed or native allocation);
       envelope          the best of the nine baselines, each under its own protocol (its phases, its
                         allocation: as the sweep runs them, `polykv.eval.protocols`);
       searched          the local search (`polykv.search.search`) from toprank-workload and the best fixed
                         homogeneous plan, moves ranked by the workload profile's danswer;
  2. the verdict: every contender and FullKV evaluated by the suite itself on the *held-out* samples (the
     evaluation split: what `polykv eval` draws at the seed), generating and scoring (mode both: accuracy
     and answer_nll), on the searched tasks and on the transfer tasks (tasks the plan never saw). Each
     contender against the envelope, and the searched plan against each other contender, sample by sample:
     the sign-flip permutation test, the within-task bootstrap interval and the minimal detectable
     difference at 80% power (`polykv.eval.paired_samples`), and per-sample wins, ties and losses.
The runs are kept in `<out>/results.sqlite` (every sample's answer readable with `polykv runs show`).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

from polykv.eval.workload import COMPETENCE_THRESHOLD
from polykv.kv_memory import kv_dimensions
from polykv.plan import FULL, Plan, Scope
from polykv.search.answer_objective import METRIC, AnswerObjective
from polykv.search.moves import base_params
from polykv.search.objective import plan_key
from polykv.search.report import homogeneous_plans, toprank_plan
from polykv.search.search import SearchSettings, search, with_provenance
from polykv.search.workload_verdict import (
    FAMILIES,
    competent_families,
    majority_method,
    verdict,
)

FORMAT = "polykv.workload-report"
VERSION = 1
PILOT_SAMPLES = 10  # held-out samples per task FullKV generates on for the competence rule (the study's pilot)


@dataclasses.dataclass
class WorkloadSamples:
    """The workload, its search samples (calibration split) and how many held-out samples per task."""

    workload: Any  # polykv.eval.calibration.Workload
    search: list[tuple[str, str, dict]]
    held_out: int
    transfer: tuple[str, ...] = ()  # tasks of the same suite judged but never searched on
    seed: int = 0
    accuracy: int | None = None  # held-out samples per task that also generate (None: all of them)
    held_out_prompts: frozenset[str] = frozenset()  # the held-out samples' prompt hashes (never calibration)
    lengths: dict = dataclasses.field(default_factory=dict)  # per task, the held-out samples' mean token counts

    def objective(self, model) -> AnswerObjective:
        from polykv.eval.calibration import question

        return AnswerObjective(
            model, [question(self.workload, p) for _, _, p in self.search], [t for t, _, _ in self.search]
        )

    @property
    def protocol(self) -> str:
        """The question protocol every sample is scored under (`polykv.eval.suites.answers`)."""
        return self.workload.settings.question

    def verdict_settings(self) -> dict[str, Any]:
        """{metric: the suite's settings whose runs give it} (`verdict_settings`)."""
        return verdict_settings(self.workload, self.held_out, self.transfer, self.accuracy)

    def summary(self) -> dict[str, Any]:
        return {
            "suite": self.workload.suite,
            "sources": list(self.workload.sources),
            "settings": self.workload.settings.to_dict(),
            "search_samples": len(self.search),
            "search_per_task": len(self.search) // len(self.workload.tasks),
            "held_out_per_task": self.held_out,
            "transfer": list(self.transfer),
            "accuracy_per_task": self.held_out if self.accuracy is None else min(self.accuracy, self.held_out),
            "seed": self.seed,
            "question": self.protocol,
            "lengths": self.lengths,
        }


def verdict_settings(workload, held_out: int, transfer: Sequence[str] = (), accuracy: int | None = None) -> dict:
    """{metric: the suite's settings of the verdict runs that give it}: searched and transfer tasks, `held_out`
    samples per task scored (answer_nll); accuracy generated on the first `accuracy` of them (the same prompts:
    one seed), or on all in one run (mode both) when `accuracy` is None or not below `held_out`."""
    tasks = tuple(workload.tasks) + tuple(transfer)
    if accuracy is None or accuracy >= held_out:
        both = dataclasses.replace(workload.with_samples(held_out, "both"), tasks=tasks)
        return {"answer_nll": both, "score": both}
    return {
        "answer_nll": dataclasses.replace(workload.with_samples(held_out, "score"), tasks=tasks),
        "score": dataclasses.replace(workload.with_samples(accuracy, "generate"), tasks=tasks),
    }


def draw_samples(
    workload,
    tokenizer,
    model,
    search_per_task: int,
    held_out: int,
    seed: int = 0,
    transfer: Sequence[str] = (),
    accuracy: int | None = None,
) -> WorkloadSamples:
    """Search samples from the calibration split, none of them a held-out sample (checked by prompt)."""
    from polykv.eval.calibration import calibration_samples, evaluation_samples, prompt_hash

    overlap = set(transfer) & set(workload.tasks)
    if overlap:
        raise ValueError(f"transfer task {sorted(overlap)[0]} is also searched on: list it once")
    held = evaluation_samples(workload, tokenizer, model, held_out, seed)
    exclude = {prompt_hash(workload, task, sample, seed, payload) for task, sample, payload in held}
    chosen = calibration_samples(workload, tokenizer, model, search_per_task, seed, exclude)
    judged = list(held)
    if transfer:
        others = dataclasses.replace(workload, settings=dataclasses.replace(workload.settings, tasks=tuple(transfer)))
        judged += evaluation_samples(others, tokenizer, model, held_out, seed)
    lengths = sample_lengths(workload, judged)
    return WorkloadSamples(workload, chosen, held_out, tuple(transfer), seed, accuracy, frozenset(exclude), lengths)


def sample_lengths(workload, rows) -> dict[str, dict[str, float]]:
    """Per task, the mean token counts of its samples: the prompt, its question when it comes after compression
    (0 when in the prompt) and the gold answer scored (what the KV memory of a plan depends on)."""
    from polykv.eval.calibration import question

    out: dict[str, list] = {}
    for task, _, payload in rows:
        q = question(workload, payload)
        asked = 0 if q.question_start is None else len(q.prompt_ids) - q.question_start
        out.setdefault(task, []).append((len(q.prompt_ids), asked, len(q.answer_ids)))
    return {
        task: dict(zip(("prompt", "question", "answer"), (sum(col) / len(col) for col in zip(*values))))
        for task, values in out.items()
    }


def build_workload_profile(
    model_name: str, model, tokenizer, root, samples: WorkloadSamples, scope, b_cal: int | None = None, progress=None
):
    """The workload profile of the searched scope on the search's calibration split (its search samples per
    task, never a held-out prompt): danswer ranks the moves and gives toprank-workload (computed once, reused)."""
    from polykv.eval.calibration import workload_corpus
    from polykv.profile.build import build_profile
    from polykv.profile.corpus import CorpusSpec

    spec = CorpusSpec(
        sources=samples.workload.sources,
        num_sequences=len(samples.search),
        max_tokens=getattr(samples.workload.settings, "length", 2048),
        seed=samples.seed,
    )
    corpus = workload_corpus(tokenizer, model, spec, set(samples.held_out_prompts), samples.protocol)
    return build_profile(
        model_name,
        model,
        tokenizer,
        root,
        spec,
        capacity=b_cal,
        scopes=tuple(Scope(scope).phases),
        progress=progress,
        workload=corpus,
    )


def _best(objective: AnswerObjective, plans: Sequence[Plan]) -> tuple[Plan, dict[str, float]]:
    values = dict(zip((p.name for p in plans), objective.values(plans)))
    return min(plans, key=lambda p: (values[p.name], p.name)), values


def envelope_plans(budget: int, num_layers: int) -> list[Plan]:
    """The nine baselines at `budget`, each under its own protocol (as the sweep runs them)."""
    from polykv.eval.protocols import baseline_methods, baseline_plan

    return [baseline_plan(m, budget, num_layers) for m in baseline_methods()]


def contenders(
    objective: AnswerObjective,
    workload_profile,
    text_profile,
    scope: Scope,
    settings: SearchSettings,
    text_statistic: str = "dppl",
    on_step=None,
    on_trace=None,
) -> tuple[dict[str, Plan], dict[str, Any]]:
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
    chosen = {
        "homogeneous_scores": homogeneous_values,
        "envelope_scores": envelope_values,
        "search": found.to_dict(),
        "search_values": {role: objective.value(plan) for role, plan in plans.items()},
        "seconds": time.perf_counter() - started,
    }
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
) -> tuple[dict[str, Any], list[Plan]]:
    """The module docstring's procedure at every budget: (the report as a JSON-ready dict, the searched plans)."""
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
        contenders_seconds = chosen.pop("seconds")
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
            {
                "budget": budget,
                "plans": {role: plan.to_dict() for role, plan in plans.items()},
                "runs": run_ids,
                **chosen,
                "verdict": verdict(store, run_ids, families, seed, {r: p.scope.value for r, p in plans.items()}),
                "seconds": {"contenders": contenders_seconds, "verdict": time.perf_counter() - verdict_started},
            }
        )
        searched_plans.append(plans["searched"])
        left = len(budgets) - len(budgets_out)
        took = sum(budgets_out[-1]["seconds"].values()) / 60
        if left:
            say(f"budget {budget} took {took:.1f} min: about {took * left:.0f} min more for the {left} budget(s) left")
    report = {
        "format": FORMAT,
        "version": VERSION,
        "model": model_name,
        "kv": kv_dimensions(model),
        "scope": scope.value,
        "objective": METRIC,
        "seed": seed,
        "evaluations": evaluations,
        "candidates": candidates,
        "samples": samples.summary(),
        "workload_profile": {"key": workload_profile.key, "b_cal": workload_profile.meta.b_cal},
        "text_profile": None
        if text_profile is None
        else {"key": text_profile.key, "b_cal": text_profile.meta.b_cal, "statistic": text_statistic},
        "budgets": budgets_out,
        "fullkv_accuracy": fullkv_accuracy,
        "competence": {"threshold": competence, "pilot": pilot, "samples": piloted},
        "command": command,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "seconds": time.perf_counter() - started,
    }
    return report, searched_plans


__all__ = [
    "FORMAT",
    "PILOT_SAMPLES",
    "WorkloadSamples",
    "build_workload_profile",
    "contenders",
    "draw_samples",
    "envelope_plans",
    "sample_lengths",
    "verdict_settings",
    "workload_report",
]

"""Runs: (model, plan, suite, settings, seed) executed sample by sample into the store, resumable.

A suite is a module with `Settings` (a frozen dataclass with `to_dict()`), `build_samples(tokenizer,
model, settings, seed) -> [(task, sample id, payload)]`, `score_sample(model, plan, payload, settings)`
and `prompt_tokens(payload)` (the token ids whose hash names the sample's prompt in the store). A sample
scores as {metric: value}, or as an `answers.Scored` that also carries the model's answer and the gold
answers (the question suites), which the store keeps beside the metrics with the prompt's id ({"task",
"sample", "seed", "sha256"}: not the prompt). Task scores are the means of the sample metrics.

A run's id is a hash of what determines its results, so asking for the same run again finds it:
finished samples are skipped (a killed run resumes where it stopped) and a finished run returns at
once. That includes the code: the suite module's `REVISION` and the `revision` of every method the
plan uses (either phase), so a run measured with an older rule or older samples is never found as
the current one (it stays in the store under its own id). Progress is the number of sample rows in
the store, readable from any process.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
import weakref

import torch
import transformers

from polykv import __version__
from polykv.eval.results.store import SampleRecord, Store
from polykv.eval.suites import fidelity, longbench, ruler
from polykv.eval.suites.answers import Scored
from polykv.methods import REGISTRY, validate_plan
from polykv.models import num_layers
from polykv.plan import Phase, Plan
from polykv.progress import Progress

SUITES = {"fidelity": fidelity, "longbench": longbench, "ruler": ruler}


def plan_hash(plan: Plan) -> str:
    return hashlib.sha256(plan.to_json().encode()).hexdigest()


def code_revisions(plan: Plan, suite: str) -> dict:
    """{"suite": the suite's REVISION, "methods": {name: revision}} for every method in either phase."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r} (suites: {', '.join(SUITES)})")
    names = sorted({layer[phase].method for layer in plan.layers for phase in Phase})
    unknown = [name for name in names if name not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)} (methods: {', '.join(REGISTRY)})")
    return {"suite": int(SUITES[suite].REVISION), "methods": {name: int(REGISTRY[name].revision) for name in names}}


def run_id_for(model_name: str, plan: Plan, suite: str, settings: dict, seed: int) -> str:
    """The hash of model, plan, suite, settings, seed and the code revisions (`code_revisions`)."""
    revisions = code_revisions(plan, suite)
    blob = json.dumps([model_name, plan_hash(plan), suite, settings, seed, revisions], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_suite(
    store: Store,
    model_name: str,
    model,
    tokenizer,
    plan: Plan,
    suite: str = "fidelity",
    settings=None,
    seed: int = 0,
    progress: Progress | None = None,
) -> str:
    """Execute (or resume, or find) a run; returns its id. Scores land in the store as they finish.
    The plan runs alone (`routed` and `generate`): the reference `run_suites` is checked against."""
    return _execute(store, model_name, model, tokenizer, [plan], suite, settings, seed, progress, batched=False)[0]


def run_suites(
    store: Store,
    model_name: str,
    model,
    tokenizer,
    plans: list[Plan],
    suite: str = "fidelity",
    settings=None,
    seed: int = 0,
    progress: Progress | None = None,
    shard: tuple[int, int] | None = None,
) -> list[str]:
    """`run_suite` for several plans on the same samples, executed together: sample by sample, every
    plan still missing it is scored in one batch (the suite's `score_samples`: one prompt pass for all,
    their decode steps as one batch; `polykv.runtime.many_plans`). Equal to running each alone up to float
    rounding. Each run is stored, resumed and found exactly as `run_suite`'s; a sample's time is the
    batch's divided among its plans. `progress` sees (samples done, samples in all, where), samples
    counted over the batch's sample list. `shard` (k, n): only the samples whose index is k modulo n, and the
    runs are left unfinished (`polykv.eval.running.shards` runs n shards in parallel processes, then finishes them)."""
    return _execute(store, model_name, model, tokenizer, plans, suite, settings, seed, progress, True, shard)


def _execute(store, model_name, model, tokenizer, plans, suite, settings, seed, progress, batched, shard=None):
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r} (suites: {', '.join(SUITES)})")
    module = SUITES[suite]
    settings = settings or module.Settings()
    layers = num_layers(model)
    for plan in plans:
        validate_plan(plan, layers)
    ids = [run_id_for(model_name, plan, suite, settings.to_dict(), seed) for plan in plans]
    pending = {}  # run id -> plan, for the runs not finished yet (a plan listed twice runs once)
    for plan, run_id in zip(plans, ids):
        existing = store.run(run_id)
        if existing is None or existing.status != "finished":
            pending[run_id] = plan
    if not pending:
        return ids
    samples = _samples(module, suite, tokenizer, model, settings, seed)
    for run_id, plan in pending.items():
        store.create_run(
            run_id,
            model=model_name,
            plan_name=plan.name,
            plan_hash=plan_hash(plan),
            plan_json=plan.to_json(),
            suite=suite,
            settings=settings.to_dict(),
            seed=seed,
            total_samples=len(samples),
            versions={
                "polykv": __version__,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "python": platform.python_version(),
                "revisions": code_revisions(plan, suite),
                **_prompt_format(module, tokenizer, settings),
            },
        )
        store.set_running(run_id)  # this process is its worker now (a killed worker's run reads as "stopped")
    done = {run_id: store.done(run_id) for run_id in pending}
    score_many = getattr(module, "score_samples", None) if batched else None
    try:
        for index, (task, sample, payload) in enumerate(samples):
            if shard is not None and index % shard[1] != shard[0]:
                continue
            todo = [run_id for run_id in pending if (task, sample) not in done[run_id]]
            if todo:
                started = time.perf_counter()
                chosen = [pending[run_id] for run_id in todo]
                if score_many is not None:
                    metrics = score_many(model, chosen, payload, settings)
                else:
                    metrics = [module.score_sample(model, plan, payload, settings) for plan in chosen]
                seconds = (time.perf_counter() - started) / len(todo)
                prompt = prompt_id(module, task, sample, seed, payload)
                for run_id, values in zip(todo, metrics):
                    scores, record = _record(values, prompt)
                    store.add_sample(run_id, task, sample, scores, seconds, record)
            if progress is not None:
                progress(index + 1, len(samples), f"{task}/{sample}")
    except BaseException as exc:
        for run_id in pending:
            store.set_status(run_id, "failed", f"{exc.__class__.__name__}: {exc}"[:500])
        raise
    if shard is None:
        for run_id in pending:
            _finish(store, run_id)
    return ids


def prompt_id(module, task: str, sample: str, seed: int, payload) -> dict:
    """What names a sample's prompt in the store: task, sample id, seed and the sha256 of its token ids."""
    tokens = json.dumps([int(t) for t in module.prompt_tokens(payload)])
    return {"task": task, "sample": sample, "seed": seed, "sha256": hashlib.sha256(tokens.encode()).hexdigest()[:16]}


def _record(values, prompt: dict) -> tuple[dict[str, float], SampleRecord]:
    """A scored sample as (metrics, what the store keeps beside them)."""
    if isinstance(values, Scored):
        return values.metrics, SampleRecord(values.prediction, values.gold, prompt, values.kv_held)
    return values, SampleRecord(prompt=prompt)


def _prompt_format(module, tokenizer, settings) -> dict:
    """{"chat_template": whether the run's prompts are in the tokenizer's chat template}, for the suites
    that have the choice (their `use_chat_template` setting may say "auto")."""
    uses = getattr(module, "uses_chat_template", None)
    return {} if uses is None else {"chat_template": bool(uses(tokenizer, settings))}


# A suite's samples depend only on the model, its tokenizer, the settings and the seed, but building them
# can cost more than scoring (the fidelity suite samples text from the model): an experiment's runs over
# the same samples build them once per process. A weak reference guards against a new model reusing a
# freed one's id; the newest few sample sets are kept.
_SAMPLE_SETS = 8
_samples_cache: dict[tuple, tuple[weakref.ref, list]] = {}


def clear_sample_cache() -> None:
    """Forget every suite's cached samples (e.g. before rerunning under other arithmetic settings)."""
    _samples_cache.clear()


def _samples(module, suite: str, tokenizer, model, settings, seed: int) -> list:
    key = (id(model), id(tokenizer), suite, module.REVISION, json.dumps(settings.to_dict(), sort_keys=True), seed)
    entry = _samples_cache.get(key)
    if entry is not None and entry[0]() is model:
        return entry[1]
    samples = module.build_samples(tokenizer, model, settings, seed)
    _samples_cache.pop(key, None)
    _samples_cache[key] = (weakref.ref(model), samples)
    while len(_samples_cache) > _SAMPLE_SETS:
        _samples_cache.pop(next(iter(_samples_cache)))
    return samples


def _finish(store: Store, run_id: str) -> None:
    """Per task, the mean of every metric over its samples."""
    by_task: dict[str, list[dict[str, float]]] = {}
    for row in store.samples(run_id):
        by_task.setdefault(row.task, []).append(row.metrics)
    scores = {
        task: {metric: sum(m[metric] for m in rows) / len(rows) for metric in rows[0]} for task, rows in by_task.items()
    }
    store.set_task_scores(run_id, scores, {task: len(rows) for task, rows in by_task.items()})
    store.set_status(run_id, "finished")

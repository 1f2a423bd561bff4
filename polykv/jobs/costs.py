"""What a job will cost before it starts: its work counted from its own file (`polykv.eval.launch_work`) and
priced at the model's measured rates (`polykv.costs`). The launcher writes the estimate into the job
(`Job.estimate_s`); the worker records the time it took beside it, and their ratio corrects the next
estimates of that kind (`polykv.jobs.worker`)."""

from __future__ import annotations

import json
from collections import defaultdict

from polykv import costs
from polykv.costs import Work
from polykv.jobs.spec import Job

_SHAPES: dict[tuple, list] = {}  # (model, suite, settings, seed) -> shapes: a page asks again on every redraw


def _shapes(suite: str, settings_json: str, model, tokenizer, seed: int):
    from polykv.eval.launch_work import sample_shapes
    from polykv.eval.settings import suite_settings

    key = (id(model), suite, settings_json, seed)
    if key not in _SHAPES:
        if len(_SHAPES) > 64:
            _SHAPES.clear()
        _SHAPES[key] = sample_shapes(suite, suite_settings(suite, settings_json), model, tokenizer, seed)
    return _SHAPES[key]


def job_work(job: Job, model, tokenizer) -> Work:
    """The work `job` runs on `model` (loaded: its suites' first samples are built to measure them)."""
    from polykv.eval import launch_work as counted
    from polykv.models import context_length, num_layers

    layers, context = num_layers(model), context_length(model)
    if job.kind == "eval":  # runs one after another; FullKV's reference once per sample of each suite
        groups: dict[tuple, int] = defaultdict(int)
        for run in job.runs:
            groups[(run.unit.suite, run.unit.settings_json, run.unit.seed)] += 1
        work = Work("eval", (), loads=0)
        for (suite, settings_json, seed), plans in groups.items():
            shapes = _shapes(suite, settings_json, model, tokenizer, seed)
            work = work + counted.suite_work("eval", shapes, plans, batched=False)
        return work.loaded(1)
    if job.kind == "profile":
        spec = job.profile
        corpus = spec.corpus
        tokens = min(int(corpus.get("max_tokens", 2048)), context or int(corpus.get("max_tokens", 2048)))
        return counted.profile_work(
            tuple(corpus.get("sources") or ()), int(corpus.get("num_sequences", 20)), tokens, spec.scopes, layers
        )
    if job.kind == "experiment":
        spec = job.experiment
        shapes = _shapes(spec.suite, json.dumps(spec.settings), model, tokenizer, spec.seed)
        plans = counted.experiment_plans(
            spec.name, spec.k, len(spec.budgets), None if spec.baselines is None else len(spec.baselines)
        )
        return counted.experiment_work(shapes, spec.name, plans)
    spec = job.search
    tokens = min(spec.max_tokens, context or spec.max_tokens)
    if spec.sources is None:
        return counted.text_search_work(spec.search_sequences, spec.held_out, tokens, spec.evaluations, 1)
    from polykv.eval.calibration import parse_workload, split_sources
    from polykv.search.workload import verdict_settings

    workload = parse_workload(split_sources(spec.sources), spec.max_tokens, question=spec.question)
    others = tuple(parse_workload(split_sources(spec.transfer), spec.max_tokens).tasks) if spec.transfer else ()
    held = []
    for settings in verdict_settings(workload, spec.held_out, others, spec.accuracy_samples).values():
        held += counted.sample_shapes(workload.suite, settings, model, tokenizer, spec.seed)
    searched = [s for s in held if s.task in workload.tasks]
    searched = [type(s)(s.task, spec.search_sequences, s.prompt, s.steps, s.reference_steps, s.rows) for s in searched]
    return counted.workload_search_work(searched or held, held, spec.evaluations, 1, layers)


def job_estimate(job: Job, model, tokenizer) -> costs.Estimate | None:
    """The job's estimate at the stored rates of its model and device; None until they are measured."""
    rates = costs.stored_rates(job.model, job.device)
    return None if rates is None else costs.estimate(job_work(job, model, tokenizer), rates)


def with_estimate(job: Job, model, tokenizer) -> Job:
    """`job` with its estimate written in (unchanged when its model's rates are not measured here yet)."""
    found = job_estimate(job, model, tokenizer)
    return job if found is None else job.model_copy(update={"estimate_s": round(found.seconds, 1)})


__all__ = ["job_estimate", "job_work", "with_estimate"]

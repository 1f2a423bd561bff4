"""What a job will cost before it starts: its work counted from its own file (`polykv.eval.launch.work`) and
priced at the model's measured rates (`polykv.costs`). The launcher writes the estimate into the job
(`Job.estimate_s`); the worker records the time it took beside it, and their ratio corrects the next
estimates of that kind (`polykv.jobs.worker`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from polykv import costs
from polykv.costs import Work
from polykv.errors import PolyKVError
from polykv.jobs.progress import same_samples
from polykv.jobs.spec import Job

_SHAPES: dict[tuple, list] = {}  # (model, suite, settings, seed) -> shapes: a page asks again on every redraw


def _shapes(suite: str, settings_json: str, model, tokenizer, seed: int):
    from polykv.eval.launch.work import sample_shapes
    from polykv.eval.running.settings import suite_settings

    key = (id(model), suite, settings_json, seed)
    if key not in _SHAPES:
        if len(_SHAPES) > 64:
            _SHAPES.clear()
        _SHAPES[key] = sample_shapes(suite, suite_settings(suite, settings_json), model, tokenizer, seed)
    return _SHAPES[key]


def job_work(job: Job, model, tokenizer, workspace: Path) -> Work:
    """The work `job` runs on `model` (loaded: its suites' first samples are built to measure them)."""
    from polykv.eval.launch import work as counted
    from polykv.eval.running.settings import suite_settings
    from polykv.models import context_length, num_layers

    layers, context = num_layers(model), context_length(model)
    if job.kind == "eval":  # runs on the same samples together (`run_suites`); FullKV's reference once per sample
        work = Work("eval", (), loads=0)
        for members in same_samples(job.runs):
            unit, plans = job.runs[members[0]].unit, len(members)
            shapes = _shapes(unit.suite, unit.settings_json, model, tokenizer, unit.seed)
            settings = suite_settings(unit.suite, unit.settings_json)
            work = work + counted.suite_work("eval", shapes, plans, batched=plans > 1)
            work = work + counted.samples_work(unit.suite, settings, model)
        return work.loaded(1)
    if job.kind == "profile":
        spec = job.profile
        corpus = spec.corpus
        tokens = min(int(corpus.get("max_tokens", 2048)), context or int(corpus.get("max_tokens", 2048)))
        return counted.profile_work(
            tuple(corpus.get("sources") or ()), int(corpus.get("num_sequences", 20)), tokens, spec.scopes, layers
        )
    if job.kind == "experiment":  # its plans as the job makes them, run one after another (`run_job`)
        from polykv.jobs.experiment import job_experiment

        spec = job.experiment
        shapes = _shapes(spec.suite, json.dumps(spec.settings), model, tokenizer, spec.seed)
        _, settings, experiment = job_experiment(spec, job.model, workspace)
        work = counted.experiment_work(shapes, spec.name, len(experiment.plans), batched=False)
        return work + dataclasses.replace(counted.samples_work(spec.suite, settings, model), kind="experiment")
    spec = job.search
    tokens = min(spec.max_tokens, context or spec.max_tokens)
    if spec.sources is None:
        from polykv.profile.corpus import default_sources

        return counted.text_search_work(
            spec.search_sequences, spec.held_out, tokens, spec.evaluations, 1, spec.scope, default_sources(job.model)
        )
    from polykv.eval.workloads.workload import parse_workload, split_sources
    from polykv.search.workload.run import verdict_settings

    workload = parse_workload(split_sources(spec.sources), spec.max_tokens, question=spec.question)
    others = tuple(parse_workload(split_sources(spec.transfer), spec.max_tokens).tasks) if spec.transfer else ()
    held = []
    for settings in verdict_settings(workload, spec.held_out, others, spec.accuracy_samples).values():
        held += counted.sample_shapes(workload.suite, settings, model, tokenizer, spec.seed)
    searched = [s for s in held if s.task in workload.tasks]
    searched = [dataclasses.replace(s, count=spec.search_sequences) for s in searched]
    return counted.workload_search_work(
        searched or held, held, spec.evaluations, 1, layers, profiled=spec.profile == "auto"
    )


def job_estimate(job: Job, model, tokenizer, workspace: Path) -> costs.Estimate | None:
    """The job's estimate at the stored rates of its model and device; None until they are measured."""
    rates = costs.stored_rates(job.model, job.device)
    return None if rates is None else costs.estimate(job_work(job, model, tokenizer, workspace), rates)


def with_estimate(job: Job, model, tokenizer, workspace: Path) -> Job:
    """`job` with its estimate written in; unchanged when its model's rates are not measured here yet, or the
    estimate cannot be made (an estimate never stops a launch)."""
    try:
        found = job_estimate(job, model, tokenizer, workspace)
    except (PolyKVError, ValueError, OSError):
        return job
    if found is None:
        return job
    return job.model_copy(update={"estimate_s": round(found.seconds, 1), "estimate_model_s": found.model_seconds})


__all__ = ["job_estimate", "job_work", "with_estimate"]

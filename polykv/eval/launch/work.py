"""What each kind of launch runs, counted as forward passes (`polykv.costs.Work`), so that its cost can be
said before it starts: an evaluation, a profile, a heterogeneity measurement, an experiment, the study and
a search. Counts come from the launch's own settings and, for a suite, from the first sample of each task
(built as every run builds it: its prompt's real length in the model's tokens)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from polykv.costs import Forward, Work
from polykv.plan import Phase, Plan
from polykv.profile.profiler import CONTINUATION  # the profiler's teacher-forced tokens (the text search's too)


@dataclasses.dataclass(frozen=True)
class SampleShape:
    """One task's samples: how many, the prompt's tokens, the steps a plan takes after it (decode or
    teacher-forced) and the steps FullKV's reference takes (generated answers, fidelity's traces)."""

    task: str
    count: int
    prompt: int
    steps: int
    reference_steps: int
    rows: int = 1  # rows a plan steps in at once in a batch (fidelity: its teacher-forced and its greedy trace)
    prompts: int = 1  # prompt passes a plan (and FullKV's reference) makes alone (fidelity: one per trace)
    build_s: float = 0.0  # seconds to build one sample (timed on the first; RULER's haystacks, LongBench's files)


def _shape(suite: str, settings, task: str, count: int, payload) -> SampleShape:
    """A question suite's task from its first sample's payload (RULER, LongBench)."""
    from polykv.eval.suites import answers

    prompt = len(payload.get("prompt_ids") or payload.get("ids") or [])
    generated = int(payload.get("tokens_to_generate") or payload.get("max_new_tokens") or 0)
    scored = min(len(payload.get("answer_ids") or []), answers.answer_limit(generated, settings.answer_tokens))
    mode = settings.mode
    steps = (generated if answers.generates(mode) else 0) + (scored if answers.scores_answer(mode) else 0)
    return SampleShape(task, count, prompt, steps, generated if answers.generates(mode) else 0)


def fidelity_shapes(settings, context: int | None) -> list[SampleShape]:
    """The fidelity suite's tasks from its settings alone (its samples are not built: model-sampled tasks
    generate theirs, which `fidelity_corpus_work` counts). A plan runs a teacher-forced trace over the
    continuation and a greedy one, each after its own prompt pass (`rows` 2 in a batch); FullKV too."""
    tail = max(settings.continuation + 1, settings.generate)
    prompt = min(settings.prompt_tokens, (context or 10**9) - tail - 1)
    steps = settings.continuation + settings.generate
    return [
        SampleShape(task, settings.samples_per_task, prompt, steps, steps, rows=2, prompts=2) for task in settings.tasks
    ]


def fidelity_corpus_work(settings, context: int | None) -> Work:
    """Sampling the fidelity tasks drawn from the model (stories, tales): every such sample generated."""
    from polykv.eval.suites.fidelity import TASK_SOURCES

    tail = max(settings.continuation + 1, settings.generate)
    length = min(settings.prompt_tokens, (context or 10**9) - tail - 1) + tail
    sources = [TASK_SOURCES[t] for t in settings.tasks]
    return corpus_work(sources, len(sources) * settings.samples_per_task, length)


def sample_shapes(suite: str, settings, model, tokenizer, seed: int = 0) -> list[SampleShape]:
    """Each task's samples as a run builds them (one sample per task built to measure it; LongBench with no
    sample count: every sample, since how many there are is known only by reading them; fidelity from its
    settings, `fidelity_shapes`)."""
    from polykv.eval.running.settings import suite_module
    from polykv.models import context_length

    if suite == "fidelity":
        return fidelity_shapes(settings, context_length(model))
    module = suite_module(suite)
    per_task = getattr(settings, "samples_per_task", None)
    one = dataclasses.replace(settings, samples_per_task=1) if per_task is not None else settings
    started = time.perf_counter()
    built = module.build_samples(tokenizer, model, one, seed)
    build_s = (time.perf_counter() - started) / max(1, len(built))
    counts: dict[str, int] = {}
    if per_task is None:
        for task, _, _ in built:
            counts[task] = counts.get(task, 0) + 1
    first: dict[str, object] = {}
    for task, _, payload in built:
        first.setdefault(task, payload)
    shapes = [_shape(suite, settings, task, counts.get(task, per_task or 1), p) for task, p in first.items()]
    return [dataclasses.replace(shape, build_s=build_s) for shape in shapes]


def _samples(shapes: Sequence[SampleShape]) -> int:
    return sum(s.count for s in shapes)


def suite_work(
    kind: str, shapes: Sequence[SampleShape], plans: int, batched: bool, reference: bool = True, what: str = ""
) -> Work:
    """`plans` plans scoring every sample of `shapes`: each alone (a prompt pass and its steps per plan), or
    `batched` (`many_plans`: one prompt pass, then every plan's steps as one batch); FullKV's reference once per
    sample when `reference`."""
    forwards: list[Forward] = []
    longest = 0
    for s in shapes:
        longest = max(longest, s.prompt + s.steps)
        if batched:
            per_row = s.steps if s.rows == 1 else max(1, s.steps // s.rows)  # the traces step side by side
            forwards += [Forward(s.count, s.prompt), Forward(s.count * per_row, 1, s.prompt, plans * s.rows)]
        else:
            forwards += [
                Forward(s.count * plans * s.prompts, s.prompt),
                Forward(s.count * plans * s.steps, 1, s.prompt),
            ]
        if reference and s.reference_steps:  # FullKV's: plain passes, no routed cache
            forwards += [
                Forward(s.count * s.prompts, s.prompt, routed=False),
                Forward(s.count * s.reference_steps, 1, s.prompt, routed=False),
            ]
    count = _samples(shapes)
    longest_prompt = max((s.prompt for s in shapes), default=0)
    default = f"{count} samples x {plans} plan{'s' if plans != 1 else ''} at up to {longest_prompt:,} tokens"
    building = sum(s.count * s.build_s for s in shapes) * (1 if batched else plans)  # each run alone builds its own
    return Work(
        kind,
        tuple(forwards),
        kv_tokens=longest,
        kv_rows=plans if batched else 1,
        what=what or default,
        timed_s=building,
    )


def eval_work(suite: str, settings, model, tokenizer, plans: Sequence[Plan], seed: int = 0) -> Work:
    """An evaluation (the CLI's `eval`, the Runs page's launch): each plan's run in turn, in one process."""
    work = suite_work("eval", sample_shapes(suite, settings, model, tokenizer, seed), len(plans), batched=False)
    return work + samples_work(suite, settings, model)


def samples_work(suite: str, settings, model) -> Work:
    """Building a suite's samples where that costs model time (fidelity's model-sampled tasks); else nothing."""
    from polykv.models import context_length

    if suite != "fidelity":
        return Work("eval", (), loads=0)
    return dataclasses.replace(fidelity_corpus_work(settings, context_length(model)), kind="eval")


def corpus_work(sources: Sequence[str], sequences: int, tokens: int) -> Work:
    """Drawing a calibration corpus: text sources cost nothing to speak of; model sources generate their
    sequences (`tokens` steps, every such sequence in one batch)."""
    from polykv.profile.corpus import model_source

    sampled = sum(1 for k in range(sequences) if model_source(sources[k % len(sources)]) is not None)
    if not sampled:
        return Work("profile", (), loads=0)
    return Work(
        "profile",
        (Forward(tokens, 1, tokens // 2, sampled, routed=False),),
        loads=0,
        what=f"{sampled} sequences sampled from the model",
    )


def profile_work(
    sources: Sequence[str], sequences: int, tokens: int, scopes: Sequence[Phase | str], num_layers: int
) -> Work:
    """A profile: every sequence's FullKV pass, then for every layer and (scope, method) cell the layers above
    it over the continuation (`polykv.profile.profiler`: on average half the model per cell)."""
    from polykv.methods import for_phase

    cells = 1 + sum(len(for_phase(scope)) for scope in scopes)  # FullKV's own cell, then every method's
    prompt = max(1, tokens - CONTINUATION)
    above = cells * (num_layers + 1) / 2  # forwards of the whole model's worth, summed over the layers
    work = Work(
        "profile",
        (Forward(sequences, tokens, routed=False), Forward(sequences * above, CONTINUATION, prompt, routed=False)),
        kv_tokens=tokens,
        what=f"{sequences} sequences of {tokens:,} tokens x {cells} cells x {num_layers} layers",
    )
    return work + corpus_work(sources, sequences, tokens)


def heterogeneity_work(sources: Sequence[str], inputs: int, tokens: int) -> Work:
    """The heterogeneity measurement: every input's prompt pass and one decoding step recording attention."""
    work = Work(
        "heterogeneity",
        (Forward(inputs, tokens, routed=False), Forward(inputs, 1, tokens, routed=False)),
        kv_tokens=tokens,
        what=f"{inputs} input{'s' * (inputs != 1)} of {tokens:,} tokens",
    )
    return dataclasses.replace(work + corpus_work(sources, inputs, tokens), kind="heterogeneity")


def experiment_work(shapes: Sequence[SampleShape], name: str, plans: int, batched: bool = True) -> Work:
    """An experiment's `plans` on the suite's samples: as one batch per sample (the jobs, `--batch`), or each
    plan alone."""
    return suite_work(
        "experiment", shapes, plans, batched=batched, what=f"{name}: {_samples(shapes)} samples x {plans} plans"
    )


def text_search_work(
    sequences: int,
    held_out: int,
    tokens: int,
    evaluations: int,
    budgets: int,
    scope: str = "decode",
    sources: Sequence[str] = (),
) -> Work:
    """The text search: every homogeneous plan of the scope scores the search sequences (the best is a start),
    then each plan execution scores one sequence (a prompt pass, the continuation teacher-forced); the verdict
    scores the held-out sequences with its three plans and FullKV's reference. Its sequences come from `sources`
    (the model's calibration sources): those sampled from the model are generated first."""
    from polykv.methods import for_phase
    from polykv.plan import Scope

    homogeneous = len(for_phase(Scope(scope).phases[0]))
    prompt = max(1, tokens - CONTINUATION)
    runs = budgets * (evaluations + homogeneous * sequences + 4 * held_out)
    drawn = corpus_work(sources, sequences, tokens) + corpus_work(sources, held_out, tokens) if sources else None
    work = Work(
        "search",
        (Forward(runs, prompt), Forward(runs * CONTINUATION, 1, prompt)),
        kv_tokens=tokens,
        what=f"{budgets} budget(s) x {evaluations} evaluations on {sequences} sequences of {tokens:,} tokens",
    )
    return work if drawn is None else work + dataclasses.replace(drawn, kind="search")


def workload_search_work(
    search: Sequence[SampleShape],
    held_out: Sequence[SampleShape],
    evaluations: int,
    budgets: int,
    num_layers: int,
    profiled: bool = True,
) -> Work:
    """The workload search: its workload profile when it makes one (`profiled`: one pass per search sample and
    layer cell), the baselines and the evaluations on the search samples, then every contender on the held-out
    samples (batched). FullKV's competence pilot (generating) is not counted: its length is the model's."""
    from polykv.methods import REGISTRY

    methods = len(REGISTRY)
    profile = [
        Forward(s.count * (1 + methods * (num_layers + 1) / 2), s.prompt, routed=False) for s in search if profiled
    ]
    per_budget = suite_work("search", search, 1, batched=False, reference=False)
    # the homogeneous plans and the route on every search sample, each evaluation on one
    runs = methods + 1 + evaluations / max(1, _samples(search))
    verdict = suite_work("search", held_out, 8, batched=True)  # at most 8 distinct contenders, FullKV beside
    forwards = tuple(profile) + tuple(
        dataclasses.replace(f, count=f.count * runs * budgets) for f in per_budget.forwards
    )
    return Work(
        "search",
        forwards + tuple(dataclasses.replace(f, count=f.count * budgets) for f in verdict.forwards),
        kv_tokens=verdict.kv_tokens,
        kv_rows=verdict.kv_rows,
        what=f"{budgets} budget(s) x {evaluations} evaluations; {_samples(held_out)} held-out samples",
    )


def study_work(settings, shapes: Sequence[SampleShape], num_layers: int, context: int | None) -> Work:
    """The study (`polykv.eval.study.settings.StudySettings`): its profile; on a question suite the pilot (FullKV and
    anchor); then the factorial, the placement control and the sweeps on the primary suite's samples, each
    sample one batch of every plan. With automatic samples the count is its floor (`min_samples`), so the
    estimate is a lower one (said in its `what`)."""
    from polykv.eval.method_protocols import baseline_methods
    from polykv.methods import for_phase
    from polykv.profile.corpus import default_sources

    tokens = min(settings.calibration_tokens, context or settings.calibration_tokens)
    sources = settings.calibration_sources or default_sources(settings.model)
    work = profile_work(sources, settings.calibration_sequences, tokens, settings.swept, num_layers)
    if settings.suite in ("ruler", "longbench"):
        pilot = [dataclasses.replace(s, count=settings.pilot_samples) for s in shapes]
        work = work + suite_work("study", pilot, 2, batched=True, what="")
    baselines = len(settings.baselines) if settings.baselines else len(baseline_methods())
    matched = len(for_phase(settings.scope)) if settings.sweep_matched else 0
    plans = 4 + len(settings.budgets) * len(settings.swept) * (2 + baselines + matched) + 1
    separate = settings.placement_suite is not None or settings.placement_samples is not None
    if not separate:
        plans += settings.placements + 1
    primary = [dataclasses.replace(s, count=settings.min_samples) for s in shapes] if settings.auto_samples else shapes
    work = work + suite_work("study", primary, plans, batched=settings.batched)
    if settings.placement_samples is not None and settings.placement_suite is None:
        placed = [dataclasses.replace(s, count=settings.placement_samples) for s in shapes]
        work = work + suite_work("study", placed, settings.placements + 1, batched=settings.batched)
    floor = " (automatic samples: at their floor)" if settings.auto_samples else ""
    return dataclasses.replace(work, kind="study", loads=1, what=work.what + floor)


__all__ = [
    "SampleShape",
    "corpus_work",
    "eval_work",
    "experiment_work",
    "heterogeneity_work",
    "profile_work",
    "sample_shapes",
    "study_work",
    "suite_work",
    "text_search_work",
    "workload_search_work",
]

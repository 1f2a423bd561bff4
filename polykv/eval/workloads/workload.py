"""Workload calibration: a suite's own prompts with their gold answers, drawn where evaluation never draws.

A workload source names a suite's task instead of a text:
  ruler:TASK[@LENGTH]   RULER's generator (`polykv.eval.suites.ruler`) for TASK at LENGTH tokens (default:
                        the caller's max_tokens, clipped to the model's context); every RULER source of one
                        workload has one length (`ruler:niah_single_2@2048,ruler:vt@2048`);
  longbench:PATH        a LongBench task file `<dir>/<task>.jsonl` (the official format; `<task>` names the
                        task and its scorer).
A sample is the prompt (in the model's chat template where it has one) and the gold answer's first
`answer_tokens` tokens, as the suite's `answer_nll` scores them.

The split. The evaluation split of a workload is what `polykv eval` and the search's verdict draw: the suite's
samples at the evaluation seed. Calibration samples (profiles, the search's own samples) come from the same
generator at seed + CALIBRATION_SEED (RULER: another seed stream; LongBench: the file's samples in a seeded
order), and any whose prompt is also an evaluation prompt (by the sha256 of its token ids, as the results
store names prompts) is dropped and replaced by the next one: calibration never yields an evaluation sample.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from polykv.question_protocol import QuestionProtocol
from polykv.text import whole_number

if TYPE_CHECKING:
    from polykv.profile.corpus import WorkloadCorpus

CALIBRATION_SEED = 1_000_003  # calibration samples of a suite: seed + this (never the evaluation seed's samples)
ANSWER_TOKENS = 16  # gold answer tokens scored per sample (a cost cut for long answers, as the study uses)
_SPARE = 4  # calibration samples drawn beyond the count, so dropped ones can be replaced


@dataclass(frozen=True)
class WorkloadSource:
    suite: str
    task: str
    length: int | None = None  # RULER's length (None: the caller's default)
    data_dir: str | None = None  # LongBench's folder of <task>.jsonl


def parse_source(source: str) -> WorkloadSource:
    """A workload source parsed; a one-line ValueError for a malformed one or an unknown task."""
    suite, _, rest = source.partition(":")
    if suite == "ruler":
        from polykv.eval.suites.ruler import RULER_TASKS

        task, at, length = rest.partition("@")
        if task not in RULER_TASKS:
            raise ValueError(
                f"workload source {source!r}: unknown RULER task {task!r} (tasks: {', '.join(RULER_TASKS)})"
            )
        if not at:
            return WorkloadSource("ruler", task)
        tokens = whole_number(length)
        if tokens is None or tokens < 2:
            raise ValueError(f"workload source {source!r}: the length after @ must be a whole number of tokens")
        return WorkloadSource("ruler", task, tokens)
    if suite == "longbench":
        from polykv.eval.suites.longbench_tasks import TASK_PROMPTS

        path = Path(rest).expanduser()
        if not rest.strip() or path.suffix != ".jsonl":
            raise ValueError(f"workload source {source!r}: write longbench:PATH to a <task>.jsonl file")
        if path.stem not in TASK_PROMPTS:
            raise ValueError(
                f"workload source {source!r}: {path.name} names no LongBench task (the file is <task>.jsonl)"
            )
        if not path.is_file():
            raise ValueError(f"workload source {source!r}: no such file {path}")
        return WorkloadSource("longbench", path.stem, data_dir=str(path.resolve().parent))
    raise ValueError(f"workload source {source!r}: write ruler:TASK[@LENGTH] or longbench:PATH")


@dataclass(frozen=True)
class Workload:
    """The suite and its settings (tasks in source order, scoring answer_nll) that a list of sources names."""

    suite: str
    settings: object  # RulerSettings or LongBenchSettings
    sources: tuple[str, ...]

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(self.settings.tasks)

    def with_samples(self, samples: int | None, mode: str | None = None):
        """The settings with `samples` per task (and another mode)."""
        return dataclasses.replace(self.settings, samples_per_task=samples, mode=mode or self.settings.mode)


def split_sources(text: str | None) -> list[str]:
    """A comma-separated list of sources (the CLI's and the app's text), blanks dropped."""
    return [s.strip() for s in (text or "").split(",") if s.strip()]


def parse_workload(
    sources: Sequence[str],
    length: int | None = None,
    answer_tokens: int | None = ANSWER_TOKENS,
    mode: str = "score",
    question: QuestionProtocol = QuestionProtocol.IN_PROMPT,
) -> Workload:
    """One suite's settings from workload sources (one suite, one RULER length, one LongBench folder); a
    one-line ValueError otherwise. `length`: RULER's length where a source gives none; `question`: the
    question protocol (`polykv.eval.suites.answers`)."""
    parsed = [parse_source(s) for s in sources]
    if not parsed:
        raise ValueError("no workload source given: write ruler:TASK[@LENGTH] or longbench:PATH")
    suites = {p.suite for p in parsed}
    if len(suites) > 1:
        raise ValueError(f"workload sources mix suites ({', '.join(sorted(suites))}): give one suite's tasks")
    tasks = [p.task for p in parsed]
    if len(set(tasks)) < len(tasks):
        raise ValueError(f"workload sources name a task twice ({', '.join(sources)})")
    suite = parsed[0].suite
    if suite == "ruler":
        from polykv.eval.suites.ruler import RulerSettings

        lengths = {p.length or length for p in parsed}
        if None in lengths:
            raise ValueError(f"workload source {sources[0]!r} names no length: write ruler:TASK@LENGTH")
        if len(lengths) > 1:
            raise ValueError(f"workload sources give several RULER lengths ({', '.join(map(str, sorted(lengths)))})")
        settings = RulerSettings(
            tasks=tuple(tasks), length=lengths.pop(), mode=mode, answer_tokens=answer_tokens, question=question
        )
    else:
        from polykv.eval.suites.longbench import LongBenchSettings

        folders = {p.data_dir for p in parsed}
        if len(folders) > 1:
            raise ValueError("longbench workload sources must be files of one folder")
        settings = LongBenchSettings(
            tasks=tuple(tasks),
            data_dir=folders.pop(),
            samples_per_task=1,
            mode=mode,
            answer_tokens=answer_tokens,
            question=question,
        )
    return Workload(suite, settings, tuple(sources))


def _module(suite: str):
    from polykv.eval.running.suite_runner import SUITES

    return SUITES[suite]


def prompt_hash(workload: Workload, task: str, sample: str, seed: int, payload) -> str:
    """The sha256 (16 hex) of a sample's prompt ids, as the results store names it."""
    from polykv.eval.running.suite_runner import prompt_id

    return prompt_id(_module(workload.suite), task, sample, seed, payload)["sha256"]


def evaluation_samples(workload: Workload, tokenizer, model, samples: int, seed: int) -> list[tuple[str, str, dict]]:
    """(task, sample id, payload): exactly what an evaluation of `samples` per task at `seed` draws."""
    return _module(workload.suite).build_samples(tokenizer, model, workload.with_samples(samples), seed)


def calibration_samples(
    workload: Workload, tokenizer, model, samples: int, seed: int, exclude: set[str] | None = None
) -> list[tuple[str, str, dict]]:
    """`samples` per task from the calibration split (module docstring), none of them an evaluation sample:
    none has a prompt hash in `exclude` (a verdict's own held-out samples), or, without `exclude`, in the
    evaluation samples of the same seed at `samples` per task. A ValueError when the split holds too few."""
    module, calibration = _module(workload.suite), seed + CALIBRATION_SEED
    if exclude is None:
        evaluation = evaluation_samples(workload, tokenizer, model, samples, seed)
        exclude = {prompt_hash(workload, task, sample, seed, payload) for task, sample, payload in evaluation}
    banned = set(exclude)
    if workload.suite == "ruler":
        drawn = module.build_samples(tokenizer, model, workload.with_samples(samples + _SPARE), calibration)
    else:  # every sample of the file, in a seeded order
        drawn = module.build_samples(tokenizer, model, workload.with_samples(None), calibration)
        random.Random(f"polykv-workload/{calibration}").shuffle(drawn)
    out, taken = [], dict.fromkeys(workload.tasks, 0)
    for task, sample, payload in drawn:
        if taken[task] < samples and prompt_hash(workload, task, sample, seed, payload) not in banned:
            out.append((task, f"c{sample}", payload))
            taken[task] += 1
    short = [task for task, n in taken.items() if n < samples]
    if short:
        held = taken[short[0]]
        advice = f"ask for at most {held}" if held else "it needs more samples than the evaluation takes"
        raise ValueError(
            f"the calibration split of {short[0]} holds {held} sample(s) apart from the evaluation ones, "
            f"{samples} asked: {advice}"
        )
    order = {task: i for i, task in enumerate(workload.tasks)}
    return sorted(out, key=lambda row: order[row[0]])  # tasks in source order, samples in draw order


def answer_sample(workload: Workload, payload):
    """The sample as the answer machinery sees it (`polykv.eval.suites.answers.AnswerSample`)."""
    return _module(workload.suite).answer_sample(payload)


def workload_corpus(
    tokenizer, model, spec, exclude: set[str] | None = None, question=QuestionProtocol.IN_PROMPT
) -> WorkloadCorpus:
    """A corpus spec whose sources are workload sources as profiler sequences: `spec.num_sequences` shared
    round-robin over the tasks, RULER at `spec.max_tokens` where a source gives no length, at `spec.seed`'s
    calibration split. Each sequence is the prompt followed by the gold answer. In-prompt, the profiler feeds the
    answer after the prompt's pass, so its first token (predicted by the prompt, which every method leaves
    whole) is the same under every method and the rest is what a method can change (answers of one token are
    skipped); AFTER_COMPRESSION (`question`), the prompt's pass is the context, the question follows kept in
    full and every answer token is scored. `exclude`: prompt hashes never to use (a verdict's held-out samples)."""
    from polykv.models import context_length
    from polykv.profile.corpus import WorkloadCorpus

    context = context_length(model)
    workload = parse_workload(
        spec.sources, min(spec.max_tokens, context) if context else spec.max_tokens, question=question
    )
    split = not QuestionProtocol(question).compresses_question
    per_task = -(-spec.num_sequences // len(workload.tasks))
    rows = calibration_samples(workload, tokenizer, model, per_task, spec.seed, exclude)
    rows = [row for row in rows if split or len(answer_sample(workload, row[2]).answer_ids) >= 2]
    if not rows:
        raise ValueError("every calibration sample's gold answer is one token: nothing for a method to change")
    corpus = WorkloadCorpus([], [], [], [], question=QuestionProtocol(question))
    for task, sample, payload in rows:
        q = answer_sample(workload, payload)
        corpus.sequences.append([*q.prompt_ids, *q.answer_ids])
        kept = len(q.prompt_ids) - q.question_start if split else 0
        corpus.continuations.append(kept + len(q.answer_ids) - 1)
        corpus.scored.append(len(q.answer_ids) if split else len(q.answer_ids) - 1)
        corpus.kept.append(kept)
        corpus.answer_tokens.append(len(q.answer_ids))
        corpus.records.append(
            {
                "index": len(corpus.records),
                "source": f"{workload.suite}:{task}",
                "sample": sample,
                "tokens": len(q.prompt_ids),
            }
        )
    return corpus


__all__ = [
    "split_sources",
    "ANSWER_TOKENS",
    "CALIBRATION_SEED",
    "Workload",
    "WorkloadSource",
    "calibration_samples",
    "evaluation_samples",
    "parse_source",
    "parse_workload",
    "prompt_hash",
    "answer_sample",
    "workload_corpus",
]

"""The `longbench` suite: LongBench (v1), 21 long-context tasks in English and Chinese, scored as the original.

Reference: Yushi Bai et al., "LongBench: A Bilingual, Multitask Benchmark for Long Context
Understanding", ACL 2024. Reproduced from THUDM/LongBench @ 2e00731f, folder ``LongBench/`` (v1; the
repository's top level is LongBench v2, which this is not): ``pred.py`` (prompt building, truncation,
chat format, generation), ``config/dataset2prompt.json`` (``TASK_PROMPTS``),
``config/dataset2maxlen.json`` (``TASK_MAX_NEW_TOKENS``; both in ``longbench_tasks``),
``config/model2maxlen.json`` and ``eval.py`` (scoring, in ``polykv.eval.metrics``). Read, then
re-implemented; no code copied.

Per sample, as ``pred.py`` does it:
  1. the task's template is formatted with the sample's fields (``{context}``, ``{input}``);
  2. if the tokenized prompt (special tokens included) is longer than ``max_length`` tokens, it is cut
     in the middle: the first ``max_length // 2`` and the last ``max_length // 2`` tokens are decoded
     (special tokens skipped) and the two texts joined;
  3. the chat format is applied, except for trec, triviaqa, samsum, lsht, lcc and repobench-p
     (few-shot / completion tasks, ``NO_CHAT_TASKS``);
  4. greedy decoding of at most the task's generation length; samsum also stops at a newline and
     generates at least one token; the new tokens are decoded with special tokens skipped;
  5. the sample scores ``100 * longbench_sample_score(...)`` (max over the ground truths; trec,
     triviaqa, samsum and lsht predictions cut at their first line). A task's score is the mean over
     its samples: LongBench's ``round(100 * mean, 2)`` without the rounding.
The ``question`` setting (``QuestionProtocol``): IN_PROMPT (the official protocol) or AFTER_COMPRESSION (the
question-agnostic protocol of ``polykv.eval.suites.answers``: the plan compresses the prompt up to the end of
``{context}``, the rest is fed after it and kept in full; ``polykv.eval.suites.questions`` says how the split is
placed; the tasks of ``INSTRUCTION_ONLY`` have no question after the context, only an instruction, which is what
comes after).
The ``mode`` setting adds or chooses the dense ``answer_nll`` and FullKV ``agreement``
(``polykv.eval.suites.answers``); the gold answer of ``answer_nll`` is the sample's first answer (the
others are alternatives LongBench accepts too), at most the task's generation length.

Differences from the original:
  * Chat format: the original hard-codes a format per model name (``build_chat``); here the
    tokenizer's own chat template is used (``apply_chat_template`` with one user message and the
    generation prompt, then tokenized without adding special tokens) when it has one and
    ``use_chat_template`` is "auto" or True; a tokenizer without a template gets the plain prompt.
  * ``max_length``: the original takes it per model from ``model2maxlen.json`` (e.g. 3500 for a 4k
    Llama-2, 31500 for 32k models: the context minus a margin of 500-596 tokens). By default it is
    here the model's context (``max_position_embeddings``) minus the task's generation length minus
    the chat template's overhead (the tokens of a templated empty message), so prompt plus
    generation always fit; a set ``max_length`` is used as given for every task.
  * Re-encoding the joined head and tail texts can give a few more tokens than ``max_length`` (a
    merge at the junction); only then the cut is redone with a smaller half until the prompt fits,
    so it never exceeds ``max_length`` (the original lets it). Prompts that fit are never changed.
  * Data: ``data_dir`` is a directory of the official jsonl files (``<task>.jsonl``, the contents of
    the hub's ``data.zip``). Malformed lines and lines without the fields scoring needs are skipped
    with a warning naming file and line (the original would crash). Without ``data_dir`` the hub
    dataset ``THUDM/LongBench`` is loaded with the ``datasets`` package, without trusting remote code.
  * ``samples_per_task`` (default: all) takes a seeded random subset, kept in file order; the
    original always runs every sample. Sample ids are the 1-based line numbers in the file (row
    numbers for the hub dataset).
  * ``all_classes`` is taken per sample; ``eval.py`` uses the last line's for the whole task (the
    same list in the official data).
  * Only the 21 LongBench tasks; LongBench-E (``<task>_e``, scores by length bucket) is not covered.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from polykv.eval.metrics import LONGBENCH_FIRST_LINE_TASKS, longbench_sample_score
from polykv.lazy import no_grad
from polykv.models import context_length
from polykv.models.support import greedy_needs_generate
from polykv.plan import Plan
from polykv.question_protocol import QuestionProtocol

from . import answer_settings, answers, chat
from .longbench_data import HUB_DATASET, MAX_LINE_BYTES, SKIPS_SHOWN, load_task, read_task_file  # noqa: F401
from .longbench_prompts import (  # noqa: F401 - the suite's names stay importable from here
    INSTRUCTION_ONLY,
    _prompt,
    after_context,
    default_max_length,
    format_prompt,
    prompt_ids,
    question_start,
    truncate_middle,
)
from .longbench_tasks import CLASSIFICATION_TASKS, NO_CHAT_TASKS, TASK_MAX_NEW_TOKENS, TASK_PROMPTS, TASKS  # noqa: F401


@dataclass(frozen=True)
class LongBenchSettings:
    tasks: tuple[str, ...] = TASKS
    data_dir: str | None = None  # a directory of <task>.jsonl files; None: the hub dataset via `datasets`
    max_length: int | None = None  # prompt tokens; None: the model's context - generation length - chat overhead
    samples_per_task: int | None = None  # None: every sample; N: a seeded random subset of N
    use_chat_template: bool | str = "auto"  # "auto": when the tokenizer has one; True: required; False: never
    mode: str = "generate"  # "generate" (score, agreement), "score" (answer_nll) or "both" (`answers`)
    answer_tokens: int | None = None  # answer_nll over at most this many gold tokens (None: all, up to max_new)
    question: QuestionProtocol = QuestionProtocol.IN_PROMPT  # where the question goes (the module docstring)

    def __post_init__(self):
        tasks = (self.tasks,) if isinstance(self.tasks, str) else tuple(self.tasks)
        object.__setattr__(self, "tasks", tasks)
        unknown = [t for t in tasks if t not in TASK_PROMPTS]
        if unknown:
            raise ValueError(f"unknown LongBench task(s) {', '.join(unknown)} (tasks: {', '.join(TASKS)})")
        if not tasks:
            raise ValueError(f"no LongBench task given (tasks: {', '.join(TASKS)})")
        if self.data_dir is not None:
            object.__setattr__(self, "data_dir", str(self.data_dir))
        if self.max_length is not None and (isinstance(self.max_length, bool) or self.max_length < 2):
            raise ValueError(f"LongBench max_length must be an integer >= 2, got {self.max_length!r}")
        if self.samples_per_task is not None and (isinstance(self.samples_per_task, bool) or self.samples_per_task < 1):
            raise ValueError(f"LongBench samples_per_task must be >= 1 or None (all), got {self.samples_per_task!r}")
        chat.check_choice(self.use_chat_template, "LongBench")
        answer_settings.check_mode(self.mode, "LongBench")
        answer_settings.check_answer_tokens(self.answer_tokens, "LongBench")
        object.__setattr__(self, "question", answer_settings.check_question(self.question, "LongBench"))

    def to_dict(self) -> dict:
        return answer_settings.protocol_dict({**asdict(self), "tasks": list(self.tasks)})


def check_settings(settings: LongBenchSettings) -> None:
    """Refuse, before any job starts, a `data_dir` that is not a directory or lacks a chosen task's
    `<task>.jsonl` (one line naming the directory and the missing files). `data_dir=None` (the hub) is
    not checked here: whether the hub answers, or has the dataset cached, is known only by loading it."""
    if settings.data_dir is None:
        return
    directory = Path(settings.data_dir)
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise FileNotFoundError(f"data_dir {directory} {what} (expected a directory of <task>.jsonl files)")
    missing = [f"{task}.jsonl" for task in settings.tasks if not (directory / f"{task}.jsonl").is_file()]
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise FileNotFoundError(f"data_dir {directory} lacks {shown} (one <task>.jsonl per chosen task)")


Settings = LongBenchSettings  # every suite module exposes Settings, build_samples and score_sample
# Bump whenever samples or scoring change: run ids include it, so older results are never reused.
# 2: the mode setting (answer_nll, agreement) and every sample's answer stored; 3: the gold answer tokenized as the
# prompt's continuation (`answers.gold_ids`)
REVISION = 3
METRICS = answer_settings.MODE_METRICS["both"]  # what a run may report (its mode says which)


def uses_chat_template(tokenizer, settings: LongBenchSettings) -> bool:
    """Does a run with these settings wrap its prompts in the tokenizer's chat template (the tasks of
    ``NO_CHAT_TASKS`` never are)?"""
    return chat.resolve(tokenizer, settings.use_chat_template, "LongBench")


def _newline_id(tokenizer) -> int | None:
    ids = tokenizer.encode("\n", add_special_tokens=False)
    return ids[-1] if ids else None


# --------------------------------------------------------------------------------------------------
# Suite contract
# --------------------------------------------------------------------------------------------------


def build_samples(tokenizer, model, settings: LongBenchSettings, seed: int) -> list[tuple[str, str, dict]]:
    """(task, sample id, payload) for every selected sample; payload: ``ids`` (prompt token ids),
    ``answers``, ``answer_ids`` (the first answer's tokens, ``answers.gold_ids``), ``all_classes``, ``task``,
    ``max_new_tokens``, ``eos_token_id`` (samsum's stop list, else None) and the ``tokenizer`` that decodes
    the prediction."""
    chat_used = uses_chat_template(tokenizer, settings)
    overhead = len(chat.chat_ids(tokenizer, "")) if chat_used else 0
    context = context_length(model)
    out = []
    for task in settings.tasks:
        samples = load_task(task, settings.data_dir)
        if settings.samples_per_task is not None and settings.samples_per_task < len(samples):
            rng = random.Random(f"longbench/{task}/{seed}")
            samples = [samples[i] for i in sorted(rng.sample(range(len(samples)), settings.samples_per_task))]
        task_chat = chat_used and task not in NO_CHAT_TASKS
        max_new = TASK_MAX_NEW_TOKENS[task]
        if settings.max_length is None:
            max_length = default_max_length(context, task, overhead if task_chat else 0)
        else:
            max_length = settings.max_length
            if context is not None and max_length + (overhead if task_chat else 0) + max_new > context:
                warnings.warn(
                    f"LongBench {task}: max_length {max_length} + generation length {max_new} exceeds the "
                    f"model's context ({context})",
                    stacklevel=2,
                )
        eos = None
        if task == "samsum":  # pred.py: stop at a newline too (the model otherwise repeats "\nDialogue")
            eos = [i for i in (tokenizer.eos_token_id, _newline_id(tokenizer)) if i is not None] or None
        for sample_id, record in samples:
            prompt, ids = _prompt(tokenizer, task, record, max_length, task_chat)
            split = {}
            if settings.question is QuestionProtocol.AFTER_COMPRESSION:
                split["question_start"] = question_start(tokenizer, task, record, prompt, ids, task_chat)
            payload = {
                "task": task,
                "ids": ids,
                "answers": list(record["answers"]),
                "answer_ids": answers.gold_ids(
                    tokenizer,
                    ids,
                    str(record["answers"][0]),
                    answer_settings.answer_limit(max_new, settings.answer_tokens),
                ),
                "all_classes": record.get("all_classes"),
                "max_new_tokens": max_new,
                "eos_token_id": eos,
                "tokenizer": tokenizer,
                **split,
            }
            out.append((task, sample_id, payload))
    return out


def prompt_tokens(payload: dict) -> list[int]:
    """The prompt a sample's id hashes (the runner stores the hash, not the prompt)."""
    return payload["ids"]


def answer_sample(payload: dict) -> answers.AnswerSample:
    stop = payload.get("eos_token_id")
    return answers.AnswerSample(
        payload["ids"],
        payload["answer_ids"],
        payload["max_new_tokens"],
        tuple(stop) if stop else None,
        1 if stop else 0,
        payload.get("question_start"),
    )


def _judge(payload: dict):
    """(metrics, prediction) of generated tokens: LongBench's score of the decoded text, and whether it is
    FullKV's answer (both cut at the first line where LongBench cuts, and stripped)."""
    tokenizer, task = payload["tokenizer"], payload["task"]

    def answer_text(tokens: list[int]) -> str:
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        return (text.lstrip("\n").split("\n")[0] if task in LONGBENCH_FIRST_LINE_TASKS else text).strip()

    def judge(tokens: list[int], reference: list[int]) -> tuple[dict[str, float], str]:
        prediction = tokenizer.decode(tokens, skip_special_tokens=True)
        metrics = _score(payload, prediction)
        metrics["agreement"] = float(answer_text(tokens) == answer_text(reference))
        return metrics, prediction

    return judge


def _pad(tokenizer) -> int | None:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@no_grad
def score_sample(model, plan: Plan, payload: dict, settings: LongBenchSettings) -> answers.Scored:
    """One plan alone (`routed` and `generate`), in the settings' mode (see `polykv.eval.suites.answers`)."""
    scored = answers.score_alone(
        model, plan, answer_sample(payload), settings.mode, _judge(payload), _pad(payload["tokenizer"])
    )
    return answers.with_gold(scored, payload["answers"])


def score_samples(model, plans: list[Plan], payload: dict, settings: LongBenchSettings) -> list[answers.Scored]:
    """`score_sample` for several plans on one sample at once (`polykv.runtime.many_plans`: one prompt pass,
    the plans' generations and teacher-forced answers as one batch); plan by plan when the model's
    generation needs `generate`."""

    if greedy_needs_generate(model):
        return [score_sample(model, plan, payload, settings) for plan in plans]
    scored = answers.score_many(model, plans, answer_sample(payload), settings.mode, _judge(payload))
    return [answers.with_gold(s, payload["answers"]) for s in scored]


def _score(payload: dict, prediction: str) -> dict[str, float]:
    value = longbench_sample_score(payload["task"], prediction, payload["answers"], payload["all_classes"])
    return {"score": 100.0 * value}

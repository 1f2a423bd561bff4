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
The ``question`` setting: "in-prompt" (the official protocol) or "after-compression" (the question-agnostic
protocol of ``polykv.eval.suites.answers``: the plan compresses the prompt up to the end of ``{context}``, the
rest is fed after it and kept in full; ``polykv.eval.suites.questions`` says how the split is placed; the tasks
of ``INSTRUCTION_ONLY`` have no question after the context, only an instruction, which is what comes after).
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
from typing import Any

from polykv.errors import FileError, first_line
from polykv.eval.metrics import LONGBENCH_FIRST_LINE_TASKS, longbench_sample_score
from polykv.files import parse_json
from polykv.lazy import lazy_import, no_grad
from polykv.models import context_length
from polykv.plan import Plan

from . import answers, chat, questions
from .longbench_tasks import CLASSIFICATION_TASKS, NO_CHAT_TASKS, TASK_MAX_NEW_TOKENS, TASK_PROMPTS, TASKS

#: the tasks whose template asks no question after the context, only an instruction (summarize, count, complete)
INSTRUCTION_ONLY = tuple(t for t in TASKS if "{input}" not in TASK_PROMPTS[t].split("{context}", 1)[1])

torch = lazy_import("torch")  # loaded on first use: checking a suite's settings needs no tensor

HUB_DATASET = "THUDM/LongBench"
_MIN_DEFAULT_MAX_LENGTH = 16  # a default prompt budget below this means the context cannot hold the task


@dataclass(frozen=True)
class LongBenchSettings:
    tasks: tuple[str, ...] = TASKS
    data_dir: str | None = None  # a directory of <task>.jsonl files; None: the hub dataset via `datasets`
    max_length: int | None = None  # prompt tokens; None: the model's context - generation length - chat overhead
    samples_per_task: int | None = None  # None: every sample; N: a seeded random subset of N
    use_chat_template: bool | str = "auto"  # "auto": when the tokenizer has one; True: required; False: never
    mode: str = "generate"  # "generate" (score, agreement), "score" (answer_nll) or "both" (`answers`)
    answer_tokens: int | None = None  # answer_nll over at most this many gold tokens (None: all, up to max_new)
    question: str = answers.IN_PROMPT  # "in-prompt" or "after-compression" (the module docstring)

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
        answers.check_mode(self.mode, "LongBench")
        answers.check_answer_tokens(self.answer_tokens, "LongBench")
        answers.check_question(self.question, "LongBench")

    def to_dict(self) -> dict:
        return answers.protocol_dict({**asdict(self), "tasks": list(self.tasks)})


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
METRICS = answers.MODE_METRICS["both"]  # what a run may report (its mode says which)


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


def _check_task(task: str) -> None:
    if task not in TASK_PROMPTS:
        raise ValueError(f"unknown LongBench task {task!r} (tasks: {', '.join(TASKS)})")


def _problem(task: str, record: Any) -> str | None:
    """Why a record cannot be scored (None if it can): a JSON object with string input and context, a
    non-empty list of string answers, and all_classes (a list of strings, or null/absent; required for
    trec and lsht)."""
    if not isinstance(record, dict):
        return f"not a JSON object but {type(record).__name__}"
    missing = [key for key in ("input", "context", "answers") if key not in record]
    if task in CLASSIFICATION_TASKS and record.get("all_classes") is None:
        missing.append("all_classes")
    if missing:
        return f"missing field(s) {', '.join(missing)}"
    for key in ("input", "context"):
        if not isinstance(record[key], str):
            return f"field {key} is not a string"
    answers = record["answers"]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        return "field answers is not a non-empty list of strings"
    classes = record.get("all_classes")
    if classes is not None and (not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)):
        return "field all_classes is neither null nor a list of strings"
    if task in CLASSIFICATION_TASKS and not classes:
        return "field all_classes is empty"
    return None


def _warn_skipped(where: str, unit: str, skipped: list[tuple[int, str]]) -> None:
    """One warning for a file's (or the hub task's) skipped lines or rows, however many: the first few named."""
    if skipped:
        shown = "; ".join(f"{unit} {n}: {why}" for n, why in skipped[:SKIPS_SHOWN])
        more = f"; and {len(skipped) - SKIPS_SHOWN} more" if len(skipped) > SKIPS_SHOWN else ""
        warnings.warn(f"LongBench: skipped {len(skipped)} {unit}(s) of {where}: {shown}{more}", stacklevel=3)


MAX_LINE_BYTES = 64 * 2**20  # a LongBench line (one sample, its context included) is at most a few MB
SKIPS_SHOWN = 5  # skipped lines a file's warning names


def read_task_file(task: str, path: str | Path) -> list[tuple[str, dict]]:
    """(sample id, record) for every usable line of an official ``<task>.jsonl`` file.

    The sample id is the 1-based line number (zero-padded). Blank lines are ignored; a line that is not
    UTF-8 JSON, not an object, or lacks a field scoring needs is skipped, and one warning per file names them
    (``"skipped 2 line(s) of <path>: line 3: ...; line 7: ..."``). A file with no usable line is an error, and
    so is a line longer than MAX_LINE_BYTES (a file with no newline is not read whole)."""
    _check_task(task)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LongBench task file {path} not found")
    samples, skipped = [], []  # skipped: (line number, why)
    with path.open("rb") as handle:
        lineno = 0
        while raw := handle.readline(MAX_LINE_BYTES + 1):
            lineno += 1
            if len(raw) > MAX_LINE_BYTES:  # e.g. a file with no newline: not read whole
                raise FileError(
                    f"{path}, line {lineno}: longer than {MAX_LINE_BYTES // 2**20} MiB: not a LongBench jsonl file"
                )
            try:
                text = raw.decode("utf-8")
                if not text.strip():
                    continue
                record = parse_json(text)
            except (UnicodeDecodeError, FileError) as exc:
                skipped.append((lineno, f"malformed JSON ({first_line(exc)})"))
                continue
            problem = _problem(task, record)
            if problem is None:
                samples.append((f"{lineno:05d}", record))
            else:
                skipped.append((lineno, problem))
    _warn_skipped(str(path), "line", skipped)  # one warning, not one per line of a pretty-printed file
    if not samples:
        raise ValueError(f"LongBench task file {path} holds no usable sample")
    return samples


def _hub_task(task: str) -> list[tuple[str, dict]]:
    hint = "give --data-dir (a directory of the official LongBench <task>.jsonl files, from the hub's data.zip)"
    try:
        import datasets
    except ImportError:
        raise ValueError(f"LongBench: the 'datasets' package is not installed to load {HUB_DATASET}; {hint}") from None
    try:
        rows = list(datasets.load_dataset(HUB_DATASET, task, split="test"))
    except Exception as exc:  # noqa: BLE001 - network, hub, script or format errors: all mean "give the files"
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ValueError(
            f"LongBench: could not load {HUB_DATASET} ({task}) from the Hugging Face hub "
            f"({exc.__class__.__name__}: {reason}); {hint}"
        ) from None
    samples = [(f"{n:05d}", dict(row)) for n, row in enumerate(rows, start=1)]
    problems = [(sid, row, _problem(task, row)) for sid, row in samples]
    _warn_skipped(f"{HUB_DATASET}/{task}", "row", [(int(sid), why) for sid, _, why in problems if why is not None])
    samples = [(sid, row) for sid, row, why in problems if why is None]
    if not samples:
        raise ValueError(f"LongBench: {HUB_DATASET} ({task}) holds no usable sample; {hint}")
    return samples


def load_task(task: str, data_dir: str | Path | None = None) -> list[tuple[str, dict]]:
    """(sample id, record) of one task: ``<data_dir>/<task>.jsonl``, or the hub dataset if data_dir is None."""
    _check_task(task)
    if data_dir is None:
        return _hub_task(task)
    directory = Path(data_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"LongBench data directory {directory} not found")
    path = directory / f"{task}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"LongBench task file {path} not found (expected <task>.jsonl in {directory})")
    return read_task_file(task, path)


# --------------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------------


def format_prompt(task: str, record: dict) -> str:
    """The task's official template formatted with the sample's fields (``str.format(**record)``)."""
    _check_task(task)
    return TASK_PROMPTS[task].format(**record)


def truncate_middle(tokenizer, prompt: str, max_length: int) -> str:
    """``pred.py``'s middle truncation: if the prompt has more than max_length tokens (special tokens
    included), the text of its first and last ``max_length // 2`` tokens (special tokens skipped),
    joined. If re-encoding the joined text still exceeds max_length, the cut is redone with fewer
    tokens per side until it fits (see the module docstring)."""
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    ids = tokenizer(prompt).input_ids
    if len(ids) <= max_length:
        return prompt
    half = max_length // 2
    while True:
        text = tokenizer.decode(ids[:half], skip_special_tokens=True) + tokenizer.decode(
            ids[-half:], skip_special_tokens=True
        )
        excess = len(tokenizer(text).input_ids) - max_length
        if excess <= 0 or half <= 1:
            return text
        half -= max(1, (excess + 1) // 2)
        half = max(half, 1)


def prompt_ids(tokenizer, task: str, record: dict, max_length: int, use_chat: bool = False) -> list[int]:
    """The token ids fed to the model: template, middle truncation, chat format (never for
    ``NO_CHAT_TASKS``), tokenization (with the tokenizer's special tokens when there is no chat format)."""
    return _prompt(tokenizer, task, record, max_length, use_chat)[1]


def _prompt(tokenizer, task: str, record: dict, max_length: int, use_chat: bool) -> tuple[str, list[int]]:
    """(the prompt text after truncation, its token ids): `prompt_ids`."""
    prompt = truncate_middle(tokenizer, format_prompt(task, record), max_length)
    if use_chat and task not in NO_CHAT_TASKS:
        return prompt, chat.chat_ids(tokenizer, prompt)
    return prompt, list(tokenizer(prompt).input_ids)


def after_context(task: str, record: dict) -> str:
    """What the task's template puts after the sample's ``{context}``: the question and its request (or, for
    ``INSTRUCTION_ONLY``, the instruction), leading whitespace left with the context."""
    _check_task(task)
    tail = TASK_PROMPTS[task].split("{context}", 1)[1]
    return tail.format(**record).lstrip()


def question_start(tokenizer, task: str, record: dict, prompt: str, ids: list[int], use_chat: bool) -> int:
    """Where a sample's question starts in its prompt ids (`polykv.eval.suites.questions`): at the text after
    ``{context}``. A prompt cut in the middle carries that text as decoding the whole prompt's last tokens gives
    it (their text may differ from the template's in spaces): the question is found as those tokens' text; a cut
    that reached into the question is an error (one line)."""
    formatted = format_prompt(task, record)
    tail = after_context(task, record)
    if prompt != formatted:  # cut in the middle: the tail is the decoded text of the original's last tokens
        original = list(tokenizer(formatted).input_ids)
        start = questions.after_whitespace(formatted, len(formatted) - len(tail))
        asked = len(original) - questions.question_start(tokenizer, original, formatted, start, False)
        tail = tokenizer.decode(original[-asked:], skip_special_tokens=True)
    if not tail.strip() or not prompt.endswith(tail):
        raise ValueError(f"LongBench {task}: the middle truncation cut into the question; give a larger max_length")
    start = questions.after_whitespace(prompt, len(prompt) - len(tail))
    return questions.question_start(tokenizer, ids, prompt, start, use_chat and task not in NO_CHAT_TASKS)


def default_max_length(context: int | None, task: str, chat_overhead: int = 0) -> int:
    """The prompt budget when Settings.max_length is None: context - generation length - chat overhead."""
    if context is None:
        raise ValueError("LongBench: the model's config has no max_position_embeddings; give max_length")
    budget = context - TASK_MAX_NEW_TOKENS[task] - chat_overhead
    if budget < _MIN_DEFAULT_MAX_LENGTH:
        raise ValueError(
            f"LongBench: the model's context ({context}) is too short for {task} (generation length "
            f"{TASK_MAX_NEW_TOKENS[task]}); give max_length or leave the task out"
        )
    return budget


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
            if settings.question == answers.AFTER_COMPRESSION:
                split["question_start"] = question_start(tokenizer, task, record, prompt, ids, task_chat)
            payload = {
                "task": task,
                "ids": ids,
                "answers": list(record["answers"]),
                "answer_ids": answers.gold_ids(
                    tokenizer, ids, str(record["answers"][0]), answers.answer_limit(max_new, settings.answer_tokens)
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


def _question(payload: dict) -> answers.Question:
    stop = payload.get("eos_token_id")
    return answers.Question(
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
        model, plan, _question(payload), settings.mode, _judge(payload), _pad(payload["tokenizer"])
    )
    return answers.Scored(scored.metrics, scored.prediction, list(payload["answers"]))


def score_samples(model, plans: list[Plan], payload: dict, settings: LongBenchSettings) -> list[answers.Scored]:
    """`score_sample` for several plans on one sample at once (`polykv.runtime.many_plans`: one prompt pass,
    the plans' generations and teacher-forced answers as one batch); plan by plan when the model's
    generation needs `generate`."""
    from polykv.runtime import many_plans  # torch and transformers: when a plan runs

    if many_plans.unsupported(model):
        return [score_sample(model, plan, payload, settings) for plan in plans]
    scored = answers.score_many(model, plans, _question(payload), settings.mode, _judge(payload))
    return [answers.Scored(s.metrics, s.prediction, list(payload["answers"])) for s in scored]


def _score(payload: dict, prediction: str) -> dict[str, float]:
    value = longbench_sample_score(payload["task"], prediction, payload["answers"], payload["all_classes"])
    return {"score": 100.0 * value}

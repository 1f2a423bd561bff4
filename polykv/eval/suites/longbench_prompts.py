"""A LongBench sample's prompt, as ``pred.py`` builds it: the task's template formatted with the sample's fields,
cut in the middle to ``max_length`` tokens, in the chat format unless the task is one of ``NO_CHAT_TASKS``; where
its question starts (the AFTER_COMPRESSION protocol), and the default prompt budget. How this differs from the
original: the suite's docstring (`polykv.eval.suites.longbench`)."""

from __future__ import annotations

from . import chat, questions
from .longbench_data import _check_task
from .longbench_tasks import NO_CHAT_TASKS, TASK_MAX_NEW_TOKENS, TASK_PROMPTS, TASKS

#: the tasks whose template asks no question after the context, only an instruction (summarize, count, complete)
INSTRUCTION_ONLY = tuple(t for t in TASKS if "{input}" not in TASK_PROMPTS[t].split("{context}", 1)[1])
_MIN_DEFAULT_MAX_LENGTH = 16  # a default prompt budget below this means the context cannot hold the task


def format_prompt(task: str, record: dict) -> str:
    """The task's official template formatted with the sample's fields (``str.format(**record)``)."""
    _check_task(task)
    return TASK_PROMPTS[task].format(**record)


def truncate_middle(tokenizer, prompt: str, max_length: int) -> str:
    """``pred.py``'s middle truncation: if the prompt has more than max_length tokens (special tokens
    included), the text of its first and last ``max_length // 2`` tokens (special tokens skipped),
    joined. If re-encoding the joined text still exceeds max_length, the cut is redone with fewer
    tokens per side until it fits (see the suite's docstring, `polykv.eval.suites.longbench`)."""
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

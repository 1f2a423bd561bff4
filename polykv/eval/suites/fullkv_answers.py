"""FullKV's greedy answers, kept once per (model, prompt) in this process: what `agreement` compares each plan's
answer with (`polykv.eval.suites.answers.fullkv_answer` computes a missing one). A question is an
`answers.Question`."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

_REFERENCES = 4096
_reference_cache: OrderedDict[tuple, tuple[weakref.ref, list[int]]] = OrderedDict()
_reference_lock = threading.Lock()


def _reference_key(model, question) -> tuple:
    parameter = next(model.parameters())
    return (
        id(model),
        str(parameter.device),
        str(parameter.dtype),
        tuple(question.prompt_ids),
        question.max_new_tokens,
        question.stop,
        question.min_new_tokens,
        question.question_start,
    )


def cached_reference(model, question) -> list[int] | None:
    with _reference_lock:
        entry = _reference_cache.get(_reference_key(model, question))
        if entry is not None and entry[0]() is model:
            return list(entry[1])
    return None


def remember_reference(model, question, tokens: list[int]) -> list[int]:
    """Keep FullKV's answer to `question` (the first one computed stays: every plan compares with the same)."""
    key = _reference_key(model, question)
    with _reference_lock:
        entry = _reference_cache.get(key)
        if entry is not None and entry[0]() is model:
            return list(entry[1])
        _reference_cache[key] = (weakref.ref(model), list(tokens))
        while len(_reference_cache) > _REFERENCES:
            _reference_cache.popitem(last=False)
    return list(tokens)


def clear_reference_cache() -> None:
    with _reference_lock:
        _reference_cache.clear()


__all__ = ["cached_reference", "clear_reference_cache", "remember_reference"]

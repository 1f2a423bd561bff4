"""FullKV's greedy answers, kept once per (model, prompt) in this process: what `agreement` compares each plan's
answer with (`polykv.eval.suites.answers.fullkv_answer` computes a missing one). A sample is an
`answers.AnswerSample`."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

_REFERENCES = 4096
_reference_cache: OrderedDict[tuple, tuple[weakref.ref, list[int]]] = OrderedDict()
_reference_lock = threading.Lock()


def _reference_key(model, sample) -> tuple:
    parameter = next(model.parameters())
    return (
        id(model),
        str(parameter.device),
        str(parameter.dtype),
        tuple(sample.prompt_ids),
        sample.max_new_tokens,
        sample.stop,
        sample.min_new_tokens,
        sample.question_start,
    )


def cached_reference(model, sample) -> list[int] | None:
    with _reference_lock:
        entry = _reference_cache.get(_reference_key(model, sample))
        if entry is not None and entry[0]() is model:
            return list(entry[1])
    return None


def remember_reference(model, sample, tokens: list[int]) -> list[int]:
    """Keep FullKV's answer to `sample` (the first one computed stays: every plan compares with the same)."""
    key = _reference_key(model, sample)
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

"""What every RULER task builder shares: tokens to generate per task family, the noise line, the
length error, the builder base class, tokenizer-length fitting (the largest haystack whose prompt
fits), per-sample seeds and wonderwords' word lists.

Follows NVIDIA/RULER @ c3f5e3b4, ``scripts/data/synthetic/constants.py`` (read, then re-implemented;
no code copied); how fitting differs from RULER's is in the package docstring.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from typing import Any

from .. import chat

#: scripts/data/synthetic/constants.py: tokens to generate per task family
TOKENS_TO_GENERATE = {
    "niah": 128,
    "variable_tracking": 30,
    "common_words_extraction": 120,
    "freq_words_extraction": 50,
    "qa": 32,
}

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


class RulerLengthError(ValueError):
    """The requested length cannot hold a task's shortest prompt plus its generation."""


class _Builder:
    """A sample with everything drawn but the haystack size: render(size) -> (prompt, answers, context, info)."""

    min_size = 0

    def render(self, size: int) -> tuple[str, list[str], str, dict]:
        raise NotImplementedError


# ---- fitting: the largest haystack whose prompt fits the length ------------------------------------


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, verbose=False)["input_ids"])


#: where each family's answer prefix starts: the prompt is the task text, then the prefix
ANSWER_PREFIX_START = {
    "niah": " The special magic",
    "variable_tracking": " Answer:",
    "common_words_extraction": " Answer:",
    "freq_words_extraction": " Answer:",
    "qa": " Answer:",
}


def split_answer_prefix(family: str, text: str) -> tuple[str, str]:
    """(task text, answer prefix) of a rendered prompt: the prefix is its last part, from the family's marker."""
    start = text.rfind(ANSWER_PREFIX_START[family])
    if start < 0:
        raise ValueError(f"a {family} prompt without its answer prefix")
    return text[:start], text[start:]


def prompt_ids(tokenizer, family: str, text: str, use_chat: bool) -> list[int]:
    """The ids the model gets for a rendered prompt: plain (the tokenizer's special tokens added), or the
    task in the chat template's user message with the answer prefix after the generation prompt (RULER's
    ``model_template.format(task_template=...) + answer_prefix``)."""
    if not use_chat:
        return _encode(tokenizer, text)
    task, prefix = split_answer_prefix(family, text)
    return chat.chat_ids(tokenizer, task, prefix)


def _largest_fitting(
    fits: Callable[[int], bool], lo: int, guess: int | None, count: Callable[[int], int], budget: int
) -> int:
    """The largest n >= lo with fits(n) and not fits(n + 1); fits(lo) must hold."""
    if guess is None:  # extrapolate from the cost of a few more units
        probe = lo + 16
        per_unit = max((count(probe) - count(lo)) / 16, 1e-3)
        guess = lo + int((budget - count(lo)) / per_unit)
    guess = max(guess, lo)
    if fits(guess):
        good, step = guess, max(1, guess // 64)
        while fits(good + step):
            good, step = good + step, step * 2
        bad = good + step
    else:
        bad, step = guess, max(1, (guess - lo) // 64)
        while True:
            candidate = bad - step
            if candidate <= lo:
                good = lo
                break
            if fits(candidate):
                good = candidate
                break
            bad, step = candidate, step * 2
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good


def _seed_int(*parts: Any) -> int:
    digest = hashlib.sha256(":".join(str(p) for p in ("polykv-ruler", *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


@lru_cache(maxsize=1)
def _wonderwords() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """wonderwords' noun, adjective and verb lists (the package's own asset files)."""
    assets = resources.files("wonderwords") / "assets"

    def read(name: str) -> tuple[str, ...]:
        lines = (assets / name).read_text(encoding="utf-8").splitlines()
        return tuple(sorted({line.rstrip() for line in lines if line.strip()}))

    return read("nounlist.txt"), read("adjectivelist.txt"), read("verblist.txt")

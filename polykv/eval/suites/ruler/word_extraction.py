"""RULER's word extraction tasks: common words (cwe: the 10 words a numbered list repeats most) and
frequent words (fwe: the 3 most frequent "coded" words of a Zipf-distributed text).

Follows NVIDIA/RULER @ c3f5e3b4, ``scripts/data/synthetic/constants.py``,
``scripts/data/synthetic/common_words_extraction.py`` and ``freq_words_extraction.py`` (read, then
re-implemented; no code copied).
"""

from __future__ import annotations

import math
import random
import string
from collections.abc import Sequence
from functools import lru_cache

from .common import RulerLengthError, _Builder, _wonderwords

# The templates and answer prefixes (scripts/data/synthetic/constants.py); a prompt is the two joined.
CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
    "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?"
)
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most "
    "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
    "the dots '....'. What are the three most frequently appeared words in the above coded text?"
)
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
CWE_ARGS = {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10, "num_fewshot": 1}
FWE_ARGS = {"alpha": 2.0, "coded_wordlen": 6}


@lru_cache(maxsize=1)
def _cwe_words() -> tuple[str, ...]:
    nouns, adjectives, verbs = _wonderwords()
    return tuple(sorted(set(nouns) | set(adjectives) | set(verbs)))


# ---- common words extraction ------------------------------------------------------------------------


def _draw_words(rng: random.Random, count: int) -> list[str]:
    pool = _cwe_words()
    if count <= len(pool):
        return rng.sample(pool, count)
    nouns, adjectives, _ = _wonderwords()  # more than the lists hold: adjective-noun compounds
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < count:
        word = f"{rng.choice(adjectives)}-{rng.choice(nouns)}"
        if word not in seen:
            seen.add(word)
            out.append(word)
    return out


def _numbered(words: Sequence[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


class _CommonWords(_Builder):
    def __init__(self, length: int, seed: int, freq_cw: int, freq_ucw: int, num_cw: int, num_fewshot: int):
        rng = random.Random(seed)
        self.num_cw = num_cw
        # RULER's settings below 4096 tokens: a smaller example and fewer repeats
        shot_words, shot_cw, shot_ucw = (20, 3, 1) if length < 4096 else (40, 10, 3)
        self.repeats = (6, 1) if length < 4096 else (freq_cw, freq_ucw)
        shots = []
        for _ in range(num_fewshot):
            context, common = self._example(rng, shot_words, shot_cw, shot_ucw)
            shots.append(CWE_TEMPLATE.format(context=context) + CWE_PREFIX + " " + _numbered(common))
        self.shots = "\n".join(shots)
        self.main_seed = rng.getrandbits(64)
        self.min_size = num_cw

    def _example(self, rng: random.Random, num_words: int, common_repeats: int, uncommon_repeats: int):
        words = _draw_words(rng, num_words)
        common, uncommon = words[: self.num_cw], words[self.num_cw :]
        items = common * common_repeats + uncommon * uncommon_repeats
        rng.shuffle(items)
        return _numbered(items), common

    def render(self, size: int):
        context, common = self._example(random.Random(self.main_seed), size, *self.repeats)
        prompt = self.shots + "\n" + CWE_TEMPLATE.format(context=context) + CWE_PREFIX
        return prompt, common, context, {}


# ---- frequent words extraction ----------------------------------------------------------------------


def _zeta(s: float) -> float:
    """Riemann zeta(s) for s > 1: a partial sum and its Euler-Maclaurin tail."""
    n = 1000
    head = math.fsum(k**-s for k in range(1, n))
    return (
        head
        + n ** (1 - s) / (s - 1)
        + 0.5 * n**-s
        + s * n ** (-s - 1) / 12
        - s * (s + 1) * (s + 2) * n ** (-s - 3) / 720
    )


class _FreqWords(_Builder):
    def __init__(self, task: str, length: int, generate: int, seed: int, alpha: float, coded_wordlen: int):
        vocab_size = (length - generate) // 50  # RULER's vocabulary size for a length
        if vocab_size < 4:
            raise RulerLengthError(
                f"ruler length {length} is too small for task {task}: its vocabulary of (length - {generate}) // 50 "
                "words needs at least 4 (the noise word and the three answers)"
            )
        rng = random.Random(seed)
        vocab: set[str] = set()
        while len(vocab) < vocab_size:
            vocab.add("".join(rng.choices(string.ascii_lowercase, k=coded_wordlen)))
        words = sorted(vocab)
        rng.shuffle(words)
        words[0] = "..."  # the most frequent word is noise
        self.vocab, self.answers = words, words[1:4]
        self.share = [k**-alpha / _zeta(alpha) for k in range(1, vocab_size + 1)]
        self.shuffle_seed = rng.getrandbits(64)
        n = 1
        while not self._well_posed(n):
            n += 1
        self.min_size = n

    def counts(self, size: int) -> list[int]:
        return [int(size * share) for share in self.share]

    def _well_posed(self, size: int) -> bool:
        counts = self.counts(size)
        return counts[3] >= 1 and (len(counts) < 5 or counts[3] > counts[4])

    def render(self, size: int):
        items = [w for w, c in zip(self.vocab, self.counts(size)) for _ in range(c)]
        random.Random(self.shuffle_seed).shuffle(items)
        context = " ".join(items)
        return FWE_TEMPLATE.format(context=context) + FWE_PREFIX, self.answers, context, {}

"""RULER's needle-in-a-haystack tasks (niah_single_1..3, niah_multikey_1..3, niah_multivalue,
niah_multiquery): the configurations, the haystacks (the King James Bible as text, the noise line,
other needles) and where the needles go.

Follows NVIDIA/RULER @ c3f5e3b4, ``scripts/synthetic.yaml``, ``scripts/data/synthetic/constants.py``
and ``scripts/data/synthetic/niah.py`` (read, then re-implemented; no code copied).
"""

from __future__ import annotations

import random
import re
import uuid
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from polykv.profile.corpus import SPLITS, corpora_dir

from .common import NOISE, _Builder, _wonderwords

# The template and answer prefix (scripts/data/synthetic/constants.py). The prompt is the template
# followed by the answer prefix (scripts/data/prepare.py, "base" model template).
NIAH_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
NIAH_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NIAH_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."

#: RULER's needle depths: round(linspace(0, 100, 40)) percent
DEPTHS = tuple(round(100 * i / 39) for i in range(40))


@dataclass(frozen=True)
class NiahConfig:
    """One needle-in-a-haystack configuration of scripts/synthetic.yaml."""

    haystack: str  # "essay" (here: the King James Bible), "noise" or "needle"
    type_needle_k: str  # "words", "numbers" or "uuids"
    type_needle_v: str
    num_needle_k: int = 1
    num_needle_v: int = 1
    num_needle_q: int = 1


#: scripts/synthetic.yaml
NIAH_TASKS = {
    "niah_single_1": NiahConfig("noise", "words", "numbers"),
    "niah_single_2": NiahConfig("essay", "words", "numbers"),
    "niah_single_3": NiahConfig("essay", "words", "uuids"),
    "niah_multikey_1": NiahConfig("essay", "words", "numbers", num_needle_k=4),
    "niah_multikey_2": NiahConfig("needle", "words", "numbers"),
    "niah_multikey_3": NiahConfig("needle", "uuids", "uuids"),
    "niah_multivalue": NiahConfig("essay", "words", "numbers", num_needle_v=4),
    "niah_multiquery": NiahConfig("essay", "words", "numbers", num_needle_q=4),
}


def _random_value(rng: random.Random, kind: str) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if kind == "words":
        nouns, adjectives, _ = _wonderwords()
        return f"{rng.choice(adjectives)}-{rng.choice(nouns)}"
    raise ValueError(f"unknown needle type {kind!r} (numbers, words or uuids)")


def _unique_value(rng: random.Random, kind: str, used: set[str]) -> str:
    while True:
        value = _random_value(rng, kind)
        if value not in used:
            used.add(value)
            return value


_HEADING = re.compile(r"(?:[123] )?[A-Z][A-Za-z ]* \d+")
_VERSE_NUMBER = re.compile(r"^\s+\d+\s+")


@lru_cache(maxsize=2)
def _bible(path: str) -> tuple[list[str], list[int]]:
    """The evaluation part of kjv.txt as words (headings and verse numbers dropped), and the indices of
    the words that start a sentence."""
    text = Path(path).read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
    lo, hi = SPLITS["evaluation"]
    start = text.find("\n\n", int(len(text) * lo))
    lines, previous = [], ""
    for line in text[max(start, 0) : int(len(text) * hi)].split("\n"):
        if not (previous.strip() == "" and _HEADING.fullmatch(line.strip()) and not line.startswith(" ")):
            lines.append(_VERSE_NUMBER.sub("", line))
        previous = line
    words = " ".join(lines).split()
    if len(words) < 100:
        raise ValueError(f"ruler: the haystack text {path} is too short")
    starts = [0] + [i + 1 for i, w in enumerate(words[:-1]) if w.endswith((".", "?", "!"))]
    return words, starts


def _haystack_words(path: str, first: int, n: int) -> list[str]:
    """n words from word `first` on, wrapping around the text."""
    words, _ = _bible(path)
    out: list[str] = []
    at = first
    while len(out) < n:
        piece = words[at : at + n - len(out)]
        out += piece
        at = 0
    return out


def _insert_lines(lines: list[str], items: Sequence[str], fractions: Sequence[float]) -> list[str]:
    """Insert each item among the lines at slot round(fraction x number of lines) (ties keep item order)."""
    n = len(lines)
    slots = [min(n, max(0, round(f * n))) for f in fractions]
    order = sorted(range(len(items)), key=lambda i: (slots[i], i))
    out, previous = [], 0
    for i in order:
        out += lines[previous : slots[i]]
        out.append(items[i])
        previous = slots[i]
    return out + lines[previous:]


class _Niah(_Builder):
    def __init__(self, config: NiahConfig, seed: int, depths: Sequence[float] | None):
        self.config = config
        rng = random.Random(seed)
        num_k = max(config.num_needle_k, config.num_needle_q)
        used: set[str] = set()
        keys, values, needles = [], [], []
        for _ in range(num_k):
            keys.append(_unique_value(rng, config.type_needle_k, used))
            values.append([])
            for _ in range(config.num_needle_v):
                values[-1].append(_unique_value(rng, config.type_needle_v, used))
                needles.append(
                    NIAH_NEEDLE.format(type_needle_v=config.type_needle_v, key=keys[-1], value=values[-1][-1])
                )
        rng.shuffle(needles)
        queried = rng.sample(range(num_k), config.num_needle_q)
        queries = [keys[i] for i in queried]
        self.answers = [v for i in queried for v in values[i]]
        self.query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]
        if depths is not None:
            depths = [float(d) for d in depths]
            if len(depths) != len(needles) or not all(0.0 <= d <= 1.0 for d in depths):
                raise ValueError(f"depths: give {len(needles)} fraction(s) in [0, 1], one per needle")
        elif config.haystack == "essay":
            depths = [d / 100 for d in rng.sample(DEPTHS, len(needles))]
        else:
            depths = [rng.random() for _ in needles]
        self.needles, self.depths = needles, depths
        self.used = used
        self.distractor_seed = rng.getrandbits(64)
        if config.haystack == "essay":
            self.path = str(corpora_dir() / "kjv.txt")
            words, starts = _bible(self.path)
            self.first = starts[bisect_left(starts, rng.randrange(len(words))) % len(starts)]
        elif config.haystack not in ("noise", "needle"):
            raise ValueError(f"unknown haystack {config.haystack!r} (essay, noise or needle)")
        template, type_v = NIAH_TEMPLATE + NIAH_PREFIX, config.type_needle_v
        if config.num_needle_q * config.num_needle_v == 1:  # RULER's singular wording
            for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
                template = template.replace(old, new)
            type_v = type_v[:-1]
        self.template, self.type_v = template, type_v

    def render(self, size: int):
        config = self.config
        if config.haystack == "essay":
            context = self._essay(size)
        else:
            if config.haystack == "noise":
                lines = [NOISE] * size
            else:  # other needles, drawn in a fixed order so a longer haystack extends a shorter one
                rng, used = random.Random(self.distractor_seed), set(self.used)
                lines = [
                    NIAH_NEEDLE.format(
                        type_needle_v=config.type_needle_v,
                        key=_unique_value(rng, config.type_needle_k, used),
                        value=_random_value(rng, config.type_needle_v),
                    )
                    for _ in range(size)
                ]
            context = "\n".join(_insert_lines(lines, self.needles, self.depths))
        text = self.template.format(type_needle_v=self.type_v, context=context, query=self.query)
        return (
            text,
            self.answers,
            context,
            {"needles": list(self.needles), "depths": list(self.depths), "query": self.query},
        )

    def _essay(self, size: int) -> str:
        words = _haystack_words(self.path, self.first, size)
        boundaries = [0] + [i for i in range(1, size) if words[i - 1].endswith((".", "?", "!"))] + [size]
        slots = []
        for depth in self.depths:
            target = depth * size
            j = bisect_left(boundaries, target)
            candidates = boundaries[max(0, j - 1) : j + 1]
            slots.append(min(candidates, key=lambda b: (abs(b - target), b)))
        order = sorted(range(len(self.needles)), key=lambda i: (slots[i], i))
        pieces, previous = [], 0
        for i in order:
            pieces.append(" ".join(words[previous : slots[i]]))
            pieces.append(self.needles[i])
            previous = slots[i]
        pieces.append(" ".join(words[previous:]))
        return " ".join(p for p in pieces if p)

"""The `ruler` suite: RULER's synthetic long-context tasks, built for the evaluated model's tokenizer.

Reference: Cheng-Ping Hsieh, Simeng Sun, Samuel Kriman, Shantanu Acharya, Dima Rekesh, Fei Jia, Yang
Zhang, Boris Ginsburg. "RULER: What's the Real Context Size of Your Long-Context Language Models?"
COLM 2024 (arXiv:2404.06654). The task definitions follow the reference implementation, NVIDIA/RULER
@ c3f5e3b4: ``scripts/synthetic.yaml`` (the 13 standard task configurations),
``scripts/data/synthetic/constants.py`` (templates, answer prefixes, tokens to generate),
``scripts/data/synthetic/{niah,variable_tracking,common_words_extraction,freq_words_extraction,qa}.py``
(the generators) and ``scripts/data/prepare.py`` (template + answer prefix). That code was read and
re-implemented here; none of it is copied. Scoring uses the RULER metrics of ``polykv.eval.metrics``.

Tasks (``length`` counts tokens of the evaluated model's tokenizer; prompt + generation fit in it):
  niah_single_1..3, niah_multikey_1..3, niah_multivalue, niah_multiquery
      needles "One of the special magic {numbers|uuids} for {key} is: {value}." hidden at seeded depths
      in a haystack: text (the King James Bible), noise ("The grass is green. ..." repeated) or other
      needles; keys are adjective-noun words (wonderwords) or uuids, values 7-digit numbers or uuids.
  vt    variable tracking: a chain "VAR A = 12345", "VAR B = VAR A", ... (4 hops) hidden in noise, with
        one worked example in front; the answer is every variable holding the value. Chain lines are
        placed as RULER places them (``_Chains``): each right before a distinct line drawn uniformly,
        in chain order, so no two are adjacent and none follows the last noise line.
  cwe   common words: a numbered list where 10 words repeat more often than the rest (one worked
        example in front); the answer is those 10 words.
  fwe   frequent words: synthetic 6-letter "coded" words drawn from a Zipf (zeta, alpha 2) law; the
        answer is the 3 most frequent ones after the "..." noise word.
  qa_1, qa_2
        a SQuAD / HotpotQA question answered from its gold documents mixed with distractors. The data
        is the user's own file (``squad_path``: SQuAD json, v2 or v1.1; ``hotpot_path``: HotpotQA
        json, e.g. the dev "distractor" set); without it the default task list leaves the task out.
Each prompt ends with RULER's answer prefix (the model continues it); ``tokens_to_generate`` new tokens
are generated greedily under the plan, decoded, post-processed as RULER does and scored on that one
sample with the task's RULER metric (string_match_all, or string_match_part for qa): 0-100.

Differences from the original, chosen on purpose:
  * Text haystack: the King James Bible (public domain; the evaluation part of ``kjv.txt``, the last
    20% held out from calibration, book/chapter headings and verse numbers removed) instead of Paul
    Graham's essays, which may not be redistributed. Each sample starts at a seeded sentence start
    (RULER always starts at the first essay word) and the text wraps around when it runs out.
  * Sentences are split after words ending in ".", "?" or "!" (RULER: nltk's punkt). A needle at depth
    d goes to the sentence boundary nearest to d x the haystack's words (RULER: sentence number
    int(d x sentences)); depths are still drawn from RULER's 40 depths 0..100%. In noise and needle
    haystacks positions come from uniform fractions of the line count.
  * Keys are unique within a sample (RULER may, rarely, reuse a key among the distractor needles), and a
    word key is a random adjective + "-" + random noun (RULER draws from the sorted set of all pairs:
    the same distribution up to a handful of duplicate strings).
  * Fitting: for every sample, the largest haystack (words, lines, list entries, coded words or
    documents) such that the tokenized prompt, answer prefix and the special tokens the tokenizer adds
    (BOS) included, plus tokens_to_generate is at most ``length``. RULER counts tokens without special
    tokens, searches the size once per task and shrinks it per sample in fixed steps (fwe: grows it in
    steps of length/32), so its prompts are up to a step shorter. A length too small for a task's
    shortest prompt is an error (RULER silently overflows).
  * vt's worked example is sized to min(500, length // 8) tokens (RULER: 500) and left out when even its
    shortest form does not fit that; its names and value are random like RULER's randomized example.
  * cwe: when more distinct words are needed than wonderwords' lists hold (about 128k tokens with common tokenizers), the
    words are adjective-noun compounds (RULER switches to its own english_words.json).
  * fwe: zeta(alpha) is computed here (no scipy); a length so short that the top three words are not
    well defined (the third one absent or as frequent as the fourth) is an error.
  * qa: question k of a run is the k-th of a seeded permutation of the file's questions (RULER takes the
    first questions in file order whatever the seed); SQuAD v1.1 files (no ``is_impossible``) work.
  * Randomness: one ``random.Random`` per (seed, task, sample), so a sample does not depend on the
    others (RULER uses one stream per task and re-seeds some shuffles with the fixed seed).
  * The "base" template only (no chat template), newlines kept (RULER's defaults), no stop words.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import string
import uuid
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from polykv.eval.metrics import RULER_TASKS, ruler_metric, ruler_postprocess_pred
from polykv.plan import Plan
from polykv.profile.corpus import SPLITS, corpora_dir
from polykv.runtime import routed

STANDARD_TASKS: tuple[str, ...] = tuple(RULER_TASKS)
#: the setting naming each QA task's data file, and what the file is
QA_FILES = {"qa_1": ("squad_path", "SQuAD"), "qa_2": ("hotpot_path", "HotpotQA")}

#: scripts/data/synthetic/constants.py: tokens to generate per task family
TOKENS_TO_GENERATE = {
    "niah": 128,
    "variable_tracking": 30,
    "common_words_extraction": 120,
    "freq_words_extraction": 50,
    "qa": 32,
}

# The task templates and answer prefixes (scripts/data/synthetic/constants.py). The prompt is the
# template followed by the answer prefix (scripts/data/prepare.py, "base" model template).
NIAH_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
NIAH_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NIAH_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assigned the value {query}, they are: "
)
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
QA_INSTRUCTION = "Answer the question based on the given documents. Only give me the answer and do not output any other words."
QA_TEMPLATE = (
    QA_INSTRUCTION + "\n\nThe following are given documents.\n\n{context}\n\n" + QA_INSTRUCTION + "\n\nQuestion: {query}"
)
QA_PREFIX = " Answer:"
QA_DOCUMENT = "Document {i}:\n{document}"

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
VT_ARGS = {"num_chains": 1, "num_hops": 4}
CWE_ARGS = {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10, "num_fewshot": 1}
FWE_ARGS = {"alpha": 2.0, "coded_wordlen": 6}
VT_EXAMPLE_TOKENS = 500  # RULER sizes its worked vt example to 500 tokens


class RulerLengthError(ValueError):
    """The requested length cannot hold a task's shortest prompt plus its generation."""


# ---- settings ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RulerSettings:
    """``tasks=None``: the 13 standard tasks, less qa_1 / qa_2 when their file is not given.

    ``length``: tokens of the evaluated model's tokenizer that prompt + generation may use (each prompt
    is made as long as that allows); a list of lengths (e.g. ``[4096, 8192]``) runs every task at each
    of them. With several lengths a task's samples at length L are named ``<task>@<L>`` (e.g.
    ``niah_single_1@4096``), so statistics can resample a task's cluster across lengths. Sample i of a
    task has the same seed at every length (niah needles and vt chains come out the same, in a longer
    haystack; fwe's vocabulary and cwe's repeats depend on the length, as in RULER). A one-element list
    is the same settings as its single length, and the list is kept sorted.
    ``squad_path`` / ``hotpot_path``: the user's SQuAD / HotpotQA json.
    """

    tasks: tuple[str, ...] | None = None
    length: int | tuple[int, ...] = 4096
    samples_per_task: int = 4
    squad_path: str | None = None
    hotpot_path: str | None = None

    def __post_init__(self):
        for name in ("squad_path", "hotpot_path"):
            value = getattr(self, name)
            if value is not None:
                path = Path(value).expanduser()
                if not path.is_file():
                    raise FileNotFoundError(f"ruler {name}: no such file {path}")
                object.__setattr__(self, name, str(path.resolve()))
        if self.tasks is None:
            tasks = tuple(t for t in STANDARD_TASKS if t not in QA_FILES or getattr(self, QA_FILES[t][0]))
        elif isinstance(self.tasks, str):
            tasks = tuple(t.strip() for t in self.tasks.split(",") if t.strip())
        else:
            tasks = tuple(self.tasks)
        unknown = [t for t in tasks if t not in RULER_TASKS]
        if unknown:
            raise ValueError(f"unknown ruler task(s) {', '.join(map(str, unknown))} (tasks: {', '.join(STANDARD_TASKS)})")
        if not tasks or len(set(tasks)) != len(tasks):
            raise ValueError("ruler settings: tasks must be a non-empty list without repeats")
        for task in tasks:
            if task in QA_FILES and not getattr(self, QA_FILES[task][0]):
                name, kind = QA_FILES[task]
                raise ValueError(f"ruler task {task} needs {name}: the path of a {kind} json file (it is not bundled)")
        object.__setattr__(self, "tasks", tasks)
        object.__setattr__(self, "length", _normalized_length(self.length))
        if self.samples_per_task < 1 or min(self.lengths) < 2:
            raise ValueError("ruler settings: samples_per_task must be >= 1 and length >= 2")

    @property
    def lengths(self) -> tuple[int, ...]:
        """Every length the tasks run at, ascending."""
        return self.length if isinstance(self.length, tuple) else (self.length,)

    def task_name(self, task: str, length: int) -> str:
        """The name a task's samples at `length` are stored under: `task`, or `task@length` with several lengths."""
        return task if len(self.lengths) == 1 else f"{task}@{length}"

    def to_dict(self) -> dict:
        length = list(self.length) if isinstance(self.length, tuple) else self.length
        return {**asdict(self), "tasks": list(self.tasks), "length": length}


def _normalized_length(value) -> int | tuple[int, ...]:
    """A length as an int, several as an ascending tuple (one listed length becomes that int)."""
    def whole(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if whole(value):
        return value
    if isinstance(value, (list, tuple)) and value and all(whole(v) for v in value):
        if len(set(value)) != len(value):
            raise ValueError(f"ruler settings: length lists a length twice ({list(value)})")
        return value[0] if len(value) == 1 else tuple(sorted(value))
    raise ValueError(f"ruler settings: length must be a whole number of tokens or a non-empty list of them (got {value!r})")


Settings = RulerSettings  # every suite module exposes Settings, build_samples and score_sample
# Bump whenever samples or scoring change: run ids include it, so older results are never reused.
REVISION = 2  # 2: variable-tracking chain lines placed as the official generator does


# ---- samples ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RulerSample:
    task: str
    prompt: str  # the whole prompt text; it ends with RULER's answer prefix
    prompt_ids: list[int]  # the prompt tokenized as the model gets it (special tokens included)
    answers: list[str]  # RULER's `outputs`
    tokens_to_generate: int
    context: str  # what fills the template's {context}
    size: int  # haystack units: words, lines, list words, coded words or documents
    info: dict = field(default_factory=dict)  # niah: needles and their depths; vt: the chain; qa: question


def make_sample(
    tokenizer,
    task: str,
    length: int,
    seed: int = 0,
    index: int = 0,
    *,
    squad_path: str | None = None,
    hotpot_path: str | None = None,
    depths: Sequence[float] | None = None,
    size: int | None = None,
    guess: int | None = None,
) -> RulerSample:
    """Sample `index` of `task` for `seed`, as long as `length` allows (deterministic).

    ``depths``: niah only, one fraction in [0, 1] per needle (in the order of ``info["needles"]``)
    instead of seeded ones. ``size``: use this haystack size instead of fitting one (it may not fit).
    ``guess``: a haystack size to start the search from (the previous sample's, to save tokenizations).
    """
    if task not in RULER_TASKS:
        raise ValueError(f"unknown ruler task {task!r} (tasks: {', '.join(STANDARD_TASKS)})")
    family = RULER_TASKS[task]
    generate = TOKENS_TO_GENERATE[family]
    sample_seed = _seed_int(seed, task, index)
    if family == "niah":
        builder: _Builder = _Niah(NIAH_TASKS[task], sample_seed, depths)
    elif depths is not None:
        raise ValueError(f"depths apply to niah tasks only, not {task}")
    elif family == "variable_tracking":
        builder = _VariableTracking(tokenizer, length, sample_seed, **VT_ARGS)
    elif family == "common_words_extraction":
        builder = _CommonWords(length, sample_seed, **CWE_ARGS)
    elif family == "freq_words_extraction":
        builder = _FreqWords(task, length, generate, sample_seed, **FWE_ARGS)
    else:
        name, kind = QA_FILES[task]
        path = squad_path if task == "qa_1" else hotpot_path
        if not path:
            raise ValueError(f"ruler task {task} needs {name}: the path of a {kind} json file (it is not bundled)")
        builder = _QA(task, _load_qa(task, path), seed, index, sample_seed)

    counts: dict[int, int] = {}

    def count(n: int) -> int:
        if n not in counts:
            counts[n] = len(_encode(tokenizer, builder.render(n)[0]))
        return counts[n]

    budget = length - generate
    if size is None:
        if count(builder.min_size) > budget:
            raise RulerLengthError(
                f"ruler length {length} is too small for task {task}: its shortest prompt is "
                f"{count(builder.min_size)} tokens with this tokenizer, plus {generate} to generate"
            )
        size = _largest_fitting(lambda n: count(n) <= budget, builder.min_size, guess, count, budget)
    elif size < builder.min_size:
        raise ValueError(f"ruler task {task}: size must be at least {builder.min_size}")
    text, answers, context, info = builder.render(size)
    return RulerSample(
        task=task, prompt=text, prompt_ids=_encode(tokenizer, text), answers=list(answers),
        tokens_to_generate=generate, context=context, size=size, info=info,
    )


def build_samples(tokenizer, model, settings: RulerSettings, seed: int) -> list[tuple[str, str, dict]]:
    """(task, sample id, payload) for every sample, deterministic for a seed.

    The task of a row is ``settings.task_name(task, length)``: the RULER task, with ``@<length>`` when
    the settings list several lengths (tasks in order, each at every length, ascending).
    payload: ``prompt_ids``, ``answers``, ``task`` (the RULER task), ``length``, ``tokens_to_generate``
    and the ``tokenizer`` (to decode what the model generates)."""
    context = _model_context(model)
    longest = max(settings.lengths)
    if context is not None and longest > context:
        raise ValueError(
            f"ruler length {longest} exceeds the model's context ({context} tokens); pass a length of at most {context}"
        )
    out = []
    for task in settings.tasks:
        for length in settings.lengths:
            guess = None
            for i in range(settings.samples_per_task):
                sample = make_sample(
                    tokenizer, task, length, seed, i,
                    squad_path=settings.squad_path, hotpot_path=settings.hotpot_path, guess=guess,
                )
                guess = sample.size
                payload = {
                    "task": task,
                    "length": length,
                    "prompt_ids": sample.prompt_ids,
                    "answers": sample.answers,
                    "tokens_to_generate": sample.tokens_to_generate,
                    "tokenizer": tokenizer,
                }
                out.append((settings.task_name(task, length), f"{i:03d}", payload))
    return out


@torch.no_grad()
def score_sample(model, plan: Plan, payload: dict, settings: RulerSettings | None = None) -> dict[str, float]:
    """Greedy generation under the plan, decoded and scored as RULER scores it: {"score": 0..100}."""
    prediction = generate_answer(model, plan, payload)
    metric = ruler_metric(payload["task"])
    return {"score": float(metric([ruler_postprocess_pred(prediction)], [payload["answers"]]))}


def generate_answer(model, plan: Plan, payload: dict) -> str:
    """The text the model generates after the prompt (greedy, ``tokens_to_generate`` tokens at most)."""
    device = next(model.parameters()).device
    ids = torch.tensor([payload["prompt_ids"]], device=device)
    tokenizer = payload["tokenizer"]
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    with routed(model, plan):
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=payload["tokens_to_generate"],
            do_sample=False, pad_token_id=pad,
        )
    return tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True)


# ---- fitting ----------------------------------------------------------------------------------------


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, verbose=False)["input_ids"])


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


def _model_context(model) -> int | None:
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


# ---- shared pieces ----------------------------------------------------------------------------------


class _Builder:
    """A sample with everything drawn but the haystack size: render(size) -> (prompt, answers, context, info)."""

    min_size = 0

    def render(self, size: int) -> tuple[str, list[str], str, dict]:
        raise NotImplementedError


@lru_cache(maxsize=1)
def _wonderwords() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """wonderwords' noun, adjective and verb lists (the package's own asset files)."""
    assets = resources.files("wonderwords") / "assets"

    def read(name: str) -> tuple[str, ...]:
        lines = (assets / name).read_text(encoding="utf-8").splitlines()
        return tuple(sorted({line.rstrip() for line in lines if line.strip()}))

    return read("nounlist.txt"), read("adjectivelist.txt"), read("verblist.txt")


@lru_cache(maxsize=1)
def _cwe_words() -> tuple[str, ...]:
    nouns, adjectives, verbs = _wonderwords()
    return tuple(sorted(set(nouns) | set(adjectives) | set(verbs)))


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


# ---- niah -------------------------------------------------------------------------------------------


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
                needles.append(NIAH_NEEDLE.format(type_needle_v=config.type_needle_v, key=keys[-1], value=values[-1][-1]))
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
        return text, self.answers, context, {"needles": list(self.needles), "depths": list(self.depths), "query": self.query}

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


# ---- variable tracking ------------------------------------------------------------------------------


def _names(rng: random.Random, count: int, letters: int, used: set[str]) -> list[str]:
    out = []
    while len(out) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if name not in used:
            used.add(name)
            out.append(name)
    return out


class _Chains:
    """num_chains chains of num_hops + 1 variables; the first chain's value is the query.

    Placement (RULER's noise haystack, variable_tracking.py): chain after chain, a chain of k lines
    picks k distinct lines, uniformly without replacement, among the lines already there (the noise
    lines and the lines of the chains placed before it), and its j-th line goes right before the j-th
    picked line in text order. So every chain line is followed by a line that was there before it:
    none comes after the last noise line, a chain keeps its order, and two lines of one chain are never
    adjacent (with the standard single chain, no two chain lines are; lines of different chains may
    touch, as in RULER). A chain needs at least k lines to choose from: ``min_noise`` noise lines. The
    draw comes from one seed per sample, so a haystack size always gives the same text.
    """

    def __init__(self, rng: random.Random, num_chains: int, num_hops: int, letters: int):
        used_names: set[str] = set()
        used_values: set[int] = set()
        self.names, self.lines = [], []
        for _ in range(num_chains):
            names = _names(rng, num_hops + 1, letters, used_names)
            value = rng.randint(10000, 99999)
            while value in used_values:
                value = rng.randint(10000, 99999)
            used_values.add(value)
            self.names.append(names)
            self.lines.append([f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(num_hops)])
            if len(self.names) == 1:
                self.value = str(value)
        self.placement_seed = rng.getrandbits(64)
        self.num_hops = num_hops
        self.min_noise = num_hops + 1

    def text(self, noise_lines: int) -> tuple[str, str]:
        """(context, prompt) with the chains among noise_lines noise lines, placed as the class says."""
        if noise_lines < self.min_noise:
            raise ValueError(f"variable tracking needs at least {self.min_noise} noise lines, got {noise_lines}")
        lines = [NOISE] * noise_lines
        rng = random.Random(self.placement_seed)
        for chain in self.lines:
            lines = _place_before(lines, chain, rng)
        context = "\n".join(lines)
        prompt = VT_TEMPLATE.format(context=context, query=self.value) + VT_PREFIX.format(
            num_v=self.num_hops + 1, query=self.value
        )
        return context, prompt


def _place_before(lines: list[str], items: Sequence[str], rng: random.Random) -> list[str]:
    """Each item right before one of len(items) distinct lines drawn uniformly, items in their order."""
    picked = sorted(rng.sample(range(len(lines)), len(items)))
    before = dict(zip(picked, items))
    out = []
    for i, line in enumerate(lines):
        if i in before:
            out.append(before[i])
        out.append(line)
    return out


class _VariableTracking(_Builder):
    def __init__(self, tokenizer, length: int, seed: int, num_chains: int, num_hops: int):
        rng = random.Random(seed)
        self.chains = _Chains(rng, num_chains, num_hops, letters=5)
        # The worked example: shorter names (3 letters), its own value, sized to its token budget.
        example = _Chains(random.Random(rng.getrandbits(64)), num_chains, num_hops, letters=3)

        def shot(noise_lines: int) -> str:
            return example.text(noise_lines)[1] + " " + " ".join(example.names[0]) + "\n"

        budget = min(VT_EXAMPLE_TOKENS, length // 8)
        counts: dict[int, int] = {}

        def shot_tokens(n: int) -> int:
            if n not in counts:
                counts[n] = len(_encode(tokenizer, shot(n)))
            return counts[n]

        least = example.min_noise
        if shot_tokens(least) <= budget:
            best = _largest_fitting(lambda n: shot_tokens(n) <= budget, least, None, shot_tokens, budget)
            self.example = shot(best)
        else:
            self.example = ""
        self.min_size = self.chains.min_noise

    def render(self, size: int):
        context, prompt = self.chains.text(size)
        if self.example:
            prompt = self.example + "\n" + prompt
        return prompt, list(self.chains.names[0]), context, {"chain": list(self.chains.lines[0]), "example": self.example}


# ---- common words extraction ------------------------------------------------------------------------


def _draw_words(rng: random.Random, count: int) -> list[str]:
    pool = _cwe_words()
    if count <= len(pool):
        return rng.sample(pool, count)
    nouns, adjectives, _ = _wonderwords()  # more than the lists hold: adjective-noun compounds
    seen: set[str] = set()
    out = []
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
    return head + n ** (1 - s) / (s - 1) + 0.5 * n**-s + s * n ** (-s - 1) / 12 - s * (s + 1) * (s + 2) * n ** (-s - 3) / 720


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


# ---- qa ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _QAData:
    questions: list[dict]  # query, outputs, context (gold document indices), more_context
    documents: list[str]


def _load_qa(task: str, path: str) -> _QAData:
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"ruler task {task}: no such file {file}")
    stat = file.stat()
    return _read_qa(task, str(file.resolve()), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=4)
def _read_qa(task: str, path: str, mtime_ns: int, size: int) -> _QAData:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        data = _read_squad(data) if task == "qa_1" else _read_hotpot(data)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        kind = QA_FILES[task][1]
        raise ValueError(f"ruler task {task}: {path} is not a {kind} json file ({exc.__class__.__name__}: {exc})"[:300]) from None
    if not data.questions:
        raise ValueError(f"ruler task {task}: {path} holds no answerable question")
    return data


def _read_squad(data: dict) -> _QAData:
    """SQuAD json: every answerable question, its paragraph, and the other paragraphs of its article."""
    documents = sorted({p["context"] for article in data["data"] for p in article["paragraphs"]})
    number = {d: i for i, d in enumerate(documents)}
    questions = []
    for article in data["data"]:
        paragraphs = [number[p["context"]] for p in article["paragraphs"]]
        for p in article["paragraphs"]:
            own = number[p["context"]]
            for qa in p["qas"]:
                answers = [a["text"] for a in qa.get("answers", [])]
                if qa.get("is_impossible", False) or not answers:
                    continue
                questions.append({
                    "query": qa["question"], "outputs": answers, "context": [own],
                    "more_context": [i for i in paragraphs if i != own],
                })
    return _QAData(questions, documents)


def _read_hotpot(data: list) -> _QAData:
    """HotpotQA json: every question with all of its paragraphs ("title\\ntext") as its documents."""

    def document(entry) -> str:
        title, sentences = entry
        return f"{title}\n{''.join(sentences)}"

    documents = sorted({document(entry) for item in data for entry in item["context"]})
    number = {d: i for i, d in enumerate(documents)}
    questions = [
        {"query": item["question"], "outputs": [item["answer"]], "context": [number[document(e)] for e in item["context"]],
         "more_context": []}
        for item in data
    ]
    return _QAData(questions, documents)


class _QA(_Builder):
    def __init__(self, task: str, data: _QAData, seed: int, index: int, sample_seed: int):
        order = random.Random(_seed_int(seed, task, "questions")).sample(range(len(data.questions)), len(data.questions))
        if index >= len(order):
            raise ValueError(f"ruler task {task}: sample {index} asked for, but the file holds only {len(order)} answerable questions")
        question = data.questions[order[index]]
        rng = random.Random(sample_seed)
        gold = list(dict.fromkeys(question["context"]))
        more = [i for i in dict.fromkeys(question["more_context"]) if i not in gold]
        taken = set(gold) | set(more)
        rng.shuffle(more)
        others = [i for i in range(len(data.documents)) if i not in taken]
        rng.shuffle(others)
        # Documents in the order they are added (gold, same-article ones, others), each with a random
        # sort key: a longer haystack adds documents among those of a shorter one.
        self.candidates = gold + more + others
        self.keys = [rng.random() for _ in self.candidates]
        self.documents, self.query, self.answers = data.documents, question["query"], list(question["outputs"])
        self.min_size = len(gold)

    def render(self, size: int):
        total = len(self.candidates)
        chosen = sorted(range(min(size, total)), key=lambda i: self.keys[i])
        if size > total:  # more than the file holds: the documents again, as RULER repeats them
            chosen = (chosen * math.ceil(size / total))[:size]
        context = "\n\n".join(QA_DOCUMENT.format(i=k + 1, document=self.documents[self.candidates[i]]) for k, i in enumerate(chosen))
        prompt = QA_TEMPLATE.format(context=context, query=self.query) + QA_PREFIX
        return prompt, self.answers, context, {"query": self.query}

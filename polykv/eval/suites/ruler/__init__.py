"""The `ruler` suite: RULER's synthetic long-context tasks, built for the evaluated model's tokenizer.

Reference: Cheng-Ping Hsieh, Simeng Sun, Samuel Kriman, Shantanu Acharya, Dima Rekesh, Fei Jia, Yang
Zhang, Boris Ginsburg. "RULER: What's the Real Context Size of Your Long-Context Language Models?"
COLM 2024 (arXiv:2404.06654). The task definitions follow the reference implementation, NVIDIA/RULER
@ c3f5e3b4: ``scripts/synthetic.yaml`` (the 13 standard task configurations),
``scripts/data/synthetic/constants.py`` (templates, answer prefixes, tokens to generate),
``scripts/data/synthetic/{niah,variable_tracking,common_words_extraction,freq_words_extraction,qa}.py``
(the generators) and ``scripts/data/prepare.py`` (template + answer prefix). That code was read and
re-implemented here; none of it is copied. Scoring uses the RULER metrics of ``polykv.eval.metrics``.

Modules: ``settings`` (RulerSettings), ``common`` (what the task builders share: fitting a prompt to
the length, seeds, word lists), ``needle`` (the niah tasks), ``variable_tracking`` (vt),
``word_extraction`` (cwe, fwe) and ``qa`` (qa_1, qa_2); this package builds and scores the samples
(``make_sample``, ``build_samples``, ``score_sample``) and re-exports the public names.

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
sample with the task's RULER metric (string_match_all, or string_match_part for qa): 0-100. The
``mode`` setting adds or chooses the dense ``answer_nll`` (``polykv.eval.suites.answers``): the gold
answer is RULER's ``outputs`` in gold order joined by ", " (one text even when a task has several
answers; the model may list them in another order or format, which costs every plan alike).

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
  * cwe: when more distinct words are needed than wonderwords' lists hold (about 128k tokens with common
    tokenizers), the words are adjective-noun compounds (RULER switches to its own english_words.json).
  * fwe: zeta(alpha) is computed here (no scipy); a length so short that the top three words are not
    well defined (the third one absent or as frequent as the fourth) is an error.
  * qa: question k of a run is the k-th of a seeded permutation of the file's questions (RULER takes the
    first questions in file order whatever the seed); SQuAD v1.1 files (no ``is_impossible``) work.
  * Randomness: one ``random.Random`` per (seed, task, sample), so a sample does not depend on the
    others (RULER uses one stream per task and re-seeds some shuffles with the fixed seed).
  * Model template: the tokenizer's own chat template when it has one (``use_chat_template`` "auto",
    as RULER's ``hf-chat`` type does for instruct models: the task as one user message, the generation
    prompt, then the answer prefix), else RULER's "base" template; newlines kept (RULER's default), no
    stop words (generation ends at the model's end-of-turn token or the task's token count).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from polykv.eval.metrics import RULER_TASKS, ruler_metric, ruler_postprocess_pred
from polykv.lazy import no_grad
from polykv.models import context_length
from polykv.models.support import greedy_needs_generate
from polykv.plan import Plan

from .. import answers, chat, questions
from .common import (
    NOISE,
    TOKENS_TO_GENERATE,
    RulerLengthError,
    _Builder,
    _largest_fitting,
    _seed_int,
    prompt_ids,
    split_answer_prefix,
)
from .needle import (
    DEPTHS,
    NIAH_NEEDLE,
    NIAH_PREFIX,
    NIAH_TASKS,
    NIAH_TEMPLATE,
    NiahConfig,
    _Niah,
)
from .qa import _QA, QA_DOCUMENT, QA_INSTRUCTION, QA_PREFIX, QA_TEMPLATE, _load_qa
from .settings import QA_FILES, STANDARD_TASKS, RulerSettings
from .variable_tracking import (
    VT_ARGS,
    VT_EXAMPLE_TOKENS,
    VT_PREFIX,
    VT_TEMPLATE,
    _VariableTracking,
)
from .variable_tracking import _Chains as _Chains  # used by the tests as ruler._Chains
from .word_extraction import (
    CWE_ARGS,
    CWE_PREFIX,
    CWE_TEMPLATE,
    FWE_ARGS,
    FWE_PREFIX,
    FWE_TEMPLATE,
    _CommonWords,
    _FreqWords,
)

__all__ = [
    "CWE_ARGS",
    "CWE_PREFIX",
    "CWE_TEMPLATE",
    "DEPTHS",
    "FWE_ARGS",
    "FWE_PREFIX",
    "FWE_TEMPLATE",
    "NIAH_NEEDLE",
    "NIAH_PREFIX",
    "NIAH_TASKS",
    "NIAH_TEMPLATE",
    "NOISE",
    "QA_DOCUMENT",
    "QA_FILES",
    "QA_INSTRUCTION",
    "QA_PREFIX",
    "QA_TEMPLATE",
    "REVISION",
    "RULER_TASKS",
    "STANDARD_TASKS",
    "TOKENS_TO_GENERATE",
    "VT_ARGS",
    "VT_EXAMPLE_TOKENS",
    "VT_PREFIX",
    "VT_TEMPLATE",
    "NiahConfig",
    "RulerLengthError",
    "RulerSample",
    "METRICS",
    "RulerSettings",
    "Settings",
    "build_samples",
    "make_sample",
    "prompt_tokens",
    "question_start",
    "ruler_metric",
    "ruler_postprocess_pred",
    "score_sample",
    "score_samples",
    "uses_chat_template",
]

Settings = RulerSettings  # every suite module exposes Settings, build_samples and score_sample
# Bump whenever samples or scoring change: run ids include it, so older results are never reused.
# 2: vt chain lines placed as the official generator does; 3: the chat template (use_chat_template); 4: the
# mode setting (answer_nll, agreement) and every sample's answer stored; 5: the gold answer tokenized as the
# prompt's continuation (no lone space token before it with a dummy-prefix tokenizer; smollm2's are unchanged)
REVISION = 5  # the question setting needs none: its default leaves samples and ids as they were
METRICS = answers.MODE_METRICS["both"]  # what a run may report (its mode says which)


# ---- samples ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RulerSample:
    task: str
    prompt: str  # the whole prompt text (without the chat template); it ends with RULER's answer prefix
    prompt_ids: list[int]  # the prompt as the model gets it (special tokens or the chat template included)
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
    use_chat: bool = False,
) -> RulerSample:
    """Sample `index` of `task` for `seed`, as long as `length` allows (deterministic).

    ``depths``: niah only, one fraction in [0, 1] per needle (in the order of ``info["needles"]``)
    instead of seeded ones. ``size``: use this haystack size instead of fitting one (it may not fit).
    ``guess``: a haystack size to start the search from (the previous sample's, to save tokenizations).
    ``use_chat``: the prompt in the tokenizer's chat template (see ``common.prompt_ids``); its tokens count.
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
            counts[n] = len(prompt_ids(tokenizer, family, builder.render(n)[0], use_chat))
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
        task=task,
        prompt=text,
        prompt_ids=prompt_ids(tokenizer, family, text, use_chat),
        answers=list(answers),
        tokens_to_generate=generate,
        context=context,
        size=size,
        info=info,
    )


def build_samples(tokenizer, model, settings: RulerSettings, seed: int) -> list[tuple[str, str, dict]]:
    """(task, sample id, payload) for every sample, deterministic for a seed.

    The task of a row is ``settings.task_name(task, length)``: the RULER task, with ``@<length>`` when
    the settings list several lengths (tasks in order, each at every length, ascending).
    payload: ``prompt_ids``, ``answers``, ``answer_ids`` (the gold answer's tokens, ``answers.gold_ids``),
    ``task`` (the RULER task), ``length``, ``tokens_to_generate`` and the ``tokenizer`` (to decode what the
    model generates)."""
    use_chat = uses_chat_template(tokenizer, settings)
    context = context_length(model)
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
                    tokenizer,
                    task,
                    length,
                    seed,
                    i,
                    squad_path=settings.squad_path,
                    hotpot_path=settings.hotpot_path,
                    guess=guess,
                    use_chat=use_chat,
                )
                guess = sample.size
                split = {}
                if not settings.question.compresses_question:
                    split["question_start"] = question_start(tokenizer, sample, use_chat)
                payload = {
                    "task": task,
                    "length": length,
                    "prompt_ids": sample.prompt_ids,
                    "answers": sample.answers,
                    "answer_ids": answers.gold_ids(
                        tokenizer,
                        sample.prompt_ids,
                        ", ".join(sample.answers),
                        answers.answer_limit(sample.tokens_to_generate, settings.answer_tokens),
                    ),
                    "tokens_to_generate": sample.tokens_to_generate,
                    "tokenizer": tokenizer,
                    **split,
                }
                out.append((settings.task_name(task, length), f"{i:03d}", payload))
    return out


def uses_chat_template(tokenizer, settings: RulerSettings) -> bool:
    """Does a run with these settings put its prompts in the tokenizer's chat template?"""
    return chat.resolve(tokenizer, settings.use_chat_template, "ruler")


def question_start(tokenizer, sample: RulerSample, use_chat: bool) -> int:
    """Where the sample's question starts in its prompt ids: after the haystack (the template's `{context}`)
    and the whitespace after it (`polykv.eval.suites.questions`); the answer prefix goes with the question."""
    if not sample.context:
        raise ValueError(f"ruler task {sample.task}: the sample has no haystack to compress before its question")
    family = RULER_TASKS[sample.task]
    end = questions.after_whitespace(sample.prompt, sample.prompt.rfind(sample.context) + len(sample.context))
    message = split_answer_prefix(family, sample.prompt)[0] if use_chat else sample.prompt
    if end > len(message):
        raise ValueError(f"ruler task {sample.task}: no question after the haystack")
    return questions.question_start(tokenizer, sample.prompt_ids, message, end, use_chat)


def prompt_tokens(payload: dict) -> list[int]:
    """The prompt a sample's id hashes (the runner stores the hash, not the prompt)."""
    return payload["prompt_ids"]


def answer_sample(payload: dict) -> answers.AnswerSample:
    return answers.AnswerSample(
        payload["prompt_ids"],
        payload["answer_ids"],
        payload["tokens_to_generate"],
        question_start=payload.get("question_start"),
    )


def _judge(payload: dict):
    """(metrics, prediction) of generated tokens: RULER's score of the decoded text, and whether it is FullKV's
    answer once both are post-processed as RULER does."""
    tokenizer = payload["tokenizer"]

    def judge(tokens: list[int], reference: list[int]) -> tuple[dict[str, float], str]:
        prediction = tokenizer.decode(tokens, skip_special_tokens=True)
        fullkv = tokenizer.decode(reference, skip_special_tokens=True)
        metrics = _score(payload, prediction)
        metrics["agreement"] = float(ruler_postprocess_pred(prediction) == ruler_postprocess_pred(fullkv))
        return metrics, prediction

    return judge


@no_grad
def score_sample(model, plan: Plan, payload: dict, settings: RulerSettings | None = None) -> answers.Scored:
    """One plan alone (`routed` and `generate`), in the settings' mode: RULER's {"score": 0..100} and FullKV
    "agreement" when generating, "answer_nll" when scoring; with the prediction and the gold answers."""
    mode = (settings or RulerSettings()).mode
    scored = answers.score_alone(model, plan, answer_sample(payload), mode, _judge(payload), _pad(payload["tokenizer"]))
    return answers.with_gold(scored, payload["answers"])


def score_samples(
    model, plans: Sequence[Plan], payload: dict, settings: RulerSettings | None = None
) -> list[answers.Scored]:
    """`score_sample` for several plans on one sample at once (`polykv.runtime.many_plans`: one prompt pass,
    the plans' generations and teacher-forced answers as one batch); plan by plan when the model's
    generation needs `generate`."""
    if greedy_needs_generate(model):
        return [score_sample(model, plan, payload, settings) for plan in plans]
    mode = (settings or RulerSettings()).mode
    scored = answers.score_many(model, plans, answer_sample(payload), mode, _judge(payload))
    return [answers.with_gold(s, payload["answers"]) for s in scored]


def _pad(tokenizer) -> int | None:
    pad = getattr(tokenizer, "pad_token_id", None)
    return pad if pad is not None else getattr(tokenizer, "eos_token_id", None)


def _score(payload: dict, prediction: str) -> dict[str, float]:
    metric = ruler_metric(payload["task"])
    return {"score": float(metric([ruler_postprocess_pred(prediction)], [payload["answers"]]))}

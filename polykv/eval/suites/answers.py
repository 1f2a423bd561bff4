"""The answers of the question suites (RULER, LongBench): generated, scored by their gold likelihood, or both.

A question suite's `mode` setting chooses what a sample costs and reports (the settings' values and checks:
`polykv.eval.suites.answer_settings`):
  generate  greedy generation under the plan (the official protocol), scored by the suite's string metric
            (`score`, 0-100), and `agreement`: 1 when the plan's answer is FullKV's greedy answer on the same
            prompt (after the suite's post-processing), else 0;
  score     no generation: `answer_nll`, the mean negative log-likelihood (nats per token) of the gold
            answer's tokens, teacher-forced after the prompt with the plan's prefill compression applied and
            its decode-phase eviction active while the answer tokens are fed (one decode step per token, as a
            generation of that answer would run); lower is better; dense: it moves before an exact string
            match flips. And `answer_match`, from the same pass: 100 when every gold token is the argmax of
            its position given the gold before it, else 0 (the scale of `score`): then greedy decoding by the
            raw argmax writes the gold answer's tokens first (no logits processors, no `min_new_tokens`, no
            near-tie rounding between the two passes). With the whole gold answer (`answer_tokens` unset) and a
            string-match suite (RULER), such a sample's string match is 100: a lower bound of `score` at no
            generation's cost; LongBench's F1 and ROUGE scores are not string matches;
  both      all three (the teacher-forced and the generating copies of each plan step as one batch).

A question suite's `question` setting chooses what the plan compresses (`polykv.question_protocol.QuestionProtocol`):
  IN_PROMPT         the question is part of the prompt: the plan's prefill compression acts at the end of the
                    whole prompt, question included (SnapKV-like methods see it in their observation window),
                    and the first answer token comes from the prompt's pass (FullKV's);
  AFTER_COMPRESSION the question-agnostic protocol (kvpress's pipeline): the prompt's pass is the context
                    alone, which the plan compresses; then the question (with the chat template's tail and the
                    answer prefix) is fed at its true positions and kept in full whatever the plan
                    (`RoutedCache.keep_until`), and the answer is generated or scored after it. Decode-phase
                    methods update their state over the question and evict from the first answer token on.
                    The suites say where each sample's question starts (`AnswerSample.question_start`).
Nothing is evicted under `full`, so the split changes nothing there: FullKV's answer is the same under both.

The gold answer is one text per sample (`AnswerSample.answer_ids`; the suites define it: RULER's answers in
gold order joined by ", ", LongBench's first answer), preceded by a space unless the prompt ends in
whitespace, and cut to the suite's generation length (or to the `answer_tokens` setting, a cost cut for
long answers such as uuids or several values: the first tokens then carry the retrieval). Its first token
is predicted from the prompt's pass, which eviction never changes (the prompt attends in full), so every
plan shares that term; the plans differ from the second token on.

FullKV's greedy answer (for `agreement`) is computed once per process, model and prompt: alone with
`model.generate` when one plan runs (a plan that evicts nothing is its own reference), else as one more row of
the batch (or the batch's own FullKV plan); `polykv.eval.suites.fullkv_answers` keeps them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from polykv.kv_memory import KVHeld
from polykv.lazy import torch
from polykv.models.support import eos_ids
from polykv.plan import FULL, Phase, Plan

from .answer_settings import (  # the settings stay importable from here, where the suites and the runner take them
    MODE_METRICS,
    MODES,
    answer_limit,
    check_answer_tokens,
    check_mode,
    check_question,
    generates,
    mode_for,
    protocol_dict,
    scores_answer,
)
from .fullkv_answers import cached_reference, clear_reference_cache, remember_reference


@dataclass(frozen=True)
class AnswerSample:
    """One sample as the answer machinery sees it."""

    prompt_ids: list[int]
    answer_ids: list[int]  # the gold answer's tokens, teacher-forced for answer_nll (at least one)
    max_new_tokens: int
    stop: tuple[int, ...] | None = None  # what ends a generation (None: the model's end of sequence)
    min_new_tokens: int = 0
    # AFTER_COMPRESSION: prompt_ids[:question_start] is the context the plan compresses, the rest the question
    # fed after it and kept in full; None: IN_PROMPT (the whole prompt is one pass)
    question_start: int | None = None

    def __post_init__(self):
        if self.question_start is not None and not 0 < self.question_start < len(self.prompt_ids):
            raise ValueError(
                f"the question must start inside the prompt (token 1 .. {len(self.prompt_ids) - 1}), "
                f"got {self.question_start}"
            )


@dataclass(frozen=True)
class Answer:
    """What one plan gave on one question: its greedy tokens (when generating) and the gold answer's NLL
    (when scoring)."""

    tokens: list[int] | None = None
    nll: float | None = None
    match: float | None = None  # 100 when every gold token was the argmax at its position, else 0 (when scoring)
    # the slots each layer held per KV head, read from the plan's cache (`RoutedCache.kv_held`): "entering" the
    # answer and at the "end" (after the last answer token fed: the gold's when scoring, else the generated)
    kv_held: KVHeld | None = None


@dataclass(frozen=True)
class Scored:
    """A scored sample: its metrics and what the runner stores beside them (the answer and the gold)."""

    metrics: dict[str, float]
    prediction: str | None = None
    gold: list[str] | None = None
    kv_held: KVHeld | None = None  # `Answer.kv_held`


def gold_ids(tokenizer, prompt_ids: Sequence[int], text: str, limit: int) -> list[int]:
    """The tokens of a gold answer `text` as the model would continue the prompt: a space in front unless the
    prompt ends in whitespace (a chat template's assistant header, RULER's vt prefix), at most `limit` tokens.

    The answer is tokenized after the prompt's last tokens and the tokens they give alone are cut off, so a
    tokenizer that marks a word's leading space inside its first token (SentencePiece's dummy prefix, as in
    llama2.c and Llama 2 / Mistral tokenizers) gives that token, not a lone space before it. When the joint
    tokenization changes the prompt's own tokens, the answer is tokenized alone."""
    tail_ids = list(prompt_ids[-_TAIL:])
    tail = tokenizer.decode(tail_ids)
    spaced = text if not tail or tail[-1].isspace() else " " + text
    alone = list(tokenizer(tail, add_special_tokens=False).input_ids)
    joint = list(tokenizer(tail + spaced, add_special_tokens=False).input_ids)
    if alone and joint[: len(alone)] == alone and len(joint) > len(alone):
        ids = joint[len(alone) :]
    else:
        ids = list(tokenizer(spaced, add_special_tokens=False).input_ids)
    ids = ids[:limit]
    if not ids:
        raise ValueError(f"empty gold answer {text!r}: answer_nll needs at least one answer token")
    return ids


_TAIL = 8  # prompt tokens the answer is tokenized after (enough for any merge across the boundary to show)


def keeps_everything(plan: Plan) -> bool:
    return all(layer[phase].method == FULL for layer in plan.layers for phase in Phase)


def _nll(logits, target: int) -> float:
    """-log p(target) under one row of next-token logits, in float64."""
    return float(-torch.log_softmax(logits.double(), dim=-1)[target])


# ---- one plan alone (the reference path: `routed` and `generate`) ---------------------------------------------
def answer_alone(model, plan: Plan, sample: AnswerSample, mode: str, pad_token_id: int | None = None) -> Answer:
    """One plan's answer as `routed(model, plan)` gives it: `model.generate` for the tokens and a prefill then
    one decode step per answer token for the NLL, each from an empty cache (AFTER_COMPRESSION: the context's
    pass, then the question kept in full, before either)."""
    from polykv.runtime import routed  # torch and transformers: when a plan runs

    with torch.no_grad(), routed(model, plan):
        tokens, cache = _generate(model, sample, pad_token_id, split=True) if generates(mode) else (None, None)
        nll, match = None, None
        if scores_answer(mode):
            nll, match, cache = teacher_forced(model, sample, with_cache=True)
    return Answer(tokens, nll, match, _held(cache))


def _held(cache) -> KVHeld | None:
    """What a routed cache held (`RoutedCache.kv_held`); None from any other cache."""
    from polykv.runtime.cache import RoutedCache

    return cache.kv_held() if isinstance(cache, RoutedCache) else None


def _context_pass(model, sample: AnswerSample):
    """(logits [1, vocab], cache) after the pass of the prompt up to the question's start (the whole prompt
    when the question is in it), with the model as it is set up; a routed cache is told to keep the question
    in full (`RoutedCache.keep_until`)."""
    from polykv.models import output_cache
    from polykv.runtime.cache import RoutedCache

    ids = sample.prompt_ids
    out = model(torch.tensor([ids[: sample.question_start]], device=model.device), use_cache=True, logits_to_keep=1)
    cache = output_cache(out)
    if sample.question_start is not None and isinstance(cache, RoutedCache):  # a plain cache keeps it anyway
        cache.keep_until(len(ids))
    return out.logits[:, -1], cache


def _prompt_pass(model, sample: AnswerSample):
    """(the prompt's last logits [vocab], its cache): `_context_pass`, then the question's block if it is apart."""
    from polykv.models import cache_argument_name

    logits, cache = _context_pass(model, sample)
    if sample.question_start is not None:
        rest = torch.tensor([sample.prompt_ids[sample.question_start :]], device=model.device)
        logits = model(rest, use_cache=True, logits_to_keep=1, **{cache_argument_name(model): cache}).logits[:, -1]
    return logits[0], cache


def teacher_forced(model, sample: AnswerSample, with_cache: bool = False) -> tuple:
    """The gold answer's mean NLL and its greedy match (100 when every gold token is its position's argmax, else 0) with
    the model as it is set up (under `routed`, the plan's cache): the prompt's pass (`_prompt_pass`), then the
    answer token by token through the cache. `with_cache`: the cache as a third value."""
    from polykv.models import cache_argument_name

    logits, cache = _prompt_pass(model, sample)
    answer = sample.answer_ids
    total, match = _nll(logits, answer[0]), int(logits.argmax()) == answer[0]
    for fed, target in zip(answer[:-1], answer[1:]):
        step = torch.tensor([[fed]], device=model.device)
        out = model(step, use_cache=True, **{cache_argument_name(model): cache})
        total += _nll(out.logits[0, -1], target)
        match = match and int(out.logits[0, -1].argmax()) == target
    return (total / len(answer), 100.0 * match) + ((cache,) if with_cache else ())


def _generate(model, sample: AnswerSample, pad_token_id: int | None, split: bool = False) -> tuple[list[int], object]:
    """(greedy tokens after the prompt, the cache they were generated with). `split`: a question after
    compression gets the context's pass first (`_context_pass`; a plain cache when no plan is routed);
    `generate` then feeds the question and the answer through that cache."""
    from polykv.models import cache_argument_name

    ids = torch.tensor([sample.prompt_ids], device=model.device)
    kwargs = {"max_new_tokens": sample.max_new_tokens, "do_sample": False, "num_beams": 1}
    if split and sample.question_start is not None:
        kwargs[cache_argument_name(model)] = _context_pass(model, sample)[1]
    if sample.stop:
        kwargs["eos_token_id"] = list(sample.stop)
    if sample.min_new_tokens:
        kwargs["min_new_tokens"] = sample.min_new_tokens
    if pad_token_id is not None and model.generation_config.pad_token_id is None:
        kwargs["pad_token_id"] = pad_token_id
    out = model.generate(ids, attention_mask=torch.ones_like(ids), return_dict_in_generate=True, **kwargs)
    return out.sequences[0, ids.shape[1] :].tolist(), out.past_key_values


# ---- many plans on one prompt (`polykv.runtime.many_plans`) ------------------------------------------------------
def answer_many(
    model, plans: Sequence[Plan], sample: AnswerSample, mode: str, with_fullkv: bool = False, kept=None
) -> list[Answer]:
    """Every plan's answer from one prompt pass: the plans' teacher-forced rows and (when generating) their
    greedy rows step as one batch. `with_fullkv`: add a FullKV row when generating (its answer comes last).
    `kept`: the prompt's pass replayed from there, or run and kept there (`polykv.runtime.many_plans.PromptPasses`)."""
    from polykv.runtime import many_plans  # torch and transformers: when a plan runs

    plans = list(plans) + ([Plan.homogeneous(FULL, None, plans[0].num_layers)] if with_fullkv else [])
    count = len(plans)
    forced = count if scores_answer(mode) else 0
    answer = sample.answer_ids
    nll = [[0.0] * len(answer) for _ in range(forced)]
    matched = [True] * forced  # every gold token so far was the row's argmax

    def take(step: int, logits) -> None:  # logits after feeding answer[step] predict answer[step + 1]
        logp = torch.log_softmax(logits.double(), dim=-1)[:, answer[step + 1]]
        for row, value in enumerate(logp.tolist()):
            nll[row][step + 1] = -value
        for row, best in enumerate(logits.argmax(dim=-1).tolist()):
            matched[row] = matched[row] and best == answer[step + 1]

    rows = (list(plans) if forced else []) + (list(plans) if generates(mode) else [])
    cut = sample.question_start
    with torch.inference_mode(), many_plans.many(model, rows) as session:
        stepping, first = session.prefill(sample.prompt_ids[:cut], kept)
        caches = list(stepping.caches)  # rows leave the batch when done; their caches keep what they held
        if cut is not None:  # the question after the compressed context, kept in full: each row's own logits
            first = stepping.feed(sample.prompt_ids[cut:], keep=True)
        max_new = sample.max_new_tokens if generates(mode) else 0
        stepping.reserve(max(len(answer) - 1, max_new))
        if first.dim() == 1:  # the prompt's pass: FullKV's, the same for every row
            first_nll = [_nll(first, answer[0])] * forced
            first_best = [int(first.argmax())] * forced
        else:
            first_nll = (-torch.log_softmax(first[:forced].double(), dim=-1)[:, answer[0]]).tolist()
            first_best = first[:forced].argmax(dim=-1).tolist()
        for row, value in zip(nll, first_nll):
            row[0] = value
        matched[:] = [best == answer[0] for best in first_best]
        tokens = many_plans.force_and_generate(
            stepping,
            first,
            forced=forced,
            feed=answer[:-1],
            on_forced=take,
            max_new_tokens=max_new,
            stop=set(sample.stop) if sample.stop else eos_ids(model),
            min_new_tokens=sample.min_new_tokens,
        )
    return [
        Answer(
            tokens[i] if generates(mode) else None,
            math.fsum(nll[i]) / len(answer) if forced else None,
            100.0 * matched[i] if forced else None,
            caches[i].kv_held(),  # the teacher-forced row when scoring, else the generating one
        )
        for i in range(count)
    ]


def fullkv_answer(model, sample: AnswerSample, pad_token_id: int | None = None) -> list[int]:
    """FullKV's greedy answer to `sample` (cached; computed alone with `model.generate` when missing)."""
    cached = cached_reference(model, sample)
    if cached is not None:
        return cached
    with torch.no_grad():  # the vanilla model, with the question fed after the context when it comes apart
        return remember_reference(model, sample, _generate(model, sample, pad_token_id, split=True)[0])


# ---- a suite's samples scored in any mode -------------------------------------------------------------------
def score_alone(model, plan: Plan, sample: AnswerSample, mode: str, judge, pad_token_id: int | None = None) -> Scored:
    """One plan on one sample, the reference path. `judge(prediction tokens, FullKV's tokens)` turns the
    generated tokens into the suite's metrics and its prediction text ((metrics, prediction))."""
    answer = answer_alone(model, plan, sample, mode, pad_token_id)
    reference = None
    if generates(mode):
        if keeps_everything(plan) and cached_reference(model, sample) is None:
            # a plan that evicts nothing generates FullKV's answer (tested bit for bit): not generated twice
            reference = remember_reference(model, sample, answer.tokens)
        else:
            reference = fullkv_answer(model, sample, pad_token_id)
    return _scored(answer, reference, judge)


def score_many(model, plans: Sequence[Plan], sample: AnswerSample, mode: str, judge) -> list[Scored]:
    """Several plans on one question from one prompt pass (`answer_many`); FullKV's answer for `agreement` is
    the cached one, else the batch's own FullKV plan, else one more row."""
    reference = cached_reference(model, sample) if generates(mode) else None
    full_row = next((i for i, plan in enumerate(plans) if keeps_everything(plan)), None)
    extra = generates(mode) and reference is None and full_row is None
    answers = answer_many(model, plans, sample, mode, with_fullkv=extra)
    if generates(mode) and reference is None:
        reference = remember_reference(model, sample, answers[-1 if extra else full_row].tokens)
    return [_scored(answer, reference, judge) for answer in answers[: len(plans)]]


def with_gold(scored: Scored, gold: Sequence[str]) -> Scored:
    """`scored` with the suite's gold answers beside it (what the runner stores)."""
    return replace(scored, gold=list(gold))


def _scored(answer: Answer, reference: list[int] | None, judge) -> Scored:
    metrics: dict[str, float] = {}
    prediction = None
    if answer.tokens is not None:
        metrics, prediction = judge(answer.tokens, reference)
    if answer.nll is not None:
        metrics = {**metrics, "answer_nll": answer.nll, "answer_match": answer.match}
    return Scored(metrics, prediction, kv_held=answer.kv_held)


__all__ = [
    "MODES",
    "MODE_METRICS",
    "Answer",
    "AnswerSample",
    "Scored",
    "answer_alone",
    "answer_many",
    "answer_limit",
    "check_answer_tokens",
    "check_mode",
    "check_question",
    "clear_reference_cache",
    "fullkv_answer",
    "generates",
    "gold_ids",
    "keeps_everything",
    "mode_for",
    "protocol_dict",
    "score_alone",
    "score_many",
    "scores_answer",
    "teacher_forced",
    "with_gold",
]

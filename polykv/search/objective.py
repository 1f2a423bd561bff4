"""The search objective: how far the whole compressed model drifts from FullKV on calibration text.

For a plan pi and a token sequence x of n tokens, the prompt is x[:n - M - 1] and the continuation the
next M tokens (M = `continuation`). The plan really executes (`polykv.runtime.routed`): the prompt is
prefilled, then the continuation is fed token by token (teacher forcing; decode-phase methods act at
every step), exactly as the fidelity suite's `teacher_forced_logits` does. At each continuation step t we get
the plan's next-token distribution p_pi,t and FullKV's p_t, and per sequence

    kl    = mean_t KL(p_t || p_pi,t)                       (the objective, lower is better)
    top1  = mean_t [argmax p_pi,t == argmax p_t]
    nll   = mean_t -log p_pi,t(x_{t+1})                    (perplexity = exp(nll))
    dppl  = exp(nll) - exp(nll of FullKV)                  (the optional objective)

`Objective.value(plan, indices)` is the mean of the chosen statistic over the sequences `indices`;
`Objective.values(plans, indices)` the same for several plans at once (a successive-halving rung).
FullKV's log-probabilities are computed once per sequence and kept; a (plan, sequence) score is
computed once and kept too, so successive halving never pays twice for the same execution.
`executions` counts the plan executions actually run (FullKV references not included): the currency
of the search's evaluation budget.

Where the executions run: by default here, one after another. An objective with an `executor`
(`Executor`: a callable that scores a batch of (plan, token ids) pairs, e.g. `polykv.search.parallel.
RayExecutor`) sends every batch's uncached pairs to it at once; the scores, the caches, `executions` and
the budget are exactly those of the sequential path (a batch that would cross `limit` is cut at the
limit, in the order the sequential loop would have run it, then BudgetExhausted). `reference_scores` and
`score_tokens` are the computation both paths share. `executing(executor)` makes objectives built
inside it (e.g. by `polykv.search.text.run.build_report`) use that executor.

`build_sequences` draws the search (calibration split) and held-out (evaluation split) sequences from
the model's default calibration sources and refuses any overlap in token content (`check_disjoint`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from polykv.plan import Plan

METRICS = ("kl", "dppl")  # what the search may minimise
CONTINUATION = 32  # teacher-forced steps per sequence: the fidelity suite's default


@dataclass(frozen=True)
class SequenceScore:
    """One plan on one sequence (see the module docstring)."""

    kl: float
    top1: float
    nll: float
    reference_nll: float

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)

    @property
    def dppl(self) -> float:
        return math.exp(self.nll) - math.exp(self.reference_nll)

    def value(self, metric: str) -> float:
        return self.kl if metric == "kl" else self.dppl

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "ppl": self.ppl, "dppl": self.dppl}


@dataclass(frozen=True)
class SearchSequences:
    """Search (calibration) and held-out (evaluation) sequences, disjoint by token content."""

    search: list[list[int]]
    held_out: list[list[int]]
    search_corpus: dict[str, Any]  # `Corpus.to_dict()`: spec, records, fingerprint
    held_out_corpus: dict[str, Any]
    continuation: int = CONTINUATION

    def to_dict(self) -> dict[str, Any]:
        return {
            "continuation": self.continuation,
            "search": self.search_corpus,
            "held_out": self.held_out_corpus,
        }


def check_disjoint(search: Sequence[Sequence[int]], held_out: Sequence[Sequence[int]], continuation: int) -> None:
    """ValueError unless no held-out sequence equals a search sequence, and no held-out sequence's scored
    tail (its last continuation + 1 tokens, what the verdict is measured on) equals a search one's."""
    whole = {tuple(s) for s in search}
    tails = {tuple(s[-continuation - 1 :]) for s in search}
    for i, seq in enumerate(held_out):
        if tuple(seq) in whole or tuple(seq[-continuation - 1 :]) in tails:
            raise ValueError(f"held-out sequence {i} also appears among the search sequences")


def build_sequences(
    tokenizer,
    model,
    model_name: str | None,
    search: int = 16,
    held_out: int = 48,
    max_tokens: int = 512,
    seed: int = 0,
    continuation: int = CONTINUATION,
    sources: Sequence[str] | None = None,
) -> SearchSequences:
    """`search` calibration-split and `held_out` evaluation-split sequences of min(max_tokens, context)
    tokens from `sources` (default: the model's calibration sources, `default_sources`), with the same
    corpus seed: text sources draw from disjoint byte ranges, model sources from seeds that name the
    split. Disjointness is then checked on the token ids themselves."""
    from polykv.profile.corpus import CorpusSpec, build_corpus, default_sources

    chosen = tuple(sources) if sources else default_sources(model_name)

    def draw(count: int, split: str):
        spec = CorpusSpec(sources=chosen, num_sequences=count, max_tokens=max_tokens, seed=seed, split=split)
        return build_corpus(tokenizer, spec, model=model)

    found, verdict = draw(search, "calibration"), draw(held_out, "evaluation")
    if found.sequence_length < continuation + 9:
        raise ValueError(
            f"sequences of {found.sequence_length} tokens are too short for a {continuation}-token continuation"
        )
    check_disjoint(found.sequences, verdict.sequences, continuation)
    return SearchSequences(found.sequences, verdict.sequences, found.to_dict(), verdict.to_dict(), continuation)


def plan_key(plan: Plan) -> str:
    """What a plan executes (scope, allocation, every cell, and a head rule where it has one), not what it is
    called."""
    data = plan.to_dict()
    heads = [data["head_allocation"], data.get("head_allocation_params", {})] if "head_allocation" in data else []
    return json.dumps([data["scope"], data["allocation"], data["layers"], *heads], sort_keys=True)


class BudgetExhausted(Exception):
    """The next execution would exceed the evaluation budget."""


Reference = tuple[torch.Tensor, torch.Tensor, float]  # FullKV's logits [M, vocab] (CPU), their argmax, its NLL
# Scores a batch of (plan, token ids) pairs with `continuation` teacher-forced steps, in order.
Executor = Callable[[Sequence[tuple[Plan, Sequence[int]]], int], list[SequenceScore]]

_DEFAULT_EXECUTOR: contextvars.ContextVar[Executor | None] = contextvars.ContextVar("executor", default=None)


@contextlib.contextmanager
def executing(executor: Executor | None) -> Iterator[None]:
    """Objectives built inside (without an explicit `executor`) send their executions to `executor`."""
    token = _DEFAULT_EXECUTOR.set(executor)
    try:
        yield
    finally:
        _DEFAULT_EXECUTOR.reset(token)


def _token_tensor(model, token_ids: Sequence[int], continuation: int) -> tuple[torch.Tensor, int]:
    device = next(model.parameters()).device
    tokens = torch.tensor([list(map(int, token_ids))], device=device)
    return tokens, tokens.shape[1] - continuation - 1


@torch.no_grad()
def reference_scores(model, token_ids: Sequence[int], continuation: int) -> Reference:
    """FullKV on one sequence: its continuation logits (the model's own dtype, on the CPU), their argmax
    (of the fp64 log-probabilities) and its continuation NLL."""
    from polykv.eval.suites.fidelity import teacher_forced_logits

    tokens, prompt = _token_tensor(model, token_ids, continuation)
    logits = teacher_forced_logits(model, tokens, prompt).cpu()
    logp = torch.log_softmax(logits.double(), -1)
    nll = -logp.gather(-1, tokens[0, prompt + 1 :, None].cpu()).mean().item()
    return logits, logp.argmax(-1), nll


@torch.no_grad()
def score_tokens(model, plan: Plan, token_ids: Sequence[int], continuation: int, reference: Reference) -> SequenceScore:
    """The plan executed on one sequence (`polykv.runtime.routed`), against FullKV's `reference`."""
    from polykv.eval.suites.fidelity import teacher_forced_logits
    from polykv.runtime import routed

    ref_logits, ref_top, ref_nll = reference
    ref_logp = torch.log_softmax(ref_logits.double(), -1)
    tokens, prompt = _token_tensor(model, token_ids, continuation)
    with routed(model, plan):
        logits = teacher_forced_logits(model, tokens, prompt)
    logp = torch.log_softmax(logits.double(), -1).cpu()
    tokens = tokens.cpu()
    return SequenceScore(
        kl=(ref_logp.exp() * (ref_logp - logp)).sum(-1).clamp_min(0).mean().item(),
        top1=(logp.argmax(-1) == ref_top).double().mean().item(),
        nll=-logp.gather(-1, tokens[0, prompt + 1 :, None]).mean().item(),
        reference_nll=ref_nll,
    )


class Objective:
    """A plan's divergence from FullKV on a fixed list of token sequences (see the module docstring)."""

    def __init__(
        self,
        model,
        sequences: Sequence[Sequence[int]],
        continuation: int = CONTINUATION,
        metric="kl",
        executor: Executor | None = None,
    ):
        if metric not in METRICS:
            raise ValueError(f"objective metric must be one of {', '.join(METRICS)} (got {metric!r})")
        if not sequences:
            raise ValueError("the objective needs at least one sequence")
        short = [i for i, s in enumerate(sequences) if len(s) < continuation + 9]
        if short:
            raise ValueError(f"sequence {short[0]} is too short for a {continuation}-token continuation")
        self.model = model
        self.sequences = [list(map(int, s)) for s in sequences]
        self.continuation = continuation
        self.metric = metric
        self.executions = 0
        self.limit: int | None = None  # executions allowed in all (None: no limit); set by the search
        self.executor: Executor | None = executor if executor is not None else _DEFAULT_EXECUTOR.get()
        self._reference: dict[int, Reference] = {}  # logits, argmax, nll
        self._scores: dict[tuple[str, int], SequenceScore] = {}

    def __len__(self) -> int:
        return len(self.sequences)

    # ---- FullKV, once per sequence -----------------------------------------------------------------
    def reference(self, i: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        """FullKV's log-probabilities [M, vocab] (fp64), their argmax and its continuation NLL.

        Kept per sequence as the model's own logits on the CPU (M x vocab in its dtype; widened to fp64
        when used, exactly as if never stored), so a large vocabulary costs what the fidelity suite's
        reference cache costs."""
        if i not in self._reference:
            self._reference[i] = reference_scores(self.model, self.sequences[i], self.continuation)
        logits, top, nll = self._reference[i]
        return torch.log_softmax(logits.double(), -1), top, nll

    # ---- plans ---------------------------------------------------------------------------------------
    def is_cached(self, plan: Plan, i: int) -> bool:
        return (plan_key(plan), i) in self._scores

    def score(self, plan: Plan, i: int) -> SequenceScore:
        """The plan on sequence i, executed once (raises BudgetExhausted past `limit`)."""
        key = (plan_key(plan), i)
        cached = self._scores.get(key)
        if cached is not None:
            return cached
        if self.executor is not None:
            self._execute([(plan, i)])
            return self._scores[key]
        if self.limit is not None and self.executions >= self.limit:
            raise BudgetExhausted
        if i not in self._reference:
            self._reference[i] = reference_scores(self.model, self.sequences[i], self.continuation)
        result = score_tokens(self.model, plan, self.sequences[i], self.continuation, self._reference[i])
        self.executions += 1
        self._scores[key] = result
        return result

    def _execute(self, pairs: Iterable[tuple[Plan, int]]) -> None:
        """Run the uncached pairs among `pairs` through the executor as one batch, in the sequential order
        (each distinct pair once). Past `limit`, only the pairs the sequential loop would have run before
        BudgetExhausted run (their scores kept), then BudgetExhausted."""
        batch, exhausted = self._pending(pairs)
        if batch:
            assert self.executor is not None
            results = self.executor([(plan, self.sequences[i]) for _, (plan, i) in batch], self.continuation)
            if len(results) != len(batch):
                raise RuntimeError(f"the executor returned {len(results)} scores for {len(batch)} executions")
            for (key, _), result in zip(batch, results):
                self._scores[key] = result
            self.executions += len(batch)
        if exhausted:
            raise BudgetExhausted

    def _pending(self, pairs: Iterable[tuple[Plan, int]]) -> tuple[list, bool]:
        """([((plan key, i), (plan, i)) of the distinct uncached pairs, in order, cut at `limit`], whether the
        cut left some out)."""
        todo: dict[tuple[str, int], tuple[Plan, int]] = {}
        for plan, i in pairs:
            key = (plan_key(plan), i)
            if key not in self._scores and key not in todo:
                todo[key] = (plan, i)
        batch = list(todo.items())
        if self.limit is not None and self.executions + len(batch) > self.limit:
            return batch[: max(0, self.limit - self.executions)], True
        return batch, False

    def scores(self, plan: Plan, indices: Iterable[int]) -> list[SequenceScore]:
        if self.executor is None:
            return [self.score(plan, i) for i in indices]
        chosen = list(indices)
        self._execute((plan, i) for i in chosen)
        return [self._scores[(plan_key(plan), i)] for i in chosen]

    def value(self, plan: Plan, indices: Iterable[int] | None = None) -> float:
        """Mean of the objective metric over `indices` (default: every sequence)."""
        chosen = range(len(self.sequences)) if indices is None else list(indices)
        values = [s.value(self.metric) for s in self.scores(plan, chosen)]
        return sum(values) / len(values)

    def values(self, plans: Sequence[Plan], indices: Iterable[int] | None = None) -> list[float]:
        """`value(plan, indices)` for each plan, in order. Without an executor exactly that loop; with one,
        every uncached (plan, sequence) pair in one batch (see `_execute`), then the same means."""
        chosen = list(range(len(self.sequences)) if indices is None else indices)
        if self.executor is not None:
            self._execute((plan, i) for plan in plans for i in chosen)
        return [self.value(plan, chosen) for plan in plans]

    def cost(self, plan: Plan, indices: Iterable[int]) -> int:
        """Executions `scores(plan, indices)` would run (its uncached sequences)."""
        key = plan_key(plan)
        return sum((key, i) not in self._scores for i in indices)


__all__ = [
    "CONTINUATION",
    "METRICS",
    "BudgetExhausted",
    "Executor",
    "Objective",
    "SearchSequences",
    "SequenceScore",
    "build_sequences",
    "check_disjoint",
    "executing",
    "plan_key",
    "reference_scores",
    "score_tokens",
]

"""The search objective: how far the whole compressed model drifts from FullKV on calibration text.

For a plan pi and a token sequence x of n tokens, the prompt is x[:n - M - 1] and the continuation the
next M tokens (M = `continuation`). The plan really executes (`polykv.runtime.routed`): the prompt is
prefilled, then the continuation is fed token by token (teacher forcing; decode-phase methods act at
every step), exactly as the fidelity suite's `_teacher_forced` does. At each continuation step t we get
the plan's next-token distribution p_pi,t and FullKV's p_t, and per sequence

    kl    = mean_t KL(p_t || p_pi,t)                       (the objective, lower is better)
    top1  = mean_t [argmax p_pi,t == argmax p_t]
    nll   = mean_t -log p_pi,t(x_{t+1})                    (perplexity = exp(nll))
    dppl  = exp(nll) - exp(nll of FullKV)                  (the optional objective)

`Objective.value(plan, indices)` is the mean of the chosen statistic over the sequences `indices`.
FullKV's log-probabilities are computed once per sequence and kept; a (plan, sequence) score is
computed once and kept too, so successive halving never pays twice for the same execution.
`executions` counts the plan executions actually run (FullKV references not included): the currency
of the search's evaluation budget.

`build_sequences` draws the search (calibration split) and held-out (evaluation split) sequences from
the model's default calibration sources and refuses any overlap in token content (`check_disjoint`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
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
    """What a plan executes (scope, allocation, every cell), not what it is called."""
    data = plan.to_dict()
    return json.dumps([data["scope"], data["allocation"], data["layers"]], sort_keys=True)


class BudgetExhausted(Exception):
    """The next execution would exceed the evaluation budget."""


class Objective:
    """A plan's divergence from FullKV on a fixed list of token sequences (see the module docstring)."""

    def __init__(self, model, sequences: Sequence[Sequence[int]], continuation: int = CONTINUATION, metric="kl"):
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
        self._reference: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}  # logits, argmax, nll
        self._scores: dict[tuple[str, int], SequenceScore] = {}

    def __len__(self) -> int:
        return len(self.sequences)

    # ---- FullKV, once per sequence -----------------------------------------------------------------
    def _tokens(self, i: int) -> tuple[torch.Tensor, int]:
        device = next(self.model.parameters()).device
        tokens = torch.tensor([self.sequences[i]], device=device)
        return tokens, tokens.shape[1] - self.continuation - 1

    @torch.no_grad()
    def reference(self, i: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        """FullKV's log-probabilities [M, vocab] (fp64), their argmax and its continuation NLL.

        Kept per sequence as the model's own logits on the CPU (M x vocab in its dtype; widened to fp64
        when used, exactly as if never stored), so a large vocabulary costs what the fidelity suite's
        reference cache costs."""
        if i not in self._reference:
            from polykv.eval.suites.fidelity import _teacher_forced

            tokens, prompt = self._tokens(i)
            logits = _teacher_forced(self.model, tokens, prompt).cpu()
            logp = torch.log_softmax(logits.double(), -1)
            nll = -logp.gather(-1, tokens[0, prompt + 1 :, None].cpu()).mean().item()
            self._reference[i] = (logits, logp.argmax(-1), nll)
        logits, top, nll = self._reference[i]
        return torch.log_softmax(logits.double(), -1), top, nll

    # ---- plans ---------------------------------------------------------------------------------------
    def is_cached(self, plan: Plan, i: int) -> bool:
        return (plan_key(plan), i) in self._scores

    @torch.no_grad()
    def score(self, plan: Plan, i: int) -> SequenceScore:
        """The plan on sequence i, executed once (raises BudgetExhausted past `limit`)."""
        key = (plan_key(plan), i)
        cached = self._scores.get(key)
        if cached is not None:
            return cached
        if self.limit is not None and self.executions >= self.limit:
            raise BudgetExhausted
        from polykv.eval.suites.fidelity import _teacher_forced
        from polykv.runtime import routed

        ref_logp, ref_top, ref_nll = self.reference(i)
        tokens, prompt = self._tokens(i)
        with routed(self.model, plan):
            logits = _teacher_forced(self.model, tokens, prompt)
        self.executions += 1
        logp = torch.log_softmax(logits.double(), -1).cpu()
        tokens = tokens.cpu()
        result = SequenceScore(
            kl=(ref_logp.exp() * (ref_logp - logp)).sum(-1).clamp_min(0).mean().item(),
            top1=(logp.argmax(-1) == ref_top).double().mean().item(),
            nll=-logp.gather(-1, tokens[0, prompt + 1 :, None]).mean().item(),
            reference_nll=ref_nll,
        )
        self._scores[key] = result
        return result

    def scores(self, plan: Plan, indices: Iterable[int]) -> list[SequenceScore]:
        return [self.score(plan, i) for i in indices]

    def value(self, plan: Plan, indices: Iterable[int] | None = None) -> float:
        """Mean of the objective metric over `indices` (default: every sequence)."""
        chosen = range(len(self.sequences)) if indices is None else list(indices)
        values = [s.value(self.metric) for s in self.scores(plan, chosen)]
        return sum(values) / len(values)

    def cost(self, plan: Plan, indices: Iterable[int]) -> int:
        """Executions `scores(plan, indices)` would run (its uncached sequences)."""
        key = plan_key(plan)
        return sum((key, i) not in self._scores for i in indices)


__all__ = [
    "CONTINUATION",
    "METRICS",
    "BudgetExhausted",
    "Objective",
    "SearchSequences",
    "SequenceScore",
    "build_sequences",
    "check_disjoint",
    "plan_key",
]

"""ExpectedAttention: keep the tokens future queries are expected to attend to, from the prompt's query statistics.

Devoto, Jeblick, Jégou. "Expected Attention: KV Cache Compression by Estimating Attention from Future Queries
Distribution." arXiv:2510.00636 (NVIDIA kvpress's own method, `ExpectedAttentionPress`).
"""

from __future__ import annotations

import math

from pydantic import Field

from polykv.lazy import torch
from polykv.methods.base import NOTHING, LayerView, Method, Needs
from polykv.methods.eviction import Eviction, keep_top
from polykv.methods.params import MethodParams, Real, real, tokens
from polykv.plan import MAX_TOKENS, Phase

QUERIES = Needs(queries=True)


class ExpectedAttentionParams(MethodParams):
    # positions after the prompt, not tokens held: not bounded by the model's context (RoPE extends past it)
    n_future_positions: int = Field(
        default=512,
        ge=1,
        le=MAX_TOKENS,
        description=f"positions after the prompt the expected rotation averages over; an integer, 1 .. {MAX_TOKENS}",
    )
    n_sink: int = tokens(4, ge=0, description="first tokens always kept and left out of the statistics")
    use_covariance: bool = Field(default=True, description="add the queries' covariance term (true or false)")
    use_vnorm: bool = Field(default=True, description="scale the expected attention by the value's norm")
    epsilon: Real = real(0.0, ge=0.0, le=1.0, description="added to the expected attention before the value norm")


class ExpectedAttention(Method):
    """Compress the prompt once: keep the tokens the next queries are expected to attend to, per KV head.

    Rule (kvpress's `ExpectedAttentionPress`), at a prompt of n > capacity tokens, per query head: take the
    prompt's queries before RoPE, less the first `n_sink`, and their mean mu and covariance S (divided by their
    count); rotate both by R, the RoPE rotation matrix averaged over the `n_future_positions` positions after the
    prompt (mu <- R mu, S <- R S R^T). Each key k after the sinks (as cached, after RoPE; d its size) scores
    exp(mu.k / sqrt(d) + k^T S k / (2d)), the expected exp(q.k / sqrt(d)) for Gaussian queries, softmax-normalised
    over those keys; a KV head takes the mean of its query heads; then (score + epsilon) * ||v||. The sinks score
    above every other token, and the `capacity` highest stay, per KV head.

    PolyKV's queries before RoPE are the model's rotated queries turned back (`polykv.runtime.rotary`), where
    kvpress projects the hidden states again: the same numbers up to rounding (in fp32 about 1e-6 relative; in
    bf16 the model's own rounding of the rotated queries makes it about 1e-2), so near-ties may go the other way.
    Each layer is rotated by its own rotary embedding (on Gemma 3 a local layer by the local one; kvpress 0.5.5
    under transformers 5.x calls Gemma 3's embedding without a layer type and fails); the future positions follow
    the prompt's last position (kvpress: the forward's length, the same for a whole prompt). On a prompt whose
    sinks are not its first slots (a local layer that dropped them) the sinks are found by position and masked out
    of the softmax instead of cut off. The cut is by top-k even when one slot goes, as kvpress's.

    Prefill only: the statistics describe the prompt's queries and the positions after it; kvpress applies the
    press again during decoding only every few steps (`DecodingPress`), never one token a step.
    """

    name = "expected_attention"
    phases = frozenset({Phase.PREFILL})
    colour = "#FF9896"
    Params = ExpectedAttentionParams
    params: ExpectedAttentionParams  # this instance's, parsed
    below_capacity = ("n_sink",)
    phase_refusal = "its statistics are the prompt's queries, taken once; it has no rule for one token a step"
    standalone_source = "ExpectedAttention (Devoto et al., 2025, kvpress): compresses the prompt once"

    def needs(self, phase: Phase, length: int) -> Needs:
        return QUERIES if self.capacity is None or length > self.capacity else NOTHING

    def step(self, view: LayerView) -> Eviction | None:
        if not self.over_capacity(view):
            return None
        if view.queries is None or view.rotary is None:
            raise RuntimeError("expected_attention evicts from the step's queries before RoPE, which it was not given")
        return Eviction(keep=keep_top(self.scores(view), self.capacity, hidden=view.hidden))  # top-k: as kvpress

    def scores(self, view: LayerView) -> torch.Tensor:
        """[b, h, n] expected attention per slot; the sinks above every other slot."""
        p = self.params
        mean, covariance = self.query_statistics(view)
        keys, values = view.keys, view.values
        by_slot = view.fresh and keys.shape[2] > p.n_sink  # slot i holds position i: cut the sinks off, as kvpress
        if by_slot:
            keys, values = keys[:, :, p.n_sink :], values[:, :, p.n_sink :]
        b, h, n, d = keys.shape
        g = mean.shape[1] // h
        keys_t = keys.repeat_interleave(g, dim=1).transpose(2, 3)  # [b, h*g, d, n]
        logits = torch.matmul(mean.unsqueeze(2), keys_t).squeeze(2) / math.sqrt(d)
        if covariance is not None:
            logits = logits + torch.einsum("bhin,bhij,bhjn->bhn", keys_t, covariance, keys_t) / d / 2
        sinks = None
        if not by_slot:
            sinks = (view.positions < p.n_sink).repeat_interleave(g, dim=1)
            logits = logits.masked_fill(sinks, float("-inf"))
        scores = torch.softmax(logits, dim=-1).view(b, h, g, n).mean(dim=2)
        if p.use_vnorm:
            scores = (scores + p.epsilon) * values.norm(dim=-1)
        if by_slot:
            return torch.nn.functional.pad(scores, (p.n_sink, 0), value=scores.max().item() + 1)
        return scores.masked_fill(sinks[:, ::g], scores.max().item() + 1)

    def query_statistics(self, view: LayerView) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The mean [b, h*g, d] and covariance [b, h*g, d, d] of the step's queries before RoPE (the first
        `n_sink` left out), rotated by RoPE averaged over the next `n_future_positions` positions."""
        p = self.params
        queries = view.queries[:, :, p.n_sink :]
        mean = queries.mean(dim=2, keepdim=True)
        covariance = None
        if p.use_covariance:
            centred = queries - mean
            covariance = torch.einsum("bnsi,bnsj->bnij", centred, centred) / queries.shape[2]
        mean = mean.squeeze(2)
        start = view.newest + 1 if view.newest is not None else int(view.positions.max()) + 1
        rotation = average_rotation(view.rotary, start, p.n_future_positions, mean.shape[-1], mean.device)
        mean = torch.matmul(mean, rotation.T)
        if covariance is not None:
            covariance = torch.matmul(rotation, torch.matmul(covariance, rotation.T))
        return mean, covariance


def average_rotation(rotary, start: int, count: int, d: int, device) -> torch.Tensor:
    """[d, d] RoPE's rotation matrix averaged over positions start .. start + count - 1 (as kvpress builds it:
    cos on the diagonal, sin on the rotate-half pairs)."""
    cos, sin = rotary(torch.arange(start, start + count, device=device))  # [count, d]
    identity = torch.eye(d, device=cos.device, dtype=cos.dtype)
    pairs = torch.zeros((d, d), device=cos.device, dtype=cos.dtype)
    half = d // 2
    pairs[half:, :half], pairs[:half, half:] = torch.eye(half), -torch.eye(half)
    return (cos.unsqueeze(1) * identity + sin.unsqueeze(1) * pairs).mean(dim=0)

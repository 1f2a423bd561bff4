"""LagKV: score each chunk of keys and values against the range of the chunk after it.

Liang, Li, Yang, Zhang, Zhang, Qu. "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are
Important." arXiv:2504.04704 (code: AI-Lab-China-Merchants-Bank/LagKV; in NVIDIA kvpress as `LagKVPress`).
"""

from __future__ import annotations

from polykv.lazy import torch
from polykv.methods.base import LayerView, Method
from polykv.methods.eviction import Eviction, keep_top
from polykv.methods.params import MethodParams, tokens
from polykv.plan import Phase


class LagKVParams(MethodParams):
    sinks: int = tokens(4, ge=0, description="first tokens always kept (attention sinks); below the capacity")
    lag_size: int = tokens(128, ge=1, description="tokens per chunk, scored against the next chunk; below the capacity")


class LagKV(Method):
    """Compress the prompt once: keep the tokens that stand out of the next chunk's range, per KV head.

    Rule (kvpress's `LagKVPress`, prompt of n tokens, s sinks, chunk size L): the first s tokens and the tail (the
    last L + (n - s) mod L tokens) always stay. The m = (n - s) div L - 1 chunks of L tokens between them are scored
    against the chunk after each: per KV head, a key is min-max normalised by the next chunk's per-channel minimum
    and maximum, its score is the standard deviation of the result over the channels, softmax over the chunk; the
    same for the value; the token's score is the mean of the two. Within each chunk the scores become ranks
    (0 .. L - 1, divided by L), and the `capacity` highest scores are kept, sinks and tail first, then the best
    ranks of every chunk. A prompt shorter than s + 2L tokens has no scored chunk: the sinks and the most recent
    tokens stay (kvpress's fallback). Each KV head keeps its own positions. Ties among equal ranks are broken by
    torch's top-k on the same scores, as in kvpress, so the kept positions are kvpress's for the same tensor.
    The sinks and the tail (up to s + 2L - 1 tokens) only all stay when the capacity holds them: below that they
    all score 1 and top-k's tie order picks among them, in kvpress as here, and no chunk is scored. So `lag_size`
    must leave room for them: s + 2L - 1 at most the capacity (plan validation says so), and a `lag_size` that
    does not fit shrinks to a quarter of what the sinks leave (`params_that_fit`).

    Prefill only: a token's score is relative to the L tokens after it, which a decode step has not seen (the
    paper compresses in chunks as the cache grows, never one token a step). kvpress's experimental `cross_scoring`
    (raw scores across chunks) is not offered.
    """

    name = "lagkv"
    phases = frozenset({Phase.PREFILL})
    colour = "#AEC7E8"
    Params = LagKVParams
    params: LagKVParams  # this instance's, parsed
    below_capacity = ("sinks", "lag_size")

    @classmethod
    def least_capacity(cls, params: LagKVParams) -> int:
        return params.sinks + 2 * params.lag_size - 1  # the sinks and the longest tail

    @classmethod
    def check_capacity(cls, params: LagKVParams, capacity: int | None) -> list[str]:
        problems = super().check_capacity(params, capacity)
        if capacity is not None and not problems and cls.least_capacity(params) > capacity:
            most = (capacity - params.sinks + 1) // 2
            problems.append(
                f"sinks + 2 x lag_size - 1 ({cls.least_capacity(params)}: the sinks and the longest tail, which always "
                f"stay) must be at most the capacity ({capacity}); lag_size at most {most}"
            )
        return problems

    @classmethod
    def fit(cls, params, capacity: int) -> dict:
        out = super().fit(params, capacity)
        fitted = cls.Params(**out)
        if cls.least_capacity(fitted) > capacity:
            out["lag_size"] = max(1, (capacity - fitted.sinks) // 4)
        return out

    phase_refusal = "a token's score needs the lag_size tokens after it, which a decode step has not seen"
    standalone_source = "LagKV (Liang et al., 2025): compresses the prompt once, keeps generated tokens"

    def step(self, view: LayerView) -> Eviction | None:
        if not self.over_capacity(view):
            return None
        scores = lag_scores(view.keys, view.values, self.params.sinks, self.params.lag_size)
        return Eviction(keep=keep_top(scores, self.capacity, hidden=view.hidden))  # top-k even for one slot: ties


def lag_scores(keys: torch.Tensor, values: torch.Tensor, sinks: int, lag: int) -> torch.Tensor:
    """[b, h, n, d] keys and values in position order -> [b, h, n] LagKV scores (sinks and tail 1, the scored
    chunks' ranks / lag below 1), in the keys' dtype."""
    b, h, n, d = keys.shape
    if n < sinks + 2 * lag:  # no chunk has a next one: the sinks, then newer tokens higher
        score = torch.ones((b, h, n), dtype=keys.dtype, device=keys.device)
        if n > sinks:
            score[:, :, sinks:] = (torch.arange(n - sinks, device=keys.device) / (n - sinks)).to(keys.dtype)
        return score
    end = sinks + ((n - sinks) // lag) * lag  # the last whole chunk ends here; it and the rest are the tail
    chunked = (keys[:, :, sinks:end].reshape(b, h, -1, lag, d), values[:, :, sinks:end].reshape(b, h, -1, lag, d))
    score = (_stands_out(chunked[0]) + _stands_out(chunked[1])) / 2  # [b, h, chunks - 1, lag]
    score = (score.argsort(dim=-1).argsort(dim=-1) / lag).to(keys.dtype)
    sink_score = torch.ones((b, h, sinks), dtype=score.dtype, device=score.device)
    tail_score = torch.ones((b, h, n - end + lag), dtype=score.dtype, device=score.device)
    return torch.cat((sink_score, score.reshape(b, h, -1), tail_score), dim=-1)


def _stands_out(chunks: torch.Tensor) -> torch.Tensor:
    """[b, h, c, L, d] chunks -> [b, h, c - 1, L]: each token of chunks 0 .. c - 2, min-max normalised per channel
    by the next chunk's range, its spread over the channels (std), softmax within its chunk."""
    reference, scored = chunks[:, :, 1:], chunks[:, :, :-1]
    low = reference.min(dim=-2, keepdim=True).values
    high = reference.max(dim=-2, keepdim=True).values
    return ((scored - low) / (high - low)).std(dim=-1).softmax(dim=-1)

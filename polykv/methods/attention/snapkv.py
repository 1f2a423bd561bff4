"""SnapKV: the prompt's last queries vote for the prefix tokens worth keeping.

Li, Huang, Yang, Venkitesh, Locatelli, Ye, Cai, Lewis, Chen. "SnapKV: LLM Knows What You are Looking
for Before Generation." NeurIPS 2024, arXiv:2404.14469 (code: FasterDecoding/SnapKV).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from polykv.lazy import torch
from polykv.methods.base import LayerView, Method, Needs
from polykv.methods.eviction import Eviction
from polykv.methods.params import MethodParams, tokens
from polykv.plan import Phase


class SnapKVParams(MethodParams):
    window: int = tokens(
        32, ge=1, description="observation window: the last prompt queries that vote; below the capacity"
    )
    kernel_size: int = tokens(7, ge=1, description="1-D pooling kernel over the votes (odd keeps alignment)")
    pooling: Literal["max", "avg"] = Field(default="max", description="pooling of the votes: 'max' or 'avg'")


class SnapKV(Method):
    """Compress the prompt once, at the end of prefill; decode then appends without eviction.

    Rule: with a prompt of n > capacity tokens and window w, take the softmax attention (fp32) of the
    last w queries over all keys (causal inside the window), sum it over those queries, pool it along
    the key axis (stride 1, padding kernel//2; avg pooling counts the padding, as torch does by
    default), and keep, per KV head, the `capacity - w` best prefix tokens plus the whole window.
    Defaults window 32, kernel 7, max pooling: the authors' LongBench configurations
    (ablation_c*_w32_k7_maxpool.json). GQA: a KV head scores by the mean of its query heads (kvpress);
    the original repeats keys per query head instead, at G times the memory.
    """

    name = "snapkv"
    colour = "#CC79A7"
    standalone_source = "SnapKV (Li et al., NeurIPS 2024): compresses the prompt once, keeps generated tokens"
    phases = frozenset({Phase.PREFILL})
    Params = SnapKVParams
    params: SnapKVParams  # this instance's, parsed
    below_capacity = ("window",)

    def needs(self, phase: Phase, length: int) -> Needs:
        # capacity None: native allocation has not chosen this layer's capacity yet, so score anyway
        over = self.capacity is None or length > self.capacity
        return Needs(rows=self.params.window) if over else Needs()

    def step(self, view: LayerView) -> Eviction | None:
        if view.rows is None:
            return None
        self.per_token["score"] = self.score(view)
        return self.settle()

    def score(self, view: LayerView) -> torch.Tensor:
        """Pooled window votes for the prefix; +inf for the window, which always stays."""
        # At the end of prefill slot i holds position i, so the window is the last w slots.
        n, w = view.length, min(self.params.window, view.length)
        # the window's own rows: the view may hold more when the layer's decode method asked for more
        votes = view.grouped(view.rows[:, :, -w:].sum(dim=2))[..., : n - w]  # [b, h, n - w]
        votes = pool_votes(votes, self.params.kernel_size, self.params.pooling)
        return torch.cat([votes, votes.new_full((*votes.shape[:2], w), float("inf"))], dim=-1)


def pool_votes(votes: torch.Tensor, kernel_size: int, pooling: str) -> torch.Tensor:
    """Smooth votes [b, h, m], given in position order, so neighbours of a voted token survive with it.

    Slots are in position order at the end of prefill; in decode they are not (freed slots are reused),
    so a decode rule sorts them first (see CAKE).
    """
    if kernel_size == 1 or votes.shape[-1] == 0:
        return votes
    b, h, m = votes.shape
    flat = votes.reshape(b * h, 1, m)
    pool = torch.nn.functional.max_pool1d if pooling == "max" else torch.nn.functional.avg_pool1d
    pooled = pool(flat, kernel_size=kernel_size, stride=1, padding=kernel_size // 2)
    if pooled.shape[-1] != m:  # an even kernel gives one more: the last one goes
        pooled = pooled[..., :m]
    return pooled.reshape(b, h, m)

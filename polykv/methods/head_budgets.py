"""Head-level budgets: how a layer's budget splits over its KV heads (a plan's `head_allocation`).

  uniform  every KV head keeps the layer's capacity k (what every method does alone);
  adakv    Ada-KV (Feng et al., 2024, arXiv:2407.11550), as kvpress's AdaKVPress selects: the layer keeps the
           h x k best scores across its h KV heads, every head keeping at least its own floor(k x alpha) best
           (the safeguard, alpha 0.2 by default), so a head whose scores stand out keeps more tokens and a flat one
           fewer. The scores are the method's own: the ranking its prefill cut made (`recorded_rankings`), with
           its protected slots (+inf: SnapKV's window, StreamingLLM's sinks) always kept; a method that scores all
           heads alike (TOVA) gives each head the same tokens, ties aside, as there.

Where PolyKV differs from kvpress: kvpress keeps every token and masks the pruned ones in its attention patch;
here a layer holds only what its heads keep. Storage stays rectangular ([b, h, n, d]), so a head that keeps fewer
than the most-keeping head holds padding slots (`Eviction.padding`): the runtime marks them at position -1, no
query sees them, and the measured KV counts only tokens (`LayerSlots.held`). Ties across heads go by flat index
(kvpress's go by its bottom-k of the negated scores).

Decode (PolyKV's rule; kvpress compresses the prompt only): each step's new token joins every head, and the layer
keeps the h x k best of its method's scores across its heads once more, each head at least its own
floor(k x alpha): the h lowest go, from whichever heads hold them. A merging method (CaM, D2O) has no scores to
split this way and an eviction interval above 1 none step by step: `plan validate` refuses both in one line.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import Field

from polykv.lazy import torch
from polykv.methods.eviction import Eviction, recorded_rankings
from polykv.methods.params import MethodParams

HEAD_RULES = ("uniform", "adakv")


class AdaKVParams(MethodParams):
    alpha_safeguard: float = Field(
        default=0.2, ge=0.0, le=1.0, description="share of the capacity every KV head keeps of its own best; 0 .. 1"
    )


def adakv_keep(ranked: torch.Tensor, k: int, alpha: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Ada-KV's choice over a layer's ranked scores `ranked` [b, h, n] (higher stays) with capacity `k` per head:
    the slots to keep [b, h, m] (ascending; m the most any head keeps) and which of them are padding [b, h, m]
    (None when every head keeps m tokens). Every row keeps h x k tokens in all."""
    b, h, n = ranked.shape
    scores = ranked.clone()
    safe = int(k * alpha)  # kvpress's n_safe: int(n_kept * alpha_safeguard)
    if safe:
        scores.scatter_(-1, scores.topk(safe, dim=-1).indices, float("inf"))
    chosen = scores.reshape(b, h * n).topk(h * k, dim=-1).indices
    kept = torch.zeros(b, h * n, dtype=torch.bool, device=ranked.device).scatter_(-1, chosen, True).view(b, h, n)
    most = int(kept.sum(dim=-1).max())  # one host read per layer and prompt
    # a head's kept slots first, then (as room) its latest dropped ones: every key distinct, so the choice is fixed
    order = kept.long() * n + torch.arange(n, device=ranked.device)
    keep = order.topk(most, dim=-1).indices.sort(dim=-1).values
    padding = ~kept.gather(-1, keep)
    return keep, (padding if bool(padding.any()) else None)


class AdaKV:
    """The `adakv` rule of one plan: re-chooses each layer's eviction over its heads, at the prompt and every step."""

    def __init__(self, params: AdaKVParams):
        self.params = params

    def cut(self, decide: Callable[[], Eviction | None], heads: int) -> Eviction | None:
        """The eviction the method's cut `decide()` makes, the budget split over the `heads` KV heads: from
        the ranking the cut made (the last one, should the method rank twice) and the k it kept per head."""
        with recorded_rankings() as rankings:
            eviction = decide()
        if eviction is None or not rankings:
            return eviction
        ranked, k = rankings[-1]
        keep, padding = adakv_keep(ranked.expand(-1, heads, -1), k, self.params.alpha_safeguard)
        return Eviction(keep=keep, padding=padding)


__all__ = ["HEAD_RULES", "AdaKV", "AdaKVParams", "adakv_keep"]

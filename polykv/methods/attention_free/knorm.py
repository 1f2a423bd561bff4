"""Knorm: keep the keys with the smallest L2 norm.

Devoto, Zhao, Scardapane, Minervini. "A Simple and Effective L2 Norm-Based Strategy for KV Cache
Compression." EMNLP 2024, arXiv:2406.11430 (in NVIDIA kvpress as `KnormPress`).
"""

from __future__ import annotations

from polykv.methods.base import LayerView, Method
from polykv.methods.eviction import Eviction, evict_lowest
from polykv.plan import Phase


class Knorm(Method):
    """Drop the tokens whose keys have the largest L2 norm, per KV head.

    Rule: whenever a layer holds more than `capacity` slots (end of prefill, every decode step), score
    every slot of each KV head by minus the L2 norm of its key (as stored in the cache, after RoPE) and
    keep the `capacity` highest, i.e. the lowest-norm keys. The paper observes that low-norm keys draw
    high attention, so the norm stands in for attention without computing any. Needs no attention
    signal and has no parameters; each KV head keeps its own positions, as in kvpress's `KnormPress`,
    which applies the rule once to the prompt. Here it also runs in decode, one token per step.
    """

    name = "knorm"
    phases = frozenset({Phase.PREFILL, Phase.DECODE})
    colour = "#17BECF"
    standalone_source = (
        "Knorm (Devoto et al., EMNLP 2024): lowest-norm keys, on the prompt and as generation grows (kvpress: prompt)"
    )

    def step(self, view: LayerView) -> Eviction | None:
        # A key's norm never changes: keep the scores with the cache (`per_token` moves with its slots)
        # and score only the step's new tokens, not every slot at every decode step.
        score = self.per_token.get("score")
        if score is not None and score.shape[-1] == view.length - view.num_new:
            new = view.keys[..., view.length - view.num_new :, :]
            score = self.grow("score", view.num_new)
            score[..., view.length - view.num_new :] = -new.float().norm(dim=-1)
        else:
            score = -view.keys.float().norm(dim=-1)  # [b, h, n]
        self.per_token["score"] = score
        if not self.over_capacity(view):
            return None
        return evict_lowest(score, self.capacity, hidden=view.hidden)

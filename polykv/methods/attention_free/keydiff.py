"""KeyDiff: keep the keys least like the layer's mean key direction.

Park, Jones, Morse, Goel, Lee, Hou, Shin, Li, Song, Jiang. "KeyDiff: Key Similarity-Based KV Cache Eviction for
Long-Context LLM Inference in Resource-Constrained Environments." arXiv:2504.15364 (in NVIDIA kvpress as
`KeyDiffPress`).
"""

from __future__ import annotations

from polykv.lazy import torch
from polykv.methods.base import LayerView, Method
from polykv.methods.eviction import Eviction, prompt_cut
from polykv.plan import Phase


class KeyDiff(Method):
    """Drop the tokens whose keys point most nearly the way the layer's keys do on average, per KV head.

    Rule: whenever a layer holds more than `capacity` slots (end of prefill, every decode step), take each KV
    head's anchor, the mean of its keys scaled to unit length (as stored, after RoPE), score every slot by minus
    the cosine similarity of its key to the anchor, and keep the `capacity` highest: the most distinctive keys.
    No attention is needed and there are no parameters. At a prompt this is kvpress's `KeyDiffPress` (the same
    `F.normalize` and `F.cosine_similarity`, so the same numbers); a local layer's hidden padding, which no query
    sees, is left out of the anchor and goes first. In decode the anchor is taken again over the held slots at
    every step and one token goes (the new one may): the paper's rule evicts block by block as tokens stream in
    (kvpress's `BlockPress`), and one token a step is its finest block.
    """

    name = "keydiff"
    phases = frozenset({Phase.PREFILL, Phase.DECODE})
    colour = "#BCBD22"
    standalone_source = "KeyDiff (Park et al., 2025): distinctive keys, on the prompt and as generation grows"

    def step(self, view: LayerView) -> Eviction | None:
        if not self.over_capacity(view):
            return None
        return prompt_cut(key_diff_scores(view.keys, view.hidden), self.capacity, view.phase, view.hidden)


def key_diff_scores(keys: torch.Tensor, hidden: torch.Tensor | None = None) -> torch.Tensor:
    """[b, h, n, d] keys -> [b, h, n] minus each key's cosine similarity to the mean unit key of its head (the
    slots marked `hidden` [b, h, n] left out of the mean)."""
    unit = torch.nn.functional.normalize(keys, p=2, dim=-1)
    if hidden is None:
        anchor = unit.mean(dim=2, keepdim=True)
    else:
        seen = (~hidden).unsqueeze(-1)
        anchor = (unit * seen).sum(dim=2, keepdim=True) / seen.sum(dim=2, keepdim=True).clamp(min=1)
    return -torch.nn.functional.cosine_similarity(keys, anchor, dim=-1)

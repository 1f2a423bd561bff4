"""TOVA: Token Omission Via Attention.

Oren, Hassid, Yarden, Adi, Schwartz. "Transformers are Multi-State RNNs." EMNLP 2024,
arXiv:2401.06104 (code: schwartz-lab-NLP/TOVA).
"""

from __future__ import annotations

from polykv.methods.base import NOTHING, ONE_ROW, LayerView, Method, Needs
from polykv.methods.eviction import Eviction, evict_lowest
from polykv.plan import Phase


class TOVA(Method):
    """Drop the tokens the current query attends to least, one index set per layer.

    Rule: when a layer holds more than `capacity` slots, score every slot by the attention of the
    LAST query (softmax, fp32), averaged over all query heads of the layer, and keep the `capacity`
    highest; every KV head keeps the same positions. At the end of a long prompt this cuts the prompt
    in one shot with the last prompt token's attention; in decode it drops one token per step (the new
    token itself may go). No sinks or recent window are protected, as in the authors' code.
    """

    name = "tova"
    colour = "#009E73"
    standalone_source = "the paper's sweep protocol: TOVA is active in both prefill and decode"
    phases = frozenset({Phase.PREFILL, Phase.DECODE})

    def needs(self, phase: Phase, length: int) -> Needs:
        return ONE_ROW if self.evicts(phase, length) else NOTHING

    @classmethod
    def one_slot_scores(cls, params, rows, positions, capacity, newest, state):
        return rows[:, :, -1, :].mean(dim=1, keepdim=True), None  # `step`'s score; the same slot for every head

    def step(self, view: LayerView) -> Eviction | None:
        if not self.over_capacity(view):
            return None
        score = view.rows[:, :, -1, :].mean(dim=1, keepdim=True)  # [b, 1, n], averaged over every query head
        eviction = evict_lowest(score, self.capacity, hidden=view.hidden)
        h = view.positions.shape[1]  # the same slots for every KV head
        if eviction.dropped is not None:
            return Eviction(dropped=eviction.dropped.expand(-1, h, -1))
        return Eviction(keep=eviction.keep.expand(-1, h, -1))

"""H2O: heavy hitters (accumulated attention) plus a recent window.

Zhang, Sheng, Zhou, Chen, Zheng, Cai, Song, Tian, Ré, Barrett, Wang, Chen. "H2O: Heavy-Hitter Oracle
for Efficient Generative Inference of Large Language Models." NeurIPS 2023, arXiv:2306.14048
(code: FMInference/H2O, h2o_hf/utils_real_drop).
"""

from __future__ import annotations

from polykv.methods.base import LayerView
from polykv.methods.eviction import Eviction, evict_lowest
from polykv.methods.params import MethodParams, Real, real
from polykv.methods.shared import AccumulatedAttention, recent_mask
from polykv.plan import Phase


class H2OParams(MethodParams):
    heavy_ratio: Real = real(0.5, gt=0.0, le=1.0, description="share of the capacity for heavy hitters")


class H2O(AccumulatedAttention):
    """Keep the `recent` newest tokens plus the tokens with the largest accumulated attention.

    Rule (the authors' real-drop cache): every token's score is the attention it has received, summed
    (unnormalized) over every query so far: all prompt queries at prefill, then each new query. New
    tokens start from the attention of their own step. When a layer holds more than `capacity` slots,
    keep the `capacity - heavy` most recent positions and the `heavy = round(heavy_ratio * capacity)`
    highest-scoring others; evicted scores are dropped. Default heavy_ratio 0.5: the paper splits its
    budget evenly between heavy hitters and recent tokens. Selection is per KV head; with grouped-query
    attention a KV head's score is the mean of its query heads' scores (the original had no GQA).
    As a decode-only method after a full prefill, the scores still start from the prompt's attention.
    """

    name = "h2o"
    colour = "#E69F00"
    standalone_source = "H2O (Zhang et al., NeurIPS 2023): heavy hitters from the prompt on and through generation"
    phases = frozenset({Phase.PREFILL, Phase.DECODE})
    Params = H2OParams
    params: H2OParams  # this instance's, parsed

    one_slot_state = "score"

    def step(self, view: LayerView) -> Eviction | None:
        score = self.accumulate(view, restart=view.phase is Phase.PREFILL)  # a prefill step is a new prompt
        if not self.over_capacity(view):
            return None
        return evict_lowest(score, self.capacity, recent_mask(view, _recent(self.params, self.capacity)), view.hidden)

    @classmethod
    def one_slot_scores(cls, params, rows, positions, capacity, newest, state):
        count, h, n = positions.shape
        g = rows.shape[1] // h
        # `accumulate`'s numbers: the step's row, each KV head's the mean of its group (`LayerView.grouped`)
        state.add_(rows.view(count, h, n) if g == 1 else rows.view(count, h, g, n).sum(2).div_(g))
        return state, positions > newest - _recent(params, capacity)  # `recent_mask`


def _recent(params: H2OParams, capacity: int) -> int:
    """The recent window: the capacity less its `heavy_ratio` share for heavy hitters."""
    return capacity - min(capacity, max(0, round(params.heavy_ratio * capacity)))

"""StreamingLLM: attention sinks plus a recent window.

Xiao, Tian, Chen, Han, Lewis. "Efficient Streaming Language Models with Attention Sinks." ICLR 2024,
arXiv:2309.17453 (code: mit-han-lab/streaming-llm).
"""

from __future__ import annotations

from polykv.methods.base import LayerView, Method
from polykv.methods.eviction import Eviction, evict_lowest
from polykv.methods.params import MethodParams, tokens
from polykv.plan import Phase


class StreamingLLMParams(MethodParams):
    sinks: int = tokens(4, ge=0, description="first tokens always kept (attention sinks); below the capacity")


class StreamingLLM(Method):
    """Keep the first `sinks` tokens and the most recent `capacity - sinks` tokens; evict the middle.

    Rule: whenever a layer holds more than `capacity` slots (end of prefill, every decode step), keep
    positions [0, sinks) and the `capacity - sinks` newest positions. No scores are used; every head
    and layer keeps the same positions. Defaults: 4 sinks, as in the paper and `StartRecentKVCache`.
    Difference from the original: keys keep their TRUE RoPE positions (PolyKV never re-rotates), where
    the authors re-position the cache contiguously ("pos_shift"); within the model's trained context the
    two agree on which tokens are kept, and only the positional distances differ.
    """

    name = "streamingllm"
    colour = "#0072B2"
    standalone_source = "StreamingLLM (Xiao et al., ICLR 2024): sinks + recent window over the whole stream"
    phases = frozenset({Phase.PREFILL, Phase.DECODE})
    Params = StreamingLLMParams
    params: StreamingLLMParams  # this instance's, parsed
    below_capacity = ("sinks",)

    @classmethod
    def one_slot_scores(cls, params, rows, positions, capacity, newest, state):
        return positions.float(), positions < params.sinks  # `step`'s rule: the oldest position but the sinks

    def step(self, view: LayerView) -> Eviction | None:
        if not self.over_capacity(view):
            return None
        # Positions are unique per head, so the top `capacity` positions with sinks forced in are
        # exactly sinks + the most recent tokens.
        sinks = view.positions < self.params.sinks
        return evict_lowest(view.positions.float(), self.capacity, protected=sinks, hidden=view.hidden)

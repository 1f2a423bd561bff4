"""PolyKV's attention function, registered with transformers as `attn_implementation="polykv"`, and what a forward
records of it.

The model calls `cache.update(...)` and then, in the same attention module, the attention function. A cache layer
of PolyKV's hands itself over in its update (`hand_over`); the attention function finds it (`take_updated_layer`)
and lets it compute its own step (`AttendingLayer.attend`: one routed layer's step is
`polykv.runtime.attention_step.attend`). A forward that handed nothing over (no routed cache) runs plain
attention: the model's own in another thread than the block's (`polykv.runtime.swap`), SDPA in the block's own.

Recorders (`record_attention`, `record_entropy`) listen to the routed forwards of the thread that opened them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from polykv.errors import RoutedCacheError
from polykv.runtime.swap import ATTN_IMPLEMENTATION, own_attention, own_mask

# The layer that was just updated is parked here, per thread, for the attention function of the same module.
_handoff = threading.local()


def hand_over(layer: AttendingLayer) -> None:
    """Park a just-updated cache layer for the attention function of the same module (`take_updated_layer`)."""
    _handoff.layer = layer


def take_updated_layer(layer_idx: int) -> AttendingLayer | None:
    """The layer parked by the cache update that ran just before this attention, or None."""
    layer = getattr(_handoff, "layer", None)
    _handoff.layer = None
    if layer is not None and layer.layer_idx != layer_idx:
        raise RoutedCacheError(
            f"cache layer {layer.layer_idx} was updated but attention ran for layer {layer_idx}; "
            "this model's attention does not follow the update-then-attend order PolyKV relies on"
        )
    return layer


class AttendingLayer(Protocol):
    """What PolyKV's attention function talks to: the cache layer a forward pass has just updated (it hands
    itself over with `hand_over`), which computes its own attention step: its index, and `attend`. Implemented
    by `RoutedLayer` (one plan's layer), `polykv.runtime.many_plans`'s `SharedPrompt` (one prompt pass filling many
    plans' layers) and `PlanRows` (many plans' rows as one batch), and the profiler's `_PrefixBlock` (many
    cells' continuations over one shared prompt)."""

    layer_idx: int

    def attend(
        self,
        module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        dropout: float,
        scaling: float,
        kwargs,
    ) -> tuple[torch.Tensor, None]: ...


def polykv_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    layer = take_updated_layer(module.layer_idx)
    if layer is None:  # no routed cache: plain attention, with the mask built for it (`own_mask`)
        attention = own_attention(module)
        return attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if attention_mask is not None:
        raise RoutedCacheError(
            "custom attention masks are not supported under routed(); pass none (padding is refused)"
        )
    return layer.attend(module, query, key, value, dropout, module.scaling if scaling is None else scaling, kwargs)


class AttentionRecorder:
    """Collects the newest query's attention [b, h*g, 1, n] and the slot positions, per layer."""

    def __init__(self):
        self.rows: dict[int, torch.Tensor] = {}
        self.positions: dict[int, torch.Tensor] = {}

    def record(self, layer, rows: torch.Tensor) -> None:
        self.rows[layer.layer_idx] = rows
        self.positions[layer.layer_idx] = layer.positions


class EntropyRecorder:
    """Per layer: the attention entropy (nats) of every query, summed over the queries of each forward
    inside the block ([b, h*g], float64), and how many queries were summed."""

    def __init__(self):
        self.sums: dict[int, torch.Tensor] = {}
        self.queries: dict[int, int] = {}

    def record(self, layer_idx: int, sums: torch.Tensor, num_queries: int) -> None:
        self.sums[layer_idx] = self.sums[layer_idx] + sums if layer_idx in self.sums else sums
        self.queries[layer_idx] = self.queries.get(layer_idx, 0) + num_queries


class ThreadRecorders(threading.local):
    """The recorders the current thread opened: a forward records only into its own thread's (a shared model
    runs other threads' forwards too, as the hand-over of layers to the attention function is per thread)."""

    def __init__(self):
        self.attention: list[AttentionRecorder] = []
        self.entropy: list[EntropyRecorder] = []

    def __bool__(self) -> bool:
        return bool(self.attention or self.entropy)


_here = ThreadRecorders()


def listening() -> ThreadRecorders:
    """The recorders open in this thread (false when there are none)."""
    return _here


@contextmanager
def record_attention() -> Iterator[AttentionRecorder]:
    """Inside the block, every routed forward of this thread records each layer's newest-query attention."""
    recorder = AttentionRecorder()
    _here.attention.append(recorder)
    try:
        yield recorder
    finally:
        _here.attention.remove(recorder)


@contextmanager
def record_entropy() -> Iterator[EntropyRecorder]:
    """Inside the block, every routed forward of this thread adds each layer's per-query attention entropies."""
    recorder = EntropyRecorder()
    _here.entropy.append(recorder)
    try:
        yield recorder
    finally:
        _here.entropy.remove(recorder)


AttentionInterface.register(ATTN_IMPLEMENTATION, polykv_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, own_mask)

"""The routed cache: one `RoutedLayer` per Transformer layer, each running its plan entry.

A `RoutedLayer` is a Hugging Face cache layer (the `DynamicLayer` interface: update, get_seq_length,
get_mask_sizes) that physically holds only the slots its method keeps. It also records the true
position of every slot, and reports the TRUE number of tokens seen as its sequence length, so a model
that derives RoPE positions from the cache keeps counting from the real length after eviction.

The attention function (`attention.py`) calls `finish_step` right after computing the layer's output,
handing over the attention signals the layer's methods asked for; the method then decides what stays.
"""

from __future__ import annotations

import threading

import torch
from transformers.cache_utils import Cache, DynamicLayer

from polykv.errors import RoutedCacheError
from polykv.methods import Method, make_method
from polykv.methods.base import Eviction, LayerView, Needs
from polykv.plan import Phase, Plan

# The model calls `cache.update(...)` and then, in the same attention module, the attention function.
# The layer that was just updated is parked here so that the attention function can find it.
_handoff = threading.local()


def take_updated_layer(layer_idx: int) -> RoutedLayer | None:
    layer = getattr(_handoff, "layer", None)
    _handoff.layer = None
    if layer is not None and layer.layer_idx != layer_idx:
        raise RoutedCacheError(
            f"cache layer {layer.layer_idx} was updated but attention ran for layer {layer_idx}; "
            "this model's attention does not follow the update-then-attend order PolyKV relies on"
        )
    return layer


class RoutedLayer(DynamicLayer):
    """One layer of the routed cache: its keys/values, true positions and two phase methods."""

    def __init__(self, layer_idx: int, prefill: Method, decode: Method):
        super().__init__()
        self.layer_idx = layer_idx
        self.methods = {Phase.PREFILL: prefill, Phase.DECODE: decode}
        self.seen = 0  # tokens processed so far: the true sequence length
        # [b, h, n] true position of each slot; None until the first eviction, while slot i holds
        # position i (saves work on every step of layers that never evict)
        self._positions: torch.Tensor | None = None
        self.phase = Phase.PREFILL
        self.num_new = 0
        self.retained_after_prefill: int | None = None
        self.on_prefill_done = None  # set by the cache under native allocation

    # ---- Hugging Face cache-layer interface ---------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        self.phase = Phase.PREFILL if self.seen == 0 else Phase.DECODE
        if self.seen == 0:
            self.keys, self.values = key_states, value_states
        else:
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
            if self._positions is not None:
                b, h = key_states.shape[:2]
                new_pos = torch.arange(self.seen, self.seen + q, device=key_states.device).repeat(b, h, 1)
                self._positions = torch.cat([self._positions, new_pos], dim=-1)
        self.seen += q
        self.num_new = q
        _handoff.layer = self
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.retained + query_length, 0

    def reset(self) -> None:
        super().reset()
        self.seen, self._positions = 0, None
        for method in self.methods.values():
            method.per_token.clear()

    def crop(self, tokens_to_remove: int) -> None:
        raise RoutedCacheError("cropping a routed cache is not supported (evicted tokens cannot be restored)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_batch(lambda t: t[indices, ...])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    # ---- routing ------------------------------------------------------------------------------
    @property
    def retained(self) -> int:
        """Slots physically held per KV head."""
        return 0 if self.keys is None or self.keys.dim() < 3 else self.keys.shape[-2]

    @property
    def positions(self) -> torch.Tensor | None:
        """[b, h, n] true position of every slot."""
        if self._positions is None and self.retained:
            b, h, n = self.keys.shape[:3]
            return torch.arange(n, device=self.keys.device).expand(b, h, n)
        return self._positions

    @property
    def idle(self) -> bool:
        """Nothing for the methods to do this step (e.g. `full`): skip scoring and bookkeeping."""
        if self.phase is Phase.DECODE:
            return self.method.passive
        return self.method.passive and self.methods[Phase.DECODE].passive

    @property
    def method(self) -> Method:
        return self.methods[self.phase]

    def needs(self) -> Needs:
        length = self.retained
        needs = self.method.needs(self.phase, length)
        if self.phase is Phase.PREFILL:
            needs = needs | self.methods[Phase.DECODE].needs_from_prefill(length)
        return needs

    def finish_step(self, view: LayerView) -> None:
        """After attention: let the phase's method evict (and, in prefill, brief the decode method)."""
        if self.phase is Phase.DECODE:
            self._apply(self.method.step(view))
            return
        self.methods[Phase.DECODE].observe_prefill(view)
        eviction = self.method.step(view)
        if self.on_prefill_done is None:
            self.settle_prefill(eviction)
        else:  # native allocation: the cache settles every layer once all have seen the prompt
            self.on_prefill_done(self)

    def settle_prefill(self, eviction: Eviction | None) -> None:
        self.method.per_token.clear()  # the prefill method's scores are never used again
        self._apply(eviction)
        self.retained_after_prefill = self.retained

    def _apply(self, eviction: Eviction | None) -> None:
        if eviction is None:
            return
        n = self.retained
        if eviction.dropped is None and eviction.keep.shape[-1] == n - 1:
            eviction = Eviction(dropped=n * (n - 1) // 2 - eviction.keep.sum(dim=-1, keepdim=True))
        kept = n - 1 if eviction.dropped is not None else eviction.keep.shape[-1]
        capacity = self.method.capacity
        if capacity is not None and kept > capacity:
            raise RoutedCacheError(
                f"layer {self.layer_idx}: {self.method.name} kept {kept} slots, over its capacity {capacity}"
            )
        if eviction.dropped is not None:
            # The usual decode step drops one slot: move the newest slot into it instead of copying
            # the whole cache (slots are unordered; positions say where each token was).
            select = lambda t: drop_one_slot(t, eviction.dropped)  # noqa: E731
        else:
            select = lambda t: gather_slots(t, eviction.keep)  # noqa: E731
        positions = self.positions.contiguous()  # materialized at the first eviction
        self.keys, self.values, self._positions = select(self.keys), select(self.values), select(positions)
        for method in self.methods.values():
            for name, tensor in method.per_token.items():
                method.per_token[name] = select(tensor)

    def adopt(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Take over keys/values already computed for a prefix, as if prefilled here (nothing evicted).

        Profiling reuses FullKV's prefix this way; only layers that keep everything can adopt one.
        """
        if not all(method.passive for method in self.methods.values()):
            raise RoutedCacheError(f"layer {self.layer_idx}: only a layer that keeps everything can adopt a prefix")
        self.lazy_initialization(keys, values)
        self.keys, self.values, self.seen = keys, values, keys.shape[-2]
        self.retained_after_prefill = self.retained

    def evict_positions(self, positions: torch.Tensor) -> None:
        """Drop the slots holding these true positions (same set for every batch row and head).

        A manual tool for experiments and exactness tests; methods evict through `step`.
        """
        drop = torch.isin(self.positions, positions.to(self.positions.device))
        keep_count = int((~drop[0, 0]).sum())
        keep = (~drop).float().topk(keep_count, dim=-1, sorted=False).indices.sort(dim=-1).values
        self._apply(Eviction(keep=keep))

    def _map_batch(self, fn) -> None:
        if self.retained == 0:
            return
        self.keys, self.values = fn(self.keys), fn(self.values)
        self._positions = None if self._positions is None else fn(self._positions)
        for method in self.methods.values():
            method.per_token = {k: fn(v) for k, v in method.per_token.items()}


def gather_slots(tensor: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Select slots along dim 2 of a [b, h, n, ...] tensor with per-head indices [b, h, k]."""
    if tensor.dim() == 3:
        return tensor.gather(2, keep)
    # Rows of a flattened [b*h*n, d] view: index_select copies whole rows, ~3x faster than a gather
    # with an expanded index on CPU, and this runs for keys and values in every layer at every step.
    b, h, n = tensor.shape[:3]
    offsets = torch.arange(0, b * h * n, n, device=keep.device).view(b, h, 1)
    rows = tensor.reshape(b * h * n, *tensor.shape[3:]).index_select(0, (keep + offsets).reshape(-1))
    return rows.view(*keep.shape, *tensor.shape[3:])


def drop_one_slot(tensor: torch.Tensor, dropped: torch.Tensor) -> torch.Tensor:
    """Remove slot `dropped[b, h, 0]` of each head in place: the last slot moves into it."""
    index = dropped.view(*dropped.shape, *([1] * (tensor.dim() - 3))).expand(*dropped.shape, *tensor.shape[3:])
    tensor.scatter_(2, index, tensor[:, :, -1:].clone())
    return tensor[:, :, :-1]


class RoutedCache(Cache):
    """A Hugging Face `Cache` whose layers follow a plan."""

    def __init__(self, plan: Plan):
        layers = [
            RoutedLayer(idx, make_method(layer.prefill, idx), make_method(layer.decode, idx))
            for idx, layer in enumerate(plan.layers)
        ]
        super().__init__(layers=layers)
        self.plan = plan
        self.native_totals: dict[Phase, int] = {}
        if plan.allocation == "native":
            for phase in plan.scope.phases:
                self.native_totals[phase] = sum(layer[phase].capacity for layer in plan.layers)
                for layer in layers:  # capacities are unknown until every layer has seen the prompt
                    layer.methods[phase].capacity = None
            for layer in layers:
                layer.on_prefill_done = self._layer_prefilled

    def _layer_prefilled(self, layer: RoutedLayer) -> None:
        if layer.layer_idx != len(self.layers) - 1:
            return
        prompt_length = layer.seen
        for phase, total in self.native_totals.items():
            methods = [lay.methods[phase] for lay in self.layers]
            capacities = type(methods[0]).allocate(
                total, [m.allocation_statistic() for m in methods], methods[0].params, prompt_length
            )
            for method, capacity in zip(methods, capacities):
                method.capacity = capacity
        for lay in self.layers:
            lay.settle_prefill(lay.methods[Phase.PREFILL].settle())

    def retained_per_layer(self) -> list[int]:
        return [layer.retained for layer in self.layers]

    def kv_bytes_per_layer(self) -> list[int]:
        """Bytes actually held by keys and values in each layer."""
        return [0 if layer.retained == 0 else layer.keys.nbytes + layer.values.nbytes for layer in self.layers]

    def capacities(self, phase: Phase | str) -> list[int | None]:
        """Each layer's capacity in a phase (after native allocation, the capacities it chose)."""
        return [layer.methods[Phase(phase)].capacity for layer in self.layers]

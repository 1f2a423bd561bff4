"""Where a routed layer's slots live in static-shape decode (`LayerSlots`): one object per layer, so that the
layer itself is the Hugging Face interface and its phases, and storage is in one place.

While a layer evicts in decode, its keys, values and positions are prefix views of blocks of capacity +
interval slots (`polykv.methods.slots.SlotBlock`): a step writes its new tokens into the slots the last
eviction freed and a one-slot eviction moves the last slot into the dropped one, so a step allocates nothing
and shapes stay fixed. Keys and values share one storage [2, b, h, S, d], so that one scatter moves both; in
a merge group (`polykv.runtime.merges`) that storage is the layer's slice of the group's block. A cut that
gathers, or any other assignment, gives the tensors storage of their own, and the next step copies them
into a new block once. The methods' per-slot state lives the same way, in each method's `SlotStates`.
"""

from __future__ import annotations

from polykv.lazy import lazy_import
from polykv.methods.slots import SlotBlock, drop_one_slot
from polykv.plan import Phase

torch = lazy_import("torch")


class LayerSlots:
    """The blocks of one routed layer (`RoutedLayer.slots`): keys and values (`kv`, with `keys` and `values` its
    halves), positions (`pos`), and the merge group whose block holds keys and values (`group`); None until the
    first decode step that needs them, and again after a cut. The layer's own `keys`, `values` and
    `_positions` are the tensors; these say where they live."""

    def __init__(self) -> None:
        self.kv: SlotBlock | None = None
        self.keys: SlotBlock | None = None
        self.values: SlotBlock | None = None
        self.pos: SlotBlock | None = None
        self.group = None  # MergeGroup | None

    def free(self) -> None:
        """Forget every block (the tensors got storage of their own, or the layer was reset)."""
        self.kv = self.keys = self.values = self.pos = None
        self.group = None

    def holds_kv(self, layer, slots: int) -> bool:
        """Are the layer's keys and values prefix views of the block with room for `slots`?"""
        return self.kv is not None and self.keys.holds(layer.keys, slots) and self.values.holds(layer.values)

    def kv_view(self, layer) -> torch.Tensor | None:
        """Keys and values as one [2, b, h, n, d] view when they live in one block, else None."""
        return self.kv.prefix(layer.retained) if self.holds_kv(layer, layer.retained) else None

    def room(self, layer, slots: int) -> int:
        """Slots of a new block for `slots` tokens: the decode method's capacity + interval, at least."""
        decode = layer.methods[Phase.DECODE]
        return max(slots, 0 if decode.capacity is None else decode.capacity + decode.interval)

    def write(self, layer, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Write the new tokens after the layer's slots, in place (their positions too); the first step after
        a cut copies into a new block once."""
        n, q = layer.keys.shape[-2], key_states.shape[-2]
        if layer.keys.shape[-1] != layer.values.shape[-1] or layer.keys.dtype != layer.values.dtype:
            # keys and values of different sizes cannot share one block: concatenate, as before
            layer.keys = torch.cat([layer.keys, key_states], dim=-2)
            layer.values = torch.cat([layer.values, value_states], dim=-2)
        else:
            if not self.holds_kv(layer, n + q):  # once after a cut, which gives keys and values new storage
                self._new_kv_block(layer, self.room(layer, n + q))
            self.keys.span(n, n + q).copy_(key_states)
            self.values.span(n, n + q).copy_(value_states)
            layer.keys, layer.values = self.keys.prefix(n + q), self.values.prefix(n + q)
        self._append_positions(layer, n, q)

    def _new_kv_block(self, layer, slots: int) -> None:
        """Keys and values into a new block of `slots` slots: a slice of the block of the layer's merge
        group when it has one, else a block of its own."""
        handed = None if layer.merge_groups is None else layer.merge_groups.block_for(layer, slots)
        if handed is None:
            self.kv = SlotBlock.around(torch.stack([layer.keys, layer.values]), slots, dim=3)
        else:
            self.kv, self.group = handed
            held = self.kv.prefix(layer.retained)
            held[0].copy_(layer.keys)
            held[1].copy_(layer.values)
        self.keys, self.values = SlotBlock(self.kv.storage[0]), SlotBlock(self.kv.storage[1])

    def _append_positions(self, layer, n: int, q: int) -> None:
        if layer._positions is None:  # slot i still holds position i
            return
        if self.pos is None or not self.pos.holds(layer._positions, n + q):
            self.pos = SlotBlock.around(layer._positions, self.room(layer, n + q))  # once after a cut
        if q == 1:
            self.pos.span(n, n + 1).fill_(layer.seen)
        else:
            self.pos.span(n, n + q).copy_(torch.arange(layer.seen, layer.seen + q, device=layer._positions.device))
        layer._positions = self.pos.prefix(n + q)

    def reserve(self, layer, slots: int) -> None:
        """Room for `slots` more tokens of a layer that keeps everything (see `RoutedLayer.reserve`)."""
        n = layer.retained
        self.kv = SlotBlock.around(torch.stack([layer.keys, layer.values]), n + slots, dim=3)
        self.keys, self.values = SlotBlock(self.kv.storage[0]), SlotBlock(self.kv.storage[1])
        layer.keys, layer.values = self.keys.prefix(n), self.values.prefix(n)
        if layer._positions is not None:
            self.pos = SlotBlock.around(layer._positions, n + slots)
            layer._positions = self.pos.prefix(n)

    def drop_one(self, layer, dropped: torch.Tensor, n: int, newest_last: bool, deferred: bool) -> None:
        """Slot `dropped[b, h, 0]` of each head leaves the layer's keys, values and positions: the last slot
        moves into it (one scatter for keys and values when they share a block). `newest_last`: the last slot
        holds the newest position, scattered as a number. `deferred`: the merge group moves the key/value
        slot after its merge (until then keys and values are already the n - 1 slot prefix, whose dropped slot
        still holds the evicted token)."""
        if self.pos is not None and self.pos.holds(layer._positions):
            layer._positions = self.pos.drop(dropped, n, last=layer.seen - 1 if newest_last else None)
        else:  # materialized at the first eviction (writable storage, not an expanded arange)
            layer._positions = drop_one_slot(layer.positions.contiguous(), dropped)
        if self.holds_kv(layer, n):
            if deferred:
                self.group.defer(layer, dropped, n)
            else:
                self.kv.drop(dropped, n)
            layer.keys, layer.values = self.keys.prefix(n - 1), self.values.prefix(n - 1)
        else:
            layer.keys, layer.values = drop_one_slot(layer.keys, dropped), drop_one_slot(layer.values, dropped)

    def gather(self, layer, keep: torch.Tensor) -> None:
        """A cut: the layer keeps slots `keep` [b, h, k] of its keys, values and positions, and its methods'
        per-slot state follows; every tensor gets storage of its own (the next step makes a block again).

        Mid-step (a local layer's window, before its method has seen the step's new slots) a method's state
        covers only the slots held before the step, the first ones: it keeps the indices among them (the new
        slots, last, are always kept)."""
        n = layer.retained
        layer._positions = gather_slots(layer.positions, keep)
        layer.keys, layer.values = gather_slots(layer.keys, keep), gather_slots(layer.values, keep)
        self.free()
        for method in layer.methods.values():
            for name, tensor in method.per_token.items():
                older = keep if tensor.shape[2] == n else keep[..., : keep.shape[-1] - (n - tensor.shape[2])]
                method.per_token[name] = gather_slots(tensor, older)


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

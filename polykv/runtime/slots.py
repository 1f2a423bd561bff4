"""The slots a routed layer holds (`LayerSlots`): its keys, values and their true positions, and where they live.
One object per layer, so that the layer itself is the Hugging Face interface and its phases, and storage is in
one place: the layer reads the tensors here and changes them only through this interface.

While a layer evicts in decode, its keys, values and positions are prefix views of blocks of capacity +
interval slots (`polykv.methods.slots.SlotBlock`): a step writes its new tokens into the slots the last
eviction freed and a one-slot eviction moves the last slot into the dropped one, so a step allocates nothing
and shapes stay fixed. Keys and values share one storage [2, b, h, S, d], so that one scatter moves both; in
a merge group (`polykv.runtime.merges`) that storage is the layer's slice of the group's block. A cut that
gathers, or any other assignment, gives the tensors storage of their own, and the next step copies them
into a new block once. The methods' per-slot state lives the same way, in each method's `SlotStates`.
Many plans stepping together (`polykv.runtime.row_storage`) give a layer slices of blocks its layer shares with
the other plans' instead (`adopt_block`), and a new block after a cut is that slice again.
"""

from __future__ import annotations

from polykv.lazy import torch
from polykv.methods.slots import SlotBlock, drop_one_slot, gather_slots
from polykv.plan import Phase


class LayerSlots:
    """The slots of one routed layer (`RoutedLayer.slots`).

    The tensors: `keys` and `values` [b, h, n, d] (after RoPE; None before the first token), and `positions`
    [b, h, n], the true position of each slot. Assigning `keys` or `values` stores a tensor of its own (outside
    any block), as Hugging Face's layer code does. Where they live: the block of keys and values (`kv_block`,
    with `key_block` and `value_block` its halves), of positions (`position_block`), and the merge group whose
    block holds keys and values (`group`); None until the first decode step that needs them, and again after
    a cut. Methods that need the layer (`write`, `reserve`, `drop_one`) read its decode method's capacity, its
    merge groups and the tokens it has seen; they write nothing on it."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        # [b, h, n] true position of each slot; None until the first eviction, while slot i holds position i
        # (saves work on every step of layers that never evict)
        self._positions: torch.Tensor | None = None
        self.kv_block: SlotBlock | None = None
        self.key_block: SlotBlock | None = None
        self.value_block: SlotBlock | None = None
        self.position_block: SlotBlock | None = None
        self.group = None  # MergeGroup | None
        # do some slots hold no token, only room (a head-level split's padding, `hide`)? Then every query is masked
        self.padded = False

    @property
    def retained(self) -> int:
        """Slots held per KV head."""
        return 0 if self.keys is None or self.keys.dim() < 3 else self.keys.shape[-2]

    @property
    def positions(self) -> torch.Tensor | None:
        """[b, h, n] true position of every slot (None while nothing is held)."""
        if self._positions is None and self.retained:
            b, h, n = self.keys.shape[:3]
            return torch.arange(n, device=self.keys.device).expand(b, h, n)
        return self._positions

    def start(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold a prompt's keys and values (or a prefix's, adopted): slot i holds position i."""
        self.keys, self.values, self._positions = keys, values, None

    def reset(self) -> None:
        """Hold nothing (a new sequence)."""
        self.keys = self.values = self._positions = None
        self.padded = False
        self.free()

    def free(self) -> None:
        """Forget every block (the tensors got storage of their own, or the layer was reset)."""
        self.kv_block = self.key_block = self.value_block = self.position_block = None
        self.group = None

    def holds_kv(self, slots: int) -> bool:
        """Are the keys and values prefix views of the block with room for `slots`?"""
        return (
            self.kv_block is not None and self.key_block.holds(self.keys, slots) and self.value_block.holds(self.values)
        )

    def kv_view(self) -> torch.Tensor | None:
        """Keys and values as one [2, b, h, n, d] view when they live in one block, else None."""
        n = self.retained
        return self.kv_block.prefix(n) if self.holds_kv(n) else None

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor, seen: int) -> None:
        """The new tokens (at positions seen, seen + 1, ...) after the held slots, by concatenation: how a layer
        that keeps everything grows, as Hugging Face's DynamicLayer does."""
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        if self._positions is not None:
            b, h, q = key_states.shape[0], key_states.shape[1], key_states.shape[-2]
            new_pos = torch.arange(seen, seen + q, device=key_states.device).repeat(b, h, 1)
            self._positions = torch.cat([self._positions, new_pos], dim=-1)

    def write(self, layer, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """The new tokens (at positions layer.seen, ...) after the held slots, in place (their positions too); the
        first step after a cut copies into a new block once."""
        n, q = self.keys.shape[-2], key_states.shape[-2]
        if self.keys.shape[-1] != self.values.shape[-1] or self.keys.dtype != self.values.dtype:
            # keys and values of different sizes cannot share one block: concatenate, as before
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
        else:
            if not self.holds_kv(n + q):  # once after a cut, which gives keys and values new storage
                self._new_kv_block(layer, _room(layer, n + q))
            self.key_block.span(n, n + q).copy_(key_states)
            self.value_block.span(n, n + q).copy_(value_states)
            self.keys, self.values = self.key_block.prefix(n + q), self.value_block.prefix(n + q)
        self._append_positions(layer, n, q)

    def _new_kv_block(self, layer, slots: int) -> None:
        """Keys and values into a new block of `slots` slots: a slice of the block of the layer's merge
        group when it has one, else its slices of storage shared with other plans' rows when it has them
        (`polykv.runtime.row_storage`), else a block of its own."""
        handed = None if layer.merge_groups is None else layer.merge_groups.block_for(layer, slots)
        shared = None if handed is not None or layer.shared_rows is None else layer.shared_rows.block_for(layer, slots)
        if shared is not None:
            self.adopt_block(*shared)
            return
        if handed is None:
            self.kv_block = SlotBlock.around(torch.stack([self.keys, self.values]), slots, dim=3)
        else:
            self.kv_block, self.group = handed
            held = self.kv_block.prefix(self.retained)
            held[0].copy_(self.keys)
            held[1].copy_(self.values)
        self.key_block, self.value_block = SlotBlock(self.kv_block.storage[0]), SlotBlock(self.kv_block.storage[1])

    def adopt_block(self, block: SlotBlock, positions: SlotBlock | None = None) -> None:
        """Keys and values into `block` ([2, b, h, S, d], slots on dimension 3), and positions into `positions`
        ([b, h, S]) if given, copied there: slices of storage other rows share (`polykv.runtime.row_storage`)."""
        n = self.retained
        held = block.prefix(n)
        held[0].copy_(self.keys)
        held[1].copy_(self.values)
        self.kv_block, self.group = block, None
        self.key_block, self.value_block = SlotBlock(block.storage[0]), SlotBlock(block.storage[1])
        self.keys, self.values = self.key_block.prefix(n), self.value_block.prefix(n)
        if positions is not None:
            positions.prefix(n).copy_(self.positions)  # slot i = position i until the first eviction: written out
            self.position_block, self._positions = positions, positions.prefix(n)

    def lives_in(self, kv: SlotBlock, positions: SlotBlock) -> bool:
        """Are the keys, values and positions the prefix views of these blocks?"""
        n = self.retained
        return (
            self.kv_block is kv
            and self.holds_kv(n)
            and self.position_block is positions
            and positions.holds(self._positions)
        )

    def dropped_together(self, n: int) -> None:
        """Of the n slots held, one left each head in the blocks (`polykv.runtime.row_storage`: many rows' last
        slots moved at once): the tensors become the blocks' n - 1 slot prefixes."""
        self.keys, self.values = self.key_block.prefix(n - 1), self.value_block.prefix(n - 1)
        self._positions = self.position_block.prefix(n - 1)

    def _append_positions(self, layer, n: int, q: int) -> None:
        if self._positions is None:  # slot i still holds position i
            return
        if self.position_block is None or not self.position_block.holds(self._positions, n + q):
            self.position_block = SlotBlock.around(self._positions, _room(layer, n + q))  # once after a cut
        if q == 1:
            self.position_block.span(n, n + 1).fill_(layer.seen)
        else:
            new = torch.arange(layer.seen, layer.seen + q, device=self._positions.device)
            self.position_block.span(n, n + q).copy_(new)
        self._positions = self.position_block.prefix(n + q)

    def reserve(self, slots: int) -> None:
        """Room for `slots` more tokens of a layer that keeps everything (see `RoutedLayer.reserve`)."""
        n = self.retained
        self.kv_block = SlotBlock.around(torch.stack([self.keys, self.values]), n + slots, dim=3)
        self.key_block, self.value_block = SlotBlock(self.kv_block.storage[0]), SlotBlock(self.kv_block.storage[1])
        self.keys, self.values = self.key_block.prefix(n), self.value_block.prefix(n)
        if self._positions is not None:
            self.position_block = SlotBlock.around(self._positions, n + slots)
            self._positions = self.position_block.prefix(n)

    def drop_one(self, layer, dropped: torch.Tensor, n: int, newest_last: bool, deferred: bool) -> None:
        """Slot `dropped[b, h, 0]` of each head leaves the keys, values and positions: the last slot moves into it
        (one scatter for keys and values when they share a block). `newest_last`: the last slot holds the newest
        position (layer.seen - 1), scattered as a number. `deferred`: the merge group moves the key/value slot
        after its merge (until then keys and values are already the n - 1 slot prefix, whose dropped slot still
        holds the evicted token)."""
        if self.position_block is not None and self.position_block.holds(self._positions):
            self._positions = self.position_block.drop(dropped, n, last=layer.seen - 1 if newest_last else None)
        else:  # materialized at the first eviction (writable storage, not an expanded arange)
            self._positions = drop_one_slot(self.positions.contiguous(), dropped)
        if self.holds_kv(n):
            if deferred:
                self.group.defer(layer, dropped, n)
            else:
                self.kv_block.drop(dropped, n)
            self.keys, self.values = self.key_block.prefix(n - 1), self.value_block.prefix(n - 1)
        else:  # from copies: a prompt's keys and values may be shared (many plans' layers hold the same tensors)
            self.keys = drop_one_slot(self.keys.clone(), dropped)
            self.values = drop_one_slot(self.values.clone(), dropped)

    def gather(self, keep: torch.Tensor) -> None:
        """A cut: keep slots `keep` [b, h, k] of the keys, values and positions, each in storage of its own (the
        next step makes a block again)."""
        self._positions = gather_slots(self.positions, keep)
        self.keys, self.values = gather_slots(self.keys, keep), gather_slots(self.values, keep)
        self.free()

    def hide(self, padding: torch.Tensor) -> None:
        """Slots `padding` [b, h, n] hold room, no token (heads that keep fewer under a head-level split): at position
        -1, which no query sees (`polykv.runtime.attention_math.allowed`)."""
        self._positions = self.positions.masked_fill(padding, -1)
        self.padded = True

    def held(self) -> float:
        """Tokens held per KV head, measured: the slots less the padding, the mean over heads and rows (what varlen
        storage, as Ada-KV's, would hold)."""
        if not self.padded:
            return self.retained
        positions = self.positions
        return (positions >= 0).sum().item() / (positions.shape[0] * positions.shape[1])

    def held_per_head(self) -> list[float] | None:
        """Tokens each KV head holds (the mean over rows) where heads hold different numbers (`padded`), else None."""
        if not self.padded:
            return None
        return (self.positions >= 0).sum(dim=-1).double().mean(dim=0).tolist()

    def map_batch(self, fn) -> None:
        """Every tensor becomes `fn(tensor)` along the batch (beam search, a batch selected), in new storage."""
        self.keys, self.values = fn(self.keys), fn(self.values)
        self._positions = None if self._positions is None else fn(self._positions)
        self.free()  # new storage: a new block next step


def _room(layer, slots: int) -> int:
    """Slots of a new block for `slots` tokens: the decode method's capacity + interval, at least."""
    decode = layer.methods[Phase.DECODE]
    return max(slots, 0 if decode.capacity is None else decode.capacity + decode.interval)

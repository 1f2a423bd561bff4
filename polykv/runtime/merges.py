"""Merges done together: the layers of a routed cache that run one merging method with the same parameters
and capacity share one block of slot storage and merge, in one set of operations, once per decode step.

A merging method's one-slot decode step (D2O's, CaM's) is a dozen or more small operations, the same in
every layer, and on a decode step bound by host-side work they cost more than the layer's attention. So the
keys and values of such layers are the slices [:, i] of one [2, L, b, h, S, d] block (S = capacity + 1), and
each layer's step decides its eviction as usual but leaves its merge pending, and with it the move of its last
key/value slot and method state into the dropped slot (its positions move at once). Once the last of the
group's layers has run its step, the group merges every layer at once (`Method.merge_together`, over the
whole block), moves every layer's key/value slot with one scatter, and each layer's state. In between,
nothing reads a pending layer's keys, values or state (each later layer attends to its own), so every number
is the one the layer would produce merging alone, bit for bit. The pending work is done before the step
ends: between two forward passes nothing is pending.

Many plans in one batch (`polykv.runtime.many_plans`, whose rows already share padded storage) also let the
layers of a method that `merges_across_capacities` (D2O, whose native allocation gives every layer its own
capacity) share one block of the largest capacity + 1 slots: each merges over the block's first N slots, N the
most any layer holds, its own slots past its n being padding, and one gather and one scatter move every layer's
last slot. A routed cache alone keeps one capacity per block, so the KV memory it holds is what its plan says.

A group merges together only when every one of its layers left a merge, over the same number of slots unless
its block is padded; otherwise each pending merge runs alone (the same numbers, one layer at a time).
"""

from __future__ import annotations

import torch

from polykv.methods.slots import SlotBlock
from polykv.plan import Phase


class MergeGroup:
    """Layers that merge together: their block, which of them hold their slice, and the pending merges."""

    def __init__(self, owner: MergeGroups, members: list, storage: torch.Tensor):
        self.owner = owner  # the cache's groups, which list the groups with pending merges
        self.members = members
        self.methods = [layer.methods[Phase.DECODE] for layer in members]
        self.index = {layer: i for i, layer in enumerate(members)}
        self.block = SlotBlock(storage, dim=4)  # [2, L, b, h, S, d]: slots are dimension 4
        self.last_layer = max(layer.layer_idx for layer in members)
        self.slices: dict[int, SlotBlock] = {}  # member -> its slice, once handed out
        self.pending: dict[int, tuple[torch.Tensor, int]] = {}  # member -> (dropped slots [b, h, 1], slots n)
        self._lengths: dict[tuple[int, ...], torch.Tensor] = {}  # the members' slots, on the device, by value

    def hand_out(self, layer) -> SlotBlock:
        """The member's slice of the block: its keys and values [2, b, h, S, d]."""
        i = self.index[layer]
        self.slices[i] = SlotBlock(self.block.storage[:, i], dim=3)
        return self.slices[i]

    def handed(self, layer) -> bool:
        return self.index.get(layer) in self.slices

    def defer(self, layer, dropped: torch.Tensor, n: int) -> None:
        """Layer `layer`, holding n slots, evicts `dropped`: merge and move its slot later (`flush`)."""
        if not self.pending:
            self.owner.pending.append(self)
        self.pending[self.index[layer]] = (dropped, n)

    def waits_for(self, layer) -> bool:
        """Is a merge of this layer pending?"""
        return bool(self.pending) and self.index[layer] in self.pending

    def flush(self) -> None:
        """Do every pending merge and slot move: together when every member waits (over the same slots, unless
        the method merges across capacities)."""
        pending, self.pending = self.pending, {}
        if self in self.owner.pending:
            self.owner.pending.remove(self)
        sizes = tuple(pending[i][1] for i in range(len(self.members))) if len(pending) == len(self.members) else ()
        method, uniform = type(self.methods[0]), len(set(sizes)) == 1
        if sizes and (uniform or method.merges_across_capacities):
            dropped = torch.stack([pending[i][0] for i in range(len(self.members))])  # [L, b, h, 1]
            if uniform:
                method.merge_together(self.methods, self.block.prefix(sizes[0]), dropped)
                self.block.drop(dropped, sizes[0])
            else:
                lengths = self._lengths.get(sizes)
                if lengths is None:  # once per set of sizes: a steady step's never change (no copy to the device)
                    lengths = self._lengths[sizes] = torch.tensor(sizes, device=dropped.device)
                kv = self.block.prefix(max(sizes))
                method.merge_together(self.methods, kv, dropped, lengths)
                _drop_each(kv, dropped, lengths)
            for i, layer in enumerate(self.members):
                layer.drop_method_states(pending[i][0])
            return
        for i, (dropped, n) in pending.items():  # each alone
            kv = self.slices[i].prefix(n).unsqueeze(1)  # [2, 1, b, h, n, d]
            type(self.methods[i]).merge_together([self.methods[i]], kv, dropped.unsqueeze(0))
            self.slices[i].drop(dropped, n)
            self.members[i].drop_method_states(dropped)


def _drop_each(kv: torch.Tensor, dropped: torch.Tensor, lengths: torch.Tensor) -> None:
    """Layer i's last slot, lengths[i] - 1, moves into its dropped slot dropped[i] ([L, b, h, 1]), in every layer of
    kv [2, L, b, h, N, d] at once (what `SlotBlock.drop` does for one length)."""
    two, layers, b, h, _, d = kv.shape
    last = (lengths - 1).view(1, layers, 1, 1, 1, 1).expand(two, layers, b, h, 1, d)
    moved = kv.gather(4, last)  # a copy: the scatter below may write over a last slot (when it is the dropped one)
    kv.scatter_(4, dropped.view(1, layers, b, h, 1, 1).expand(two, layers, b, h, 1, d), moved)


class MergeGroups:
    """The merge groups of one routed cache, made when a layer first asks for a decode block."""

    def __init__(self, layers: list):
        self.layers = layers
        # layers of a method that merges across capacities share one padded block (set by many plans' batches)
        self.across_capacities = False
        self.groups: dict[tuple, MergeGroup] = {}
        self.pending: list[MergeGroup] = []  # groups with merges waiting

    def block_for(self, layer, slots: int) -> tuple[SlotBlock, MergeGroup] | None:
        """A slice of the block of the layer's group, for keys and values of `slots` slots each, or None
        when the layer merges alone (another method, an interval, a group of one, or not the steady
        block of capacity + 1 slots: the block after a long prompt would hold the whole prompt)."""
        key = _group_key(layer, self.across_capacities)
        if key is None or slots != layer.methods[Phase.DECODE].capacity + 1:
            return None
        group = self.groups.get(key)
        if group is not None and group.handed(layer):
            # asked again within the sequence (a new sequence forgets every group): after a cut, its slice is free
            return group.slices[group.index[layer]], group
        if group is None or layer not in group.index:
            members = [other for other in self.layers if _group_key(other, self.across_capacities) == key]
            if len(members) < 2:
                return None
            size = max(other.methods[Phase.DECODE].capacity for other in members) + 1  # padded when they differ
            storage = layer.keys.new_empty(2, len(members), *layer.keys.shape[:2], size, layer.keys.shape[-1])
            group = self.groups[key] = MergeGroup(self, members, storage)
        return group.hand_out(layer), group

    def layer_done(self, layer) -> None:
        """After a layer's step: flush the groups whose last layer it is."""
        for group in [g for g in self.pending if layer.layer_idx >= g.last_layer]:
            group.flush()

    def forget(self) -> None:
        """A new sequence: no group, nothing pending."""
        self.groups.clear()
        self.pending.clear()


def _group_key(layer, across_capacities: bool) -> tuple | None:
    """What layers merging together share: method, parameters and capacity (interval 1; any capacity, with
    `across_capacities`, for a method that merges across capacities), and the shape, dtype and device of their keys
    and values; None for a layer that merges alone."""
    method = layer.methods[Phase.DECODE]
    if not method.merges_together or method.interval != 1 or method.capacity is None or not layer.retained:
        return None
    keys, values = layer.keys, layer.values
    if keys.shape[-1] != values.shape[-1] or keys.dtype != values.dtype:
        return None  # keys and values live apart (`LayerSlots.write`)
    capacity = None if across_capacities and method.merges_across_capacities else method.capacity
    return (type(method), method.params, capacity, *keys.shape[:2], keys.shape[-1], keys.dtype, keys.device)

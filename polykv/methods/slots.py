"""Slot storage of static-shape decode: a block of capacity + interval slots and its prefix views, and the
store of a method's per-slot state built on them (`SlotStates`).

Slot tensors ([b, h, n, ...]: keys, values, positions, per-slot method state) of an evicting layer are
prefix views of a block along their slot dimension. A step writes its new token into the slot after
the prefix and a one-slot eviction moves the last slot into the dropped one, so a steady decode step
allocates nothing and shapes stay fixed.

Views are cached by length: a steady step alternates between capacity + 1 and capacity slots, so it
creates no view objects (slicing alone costs several dispatcher calls per tensor on the CPU, and these
run for every layer at every step), and a tensor's identity with a view handed out says whether it
still lives in the block (identity, not data_ptr(), so that torch.compile can trace the check). Each
cache keeps the `CACHED_VIEWS` views used last: a layer that keeps everything in reserved room asks for a
new length at every step, and keeping every view it was handed grew 54 plans' batch by about 1,750 views
(1 MB) a step, for as long as a generation ran (benchmarks/README.md, `many_plans_scaling.py --held`).
"""

from __future__ import annotations

import weakref

from polykv.lazy import torch

# Views each cache of a block keeps, the least recently used going first: a steady step uses two lengths (capacity
# and capacity + 1; interval + 1 of them with an eviction interval), so an interval under this finds its views, and
# a larger one makes a view or two per step (about 2 us each). Thousands of blocks: each view is about 600 bytes.
CACHED_VIEWS = 16


class SlotBlock:
    """Storage of `size` slots along dimension `dim`, handing out cached prefix and span views."""

    def __init__(self, storage: torch.Tensor, dim: int = 2):
        self.storage = storage
        self.dim = dim
        self.size = storage.shape[dim]
        self._views: dict[tuple[int, int], torch.Tensor] = {}
        self._prefixes: dict[int, torch.Tensor] = {}  # by length: the views asked for most
        self._refused: dict[int, bool] = {}  # see `_overlap_refused`

    @classmethod
    def around(cls, tensor: torch.Tensor, size: int, dim: int = 2) -> SlotBlock:
        """A new block of `size` slots whose prefix holds a copy of `tensor`."""
        shape = list(tensor.shape)
        shape[dim] = size
        block = cls(tensor.new_empty(shape), dim)
        block.prefix(tensor.shape[dim]).copy_(tensor)
        return block

    def span(self, start: int, stop: int) -> torch.Tensor:
        views = self._views
        view = views.pop((start, stop), None)  # put back last below: the most recently used
        if view is None:
            view = self.storage.narrow(self.dim, start, stop - start)
            _make_room(views)
        views[start, stop] = view
        return view

    def prefix(self, n: int) -> torch.Tensor:
        views = self._prefixes
        view = views.pop(n, None)
        if view is None:
            view = self.storage.narrow(self.dim, 0, n)
            _make_room(views)
        views[n] = view
        return view

    def holds(self, tensor: torch.Tensor | None, room: int = 0) -> bool:
        """Is `tensor` the prefix view this block handed out, with room for `room` slots in all?"""
        if tensor is None or room > self.size:
            return False
        return tensor is self._prefixes.get(tensor.shape[self.dim])

    def drop(self, dropped: torch.Tensor, n: int, last: int | None = None) -> torch.Tensor:
        """Drop slot `dropped[..., b, h, 0]` of each head from the n-slot prefix: the last slot moves into it.
        Returns the (n - 1)-slot prefix. `last`: the last slot's value when the caller knows it (a
        position), scattered as a number.

        The last slot is scattered straight from its view of the block: each head's element is read once
        and written once, into another slot or (when the last slot itself goes) onto itself. Torch refuses
        such a scatter when the source and the written tensor are both dense (its overlap check then
        sees a partial overlap, e.g. one head of one sequence), so only then is the moved slot copied
        first."""
        live = self.prefix(n)
        moved = self.span(n - 1, n) if last is None else last
        if last is None and self._overlap_refused(n):
            moved = moved.clone()
        live.scatter_(self.dim, slot_index(dropped, live, self.dim), moved)
        return self.prefix(n - 1)

    def _overlap_refused(self, n: int) -> bool:
        """Would torch refuse to scatter the n-slot prefix's last slot into it? (Known per length.)"""
        refused = self._refused.get(n)
        if refused is None:
            refused = self._refused[n] = _dense(self.prefix(n)) and _dense(self.span(n - 1, n))
        return refused


class SlotStates(dict):
    """A method's per-slot state, {name: [b, h, n, ...] tensor} (`Method.per_token`), and the storage each
    lives in: a tensor grown by a decode step stays a prefix view of a block with room to grow into, and a
    one-slot drop moves the last slot into the dropped one there (`SlotBlock`), so neither reallocates. A
    tensor stored by plain assignment (a gather, a new prompt) lives in no block until it next grows.

    The method writes its own states (by name); the runtime moves them with the cache's slots only through
    `drop_one`, `gather`, `map_batch` and `clear`, so that no state is left behind when slots move. A method that
    holds work not yet folded into its states (Scissorhands' deferred rows) sets `before_move` (a weak reference to
    a method of it, so that the method and its store make no cycle), which each of the first three calls first.
    Many plans' rows may also keep one state in storage they share and drop by it together (`adopt`,
    `dropped_together`, `polykv.runtime.row_storage`): only a store without `before_move`."""

    def __init__(self) -> None:
        super().__init__()
        self._blocks: dict[str, SlotBlock] = {}  # name -> the block its tensor was last handed out from
        self.before_move: weakref.WeakMethod | None = None

    def grow(self, name: str, q: int, fill: float | bool | None, room: int | None) -> torch.Tensor:
        """`self[name]` extended by q new (last) slots set to `fill` (None: for the caller to write), stored
        back and returned. In place while it is still the view of its block this store handed out and the
        block has room; else copied into a new block of max(n + q, `room`) slots (`room` None, a layer without a
        capacity: exactly n + q)."""
        tensor = self[name]
        n = tensor.shape[2]
        block = self._blocks.get(name)
        if not (room is not None and block is not None and block.holds(tensor, n + q)):
            block = self._blocks[name] = SlotBlock.around(tensor, n + q if room is None else max(n + q, room))
        if fill is not None:
            block.span(n, n + q).fill_(fill)
        out = self[name] = block.prefix(n + q)
        return out

    def adopt(self, name: str, block: SlotBlock) -> None:
        """`self[name]` copied into the prefix of `block` (its slice of storage other layers' rows share,
        `polykv.runtime.row_storage`), where it then grows and drops as in a block of its own."""
        tensor = self[name]
        block.prefix(tensor.shape[2]).copy_(tensor)
        self._blocks[name] = block
        self[name] = block.prefix(tensor.shape[2])

    def lives_in(self, name: str, block: SlotBlock) -> bool:
        """Is `self[name]` the prefix view of `block`?"""
        return self._blocks.get(name) is block and block.holds(self.get(name))

    def dropped_together(self, name: str, n: int) -> None:
        """Of the n slots of `self[name]`, one left each head in its block (many rows' at once): the state becomes
        the block's n - 1 slot prefix."""
        self[name] = self._blocks[name].prefix(n - 1)

    def drop_one(self, dropped: torch.Tensor) -> None:
        """Slot `dropped[b, h, 0]` of every head leaves every state (the runtime dropped it from the cache): in the
        state's block when it lives in one, the last slot moving into it."""
        self._settle()
        for name, tensor in self.items():
            block = self._blocks.get(name)
            if block is not None and block.holds(tensor):
                self[name] = block.drop(dropped, tensor.shape[2])
            else:
                self[name] = drop_one_slot(tensor, dropped)

    def gather(self, keep: torch.Tensor, held: int) -> None:
        """A cut: of the `held` slots the layer held, every state keeps slots `keep` [b, h, k], in storage of its
        own (it lives in no block until it next grows).

        Mid-step (a local layer's window, before the method has seen the step's new slots) a state covers only the
        slots held before the step, the first ones: it keeps the indices among them (the new slots, last, are
        always kept)."""
        self._settle()
        for name, tensor in self.items():
            own = keep if tensor.shape[2] == held else keep[..., : keep.shape[-1] - (held - tensor.shape[2])]
            self[name] = gather_slots(tensor, own)

    def map_batch(self, fn) -> None:
        """Every state becomes `fn(state)` (a batch reordered, repeated or selected), in storage of its own."""
        self._settle()
        for name, tensor in self.items():
            self[name] = fn(tensor)

    def _settle(self) -> None:
        settle = None if self.before_move is None else self.before_move()
        if settle is not None:
            settle()

    def clear(self) -> None:
        """Forget every state and its storage (a new prompt, or the prefill method once done)."""
        super().clear()
        self._blocks.clear()


def drop_one_slot(tensor: torch.Tensor, dropped: torch.Tensor) -> torch.Tensor:
    """Remove slot `dropped[b, h, 0]` of each head of a [b, h, n, ...] tensor that lives in no block, in
    place: the last slot moves into it."""
    return SlotBlock(tensor).drop(dropped, tensor.shape[2])


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


def slot_index(dropped: torch.Tensor, like: torch.Tensor, dim: int = 2) -> torch.Tensor:
    """The [..., b, h, 1] slot indices `dropped`, shaped as a scatter index into `like` along `dim` (the
    dimensions of `dropped` but its last are those just before `dim`: batch and heads, and layers for a
    block of many layers)."""
    if like.dim() == 3 and dim == 2:
        return dropped
    shape = (1,) * (dim + 1 - dropped.dim()) + tuple(dropped.shape) + (1,) * (like.dim() - dim - 1)
    return dropped.view(shape).expand(*like.shape[:dim], 1, *like.shape[dim + 1 :])


def _dense(tensor: torch.Tensor) -> bool:
    """Does `tensor` cover its memory without gaps or overlaps, in some order of its dimensions? (What
    torch's overlap check calls non-overlapping and dense: only between two such tensors does it compare
    memory ranges, and refuse a partial overlap.)"""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(tensor.shape, tensor.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _make_room(views: dict) -> None:
    """Room for one more view in a cache of at most `CACHED_VIEWS`: the least recently used goes (a dict keeps
    insertion order, and a view is put back last each time it is used)."""
    if len(views) >= CACHED_VIEWS:
        del views[next(iter(views))]

"""Slot storage of static-shape decode: a block of capacity + interval slots and its prefix views.

Slot tensors ([b, h, n, ...]: keys, values, positions, per-slot method state) of an evicting layer are
prefix views of a block along their slot dimension. A step writes its new token into the slot after
the prefix and a one-slot eviction moves the last slot into the dropped one, so a steady decode step
allocates nothing and shapes stay fixed.

Views are cached by length: a steady step alternates between capacity + 1 and capacity slots, so it
creates no view objects (slicing alone costs several dispatcher calls per tensor on the CPU, and these
run for every layer at every step), and a tensor's identity with a view handed out says whether it
still lives in the block (identity, not data_ptr(), so that torch.compile can trace the check).
"""

from __future__ import annotations

from polykv.lazy import lazy_import

torch = lazy_import("torch")


class SlotBlock:
    """Storage of `size` slots along dimension `dim`, handing out cached prefix and span views."""

    def __init__(self, storage: torch.Tensor, dim: int = 2):
        self.storage = storage
        self.dim = dim
        self.size = storage.shape[dim]
        self._views: dict[tuple[int, int], torch.Tensor] = {}

    @classmethod
    def around(cls, tensor: torch.Tensor, size: int, dim: int = 2) -> SlotBlock:
        """A new block of `size` slots whose prefix holds a copy of `tensor`."""
        shape = list(tensor.shape)
        shape[dim] = size
        block = cls(tensor.new_empty(shape), dim)
        block.prefix(tensor.shape[dim]).copy_(tensor)
        return block

    def span(self, start: int, stop: int) -> torch.Tensor:
        view = self._views.get((start, stop))
        if view is None:
            view = self._views[start, stop] = self.storage.narrow(self.dim, start, stop - start)
        return view

    def prefix(self, n: int) -> torch.Tensor:
        return self.span(0, n)

    def holds(self, tensor: torch.Tensor | None, room: int = 0) -> bool:
        """Is `tensor` the prefix view this block handed out, with room for `room` slots in all?"""
        if tensor is None:
            return False
        n = tensor.shape[self.dim]
        return max(n, room) <= self.size and tensor is self._views.get((0, n))

    def drop(self, dropped: torch.Tensor, n: int, last: int | None = None) -> torch.Tensor:
        """Drop slot `dropped[b, h, 0]` of each head from the n-slot prefix: the last slot moves into it.
        Returns the (n - 1)-slot prefix. `last`: the last slot's value when the caller knows it (a
        position), scattered as a number. (Otherwise the moved slot is copied first: torch refuses a
        scatter from a view of the tensor it writes for some layouts, even where no element is both read
        and written.)"""
        live = self.prefix(n)
        moved = self.span(n - 1, n).clone() if last is None else last
        live.scatter_(self.dim, slot_index(dropped, live, self.dim), moved)
        return self.prefix(n - 1)


def drop_one_slot(tensor: torch.Tensor, dropped: torch.Tensor) -> torch.Tensor:
    """Remove slot `dropped[b, h, 0]` of each head of a [b, h, n, ...] tensor that lives in no block, in
    place: the last slot moves into it."""
    return SlotBlock(tensor).drop(dropped, tensor.shape[2])


def slot_index(dropped: torch.Tensor, like: torch.Tensor, dim: int = 2) -> torch.Tensor:
    """The [b, h, 1] slot indices `dropped`, shaped as a scatter index into `like` along `dim` (batch and
    heads are the two dimensions before `dim`)."""
    if like.dim() == 3 and dim == 2:
        return dropped
    shape = (1,) * (dim - 2) + tuple(dropped.shape) + (1,) * (like.dim() - dim - 1)
    return dropped.view(shape).expand(*like.shape[:dim], 1, *like.shape[dim + 1 :])

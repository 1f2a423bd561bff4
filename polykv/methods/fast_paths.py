"""What only the runtime's speed paths ask of a method (`FastPaths`, which `Method` inherits): a one-slot decode drop
for many plans' rows at once (`polykv.runtime.row_storage`) and one-slot merges for many layers at once
(`polykv.runtime.merges`). A method that sets none of them runs each layer's step alone, with the same results.

A merging method that sets `merges_together` (D2O, CaM) may leave a one-slot step's merge to the runtime, which then
merges every layer of the same method, parameters and capacity (in many plans' batches any capacity, if it
`merges_across_capacities`) at once after the step's last of them (`merge_together`): the view's `defer_merge` says
when it may, the eviction's `merge_deferred` that it did."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch


class FastPaths:
    """The defaults: every layer steps and merges alone."""

    name: ClassVar[str]

    merges_together: ClassVar[bool] = False  # its one-slot merges can run for many layers at once (`merge_together`)
    merges_across_capacities: ClassVar[bool] = False  # ... and layers of different capacities (`lengths`)

    # A decode step dropping one slot, for many layers' rows at once (`polykv.runtime.row_storage`): a classmethod
    # (params, rows, positions, capacity, newest, state) -> (score, protected), `step` dropping the lowest score not
    # `protected`. rows [G, h*g, 1, n] the step's attention, positions [G, h, n] (every row n = capacity + 1 slots),
    # newest: the new token's position, state [G, h, n]: the rows' `one_slot_state` (None: none; this step's slot
    # at 0, as `grow` starts it), updated in place as `step` does. score [G, h or 1, n], protected [G, h, n] or
    # None. None: each layer steps alone.
    one_slot_scores = None
    one_slot_state: ClassVar[str | None] = None

    @classmethod
    def merge_together(cls, methods: list[FastPaths], kv: torch.Tensor, dropped: torch.Tensor, lengths=None) -> None:
        """The merges of one-slot steps that layers left to the runtime (`LayerView.defer_merge`), all at once,
        with the numbers of each layer merging alone: layer i (`methods[i]`, all with the same parameters) holds
        keys and values kv[:, i] ([2, L, b, h, N, d], merged in place), its first `lengths[i]` slots (None: all
        N; the rest is padding, `merges_across_capacities`), and evicts slot dropped[i, b, h, 0] ([L, b, h, 1]);
        its per-slot state is still that of its step (the runtime moves the slots and the state afterwards)."""
        raise NotImplementedError(f"{cls.name} merges each layer alone")

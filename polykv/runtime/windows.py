"""A local layer's sliding window (Gemma 3's and Mistral's local layers): which held slots a later query can still
see, and how a step's view follows when the layer drops the others (`RoutedLayer.keep_window`).

Storage is rectangular ([b, h, n, d]): when heads (or rows) keep different numbers of visible slots (their methods
kept different tokens), one with fewer keeps its newest hidden ones as padding, which the window mask hides from
every query, which its method evicts first (`LayerView.hidden`), and which leave as soon as no head needs the room.
(A merging method, CaM or D2O, merges an evicted padding slot into the slots it keeps as it does any evicted
token, where alone the window would have dropped it: the one place a padded row differs from the row alone;
tests/test_hybrid_attention.py checks the slots kept.)
"""

from __future__ import annotations

from dataclasses import replace

import torch

from polykv.methods.base import LayerView


def window_cut(positions: torch.Tensor, seen: int, window: int) -> tuple[torch.Tensor | None, torch.Tensor, bool]:
    """Of the slots at `positions` [b, h, n], after `seen` tokens: the slots to keep [b, h, k] (None: all of them),
    which of the kept ones are visible [b, h, k], and whether every kept slot is (the layer is `window_clean`).
    A slot is visible while its position is above seen - window; each head keeps as many slots as the head that
    sees the most: its visible ones first, then its newest hidden ones, in ascending slot order (the newest last)."""
    visible = positions > seen - window  # [b, h, n]
    fewest, k = torch.stack(visible.sum(dim=-1).aminmax()).tolist()  # one host read per step
    if k == positions.shape[-1]:
        return None, visible, fewest == k
    rank = positions + visible.to(positions.dtype) * (seen + 1)
    keep = rank.topk(k, dim=-1, sorted=False).indices.sort(dim=-1).values
    return keep, visible.gather(-1, keep), fewest == k


def windowed_view(view: LayerView, layer, keep: torch.Tensor | None, visible: torch.Tensor, clean: bool) -> LayerView:
    """This step's view after the layer kept slots `keep` (`window_cut`): its tensors, signals and positions
    follow the cut, and the slots no query can see are `hidden`."""
    hidden = None if clean else ~visible
    if keep is None:
        return view if hidden is None else replace(view, hidden=hidden)
    index = keep.repeat_interleave(view.num_kv_groups, dim=1)  # [b, h*g, k]: each query head's slots
    rows = view.rows
    if rows is not None:
        rows = rows.gather(-1, index[:, :, None, :].expand(-1, -1, rows.shape[2], -1))
    sums = None if view.column_sums is None else view.column_sums.gather(-1, index)
    return replace(
        view,
        keys=layer.keys,
        values=layer.values,
        positions=layer.positions,
        rows=rows,
        column_sums=sums,
        kv=None,
        defer_merge=False,
        hidden=hidden,
        fresh=False,
    )


def room_hidden(view: LayerView, positions: torch.Tensor) -> LayerView:
    """`view` with the slots that hold room, no token (a head-level split's padding at position -1,
    `polykv.methods.head_budgets`), marked `hidden` beside any the window hides."""
    room = positions < 0
    return replace(view, hidden=room if view.hidden is None else view.hidden | room)

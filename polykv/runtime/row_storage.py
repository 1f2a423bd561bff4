"""One layer's keys and values for many plans' rows in shared blocks, so that their decode attention is one call.

Many plans stepping together (`polykv.runtime.many_plans`) give each plan's layer its own slots. Attending row
by row costs a dozen small operations per row and layer; a batch of 54 plans spends most of its step there.
So at a batch's first decode step each layer puts its rows' keys and values into a few blocks [2, rows, h, S, d],
and the positions of those that evict into [rows, h, S] beside them (`SharedRows`), rows of similar room
together: rows whose room (`S_i` slots: capacity + interval for a layer that evicts, what `reserve` gave a layer
that keeps everything) is within a factor sqrt(2) share a block of the largest's. A row that still holds more
(a decode-only plan's whole prompt, before its first cut) moves in at its first write after the cut. Each row's
`LayerSlots` holds its slices of a block as its own blocks (`polykv.runtime.slots`): its writes, drops and views
are the same operations as in blocks of its own, and its method sees its own [b, h, n_i, d] prefix. A cut gives
a row storage of its own; its next write copies it back into its slices.

A decode step then attends for every row of a block at once (`attend_block`): one query per row over the
block's first N = max n_i slots, each row's slots past its own n_i masked out (probability exactly 0; the slots
hold finite numbers, zeros or old tokens, so the masked products add exact zeros). The output and each
row's probabilities equal the row's own up to float rounding (a longer reduction may round differently), as
a batch's matrix products always may.

Rows whose step drops one slot by a score (`RoutedLayer.drops_one_by_score`: TOVA, StreamingLLM and H2O, one slot
over the capacity) drop theirs together, per method, parameters and length (`drop_together`): the scores of all of
them at once (`Method.one_slot_scores`), then a few operations move every row's last slot into its dropped one. One
length, because a score that sums over a KV head's query heads may round by the length it sums (a CPU's sum over 5
or more does), and each row must drop the slot its own step would. A lone row steps by itself (`TOGETHER_AT_LEAST`):
the group's fixed cost is more than one row's own step. A method that scores by a per-slot state (H2O's
accumulated attention, its `one_slot_state`) keeps that state in the block too ([rows, h, S] beside the positions),
where the step updates every row's at once; each row's method sees its own prefix of it, as of its other states.

Rows that stay out: a layer whose decode method merges together across layers (D2O, CaM at interval 1: their
layers share one block per plan, `polykv.runtime.merges`), keys and values of different sizes, and a layer that
keeps everything without reserved room (it grows by concatenation). They attend row by row, as before.
"""

from __future__ import annotations

import math

import torch

from polykv.methods.slots import SlotBlock
from polykv.plan import Phase
from polykv.runtime.attention import listening
from polykv.runtime.attention_math import decode_output
from polykv.runtime.attention_step import Path, choose_path, finish_with_row

# Rows whose rooms differ by less than this factor share a block (sized for the largest): at most ~41% of a
# block is padding, and a batch of plans at budgets 64 ... 512 needs about six blocks per layer.
_ROOM_RATIO = math.sqrt(2)
# Rows of one method, parameters and length in a block drop together from this many on; fewer step alone (cheaper
# than the dozen operations of `drop_together`: benchmarks/README.md, "Rows that drop together").
TOGETHER_AT_LEAST = 2


class SharedRows:
    """The shared blocks of one layer of a batched step: which rows live in which block, at which row."""

    def __init__(self, layers: list, width: int):
        self.layers = layers
        self.width = width  # sequences per plan (rows per layer)
        self.home: dict[int, tuple[Block, int]] = {}  # layer position -> (its block, its first row there)
        self._positions = {id(layer): i for i, layer in enumerate(layers)}
        rooms = {i: room for i, layer in enumerate(layers) if (room := _room_of(layer)) is not None}
        for layer in layers:
            layer.shared_rows = None
        for members in _by_room(rooms):
            block = Block(self, members, max(rooms[i] for i in members))
            for j, i in enumerate(members):
                self.home[i] = (block, j * width)
                layers[i].shared_rows = self
                if layers[i].retained < block.size:  # else (a whole prompt before its first cut): after its cut
                    block.move_in(layers[i], j * width)
        self.blocks = list({id(block): block for block, _ in self.home.values()}.values())

    def block_for(self, layer, slots: int) -> tuple[SlotBlock, SlotBlock] | None:
        """The layer's slices again (keys and values, positions), for `slots` slots (after a cut gave it storage
        of its own), or None when it has none or they are too small."""
        i = self._position(layer)
        if i is None:
            return None
        block, row = self.home[i]
        if slots > block.size:
            return None
        return block.slice(row), block.position_slice(row)

    def _position(self, layer) -> int | None:
        i = self._positions.get(id(layer))
        return i if i in self.home else None


class Block:
    """Keys and values of several rows of one layer, [2, rows, h, S, d], and their positions [rows, h, S]."""

    def __init__(self, owner: SharedRows, members: list[int], size: int):
        first = owner.layers[members[0]]
        keys = first.keys
        self.owner = owner
        self.members = members  # positions of the rows' layers in `owner.layers`, in block order
        self.size = size
        rows = len(members) * owner.width
        # zeros: a masked slot's value is multiplied by an exact 0, which must meet a finite number
        self.storage = keys.new_zeros(2, rows, keys.shape[1], size, keys.shape[-1])
        self.positions = torch.zeros(rows, keys.shape[1], size, dtype=torch.long, device=keys.device)
        self._slices: dict[int, SlotBlock] = {}
        self._position_slices: dict[int, SlotBlock] = {}
        self._query_index: torch.Tensor | None = None
        self.states: dict[str, torch.Tensor] = {}  # name -> [rows, h, S]: a per-slot state its rows drop by
        self._state_slices: dict[tuple[str, int], SlotBlock] = {}
        self._drop_indices: dict[tuple, DropIndex] = {}

    def query_index(self, device) -> torch.Tensor:
        """The batch rows of the block's rows, in block order."""
        if self._query_index is None:
            width = self.owner.width
            rows = [i * width + k for i in self.members for k in range(width)]
            self._query_index = torch.tensor(rows, device=device)
        return self._query_index

    def slice(self, row: int) -> SlotBlock:
        block = self._slices.get(row)
        if block is None:
            block = self._slices[row] = SlotBlock(self.storage[:, row : row + self.owner.width], dim=3)
        return block

    def holds(self, layer, row: int) -> bool:
        """Do the layer's keys, values and positions live in their slices of this block, at block row `row`?"""
        return layer.slots.lives_in(self.slice(row), self.position_slice(row))

    def position_slice(self, row: int) -> SlotBlock:
        block = self._position_slices.get(row)
        if block is None:
            block = self._position_slices[row] = SlotBlock(self.positions[row : row + self.owner.width])
        return block

    def drop_index(self, rows: tuple[int, ...], n: int) -> DropIndex:
        """`drop_together`'s indices for these block rows, each holding n slots (a steady step asks for the same)."""
        index = self._drop_indices.get((rows, n))
        if index is None:
            if len(self._drop_indices) >= 64:  # rows cut or moved: forget the old ones
                self._drop_indices.clear()
            heads = self.positions.shape[1]
            index = self._drop_indices[rows, n] = DropIndex(rows, n, heads, self.size, self.positions.device)
        return index

    def holds_state(self, layer, row: int) -> bool:
        """Does the layer's decode method's `one_slot_state` (if any) live in its slice of this block's storage for
        it, [rows, h, S] fp32? Moved in if the method holds it for the slots before this step's new token (once
        after each cut: a cut gives states storage of their own). The rows' per-slot states must live beside their
        keys for `drop_together` to move them together."""
        method = layer.method
        name = type(method).one_slot_state
        if name is None:
            return True
        states = method.per_token
        held = states.get(name)
        stale = held is None or held.shape[2] != layer.retained - 1 or held.dtype != torch.float32
        if stale or states.before_move is not None:  # (work not yet folded into the state: it steps alone)
            return False
        block = self._state_slices.get((name, row))
        if block is None:
            storage = self.states.get(name)
            if storage is None:
                storage = self.states[name] = self.positions.new_zeros(self.positions.shape, dtype=torch.float32)
            block = self._state_slices[name, row] = SlotBlock(storage[row : row + self.owner.width])
        if not states.lives_in(name, block):
            states.adopt(name, block)
        return True

    def move_in(self, layer, row: int) -> None:
        """The layer's keys, values and positions now live in its slices (a copy of what it holds; a layer that
        keeps everything keeps no positions)."""
        positions = None if layer.methods[Phase.DECODE].passive else self.position_slice(row)
        layer.slots.adopt_block(self.slice(row), positions)


class DropIndex:
    """Where `drop_together`'s rows (n slots each) live in their block's flattened slots: slot s of head k of block
    row r is element (r * h + k) * S + s. `first` [G, h] each head's slot 0, `last` [G * h] its last slot (made
    once: no host-to-device copy at each step)."""

    def __init__(self, rows: tuple[int, ...], n: int, heads: int, size: int, device):
        self.rows = torch.tensor(rows, device=device)
        self.first = (self.rows[:, None] * heads + torch.arange(heads, device=device)) * size
        self.last = (self.first + (n - 1)).view(-1)


def _room_of(layer) -> int | None:
    """Slots the layer's decode steps need room for, or None when it stays out (see the module docstring)."""
    slots = layer.slots
    n = slots.retained
    if n == 0 or slots.keys.shape[-1] != slots.values.shape[-1] or slots.keys.dtype != slots.values.dtype:
        return None
    decode = layer.methods[Phase.DECODE]
    if decode.passive:
        block = slots.kv_block
        return block.size if block is not None and slots.holds_kv(n) and block.size > n else None
    if decode.merges_together and decode.interval == 1:
        return None
    # what its steps hold once it has cut to its capacity: a decode-only plan holds the whole prompt until then
    return None if decode.capacity is None else decode.capacity + decode.interval


def _by_room(rooms: dict[int, int]) -> list[list[int]]:
    """Rows grouped so that each group's rooms lie within `_ROOM_RATIO` of its smallest; in row order within one."""
    groups: list[list[int]] = []
    smallest = 0
    for i in sorted(rooms, key=lambda i: (rooms[i], i)):
        if not groups or rooms[i] > smallest * _ROOM_RATIO:
            groups.append([])
            smallest = rooms[i]
        groups[-1].append(i)
    return [sorted(group) for group in groups]


def attend_block(block: Block, query: torch.Tensor, lengths: list[int], scaling: float):
    """Every row of the block attending with one query each: `query` [rows, h*g, 1, d] in block order, row r
    over its first `lengths[r]` slots. Returns the output [rows, 1, h*g, dv] and the probabilities
    [rows, h, g, N] (fp32; N = max(lengths), each row's slots past its length 0)."""
    n = max(lengths)
    keys, values = block.storage[0, :, :, :n], block.storage[1, :, :, :n]  # [rows, h, N, d]
    output, probs = decode_output(query, keys, values, scaling, lengths)
    return output, probs.view(query.shape[0], keys.shape[1], -1, n)


def attend_shared(shared: SharedRows, module, query, dropout: float, scaling: float, kwargs) -> dict[int, torch.Tensor]:
    """A one-query step of every row whose keys and values are in its slice of a block and whose step takes
    its output from one softmax row (`Path.IDLE_ROW` or `Path.FUSED_DECODE`): one attention call per block,
    then each row's methods see their own probabilities and evict, as in `attend`. `query` [rows, h*g, 1, d]
    in batch order. Returns {layer position: its output [width, 1, h*g, dv]}; the other rows are left to
    attend alone."""
    window = kwargs.get("sliding_window")
    recording = bool(listening())
    width = shared.width
    outputs: dict[int, torch.Tensor] = {}
    for block in shared.blocks:
        ready: list[tuple[int, int, Path, object]] = []  # (row in block, layer position, path, needs)
        lengths = []
        for j, i in enumerate(block.members):
            layer = shared.layers[i]
            layer.window = window
            n = layer.retained
            slots = layer.slots
            path = None
            if slots.kv_block is block.slice(j * width) and slots.holds_kv(n):
                needs = layer.needs()
                path = choose_path(layer, 1, window, dropout, kwargs, True, needs, recording)
            if path is Path.IDLE_ROW or path is Path.FUSED_DECODE:
                ready.append((j, i, path, needs))
                lengths.extend([n] * width)
            else:
                lengths.extend([1] * width)  # computed and left unused: the row attends alone
        if not ready:
            continue
        block_query = query.index_select(0, block.query_index(query.device))
        output, probs = attend_block(block, block_query, lengths, scaling)
        qh = query.shape[1]
        # (method class, parameters, slots held) -> [(row, layer, needs)]: rows of one length, as a sum over a KV
        # head's query heads may round by the length of what it sums (a CPU's sum over 5 or more of them does)
        together: dict[tuple, list[tuple[int, object, object]]] = {}
        for j, i, path, needs in ready:
            rows = slice(j * width, (j + 1) * width)
            outputs[i] = output[rows]
            layer = shared.layers[i]
            if path is Path.IDLE_ROW:
                layer.keep_window()
                continue
            if width == 1 and layer.drops_one_by_score() and block.holds(layer, j) and block.holds_state(layer, j):
                key = (type(layer.method), layer.method.params, layer.retained)
                together.setdefault(key, []).append((j, layer, needs))
                continue
            _finish_alone(layer, module, needs, probs[rows], width, qh)
        for (cls, params, _), members in together.items():
            if len(members) >= TOGETHER_AT_LEAST:
                drop_together(block, [(j, layer) for j, layer, _ in members], cls, params, probs)
            else:
                for j, layer, needs in members:
                    _finish_alone(layer, module, needs, probs[j : j + 1], width, qh)
    return outputs


def _finish_alone(layer, module, needs, probs: torch.Tensor, width: int, qh: int) -> None:
    """The row's own method step, with its probabilities (`probs` [width, h, g, N] of the block, N >= its n)."""
    finish_with_row(layer, module, layer.keys, layer.values, needs, probs[..., : layer.retained], width, qh)


def drop_together(block: Block, members: list, cls, params, probs: torch.Tensor) -> None:
    """Rows of one method class, parameters and length (`members`: (row in the block, its layer), each layer one
    slot over its capacity, `RoutedLayer.drops_one_by_score`) drop their slot of lowest one-slot score at once: the
    scores for all of them (`Method.one_slot_scores`; a method's `one_slot_state` updated for all of them), then
    each row's last slot moves into its dropped one (keys, values, positions and that state: a few operations for
    every row). The same slots and state as each layer's own `step` and `_drop_one`; `probs` [rows, h, g, N'] the
    step's, N' >= n."""
    first_layer = members[0][1]
    n = first_layer.retained  # every member's: one slot over the one capacity
    index = block.drop_index(tuple(j for j, _ in members), n)
    rows, first, last = index.rows, index.first, index.last
    newest = first_layer.seen - 1  # every row's new token, in its last slot
    positions = block.positions.index_select(0, rows)[..., :n]  # [G, h, N]
    count, h = positions.shape[:2]
    name = cls.one_slot_state
    state = None
    if name is not None:
        states = block.states[name]
        states.view(-1).index_fill_(0, last, 0.0)  # the new token's slot starts at 0 (`Method.grow`)
        state = states.index_select(0, rows)[..., :n]
    attention = probs.index_select(0, rows)[..., :n].view(count, -1, 1, n)  # [G, h*g, 1, N]
    score, protected = cls.one_slot_scores(params, attention, positions, n - 1, newest, state)
    if state is not None:
        states[..., :n].index_copy_(0, rows, state)
    if protected is not None:
        score = score.masked_fill(protected, float("inf"))
    dropped = score.argmin(dim=-1).expand(count, h)  # [G, h]
    gone = (first + dropped).view(-1)
    kv = block.storage.view(2, -1, block.storage.shape[-1])
    kv.index_copy_(1, gone, kv.index_select(1, last))
    block.positions.view(-1).index_fill_(0, gone, newest)
    if state is not None:
        flat = states.view(-1)
        flat.index_copy_(0, gone, flat.index_select(0, last))
    for _, layer in members:
        layer.dropped_together()

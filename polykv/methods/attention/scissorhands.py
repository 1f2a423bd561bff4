"""Scissorhands: drop the tokens that were unimportant most often in a recent history window.

Liu, Desai, Liao, Wang, Xie, Xu, Kyrillidis, Shrivastava. "Scissorhands: Exploiting the Persistence of
Importance Hypothesis for LLM KV Cache Compression at Test Time." NeurIPS 2023, arXiv:2305.17118
(code: lzcemma/Scissorhands).
"""

from __future__ import annotations

import functools
import struct
import weakref

from pydantic import BaseModel

from polykv.lazy import torch
from polykv.methods.base import NOTHING, LayerView, Method, Needs
from polykv.methods.eviction import Eviction, evict_lowest
from polykv.methods.params import MethodParams, Real, real, tokens
from polykv.methods.shared import recent_mask
from polykv.plan import Phase

# A history of up to this many queries is allowed at any capacity (the authors' 100 included).
HISTORY_ALWAYS_ALLOWED = 128
# Decode steps whose flags wait to be computed together (`Scissorhands._defer`), at most: their rows take 4 bytes
# each per slot and KV head while they wait (the flags take `history` bytes).
DEFERRED_ROWS = 16
# Rows at least this long, with at least this many entries in all, take their top-k from numpy (`_largest`); below
# either, torch's own is as fast or faster (one core of a 2-core EPYC: even at 16 rows of 512, torch's at 2 of 1,024)
_SELECT_LONG_ROWS, _SELECT_MANY_ENTRIES = 512, 8192
_SELECT_BLOCK_ENTRIES = 1 << 16  # rows whose copy numpy partitions at once: 256 KiB of them


class ScissorhandsParams(MethodParams):
    history: int = tokens(
        100,
        ge=1,
        description="queries whose importance judgements are counted; at most max(capacity + 1, "
        f"{HISTORY_ALWAYS_ALLOWED})",
    )
    recent: int = tokens(10, ge=0, description="most recent tokens, never dropped; below the capacity")
    importance_quantile: Real = real(
        0.9, gt=0.0, lt=1.0, description="a token is important to a query at or above this quantile of its row"
    )
    drop_ratio: Real = real(0.1, gt=0.0, le=1.0, description="share of the capacity dropped at once (m)")


class Scissorhands(Method):
    """Keep the tokens that stayed important over the last `history` queries; drop in batches of m.

    Rule (the paper's algorithm with budget B = capacity, history window w = `history`, recent window
    r = `recent`, drop amount m): for every cached token and each of the last w queries, record whether
    the token was UNIMPORTANT to that query: its attention (group mean, see below) is below that query
    row's `importance_quantile` quantile (linear interpolation) over the tokens the query can see.
    Tokens a query cannot see (later ones) get no event, nor do tokens for queries before they existed.
    When a layer holds more than `capacity` slots, the `recent` most recent positions stay and the
    m = max(1, round(drop_ratio * capacity)) tokens with the most unimportant events go (ties: the older
    first), plus any more needed to reach the capacity; the cache then refills to the capacity.
    Prefill: the last w prompt queries fill the flags and the prompt is cut to exactly the capacity the
    same way; the authors' public code applies this history-window rule to prompt queries (C4
    perplexity, hf_opt_dropkv.py), and a decode-phase Scissorhands after another prefill method reads
    its history from the same prompt rows.
    Defaults: history 100 and recent 10 are the authors' C4 script values (LRU_WINDOW=100,
    POSITION_WINDOW=10); the 0.9 quantile is their threshold (rank int(0.9 * len) of each sorted row,
    there counting the causal zeros; we take the quantile over visible tokens only). drop_ratio 0.1 is
    OUR choice: the paper's m could not be verified.
    GQA: flags are per KV head, from the mean attention of its query heads (the original is MHA).
    """

    name = "scissorhands"
    colour = "#000000"
    standalone_source = "Scissorhands (Liu et al., NeurIPS 2023): persistence of importance, prompt and generation"
    phases = frozenset({Phase.PREFILL, Phase.DECODE})
    Params = ScissorhandsParams
    params: ScissorhandsParams  # this instance's, parsed
    below_capacity = ("recent",)

    def __init__(self, capacity, params=None, layer_idx=0, interval=1):
        super().__init__(capacity, params, layer_idx, interval)
        self.cursor = 0  # ring-buffer column the next query's flags go to
        # Decode steps that evict nothing keep their grouped row here, [b, h, DEFERRED_ROWS, capacity + interval]
        # (-1 where a step's query saw no slot; a row per step: one contiguous write), and `waiting` of them are not
        # yet flags: their quantiles come from one top-k at the next eviction, or before the runtime moves slots
        # (`_settle`).
        self.deferred: torch.Tensor | None = None
        self.waiting = 0
        self.per_token.before_move = weakref.WeakMethod(self._settle)  # weak: the store lives in the method

    @classmethod
    def check_capacity(cls, params: BaseModel, capacity: int | None) -> list[str]:
        """The window rule, and a history tied to the capacity: the flags take history bytes per slot
        and KV head (the layer holds capacity + 1 slots at a decode step, the whole prompt at the end of
        prefill; decode rows waiting to be flagged take 4 * min(history, DEFERRED_ROWS) more) and the history's
        attention rows are computed over every slot, as a SnapKV window's are.
        A history of up to HISTORY_ALWAYS_ALLOWED queries is allowed at any capacity."""
        problems = super().check_capacity(params, capacity)
        if capacity is not None:
            limit = max(capacity + 1, HISTORY_ALWAYS_ALLOWED)
            if params.history > limit:
                problems.append(
                    f"history ({params.history}) must be at most max(capacity + 1, {HISTORY_ALWAYS_ALLOWED}) = {limit} "
                    f"(its flags take history bytes per cached token and KV head); allowed range 1 .. {limit}"
                )
        return problems

    def needs(self, phase: Phase, length: int) -> Needs:
        if self.capacity is None or (phase is Phase.PREFILL and length <= self.capacity):
            return NOTHING
        return Needs(rows=self.params.history)  # in decode: every step, to keep the history going

    def needs_from_prefill(self, length: int) -> Needs:
        return Needs(rows=self.params.history)

    def observe_prefill(self, view: LayerView) -> None:
        self._start(view)

    def step(self, view: LayerView) -> Eviction | None:
        if view.rows is None:
            return None
        old = self.per_token.get("unimportant")
        if view.phase is Phase.PREFILL or old is None:
            self._start(view)
        else:  # new tokens start with no events
            self.grow("unimportant", view.num_new, False)
            if not self._defer(view):
                self._settle()  # the ring's columns in step order
                self._record(view)
        if not self.over_capacity(view):
            return None
        n = view.length
        m = max(1, round(self.params.drop_ratio * self.capacity))
        keep = self.capacity if view.phase is Phase.PREFILL else min(self.capacity, n - m)
        keep = max(keep, min(self.params.recent, n))  # the recent window always fits
        count = self.per_token["unimportant"].sum(-1).double()  # events in the window [b, h, n]
        # Most events goes first; among equal counts the older token (lower position) goes first.
        score = view.positions.double() - count * (view.positions.amax().double() + 1)
        return evict_lowest(score, keep, recent_mask(view, self.params.recent), view.hidden)

    def forget(self) -> None:
        super().forget()
        self.deferred, self.waiting = None, 0

    def _defer(self, view: LayerView) -> bool:
        """Keep a one-token decode step's grouped row for `_settle`, when the step evicts nothing and its slots fit
        the deferred rows' room; False otherwise (the caller flags it now). The same flags, later: no read of them
        comes before `_settle`."""
        n, room = view.length, self.capacity + self.interval
        if view.num_new != 1 or n > room or self.over_capacity(view):
            return False
        b, h = view.keys.shape[:2]
        deferred = self.deferred
        if deferred is None or deferred.shape[:2] != (b, h) or deferred.device != view.keys.device:
            # (nothing waits here: a batch that changed shape settled first, `SlotStates.map_batch`)
            columns = min(DEFERRED_ROWS, self.params.history)
            deferred = torch.full((b, h, columns, room), -1.0, dtype=torch.float32, device=view.keys.device)
            self.deferred = deferred
        elif self.waiting == deferred.shape[2]:
            self._settle()
        deferred[:, :, self.waiting, :n].copy_(view.grouped(view.rows)[:, :, 0])
        self.waiting += 1
        return True

    def _settle(self) -> None:
        """The deferred rows' flags, into the ring in step order: one top-k for all of them. Each row's quantile is
        over the slots held at its step (`visible_row_quantile`: the slots written since are invisible to it), the
        same numbers as at its own step (no slot has moved since: the runtime calls this first)."""
        k = self.waiting
        if not k:
            return
        self.waiting = 0
        m = min(self.per_token["unimportant"].shape[2], self.deferred.shape[3])  # later slots: no query saw them
        rows = self.deferred[:, :, :k, :m]  # [b, h, k, m]
        visible = rows >= 0
        seen = visible.sum(-1, keepdim=True)
        threshold = visible_row_quantile(rows.clamp_min(0), seen, self.params.importance_quantile)
        self._write_ring((rows < threshold) & visible)
        self.deferred[:, :, :k].fill_(-1.0)

    def _start(self, view: LayerView) -> None:
        # the prompt's flags are the same for every Scissorhands layer that sees this step with the same history
        # and quantile (the layer's two phase methods, many plans' layers): made once, each keeping a copy
        p = self.params
        self.deferred, self.waiting = None, 0  # a new ring
        flags, self.cursor = view.once(
            ("scissorhands flags", p.history, p.importance_quantile), lambda: self._flags(view)
        )
        self.per_token["unimportant"] = flags.clone()

    def _flags(self, view: LayerView) -> tuple[torch.Tensor, int]:
        """The flags of the step's newest queries in a new ring, and the ring's cursor after them."""
        b, h, n = view.positions.shape
        self.per_token["unimportant"] = torch.zeros(
            b, h, n, self.params.history, dtype=torch.bool, device=view.keys.device
        )
        self.cursor = 0
        self._record(view)
        return self.per_token["unimportant"], self.cursor

    def _record(self, view: LayerView) -> None:
        """Write the unimportance flags of the step's newest (up to `history`) queries into the ring."""
        history, q = self.params.history, self.params.importance_quantile
        rows = view.rows if view.rows.shape[2] <= history else view.rows[:, :, -history:]
        rows = view.grouped(rows)  # [b, h, w, n]
        w, n = rows.shape[2], rows.shape[3]
        # The newest slot is the newest query's own token; the w queries sit at the w newest positions.
        if w == 1:  # a decode step: the newest query sees every slot
            # a plain column: no index tensor to build at every decode step
            unimportant = rows < row_quantile(rows, q)
            self.per_token["unimportant"].select(-1, self.cursor).copy_(unimportant.squeeze(2))
            self.cursor = (self.cursor + 1) % history
            return
        if view.fresh:  # a whole prompt in slot order: query i sees slots 0 .. n - w + i
            seen = torch.arange(n - w + 1, n + 1, device=rows.device).view(w, 1)
            unimportant = rows < visible_row_quantile(rows, seen, q)
            unimportant[..., n - w :] &= torch.ones(w, w, dtype=torch.bool, device=rows.device).tril_()
        else:
            query_pos = view.positions.amax(-1, keepdim=True) - w + 1 + torch.arange(w, device=rows.device)
            visible = view.positions[:, :, None, :] <= query_pos[..., None]  # [b, h, w, n]
            unimportant = (rows < visible_row_quantile(rows, visible.sum(-1, keepdim=True), q)) & visible
        self._write_ring(unimportant)

    def _write_ring(self, unimportant: torch.Tensor) -> None:
        """Flags [b, h, w, m] of w queries over the first m slots into the ring's next w columns."""
        history, (w, m) = self.params.history, unimportant.shape[2:]
        flags = self.per_token["unimportant"][:, :, :m]
        if self.cursor + w <= history:  # the ring's next w columns, unbroken
            flags[..., self.cursor : self.cursor + w] = unimportant.transpose(2, 3)
        else:
            columns = (self.cursor + torch.arange(w, device=unimportant.device)) % history
            flags[..., columns] = unimportant.transpose(2, 3)
        self.cursor = (self.cursor + w) % history


def row_quantile(rows: torch.Tensor, q: float) -> torch.Tensor:
    """`torch.quantile(rows, q, dim=-1, keepdim=True)` (linear interpolation), the same numbers, from a
    partial top-k instead of a full sort: at every decode step this is most of the method's cost.

    torch computes the rank q * (n - 1) in float32; so does this, on the host (rows hold no NaN: they
    are softmax probabilities)."""
    n = rows.shape[-1]
    below, weight = _rank(q, n)
    # descending: the last is the value at `below` (a float top-k: on a decode step's short row the int32 views
    # of `_largest` cost more than they save)
    top = rows.topk(n - below, dim=-1).values
    pair = top[..., -2:]
    return torch.lerp(pair[..., -1:], pair[..., :1], weight)


@functools.lru_cache(maxsize=4096)
def _rank(q: float, n: int) -> tuple[int, float]:
    """The ascending rank q * (n - 1) as torch computes it in float32: its whole part and its fraction (exact)."""
    rank = _float32(_float32(q) * (n - 1))  # the exact product of two float32 values, rounded once
    return int(rank), rank - int(rank)


def visible_row_quantile(rows: torch.Tensor, seen: torch.Tensor, q: float) -> torch.Tensor:
    """`torch.nanquantile(rows with the invisible entries as NaN, q, dim=-1, keepdim=True)`, the same
    numbers for rows that see at least one entry, from one partial top-k instead of a sort of every row
    (the prompt's history window, `history` rows over the whole prompt; decode rows flagged together). `rows`
    are attention probabilities: every entry >= 0, and 0 where the row's query cannot see the slot (the causal
    mask, or a slot written after its step);
    `seen` [..., w, 1] how many entries each row sees.

    Row i with m_i visible entries needs its values at ascending ranks floor(r_i) and ceil(r_i),
    r_i = q * (m_i - 1) in float32 as torch computes it; those are among its m_i - floor(r_i) largest,
    a count that grows with m_i, so the top-k of the longest possible row holds them for every row.
    The top-k runs on the rows as they are, invisible entries included: they are 0, the least any entry
    can be, so the j-th largest value for j < m_i is the j-th largest visible one (equal values are the
    same number whichever entry holds them), and only such ranks are read."""
    n = rows.shape[-1]
    q32 = torch.tensor(_float32(q), dtype=torch.float32, device=rows.device)
    last = (seen - 1).clamp_min_(0)  # m_i - 1: descending index of ascending rank 0
    rank = q32 * last  # float32, as torch.nanquantile
    below = rank.long()
    weight = rank - below
    above = rank.ceil().long()
    k = min(n, n - _rank(q, n)[0] + 1)  # + 1: float32 rounding of the rank
    top = _largest(rows, k)  # descending
    at = lambda r: top.gather(-1, (last - r).clamp_(0, k - 1).expand(*top.shape[:-1], 1))  # noqa: E731  (ascending rank r)
    return at(below).lerp_(at(above), weight)


def _largest(rows: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest values of each row, descending, for rows of probabilities (every entry +0 or above: no -0,
    no NaN). Such floats order as their bits read as int32, which a CPU compares faster than floats."""
    if rows.device.type != "cpu" or rows.dtype != torch.float32:
        return rows.topk(k, dim=-1).values
    n = rows.shape[-1]
    bits = rows.view(torch.int32)
    if n < _SELECT_LONG_ROWS or rows.numel() < _SELECT_MANY_ENTRIES:
        return bits.topk(k, dim=-1).values.view(torch.float32)
    # numpy's selection (introselect) is two to six times faster than torch's CPU top-k on long rows (a prompt's
    # history window, 200 rows of 1,024, one core: 0.3-0.7 against 1.4-2.0 ms, on two machines); only values are
    # read, so ties cannot differ.
    # It partitions a copy, made a block of rows at a time: a copy of 256 KiB reuses freed memory, where one of the
    # whole window faults its pages in anew at every layer (in a prompt pass, 0.5 of the 0.9 ms it then took)
    import numpy  # loaded with torch

    flat = bits.reshape(-1, n).numpy()
    top = numpy.empty((flat.shape[0], k), dtype=numpy.int32)
    block = max(1, _SELECT_BLOCK_ENTRIES // n)
    for start in range(0, flat.shape[0], block):
        part = numpy.partition(flat[start : start + block], n - k, axis=-1)[:, n - k :]
        part.sort(axis=-1)
        top[start : start + block] = part[:, ::-1]  # descending
    return torch.from_numpy(top).view(torch.float32).view(*rows.shape[:-1], k)


def _float32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]

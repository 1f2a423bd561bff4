"""One routed layer's attention step (`attend`): where its output comes from (`choose_path`), then the signals its
methods asked for and their eviction.

Attention runs on exactly the keys/values the layer holds. Probabilities are computed only for what the
layer's methods asked for: the newest w queries' rows (SnapKV-style observation windows, the current
query in decode) or column sums over all queries (H2O-style accumulation). Where a method needs them,
the output comes from the same pass: a decode step's single softmax row times the values, a fresh
prompt's chunked causal attention that also sums its columns, and, in fp32, a fresh prompt's last w queries when
they are at least `PROMPT_ROWS_AT_LEAST` (Scissorhands' history). Everywhere else (a `full` layer, shorter prefill
windows) the output is SDPA's, so a `full` plan is the vanilla computation. Masks are built here from
the true slot positions: transformers hands this attention no mask, and its SDPA fallback would align a
multi-token step top-left, which is wrong once the cache holds older tokens.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from polykv.errors import RoutedCacheError
from polykv.methods.base import LayerView, Method, Needs
from polykv.plan import Phase
from polykv.runtime.attention import listening
from polykv.runtime.attention_math import (
    allowed,
    attention_probs,
    causal_attention_and_column_sums,
    column_sums,
    decode_output,
    entropy_sums,
    repeat_for_query_heads,
    rows_output,
)
from polykv.runtime.rotary import queries_before_rope, rotary_of


class SlotHoldingLayer(Protocol):
    """What an attention step (`attend`) reads and calls on its layer: the routed cache layer
    (`polykv.runtime.cache.RoutedLayer`), which holds the slots, knows the phase and runs the methods."""

    layer_idx: int
    seen: int  # tokens processed so far, this step's included: the true sequence length
    phase: Phase
    window: int | None  # a local layer's sliding window, set by each step from what the model passes
    window_clean: bool  # does every held slot lie in the window of the next query?
    padded: bool  # do some slots hold no token (position -1: a head-level split's room)? Then queries are masked

    @property
    def retained(self) -> int: ...  # slots held per KV head

    @property
    def positions(self) -> torch.Tensor: ...  # [b, h, n] true position of every slot

    @property
    def idle(self) -> bool: ...  # nothing for the methods to do this step (e.g. `full`)

    @property
    def method(self) -> Method: ...  # the phase's method

    @property
    def defers_merge(self) -> bool: ...  # will this step's one-slot merge run with its merge group's?

    @property
    def holding(self) -> bool: ...  # a decode step whose tokens are all kept (`RoutedCache.keep_until`)

    def needs(self) -> Needs: ...  # the signals its methods ask for this step

    def kv_view(self) -> torch.Tensor | None: ...  # keys and values as one [2, b, h, n, d] view, if they are

    def keep_window(self, view: LayerView | None = None) -> LayerView | None: ...  # drop what left the window

    def finish_idle_step(self) -> None: ...  # after attention, when `idle`

    def finish_step(self, view: LayerView) -> None: ...  # after attention: the methods see the view and evict


# A whole prompt whose methods read its last w queries' probabilities takes their output from them when w is at
# least this (Scissorhands' history); a shorter window (SnapKV's, PyramidKV's, CAKE's) saves too little to leave
# SDPA's numbers.
PROMPT_ROWS_AT_LEAST = 64


class Path(Enum):
    """Where a routed layer's attention output comes from (`choose_path`)."""

    IDLE_ROW = "idle row"
    FUSED_DECODE = "fused decode"
    FUSED_PROMPT = "fused prompt"
    PROMPT_ROWS = "prompt rows"
    MASKED = "masked"
    SDPA = "sdpa"


def choose_path(
    layer: SlotHoldingLayer,
    q_len: int,
    window,
    dropout: float,
    kwargs,
    row_when_idle: bool,
    needs: Needs,
    recording: bool,
    fp32: bool = True,
) -> Path:
    """The path of one routed layer's attention step:

    | path         | the output comes from                          | taken when                                  |
    |--------------|------------------------------------------------|---------------------------------------------|
    | IDLE_ROW     | one softmax row times the values               | many plans' rows (`row_when_idle`): a one-  |
    |              |                                                | query decode step, no window, of a layer    |
    |              |                                                | that keeps everything                       |
    | FUSED_DECODE | the step's attention row, which also gives the | a one-query step, no window, whose methods  |
    |              | signals its methods asked for                  | need signals (any evicting layer of many    |
    |              |                                                | plans' rows)                                |
    | FUSED_PROMPT | the chunked causal pass that also sums columns | a whole prompt over an empty cache whose    |
    |              |                                                | methods need column sums                    |
    | PROMPT_ROWS  | SDPA for all but the last w queries, their     | such a prompt in fp32 whose methods need    |
    |              | softmax rows times the values for those        | the rows of its last w queries, w at least  |
    |              |                                                | `PROMPT_ROWS_AT_LEAST`                      |
    | MASKED       | SDPA with a mask built from the true positions | the held slots are not a plain causal       |
    |              |                                                | prefix of the queries (`_needs_explicit_mask`)|
    | SDPA         | transformers' SDPA                             | everything else: a `full` layer alone is    |
    |              |                                                | the vanilla computation                     |

    The fused paths need attention without dropout or soft-capping (`_fusable`); the one-row paths and PROMPT_ROWS
    also need no recorder listening (a recorder reads every query's attention); a layer that never evicts is fused
    only as IDLE_ROW. PROMPT_ROWS needs fp32 values: in bf16 its output rounds otherwise than SDPA's by far more,
    enough for later layers to keep other slots."""
    plain_decode = _one_query_sees_all(layer, q_len, window)
    if row_when_idle and plain_decode and layer.idle and layer.phase is Phase.DECODE and not recording:
        if _fusable(dropout, kwargs):
            return Path.IDLE_ROW
    fusable = not layer.idle and _fusable(dropout, kwargs)
    # first: every layer takes it at every decode step (and many plans' rows even when no signal is needed)
    if plain_decode and (needs or row_when_idle) and fusable and not recording:
        return Path.FUSED_DECODE
    if _needs_explicit_mask(layer, q_len, window):
        return Path.MASKED
    if needs.column_sums and fusable and fresh_prompt(layer, q_len, window):
        return Path.FUSED_PROMPT
    if needs.rows >= PROMPT_ROWS_AT_LEAST and q_len > needs.rows and fusable and not recording and fp32:
        if fresh_prompt(layer, q_len, window):
            return Path.PROMPT_ROWS
    return Path.SDPA


def attend(
    layer: SlotHoldingLayer,
    module,
    query,
    key,
    value,
    dropout: float,
    scaling: float,
    kwargs,
    row_when_idle: bool = False,
):
    """One routed layer's attention step: the output over the slots it holds (`choose_path`), then the
    signals its methods asked for and their eviction. (Many plans at once call it for a plan's layer that does
    not attend in its shared block, `polykv.runtime.row_storage`, with `row_when_idle`: a one-query decode step
    takes its output from one softmax row even when its methods need no signal, which spares SDPA's copy of the
    keys for every query head; alone, such a layer runs SDPA, so that a `full` plan is the vanilla computation.)"""
    window = layer.window = kwargs.get("sliding_window")  # a local layer keeps its window (`keep_window`)
    q_len = query.shape[2]
    recorders = listening()
    needs, recording = layer.needs(), bool(recorders)  # once per step: a hot path
    path = choose_path(
        layer, q_len, window, dropout, kwargs, row_when_idle, needs, recording, value.dtype == torch.float32
    )
    if path is Path.IDLE_ROW:
        output = decode_output(query, key, value, scaling)[0]
        layer.keep_window()
        return output, None
    if path is Path.FUSED_DECODE:
        return _decode_step(layer, module, query, key, value, scaling, needs)
    if path is Path.PROMPT_ROWS:
        return _prompt_rows_step(layer, module, query, key, value, scaling, needs, kwargs)
    plain_decode = _one_query_sees_all(layer, q_len, window)
    if path is Path.MASKED or (needs and not plain_decode) or recording:
        key_pos = layer.positions  # [b, h, n]
        query_pos = _query_positions(layer, q_len, query.device)
    else:
        key_pos = query_pos = None
    # A prompt's column sums come from the fused causal pass, whichever path gives the output.
    fresh_sums = needs.column_sums and fresh_prompt(layer, q_len, window)
    sums = None
    if fresh_sums:
        fused_output, sums = causal_attention_and_column_sums(query, key, value, scaling, path is Path.FUSED_PROMPT)
    if path is Path.FUSED_PROMPT:
        attn_output = fused_output
    elif path is Path.MASKED:
        mask = allowed(key_pos, query_pos, window)  # [b, h, q, n]
        mask = mask.repeat_interleave(module.num_key_value_groups, dim=1)
        out = F.scaled_dot_product_attention(
            query,
            repeat_for_query_heads(key, module),
            repeat_for_query_heads(value, module),
            attn_mask=mask,
            dropout_p=dropout,
            scale=scaling,
        )
        attn_output = out.transpose(1, 2).contiguous()
    else:
        # transformers hands a local layer a mask once it attends a window's worth of slots, even where the mask
        # allows them all: so do we (the same kernel, the same bits)
        mask = None
        if window is not None and key.shape[2] >= window:
            mask = query.new_ones((query.shape[0], 1, q_len, key.shape[2]), dtype=torch.bool)
        attn_output, _ = sdpa_attention_forward(
            module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs
        )
    for recorder in recorders.attention:
        recorder.record(layer, attention_probs(query[:, :, -1:], key, query_pos[-1:], key_pos, scaling, window))
    for entropy_recorder in recorders.entropy:
        entropy_recorder.record(layer.layer_idx, entropy_sums(query, key, query_pos, key_pos, scaling, window), q_len)
    if layer.idle:
        layer.finish_idle_step()
        return attn_output, None

    view = layer_view(layer, module, key, value, q_len)
    if plain_decode and needs:
        give_row(view, needs, attention_probs(query, key, None, None, scaling), *query.shape[:2])
    else:
        fill_signals(view, needs, module, query, key, query_pos, scaling, window, {"sums": sums} if fresh_sums else {})
    layer.finish_step(view)
    return attn_output, None


def step_on_shared_prompt(layer: SlotHoldingLayer, module, query, key, value, scaling, window, computed: dict) -> None:
    """The rest of a whole prompt's step, for a layer that took the prompt's keys and values from a pass another
    layer computed the output of (many plans on one prompt, `polykv.runtime.many_plans.SharedPrompt`): the
    signals its methods ask for (each made once for every layer sharing `computed`), then their eviction."""
    layer.window = window
    if layer.idle:
        layer.finish_idle_step()
        return
    q_len = query.shape[2]
    view = layer_view(layer, module, key, value, q_len)
    view.shared = computed  # what one plan's methods make from the step, the others' may reuse (`LayerView.once`)
    query_pos = torch.arange(q_len, device=query.device)
    fill_signals(view, layer.needs(), module, query, key, query_pos, scaling, window, computed)
    layer.finish_step(view)


def _query_positions(layer: SlotHoldingLayer, q_len: int, device) -> torch.Tensor:
    return torch.arange(layer.seen - q_len, layer.seen, device=device)


def fresh_prompt(layer: SlotHoldingLayer, q_len: int, window: int | None) -> bool:
    """Is this step a whole prompt over an empty cache (slot i = position i), with every query seeing
    all its past (no window shorter than the prompt)? Its column sums then come from the fused pass."""
    return layer.retained == q_len == layer.seen and (window is None or window >= q_len)


def fill_signals(view: LayerView, needs, module, query, key, query_pos, scaling, window, computed: dict) -> None:
    """Give `view` the rows of the newest queries, the column sums and the queries before RoPE `needs` asks for.
    `computed` holds signals already made for this step ({("rows", w): ..., "sums": ..., "queries": ...}) and gets
    those made here, so that layers seeing the same step (many plans on one prompt) compute each signal once (there
    it is also the views' `shared`: what methods make of the signals, `LayerView.once`). A whole prompt's step
    (`LayerView.fresh`) takes its column sums from the fused pass, as a layer alone does, and masks only the
    rows' last slots."""
    q_len = query.shape[2]
    if needs.rows:
        w = min(needs.rows, q_len)
        if ("rows", w) not in computed:
            rows = attention_probs(query[:, :, -w:], key, query_pos[-w:], view.positions, scaling, window, view.fresh)
            computed["rows", w] = rows
        view.rows = computed["rows", w]
    if needs.column_sums:
        if computed.get("sums") is None:
            if view.fresh:
                computed["sums"] = causal_attention_and_column_sums(query, key, view.values, scaling, False)[1]
            else:
                computed["sums"] = column_sums(query, key, query_pos, view.positions, scaling, window)
        view.column_sums = computed["sums"]
    if needs.queries:
        view.rotary = rotary_of(module, query)
        if view.rotary is None:
            raise RoutedCacheError(
                "a method of this plan reads the queries before RoPE (ExpectedAttention), but PolyKV finds no rotary "
                "embedding for this model's attention"
            )
        if computed.get("queries") is None:
            computed["queries"] = queries_before_rope(query, query_pos, view.rotary)
        view.queries = computed["queries"]


def layer_view(layer: SlotHoldingLayer, module, key, value, q_len: int) -> LayerView:
    """The step as the layer's methods see it (`polykv.methods.base.LayerView`), before its signals."""
    return LayerView(
        phase=layer.phase,
        keys=key,
        values=value,
        positions=layer.positions,
        num_new=q_len,
        num_kv_groups=module.num_key_value_groups,
        newest=layer.seen - 1,
        kv=layer.kv_view() if layer.method.merges else None,
        defer_merge=layer.defers_merge,
        holds=layer.holding,
        fresh=layer.phase is Phase.PREFILL and fresh_prompt(layer, q_len, layer.window),
    )


def give_row(view: LayerView, needs, row: torch.Tensor, b: int, qh: int) -> None:
    """A single query's attention row (b * h*g * n probabilities: [b, h*g, 1, n] or [b*h, g, n]) is also
    the step's column sums (the same numbers); each is viewed only if the method asked for it."""
    n = row.shape[-1]
    if needs.rows:
        view.rows = row.view(b, qh, 1, n)
    if needs.column_sums:
        view.column_sums = row.view(b, qh, n)


def _fusable(dropout: float, kwargs) -> bool:
    """Can the output come from our own softmax? Not with dropout or score modifiers SDPA would apply
    differently (logit soft-capping, attention sinks): those models keep SDPA beside the row."""
    return not dropout and kwargs.get("softcap") is None and kwargs.get("s_aux") is None


def _decode_step(layer: SlotHoldingLayer, module, query, key, value, scaling, needs):
    """A decode step of one query over the held slots: the probabilities (fp32, as the methods score)
    times the values give the layer's output (in the values' dtype, as eager attention does), and the
    same row goes to the method."""
    attn_output, probs = decode_output(query, key, value, scaling)
    finish_with_row(layer, module, key, value, needs, probs, *query.shape[:2])
    return attn_output, None


def finish_with_row(layer: SlotHoldingLayer, module, key, value, needs, row: torch.Tensor, b: int, qh: int) -> None:
    """A one-query step's end: the layer's methods see its attention row (`give_row`) and evict."""
    view = layer_view(layer, module, key, value, 1)
    give_row(view, needs, row, b, qh)
    layer.finish_step(view)


def _prompt_rows_step(layer: SlotHoldingLayer, module, query, key, value, scaling, needs, kwargs):
    """A whole prompt whose methods read the probabilities of its last w queries: SDPA gives the output of the
    first q - w queries (which see only the first q - w slots), and those rows times the values the output of
    the last w, so their scores and softmax are computed once."""
    q_len, w = query.shape[2], needs.rows
    head, _ = sdpa_attention_forward(
        module, query[:, :, :-w], key[:, :, :-w], value[:, :, :-w], None, dropout=0.0, scaling=scaling, **kwargs
    )
    view = layer_view(layer, module, key, value, q_len)
    query_pos = torch.arange(q_len, device=query.device)
    computed: dict = {}
    fill_signals(view, needs, module, query, key, query_pos, scaling, layer.window, computed)
    tail = rows_output(computed["rows", w], value)
    layer.finish_step(view)
    return torch.cat([head, tail], dim=1), None


def _one_query_sees_all(layer: SlotHoldingLayer, q_len: int, window: int | None) -> bool:
    """A decode step of one query that may attend every held slot: no padding, and no window or a local layer whose
    every slot lies in the window (`RoutedLayer.window_clean`: its window kept nothing older at the last step)."""
    return q_len == 1 and not layer.padded and (window is None or layer.window_clean)


def _needs_explicit_mask(layer: SlotHoldingLayer, q_len: int, window: int | None) -> bool:
    """SDPA's own masking suffices for one query over slots it may all see, or a causal block over an empty
    cache (shorter than a local layer's window); padding slots (`padded`) need the mask always."""
    if layer.padded:
        return True
    fresh = layer.retained == q_len and layer.seen == q_len
    if window is not None and q_len > 1:  # a local layer: a block's queries see windows ending where they are
        return not fresh or q_len >= window
    if window is not None:
        return not layer.window_clean
    return q_len > 1 and not fresh

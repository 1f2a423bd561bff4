"""PolyKV's attention function, registered with transformers as `attn_implementation="polykv"`.

Attention runs on exactly the keys/values the layer holds. Probabilities are computed only for what the
layer's methods asked for: the newest w queries' rows (SnapKV-style observation windows, the current
query in decode) or column sums over all queries (H2O-style accumulation). Where a method needs them,
the output comes from the same pass: a decode step's single softmax row times the values, and a fresh
prompt's chunked causal attention that also sums its columns. Everywhere else (a `full` layer, prefill
windows) the output is SDPA's, so a `full` plan is the vanilla computation. Masks are built here from
the true slot positions: transformers hands custom attention functions no mask, and its SDPA fallback
would align a multi-token step top-left, which is wrong once the cache holds older tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Protocol

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from polykv.errors import RoutedCacheError
from polykv.methods.base import LayerView, Needs
from polykv.plan import Phase

ATTN_IMPLEMENTATION = "polykv"
# Below, `layer` is a routed cache layer (`polykv.runtime.cache.RoutedLayer`): the cache builds on this module,
# so the type is not imported here.

# The model calls `cache.update(...)` and then, in the same attention module, the attention function.
# The layer that was just updated is parked here so that the attention function can find it.
_handoff = threading.local()


def hand_over(layer) -> None:
    """Park a just-updated cache layer for the attention function of the same module (`take_updated_layer`)."""
    _handoff.layer = layer


def take_updated_layer(layer_idx: int):
    """The layer parked by the cache update that ran just before this attention (a `RoutedLayer`, or a
    layer of many plans at once from `polykv.runtime.many_plans`), or None."""
    layer = getattr(_handoff, "layer", None)
    _handoff.layer = None
    if layer is not None and layer.layer_idx != layer_idx:
        raise RoutedCacheError(
            f"cache layer {layer.layer_idx} was updated but attention ran for layer {layer_idx}; "
            "this model's attention does not follow the update-then-attend order PolyKV relies on"
        )
    return layer


# Bound the [b, heads, chunk, n] fp32 block used for column sums to about this many elements
# (small enough to stay in cache-friendly sizes, large enough to keep the matmuls efficient).
_COLUMN_SUM_BLOCK = 1 << 24


class AttendingLayer(Protocol):
    """What PolyKV's attention function talks to: the cache layer a forward pass has just updated (it hands
    itself over with `hand_over`), which computes its own attention step. Implemented
    by `RoutedLayer` (one plan's layer), `polykv.runtime.many_plans`'s `SharedPrompt` (one prompt pass filling many
    plans' layers) and `PlanRows` (many plans' rows as one batch), and the profiler's `_PrefixBlock` (many
    cells' continuations over one shared prompt)."""

    layer_idx: int

    def attend(
        self,
        module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        dropout: float,
        scaling: float,
        kwargs,
    ) -> tuple[torch.Tensor, None]: ...


def polykv_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    layer: AttendingLayer | None = take_updated_layer(module.layer_idx)
    if layer is None:  # no routed cache (e.g. use_cache=False): plain attention
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if attention_mask is not None:
        raise RoutedCacheError(
            "custom attention masks are not supported under routed(); pass none (padding is refused)"
        )
    return layer.attend(module, query, key, value, dropout, module.scaling if scaling is None else scaling, kwargs)


class Path(Enum):
    """Where a routed layer's attention output comes from (`choose_path`)."""

    IDLE_ROW = "idle row"
    FUSED_DECODE = "fused decode"
    FUSED_PROMPT = "fused prompt"
    MASKED = "masked"
    SDPA = "sdpa"


def choose_path(
    layer, q_len: int, window, dropout: float, kwargs, row_when_idle: bool, needs: Needs, recording: bool
) -> Path:
    """The path of one routed layer's attention step:

    | path         | the output comes from                          | taken when                                  |
    |--------------|------------------------------------------------|---------------------------------------------|
    | IDLE_ROW     | one softmax row times the values               | many plans' rows (`row_when_idle`): a one-  |
    |              |                                                | query decode step, no window, of a layer    |
    |              |                                                | that keeps everything                       |
    | FUSED_DECODE | the step's attention row, which also gives the | a one-query step, no window, whose methods  |
    |              | signals its methods asked for                  | need signals                                |
    | FUSED_PROMPT | the chunked causal pass that also sums columns | a whole prompt over an empty cache whose    |
    |              |                                                | methods need column sums                    |
    | MASKED       | SDPA with a mask built from the true positions | the held slots are not a plain causal       |
    |              |                                                | prefix of the queries (`_needs_explicit_mask`)|
    | SDPA         | transformers' SDPA                             | everything else: a `full` layer alone is    |
    |              |                                                | the vanilla computation                     |

    The fused paths need attention without dropout or soft-capping (`_fusable`); the one-row paths also need
    no recorder listening (a recorder reads every query's attention); a layer that never evicts is fused
    only as IDLE_ROW."""
    plain_decode = _one_query_sees_all(layer, q_len, window)
    if row_when_idle and plain_decode and layer.idle and layer.phase is Phase.DECODE and not recording:
        if _fusable(dropout, kwargs):
            return Path.IDLE_ROW
    fusable = not layer.idle and _fusable(dropout, kwargs)
    if plain_decode and needs and fusable and not recording:  # first: every layer takes it at every decode step
        return Path.FUSED_DECODE
    if _needs_explicit_mask(layer, q_len, window):
        return Path.MASKED
    if needs.column_sums and fusable and _fresh_prompt(layer, q_len, window):
        return Path.FUSED_PROMPT
    return Path.SDPA


def attend(layer, module, query, key, value, dropout: float, scaling: float, kwargs, row_when_idle: bool = False):
    """One routed layer's attention step: the output over the slots it holds (`choose_path`), then the
    signals its methods asked for and their eviction. (Many plans at once call it for each plan's layer,
    with `row_when_idle`: a decode step of a layer that keeps everything takes its output from one softmax
    row too, which spares SDPA's copy of the keys for every query head; alone, such a layer runs SDPA, so
    that a `full` plan is the vanilla computation.)"""
    window = layer.window = kwargs.get("sliding_window")  # a local layer keeps its window (`keep_window`)
    q_len = query.shape[2]
    needs, recording = layer.needs(), bool(_here.attention or _here.entropy)  # once per step: a hot path
    path = choose_path(layer, q_len, window, dropout, kwargs, row_when_idle, needs, recording)
    if path is Path.IDLE_ROW:
        output = _decode_output(query, key, value, scaling)[0]
        layer.keep_window()
        return output, None
    if path is Path.FUSED_DECODE:
        return _decode_step(layer, module, query, key, value, scaling, needs)
    plain_decode = _one_query_sees_all(layer, q_len, window)
    if path is Path.MASKED or (needs and not plain_decode) or recording:
        key_pos = layer.positions  # [b, h, n]
        query_pos = _query_positions(layer, q_len, query.device)
    else:
        key_pos = query_pos = None
    # A prompt's column sums come from the fused causal pass, whichever path gives the output.
    fresh_sums = needs.column_sums and _fresh_prompt(layer, q_len, window)
    column_sums = None
    if fresh_sums:
        fused_output, column_sums = _causal_attention_and_column_sums(query, key, value, scaling)
    if path is Path.FUSED_PROMPT:
        attn_output = fused_output
    elif path is Path.MASKED:
        mask = _allowed(key_pos, query_pos, window)  # [b, h, q, n]
        mask = mask.repeat_interleave(module.num_key_value_groups, dim=1)
        out = F.scaled_dot_product_attention(
            query, _repeat(key, module), _repeat(value, module), attn_mask=mask, dropout_p=dropout, scale=scaling
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
    for recorder in _here.attention:
        recorder.record(layer, attention_probs(query[:, :, -1:], key, query_pos[-1:], key_pos, scaling, window))
    for entropy_recorder in _here.entropy:
        entropy_recorder.record(layer.layer_idx, _entropy_sums(query, key, query_pos, key_pos, scaling, window), q_len)
    if layer.idle:
        layer.finish_idle_step()
        return attn_output, None

    view = _layer_view(layer, module, key, value, q_len)
    if plain_decode and needs:
        _give_row(view, needs, attention_probs(query, key, None, None, scaling), *query.shape[:2])
    else:
        fill_signals(view, needs, query, key, query_pos, scaling, window, {"sums": column_sums} if fresh_sums else {})
    layer.finish_step(view)
    return attn_output, None


def _query_positions(layer, q_len: int, device) -> torch.Tensor:
    return torch.arange(layer.seen - q_len, layer.seen, device=device)


def _fresh_prompt(layer, q_len: int, window: int | None) -> bool:
    """Is this step a whole prompt over an empty cache (slot i = position i), with every query seeing
    all its past (no window shorter than the prompt)? Its column sums then come from the fused pass."""
    return layer.retained == q_len == layer.seen and (window is None or window >= q_len)


def fill_signals(
    view: LayerView, needs, query, key, query_pos, scaling, window, computed: dict, fresh: bool = False
) -> None:
    """Give `view` the rows of the newest queries and the column sums `needs` asks for. `computed` holds
    signals already made for this step ({("rows", w): ..., "sums": ...}) and gets those made here, so
    that layers seeing the same step (many plans on one prompt) compute each signal once. `fresh`: the
    step is a whole prompt (`_fresh_prompt`), whose column sums come from the fused pass, as they do
    when a layer runs alone."""
    q_len = query.shape[2]
    if needs.rows:
        w = min(needs.rows, q_len)
        if ("rows", w) not in computed:
            rows = attention_probs(query[:, :, -w:], key, query_pos[-w:], view.positions, scaling, window)
            computed["rows", w] = rows
        view.rows = computed["rows", w]
    if needs.column_sums:
        if computed.get("sums") is None:
            if fresh:
                computed["sums"] = _causal_attention_and_column_sums(query, key, view.values, scaling)[1]
            else:
                computed["sums"] = _column_sums(query, key, query_pos, view.positions, scaling, window)
        view.column_sums = computed["sums"]


def _layer_view(layer, module, key, value, q_len: int) -> LayerView:
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
    )


def _give_row(view: LayerView, needs, row: torch.Tensor, b: int, qh: int) -> None:
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


def _decode_step(layer, module, query, key, value, scaling, needs):
    """A decode step of one query over the held slots: the probabilities (fp32, as the methods score)
    times the values give the layer's output (in the values' dtype, as eager attention does), and the
    same row goes to the method."""
    attn_output, probs = _decode_output(query, key, value, scaling)
    view = _layer_view(layer, module, key, value, 1)
    _give_row(view, needs, probs, *query.shape[:2])
    layer.finish_step(view)
    return attn_output, None


def _decode_output(query, key, value, scaling) -> tuple[torch.Tensor, torch.Tensor]:
    """One query's attention output [b, 1, h*g, dv] over every held slot, and its probabilities [b*h, g, n]."""
    b, qh = query.shape[:2]
    h, n = key.shape[1], key.shape[2]
    probs = _decode_probs(query, key, scaling)  # [b*h, g, n]
    weights = probs if value.dtype == probs.dtype else probs.to(value.dtype)
    attn_output = torch.bmm(weights, value.reshape(b * h, n, value.shape[-1])).view(b, 1, qh, value.shape[-1])
    return attn_output, probs


def _decode_probs(query, key, scaling) -> torch.Tensor:
    """Softmax attention [b*h, g, n] (fp32) of one query per head over every held slot: no mask, and as
    few operations as the step allows (it runs for every layer at every decode step)."""
    b, qh, _, d = query.shape
    h, n = key.shape[1], key.shape[2]
    grouped_q = query.reshape(b * h, qh // h, d)
    grouped_k = key.reshape(b * h, n, d)
    if grouped_q.dtype != torch.float32:
        grouped_q, grouped_k = grouped_q.float(), grouped_k.float()
    return torch.softmax(torch.bmm(grouped_q * scaling, grouped_k.transpose(1, 2)), dim=-1)


class AttentionRecorder:
    """Collects the newest query's attention [b, h*g, 1, n] and the slot positions, per layer."""

    def __init__(self):
        self.rows: dict[int, torch.Tensor] = {}
        self.positions: dict[int, torch.Tensor] = {}

    def record(self, layer, rows: torch.Tensor) -> None:
        self.rows[layer.layer_idx] = rows
        self.positions[layer.layer_idx] = layer.positions


class _ThreadRecorders(threading.local):
    """The recorders the current thread opened: a forward records only into its own thread's (a shared model
    runs other threads' forwards too, as the hand-over of layers to this function is per thread)."""

    def __init__(self):
        self.attention: list[AttentionRecorder] = []
        self.entropy: list[EntropyRecorder] = []


_here = _ThreadRecorders()


@contextmanager
def record_attention() -> Iterator[AttentionRecorder]:
    """Inside the block, every routed forward of this thread records each layer's newest-query attention."""
    recorder = AttentionRecorder()
    _here.attention.append(recorder)
    try:
        yield recorder
    finally:
        _here.attention.remove(recorder)


class EntropyRecorder:
    """Per layer: the attention entropy (nats) of every query, summed over the queries of each forward
    inside the block ([b, h*g], float64), and how many queries were summed."""

    def __init__(self):
        self.sums: dict[int, torch.Tensor] = {}
        self.queries: dict[int, int] = {}

    def record(self, layer_idx: int, sums: torch.Tensor, num_queries: int) -> None:
        self.sums[layer_idx] = self.sums[layer_idx] + sums if layer_idx in self.sums else sums
        self.queries[layer_idx] = self.queries.get(layer_idx, 0) + num_queries


@contextmanager
def record_entropy() -> Iterator[EntropyRecorder]:
    """Inside the block, every routed forward of this thread adds each layer's per-query attention entropies."""
    recorder = EntropyRecorder()
    _here.entropy.append(recorder)
    try:
        yield recorder
    finally:
        _here.entropy.remove(recorder)


def _entropy_sums(query, key, query_pos, key_pos, scaling, window) -> torch.Tensor:
    """Entropy of each query's (causal, windowed) attention summed over the queries, [b, h*g] float64;
    in query chunks, like `_column_sums`, so memory stays bounded."""
    b, qh, q_len, _ = query.shape
    n = key.shape[2]
    chunk = max(1, min(q_len, _COLUMN_SUM_BLOCK // max(1, b * qh * n)))
    total = torch.zeros(b, qh, dtype=torch.float64, device=query.device)
    for start in range(0, q_len, chunk):
        stop = min(q_len, start + chunk)
        probs = _grouped_probs(query[:, :, start:stop], key, query_pos[start:stop], key_pos, scaling, window)
        # xlogy: masked slots (p = 0) add 0, not 0 * -inf
        entropy = -torch.special.xlogy(probs, probs).sum(dim=-1)  # [b, h, g, w]
        total += entropy.sum(dim=-1).reshape(b, qh).double()
    return total


def _one_query_sees_all(layer, q_len: int, window: int | None) -> bool:
    """A decode step of one query that may attend every held slot: no window, or a local layer whose every
    slot lies in the window (`RoutedLayer.window_clean`: its window kept nothing older at the last step)."""
    return q_len == 1 and (window is None or layer.window_clean)


def _needs_explicit_mask(layer, q_len: int, window: int | None) -> bool:
    """SDPA's own masking suffices for one query over slots it may all see, or a causal block over an empty
    cache (shorter than a local layer's window)."""
    fresh = layer.retained == q_len and layer.seen == q_len
    if window is not None and q_len > 1:  # a local layer: a block's queries see windows ending where they are
        return not fresh or q_len >= window
    if window is not None:
        return not layer.window_clean
    return q_len > 1 and not fresh


def _allowed(key_pos: torch.Tensor, query_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Boolean [b, h, q, n]: may the query at each position see each slot (causal, optional window)."""
    kp = key_pos[:, :, None, :]
    qp = query_pos[None, None, :, None]
    allowed = kp <= qp
    if window is not None:
        allowed = allowed & (kp > qp - window)
    return allowed


def attention_probs(query, key, query_pos, key_pos, scaling, window=None) -> torch.Tensor:
    """Softmax attention [b, h*g, w, n] in fp32 for the given queries over the held slots."""
    b, qh, w, _ = query.shape
    return _grouped_probs(query, key, query_pos, key_pos, scaling, window).reshape(b, qh, w, -1)


def _grouped_probs(query, key, query_pos, key_pos, scaling, window) -> torch.Tensor:
    """Softmax attention [b, h, g, w, n] (fp32), computed in place to spare memory traffic."""
    b, qh, w, d = query.shape
    h, n = key.shape[1], key.shape[2]
    # [b*h, g*w, d] @ [b*h, d, n]: one batched matmul per KV head, no broadcast copy of the keys (bmm
    # directly: what matmul would call, without its reshaping on every decode step)
    grouped_q = query.reshape(b * h, (qh // h) * w, d).float() * scaling
    scores = torch.bmm(grouped_q, key.float().reshape(b * h, n, d).transpose(-1, -2)).view(b, h, qh // h, w, n)
    if w > 1 or window is not None:  # the newest query sees every held slot: no mask needed
        scores.masked_fill_(~_allowed(key_pos, query_pos, window)[:, :, None], float("-inf"))
    scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
    return scores.div_(scores.sum(dim=-1, keepdim=True))


def _column_sums(query, key, query_pos, key_pos, scaling, window) -> torch.Tensor:
    """Attention summed over every query, [b, h*g, n], in query chunks to bound memory."""
    b, qh, q_len, _ = query.shape
    n = key.shape[2]
    chunk = max(1, min(q_len, _COLUMN_SUM_BLOCK // max(1, b * qh * n)))
    total = torch.zeros(b, qh, n, dtype=torch.float32, device=query.device)
    for start in range(0, q_len, chunk):
        stop = min(q_len, start + chunk)
        probs = _grouped_probs(query[:, :, start:stop], key, query_pos[start:stop], key_pos, scaling, window)
        total += probs.sum(dim=3).reshape(b, qh, n)
    return total


# Query chunk of the fused prompt attention: smaller chunks skip more of the masked upper triangle (at 64,
# a 1,024-token prompt computes 53% of the score matrix) and keep each softmax block in cache; larger
# ones issue fewer operations (the bound that matters on a GPU).
_CAUSAL_CHUNK = {"cpu": 64}
_CAUSAL_CHUNK_DEFAULT = 512
# Accelerators get 8x the CPU's block bound (512 MiB of fp32 scores), so that long prompts still use
# chunks of dozens of queries instead of thousands of tiny launches.
_ACCELERATOR_BLOCK = 8 * _COLUMN_SUM_BLOCK


def _causal_attention_and_column_sums(query, key, value, scaling) -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh prompt's causal attention (query i and slot i both at position i): the layer's output
    [b, n, h*g, d] (as SDPA's, in the query's dtype) and the attention every slot received, summed over
    all queries, [b, h*g, n] (fp32), from one pass in query chunks: each chunk scores only the keys it
    can see, takes one softmax, multiplies it by the values and sums it over its queries. Equal to
    SDPA's output and to `_column_sums` up to float rounding."""
    b, qh, n, d = query.shape
    h, dv = key.shape[1], value.shape[-1]
    g, dtype = qh // h, query.dtype
    if dtype != torch.float32:  # scores, softmax and output in fp32, as the methods score
        query, key, value = query.float(), key.float(), value.float()
    # One KV head's queries as rows ordered (position, query head), scaled once: a chunk of positions is
    # then a contiguous block of rows, and its output block is written in place.
    rows = (query.view(b, h, g, n, d).transpose(2, 3) * scaling).reshape(b * h, n * g, d)
    keys_t = key.reshape(b * h, n, d).transpose(1, 2)
    values = value.reshape(b * h, n, dv)
    chunk = _CAUSAL_CHUNK.get(query.device.type, _CAUSAL_CHUNK_DEFAULT)
    block = _COLUMN_SUM_BLOCK if query.device.type == "cpu" else _ACCELERATOR_BLOCK
    chunk = max(1, min(chunk, n, block // max(1, b * qh * n)))
    # -inf on the keys after each query of a chunk, 0 elsewhere: adding it masks exactly as masked_fill
    # would, in one dense operation
    future = torch.ones(chunk, chunk, dtype=torch.bool, device=query.device).triu_(1)
    bias = torch.zeros(chunk, g, chunk, device=query.device).masked_fill_(future[:, None], float("-inf"))
    output = query.new_empty(b * h, n * g, dv)
    total = query.new_zeros(b * h, g, n)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        w = stop - start
        scores = torch.bmm(rows[:, start * g : stop * g], keys_t[..., :stop]).view(b * h, w, g, stop)
        scores[..., start:].add_(bias[:w, :, :w])
        probs = torch.softmax(scores, dim=-1)
        total[..., :stop] += probs.sum(dim=1)
        torch.bmm(probs.view(b * h, w * g, stop), values[:, :stop], out=output[:, start * g : stop * g])
    output = output.view(b, h, n, g, dv).permute(0, 2, 1, 3, 4).reshape(b, n, qh, dv)
    return output.to(dtype), total.view(b, qh, n)


def _repeat(kv: torch.Tensor, module) -> torch.Tensor:
    return kv.repeat_interleave(module.num_key_value_groups, dim=1)


AttentionInterface.register(ATTN_IMPLEMENTATION, polykv_attention)

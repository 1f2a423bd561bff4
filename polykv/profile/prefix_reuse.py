"""Prefix reuse, the profiler's fast path (the profiler's docstring, `polykv.profile.profiler`): at layer l, every
(scope, method) cell's cache prefilled from one pass of the prompt through the layer (`_prefilled_at`), the
continuation through the layer for all the cells of a scope as one batch (`_layer_outputs`), and the layers above
for every cell's output as one batch and one block over FullKV's prompt keys and values, held once
(`_above`, `_PrefixBlock`)."""

from __future__ import annotations

import torch

from polykv import models
from polykv.plan import Phase
from polykv.profile.cell_plan import single_layer_plan
from polykv.profile.decoder_stack import _Stack
from polykv.runtime import RoutedCache


def _prefilled_at(stack: _Stack, layer: int, cells, capacity: int, prompt_hidden, positions) -> dict:
    """For each (scope, method) cell, a routed cache of its single-layer plan whose layer `layer` holds the
    prompt as the method leaves it: the prompt goes through the layer once, and each cell's layer takes its
    keys, values and attention signals from that pass (`polykv.runtime.many_plans`'s shared prompt)."""
    from transformers.cache_utils import Cache, DynamicLayer

    from polykv.runtime.many_plans import SharedPrompt

    num_layers = len(stack.layers)
    caches = {cell: RoutedCache(single_layer_plan(num_layers, layer, *cell, capacity)) for cell in cells}
    shared = SharedPrompt(layer, [caches[cell].layers[layer] for cell in cells])
    only_this_layer = Cache(layers=[shared if i == layer else DynamicLayer() for i in range(num_layers)])
    stack.run(prompt_hidden, layer, positions[: prompt_hidden.shape[1]], only_this_layer, stop=layer + 1)
    return caches


def _only(layer: int, cache_layer, num_layers: int):
    """A cache whose layer `layer` is `cache_layer` (for a pass through that layer alone)."""
    from transformers.cache_utils import Cache, DynamicLayer

    return Cache(layers=[cache_layer if i == layer else DynamicLayer() for i in range(num_layers)])


def _layer_outputs(
    stack: _Stack, layer: int, cells, caches: dict, entering, prompt: int, positions, keep: int = 0
) -> dict:
    """Layer `layer`'s output over the continuation for every cell [b, M, d], each cell's prompt already in its
    cache; the cells of a scope go through the layer as one batch (`PlanRows`: each its own cache). In the
    decode scope the layer evicts at every step, so the continuation goes token by token (its first `keep`
    tokens, kept in full, as one block); in the prefill scope compression is done and it goes as one block."""
    from polykv.runtime.many_plans import PlanRows

    hidden, later = entering[:, prompt:], positions[prompt:]
    width, outputs = hidden.shape[0], {}
    for scope in (Phase.PREFILL, Phase.DECODE):
        group = [cell for cell in cells if cell[0] is scope]
        if not group:
            continue
        rows = PlanRows(layer, [caches[cell].layers[layer] for cell in group], width)
        cache = _only(layer, rows, len(stack.layers))
        repeated = hidden.repeat(len(group), 1, 1)
        if scope is Phase.PREFILL:
            result = stack.run(repeated, layer, later, cache, stop=layer + 1)
        else:
            spans = ([(0, keep)] if keep else []) + [(t, t + 1) for t in range(keep, hidden.shape[1])]
            steps = [stack.run(repeated[:, a:b], layer, later[a:b], cache, stop=layer + 1) for a, b in spans]
            result = torch.cat(steps, dim=1)
        outputs.update(zip(group, result.split(width)))
    return outputs


# The layers above the profiled one take many cells' continuations as one batch; a chunk of cells is sized so
# that its logits and its attention scores over the prompt stay under this many bytes each.
_CHUNK_BYTES = 1 << 28


def _chunks(cells: list, width: int, continuation: int, prompt: int, model) -> list[list]:
    config = models.text_config(model)
    per_cell = width * continuation * 4 * max(config.vocab_size, config.num_attention_heads * (prompt + continuation))
    size = max(1, _CHUNK_BYTES // per_cell)
    return [cells[i : i + size] for i in range(0, len(cells), size)]


def _above(stack: _Stack, layer: int, hidden, prompt_kv, later, width: int):
    """Logits over the continuation of cells whose layer `layer` output is `hidden` ([cells * width, M, d]),
    through the FullKV layers above it: each attends to FullKV's prompt keys and values (held once for all
    the cells) and to its own continuation (`_PrefixBlock`)."""
    num_layers = len(stack.layers)
    groups = hidden.shape[0] // width
    from transformers.cache_utils import Cache, DynamicLayer

    cache = Cache(
        layers=[_PrefixBlock(j, *prompt_kv[j], groups) if j > layer else DynamicLayer() for j in range(num_layers)]
    )
    return stack.run(hidden, layer + 1, later, cache)


class _PrefixBlock:
    """A FullKV layer above the profiled one, for a block of continuation queries of many cells at once: the
    prompt's keys and values (FullKV's, [b, h, p, d]) are held once and shared by every cell; each cell's
    rows attend to them and, causally, to their own continuation (the block just given to `update`). The
    same attention as a FullKV cache holding prompt + continuation, up to float rounding."""

    is_sliding = False
    is_compileable = False

    def __init__(self, layer_idx: int, keys, values, groups: int):
        self.layer_idx, self.groups = layer_idx, groups
        self.prompt_keys, self.prompt_values = keys, values
        self.new_keys = self.new_values = None

    def update(self, key_states, value_states, *args, **kwargs):
        from polykv.runtime.attention import hand_over

        self.new_keys, self.new_values = key_states, value_states
        hand_over(self)
        return key_states, value_states

    def get_seq_length(self) -> int:
        return self.prompt_keys.shape[-2] + (0 if self.new_keys is None else self.new_keys.shape[-2])

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.prompt_keys.shape[-2] + query_length, 0

    def attend(self, module, query, key, value, dropout: float, scaling: float, kwargs):
        rows, qh, m, d = query.shape
        b, h, p, _ = self.prompt_keys.shape
        c, g = self.groups, qh // h
        # [cells * b, h * g, m, d] -> [cells, b, h, g * m, d]: a KV head's query rows, ordered (head, position)
        q = query.reshape(c, b, h, g * m, d)
        scores = torch.cat(
            [
                torch.matmul(q, self.prompt_keys.transpose(-1, -2)),  # the prompt: shared, broadcast over cells
                torch.matmul(q, key.reshape(c, b, h, m, key.shape[-1]).transpose(-1, -2)),
            ],
            dim=-1,
        ).float()
        scores.mul_(scaling)
        position = torch.arange(m, device=query.device).repeat(g)  # each row's query, 0..m-1 in the block
        keys_at = torch.cat([torch.arange(-p, 0, device=query.device), torch.arange(m, device=query.device)])
        allowed = keys_at[None, :] <= position[:, None]
        window = kwargs.get("sliding_window")
        if window is not None:
            allowed &= keys_at[None, :] > position[:, None] - window
        scores.masked_fill_(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(value.dtype)
        new_values = value.reshape(c, b, h, m, value.shape[-1])
        out = torch.matmul(probs[..., :p], self.prompt_values) + torch.matmul(probs[..., p:], new_values)
        # [cells, b, h, g * m, dv] -> [cells * b, m, h * g, dv], the attention functions' output layout
        out = out.view(c, b, h, g, m, -1).permute(0, 1, 4, 2, 3, 5).reshape(rows, m, qh, -1)
        return out, None

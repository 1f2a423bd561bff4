"""Each attention module's rotary position embedding while PolyKV's attention runs, and the queries before it.

A method that reasons about future queries (ExpectedAttention) needs a step's queries before RoPE and the rotation
at positions not seen yet. transformers hands the attention function the rotated queries only and keeps the rotary
embedding on the decoder (one per layer type on Gemma 3), so while a block is open (`swap.swapped_attention`) each
attention module is mapped to its layer's embedding (`rotaries_known`); `queries_before_rope` turns the step's queries
back (a rotation: exact up to rounding)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

# attention module -> (its decoder's rotary embedding, its layer type or None), while a block is open
_rotaries: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

Rotary = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@contextmanager
def rotaries_known(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block, `rotary_of` finds each attention module's rotary embedding."""
    added = []
    for decoder in model.modules():
        embedding, layers = getattr(decoder, "rotary_emb", None), getattr(decoder, "layers", None)
        if embedding is None or layers is None:
            continue
        layer_types = getattr(decoder.config, "layer_types", None)
        # one embedding for every layer type (Gemma 3 in recent transformers: rope_type per type) or two modules
        # (older releases: rotary_emb_local for the sliding layers)
        by_type = isinstance(getattr(embedding, "rope_type", None), dict)
        local = getattr(decoder, "rotary_emb_local", None)
        for i, layer in enumerate(layers):
            attention = getattr(layer, "self_attn", None)
            if attention is None:
                continue
            layer_type = layer_types[i] if layer_types else None
            if local is not None and layer_type == "sliding_attention":
                _rotaries[attention] = (local, None)
            else:
                _rotaries[attention] = (embedding, layer_type if by_type else None)
            added.append(attention)
    try:
        yield
    finally:
        for attention in added:
            _rotaries.pop(attention, None)


def rotary_of(module: torch.nn.Module, like: torch.Tensor) -> Rotary | None:
    """positions [n] -> (cos, sin) [n, d] in `like`'s dtype, as the model rotates `module`'s queries and keys;
    None outside a block or for a model without a rotary embedding."""
    found = _rotaries.get(module)
    if found is None:
        return None
    embedding, layer_type = found

    def cos_sin(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids = positions.to(like.device).view(1, -1)
        with _unchanged(embedding):  # positions past the model's own may grow a dynamic RoPE's frequencies
            cos, sin = embedding(like, ids) if layer_type is None else embedding(like, ids, layer_type)
        return cos[0], sin[0]

    return cos_sin


@contextmanager
def _unchanged(embedding: torch.nn.Module) -> Iterator[None]:
    """The embedding's buffers and number attributes as they were, whatever a call did (transformers' dynamic RoPE
    grows `inv_freq` and its scaling in place for positions past the cached length)."""
    buffers = {name: buffer.clone() for name, buffer in embedding.named_buffers(recurse=False)}
    numbers = {k: v for k, v in vars(embedding).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    try:
        yield
    finally:
        for name, buffer in buffers.items():
            setattr(embedding, name, buffer)  # a registered buffer's name: it is the buffer again
        for name, value in numbers.items():
            setattr(embedding, name, value)


def queries_before_rope(query: torch.Tensor, positions: torch.Tensor, rotary: Rotary) -> torch.Tensor:
    """[b, h*g, q, d] queries rotated at `positions` [q] -> the queries before the rotation. RoPE maps x to
    x cos + rotate_half(x) sin (cos and sin scaled alike by any attention scaling), whose inverse is
    (y cos - rotate_half(y) sin) / (cos^2 + sin^2)."""
    cos, sin = rotary(positions)
    half = query.shape[-1] // 2
    rotated_half = torch.cat((-query[..., half:], query[..., :half]), dim=-1)
    return (query * cos - rotated_half * sin) / (cos * cos + sin * sin)

"""The decoder run from any layer on given hidden states, with the model's own modules in order (the profiler
passes the prompt and the continuation through chosen layers only)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from polykv import models
from polykv.models import cache_argument_name


class _Stack:
    """Runs the decoder from any layer on given hidden states (the model's own modules, in order)."""

    def __init__(self, model):
        self.model = model
        self.decoder = model.get_decoder()
        self.layers = self.decoder.layers
        self.cache_name = cache_argument_name(model)
        # one rotary embedding for every layer, or one per layer type where the model has several (Gemma 3:
        # local layers rotate with another base than global ones)
        types = getattr(models.text_config(model), "layer_types", None)
        typed = types and "layer_type" in inspect.signature(self.decoder.rotary_emb.forward).parameters
        self.layer_types = list(types) if typed else None

    def _rotary(self, hidden, position_ids) -> list:
        """Each layer's rotary embedding (cos, sin) at these positions."""
        rotary = self.decoder.rotary_emb
        if self.layer_types is None:
            return [rotary(hidden, position_ids)] * len(self.layers)
        by_type = {kind: rotary(hidden, position_ids, kind) for kind in set(self.layer_types)}
        return [by_type[kind] for kind in self.layer_types]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(ids)

    def run(
        self,
        hidden,
        start: int,
        positions: torch.Tensor,
        cache,
        keep: Callable[[int, torch.Tensor], None] | None = None,
        stop: int | None = None,
    ):
        """Layers start..stop on `hidden` at `positions`; returns logits (the hidden state leaving layer
        stop - 1 when stopped early). `keep(l, h)` sees each layer's input (and the last layer's output as
        l = number of layers)."""
        position_ids = positions.unsqueeze(0).expand(hidden.shape[0], -1)
        rotary = self._rotary(hidden, position_ids)
        for idx in range(start, len(self.layers) if stop is None else stop):
            if keep is not None:
                keep(idx, hidden)
            out = self.layers[idx](
                hidden,
                attention_mask=None,  # the routed cache masks by position (causal, and a local layer's window)
                position_ids=position_ids,
                position_embeddings=rotary[idx],
                use_cache=True,
                **{self.cache_name: cache},
            )
            hidden = out[0] if isinstance(out, tuple) else out
        if stop is not None:
            return hidden
        if keep is not None:
            keep(len(self.layers), hidden)
        return self.model.lm_head(self.decoder.norm(hidden))

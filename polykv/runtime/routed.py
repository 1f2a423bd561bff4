"""`routed(model, plan)`: run a plan on an unmodified Hugging Face causal LM.

    with routed(model, plan) as session:
        out = model.generate(input_ids, max_new_tokens=32)
    session.cache.retained_per_layer()

Inside the block the model uses PolyKV's attention function and every forward that starts from an
empty cache gets a fresh `RoutedCache` for the plan (generate() passes its own empty cache; it is
swapped). On exit the model is exactly as before.

A model may be shared by threads (the app caches one model for every browser session). A routed block
belongs to the thread that opened it (`polykv.runtime.swap`): blocks on one model run one after another, the
cache swap applies to the opening thread's forwards only, and another thread's plain forward meanwhile runs the
model's own attention and mask. A block inside another on the same model, in the same thread, is refused.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers.cache_utils import Cache

from polykv.methods import validate_plan
from polykv.models import cache_argument_name, context_length, num_layers
from polykv.plan import Plan
from polykv.runtime.cache import RoutedCache, RoutedCacheError
from polykv.runtime.swap import swapped_attention


class RoutedSession:
    """What `routed()` yields: the plan, the model, and the cache of the latest sequence."""

    def __init__(self, model: torch.nn.Module, plan: Plan):
        self.model = model
        self.plan = plan
        self.cache: RoutedCache | None = None

    def new_cache(self) -> RoutedCache:
        self.cache = RoutedCache(self.plan)
        return self.cache


@contextmanager
def routed(model: torch.nn.Module, plan: Plan) -> Iterator[RoutedSession]:
    validate_plan(plan, num_layers(model), context_length(model))
    session = RoutedSession(model, plan)
    cache_name = cache_argument_name(model)
    owner = threading.get_ident()

    def swap_in_routed_cache(module, args, kwargs):
        if threading.get_ident() != owner:  # another thread's forward: not this session's
            return None
        name = next((k for k in ("cache", "past_key_values") if kwargs.get(k) is not None), cache_name)
        cache = kwargs.get(name)
        if kwargs.get("use_cache") is False:  # plain attention, which gets no mask in this thread
            _refuse_padding(kwargs.get("attention_mask"), "this forward would get no padding mask")
            return None
        if isinstance(cache, RoutedCache):
            return None
        if cache is not None and (not isinstance(cache, Cache) or cache.get_seq_length() > 0):
            raise RoutedCacheError(
                "routed() got a cache it did not create that already holds tokens; pass none, an empty one, "
                "or session.new_cache()"
            )
        _refuse_padding(kwargs.get("attention_mask"), "eviction would score padding as tokens")
        kwargs[name] = session.new_cache()
        return args, kwargs

    with swapped_attention(model):
        handle = model.register_forward_pre_hook(swap_in_routed_cache, with_kwargs=True)
        try:
            yield session
        finally:
            handle.remove()


def _refuse_padding(attention_mask: torch.Tensor | None, why: str) -> None:
    if attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask.all()):
        raise RoutedCacheError(
            f"padded batches are not supported under routed(): {why}; "
            "run prompts of equal length together, or one at a time"
        )

"""`routed(model, plan)`: run a plan on an unmodified Hugging Face causal LM.

    with routed(model, plan) as session:
        out = model.generate(input_ids, max_new_tokens=32)
    session.cache.retained_per_layer()

Inside the block the model uses PolyKV's attention function and every forward that starts from an
empty cache gets a fresh `RoutedCache` for the plan (generate() passes its own empty cache; it is
swapped). On exit the model is exactly as before.

A model may be shared by threads (the app caches one model for every browser session). A routed block
belongs to the thread that opened it: blocks on one model run one after another (`model_lock`), the cache
swap applies to the opening thread's forwards only, and another thread's plain forward meanwhile is the
vanilla computation (PolyKV's attention without a routed cache is SDPA).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers.cache_utils import Cache

from polykv.methods import validate_plan
from polykv.models import cache_argument_name, context_length, num_layers
from polykv.plan import Plan
from polykv.runtime.attention import ATTN_IMPLEMENTATION
from polykv.runtime.cache import CacheOptions, RoutedCache, RoutedCacheError


class RoutedSession:
    """What `routed()` yields: the plan, the model, and the cache of the latest sequence."""

    def __init__(self, model: torch.nn.Module, plan: Plan, options: CacheOptions | None = None):
        self.model = model
        self.plan = plan
        self.options = options
        self.cache: RoutedCache | None = None

    def new_cache(self) -> RoutedCache:
        self.cache = RoutedCache(self.plan, self.options)
        return self.cache


_model_locks: weakref.WeakKeyDictionary[torch.nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_model_locks_guard = threading.Lock()


def model_lock(model: torch.nn.Module) -> threading.RLock:
    """The lock a routed block holds on its model (re-entrant: a block may open another in the same thread)."""
    with _model_locks_guard:
        lock = _model_locks.get(model)
        if lock is None:
            lock = _model_locks[model] = threading.RLock()
        return lock


@contextmanager
def routed(model: torch.nn.Module, plan: Plan, options: CacheOptions | None = None) -> Iterator[RoutedSession]:
    validate_plan(plan, num_layers(model), context_length(model))
    session = RoutedSession(model, plan, options)
    cache_name = cache_argument_name(model)
    owner = threading.get_ident()

    def swap_in_routed_cache(module, args, kwargs):
        if threading.get_ident() != owner:  # another thread's forward: not this session's
            return None
        name = next((k for k in ("cache", "past_key_values") if kwargs.get(k) is not None), cache_name)
        cache = kwargs.get(name)
        if isinstance(cache, RoutedCache) or kwargs.get("use_cache") is False:
            return None
        if cache is not None and (not isinstance(cache, Cache) or cache.get_seq_length() > 0):
            raise RoutedCacheError(
                "routed() got a cache it did not create that already holds tokens; pass none, an empty one, "
                "or session.new_cache()"
            )
        _refuse_padding(kwargs.get("attention_mask"))
        kwargs[name] = session.new_cache()
        return args, kwargs

    with model_lock(model):
        previous = model.config._attn_implementation
        handle = model.register_forward_pre_hook(swap_in_routed_cache, with_kwargs=True)
        _set_attention(model, ATTN_IMPLEMENTATION)
        try:
            yield session
        finally:
            handle.remove()
            _set_attention(model, previous)


def _refuse_padding(attention_mask: torch.Tensor | None) -> None:
    if attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask.all()):
        raise RoutedCacheError(
            "padded batches are not supported: eviction would score padding as tokens; "
            "run prompts of equal length together, or one at a time"
        )


def _set_attention(model: torch.nn.Module, name: str) -> None:
    try:
        model.set_attn_implementation(name)
    except (AttributeError, ValueError):
        model.config._attn_implementation = name

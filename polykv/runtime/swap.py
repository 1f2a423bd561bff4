"""Swapping a model's attention for PolyKV's, for the forwards of one thread (`swapped_attention`).

A model may be shared by threads (the app caches one model for every browser session), but its attention
implementation is one setting of its config, which every thread's forward reads. So the swap is made once per
block and the block decides, per thread:
  * the thread that opened it runs PolyKV's attention (and no mask from transformers: PolyKV builds its masks
    from the true slot positions);
  * every other thread's forward falls through to the model's own attention and mask (`own_attention`,
    `own_mask`), so a padded batch there keeps its padding mask and its exact numbers.
Blocks on one model run one after another (`model_lock`): a second thread's block waits until the first has
put the model back. A thread cannot open a block on a model it already has one open on: the inner block's plan
would be ignored, so it is refused.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from polykv.errors import RoutedCacheError
from polykv.runtime.garbage import old_objects_frozen
from polykv.runtime.rotary import rotaries_known

ATTN_IMPLEMENTATION = "polykv"

_model_locks: weakref.WeakKeyDictionary[torch.nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_model_locks_guard = threading.Lock()
# id(config) -> the attention implementation it had before the open block swapped it (one block per model at a
# time, whichever thread opened it)
_own_implementation: dict[int, str] = {}


class _ThreadBlocks(threading.local):
    """The models this thread has a block open on, and their configs (the attention modules' and the masks')."""

    def __init__(self):
        self.models: set[int] = set()
        self.configs: set[int] = set()


_here = _ThreadBlocks()


def model_lock(model: torch.nn.Module) -> threading.RLock:
    """The lock a block holds on its model while it is open."""
    with _model_locks_guard:
        lock = _model_locks.get(model)
        if lock is None:
            lock = _model_locks[model] = threading.RLock()
        return lock


@contextmanager
def swapped_attention(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block, this thread's forwards of `model` run PolyKV's attention and other threads' forwards run
    the model's own (see the module docstring); on exit the model is as before. Holds the model's lock; a second
    block on the same model in the same thread is refused (RoutedCacheError). Garbage collections skip the objects
    alive when the process's first block opened (`polykv.runtime.garbage`)."""
    if id(model) in _here.models:
        raise RoutedCacheError(
            "routed() or many() is already open on this model in this thread, and a block inside it would run the "
            "outer block's caches, not its own plan: close one block before opening the next"
        )
    with (
        model_lock(model),
        old_objects_frozen(),
        rotaries_known(model),
    ):  # the first block's: the model's objects out of every full collection's walk
        configs = _configs(model)
        previous = model.config._attn_implementation
        for config in configs:  # recorded before the swap: another thread's forward may look them up at once
            _own_implementation[id(config)] = config._attn_implementation
        _here.models.add(id(model))
        _here.configs.update(id(config) for config in configs)
        try:
            _set_attention(model, ATTN_IMPLEMENTATION)
            yield
        finally:
            _set_attention(model, previous)
            _here.models.discard(id(model))
            _here.configs.difference_update(id(config) for config in configs)
            for config in configs:
                _own_implementation.pop(id(config), None)


def runs_polykv_here(config) -> bool:
    """Does this thread have a block open on the model of `config` (its own config or a sub-model's)?"""
    return id(config) in _here.configs


def own_attention(module) -> Callable:
    """The attention function a forward of `module` (an attention module) runs outside PolyKV: for another
    thread's forward while a block is open, the model's own implementation; else SDPA (a forward in the block's
    own thread without a routed cache, e.g. use_cache=False, whose mask is None and causal)."""
    config = getattr(module, "config", None)
    name = None if config is None or runs_polykv_here(config) else _own_name(config)
    if name is None or name == "sdpa":
        return sdpa_attention_forward
    if name == "eager":  # transformers' eager attention is each model's own function, in its modeling module
        return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", sdpa_attention_forward)
    return ALL_ATTENTION_FUNCTIONS[name] if name in ALL_ATTENTION_FUNCTIONS else sdpa_attention_forward


def own_mask(*args, config=None, **kwargs):
    """The attention mask transformers builds for `polykv` (registered as its mask function): none for the
    forwards of the thread that opened the block (PolyKV masks by slot position; padding is refused there), and
    the model's own implementation's mask for every other thread's forward."""
    if config is None or runs_polykv_here(config):
        return None
    name = _own_name(config)
    if name not in ALL_MASK_ATTENTION_FUNCTIONS:  # an implementation with no mask function: transformers builds none
        return None
    return ALL_MASK_ATTENTION_FUNCTIONS[name](*args, config=config, **kwargs)


def _own_name(config) -> str:
    """The model's own attention implementation: recorded while a block is open; once the block has put the model
    back (a forward of another thread may be between its mask and its layers then), the live setting."""
    name = _own_implementation.get(id(config))
    if name is None:
        live = getattr(config, "_attn_implementation", None)
        name = live if live and live != ATTN_IMPLEMENTATION else "sdpa"
    return name


def _configs(model: torch.nn.Module) -> list:
    """Every config object the model's modules read their attention implementation from (one for a plain causal
    LM; a multimodal model's sub-models have their own)."""
    found = {id(model.config): model.config}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            found.setdefault(id(config), config)
    return list(found.values())


def _set_attention(model: torch.nn.Module, name: str) -> None:
    try:
        model.set_attn_implementation(name)
    except (AttributeError, ValueError):
        model.config._attn_implementation = name

"""Garbage collection around routed and batched blocks (`polykv.runtime.garbage`): the first block collects and
freezes what is alive (every later collection skips it) and it stays frozen; objects made after, inside blocks or
between them, are collected as usual (a batch's caches are reference cycles: they must not pile up frozen), and a
process's own freeze is left alone.

The collector's generations are one per process, and a test before these may have opened blocks already: so each
scenario runs in a fresh Python process. Those that need no model load the module from its file, so that the process
need not import torch (5 s) for it."""

from __future__ import annotations

import gc
import importlib.util
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def old_objects_frozen():
    """`polykv.runtime.garbage.old_objects_frozen()`, the module loaded from its file (it imports no other)."""
    module = sys.modules.get("polykv_runtime_garbage")
    if module is None:
        spec = importlib.util.spec_from_file_location("polykv_runtime_garbage", ROOT / "polykv/runtime/garbage.py")
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module.old_objects_frozen()


class _Node:
    """An object in a reference cycle: only the cycle collector frees it."""

    def __init__(self):
        self.me = self


def the_first_block_freezes_what_is_alive_and_it_stays_frozen():
    from polykv.models import num_layers
    from polykv.plan import Plan
    from polykv.runtime import routed
    from polykv.runtime.many_plans import many
    from tests.helpers import tiny_model

    model = tiny_model("llama")
    kept = _Node()  # alive at the first block: frozen with it
    node = weakref.ref(kept)
    gc.collect()
    tracked = len(gc.get_objects())
    with routed(model, Plan.homogeneous("full", None, num_layers(model))):
        frozen = gc.get_freeze_count()
        assert frozen >= tracked
    with many(model, []):
        pass
    assert 0 < gc.get_freeze_count() <= frozen  # nothing more frozen (a frozen object freed by its count leaves it)
    del kept
    gc.collect()
    assert node() is not None  # still frozen after both blocks closed: no collection walks it


def a_model_alive_at_the_first_block_is_freed_when_dropped():
    from polykv.models import num_layers
    from polykv.plan import Plan
    from polykv.runtime import routed
    from tests.helpers import tiny_model

    model = tiny_model("llama")
    with routed(model, Plan.homogeneous("full", None, num_layers(model))):
        pass
    dropped, weights = weakref.ref(model), weakref.ref(next(model.parameters()))
    del model
    assert dropped() is None and weights() is None  # by reference counts alone: frozen or not, nothing leaks


def the_caches_of_earlier_batches_are_collected():
    import torch

    from polykv.models import num_layers
    from polykv.plan import Plan
    from polykv.runtime.many_plans import many
    from tests.helpers import tiny_model

    model = tiny_model("llama")
    plans = [Plan.homogeneous(m, 8, num_layers(model), "prefill") for m in ("tova", "keydiff")]
    caches, frozen = [], []
    for _ in range(3):  # each batch is dropped only after the next block has opened
        with many(model, plans) as batched:
            frozen.append(gc.get_freeze_count())
            batch, _ = batched.prefill(torch.arange(3, 40))
            caches += [weakref.ref(cache) for cache in batch.caches]
    del batch
    gc.collect()
    assert [cache() for cache in caches] == [None] * len(caches)
    assert frozen == sorted(frozen, reverse=True)  # no later block froze an earlier batch


def a_cycle_made_inside_a_block_is_collected_inside_it():
    with old_objects_frozen():
        node = weakref.ref(_Node())
        gc.collect()
        assert node() is None


def a_cycle_made_between_blocks_is_collected_when_it_is_dropped():
    with old_objects_frozen():
        pass
    kept = _Node()
    node = weakref.ref(kept)
    with old_objects_frozen():
        del kept
        gc.collect()
        assert node() is None


def garbage_left_before_the_first_block_is_collected_not_frozen():
    gc.disable()
    node = weakref.ref(_Node())  # unreachable at once, but only a collection frees it
    assert node() is not None
    with old_objects_frozen():
        assert node() is None


def a_process_that_froze_objects_itself_keeps_its_own_freeze():
    gc.freeze()
    frozen = gc.get_freeze_count()
    kept = _Node()
    with old_objects_frozen():
        pass
    assert gc.get_freeze_count() <= frozen  # the block froze nothing more
    node = weakref.ref(kept)
    del kept
    gc.collect()
    assert node() is None


SCENARIOS = [
    the_first_block_freezes_what_is_alive_and_it_stays_frozen,
    a_model_alive_at_the_first_block_is_freed_when_dropped,
    the_caches_of_earlier_batches_are_collected,
    a_cycle_made_inside_a_block_is_collected_inside_it,
    a_cycle_made_between_blocks_is_collected_when_it_is_dropped,
    garbage_left_before_the_first_block_is_collected_not_frozen,
    a_process_that_froze_objects_itself_keeps_its_own_freeze,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
def test_garbage_collection_in_a_fresh_process(scenario):
    code = f"import gc, tests.test_garbage as t; assert gc.get_freeze_count() == 0; t.{scenario.__name__}()"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]

"""Garbage collection inside routed and batched blocks (`polykv.runtime.garbage`): the objects made before the block
are frozen (every collection skips them) until the last open block closes; objects made inside are collected as
usual; nothing is lost, and a process's own freeze is left alone.

The collector's generations are one per process, and a test before these may leave a thread that still opens blocks
(an app's script run past its test): so each scenario runs in a fresh Python process. All but the first load the
module from its file, so that the process need not import torch (5 s) for it."""

from __future__ import annotations

import gc
import importlib.util
import subprocess
import sys
import threading
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


def routed_and_batched_blocks_freeze_what_was_made_before_them_and_unfreeze_it_on_exit():
    from polykv.models import num_layers
    from polykv.plan import Plan
    from polykv.runtime import routed
    from polykv.runtime.many_plans import many
    from tests.helpers import tiny_model

    model = tiny_model("llama")
    for opened in (routed(model, Plan.homogeneous("full", None, num_layers(model))), many(model, [])):
        gc.collect()
        tracked = len(gc.get_objects())
        with opened:
            assert gc.get_freeze_count() >= tracked
        assert gc.get_freeze_count() == 0


def a_cycle_made_inside_the_block_is_collected_inside_it():
    with old_objects_frozen():
        node = weakref.ref(_Node())
        gc.collect()
        assert node() is None


def a_cycle_made_before_the_block_and_dropped_inside_it_is_collected_after_it():
    kept = _Node()
    node = weakref.ref(kept)
    with old_objects_frozen():
        del kept
        gc.collect()
        assert node() is not None  # frozen: no collection walks it inside the block
    gc.collect()
    assert node() is None


def an_exception_inside_the_block_unfreezes():
    try:
        with old_objects_frozen():
            assert gc.get_freeze_count() > 0
            raise RuntimeError("inside")
    except RuntimeError:
        pass
    assert gc.get_freeze_count() == 0


def a_process_that_froze_objects_itself_keeps_them_frozen():
    gc.freeze()
    frozen = gc.get_freeze_count()
    with old_objects_frozen():
        pass
    assert gc.get_freeze_count() >= frozen


def objects_stay_frozen_until_the_last_block_open_in_any_thread_closes():
    first_open, second_done, first_may_close = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, int] = {}

    def first():
        with old_objects_frozen():
            first_open.set()
            first_may_close.wait(10)

    def second():
        first_open.wait(10)
        with old_objects_frozen():
            pass
        seen["after the second closed"] = gc.get_freeze_count()
        second_done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    second_done.wait(10)
    first_may_close.set()
    for thread in threads:
        thread.join(10)
    assert seen["after the second closed"] > 0
    assert gc.get_freeze_count() == 0


SCENARIOS = [
    routed_and_batched_blocks_freeze_what_was_made_before_them_and_unfreeze_it_on_exit,
    a_cycle_made_inside_the_block_is_collected_inside_it,
    a_cycle_made_before_the_block_and_dropped_inside_it_is_collected_after_it,
    an_exception_inside_the_block_unfreezes,
    a_process_that_froze_objects_itself_keeps_them_frozen,
    objects_stay_frozen_until_the_last_block_open_in_any_thread_closes,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
def test_garbage_collection_in_a_fresh_process(scenario):
    code = f"import gc, tests.test_garbage as t; assert gc.get_freeze_count() == 0; t.{scenario.__name__}()"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]

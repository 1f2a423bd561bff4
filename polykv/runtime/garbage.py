"""Full garbage collections that skip the objects alive when the process's first routed or batched block opened
(`old_objects_frozen`).

A full collection of Python's garbage collector walks every object it tracks. After loading torch, transformers
and a model a process tracks over 400,000 of them (smollm2: 416,000), so one full collection took 0.3-1.0 s on
this project's 2-core machine, and scoring one RULER sample with the smollm2 study's 46 plans set off about one
(benchmarks/README.md, "Full garbage collections"). Those objects (torch, transformers, the model) mostly live as
long as the process, so the first block collects once and freezes what is left (`gc.freeze`: every later collection
skips it), and they stay frozen: objects made after it, inside blocks or between them, are collected as usual (a
model loaded later is walked by full collections again: slower, not wrong).

Freezing again at each block, and unfreezing when it closed, leaked: a routed cache is a reference cycle (its layers
and their merge groups point at each other), and a batch dropped after its block was still uncollected when the
next block opened, so that block froze it too, and so on, sample after sample (`benchmarks/batch_memory.py`; the
likely cause of a gemma3 leaderboard's process growing 0.25-0.4 GB a sample). What this costs instead: a cycle among
objects alive at the first block that becomes garbage later is never collected (a model is freed by reference counts
alone, so dropping one frees it: tests/test_garbage.py). A process that froze objects itself before the first block
keeps its own freeze: blocks then leave the collector alone.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_decided = False  # whether the first block has looked (and frozen, unless the process had frozen objects itself)


@contextmanager
def old_objects_frozen() -> Iterator[None]:
    """From the process's first block on, collections skip every object alive when it opened; see the module
    docstring."""
    global _decided
    with _lock:
        if not _decided:
            if gc.get_freeze_count() == 0:
                gc.collect()  # garbage frozen now would never be collected
                gc.freeze()
            _decided = True  # after the freeze: an interrupted collection leaves the next block to try again
    yield


__all__ = ["old_objects_frozen"]

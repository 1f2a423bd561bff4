"""Full garbage collections that skip the objects made before a routed or batched block (`old_objects_frozen`).

A full collection of Python's garbage collector walks every object it tracks. After loading torch, transformers
and a model a process tracks over 400,000 of them (smollm2: 416,000), so one full collection took 0.3-1.0 s on
this project's 2-core machine, and scoring one RULER sample with the smollm2 study's 46 plans set off about one
(benchmarks/README.md, "Full garbage collections"). Those objects were alive before the block and nothing in it
frees them, so the block freezes them (`gc.freeze`: every collection ignores them) and unfreezes them when the last
open block closes (`gc.unfreeze`: they go back to the oldest generation and are collected as before). Objects made
inside the block are collected as usual; a cycle among frozen objects that becomes garbage inside the block is
collected after it. A process that froze objects itself before the first block keeps them frozen: blocks then leave
the collector alone (what it freezes while a block is open is unfrozen with the block's).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_open = 0  # blocks open now, in every thread
_froze = False  # whether the first of them froze (and so the last one unfreezes)


@contextmanager
def old_objects_frozen() -> Iterator[None]:
    """Inside the block (and any block open in another thread at the same time), collections skip every object
    made before the first of them opened; see the module docstring."""
    global _open, _froze
    counted = False
    try:
        with _lock:
            if _open == 0:
                _froze = gc.get_freeze_count() == 0
            _open += 1
            counted = True
            if _open == 1 and _froze:
                gc.freeze()
        yield
    finally:
        if counted:  # an exception may land anywhere: undo only what was done
            with _lock:
                _open -= 1
                if _open == 0 and _froze:
                    gc.unfreeze()
                    _froze = False


__all__ = ["old_objects_frozen"]

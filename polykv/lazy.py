"""Import a heavy module (torch) on first use, so commands that never touch a tensor start fast.

`polykv.methods` is imported by `polykv plan validate`, `polykv methods` and the jobs listing, which
need each method's name, phases and parameters but no tensor; importing torch costs 1.5 s or more.
The method modules therefore say `from polykv.lazy import torch` (`lazy_import("torch")`): the standard
library's `LazyLoader` registers the module and runs its code on the first attribute access; a type checker sees
torch itself. Once loaded it is the ordinary module object, so the per-step path pays nothing. When torch is
already imported, this returns it.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch as torch  # what `from polykv.lazy import torch` is to a type checker

_lock = threading.Lock()


def lazy_import(name: str) -> ModuleType:
    with _lock:
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            raise ModuleNotFoundError(f"no module named {name!r}", name=name)
        loader = importlib.util.LazyLoader(spec.loader)
        spec.loader = loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        loader.exec_module(module)
        return module


def __getattr__(name: str) -> ModuleType:
    """`from polykv.lazy import torch`: torch, run on first use (`lazy_import`)."""
    if name == "torch":
        return lazy_import("torch")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["lazy_import"]


def no_grad(function):
    """`torch.no_grad()` as a decorator that imports torch when the function runs, not when it is defined
    (so modules whose settings the CLI checks before any tensor work import fast)."""

    @functools.wraps(function)
    def without_gradients(*args, **kwargs):
        with lazy_import("torch").no_grad():
            return function(*args, **kwargs)

    return without_gradients

"""One error type for every failure that is the user's doing: a bad file, a bad value, a stale profile.

`PolyKVError` and its subclasses carry a message that is one line naming the problem; the CLI and the
app show exactly that line (the CLI exits with code 2). Anything else that escapes is a bug: the CLI
then says so in one line too and shows the traceback only under `POLYKV_DEBUG=1`.

They subclass `ValueError` so that code written before this module (and callers that catch
`ValueError`) keeps working.
"""

from __future__ import annotations

import os


class PolyKVError(ValueError):
    """A user-facing failure; `str()` is one line."""


class FileError(PolyKVError):
    """A file that cannot be read or written as asked (not a regular file, too large, not JSON ...)."""


class SettingsError(PolyKVError):
    """Suite settings, budgets, a backend name or another option that does not parse."""


class StoreError(PolyKVError):
    """The results database cannot be opened or read (damaged, foreign, newer schema, read-only)."""


class JobError(PolyKVError):
    """A job that does not exist, is damaged, or cannot be cancelled or resumed now."""


class RoutedCacheError(PolyKVError, RuntimeError):
    """The routed cache was used in a way it cannot honour (one line, says what to do)."""


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (its class name when it has none)."""
    for line in str(exc).strip().splitlines():
        if line.strip():
            return line.strip()
    return exc.__class__.__name__


def debug() -> bool:
    """`POLYKV_DEBUG=1`: show tracebacks instead of one-line messages."""
    return os.environ.get("POLYKV_DEBUG", "") not in ("", "0")


__all__ = [
    "FileError",
    "JobError",
    "PolyKVError",
    "RoutedCacheError",
    "SettingsError",
    "StoreError",
    "debug",
    "first_line",
]

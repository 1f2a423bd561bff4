"""One error type for every failure that is the user's doing: a bad file, a bad value, a stale profile.

`PolyKVError` and its subclasses carry a message that is one line naming the problem; the CLI and the
app show exactly that line (the CLI exits with code 2). Anything else that escapes is a bug: the CLI
then says so in one line too and shows the traceback only under `POLYKV_DEBUG=1`.

They subclass `ValueError` so that code written before this module (and callers that catch
`ValueError`) keeps working.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any


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


def describe_error(err: Mapping[str, Any], where: str | None = None) -> str:
    """One pydantic error as `field: what is wrong (got value)`; `where` names the field instead of the
    error's location (empty: no field, e.g. a check of the whole object)."""
    if where is None:
        where = ".".join(str(x) for x in err.get("loc", ()))
    kind = err.get("type")
    if kind == "missing":
        msg = "required field is missing"
    elif kind == "extra_forbidden":
        msg = "unknown field"
    elif kind in ("model_type", "model_attributes_type", "dict_type", "dataclass_type"):
        msg = f"should be a JSON object (got {json.dumps(err.get('input'), default=str)[:60]})"
    else:
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if "input" in err and kind != "value_error":
            msg = f"{msg} (got {json.dumps(err['input'], default=str)[:60]})"
    return f"{where}: {msg}" if where else msg


def validation_line(exc: Any, where: str | None = None) -> str:
    """The first problem of a pydantic `ValidationError`, in one line, and how many more there are."""
    errors = exc.errors()
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return describe_error(errors[0], where).splitlines()[0][:300] + more


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
    "describe_error",
    "validation_line",
    "StoreError",
    "debug",
    "first_line",
]


def script_exit(main) -> int:
    """Run a module's `main()` (`python -m polykv...`) as the CLI runs a command: a user error (a file that is
    not what the script reads, a missing one) prints `error: <one line>` and returns 2; the traceback only
    under POLYKV_DEBUG=1."""
    import sys

    try:
        return main()
    except (PolyKVError, OSError, ValueError, KeyError, TypeError) as exc:
        if debug():
            raise
        print(f"error: {first_line(exc)}", file=sys.stderr)
        return 2

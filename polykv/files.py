"""Reading and writing the files a user can hand us, safely.

Reading: only regular files (a device such as /dev/zero, a FIFO or a directory is refused before it is
opened, so nothing hangs or fills memory), at most `max_bytes`, UTF-8, and for JSON at most `max_depth`
levels of nesting, no key twice in one object (JSON leaves that undefined; Python would keep the last)
and no NaN/Infinity unless asked for.

Writing: write to a temporary file beside the target, then rename it into place, so a reader never
sees half a file and a crash leaves the old one. Only regular files or new paths are written (a
device, FIFO or directory at the target is refused); a symlink is written through to its target, so
the link stays a link; a new file gets the mode the umask gives (not mkstemp's 0600) and an existing
one keeps its mode.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from polykv.errors import FileError, PolyKVError, first_line

MAX_JSON_BYTES = 16 * 1024 * 1024  # plans, profiles and jobs are far smaller; this bounds memory only
MAX_DEPTH = 32  # a plan nests 5 levels (plan, layers, layer, phase, params); params may nest a little


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def refuse_special_file(path: str | os.PathLike, what: str, error: type[PolyKVError] = FileError) -> None:
    """`error` (one line) when `path` exists and is not a regular file: opening a FIFO blocks until a writer
    comes, and a device can be endless. A missing path passes (the caller decides what that means)."""
    _regular_or_missing(Path(path), what, error)


def _regular_or_missing(path: Path, what: str, error: type[PolyKVError]) -> os.stat_result | None:
    """`path`'s stat (None: missing); `error` for anything but a regular file or a missing path."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror or exc.__class__.__name__})") from None
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{path}: {_kind(info.st_mode)}, not a {what}")
    return info


def read_text(
    path: str | os.PathLike, what: str = "file", max_bytes: int = MAX_JSON_BYTES, error: type[PolyKVError] = FileError
) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`; `error` (one line) otherwise."""
    path = Path(path)
    info = _regular_or_missing(path, what, error)
    if info is None:
        raise error(f"{path}: no such {what}")
    if info.st_size > max_bytes:
        raise error(f"{path}: {what} is {info.st_size:,} bytes, more than the {max_bytes:,} PolyKV reads")
    try:
        # O_NONBLOCK: should the path turn into a FIFO after the check, opening it still cannot hang
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise error(f"{path}: not a regular file, not a {what}")
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror or exc.__class__.__name__})") from None
    if len(data) > max_bytes:
        raise error(f"{path}: {what} is more than the {max_bytes:,} bytes PolyKV reads")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: {what} is not UTF-8 text") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"key {json.dumps(key)[:60]} appears twice in one object")
        data[key] = value
    return data


def parse_json(
    text: str | bytes,
    what: str | None = None,
    max_depth: int = MAX_DEPTH,
    allow_nan: bool = False,
    error: type[PolyKVError] = FileError,
) -> Any:
    """Parse JSON text; `error` (one line, starting with `what` when given) for malformed, too deeply
    nested, duplicate-key or (unless allowed) NaN input."""
    at = f"{what}: " if what else ""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise error(f"{at}not UTF-8 text") from None
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=None if allow_nan else _reject_constant)
    except json.JSONDecodeError as exc:
        raise error(f"{at}malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise error(f"{at}nested more than {max_depth} levels deep") from None
    except ValueError as exc:  # NaN / Infinity, a duplicate key, or an integer with too many digits
        raise error(f"{at}{first_line(exc)}") from None
    if depth(data) > max_depth:
        raise error(f"{at}nested more than {max_depth} levels deep")
    return data


def depth(data: Any) -> int:
    """How deeply lists and objects nest (a scalar is 0); iterative, so any depth is safe to measure."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def read_json(
    path: str | os.PathLike,
    what: str = "JSON file",
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_DEPTH,
    allow_nan: bool = False,
    error: type[PolyKVError] = FileError,
) -> Any:
    """`read_text` then `parse_json`, with the path in every message."""
    text = read_text(path, what, max_bytes, error)
    try:
        return parse_json(text, None, max_depth, allow_nan, error)
    except PolyKVError as exc:
        raise error(f"{path}: {exc}") from None


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask would, briefly, for every thread)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def writable_target(path: str | os.PathLike) -> Path:
    """Where writing `path` really goes (a symlink's target); FileError unless that is a regular file or new."""
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        info = os.stat(target)
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise FileError(f"{path}: cannot write ({exc.strerror or exc.__class__.__name__})") from None
    if not stat.S_ISREG(info.st_mode):
        raise FileError(f"{path}: {_kind(info.st_mode)}; PolyKV writes only regular files or new paths")
    return target


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` (UTF-8) through a temporary file and a rename; returns `path`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file and a rename; returns `path`."""
    path = Path(path)
    target = writable_target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | os.PathLike, data: Any, indent: int | None = 1) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=indent) + "\n")


__all__ = [
    "MAX_DEPTH",
    "MAX_JSON_BYTES",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "depth",
    "file_lock",
    "parse_json",
    "read_json",
    "read_text",
    "refuse_special_file",
    "try_file_lock",
    "writable_target",
]


@contextlib.contextmanager
def file_lock(path: Path, timeout: float | None = None) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` where the platform has flock (no-op elsewhere). `timeout`: seconds to
    wait for another holder before a FileError naming the lock (None: wait as long as it takes)."""
    try:
        import fcntl
    except ImportError:  # Windows: the import is still atomic, only duplicated work is possible
        yield
        return
    with path.open("a") as handle:
        if timeout is None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        else:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise FileError(
                            f"{path}: another process has held this lock for over {timeout:g} s; if none is running, "
                            "delete the file"
                        ) from None
                    time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def try_file_lock(path: Path) -> Iterator[bool]:
    """The lock of `file_lock` if it is free now (yields True, held until the block ends), else False at
    once; True where the platform has no flock. A process that dies releases its locks, so a free lock
    means that no live process holds it."""
    try:
        import fcntl
    except ImportError:
        yield True
        return
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_report(path, fmt: str, what: str) -> dict:
    """A JSON report PolyKV wrote (its "format" is `fmt`), or FileError in one line naming what it is instead."""
    data = read_json(path, what)
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise FileError(f'{path} is not a {what} (a report.json with "format": "{fmt}")')
    return data

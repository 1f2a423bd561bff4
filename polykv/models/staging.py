"""Model directories written whole, and what a killed writer leaves behind removed.

A converted or imported model directory NAME is assembled beside its target, in `.NAME.partial-*`, and
renamed into place (an old NAME is moved aside to `.NAME.old-*` first and deleted after), so a reader
finds the old directory or the new one, never half of one. In PolyKV's model cache every such write
holds the lock `.NAME.lock`; a process killed in the middle (kill -9, a power cut) cannot clean up,
but its lock dies with it, so the next process that finds the lock free knows the leftovers are
abandoned and removes them.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from polykv.files import try_file_lock

_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(partial|old)-[^/]+$")


def lock_path(target: Path) -> Path:
    """The lock that every write of the model directory `target` holds."""
    return target.parent / f".{target.name}.lock"


@contextmanager
def staged(out_dir: Path) -> Iterator[Path]:
    """A new directory beside `out_dir` to fill; renamed onto `out_dir` when the block ends, removed
    if it fails."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        os.chmod(staging, 0o755)  # mkdtemp makes it private; the result is an ordinary directory
        yield staging
        replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def replace_dir(new: Path, target: Path) -> None:
    """Rename `new` to `target`; an existing `target` is moved aside first, then deleted."""
    if not target.exists():
        os.rename(new, target)
        return
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)  # put the previous directory back
        raise
    shutil.rmtree(old, ignore_errors=True)


def remove_abandoned(folder: Path) -> list[Path]:
    """Remove the `.NAME.partial-*` and `.NAME.old-*` directories in `folder` whose lock is free (no live
    process is writing NAME); returns what was removed. A write in progress holds its lock and is left alone."""
    removed = []
    for entry in sorted(folder.glob(".*-*")):
        found = _LEFTOVER.match(entry.name)
        if found is None or not entry.is_dir() or entry.is_symlink():
            continue
        with try_file_lock(lock_path(folder / found["name"])) as free:
            if free and entry.exists():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed

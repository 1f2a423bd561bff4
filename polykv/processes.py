"""What the operating system says about a process: is it there, when did it start, what does it run.

A pid alone does not name a process (pids get reused), so PolyKV records a worker as (pid, start time,
host) and checks all of them before it reports the worker alive or signals it. Linux answers through
/proc; elsewhere only "a process with this pid exists" can be asked, and callers say so.
"""

from __future__ import annotations

import os
from pathlib import Path


def die_with_parent(parent: int) -> None:
    """End this process when `parent`, the process that started it, dies, whatever kills it: on Linux the kernel
    is asked to send SIGTERM then (prctl PR_SET_PDEATHSIG); elsewhere, and should the parent already be gone,
    the check of the parent's pid is all there is. For helpers that exist only for their parent's call."""
    import signal
    import sys

    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def have_proc() -> bool:
    return Path("/proc/self/stat").is_file()


def proc_state(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of `pid` from /proc/<pid>/stat, or None when
    there is no such process (or no /proc). Field 2, the command name, may hold spaces and ')': the
    fields after it start after the last ')'."""
    try:
        raw = Path(f"/proc/{int(pid)}/stat").read_bytes()
    except (OSError, ValueError):
        return None
    _, paren, rest = raw.rpartition(b")")
    fields = rest.split()
    if not paren or len(fields) < 20:
        return None
    try:
        return fields[0].decode(), int(fields[19])  # fields 3 (state) and 22 (starttime)
    except ValueError:
        return None


def start_time(pid: int) -> int | None:
    state = proc_state(pid)
    return None if state is None else state[1]


def running(state: tuple[str, int] | None) -> bool:
    """A process that exists and has not exited (a zombie has exited and waits to be reaped)."""
    return state is not None and state[0] not in ("Z", "X")


def cmdline(pid: int) -> list[str] | None:
    """The argv of `pid`, or None when it cannot be read."""
    try:
        raw = Path(f"/proc/{int(pid)}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    parts = raw.split(b"\0")
    if parts and parts[-1] == b"":  # each argument ends in NUL
        parts.pop()
    return [os.fsdecode(p) for p in parts]


def pid_exists(pid: int) -> bool:
    """Without /proc: does some process (perhaps another user's) have this pid?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, but is not ours
        return True
    return True


__all__ = ["cmdline", "have_proc", "pid_exists", "proc_state", "running", "start_time"]

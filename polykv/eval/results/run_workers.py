"""The process that executes a run (pid, host and the process's start time), and how a reader reports a run
whose worker is gone: stored as "running", it was killed and reads as "stopped" (it can be resumed)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from polykv import processes

WORKER_FIELDS = ("worker_pid", "worker_host", "worker_started")


def process_start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, as text for the database), or None where
    there is no /proc (not Linux) or no such process. With the pid it names one process."""
    ticks = processes.start_time(pid)
    return None if ticks is None else str(ticks)


@dataclass(frozen=True)
class Worker:
    """The process that executes a run."""

    pid: int
    host: str
    started: str | None  # process_start_time(pid); None where it cannot be read

    @classmethod
    def current(cls) -> Worker:
        return cls(os.getpid(), socket.gethostname(), process_start_time(os.getpid()))

    def alive(self) -> bool | None:
        """True or False for a worker on this host; None (cannot tell) for one on another host."""
        if self.host != socket.gethostname():
            return None
        if processes.have_proc():
            state = processes.proc_state(self.pid)
            return (
                state is not None
                and processes.running(state)
                and (self.started is None or str(state[1]) == self.started)
            )
        return processes.pid_exists(self.pid)


def reported(row: dict[str, Any]) -> dict[str, Any]:
    """The row as readers see it: worker fields present (None for a version-1 database) and a "running"
    run whose worker on this host is gone reported as "stopped" (legacy rows without a worker stay as stored)."""
    for field in WORKER_FIELDS:
        row.setdefault(field, None)
    if row.get("status") == "running" and row["worker_pid"] is not None and row["worker_host"] is not None:
        worker = Worker(int(row["worker_pid"]), str(row["worker_host"]), row["worker_started"])
        if worker.alive() is False:
            row["status"] = "stopped"
    return row


__all__ = ["WORKER_FIELDS", "Worker", "process_start_time", "reported"]

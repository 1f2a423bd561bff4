"""How long work says how far it got, and the one rule for the time it has left.

`Progress` is the callback type of every long task that counts its work (a run's samples, a sweep's
runs, a profile's cells): `progress(done, total, where)`, `done` of `total` pieces finished, the last one
at `where`. `Fraction` is the same news as a fraction of 1 with a message (`build_profile(progress=)` and
the searches that call it), `fraction_of` turns a count into it; `Step` names the step or the run that is
starting (`ExperimentRunner.progress`, the study's steps). The CLI's bars (`polykv.cli.progress`) and the
jobs' state (`polykv.jobs.progress`) both take these and both say the time left with `eta`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Progress(Protocol):
    """`done` of `total` pieces of work finished (samples, runs, cells), the last one at `where`."""

    def __call__(self, done: int, total: int, where: str, /) -> None: ...


Fraction = Callable[[float, str], None]  # (fraction of the work done, 0..1; what the last piece was)
Step = Callable[[str], None]  # the name of the step or run that starts


def fraction_of(done: int, total: int) -> float:
    """`done` of `total` as a fraction of the work (0 when there is nothing to count yet)."""
    return min(1.0, done / total) if total else 0.0


def eta(elapsed: float, fraction: float, start_fraction: float = 0.0) -> float | None:
    """Seconds left if the rest goes at the pace since `elapsed` seconds ago, when the work stood at
    `start_fraction` (a resumed job does not count work done before it); None until there is progress to
    extrapolate from, and once the work is done."""
    gained = fraction - start_fraction
    if gained <= 1e-6 or fraction >= 1.0:
        return None
    return elapsed * (1.0 - fraction) / gained


__all__ = ["Fraction", "Progress", "Step", "eta", "fraction_of"]

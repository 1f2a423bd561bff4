"""The largest counts PolyKV takes, stated once. A count past its cap is refused in one line before any work
starts (the command line's option ranges, the suites' settings, the job specs), rather than run for days or
grow until the memory is gone. Each cap is far above what a study needs; raise one here if yours needs more."""

from __future__ import annotations

import math

from polykv.errors import SettingsError

SAMPLES_PER_TASK = 10_000  # a suite's samples per task (LongBench's tasks hold at most 500)
SEQUENCES = 10_000  # calibration, search and held-out sequences
EVALUATIONS = 1_000_000  # plan executions a search may run per budget
PLACEMENTS = 100_000  # random count-matched placements of a placement control (--k)
CANDIDATES = 1_000  # neighbours a search round tries
WORKERS = 256  # processes (or Ray tasks) sharing a suite's samples


def check_at_most(name: str, value: int | None, cap: int) -> None:
    """SettingsError when `value` is over `cap` (None: not given)."""
    if value is not None and not isinstance(value, bool) and value > cap:
        raise SettingsError(f"{name} {value:,} is more than PolyKV takes (at most {cap:,}; polykv/limits.py)")


def check_finite(name: str, value: float | None, positive: bool = True) -> None:
    """SettingsError unless `value` (when given) is a finite number, and above 0 when `positive`."""
    if value is None:
        return
    if not math.isfinite(value) or (positive and value <= 0):
        raise SettingsError(f"{name} must be a finite number{' above 0' if positive else ''} (got {value})")

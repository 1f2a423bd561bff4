"""Progress bars for the CLI's long commands: tqdm bars on stderr (percentage, elapsed, ETA, the current
run or step), drawn only when stderr is a terminal and `--no-progress` was not given.

The time left is `polykv.progress.eta`, the rule the jobs' state uses too. Elsewhere (CI, pipes, log files)
nothing is drawn per sample or step; `run()` then prints one line per run (`run: <plan>`), which says in a log
where a long experiment stands. tqdm is imported only when a
bar is drawn, so commands that never draw one pay nothing for it at start-up.
"""

from __future__ import annotations

import sys
from typing import TextIO

ENABLED = True  # False under the global `--no-progress` (set by the app's callback each invocation)

# A fraction bar (the profile) has no item count to show, only the percentage and times.
FRACTION_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]"


class Progress:
    """The bars of one command, one after another (a bar per run or step; the previous one is closed when
    the next starts). Use it as a context manager so that the last bar is closed before results print.

    `sample` is a `polykv.progress.Progress` (`run_suite(progress=)`, `ExperimentRunner.on_sample`), `fraction`
    a `Fraction` (`build_profile(progress=)`), `run` a `Step` (`ExperimentRunner.progress`).
    """

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = ENABLED and _isatty(self.stream)
        self.enabled = enabled
        self.name, self.unit = "", "sample"
        self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, name: str, unit: str = "sample") -> None:
        """The next updates draw a new bar named `name`, counting `unit`s (it appears with the first update,
        so a run that is found finished draws nothing)."""
        self.close()
        self.name, self.unit = name, unit

    def run(self, name: str) -> None:
        """A new run: its bar on a terminal; one line `run: <name>` elsewhere."""
        self.start(name)
        if not self.enabled:
            self.note(f"run: {name}")

    def note(self, line: str) -> None:
        """One line on the stream, always (above the bar on a terminal, so the bar stays whole)."""
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def sample(self, done: int, total: int, where: str = "") -> None:
        """`done` of `total` items finished (samples, or the unit `start` named), the last at `where`."""
        if not self.enabled:
            return
        bar = self._open(total=total, unit=self.unit)
        bar.total = total
        if where:
            bar.set_postfix_str(where, refresh=False)
        bar.update(done - bar.n)

    def fraction(self, fraction: float, message: str = "") -> None:
        """`fraction` (0..1) of the work done, the last piece described by `message`."""
        if not self.enabled:
            return
        bar = self._open(total=1.0, bar_format=FRACTION_FORMAT)
        if message:
            bar.set_postfix_str(message, refresh=False)
        bar.update(fraction - bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _open(self, **options):
        if self._bar is None:
            # disable=False: whether to draw was decided above (tqdm's own check would redo it)
            self._bar = _bar_class()(desc=self.name or None, file=self.stream, disable=False, leave=True, **options)
        return self._bar


_BAR = None


def _bar_class():
    """tqdm whose time left is PolyKV's one rule (`polykv.progress.eta`, as the jobs say it): the pace since the
    bar started, not tqdm's smoothed rate. tqdm is imported here, not at the top: reading commands never import
    it."""
    global _BAR
    if _BAR is None:
        from tqdm import tqdm

        from polykv.progress import eta

        class Bar(tqdm):
            @property
            def format_dict(self):
                found = super().format_dict
                total, elapsed = found.get("total"), found.get("elapsed") or 0.0
                left = eta(elapsed, found["n"] / total) if total else None
                # tqdm says the time left as (total - n) / rate: the rate that makes it `left`
                found["rate"] = (total - found["n"]) / left if left else None
                return found

        _BAR = Bar
    return _BAR


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False

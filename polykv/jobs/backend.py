"""The eval backend "subprocess": the units as one detached background job, registered in
`polykv.eval.running.backends.BACKENDS` when this module is imported (`polykv.jobs` imports it)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from polykv.errors import SettingsError
from polykv.eval.running.backends import BACKENDS
from polykv.eval.running.unit import Unit
from polykv.jobs.process import start
from polykv.jobs.spec import eval_job
from polykv.plan import Plan
from polykv.workspace import RESULTS_FILE


class SubprocessBackend:
    """The units as one detached background job (`polykv.jobs`): the caller may exit; progress is in the
    store (`polykv runs`) and in the job's files."""

    name = "subprocess"
    detached = True

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None  # the worker of the latest `run`

    def start(self, units: Unit | Sequence[Unit], workspace: Path) -> subprocess.Popen:
        """Start the job in `workspace` (results go to its results.sqlite); returns its worker process."""
        return self._start(units, workspace)[1]

    def run(self, units: list[Unit], store_path: Path) -> list[str]:
        """Start the units and return their run ids at once (the runs finish in the background);
        `store_path` is a workspace's results.sqlite, which the job writes to."""
        store_path = Path(store_path)
        if store_path.name != RESULTS_FILE:
            raise SettingsError(f"the subprocess backend writes to a workspace's results.sqlite, not {store_path}")
        job, self.process = self._start(units, store_path.parent)
        return [r.run_id for r in job.runs]

    def _start(self, units: Unit | Sequence[Unit], workspace: Path):
        units = [units] if isinstance(units, Unit) else list(units)
        title = f"{Plan.from_json(units[0].plan_json).name} on {units[0].suite}" if units else ""
        if len(units) > 1:
            title += f" + {len(units) - 1} more"
        job = eval_job([({}, unit) for unit in units], title=title)
        return job, start(job, workspace)


BACKENDS["subprocess"] = SubprocessBackend

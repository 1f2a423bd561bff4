"""Where runs execute. A unit of work (`polykv.eval.running.unit.Unit`) is one run (model, plan, suite, settings,
seed); every backend writes to the same results store, so results and progress look the same whichever
ran them. `backend(name)` is the one place that knows them by name:

  local       in this process, one unit after another
  subprocess  a detached background job for the units: survives the caller (the app, a CLI call that
              returns at once); `run` returns before the runs finish. Jobs run evaluations, so this
              backend lives above eval (`polykv.jobs.backend`) and is registered here when `polykv.jobs`
              is imported.
  ray         a Ray task per unit (one GPU each when the model runs on CUDA); with a local cluster
              (`ray.init(address="local")`) units run in parallel on this machine. On a multi-node
              cluster the store's SQLite file must be on storage every node shares.

Each has `run(units, store_path) -> [run id]`; `detached` says whether it returns before the runs end.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from polykv.errors import SettingsError
from polykv.eval.results.store import Store
from polykv.eval.running.unit import Unit
from polykv.plan import Plan
from polykv.progress import Progress

Load = Callable[[str, str], tuple]  # (model name, device) -> (model, tokenizer)


@lru_cache(maxsize=2)
def worker_model(name: str, device: str):
    from polykv.models import load_model

    return load_model(name, device=device)  # once per worker process


def execute(unit: Unit, store_path: str, load: Load | None = None, progress: Progress | None = None) -> str:
    """Run one unit into the store at `store_path`; returns the run id. `load` gets the unit's model
    (default: loaded once per process); `progress` sees every sample."""
    from polykv.eval.running.suite_runner import run_suite

    model, tokenizer = (load or worker_model)(unit.model, unit.device)
    plan = Plan.from_json(unit.plan_json)
    return run_suite(
        Store(store_path), unit.model, model, tokenizer, plan, unit.suite, unit.settings(), unit.seed, progress=progress
    )


class LocalBackend:
    """In this process, one unit after another; `load` and `progress` as in `execute`."""

    name = "local"
    detached = False

    def __init__(self, load: Load | None = None, progress: Progress | None = None):
        self.load, self.progress = load, progress

    def run(self, units: list[Unit], store_path: Path) -> list[str]:
        return [execute(unit, str(store_path), self.load, self.progress) for unit in units]


class RayBackend:
    """Each unit a Ray task; call `ray.init(...)` first to pick the cluster (else a local one starts)."""

    name = "ray"
    detached = False

    def run(self, units: list[Unit], store_path: Path) -> list[str]:
        import ray

        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(address="local", include_dashboard=False, log_to_driver=False)
        remote = ray.remote(execute)
        futures = [
            remote.options(num_gpus=1 if unit.device.startswith("cuda") else 0).remote(unit, str(store_path))
            for unit in units
        ]
        return ray.get(futures)


BACKENDS = {"local": LocalBackend, "ray": RayBackend}  # + "subprocess", registered by polykv.jobs.backend


def backend(name: str, *, waiting: bool = False, load: Load | None = None, progress: Progress | None = None):
    """The backend called `name`. `waiting=True` admits only those whose `run` returns once the runs
    have finished (an experiment reads their scores): local and ray. `load` and `progress` apply where
    units run in this process (local); the others load their own model and report progress in the store.
    An unknown name is a SettingsError that lists the names."""
    known = [n for n, cls in BACKENDS.items() if not (waiting and cls.detached)]
    if name not in known:
        raise SettingsError(f"unknown backend {name!r} (backends: {', '.join(known)})")
    if name == "local":
        return LocalBackend(load, progress)
    return BACKENDS[name]()


__all__ = ["BACKENDS", "LocalBackend", "RayBackend", "backend", "execute"]

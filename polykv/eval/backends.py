"""Where runs execute. A unit of work is one run (model, plan, suite, settings, seed); every backend
writes to the same results store, so results and progress look the same whichever ran them.

  local       in this process, one unit after another
  subprocess  a detached background process per unit (`polykv eval`): survives the caller (the app)
  ray         a Ray task per unit (one GPU each when the model runs on CUDA); with a local cluster
              (`ray.init(address="local")`) units run in parallel on this machine. On a multi-node
              cluster the store's SQLite file must be on storage every node shares.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from polykv.eval.store import Store
from polykv.plan import Plan


@dataclass(frozen=True)
class Unit:
    model: str
    plan_json: str
    suite: str = "fidelity"
    settings_json: str = "{}"  # the suite's Settings as JSON (empty: the suite's defaults)
    seed: int = 0
    device: str = "cpu"

    @classmethod
    def of(cls, model: str, plan: Plan, suite: str = "fidelity", settings=None, seed: int = 0, device: str = "cpu"):
        return cls(model, plan.to_json(), suite, json.dumps(settings.to_dict() if settings else {}), seed, device)

    def settings(self):
        from polykv.eval.settings import suite_settings

        return suite_settings(self.suite, self.settings_json)


@lru_cache(maxsize=2)
def _model(name: str, device: str):
    from polykv.models import load_model

    return load_model(name, device=device)  # once per worker process


def execute(unit: Unit, store_path: str) -> str:
    """Run one unit into the store at `store_path`; returns the run id."""
    from polykv.eval.runner import run_suite

    model, tokenizer = _model(unit.model, unit.device)
    plan = Plan.from_json(unit.plan_json)
    return run_suite(Store(store_path), unit.model, model, tokenizer, plan, unit.suite, unit.settings(), unit.seed)


class LocalBackend:
    name = "local"

    def run(self, units: list[Unit], store_path: Path) -> list[str]:
        return [execute(unit, str(store_path)) for unit in units]


class RayBackend:
    """Each unit a Ray task; call `ray.init(...)` first to pick the cluster (else a local one starts)."""

    name = "ray"

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


class SubprocessBackend:
    """A detached background job per unit (`polykv.jobs`): the caller may exit; progress is in the store."""

    name = "subprocess"

    def start(self, unit: Unit, workspace: Path) -> subprocess.Popen:
        from polykv import jobs  # jobs build on this module

        job = jobs.eval_job([({}, unit)], title=f"{Plan.from_json(unit.plan_json).name} on {unit.suite}")
        return jobs.start(job, workspace)


BACKENDS = {"local": LocalBackend, "ray": RayBackend}


def backend(name: str):
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} (backends: {', '.join(BACKENDS)}; the app uses subprocess)")
    return BACKENDS[name]()


__all__ = ["BACKENDS", "LocalBackend", "RayBackend", "SubprocessBackend", "Unit", "backend", "execute"]

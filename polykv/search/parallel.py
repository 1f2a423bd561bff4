"""Candidates scored in parallel: executors for `polykv.search.objective.Objective`.

An executor is a callable `executor(pairs, continuation) -> [SequenceScore]` that scores a batch of
(plan, token ids) pairs, in order; an objective with one sends each successive-halving rung (every
uncached pair of it) as one batch. The objective keeps the caches, counts the executions and enforces the
evaluation budget, so any executor gives the sequential search's plan, trace and execution count.

  LocalExecutor  in this process, one pair after another (the sequential arithmetic, batch-shaped)
  RayExecutor    one Ray task per pair: each worker loads the model by name and device once
                 (`polykv.eval.running.backends.worker_model`), rebuilds the plan from its JSON and scores it with the
                 local path's code (`objective.reference_scores`, `objective.score_tokens`), FullKV's
                 reference kept per worker process. Ray is imported only when a batch is sent.

`executor("local" | "ray", model_name, device)` is the one place that knows them by name (the
`polykv search --backend` choice); `local` means no executor at all (the plain sequential objective).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import astuple
from typing import Any

from polykv.plan import Plan
from polykv.search.objective import Reference, SequenceScore, reference_scores, score_tokens

BACKENDS = ("local", "ray")
REFERENCES_KEPT = 256  # FullKV references a worker keeps (M x vocab logits each), least recently used out


class _References:
    """FullKV references by (model, device, continuation, tokens), at most REFERENCES_KEPT of them."""

    def __init__(self, kept: int = REFERENCES_KEPT):
        self.kept = kept
        self._data: OrderedDict[tuple, Reference] = OrderedDict()

    def get(self, model, key: tuple, token_ids: Sequence[int], continuation: int) -> Reference:
        found = self._data.get(key)
        if found is None:
            found = self._data[key] = reference_scores(model, token_ids, continuation)
            while len(self._data) > self.kept:
                self._data.popitem(last=False)
        else:
            self._data.move_to_end(key)
        return found

    def clear(self) -> None:
        self._data.clear()


_WORKER_REFERENCES = _References()  # one per process: in a Ray worker, shared by every task it runs


def score_pair(model, plan: Plan, token_ids: Sequence[int], continuation: int, references: _References | None = None):
    """One plan on one sequence, against FullKV computed by the same code as `Objective.reference`."""
    ids = tuple(map(int, token_ids))
    refs = references if references is not None else _WORKER_REFERENCES
    reference = refs.get(model, (id(model), continuation, ids), ids, continuation)
    return score_tokens(model, plan, ids, continuation, reference)


def _score_in_worker(model_name: str, device: str, plan_json: str, token_ids: list[int], continuation: int):
    """A Ray task's body: (kl, top1, nll, reference_nll) of the plan on the sequence."""
    from polykv.eval.running.backends import worker_model

    model, _ = worker_model(model_name, device)  # once per worker process
    return astuple(score_pair(model, Plan.from_json(plan_json), token_ids, continuation))


class LocalExecutor:
    """In this process, one pair after another; FullKV references kept by the executor."""

    name = "local"

    def __init__(self, model):
        self.model = model
        self.references = _References()

    def __call__(self, pairs: Sequence[tuple[Plan, Sequence[int]]], continuation: int) -> list[SequenceScore]:
        return [score_pair(self.model, plan, ids, continuation, self.references) for plan, ids in pairs]


def init_ray(**options: Any) -> None:
    """Start a local Ray cluster (the repository's usual init) unless Ray is already initialised."""
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(**{"address": "local", "include_dashboard": False, "log_to_driver": False, **options})


class RayExecutor:
    """One Ray task per (plan, sequence) pair; call `ray.init(...)` first to pick the cluster (else a local
    one starts). The workers load `model_name` on `device` themselves (one GPU per task on CUDA)."""

    name = "ray"

    def __init__(self, model_name: str, device: str = "cpu"):
        self.model_name, self.device = model_name, device
        self._remote = None

    def __call__(self, pairs: Sequence[tuple[Plan, Sequence[int]]], continuation: int) -> list[SequenceScore]:
        if not pairs:
            return []
        import ray

        init_ray()
        if self._remote is None:
            gpus = 1 if self.device.startswith("cuda") else 0
            self._remote = ray.remote(_score_in_worker).options(num_gpus=gpus)
        futures = [
            self._remote.remote(self.model_name, self.device, plan.to_json(), list(map(int, ids)), continuation)
            for plan, ids in pairs
        ]
        return [SequenceScore(*values) for values in ray.get(futures)]


def executor(backend: str, model_name: str, device: str = "cpu") -> RayExecutor | None:
    """The executor for `polykv search --backend`: None for local (the sequential objective), a
    RayExecutor for ray. An unknown name is a SettingsError that lists the names."""
    from polykv.errors import SettingsError

    if backend not in BACKENDS:
        raise SettingsError(f"unknown backend {backend!r} (backends: {', '.join(BACKENDS)})")
    return RayExecutor(model_name, device) if backend == "ray" else None


__all__ = ["BACKENDS", "LocalExecutor", "RayExecutor", "executor", "init_ray", "score_pair"]

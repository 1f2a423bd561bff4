"""Backends: a detached subprocess and a local Ray cluster give the local backend's results (on Ray, a gemma3 unit
too: the hybrid model in a worker)."""

from __future__ import annotations

import pytest
import torch

from polykv.eval.results.store import Store
from polykv.eval.running.backends import LocalBackend, RayBackend
from polykv.eval.running.suite_runner import clear_sample_cache
from polykv.eval.running.unit import Unit
from polykv.eval.suites.fidelity import clear_reference_cache
from polykv.jobs.backend import SubprocessBackend
from polykv.plan import Plan
from tests.helpers import TINY_FIDELITY


def units() -> list[Unit]:
    return [
        Unit.of("demo", Plan.homogeneous("tova", 24, 5), "fidelity", TINY_FIDELITY),
        Unit.of("demo", Plan.homogeneous("h2o", 24, 5), "fidelity", TINY_FIDELITY),
    ]


@pytest.mark.slow  # spawns a detached worker process
def test_subprocess_backend_runs_detached_into_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYKV_HOME", str(tmp_path / "home"))
    unit = units()[0]
    process = SubprocessBackend().start(unit, tmp_path / "bg")
    assert process.wait(timeout=300) == 0
    (run,) = Store(tmp_path / "bg" / "results.sqlite").runs()
    assert run.status == "finished" and run.done_samples == 4
    local = LocalBackend().run([unit], tmp_path / "local.sqlite")
    assert local == [run.id]  # same unit, same run id
    assert Store(tmp_path / "local.sqlite").task_scores(local[0]) == Store(
        tmp_path / "bg" / "results.sqlite"
    ).task_scores(run.id)


def gemma3_unit() -> Unit:
    """One RULER sample on gemma3, scored, longer than its local layers' 512-token window, under a plan that
    cuts every layer (local ones below their window)."""
    from polykv.eval.running.settings import suite_settings

    settings = suite_settings(
        "ruler", {"tasks": ["niah_single_1"], "length": 700, "samples_per_task": 1, "mode": "score"}
    )
    return Unit.of("gemma3", Plan.homogeneous("tova", 256, 18), "ruler", settings)


@pytest.mark.slow
def test_ray_local_cluster_runs_units_in_parallel_with_local_results(gemma3_home, tmp_path, monkeypatch):
    import ray  # installed by the test set-up (`.[test]`)

    home = str(gemma3_home)  # where the converted gemma3 is
    monkeypatch.setenv("POLYKV_HOME", home)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    env = {"POLYKV_HOME": home, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    from polykv.models import demo_model_dir

    demo_model_dir()  # import the demo checkpoint here, once: the workers then only read it
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})

    @ray.remote
    def warm_worker():
        import os
        import time

        from polykv.eval.running.backends import worker_model

        worker_model("demo", "cpu")  # the worker's model cache, as a unit would fill it
        time.sleep(1.0)
        return os.getpid()

    try:
        # Two workers up, model loaded, before the units go: otherwise a short unit can finish in one
        # worker while the other is still importing torch or loading the model, and the runs need not overlap.
        assert len(set(ray.get([warm_worker.remote() for _ in range(2)]))) == 2
        ray_ids = RayBackend().run([*units(), gemma3_unit()], tmp_path / "ray.sqlite")
    finally:
        ray.shutdown()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the Ray workers' arithmetic (OMP_NUM_THREADS=1), so results match exactly
    # Samples and FullKV references cached by earlier tests in this process were computed with other
    # thread counts (last-bit differences): recompute them under the same arithmetic as the workers.
    clear_reference_cache()
    clear_sample_cache()
    try:
        local_ids = LocalBackend().run([*units(), gemma3_unit()], tmp_path / "local.sqlite")
    finally:
        torch.set_num_threads(threads)
    assert ray_ids == local_ids
    ray_store, local_store = Store(tmp_path / "ray.sqlite"), Store(tmp_path / "local.sqlite")
    for run_id in ray_ids:
        assert ray_store.run(run_id).status == "finished"
        assert ray_store.task_scores(run_id) == local_store.task_scores(run_id)
    # The two runs overlapped in time: each started before the other finished.
    first, second = (ray_store.run(run_id) for run_id in ray_ids[:2])
    assert first.created < second.finished and second.created < first.finished

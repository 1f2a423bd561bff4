"""Many plans' samples shared out over processes (polykv.eval.running.shards): the same runs, the same numbers."""

from __future__ import annotations

import pytest

from polykv.eval.results.store import Store
from polykv.eval.running.shards import run_sharded
from polykv.eval.running.suite_runner import run_suites
from polykv.eval.suites.ruler import RulerSettings
from polykv.plan import Plan


@pytest.mark.slow  # two spawned processes import torch and load the model
def test_sharded_runs_equal_the_runs_of_one_process(demo_model, tmp_path):
    model, tokenizer = demo_model
    settings = RulerSettings(tasks=("niah_single_1", "fwe"), length=400, samples_per_task=3, mode="both")
    plans = [Plan.homogeneous("full", None, 5), Plan.homogeneous("tova", 24, 5), Plan.homogeneous("h2o", 16, 5)]
    one = Store(tmp_path / "one.sqlite")
    sharded = Store(tmp_path / "sharded.sqlite")
    seen = []
    ids = run_suites(one, "demo", model, tokenizer, plans, "ruler", settings)
    got = run_sharded(
        sharded, "demo", model, tokenizer, plans, "ruler", settings, workers=2, progress=lambda *a: seen.append(a)
    )
    assert got == ids and all(sharded.run(r).status == "finished" for r in got)
    for run_id in ids:
        a, b = one.samples(run_id), sharded.samples(run_id)
        assert [(r.task, r.sample, r.prediction) for r in a] == [(r.task, r.sample, r.prediction) for r in b]
        for x, y in zip(a, b):
            assert x.metrics["score"] == y.metrics["score"] and x.metrics["agreement"] == y.metrics["agreement"]
            assert x.metrics["answer_nll"] == pytest.approx(y.metrics["answer_nll"], abs=1e-5)  # other threads
        assert one.task_scores(run_id).keys() == sharded.task_scores(run_id).keys()
    assert seen and seen[-1][1] == 6
    # asked again, the finished runs are found: no worker starts
    assert run_sharded(sharded, "demo", model, tokenizer, plans, "ruler", settings, workers=2) == ids


def test_a_worker_ends_when_the_process_that_started_it_is_killed():
    """A parent killed by a signal runs no `finally`: its workers must not go on scoring (and writing) alone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    child = (
        "from polykv.processes import die_with_parent; import sys, time; "
        "die_with_parent(int(sys.argv[1])); time.sleep(60)"
    )
    parent = (
        "import os, subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}, str(os.getpid())])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    started = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    worker = int(started.stdout.readline())
    time.sleep(1.0)  # the worker has asked for the signal
    started.send_signal(signal.SIGTERM)
    started.wait(timeout=10)
    for _ in range(100):
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        if open(f"/proc/{worker}/stat").read().split(")")[-1].split()[0] == "Z":  # ended, not yet reaped
            break
        time.sleep(0.1)
    else:
        os.kill(worker, signal.SIGKILL)
        raise AssertionError("the worker outlived its parent")

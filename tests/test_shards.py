"""Many plans' samples shared out over processes (polykv.eval.shards): the same runs, the same numbers."""

from __future__ import annotations

import pytest

from polykv.eval.runner import run_suites
from polykv.eval.shards import run_sharded
from polykv.eval.store import Store
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
    assert got == ids and all(sharded.run(r)["status"] == "finished" for r in got)
    for run_id in ids:
        a, b = one.samples(run_id), sharded.samples(run_id)
        assert [(r["task"], r["sample"], r["prediction"]) for r in a] == [
            (r["task"], r["sample"], r["prediction"]) for r in b
        ]
        for x, y in zip(a, b):
            assert (
                x["metrics"]["score"] == y["metrics"]["score"]
                and x["metrics"]["agreement"] == y["metrics"]["agreement"]
            )
            assert x["metrics"]["answer_nll"] == pytest.approx(y["metrics"]["answer_nll"], abs=1e-5)  # other threads
        assert one.task_scores(run_id).keys() == sharded.task_scores(run_id).keys()
    assert seen and seen[-1][1] == 6
    # asked again, the finished runs are found: no worker starts
    assert run_sharded(sharded, "demo", model, tokenizer, plans, "ruler", settings, workers=2) == ids

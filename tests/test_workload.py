"""The workload checks before a study judges plans (polykv.eval.workloads.competence): the competence rule, the samples
per task from a pilot, FullKV's floor tasks for any run; and the paper's S(rho) in the placement control."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polykv.eval.experiments.placement import majority_method
from polykv.eval.results.store import Store
from polykv.eval.statistics.samples import expected_mde, minimal_detectable_difference
from polykv.eval.study import paper
from polykv.eval.workloads import competence as checks
from polykv.plan import Plan
from polykv.routing import route_score
from tests.helpers import fake_run


def test_tasks_under_the_threshold_leave_the_macro_in_their_order():
    fullkv = {"niah_single_1": 100.0, "vt": 0.0, "fwe": 20.0, "cwe": 19.99}
    kept, excluded = checks.competent_tasks(fullkv, 20.0)
    assert kept == ["niah_single_1", "fwe"] and excluded == ["vt", "cwe"]
    competence = checks.Competence(20.0, fullkv, tuple(kept), tuple(excluded), 10, "abc")
    assert competence.excluded_text() == "vt (FullKV 0.0), cwe (FullKV 20.0)"
    assert "under 20% on the pilot (10 samples per task, run abc)" in competence.rule()


def test_the_samples_reach_the_target_unless_the_time_says_otherwise():
    rng = np.random.default_rng(0)
    pilot = {t: rng.normal(0.0, 0.4, 10) for t in ("a", "b", "c")}
    free = checks.plan_samples(pilot, target=0.05, seconds_per_sample=None, seconds_allowed=None, minimum=2)
    assert free.for_target == free.samples_per_task and free.expected_mde <= 0.05
    assert expected_mde(list(free.pilot_sd.values()), free.samples_per_task - 1) > 0.05
    # a minute at 1 s per sample: 20 samples in each of the 3 tasks; the time bound wins and says so
    tight = checks.plan_samples(pilot, target=0.05, seconds_per_sample=1.0, seconds_allowed=60.0, minimum=50)
    assert tight.samples_per_task == 20 and "time allowance affords 20" in tight.reason
    assert tight.expected_mde > 0.05
    floor = checks.plan_samples(pilot, target=10.0, seconds_per_sample=None, seconds_allowed=None, minimum=50)
    assert floor.samples_per_task == 50 and "minimum of 50" in floor.reason


def test_without_a_target_the_time_allowance_sets_the_samples_and_an_unreachable_target_is_said():
    rng = np.random.default_rng(0)
    pilot = {t: rng.normal(0.0, 0.4, 10) for t in ("a", "b", "c")}
    timed = checks.plan_samples(pilot, target=None, seconds_per_sample=1.0, seconds_allowed=600.0, minimum=2)
    assert (
        timed.samples_per_task == 200
        and timed.reason == "the time allowance affords 200 samples per task (no target given)"
    )
    far = checks.plan_samples(pilot, target=1e-4, seconds_per_sample=None, seconds_allowed=None, maximum=50)
    assert far.samples_per_task == 50 and far.expected_mde > 1e-4
    assert far.reason == "50 samples per task, the most allowed, do not reach the target 0.0001"
    short = checks.plan_samples(pilot, target=0.05, seconds_per_sample=100.0, seconds_allowed=60.0)
    assert short.samples_per_task == 2 and "exceed the time allowance (it affords 0)" in short.reason


def test_the_expected_mde_is_the_power_formula():
    sds = [0.5, 1.0]
    se = np.sqrt((0.25 + 1.0) / 40) / 2
    assert expected_mde(sds, 40) == pytest.approx(minimal_detectable_difference(se, 2 * 39))


def test_floor_tasks_come_from_a_fullkv_run_of_the_same_settings(tmp_path):
    store = Store(tmp_path / "results.sqlite")
    full = Plan.homogeneous("full", None, 5).to_json()
    tova = Plan.homogeneous("tova", 16, 5).to_json()
    settings = {"tasks": ["a", "b"], "mode": "generate"}
    for run_id, plan_json, scores in (
        ("full", full, {"a": {"score": 90.0}, "b": {"score": 10.0}}),
        ("tova", tova, {"a": {"score": 60.0}, "b": {"score": 0.0}}),
    ):
        fake_run(store, run_id, scores, plan_json=plan_json)
        with store._connect() as db:
            db.execute("UPDATE runs SET suite = 'ruler', settings = ? WHERE id = ?", (json.dumps(settings), run_id))
    assert checks.floor_tasks(store, store.run("tova")) == {"b": 10.0}
    assert checks.floor_tasks(store, store.run("full")) == {"b": 10.0}
    with store._connect() as db:  # other settings: no FullKV twin, no warning
        db.execute("UPDATE runs SET settings = ? WHERE id = 'tova'", (json.dumps({**settings, "tasks": ["a"]}),))
    assert checks.floor_tasks(store, store.run("tova")) == {}


def test_s_rho_is_the_papers_sum_over_the_non_majority_layers():
    # The paper: S(rho) = sum over the layers D(rho) given D2O of C(l, D2O) - C(l, TOVA) (TOVA the majority).
    import pandas as pd

    cosine = {"tova": [0.9, 0.8, 0.7, 0.95], "d2o": [0.85, 0.9, 0.6, 0.99]}
    table = pd.DataFrame(
        [
            {"layer": layer, "scope": "decode", "method": method, "cosine": value, "dppl": 0.0}
            for method, values in cosine.items()
            for layer, value in enumerate(values)
        ]
    )
    placement = ["tova", "d2o", "tova", "d2o"]
    assert majority_method(placement + ["tova"]) == "tova" and majority_method(["b", "a"]) == "a"  # ties: a-z
    direct = (0.9 - 0.8) + (0.99 - 0.95)
    assert route_score(placement, table, "decode", "cosine", "tova") == pytest.approx(direct)


def test_the_papers_tables_are_quoted_consistently_with_its_text():
    # Section 4.3: route-only beats the best of the nine by +0.46 to +2.22 at the five budgets
    envelope = paper.table_5_envelope()
    margins = [paper.TABLE_5["Route-only"][i] - envelope[b][1] for i, b in enumerate(paper.TABLE_5_BUDGETS)]
    assert round(min(margins), 2) == paper.SWEEP_MARGINS[0] and round(max(margins), 2) == paper.SWEEP_MARGINS[1]
    cells = paper.TABLE_2["cells"]
    assert (
        round(cells[("routed", "uniform")] - cells[("homogeneous", "uniform")], 4)
        == paper.TABLE_2["routing"]["difference"]
    )
    # the paper computed from unrounded scores: its rounded cells differ by 0.0001 here
    gap = paper.TABLE_4["guided_score"] - paper.TABLE_4["random_mean"]
    assert gap == pytest.approx(paper.TABLE_4["guided_minus_mean"], abs=2e-4)

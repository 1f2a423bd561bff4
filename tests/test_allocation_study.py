"""The allocation study (`polykv.eval.experiments.allocation`): every split of one budget for one scorer, run on the
same samples at the same measured KV, each rule against uniform, the calibration's best rule and a capacity-only
search against it; its report, its page and its refusals."""

from __future__ import annotations

import json

import pytest

from polykv.eval.experiments.allocation import PRIMARY, StudyChoices, rule_plan
from polykv.eval.experiments.report import Report
from polykv.eval.results.store import Store
from polykv.plan import Plan
from tests.helpers import assert_one_line_error

SPLITS = "uniform,pyramid,squeeze,cake,adakv,adakv+best,searched"  # ppl needs a profile
SETTINGS = {"tasks": ["niah_single_1"], "length": 400, "samples_per_task": 3, "mode": "score"}


def test_each_rule_keeps_the_total_and_names_its_split():
    stats = {"squeeze": [0.9, 0.5, 0.2, 0.95, 0.3], "ppl": [1.0, 2.0, 3.0, 4.0, 5.0]}
    for rule in ("uniform", "pyramid", "squeeze", "ppl"):
        plan = rule_plan("snapkv", rule, 16, 5, statistics=stats)
        assert sum(layer.prefill.capacity for layer in plan.layers) == 80 and plan.allocation == "fixed"
        assert plan.name.endswith(rule)
    cake = rule_plan("keydiff", "cake", 16, 5)
    assert cake.allocation == "cake" and cake.allocation_params == {"window": 4}  # CAKE's window under a small budget
    heads = rule_plan("keydiff", "uniform", 16, 5, heads="adakv")
    assert heads.head_allocation == "adakv" and heads.name.endswith("-adakv")
    with pytest.raises(ValueError, match="keep uniform among the contenders"):
        StudyChoices(("tova",), (16,), contenders=("pyramid",))
    with pytest.raises(ValueError, match="searched scorer 'snapkv' is not among the scorers"):
        StudyChoices(("tova",), (16,), searched=("snapkv",))


@pytest.mark.slow  # runs 7 plans on 3 samples of the demo model, a calibration pass and a short search
def test_the_study_compares_every_split_on_the_same_samples_at_the_same_measured_kv(polykv, tmp_path):
    settings = json.dumps({**SETTINGS, "question": "after-compression"})
    workspace, page, saved = tmp_path / "ws", tmp_path / "allocation.md", tmp_path / "allocation.json"
    result = polykv(
        "experiment", "allocation", "--model", "demo", "--suite", "ruler", "--metric", "answer_nll", "--batch",
        "--budgets", "16", "--scorers", "keydiff", "--contenders", SPLITS,
        "--calibration-per-task", "2", "--evaluations", "12", "--settings", settings, "-w", str(workspace),
        "--markdown", str(page), "--save", str(saved),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = Report.from_dict(json.loads(saved.read_text())).data
    entries = {e.contender: e for e in data.entries}
    assert set(entries) == {"uniform", "pyramid", "squeeze", "cake", "adakv", "adakv+best", "searched"}
    assert data.samples == {"niah_single_1": 3} and data.calibration_samples == 2
    best = data.best_rule["keydiff@16"]
    assert best in ("uniform", "pyramid", "squeeze", "cake")
    assert best == min(data.calibration["keydiff@16"], key=data.calibration["keydiff@16"].get)
    # the primary family: every rule against uniform, Holm over all of them; the secondary against the best rule
    primary = [c for e in data.entries if e.contender in PRIMARY for c in e.versus]
    assert len(primary) == 4 and {c.reference for c in primary} == {"uniform"} and {c.family for c in primary} == {4}
    assert all(c.sample.samples == 3 for e in data.entries for c in e.versus)
    assert [c.reference for c in entries["adakv+best"].versus] == ["best rule"]
    # the same KV held entering the answer by every split, measured from each run's cache (no windows on demo)
    assert len({round(e.kv_entering, 6) for e in data.entries}) == 1 and 0 < data.entries[0].kv_share < 1
    assert all(c.equal_kv for e in data.entries for c in e.versus)
    # the searched split: the scorer everywhere, the same total, found by transfers alone
    store = Store(workspace / "results.sqlite")
    searched = Plan.from_json(store.run(entries["searched"].run).plan_json)
    assert {layer.prefill.method for layer in searched.layers} == {"keydiff"}
    assert sum(layer.prefill.capacity for layer in searched.layers) == 16 * searched.num_layers
    assert searched.provenance["moves_allowed"] == ["transfer"] and data.searches[0].scorer == "keydiff"
    text = page.read_text()
    assert "### Budget 16 (answer_nll, lower is better)" in text and "(best on calibration)" in text
    assert "| `keydiff` | uniform | " in text and "(reference)" in text and "### Every contrast" in text


def test_the_command_refuses_an_unknown_split_and_ppl_without_a_profile_in_one_line(polykv):
    result = polykv("experiment", "allocation", "--budgets", "16", "--contenders", "uniform,zigzag")
    assert_one_line_error(result, "unknown contender 'zigzag'")
    result = polykv("experiment", "allocation", "--budgets", "16", "--contenders", "uniform,ppl")
    assert_one_line_error(result, "the ppl rule splits by a profile's PPL sensitivity: give --profile DIR")

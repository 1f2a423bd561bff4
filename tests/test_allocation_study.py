"""The allocation study (`polykv.eval.experiments.allocation`): every split of one budget for one scorer, run on the
same samples at the same measured KV, each rule against uniform, the calibration's best rule and a capacity-only
search against it; its report, its page and its refusals."""

from __future__ import annotations

import dataclasses
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


def test_every_split_of_every_scorer_is_a_plan_the_model_can_run():
    from polykv.methods import validate_plan

    stats = {"squeeze": [0.1 * (i % 5) for i in range(30)], "ppl": [1.0 + i % 7 for i in range(30)]}
    for scorer in ("tova", "snapkv", "keydiff", "lagkv", "expected_attention"):
        for budget in (64, 128):
            for rule in ("uniform", "pyramid", "squeeze", "ppl", "cake"):
                validate_plan(rule_plan(scorer, rule, budget, 30, statistics=stats), 30, 8192)
    # CAKE may give a layer as few as its window (32): SnapKV's window of 32 shrinks, and the plan says so
    cake = rule_plan("snapkv", "cake", 128, 30)
    assert {layer.prefill.params["window"] for layer in cake.layers} == {8}
    assert "a layer may get as few as 32 tokens, so snapkv runs with window 8" in cake.description
    assert cake.provenance["shrunk_params"] == "window 8"  # the page names it beside the split


def test_on_a_hybrid_model_no_split_gives_a_local_layer_more_than_its_window_holds():
    windows = [512, None, 512, None]  # gemma3's pattern: local layers hold at most 511 tokens
    stats = {"squeeze": [0.9, 0.5, 0.2, 0.95], "ppl": [4.0, 1.0, 3.0, 2.0]}
    for rule in ("uniform", "pyramid", "squeeze", "ppl"):
        for heads in ("uniform", "adakv"):
            plan = rule_plan("keydiff", rule, 600, 4, windows, stats, heads)
            capacities = [layer.prefill.capacity for layer in plan.layers]
            assert capacities[0] <= 511 and capacities[2] <= 511 and sum(capacities) == 2400, (rule, capacities)


def test_the_calibration_cache_is_found_again_and_never_across_other_inputs(tmp_path):
    from types import SimpleNamespace

    from polykv.eval.suites.ruler import RulerSettings
    from polykv.search.workload.allocation import CalibrationCache

    store = SimpleNamespace(path=tmp_path / "results.sqlite")
    settings = RulerSettings(tasks=("niah_single_1",), length=400, samples_per_task=3, question="after-compression")
    runner = SimpleNamespace(model_name="demo", suite="ruler", settings=settings, seed=0, store=store)
    choices = StudyChoices(("keydiff",), (16,))
    cache = CalibrationCache(runner, choices, ["uniform", "pyramid"], {"squeeze": [0.5, 0.25]})
    cache.put("keydiff@16", {"samples": 2, "values": {"uniform": 1.0, "pyramid": 0.9}})
    again = CalibrationCache(runner, choices, ["uniform", "pyramid"], {"squeeze": [0.5, 0.25]})
    assert again.get("keydiff@16")["values"]["pyramid"] == 0.9 and again.get("keydiff@32") is None
    others = [
        CalibrationCache(
            runner, dataclasses.replace(choices, evaluations=10), ["uniform", "pyramid"], {"squeeze": [0.5, 0.25]}
        ),
        CalibrationCache(runner, choices, ["uniform", "pyramid"], {"squeeze": [0.5, 0.3]}),
        CalibrationCache(runner, choices, ["uniform"], {"squeeze": [0.5, 0.25]}),
        CalibrationCache(
            SimpleNamespace(**{**vars(runner), "settings": dataclasses.replace(settings, samples_per_task=4)}),
            choices,
            ["uniform", "pyramid"],
            {"squeeze": [0.5, 0.25]},
        ),
    ]
    assert all(other.path != cache.path and other.get("keydiff@16") is None for other in others)


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


def test_the_command_refuses_what_the_study_cannot_run_in_one_line_before_any_work(polykv):
    answers = ("--suite", "ruler", "--metric", "answer_nll")
    for args, expected in [
        (("--contenders", "uniform,zigzag"), "unknown contender 'zigzag'"),
        (("--contenders", "uniform,ppl", *answers), "the ppl rule splits by a profile's PPL sensitivity"),
        (("--scorers", "tova,bogus"), "scorer 'bogus': give prefill methods"),
        (("--scorers", "tova,tova"), "a scorer is given twice (tova, tova)"),
        (("--contenders", "uniform,pyramid", "--search", "tova"), "a search is asked for, but searched is not"),
        (("--contenders", "uniform,pyramid"), "give --suite ruler or longbench and --metric answer_nll"),
    ]:
        assert_one_line_error(polykv("experiment", "allocation", "--budgets", "16", *args), expected)


def test_the_calibration_runs_every_scorer_and_budget_on_one_prompt_pass_per_sample(demo_model, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from polykv.eval.experiments.allocation import key
    from polykv.eval.suites.ruler import RulerSettings
    from polykv.search.workload import allocation as calibration
    from polykv.search.workload import objective

    model, tokenizer = demo_model
    settings = RulerSettings(tasks=("niah_single_1",), length=400, samples_per_task=3, question="after-compression")
    store = SimpleNamespace(path=tmp_path / "results.sqlite")
    runner = SimpleNamespace(
        model_name="demo", suite="ruler", settings=settings, seed=0, store=store, model=model, tokenizer=tokenizer
    )
    choices = StudyChoices(("keydiff", "tova"), (8, 16), contenders=("uniform", "pyramid"), calibration_per_task=2)
    layers = model.config.num_hidden_layers
    rules = ["uniform", "pyramid"]
    plans = {key(s, r, b): rule_plan(s, r, b, layers) for s in choices.scorers for b in choices.budgets for r in rules}
    passes, measure = [], objective.answer_nlls
    monkeypatch.setattr(objective, "answer_nlls", lambda m, p, s, kept: passes.append(len(p)) or measure(m, p, s, kept))
    chosen = calibration.calibrate(runner, choices, plans, rules, {})
    distinct = len({objective.plan_key(plan) for plan in plans.values()})  # a pyramid may be uniform on 5 layers
    assert passes == [distinct, distinct]  # two samples, each one pass for the 2 scorers x 2 budgets x 2 rules
    assert set(chosen.values) == {"keydiff@8", "keydiff@16", "tova@8", "tova@16"} and chosen.samples == 2
    assert calibration.calibrate(runner, choices, plans, rules, {}).values == chosen.values and len(passes) == 2
    alone = objective.AnswerObjective(model, calibration.calibration_objective(runner, choices).samples)
    batched = chosen.values["tova@16"]["pyramid"]
    assert alone.values([plans["tova/pyramid@16"]]) == [pytest.approx(batched, rel=1e-5)]  # alone, up to rounding

"""The methods leaderboard (`polykv.eval.experiments.leaderboard`): its plans, its contrasts against each reference
sample by sample, Holm's correction over each family, its page, and its refusals; Holm's adjustment itself."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from polykv.eval.experiments.experiment_runner import ExperimentRunner
from polykv.eval.experiments.leaderboard import board_methods, leaderboard, leaderboard_plans
from polykv.eval.experiments.leaderboard_page import leaderboard_markdown
from polykv.eval.experiments.report import Report
from polykv.eval.results.store import SampleRecord, Store
from polykv.eval.statistics.contrast import NO_DIFFERENCE
from polykv.eval.statistics.tasks import holm
from polykv.eval.suites.ruler import RulerSettings
from polykv.plan import FULL
from tests.helpers import assert_one_line_error

TASKS, SAMPLES = ("niah_single_1", "fwe"), 12


def test_holm_multiplies_the_ith_smallest_p_by_m_minus_i_and_keeps_the_order():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == [1.0, 1.0] and holm([]) == []
    with pytest.raises(ValueError):
        holm([1.5])


def test_the_plans_are_each_method_alone_at_each_budget_native_rules_kept():
    plans = leaderboard_plans(4, ["tova", "pyramidkv", "random"], [16, 32])
    assert list(plans) == [FULL, "tova@16", "tova@32", "pyramidkv@16", "pyramidkv@32", "random@16", "random@32"]
    assert plans["tova@32"].scope.value == "prefill" and {lay.prefill.capacity for lay in plans["tova@32"].layers} == {
        32
    }
    assert plans["pyramidkv@16"].allocation == "native" and plans["random@16"].allocation == "fixed"
    assert "d2o" not in board_methods("prefill") and "expected_attention" in board_methods("prefill")
    with pytest.raises(ValueError, match="d2o: not a method that runs in every phase of the prefill scope"):
        leaderboard_plans(4, ["d2o"], [16])


@dataclass
class ScriptedRunner(ExperimentRunner):
    """Runs nothing: each plan's run holds the answer_nll its script gives every sample under the settings' question
    protocol."""

    script: Callable = None

    def run_all(self, plans):
        ids = []
        for plan in plans:
            run = hashlib.sha256(f"{plan.name}/{self.settings.question}".encode()).hexdigest()[:16]
            self.store.create_run(
                run, model="demo", plan_name=plan.name, plan_hash=run, plan_json="{}", suite="ruler",
                settings=self.settings.to_dict(), seed=0, total_samples=len(TASKS) * SAMPLES, versions={},
            )  # fmt: skip
            for task in TASKS:
                for i in range(SAMPLES):
                    value = self.script(plan, task, i, self.settings.question)
                    record = SampleRecord(kv_held=held(plan))
                    self.store.add_sample(run, task, str(i), {"answer_nll": value}, 0.1, record)
            self.store.set_task_scores(run, {t: {"answer_nll": 0.0} for t in TASKS}, {t: SAMPLES for t in TASKS})
            self.store.set_status(run, "finished")
            ids.append(run)
        return ids


def held(plan) -> dict:
    """What a plan's cache measured: its capacity in each of the 4 layers (FullKV the whole 1,000-token prompt), Knorm
    one token more (a budget its rule overshoots)."""
    layer = plan.layers[0].prefill
    tokens = 1000 if layer.capacity is None else layer.capacity + (layer.method == "knorm")
    return {"entering": [tokens] * 4, "end": [tokens] * 4, "seen_entering": 1000, "seen_end": 1000}


def scripted(store: Store, script: Callable) -> ScriptedRunner:
    model = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=4))
    settings = RulerSettings(tasks=TASKS, length=1024, mode="score", question="after-compression")
    return ScriptedRunner(store, "demo", model, None, "ruler", settings, script=script)


def script(plan, task: str, i: int, question: str) -> float:
    """FullKV 1.0; TOVA 2.0; Knorm 1.0 lower than TOVA on every sample; Random TOVA's, +-0.1 in turn. With the
    question in the prompt TOVA gains 0.5 on every sample; the others do not change."""
    method = plan.layers[0].prefill.method
    gain = 0.5 if method == "tova" and question == "in-prompt" else 0.0
    return {"full": 1.0, "tova": 2.0, "knorm": 1.0, "random": 2.0 + (0.1 if i % 2 else -0.1)}[method] - gain


def test_each_method_is_compared_with_each_reference_and_holm_corrects_each_family(tmp_path):
    store = Store(tmp_path / "results.sqlite")
    report = leaderboard(scripted(store, script), ["tova", "knorm", "random"], [16, 32], question_budget=32)
    data = report.data
    assert data.metrics == ["answer_nll"] and data.samples == {t: SAMPLES for t in TASKS}
    assert data.full.means["answer_nll"] == 1.0
    knorm = next(e for e in data.entries if (e.method, e.budget) == ("knorm", 16))
    assert knorm.means["answer_nll"] == pytest.approx(1.0)
    (versus_tova,) = [c for c in knorm.versus if c.reference == "tova"]
    assert versus_tova.sample.difference == pytest.approx(-1.0) and versus_tova.verdict == "better"
    assert (versus_tova.wins, versus_tova.ties, versus_tova.losses) == (24, 0, 0)
    assert versus_tova.family == 4  # knorm and random, at two budgets
    assert versus_tova.sample.p < 1e-4 and versus_tova.p_holm == pytest.approx(min(1.0, 4 * versus_tova.sample.p))
    random = next(e for e in data.entries if (e.method, e.budget) == ("random", 16))
    (random_vs_tova,) = random.versus  # the random control is a reference itself, so only against TOVA
    assert random_vs_tova.sample.difference == pytest.approx(0.0, abs=1e-12)
    assert random_vs_tova.verdict == "no significant difference" and random_vs_tova.p_holm == 1.0
    tova = next(e for e in data.entries if (e.method, e.budget) == ("tova", 32))
    (tova_vs_random,) = tova.versus
    assert tova_vs_random.reference == "random" and tova_vs_random.verdict == "no significant difference"
    # each plan at 32 against itself with the question in the prompt: only TOVA needs it
    dependence = {c.method: c for c in data.question_dependence}
    assert set(dependence) == {"full", "tova", "knorm", "random"} and dependence["tova"].family == 3  # FullKV: control
    assert dependence["tova"].sample.difference == pytest.approx(0.5) and dependence["tova"].verdict == "worse"
    assert dependence["tova"].other_question == "in-prompt" and dependence["knorm"].verdict == NO_DIFFERENCE
    # the report reads back typed, and its page holds every contrast with its test, samples and MDE
    assert Report.from_dict(report.to_dict()).data == data
    page = leaderboard_markdown(data, "results.sqlite")
    assert "| `knorm` | 16 | tova | answer_nll | -1.0000 |" in page and "24/0/0" in page
    assert "| -1.000 (better, p_H " in page and ", MDE " in page
    assert "### The question after-compression against in-prompt" in page and "| `tova` | 32 | 2.000 | 1.500 |" in page
    # the KV each plan held, measured, and contrasts whose plans held more than 1% apart
    assert (knorm.kv_entering, knorm.kv_share) == (68, 68 / 4000) and data.full.kv_share == 1.0
    assert versus_tova.equal_kv is False and random_vs_tova.equal_kv is True
    assert "| `knorm` | 68 (1.7%) | 132 (3.3%) |" in page and "| -1.000 (better, p_H " in page
    (knorm_row,) = [line for line in page.splitlines() if line.startswith("| `knorm` | 1.000 |")]
    (random_row,) = [line for line in page.splitlines() if line.startswith("| `random` | 2.000 |")]
    assert knorm_row.count(", unequal KV)") == 4 and "unequal KV" not in random_row  # vs TOVA and Random, 16 and 32


def test_the_command_refuses_a_method_the_scope_cannot_run_and_a_reference_not_among_the_methods(polykv):
    result = polykv("experiment", "leaderboard", "--budgets", "16", "--methods", "tova,d2o,random")
    assert_one_line_error(result, "d2o: not a method that runs in every phase of the prefill scope")
    result = polykv("experiment", "leaderboard", "--budgets", "16", "--methods", "tova,knorm")
    assert_one_line_error(result, "the references random must be among the methods")

"""What the study and the experiments refuse before a model loads: a metric the suite does not report, several
RULER lengths in one study. One line, exit 2, no workspace written."""

from __future__ import annotations

import json

import pytest

from polykv.plan import Plan
from tests.helpers import assert_one_line_error


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--metric", "answer_nll"], "the fidelity suite does not report answer_nll (it reports"),
        (
            ["--suite", "ruler", "--metric", "answer_nll", "--placement-suite", "fidelity"],
            "the fidelity suite does not report answer_nll",
        ),
        (
            ["--suite", "ruler", "--metric", "answer_nll", "--settings", json.dumps({"length": [512, 1024]})],
            "the study runs one ruler length at a time; give one length (got 512, 1024)",
        ),
    ],
)
def test_the_study_refuses_before_the_model_loads(polykv, tmp_path, args, expected):
    workspace = tmp_path / "ws"
    result = polykv("experiment", "study", "-o", str(tmp_path / "s.md"), "-w", str(workspace), *args)
    assert_one_line_error(result, expected)
    assert not workspace.exists() and not (tmp_path / "s.md").exists()


def test_an_experiment_refuses_a_metric_its_suite_does_not_report(polykv, tmp_path):
    plan = tmp_path / "route.json"
    plan.write_text(Plan.homogeneous("tova", 32, 5).to_json())
    result = polykv(
        "experiment", "sweep", "--plan", str(plan), "--budgets", "16,32", "--suite", "fidelity",
        "--metric", "answer_nll", "-w", str(tmp_path / "ws"),
    )  # fmt: skip
    assert_one_line_error(result, "the fidelity suite does not report answer_nll")
    assert not (tmp_path / "ws").exists()

"""The study end to end at toy size on the demo model: the fidelity study, and the real-model study's shape
(RULER as the primary workload, the placement control on the fidelity KL suite, the prefill route swept
too), through the CLI command that writes the report."""

from __future__ import annotations

import json

import pytest

from polykv.eval.store import Store
from polykv.eval.study import StudySettings
from polykv.eval.study_report import gap_recovery

pytestmark = pytest.mark.slow

TINY = {"tasks": ["stories", "tale-park"], "samples_per_task": 1, "prompt_tokens": 96, "continuation": 8, "generate": 8}
CALIBRATION = ["--calibration-sequences", "2", "--calibration-tokens", "128", "--b-cal", "24"]


def test_the_ruler_study_writes_a_report_traceable_to_its_runs(polykv, tmp_path):
    out, workspace = tmp_path / "study.md", tmp_path / "ws"
    ruler = {"tasks": ["niah_single_1", "niah_multikey_2", "fwe"], "length": 400, "samples_per_task": 1}
    result = polykv(
        "experiment", "study", "-o", str(out), "-w", str(workspace), "--suite", "ruler",
        "--settings", json.dumps(ruler), "--metric", "score", "--placement-suite", "fidelity",
        "--placement-settings", json.dumps(TINY), "--placement-metric", "kl", "--sweep-scopes", "prefill",
        "--budget", "32", "--budgets", "16,32", "--k", "3", "--statistic", "cosine", *CALIBRATION,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    headings = ("Routing x allocation factorial", "Placement control", "Budget sweep of the decode route")
    headings += ("Budget sweep of the prefill route", "Needles by method and budget", "Beside the paper")
    for heading in headings:
        assert heading in text, heading
    assert "niah_single_1, niah_multikey_2, fwe at 400 tokens" in text and "Wall time: profile" in text
    for figure in ("profile.png", "placement.png", "sweep-decode.png", "sweep-prefill.png", "niah.png"):
        assert (tmp_path / "study" / figure).stat().st_size > 1000, figure
    store = Store(workspace / "results.sqlite", readonly=True)
    runs = {run["id"]: run for run in store.runs()}
    cited = {word.strip("`") for word in text.split() if word.strip("`") in runs}
    assert len(cited) >= 20 and all(runs[r]["status"] == "finished" for r in cited)
    suites = {runs[r]["suite"] for r in runs}
    assert suites == {"ruler", "fidelity"}  # the placements on the fidelity suite, the rest on RULER
    assert sum(runs[r]["suite"] == "fidelity" for r in runs) == 4  # the guided route and 3 placements


def test_the_fidelity_study_is_the_demo_study(polykv, tmp_path):
    out, workspace = tmp_path / "demo.md", tmp_path / "ws"
    result = polykv(
        "experiment", "study", "-o", str(out), "-w", str(workspace), "--settings", json.dumps(TINY),
        "--budget", "32", "--budgets", "16,32", "--k", "2", *CALIBRATION,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert text.startswith("# PolyKV demo study") and "Budget sweep of the decode route" in text
    assert "Budget sweep of the prefill route" not in text and "Needles by method" not in text


def test_gap_recovery_is_the_share_of_the_best_baselines_gap_closed():
    sweep = {
        "budgets": [64, 128],
        "direction": 1,
        "full": {"score": 80.0},
        "envelope": {64: {"score": 40.0}, 128: {"score": 90.0}},
        "scores": {"route-uniform": {64: 50.0, 128: 85.0}},
    }
    assert gap_recovery(sweep) == {64: 0.25, 128: None}  # at 128 the envelope beats FullKV: no gap


def test_study_settings_refuse_a_two_phase_route():
    with pytest.raises(ValueError, match="one phase"):
        StudySettings(sweep_scopes=("both",))
    assert StudySettings(scope="decode", sweep_scopes=("prefill", "decode")).swept == ("decode", "prefill")

"""The study end to end at toy size on the demo model (slow): the fidelity study, and the real-model study's shape
(RULER as the primary workload, the placement control on the fidelity KL suite, the prefill route swept
too), through the CLI command that writes the report; and its parts that need no model (in the fast loop): the
settings' checks, the suites' settings on the model, the report's arithmetic, the result's types."""

from __future__ import annotations

import json
import re

import pytest

from polykv.eval.experiments.report import BestBaseline, RunScore, SweepData
from polykv.eval.results.store import Store
from polykv.eval.study.report import gap_recovery
from polykv.eval.study.settings import StudySettings
from polykv.eval.study.steps import CALIBRATION_SEED

TINY = {"tasks": ["stories", "tale-park"], "samples_per_task": 1, "prompt_tokens": 96, "continuation": 8, "generate": 8}
CALIBRATION = ["--calibration-sequences", "2", "--calibration-tokens", "128", "--b-cal", "24"]


@pytest.mark.slow  # the study end to end on the demo model, through the CLI
def test_the_ruler_study_writes_a_report_traceable_to_its_runs(polykv, tmp_path):
    """RULER as the primary workload scored by answer_nll (score mode, no generation), its samples per task
    chosen by the pilot, accuracy generated beside it, the placement control on the fidelity KL suite and the
    prefill route swept too. The demo model answers no RULER question, so the competence threshold is 0 here
    (every task stays); the rule itself is the next test's."""
    out, workspace = tmp_path / "study.md", tmp_path / "ws"
    ruler = {"tasks": ["niah_single_1", "niah_multikey_2", "fwe"], "length": 400}
    args = (
        "experiment", "study", "-w", str(workspace), "--suite", "ruler",
        "--settings", json.dumps(ruler), "--metric", "answer_nll", "--competence", "0", "--pilot-samples", "2",
        "--samples", "auto", "--mde", "0.5", "--min-samples", "2", "--time-limit", "5", "--accuracy-samples", "1",
        "--placement-suite", "fidelity", "--placement-settings", json.dumps(TINY), "--placement-metric", "kl",
        "--sweep-scopes", "prefill", "--budget", "32", "--budgets", "16,32", "--k", "3", "--statistic", "cosine",
        *CALIBRATION,
    )  # fmt: skip
    result = polykv(*args, "-o", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    headings = ("The workload, checked before any plan ran", "Routing x allocation factorial", "Placement control")
    headings += ("Budget sweep of the decode route", "Budget sweep of the prefill route", "Accuracy beside it")
    headings += ("Needles by method and budget", "Beside the paper", "The paper's Table 2", "The paper's Table 5")
    for heading in headings:
        assert heading in text, heading
    assert "niah_single_1, niah_multikey_2, fwe at 400 tokens" in text and "Wall time: profile" in text
    assert "metric **answer_nll**" in text and "sign-flip permutation test over" in text
    assert "with 80% power" in text and "abstract" not in text
    beside = text[text.index("## Beside the paper") :]
    assert "- Sweep: the paper's route-only" in beside and "paired samples, detects" in beside  # test, n and MDE
    for figure in ("profile.png", "placement.png", "sweep-decode.png", "sweep-prefill.png", "niah.png"):
        assert (tmp_path / "study" / figure).stat().st_size > 1000, figure
    store = Store(workspace / "results.sqlite", readonly=True)
    runs = {run.id: run for run in store.runs()}
    cited = {word.strip("`") for word in text.split() if word.strip("`") in runs}
    assert len(cited) >= 20 and all(runs[r].status == "finished" for r in cited)
    suites = {runs[r].suite for r in runs}
    assert suites == {"ruler", "fidelity"}  # the placements on the fidelity suite, the rest on RULER
    assert sum(runs[r].suite == "fidelity" for r in runs) == 4  # the guided route and 3 placements
    modes = {}
    for run in runs.values():
        if run.suite == "ruler":
            settings = json.loads(run.settings)
            modes.setdefault(settings["mode"], []).append(run)
    assert set(modes) == {"both", "score", "generate"}  # the FullKV pilot; the primary runs; accuracy
    (pilot,) = modes["both"]
    assert pilot.plan_name == "full-both" and json.loads(pilot.settings)["samples_per_task"] == 2
    for run in modes["score"] + modes["generate"]:
        rows = store.samples(run.id)
        assert rows and all(row.gold and row.prompt["sha256"] for row in rows)
        generated = json.loads(run.settings)["mode"] == "generate"
        assert all((row.prediction is not None) == generated for row in rows), run.plan_name
        assert all(("answer_nll" in row.metrics) != generated for row in rows)
    chosen = int(re.search(r"Samples per task: (\d+)", text).group(1))
    assert chosen >= 2  # at least --min-samples
    per_task = [json.loads(r.settings)["samples_per_task"] for r in modes["score"]]
    assert per_task.count(2) >= 1 and set(per_task) == {2, chosen}  # the anchor's pilot, then the chosen count
    # like with like: each method alone in the route's scope beside the baselines under their own protocols
    assert "best alone in the decode scope" in text and "like with like" in text
    assert "(tova acts in prefill and decode: across protocols)" in text and "matches" not in text
    # rendered again from its database: the sample time given instead of timed, every run found, none made again
    count = len(runs)
    measured = re.search(r"takes ([0-9.]+) s here", text).group(1)  # what the first run timed, as it printed it
    again = polykv(*args, "-o", str(tmp_path / "again.md"), "--sample-seconds", measured)
    assert again.returncode == 0, again.stderr
    rendered = (tmp_path / "again.md").read_text()
    assert "The database already held every run of the factorial and the sweeps" in rendered
    assert "as given (--sample-seconds" in rendered and len(Store(workspace / "results.sqlite").runs()) == count


@pytest.mark.slow  # the study end to end on the demo model, through the CLI
def test_a_workload_fullkv_cannot_do_stops_the_study_before_any_other_plan_runs(polykv, tmp_path):
    """The competence rule: the demo model's FullKV answers no RULER question, so at the default threshold
    (20%) every task leaves the macro and the study stops with one line, having run FullKV's pilot alone."""
    out, workspace = tmp_path / "study.md", tmp_path / "ws"
    ruler = {"tasks": ["niah_single_1", "fwe"], "length": 400}
    result = polykv(
        "experiment", "study", "-o", str(out), "-w", str(workspace), "--suite", "ruler",
        "--settings", json.dumps(ruler), "--metric", "answer_nll", "--pilot-samples", "2",
        "--budget", "32", "--budgets", "16,32", "--k", "2", *CALIBRATION,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: FullKV is under 20% on every task of the pilot (niah_single_1 (FullKV 0.0)")
    assert "Traceback" not in result.stderr and not out.exists()
    runs = Store(workspace / "results.sqlite", readonly=True).runs()
    assert [run.plan_name for run in runs] == ["full-both"]


@pytest.mark.slow  # the study end to end on the demo model, through the CLI
def test_the_strongest_anchor_is_chosen_on_calibration_samples_of_the_kept_tasks_after_fullkvs_pilot(polykv, tmp_path):
    out, workspace = tmp_path / "study.md", tmp_path / "ws"
    ruler = {"tasks": ["niah_single_1", "fwe"], "length": 400}
    result = polykv(
        "experiment", "study", "-o", str(out), "-w", str(workspace), "--suite", "ruler", "--settings",
        json.dumps(ruler), "--metric", "answer_nll", "--competence", "0", "--pilot-samples", "2", "--samples", "2",
        "--baseline", "strongest", "--budget", "32", "--budgets", "32", "--k", "2", "--baselines", "tova,h2o",
        *CALIBRATION,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    anchor = re.search(r"Anchor of the factorial: (\w+): the strongest method alone at the budget", text)
    assert anchor is not None, text[:2000]
    store = Store(workspace / "results.sqlite", readonly=True)
    runs = sorted(store.runs(), key=lambda run: run.created)
    assert runs[0].plan_name == "full-both"  # FullKV's pilot ran before anything else
    calibration = [run for run in runs if run.seed == CALIBRATION_SEED]
    assert len(calibration) >= 2 and all(run.created >= runs[0].created for run in calibration)
    assert all(json.loads(run.settings)["tasks"] == ["niah_single_1", "fwe"] for run in calibration)
    assert anchor.group(1) in {run.plan_name.split("-")[0] for run in calibration}


@pytest.mark.slow  # the study end to end on the demo model, through the CLI
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
    sweep = SweepData.model_construct(  # only the fields gap_recovery reads
        budgets=[64, 128, 256],
        direction=1,
        full=RunScore(run="full", score=80.0),
        envelope={b: BestBaseline(baseline="tova", score=v) for b, v in ((64, 40.0), (128, 90.0), (256, 60.0))},
        scores={"route-uniform": {64: 50.0, 128: 85.0, 256: None}},
    )
    # at 128 the envelope beats FullKV (no gap); at 256 the route's score is undefined
    assert gap_recovery(sweep) == {64: 0.25, 128: None, 256: None}


def test_study_settings_refuse_a_two_phase_route():
    with pytest.raises(ValueError, match="one phase"):
        StudySettings(sweep_scopes=("both",))
    assert StudySettings(scope="decode", sweep_scopes=("prefill", "decode")).swept == ("decode", "prefill")


def test_study_settings_refuse_what_cannot_be_planned():
    with pytest.raises(ValueError, match="automatic samples need a target"):
        StudySettings(suite="ruler", auto_samples=True)
    with pytest.raises(ValueError, match="automatic samples need a question suite"):
        StudySettings(suite="fidelity", auto_samples=True, mde=0.1)
    with pytest.raises(ValueError, match="competence threshold is a percentage"):
        StudySettings(suite="ruler", competence_threshold=120)
    with pytest.raises(ValueError, match="workers must be at least 1"):
        StudySettings(workers=0)


def test_the_suites_settings_of_the_study_start_from_the_models_defaults():
    from polykv.eval.running.defaults import suite_defaults
    from polykv.eval.study.run import suite_settings_for
    from polykv.eval.suites.fidelity import default_tasks

    fidelity = suite_settings_for("fidelity", None, "demo", None)
    assert fidelity.tasks == default_tasks("demo") and fidelity.samples_per_task == 3  # the study's 3
    assert list(fidelity.tasks) == suite_defaults("fidelity", "demo")["tasks"]  # the rule the CLI and the app use
    assert suite_settings_for("fidelity", {"samples_per_task": 2}, "smollm2", 5).samples_per_task == 2  # given wins
    assert suite_settings_for("fidelity", None, "smollm2", None).tasks == default_tasks("smollm2")
    ruler = suite_settings_for("ruler", {"length": 512}, "demo", 6, metric="answer_nll")
    assert (ruler.length, ruler.samples_per_task, ruler.mode) == (512, 6, "score")  # answer_nll: no generation
    assert suite_settings_for("ruler", {"mode": "both"}, "demo", None, metric="answer_nll").mode == "both"  # named
    assert suite_settings_for("ruler", {"samples_per_task": 2}, "demo", 7).samples_per_task == 7  # --samples wins


def test_the_study_result_is_typed_without_any():
    from polykv.eval.study.run import StudyResult

    hints = {name: str(hint) for name, hint in StudyResult.__annotations__.items()}
    assert not [name for name, hint in hints.items() if "Any" in hint], hints
    assert hints["factorial"] == "Report" and hints["profile"] == "Profile" and hints["sweeps"] == "dict[str, Report]"

"""Reading what the model answered: `polykv runs show RUN` (--task, --failed) and `polykv compare A B --samples`,
over a results database holding RULER-like samples with predictions, gold answers and prompt ids."""

from __future__ import annotations

import json

import pytest

from polykv.eval.results.store import SampleRecord, Store
from polykv.plan import Plan
from tests.helpers import assert_one_line_error

SETTINGS = {"tasks": ["niah_single_1", "vt"], "mode": "generate"}
GOLD = {"niah_single_1": ["8094927"], "vt": ["QSOZV", "JVSSA"]}
ANSWERS = {  # run -> (task, sample) -> (prediction, score)
    "aaaa1111": {("niah_single_1", "000"): (" 8094927.", 100.0), ("niah_single_1", "001"): (" 1234567.", 0.0),
                 ("vt", "000"): (" QSOZV, JVSSA", 100.0)},
    "bbbb2222": {("niah_single_1", "000"): (" 8094927.", 100.0), ("niah_single_1", "001"): (" 8530575.", 100.0),
                 ("vt", "000"): ("\nThe grass is green.\x1b[31m", 0.0)},
    "ffff0000": {("niah_single_1", "000"): (" 8094927.", 100.0), ("niah_single_1", "001"): (" 8530575.", 100.0),
                 ("vt", "000"): (" QSOZV, JVSSA", 100.0)},
}  # fmt: skip


@pytest.fixture
def workspace(tmp_path):
    store = Store(tmp_path / "ws" / "results.sqlite")
    plans = {"aaaa1111": Plan.homogeneous("tova", 8, 5), "bbbb2222": Plan.homogeneous("h2o", 8, 5)}
    plans["ffff0000"] = Plan.homogeneous("full", None, 5)
    for run_id, samples in ANSWERS.items():
        store.create_run(
            run_id, model="demo", plan_name=plans[run_id].name, plan_hash="h", plan_json=plans[run_id].to_json(),
            suite="ruler", settings=SETTINGS, seed=0, total_samples=3, versions={},
        )  # fmt: skip
        by_task: dict[str, list[float]] = {}
        for (task, sample), (prediction, score) in samples.items():
            prompt = {"task": task, "sample": sample, "seed": 0, "sha256": f"{hash((task, sample)) & 0xFFFF:04x}"}
            metrics = {"score": score, "agreement": float(prediction == ANSWERS["ffff0000"][(task, sample)][0])}
            store.add_sample(run_id, task, sample, metrics, 0.1, SampleRecord(prediction, GOLD[task], prompt))
            by_task.setdefault(task, []).append(score)
        scores = {t: {"score": sum(v) / len(v)} for t, v in by_task.items()}
        store.set_task_scores(run_id, scores, {t: len(v) for t, v in by_task.items()})
        store.set_status(run_id, "finished")
    return tmp_path / "ws"


def test_runs_show_lists_every_sample_with_its_gold_and_answer(polykv, workspace):
    result = polykv("runs", "show", "aaaa", "-w", str(workspace))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("run aaaa1111 (tova-both-8 on ruler, demo): 3 samples shown")
    assert lines[1].split() == ["task", "sample", "metrics", "gold", "answer", "fullkv"]  # a FullKV twin: its answers
    assert any("niah_single_1" in line and "8094927" in line and "1234567." in line for line in lines)
    assert any("vt" in line and "QSOZV | JVSSA" in line for line in lines)  # several gold answers, one cell


def test_runs_show_says_what_the_runs_plan_keeps_of_the_kv_cache_against_fullkv(polykv, workspace):
    store = Store(workspace / "results.sqlite")
    plan = Plan.homogeneous("tova", 8, 5)  # 8 tokens in each of the demo model's 5 layers
    store.create_run(
        "cccc3333", model="demo", plan_name=plan.name, plan_hash="h", plan_json=plan.to_json(), suite="ruler",
        settings={**SETTINGS, "length": [100, 200]}, seed=0, total_samples=0, versions={},
    )  # fmt: skip
    lines = polykv("runs", "show", "cccc", "-w", str(workspace)).stdout.splitlines()
    assert lines[1].startswith(
        "KV kept entering the answer at the suite's length (200 tokens): 40 of FullKV's 1,000 token-layers ("
    ) and lines[1].endswith("MiB), 4.0%")
    assert not any(
        line.startswith("KV kept") for line in polykv("runs", "show", "aaaa", "-w", str(workspace)).stdout.splitlines()
    )  # no length: no line


def test_runs_show_puts_fullkvs_answer_beside_the_plans_when_the_database_has_it(polykv, workspace):
    lines = polykv("runs", "show", "bbbb", "--task", "vt", "--width", "80", "-w", str(workspace)).stdout.splitlines()
    assert lines[1].split() == ["task", "sample", "metrics", "gold", "answer", "fullkv"]
    assert "QSOZV, JVSSA" in lines[2].split("green.")[-1]  # FullKV (run ffff0000) answered right where h2o did not
    assert lines[-1].startswith("fullkv: run ffff0000's answer to the same prompt; agreement: 1 when")


def test_runs_show_keeps_one_task_or_only_the_failed_samples(polykv, workspace):
    failed = polykv("runs", "show", "aaaa", "--failed", "-w", str(workspace))
    rows = failed.stdout.splitlines()[2:-1]  # the last line says where FullKV's answers come from
    assert len(rows) == 1 and "001" in rows[0] and "score=0" in rows[0]
    one_task = polykv("runs", "show", "bbbb", "--task", "vt", "-w", str(workspace))
    rows = one_task.stdout.splitlines()[2:-1]
    assert len(rows) == 1 and rows[0].startswith("vt")
    assert "\\n" in rows[0] and "\x1b" not in one_task.stdout  # a newline and an escape shown, not obeyed
    assert_one_line_error(polykv("runs", "show", "aaaa", "--task", "cwe", "-w", str(workspace)), "has no task 'cwe'")
    assert_one_line_error(polykv("runs", "show", "zzzz", "-w", str(workspace)), "no run with that id")


def test_compare_samples_shows_where_two_runs_differ_gold_and_fullkv_beside(polykv, workspace):
    result = polykv("compare", "aaaa", "bbbb", "--metric", "score", "--samples", "-w", str(workspace))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "sign-flip permutation test over 3 paired samples" in out and "minimal detectable difference" in out
    niah = out[out.index("niah_single_1: 1 samples differ") :]
    header = niah.splitlines()[1].split()
    assert header == ["sample", "gold", "A", "B", "FullKV"]
    row = niah.splitlines()[2]
    assert row.startswith("001") and "1234567." in row and "8530575." in row  # A wrong, B and FullKV right
    assert "vt: 1 samples differ" in out
    same = polykv("compare", "aaaa", "aaaa", "--metric", "score", "--samples", "-w", str(workspace))
    assert "niah_single_1: 0 samples differ" in same.stdout


def test_the_settings_of_a_stored_run_are_what_a_twin_must_match(workspace):
    from polykv.eval.comparing.answers import fullkv_twin

    store = Store(workspace / "results.sqlite", readonly=True)
    assert fullkv_twin(store, store.run("aaaa1111")) == "ffff0000"
    assert json.loads(store.run("aaaa1111").settings) == SETTINGS


def test_samples_pair_only_when_they_asked_the_same_prompt(tmp_path):
    """Runs of two seeds share sample ids, not prompts: compared over tasks alone, not as paired samples."""
    from polykv.eval.comparing.compare import compare_runs

    store = Store(tmp_path / "results.sqlite")
    plan = Plan.homogeneous("tova", 8, 5)
    for run_id, seed, scores in (("seed0a", 0, [1.0, 2.0]), ("seed0b", 0, [0.5, 1.0]), ("seed1", 1, [0.0, 0.0])):
        store.create_run(
            run_id, model="demo", plan_name=run_id, plan_hash="h", plan_json=plan.to_json(), suite="ruler",
            settings=SETTINGS, seed=seed, total_samples=2, versions={},
        )  # fmt: skip
        for k, value in enumerate(scores):
            prompt = {"task": "vt", "sample": f"{k:03d}", "seed": seed, "sha256": f"{seed:04x}{k:012x}"}
            store.add_sample(run_id, "vt", f"{k:03d}", {"answer_nll": value}, 0.1, SampleRecord(None, ["x"], prompt))
        store.set_task_scores(run_id, {"vt": {"answer_nll": sum(scores) / 2}}, {"vt": 2})
        store.set_status(run_id, "finished")
    same = compare_runs(store, "seed0a", "seed0b", "answer_nll")
    assert same.samples is not None and same.samples.samples == 2
    other = compare_runs(store, "seed0a", "seed1", "answer_nll")
    assert other.samples is None and other.difference == pytest.approx(1.5)  # A - B over the one task


def test_answers_pair_by_prompt_and_fullkv_is_the_same_seeds(tmp_path):
    """Side by side, and FullKV's answer beside a run's, pair samples one way (`sample_key`): the same prompt.
    Another seed's run shares sample ids, not prompts: its samples never pair, and its FullKV is no twin."""
    from polykv.eval.comparing.answers import answers, fullkv_twin, side_by_side

    store = Store(tmp_path / "results.sqlite")
    routed, full = Plan.homogeneous("tova", 8, 5), Plan.homogeneous("full", None, 5)
    for run_id, plan, seed in (("plan0", routed, 0), ("plan1", routed, 1), ("full1", full, 1)):
        store.create_run(
            run_id, model="demo", plan_name=run_id, plan_hash=run_id, plan_json=plan.to_json(), suite="ruler",
            settings=SETTINGS, seed=seed, total_samples=1, versions={},
        )  # fmt: skip
        prompt = {"task": "vt", "sample": "000", "seed": seed, "sha256": f"prompt-of-seed-{seed}"}
        store.add_sample(run_id, "vt", "000", {"score": 0.0}, 0.1, SampleRecord(f"{run_id} says", ["x"], prompt))
        store.set_task_scores(run_id, {"vt": {"score": 0.0}}, {"vt": 1})
        store.set_status(run_id, "finished")
    assert side_by_side(store, "plan0", "plan1", "vt") == []  # same id "000", other prompts
    assert [row["B"] for row in side_by_side(store, "plan1", "full1", "vt")] == ["full1 says"]
    assert fullkv_twin(store, store.run("plan0")) is None  # FullKV ran seed 1 only
    assert fullkv_twin(store, store.run("plan1")) == "full1"
    assert [row["FullKV"] for row in answers(store, "plan1")] == ["full1 says"]
    assert [row["FullKV"] for row in answers(store, "plan0")] == [None]


def test_samples_stored_before_prompts_were_pair_with_hashed_ones_of_the_same_seed(tmp_path):
    """A run stored before prompts were recorded has no prompt hash: side by side it pairs with another run by id
    and seed (never with another seed's), and its FullKV twin's answer shows beside it."""
    from polykv.eval.comparing.answers import answers, side_by_side

    store = Store(tmp_path / "results.sqlite")
    routed, full = Plan.homogeneous("tova", 8, 5), Plan.homogeneous("full", None, 5)
    for run_id, plan, seed, hashed in (("old", routed, 0, False), ("new", routed, 0, True), ("full", full, 0, True)):
        store.create_run(
            run_id, model="demo", plan_name=run_id, plan_hash=run_id, plan_json=plan.to_json(), suite="ruler",
            settings=SETTINGS, seed=seed, total_samples=1, versions={},
        )  # fmt: skip
        prompt = {"task": "vt", "sample": "000", "seed": seed, "sha256": "abc"} if hashed else None
        store.add_sample(run_id, "vt", "000", {"score": 0.0}, 0.1, SampleRecord(f"{run_id} says", ["x"], prompt))
        store.set_task_scores(run_id, {"vt": {"score": 0.0}}, {"vt": 1})
        store.set_status(run_id, "finished")
    assert [(row["A"], row["B"]) for row in side_by_side(store, "old", "new", "vt")] == [("old says", "new says")]
    assert [row["FullKV"] for row in answers(store, "old")] == ["full says"]

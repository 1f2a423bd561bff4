"""The fidelity suite and resumable runs in the SQLite store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polykv.eval.runner import run_suite
from polykv.eval.store import Store
from polykv.eval.suites.fidelity import FidelitySettings, rouge_l
from polykv.plan import Plan
from test_cli import assert_one_line_error, polykv  # noqa: F401  (the fixture)

REPO = Path(__file__).resolve().parents[1]
SMALL = FidelitySettings(tasks=("prose", "stories"), samples_per_task=2, prompt_tokens=96, continuation=8, generate=8)


def test_rouge_l_by_hand():
    assert rouge_l([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    # LCS of [1,2,3,4] and [1,3,4,5] is [1,3,4]: P = 3/4, R = 3/4 -> F = 0.75
    assert rouge_l([1, 2, 3, 4], [1, 3, 4, 5]) == 0.75
    assert rouge_l([1, 2], [3, 4]) == 0.0


def test_fullkv_scores_zero_kl_and_full_agreement(demo_model, tmp_path):
    model, tokenizer = demo_model
    store = Store(tmp_path / "results.sqlite")
    run_id = run_suite(store, "demo", model, tokenizer, Plan.homogeneous("full", None, 5), "fidelity", SMALL)
    scores = store.task_scores(run_id)
    assert set(scores) == {"prose", "stories"}
    for values in scores.values():
        assert values["kl"] <= 1e-9 and values["top1"] == 1.0 and values["rougeL"] == 1.0 and values["ppl"] > 1
    assert store.run(run_id)["status"] == "finished" and len(store.samples(run_id)) == 4


def test_a_plan_scores_worse_than_fullkv_and_finished_runs_are_not_recomputed(demo_model, tmp_path):
    model, tokenizer = demo_model
    store = Store(tmp_path / "results.sqlite")
    plan = Plan.homogeneous("streamingllm", 16, 5, params={"sinks": 4})
    run_id = run_suite(store, "demo", model, tokenizer, plan, "fidelity", SMALL)
    scores = store.task_scores(run_id)
    assert all(v["kl"] > 0 for v in scores.values())
    created = [row["created"] for row in store.samples(run_id)]
    assert run_suite(store, "demo", model, tokenizer, plan, "fidelity", SMALL) == run_id  # found, not rerun
    assert [row["created"] for row in store.samples(run_id)] == created


def test_unknown_suite_and_wrong_plan_are_refused(demo_model, tmp_path):
    from polykv.plan import PlanError

    model, tokenizer = demo_model
    store = Store(tmp_path / "results.sqlite")
    with pytest.raises(ValueError, match="unknown suite 'ruler2'"):
        run_suite(store, "demo", model, tokenizer, Plan.homogeneous("full", None, 5), "ruler2", SMALL)
    with pytest.raises(PlanError, match="the plan has 3 layers but the model has 5"):
        run_suite(store, "demo", model, tokenizer, Plan.homogeneous("full", None, 3), "fidelity", SMALL)
    with pytest.raises(ValueError, match="unknown fidelity task"):
        FidelitySettings(tasks=("poetry",))


def _eval_command(workspace: Path) -> list[str]:
    return [sys.executable, "-m", "polykv.cli", "eval", "--plan", str(REPO / "plans/demo/mixed.json"),
            "--samples", "3", "--tasks", "prose,stories", "--prompt-tokens", "128", "-w", str(workspace)]


def test_a_killed_run_resumes_without_recomputing_finished_samples(tmp_path):
    env = {**os.environ, "POLYKV_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    killed = tmp_path / "killed"
    process = subprocess.Popen(_eval_command(killed), env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    store = None
    while time.time() < deadline:  # wait until at least two samples are committed, then kill -9
        if (killed / "results.sqlite").exists():
            store = Store(killed / "results.sqlite")
            runs = store.runs()
            if runs and runs[0]["done_samples"] >= 2:
                break
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    (run,) = store.runs()
    before = {(r["task"], r["sample"]): r["created"] for r in store.samples(run["id"])}
    assert 2 <= len(before) < run["total_samples"] and run["status"] == "running"

    subprocess.run(_eval_command(killed), env=env, cwd=REPO, check=True, capture_output=True, timeout=300)
    after = {(r["task"], r["sample"]): r["created"] for r in store.samples(run["id"])}
    assert len(after) == run["total_samples"] and all(after[key] == created for key, created in before.items())
    assert store.run(run["id"])["status"] == "finished"

    fresh = tmp_path / "fresh"
    subprocess.run(_eval_command(fresh), env=env, cwd=REPO, check=True, capture_output=True, timeout=300)
    assert Store(fresh / "results.sqlite").task_scores(run["id"]) == store.task_scores(run["id"])


def test_cli_eval_of_a_shipped_plan_on_the_demo_model_within_a_minute(tmp_path):
    """The default fidelity run (4 tasks x 4 samples, 479-token prompts) of the mixed demo plan."""
    env = {**os.environ, "POLYKV_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "polykv.cli", "eval", "--plan", str(REPO / "plans/demo/mixed.json"), "-w", str(tmp_path)]
    started = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - started
    assert result.returncode == 0, result.stderr
    assert elapsed <= 60, f"fidelity eval took {elapsed:.1f} s"
    lines = result.stdout.splitlines()
    assert "mixed-demo on fidelity (demo), finished" in lines[0]
    assert [line.split()[0] for line in lines[2:]] == ["code", "jargon", "prose", "stories"]


def test_runs_and_compare_commands(demo_model, tmp_path, polykv):  # noqa: F811
    model, tokenizer = demo_model
    store = Store(tmp_path / "results.sqlite")
    full = run_suite(store, "demo", model, tokenizer, Plan.homogeneous("full", None, 5), "fidelity", SMALL)
    tova = run_suite(store, "demo", model, tokenizer, Plan.homogeneous("tova", 16, 5), "fidelity", SMALL)
    listed = polykv("runs", "-w", str(tmp_path))
    assert listed.returncode == 0 and full in listed.stdout and "4/4" in listed.stdout
    compared = polykv("compare", tova[:6], full[:6], "--metric", "kl", "-w", str(tmp_path))
    assert compared.returncode == 0, compared.stderr
    assert "metric kl (lower is better)" in compared.stdout and "A wins / ties / losses: 0 / 0 / 2" in compared.stdout
    kl = store.task_scores(tova)
    expected = (kl["prose"]["kl"] + kl["stories"]["kl"]) / 2
    assert f"macro-average A - B: {expected:+.4f}" in compared.stdout
    assert_one_line_error(polykv("compare", "nope", full, "-w", str(tmp_path)), "run 'nope': no run")

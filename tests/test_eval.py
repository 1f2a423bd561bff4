"""The fidelity suite and resumable runs in the SQLite store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polykv.eval.results.store import Store
from polykv.eval.running.suite_runner import run_suite
from polykv.eval.suites.fidelity import FidelitySettings, default_tasks, rouge_l
from polykv.plan import Plan
from tests.helpers import MIXED, REPO, TINY_FIDELITY, assert_one_line_error, run_cli, wait_until


def test_rouge_l_by_hand():
    assert rouge_l([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    # LCS of [1,2,3,4] and [1,3,4,5] is [1,3,4]: P = 3/4, R = 3/4 -> F = 0.75
    assert rouge_l([1, 2, 3, 4], [1, 3, 4, 5]) == 0.75
    assert rouge_l([1, 2], [3, 4]) == 0.0


def test_fullkv_scores_zero_kl_and_full_agreement(demo_model, tmp_path):
    model, tokenizer = demo_model
    store = Store(tmp_path / "results.sqlite")
    run_id = run_suite(store, "demo", model, tokenizer, Plan.homogeneous("full", None, 5), "fidelity", TINY_FIDELITY)
    scores = store.task_scores(run_id)
    assert set(scores) == {"prose", "stories"}
    for values in scores.values():
        assert values["kl"] <= 1e-9 and values["top1"] == 1.0 and values["rougeL"] == 1.0 and values["ppl"] > 1
    assert store.run(run_id).status == "finished" and len(store.samples(run_id)) == 4


def test_a_plan_scores_worse_than_fullkv_and_finished_runs_are_not_recomputed(demo_model, tmp_path):
    model, tokenizer = demo_model
    store = Store(tmp_path / "results.sqlite")
    plan = Plan.homogeneous("streamingllm", 16, 5, params={"sinks": 4})
    run_id = run_suite(store, "demo", model, tokenizer, plan, "fidelity", TINY_FIDELITY)
    scores = store.task_scores(run_id)
    assert all(v["kl"] > 0 for v in scores.values())
    assert all(row.kv_held["entering"] == [16] * 5 for row in store.samples(run_id))  # measured with every sample
    created = [row.created for row in store.samples(run_id)]
    assert run_suite(store, "demo", model, tokenizer, plan, "fidelity", TINY_FIDELITY) == run_id  # found, not rerun
    assert [row.created for row in store.samples(run_id)] == created


def test_unknown_suite_and_wrong_plan_are_refused(demo_model, tmp_path):
    from polykv.plan import PlanError

    model, tokenizer = demo_model
    store = Store(tmp_path / "results.sqlite")
    with pytest.raises(ValueError, match="unknown suite 'ruler2'"):
        run_suite(store, "demo", model, tokenizer, Plan.homogeneous("full", None, 5), "ruler2", TINY_FIDELITY)
    with pytest.raises(PlanError, match="the plan has 3 layers but the model has 5"):
        run_suite(store, "demo", model, tokenizer, Plan.homogeneous("full", None, 3), "fidelity", TINY_FIDELITY)
    with pytest.raises(ValueError, match="unknown fidelity task"):
        FidelitySettings(tasks=("poetry",))


def _eval_command(workspace: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "polykv.cli",
        "eval",
        "--plan",
        str(MIXED),
        "--samples",
        "3",
        "--tasks",
        "prose,stories",
        "--prompt-tokens",
        "128",
        "-w",
        str(workspace),
    ]


@pytest.mark.slow  # three real `polykv eval` processes, one killed
def test_a_killed_run_resumes_without_recomputing_finished_samples(tmp_path):
    env = {**os.environ, "POLYKV_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    killed = tmp_path / "killed"
    process = subprocess.Popen(
        _eval_command(killed), env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )

    def two_samples_committed():
        if (killed / "results.sqlite").exists():
            store = Store(killed / "results.sqlite")
            runs = store.runs()
            return store if runs and runs[0].done_samples >= 2 else None
        return None

    try:
        store = wait_until(two_samples_committed, 600)  # then kill -9
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    (run,) = store.runs()
    before = {(r.task, r.sample): r.created for r in store.samples(run.id)}
    assert 2 <= len(before) < run.total_samples and run.status == "stopped"  # its worker is gone

    subprocess.run(_eval_command(killed), env=env, cwd=REPO, check=True, capture_output=True, timeout=300)
    after = {(r.task, r.sample): r.created for r in store.samples(run.id)}
    assert len(after) == run.total_samples and all(after[key] == created for key, created in before.items())
    assert store.run(run.id).status == "finished"

    fresh = tmp_path / "fresh"
    subprocess.run(_eval_command(fresh), env=env, cwd=REPO, check=True, capture_output=True, timeout=300)
    assert Store(fresh / "results.sqlite").task_scores(run.id) == store.task_scores(run.id)


@pytest.mark.slow  # the default-size fidelity run: 28 samples of 478-token prompts, in a fresh process
def test_cli_eval_of_a_shipped_plan_on_the_demo_model_scores_every_default_task(tmp_path):
    """The default fidelity run on the demo (its 7 story tasks x 4 samples, 478-token prompts) of the mixed
    demo plan: it finishes, every sample is stored, and each default task gets its scores, printed and
    stored alike. Its duration is printed (target: under a minute on a quiet machine), never asserted."""
    env = {**os.environ, "POLYKV_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    result = run_cli("eval", "--plan", str(MIXED), "-w", str(tmp_path), env=env, cwd=REPO, timeout=900)
    print(f"note: the default fidelity eval of mixed-demo on the demo model took {time.perf_counter() - started:.1f} s")
    assert result.returncode == 0, result.stderr
    store = Store(tmp_path / "results.sqlite")
    (run,) = store.runs()
    tasks = sorted(default_tasks("demo"))
    assert run.plan_name == "mixed-demo" and run.status == "finished"
    assert run.done_samples == run.total_samples == 4 * len(tasks)
    scores = store.task_scores(run.id)
    assert sorted(scores) == tasks
    for task, metrics in scores.items():
        assert set(metrics) == {"kl", "ppl", "rougeL", "top1"}, task
        assert metrics["kl"] >= 0 and metrics["ppl"] >= 1 and 0 <= metrics["top1"] <= 1 and 0 <= metrics["rougeL"] <= 1
    lines = result.stdout.splitlines()
    assert lines[0] == f"run {run.id}: mixed-demo on fidelity (demo), finished"
    header = lines[1].split()
    assert header == ["task", "kl", "ppl", "rougeL", "top1"]
    printed = {row.split()[0]: dict(zip(header[1:], row.split()[1:])) for row in lines[2:]}
    assert printed == {task: {m: f"{v:.4f}" for m, v in metrics.items()} for task, metrics in scores.items()}


def test_runs_and_compare_commands(demo_model, tmp_path, polykv):
    model, tokenizer = demo_model
    store = Store(tmp_path / "results.sqlite")
    full = run_suite(store, "demo", model, tokenizer, Plan.homogeneous("full", None, 5), "fidelity", TINY_FIDELITY)
    tova = run_suite(store, "demo", model, tokenizer, Plan.homogeneous("tova", 16, 5), "fidelity", TINY_FIDELITY)
    listed = polykv("runs", "-w", str(tmp_path))
    assert listed.returncode == 0 and full in listed.stdout and "4/4" in listed.stdout
    compared = polykv("compare", tova[:6], full[:6], "--metric", "kl", "-w", str(tmp_path))
    assert compared.returncode == 0, compared.stderr
    assert "metric kl (lower is better)" in compared.stdout and "A wins / ties / losses: 0 / 0 / 2" in compared.stdout
    kl = store.task_scores(tova)
    expected = (kl["prose"]["kl"] + kl["stories"]["kl"]) / 2
    assert f"macro-average A - B: {expected:+.4f}" in compared.stdout
    assert_one_line_error(polykv("compare", "nope", full, "-w", str(tmp_path)), "run 'nope': no run")


def test_run_ids_cover_method_and_suite_revisions(demo_model, tmp_path, monkeypatch):
    import json

    from polykv.eval.suites import fidelity
    from polykv.methods import REGISTRY

    model, tokenizer = demo_model
    store = Store(tmp_path / "results.sqlite")
    tiny = FidelitySettings(tasks=("prose",), samples_per_task=1, prompt_tokens=48, continuation=2, generate=2)
    plan = Plan.homogeneous("streamingllm", 16, 5, params={"sinks": 4})
    first = run_suite(store, "demo", model, tokenizer, plan, "fidelity", tiny)
    stored = json.loads(store.run(first).versions)["revisions"]
    assert stored == {"suite": fidelity.REVISION, "methods": {"streamingllm": REGISTRY["streamingllm"].revision}}
    first_samples = store.samples(first)

    # A method's rule changed: a new run id, computed afresh, the old run kept apart with its samples.
    monkeypatch.setattr(REGISTRY["streamingllm"], "revision", REGISTRY["streamingllm"].revision + 1)
    second = run_suite(store, "demo", model, tokenizer, plan, "fidelity", tiny)
    assert second != first and store.run(second).status == "finished"
    now = json.loads(store.run(second).versions)["revisions"]
    assert now["methods"]["streamingllm"] == stored["methods"]["streamingllm"] + 1
    assert len(store.samples(second)) == 1 and all(row.run_id == second for row in store.samples(second))
    assert store.samples(first) == first_samples  # the old run is untouched and not counted as the new one
    assert min(r.created for r in store.samples(second)) > max(r.created for r in first_samples)  # recomputed

    # The suite's samples or scoring changed: again a new run.
    monkeypatch.setattr(fidelity, "REVISION", fidelity.REVISION + 1)
    third = run_suite(store, "demo", model, tokenizer, plan, "fidelity", tiny)
    assert third not in (first, second) and len(store.samples(third)) == 1
    assert {run.id for run in store.runs()} == {first, second, third}


def test_run_ids_cover_the_methods_of_both_phases(monkeypatch):
    from polykv.eval.running.suite_runner import code_revisions, run_id_for
    from polykv.methods import REGISTRY

    plan = Plan.load(MIXED)  # prefill snapkv/h2o/..., decode tova/h2o/...
    revisions = code_revisions(plan, "fidelity")
    assert set(revisions["methods"]) == {"streamingllm", "snapkv", "h2o", "tova"}
    decode_only = Plan.homogeneous("cake", 16, 5, "decode")  # full at prefill, cake at decode
    assert set(code_revisions(decode_only, "ruler")["methods"]) == {"full", "cake"}
    before = run_id_for("demo", decode_only, "ruler", {}, 0)
    monkeypatch.setattr(REGISTRY["full"], "revision", REGISTRY["full"].revision + 1)  # the prefill phase's method
    assert run_id_for("demo", decode_only, "ruler", {}, 0) != before
    with pytest.raises(ValueError, match="unknown suite 'nope'"):
        code_revisions(plan, "nope")


# ---- the demo's in-distribution tasks; FullKV's reference computed once per sample -----------------------


def test_default_tasks_depend_on_the_model():
    from polykv.eval.suites.fidelity import DEMO_TASKS, GENERAL_TASKS, TASK_SOURCES, default_tasks
    from polykv.profile.corpus import default_sources

    assert default_tasks("demo") == DEMO_TASKS and len(DEMO_TASKS) >= 6  # enough for a bootstrap over tasks
    assert default_tasks("Qwen/Qwen3-8B") == GENERAL_TASKS == ("prose", "jargon", "code", "stories")
    assert FidelitySettings().tasks == GENERAL_TASKS  # constructible with no arguments, model-independent
    # the demo is scored on the families it is calibrated on (from the other split)
    assert {TASK_SOURCES[t] for t in DEMO_TASKS} == set(default_sources("demo"))
    with pytest.raises(ValueError, match="listed once"):
        FidelitySettings(tasks=("stories", "stories"))


def test_the_demos_story_tasks_are_held_out_from_its_calibration_corpus(demo_model):
    from polykv.eval.suites.fidelity import DEMO_TASKS, build_samples
    from polykv.profile.corpus import CorpusSpec, build_corpus, default_sources

    model, tokenizer = demo_model
    settings = FidelitySettings(tasks=DEMO_TASKS, samples_per_task=2, prompt_tokens=40, continuation=8, generate=8)
    samples = build_samples(tokenizer, model, settings, seed=0)
    assert [task for task, _, _ in samples] == [t for t in DEMO_TASKS for _ in range(2)]
    length = len(samples[0][2])
    calibration = build_corpus(
        tokenizer, CorpusSpec(sources=default_sources("demo"), num_sequences=14, max_tokens=length, seed=0), model=model
    )
    held_out = {tuple(ids) for _, _, ids in samples}
    assert len(held_out) == len(samples) and not held_out & {tuple(s) for s in calibration.sequences}
    # a task's samples do not depend on the other tasks listed
    alone = build_samples(
        tokenizer,
        model,
        FidelitySettings(tasks=("tale-sun",), samples_per_task=2, prompt_tokens=40, continuation=8, generate=8),
        seed=0,
    )
    assert alone == [s for s in samples if s[0] == "tale-sun"]


def test_fullkv_reference_is_computed_once_per_sample_and_scores_are_unchanged(demo_model, monkeypatch):
    import copy

    from polykv.eval.suites import fidelity

    model, tokenizer = demo_model
    settings = FidelitySettings(tasks=("stories",), samples_per_task=1, prompt_tokens=48, continuation=8, generate=8)
    ((_, _, ids),) = fidelity.build_samples(tokenizer, model, settings, seed=0)
    plans = [Plan.homogeneous("streamingllm", 16, 5, params={"sinks": 4}), Plan.homogeneous("tova", 16, 5)]

    fresh = []
    for plan in plans:  # the reference recomputed for each plan, as before the cache
        fidelity.clear_reference_cache()
        fresh.append(fidelity.score_sample(model, plan, ids, settings))

    calls = []
    trace = fidelity._trace
    monkeypatch.setattr(fidelity, "_trace", lambda m, plan, *a: calls.append(plan) or trace(m, plan, *a))
    fidelity.clear_reference_cache()
    cached = [fidelity.score_sample(model, plan, ids, settings) for plan in plans]
    assert cached == fresh  # identical, not merely close
    assert calls.count(None) == 1 and len(calls) == 3  # FullKV once, then each plan
    # another model object (even an identical copy) and other settings have their own reference
    other = copy.deepcopy(model)
    fidelity.score_sample(other, plans[0], ids, settings)
    fidelity.score_sample(model, plans[0], ids, FidelitySettings(tasks=("stories",), continuation=8, generate=4))
    assert calls.count(None) == 3
    fidelity.clear_reference_cache()


def test_the_cli_fidelity_settings_use_the_models_default_tasks_unless_given():
    from polykv.cli.common import _suite_settings
    from polykv.eval.suites.fidelity import DEMO_TASKS, GENERAL_TASKS

    assert _suite_settings("fidelity", 4, None, 1024, None, "demo").tasks == DEMO_TASKS
    assert _suite_settings("fidelity", 4, None, 1024, None, "Qwen/Qwen3-8B").tasks == GENERAL_TASKS
    assert _suite_settings("fidelity", 2, "prose, tale-sun", 64, None, "demo").tasks == ("prose", "tale-sun")
    # --settings without tasks: the model's default tasks too (`polykv.eval.running.defaults`, as the study and the
    # app's forms), its other fields over the suite's defaults, and --samples / --prompt-tokens left out
    given = _suite_settings("fidelity", 9, "prose", 64, '{"samples_per_task": 2}', "demo")
    assert (given.tasks, given.samples_per_task, given.prompt_tokens) == (DEMO_TASKS, 2, 1024)

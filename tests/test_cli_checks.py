"""Every option checked before any work: the command-line findings of a hostile probe (issue 41, point 8), each
refused in one line (`error: ...`, exit 2) before a model loads. The model loaders are replaced by ones that fail
the test, so a refusal that came after a load (or a command that started working) cannot pass."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import BERT_CONFIG, MIXED, REPO, assert_one_line_error

HUGE = "1000000000000000000"


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model (or its weights through transformers) fails the test."""
    import transformers

    import polykv.models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded: the option should have been refused before")

    monkeypatch.setattr(polykv.models, "load_model", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


CASES = {
    # counts without bounds: each would have run for days or grown until the memory was gone
    "profile-sequences": (["profile", "--sequences", "1000000000", "--max-tokens", "16"], "'--sequences'", "10000"),
    "heterogeneity-inputs": (["heterogeneity", "--inputs", HUGE], "'--inputs'"),
    "eval-samples": (["eval", "--samples", HUGE], "'--samples'", "10000"),
    "eval-settings-samples": (
        ["eval", "--suite", "ruler", "--settings", json.dumps({"samples_per_task": 10**12, "length": 256})],
        "ruler samples_per_task 1,000,000,000,000 is more than PolyKV takes (at most 10,000",
    ),
    "study-k": (["experiment", "study", "--k", "1000000"], "'--k'", "100000"),
    "study-workers": (["experiment", "study", "--workers", "1000"], "'--workers'", "256"),
    "study-mde-inf": (
        ["experiment", "study", "--suite", "ruler", "--samples", "auto", "--mde", "inf"],
        "--mde must be a finite number",
    ),
    "study-time-limit-inf": (["experiment", "study", "--time-limit", "inf"], "--time-limit must be a finite number"),
    "search-evaluations": (
        ["search", "-o", "s", "-b", "8", "--evaluations", "1000000000000000"],
        "'--evaluations'",
        "1000000",
    ),
    # an option the chosen path would have ignored, or never checked
    "search-sources-objective-kl": (
        ["search", "-o", "s", "-b", "8", "--sources", "ruler:niah_single_1", "--objective", "kl"],
        "a workload search (--sources) minimises answer_nll, not --objective kl",
    ),
    "search-sources-objective-unknown": (
        ["search", "-o", "s", "-b", "8", "--sources", "ruler:niah_single_1", "--objective", "nosuch"],
        "not --objective nosuch",
    ),
    "search-sources-statistic": (
        ["search", "-o", "s", "-b", "8", "--sources", "ruler:niah_single_1", "--statistic", "nosuch"],
        "--statistic must be cosine or dppl",
    ),
    # the study's choices, refused at once (they were refused after the model, a profile and a pilot, or never)
    "study-statistic": (["experiment", "study", "--statistic", "nosuch"], "--statistic must be one of cosine, dppl"),
    "study-backend": (["experiment", "study", "--backend", "nosuch"], "--backend must be one of local, ray"),
    "study-allocation": (["experiment", "study", "--allocation", "nosuch"], "--allocation must be one of entropy, ppl"),
    "study-workload-sources": (["experiment", "study", "--sources", "ruler:nosuch"], "the study profiles text"),
    # devices this machine does not have (an AssertionError from torch, "a bug in PolyKV", before)
    "study-device": (["experiment", "study", "--device", "nosuchdevice"], "'nosuchdevice' is not a device"),
    "eval-device": (["eval", "--device", "cuda:7"], "--device cuda:7"),
    "search-device": (["search", "-o", "s", "-b", "8", "--device", "cuda:7"], "--device cuda:7"),
    # numbers that are not ASCII whole numbers
    "source-superscript-length": (
        ["search", "-o", "s", "-b", "8", "--sources", "ruler:niah_single_1@²"],
        "the length after @ must be a whole number of tokens",
    ),
    "source-arabic-indic-length": (
        ["search", "-o", "s", "-b", "8", "--sources", "ruler:niah_single_1@\u0665\u0661\u0662"],
        "the length after @ must be a whole number of tokens",
    ),
    "budgets-arabic-indic": (["experiment", "study", "--budgets", "\u0665"], "--budgets are positive whole numbers"),
    # issue 56's probes: a layer count checked before the plan's list is built; a question protocol before the model
    "search-question": (
        [
            "search",
            "-o",
            "s",
            "-b",
            "8",
            "--sources",
            "ruler:niah_single_1",
            "--objective",
            "answer_nll",
            "--question",
            "nosuch",
        ],
        "'nosuch' is not one of 'in-prompt', 'after-compression'",
    ),  # fmt: skip
    "plan-homogeneous-layers": (
        ["plan", "homogeneous", "tova", "--capacity", "8", "--layers", "1000000000", "-o", "x.json"],
        "a plan has at most 4,096 layers (got 1,000,000,000)",
    ),
    # typer's own range errors: one line now, not a five-line box
    "typer-range": (["eval", "--samples", "0"], "Invalid value for '--samples'", "polykv eval --help"),
    "typer-unknown-option": (["eval", "--nosuch"], "No such option: --nosuch"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_option_is_one_line_before_any_model_loads(name, polykv, no_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POLYKV_WORKSPACE", str(tmp_path / "ws"))
    args, *expected = CASES[name]
    assert_one_line_error(polykv(*args), *expected)
    assert not (tmp_path / "s").exists()  # a refused search wrote nothing


def test_a_prompt_longer_than_the_context_is_refused_before_the_model_loads(polykv, no_model):
    result = polykv("generate", "--prompt", "Once upon a time there was a little dog. " * 90)
    assert_one_line_error(result, "the prompt is 992 tokens and --max-new-tokens 96: more than the model's 512-token")
    assert "indexing errors" not in result.stderr  # transformers' warning is not passed on


def test_plan_show_refuses_a_prompt_past_the_models_context_before_printing_anything(polykv, tmp_path):
    plan = tmp_path / "p.json"
    assert polykv("plan", "homogeneous", "tova", "--capacity", "8", "-o", str(plan)).returncode == 0
    shown = polykv("plan", "show", str(plan), "-m", "demo", "--tokens", str(10**30 - 1))
    assert_one_line_error(shown, "is longer than demo's context (512 tokens)")
    assert shown.stdout == ""


def test_compare_says_when_two_runs_ran_on_different_models(polykv, tmp_path):
    from polykv.eval.results.store import Store
    from polykv.plan import Plan

    store = Store(tmp_path / "ws" / "results.sqlite")
    for run_id, model in (("aaaa1111", "demo"), ("bbbb2222", "smollm2")):
        plan = Plan.homogeneous("tova", 8, 5)
        store.create_run(
            run_id, model=model, plan_name=plan.name, plan_hash="h", plan_json=plan.to_json(), suite="fidelity",
            settings={}, seed=0, total_samples=1, versions={},
        )  # fmt: skip
        store.set_task_scores(run_id, {"t": {"top1": 0.5}}, {"t": 1})
        store.set_status(run_id, "finished")
    result = polykv("compare", "aaaa", "bbbb", "-w", str(tmp_path / "ws"))
    assert "A ran on demo and B on smollm2: the difference is the models' as well as the plans'" in result.stdout


@pytest.mark.parametrize("module", ["polykv.search.text.report", "polykv.search.workload.markdown"])
def test_a_report_script_given_another_json_says_so_in_one_line(module, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    extra = ["--out", str(tmp_path / "x.md")] if module.endswith("markdown") else []
    result = subprocess.run(
        [sys.executable, "-m", module, str(bad), *extra], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert_one_line_error(result, f"{bad} is not a")
    assert not (tmp_path / "x.md").exists()


@pytest.mark.parametrize(
    "module, fmt",
    [
        ("polykv.search.text.report", "polykv.search-report"),
        ("polykv.search.workload.markdown", "polykv.workload-report"),
    ],
)
def test_a_report_from_a_newer_version_is_refused_in_one_line(module, fmt, tmp_path):
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"format": fmt, "version": 99}))
    extra = ["--out", str(tmp_path / "x.md")] if module.endswith("markdown") else []
    result = subprocess.run(
        [sys.executable, "-m", module, str(newer), *extra], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert_one_line_error(result, "of version 99: this PolyKV reads version 1 at most")
    assert not (tmp_path / "x.md").exists()


def test_the_first_run_benchmark_refuses_a_missing_plan_in_one_line_and_writes_nothing(tmp_path):
    args = ["--plan", str(tmp_path / "nosuch.json"), "-w", str(tmp_path / "ws")]
    result = subprocess.run(
        [sys.executable, "benchmarks/first_run.py", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert_one_line_error(result, "nosuch.json: no such plan file")
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize("damage", ["truncated weights", "tokenizer of NUL bytes"])
def test_a_model_folder_with_damaged_files_is_one_line_naming_the_folder(damage, polykv, demo_model, tmp_path):
    from tests.helpers import tiny_model

    folder = tmp_path / "model"
    tiny_model("llama", num_hidden_layers=5).save_pretrained(folder)  # as many layers as the default plan
    demo_model[1].save_pretrained(folder)
    if damage == "truncated weights":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    else:
        (folder / "tokenizer.json").write_bytes(b"\0" * 4096)
    result = polykv("generate", "--model", str(folder), "--prompt", "Once", "--max-new-tokens", "2")
    assert_one_line_error(result, f"{folder}: its weights or tokenizer cannot be read")


# A refusal that needs only a file or a model's config.json comes before torch and transformers load (seconds each):
# an eval with malformed settings took 12 s to say so, a generate on a BERT directory 15 s (both while the suite ran).
QUICK_REFUSALS = {
    "eval-malformed-settings": (["eval", "--settings", "{{"], "malformed JSON"),
    "eval-unknown-suite": (["eval", "--suite", "nope"], "unknown suite 'nope'"),
    "generate-bert": (["generate", "--model", "bert"], "model_type 'bert'"),
    "profile-bert": (["profile", "--model", "bert"], "model_type 'bert'"),
    "generate-capacity-over-context": (["generate", "--plan", "plan.json"], "is more than the model's context"),
}
LOADED_MODULES = """
import runpy, sys
sys.argv = ["polykv", *sys.argv[1:]]
try:
    runpy.run_module("polykv.cli", run_name="__main__")
finally:
    # a submodule of each: `polykv.lazy` registers torch in sys.modules before its code runs
    print("loaded:", *sorted(m for m in ("torch._C", "transformers.utils") if m in sys.modules))
"""


@pytest.mark.parametrize("name", list(QUICK_REFUSALS))
def test_a_refusal_from_a_file_or_a_config_loads_neither_torch_nor_transformers(name, tmp_path):
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps(BERT_CONFIG))
    plan = json.loads(MIXED.read_text())
    plan["layers"][1]["decode"] = {"method": "tova", "capacity": 1_048_576}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    args, expected = QUICK_REFUSALS[name]
    result = subprocess.run(
        [sys.executable, "-c", LOADED_MODULES, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert_one_line_error(result, expected)
    assert result.stdout.strip().splitlines()[-1] == "loaded:", result.stdout


def test_a_load_that_fails_for_another_reason_is_not_called_damaged_files(tmp_path):
    from polykv.models import _damaged_files_said

    (tmp_path / "config.json").write_text("{}")  # every file of the folder reads
    with pytest.raises(RuntimeError, match="out of memory"):
        with _damaged_files_said(str(tmp_path)):
            raise RuntimeError("CUDA out of memory")

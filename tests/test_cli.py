"""The `polykv` command line: the demo generation, plan commands, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polykv.methods import validate_plan
from polykv.plan import Plan
from tests.helpers import MIXED, REPO, assert_one_line_error, run_cli

PLANS = sorted((REPO / "plans").rglob("*.json"))


@pytest.mark.slow  # a real process that loads torch and the demo model
def test_generate_with_the_default_mixed_plan_on_the_demo_model(tmp_path):
    # The real console script in a fresh process: entry point, imports, exit code.
    env = {**os.environ, "POLYKV_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    exe = Path(sys.executable).with_name("polykv")
    result = subprocess.run(
        [str(exe), "generate", "--max-new-tokens", "12"], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "plan: mixed-demo" in out and "Once upon a time" in out
    table = out[out.index("layer  prefill") :].splitlines()[1:6]
    # mixed-demo's prefill capacities are 48, 32, 48, 32, 24 and decode ones 64, 48, 48, 40, 32; a
    # 95-token prompt + 12 new tokens means every layer was cut at prefill.
    assert [row.split()[-2:] for row in table] == [["48", "59"], ["32", "43"], ["48", "48"], ["32", "40"], ["24", "32"]]


def test_methods_lists_every_method_with_phases_and_defaults(polykv):
    result = polykv("methods")
    assert result.returncode == 0
    assert "snapkv" in result.stdout and "phases: prefill " in result.stdout and "window=32" in result.stdout


SHIPPED = {"demo": (5, 512), "smollm2": (30, 8192), "gemma3": (18, 32768)}  # plans/<model>/: layers, context


@pytest.mark.parametrize("path", PLANS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_plans_are_valid_for_their_model(path):
    layers, context = SHIPPED[path.parent.name]
    plan = validate_plan(Plan.load(path), layers, context)
    assert plan.to_json() == path.read_text()  # canonical, as `plan save` writes it
    if plan.provenance.get("built_by") == "homogeneous":
        params = plan.layers[0][plan.scope.phases[0]].params
        rebuilt = Plan.homogeneous(plan.provenance["method"], plan.provenance["capacity"], layers, plan.scope, params)
        assert rebuilt == plan


def test_plan_show_and_validate(polykv):
    mixed = str(MIXED)
    shown = polykv("plan", "show", mixed)
    assert shown.returncode == 0 and "total capacity B=184" in shown.stdout
    ok = polykv("plan", "validate", mixed, "--model", "demo")
    assert ok.returncode == 0 and "valid plan for a 5-layer model" in ok.stdout


def _write(tmp_path: Path, mutate) -> str:
    data = json.loads(MIXED.read_text())
    mutate(data)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return str(path)


BAD_PLANS = {
    "unknown method": (
        lambda d: d["layers"][2]["decode"].update(method="h3o"),
        "layer 2, decode, method: unknown method 'h3o'",
    ),
    "phase-incompatible": (
        lambda d: d["layers"][3]["decode"].update(method="snapkv"),
        "'snapkv' does not support the decode phase",
    ),
    "zero capacity": (
        lambda d: d["layers"][0]["prefill"].update(capacity=0),
        "layer 0, prefill, capacity: Input should be greater than 0",
    ),
    "negative capacity": (lambda d: d["layers"][4]["decode"].update(capacity=-1), "layer 4, decode, capacity"),
    "wrong layer count": (lambda d: d["layers"].pop(), "the plan has 4 layers but the model has 5"),
}


@pytest.mark.parametrize("case", sorted(BAD_PLANS))
def test_bad_plans_give_one_line_errors(case, tmp_path, polykv):
    mutate, expected = BAD_PLANS[case]
    path = _write(tmp_path, mutate)
    assert_one_line_error(polykv("plan", "validate", path, "--model", "demo"), expected)
    assert_one_line_error(polykv("generate", "--plan", path, "--max-new-tokens", "2"), expected)


def test_malformed_json_and_missing_files(tmp_path, polykv):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x",')
    assert_one_line_error(polykv("plan", "show", str(bad)), "malformed JSON")
    assert_one_line_error(polykv("generate", "--plan", str(tmp_path / "nope.json")), "no such plan file")
    assert_one_line_error(polykv("generate", "--model", str(tmp_path / "no-model")), "model path does not exist")


@pytest.mark.slow  # a real process that loads torch
def test_missing_demo_checkpoint_is_one_line(tmp_path):
    # A real process: a user error must leave no traceback on the terminal.
    env = {**os.environ, "POLYKV_HOME": str(tmp_path / "home"), "POLYKV_DEMO_CHECKPOINT": str(tmp_path / "none")}
    result = run_cli("generate", "--max-new-tokens", "2", cwd=REPO, env=env)
    assert_one_line_error(result, "demo model checkpoint not found", "POLYKV_DEMO_CHECKPOINT")


def test_plan_homogeneous_writes_a_valid_plan(tmp_path, polykv):
    out = tmp_path / "plans" / "h2o.json"
    result = polykv(
        "plan", "homogeneous", "h2o", "--capacity", "16", "--layers", "5", "-P", "heavy_ratio=0.25", "-o", str(out)
    )
    assert result.returncode == 0, result.stderr
    plan = Plan.load(out)
    assert plan.layers[4].decode.params == {"heavy_ratio": 0.25}
    bad = polykv(
        "plan", "homogeneous", "h2o", "--capacity", "16", "--layers", "5", "-P", "heavy_ratio=2", "-o", str(out)
    )
    assert_one_line_error(bad, "params.heavy_ratio: h2o: Input should be less than or equal to 1")


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["plan", "validate", str(MIXED)],
        ["plan", "show", str(MIXED)],
        ["methods"],
        ["runs"],
        ["jobs", "list"],
    ],
    ids=["help", "plan-validate", "plan-show", "methods", "runs", "jobs-list"],
)
def test_commands_that_touch_no_tensor_import_neither_torch_nor_transformers(argv, tmp_path):
    # -X importtime lists every module whose code ran; a lazily registered torch never runs.
    env = {**os.environ, "POLYKV_WORKSPACE": str(tmp_path / "ws")}
    result = run_cli(*argv, python=("-X", "importtime"), env=env, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    assert "torch" not in imported and "transformers" not in imported and "pandas" not in imported
    assert not (tmp_path / "ws").exists()  # reading commands create no workspace


@pytest.mark.slow  # two real `polykv generate` processes
def test_a_command_that_loads_a_model_says_so_on_a_terminal_and_not_in_a_pipe(tmp_path, demo_model):
    import pty

    env = {**os.environ, "POLYKV_WORKSPACE": str(tmp_path / "ws"), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "polykv.cli", "generate", "--max-new-tokens", "2"]
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=follower, env=env, cwd=tmp_path, timeout=300)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal's other side is closed: all was read
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
    assert done.returncode == 0
    assert "loading model demo on cpu" in b"".join(chunks).decode(errors="replace")
    piped = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert piped.returncode == 0 and "loading model" not in piped.stderr

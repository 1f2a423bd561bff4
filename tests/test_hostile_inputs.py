"""Hostile and damaged input, as a careful tester would hand it to PolyKV: through the CLI as real
processes, through the Python API and through the app's pages.

Every case must end in one line that names the problem (`error: ...` and exit code 2 in the CLI, a
PolyKVError in the API, an inline message on a page), never a traceback or a hang, and must write
nothing outside its target: the folder a case runs in holds exactly what the case put there.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from polykv.errors import FileError, PolyKVError, SettingsError
from polykv.eval.results.store import Store
from polykv.plan import Plan, PlanError
from tests.helpers import (
    BERT_CONFIG,
    HUGE_CONFIG,
    MIXED,
    REPO,
    assert_one_line_error,
    button,
    fake_run,
    open_app,
    run_cli,
    slow_after,
)

REAL_PROFILE = next((REPO / "docs" / "demo-study" / "profiles").iterdir())


@dataclass
class Case:
    """A folder to run in; files are made by `setup(folder) -> CLI args` (paths relative to it)."""

    args: object  # list of CLI args, or a callable(folder) -> list
    expected: str  # text the one error line must contain


def mixed(**changes) -> dict:
    data = json.loads(MIXED.read_text())
    data.update(changes)
    return data


def with_layer(layer: int, phase: str, **assignment) -> dict:
    data = mixed()
    data["layers"][layer][phase] = assignment
    return data


def write(folder: Path, name: str, content) -> str:
    path = folder / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return name


def plan_file(content, command=("plan", "validate"), extra=("--model", "demo")):
    return lambda folder: [*command, write(folder, "plan.json", content), *extra]


def model_dir(folder: Path, config) -> str:
    """A model directory whose config.json holds `config` (None: no config.json at all)."""
    (folder / "m").mkdir()
    if config is not None:
        write(folder / "m", "config.json", config)
    return str(folder / "m")


def fifo(folder: Path, name: str) -> str:
    os.mkfifo(folder / name)
    return name


def special_database(sidecar: str = "", device: bool = False, command: tuple[str, ...] = ("runs",)):
    """A workspace whose results database is a FIFO, or a link to /dev/zero (`device`), or a real database
    with a FIFO as its `sidecar` ("-wal", "-shm"); then `command` on it."""

    def setup(folder: Path) -> list[str]:
        ws = folder / "ws"
        ws.mkdir()
        if sidecar:
            write(ws, "results.sqlite", b"")
        if device:
            os.symlink("/dev/zero", ws / "results.sqlite")
        else:
            fifo(ws, "results.sqlite" + sidecar)
        return [*command, "-w", "ws"]

    return setup


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def deep_plan(levels: int) -> str:
    text = MIXED.read_text()
    return text.replace('"params": {"sinks": 4}', '"params": {"sinks": ' + "[" * levels + "]" * levels + "}", 1)


def native(capacities: list[int], params: list[dict] | None = None) -> dict:
    layers = [
        {"prefill": {"method": "pyramidkv", "capacity": c, "params": (params or [{}] * 5)[i]}}
        for i, c in enumerate(capacities)
    ]
    return {"name": "native", "scope": "prefill", "allocation": "native", "layers": layers}


def profile_copy(folder: Path, change=None, files=None) -> str:
    """A copy of the committed demo-study profile, damaged by `change(metadata)` and `files(dir)`."""
    target = folder / "profile"
    shutil.copytree(REAL_PROFILE, target)
    if change is not None:
        meta = json.loads((target / "profile.json").read_text())
        meta = change(meta)
        (target / "profile.json").write_text(json.dumps(meta))
    if files is not None:
        files(target)
    return "profile"


def drop(key):
    def change(meta):
        meta.pop(key)
        return meta

    return change


def setting(key, value):
    def change(meta):
        meta[key] = value
        return meta

    return change


def route(change=None, files=None, model="demo"):
    return lambda folder: [
        "route",
        profile_copy(folder, change, files),
        "-o",
        "out.json",
        "--budget",
        "16",
        "--model",
        model,
    ]


def csv_without_column(target: Path) -> None:
    (target / "methods.csv").write_text("layer,scope,method\n0,decode,tova\n")


def csv_layer_out_of_range(target: Path) -> None:
    text = (target / "methods.csv").read_text().splitlines()
    text[1] = "99" + text[1][1:]
    (target / "methods.csv").write_text("\n".join(text) + "\n")


def csv_fifo(target: Path) -> None:
    (target / "methods.csv").unlink()
    os.mkfifo(target / "methods.csv")


def damaged_database(content: bytes | None = None, foreign: bool = False, version: int | None = None):
    def setup(folder: Path):
        ws = folder / "ws"
        ws.mkdir()
        db = ws / "results.sqlite"
        if content is not None:
            db.write_bytes(content)
        else:
            with sqlite3.connect(db) as con:
                con.execute("CREATE TABLE customers (id INTEGER)" if foreign else "CREATE TABLE runs (id TEXT)")
                if version is not None:
                    con.execute(f"PRAGMA user_version = {version}")
            con.close()
        return ["runs", "-w", "ws"]

    return setup


def jobs_dir_with(name: str, content) -> object:
    def setup(folder: Path):
        (folder / "ws" / "jobs").mkdir(parents=True)
        write(folder / "ws" / "jobs", name, content)
        return ["jobs", "cancel", name.removesuffix(".json"), "-w", "ws"]

    return setup


HUGE_INT = (
    '{"name": "x", "scope": "decode", "layers": [{"decode": {"method": "tova", "capacity": ' + "9" * 5000 + "}}]}"
)

CLI_CASES: dict[str, Case] = {
    # ---- plan files that are not plans
    "plan-missing": Case(["plan", "show", "nope.json"], "no such plan file"),
    "plan-is-a-directory": Case(
        lambda f: ["plan", "show", (f / "dir.json").mkdir() or "dir.json"], "a directory, not a plan file"
    ),
    "plan-is-dev-zero": Case(["plan", "show", "/dev/zero"], "a device, not a plan file"),
    "plan-is-a-fifo": Case(lambda f: ["plan", "validate", fifo(f, "pipe.json")], "a FIFO, not a plan file"),
    "plan-symlink-to-device": Case(
        lambda f: ["plan", "show", os.symlink("/dev/zero", f / "z.json") or "z.json"], "a device"
    ),
    "plan-too-large": Case(plan_file(" " * (4 * 1024 * 1024 + 10)), "more than the 4,194,304 PolyKV reads"),
    "plan-not-utf8": Case(plan_file(b"\xff\xfe{}"), "not UTF-8 text"),
    "plan-malformed-json": Case(plan_file("{"), "malformed JSON at line 1"),
    "plan-empty-file": Case(plan_file(""), "malformed JSON"),
    "plan-is-a-list": Case(plan_file([1, 2]), "a plan must be a JSON object"),
    "plan-deeply-nested": Case(plan_file(deep_plan(100_000)), "nested more than 32 levels deep"),
    "plan-nan": Case(
        plan_file(MIXED.read_text().replace('"capacity": 48', '"capacity": NaN', 1)), "NaN is not a number"
    ),
    "plan-huge-integer": Case(plan_file(HUGE_INT), "limit"),
    "plan-duplicate-key": Case(
        plan_file(MIXED.read_text().replace('"layers": [', '"layers": [], "layers": [', 1)),
        'key "layers" appears twice in one object',
    ),
    "plan-capacity-over-context": Case(
        plan_file(with_layer(1, "decode", method="tova", capacity=1_048_576)),
        "layer 1, decode, capacity: 1048576 is more than the model's context (512 tokens)",
    ),
    "plan-interval-over-context": Case(
        plan_file(with_layer(1, "decode", method="tova", capacity=48, interval=600)),
        "layer 1, decode, interval: 600 is more than the model's context (512 tokens)",
    ),
    "plan-capacity-over-context-in-generate": Case(
        plan_file(with_layer(1, "decode", method="tova", capacity=1_048_576), ("generate", "--plan"), ()),
        "capacity: 1048576 is more than the model's context",
    ),
    "plan-name-escape": Case(
        plan_file(mixed(name="red\x1b[31m")), "name: must not hold control characters (found U+001B)"
    ),
    "plan-name-right-to-left": Case(plan_file(mixed(name="plan\u202egpj.exe")), "found U+202E"),
    "plan-description-escape": Case(plan_file(mixed(description="a\nb\x1b]0;x\x07")), "description: must not hold"),
    "plan-unknown-field": Case(plan_file(mixed(colour="red")), "colour: unknown field"),
    "plan-missing-name": Case(
        plan_file({k: v for k, v in mixed().items() if k != "name"}), "name: required field is missing"
    ),
    "plan-wrong-format": Case(plan_file(mixed(format="other")), "format: expected 'polykv.plan'"),
    "plan-wrong-version": Case(plan_file(mixed(version=9)), "this PolyKV reads plan version 1"),
    "plan-no-layers": Case(plan_file(mixed(layers=[])), "layers"),
    "plan-layer-count": Case(
        plan_file(Plan.homogeneous("tova", 32, 3).to_dict()), "the plan has 3 layers but the model has 5"
    ),
    "plan-too-many-layers": Case(plan_file(mixed(layers=[{}] * 5000)), "layers"),
    "plan-unknown-method": Case(plan_file(with_layer(0, "decode", method="nope", capacity=8)), "unknown method 'nope'"),
    "plan-negative-capacity": Case(plan_file(with_layer(1, "decode", method="tova", capacity=-4)), "capacity"),
    "plan-zero-capacity": Case(plan_file(with_layer(1, "decode", method="tova", capacity=0)), "capacity"),
    "plan-boolean-capacity": Case(plan_file(with_layer(1, "decode", method="tova", capacity=True)), "capacity"),
    "plan-string-capacity": Case(plan_file(with_layer(1, "decode", method="tova", capacity="48")), "capacity"),
    "plan-float-capacity": Case(plan_file(with_layer(1, "decode", method="tova", capacity=4.5)), "capacity"),
    "plan-full-with-capacity": Case(
        plan_file(with_layer(1, "decode", method="full", capacity=8)), "'full' keeps every token"
    ),
    "plan-phase-incompatible": Case(
        plan_file(with_layer(3, "decode", method="snapkv", capacity=32)), "does not support the decode phase"
    ),
    "plan-scope-mismatch": Case(plan_file(mixed(scope="prefill")), "must use 'full'"),
    "param-unknown": Case(
        plan_file(with_layer(2, "decode", method="h2o", capacity=32, params={"colour": 1})), "has no parameter 'colour'"
    ),
    "param-window-true": Case(
        plan_file(with_layer(1, "prefill", method="snapkv", capacity=32, params={"window": True})), "window"
    ),
    "param-window-string": Case(
        plan_file(with_layer(1, "prefill", method="snapkv", capacity=32, params={"window": "8"})), "window"
    ),
    "param-window-float": Case(
        plan_file(with_layer(1, "prefill", method="snapkv", capacity=32, params={"window": 8.5})), "window"
    ),
    "param-window-over-capacity": Case(
        plan_file(with_layer(1, "prefill", method="snapkv", capacity=32, params={"window": 32})),
        "must be smaller than the capacity",
    ),
    "param-sinks-negative": Case(
        plan_file(with_layer(0, "decode", method="streamingllm", capacity=32, params={"sinks": -1})), "sinks"
    ),
    "param-history-1e9": Case(
        plan_file(with_layer(2, "decode", method="scissorhands", capacity=32, params={"history": 10**9})), "history"
    ),
    "param-cake-tau-tiny": Case(
        plan_file(with_layer(2, "decode", method="cake", capacity=32, params={"tau": 1e-300})), "tau"
    ),
    "param-cake-gamma-inf": Case(
        plan_file(
            MIXED.read_text().replace(
                '{"method": "h2o", "capacity": 48}}',
                '{"method": "cake", "capacity": 48, "params": {"gamma": 1e999}}}',
                1,
            )
        ),
        "gamma",
    ),
    "param-pooling-unknown": Case(
        plan_file(with_layer(1, "prefill", method="snapkv", capacity=32, params={"window": 8, "pooling": "median"})),
        "pooling",
    ),
    "native-different-capacities": Case(plan_file(native([32, 32, 16, 32, 32])), "native"),
    "native-different-params": Case(plan_file(native([32] * 5, [{}, {}, {"window": 4}, {}, {}])), "native"),
    "native-method-without-rule": Case(
        plan_file({**native([32] * 5), "layers": [{"prefill": {"method": "snapkv", "capacity": 64}}] * 5}), "native"
    ),
    # ---- writing
    "write-dev-full": Case(
        ["plan", "homogeneous", "tova", "--capacity", "32", "--layers", "5", "-o", "/dev/full"],
        "a device; PolyKV writes only regular files",
    ),
    "write-directory": Case(
        lambda f: ["plan", "homogeneous", "tova", "--capacity", "32", "--layers", "5", "-o", (f / "d").mkdir() or "d"],
        "a directory; PolyKV writes only",
    ),
    "write-fifo": Case(
        lambda f: ["plan", "homogeneous", "tova", "--capacity", "32", "--layers", "5", "-o", fifo(f, "p.json")],
        "a FIFO; PolyKV writes only",
    ),
    "write-under-a-file": Case(
        lambda f: [
            "plan",
            "homogeneous",
            "tova",
            "--capacity",
            "32",
            "--layers",
            "5",
            "-o",
            write(f, "file", "x") + "/plan.json",
        ],
        "Not a directory",
    ),
    # ---- options
    "param-option-without-value": Case(
        ["plan", "homogeneous", "tova", "--capacity", "32", "--layers", "5", "-P", "window", "-o", "x.json"],
        "expected NAME=VALUE",
    ),
    "homogeneous-unknown-method": Case(
        ["plan", "homogeneous", "nope", "--capacity", "32", "--layers", "5", "-o", "x.json"], "unknown method 'nope'"
    ),
    "settings-a-list": Case(["eval", "--settings", "[1]"], "expected a JSON object"),
    "settings-string-number": Case(["eval", "--settings", '{"samples_per_task": "2"}'], "samples_per_task"),
    "settings-boolean-number": Case(["eval", "--settings", '{"samples_per_task": true}'], "samples_per_task"),
    "settings-unknown-field": Case(["eval", "--settings", '{"samples": 2}'], "unknown field 'samples'"),
    "settings-malformed": Case(["eval", "--settings", "{{"], "malformed JSON"),
    "settings-deeply-nested": Case(["eval", "--settings", nested(5000)], "nested more than"),
    "settings-ruler-missing-file": Case(
        ["eval", "--suite", "ruler", "--settings", '{"squad_path": "/no/squad.json"}'], "no such file /no/squad.json"
    ),
    "settings-longbench-missing-data-dir": Case(
        ["eval", "--suite", "longbench", "--settings", '{"data_dir": "/nope"}'],
        "longbench settings: data_dir /nope does not exist",
    ),
    "settings-longbench-data-dir-lacks-files": Case(
        lambda f: [
            "eval",
            "--suite",
            "longbench",
            "--settings",
            json.dumps({"data_dir": str((f / "lb").mkdir() or f / "lb"), "tasks": ["trec", "lcc"]}),
        ],  # fmt: skip
        "lacks trec.jsonl, lcc.jsonl",
    ),
    "suite-unknown": Case(["eval", "--suite", "nope"], "unknown suite 'nope'"),
    "backend-unknown": Case(["eval", "--backend", "nope"], "unknown backend 'nope'"),
    "budgets-not-numbers": Case(
        ["experiment", "sweep", "--plan", str(MIXED), "--budgets", "16,x"], "--budgets are positive whole numbers"
    ),
    "budgets-negative": Case(
        ["experiment", "sweep", "--plan", str(MIXED), "--budgets", "-3"], "--budgets are positive whole numbers"
    ),
    "model-path-missing": Case(
        ["plan", "validate", str(MIXED), "--model", "/no/such/model"], "model path does not exist"
    ),
    "model-dir-without-config": Case(
        lambda f: ["plan", "validate", str(MIXED), "--model", model_dir(f, None)], "no config.json"
    ),
    "model-config-a-list": Case(
        lambda f: ["plan", "validate", str(MIXED), "--model", model_dir(f, [1])], "no num_hidden_layers"
    ),
    "model-config-layers-a-string": Case(
        lambda f: ["plan", "validate", str(MIXED), "--model", model_dir(f, {"num_hidden_layers": "5"})],
        "no num_hidden_layers",
    ),
    "model-config-duplicate-key": Case(
        lambda f: [
            "plan",
            "validate",
            str(MIXED),
            "--model",
            model_dir(f, '{"num_hidden_layers": 5, "num_hidden_layers": 9}'),
        ],
        'key "num_hidden_layers" appears twice',
    ),
    "model-generate-bert": Case(
        lambda f: ["generate", "--model", model_dir(f, BERT_CONFIG)],
        "model_type 'bert'; PolyKV runs Llama, Mistral, Qwen2, Qwen3 and Gemma 3 models",
    ),
    "model-profile-bert": Case(
        lambda f: ["profile", "--model", model_dir(f, BERT_CONFIG)],
        "PolyKV runs Llama, Mistral, Qwen2, Qwen3 and Gemma 3",
    ),
    "model-bert-directory": Case(
        lambda f: ["plan", "validate", str(MIXED), "--model", model_dir(f, BERT_CONFIG)], "model_type 'bert'"
    ),
    "model-huge-in-eval": Case(  # refused before the results database is created
        lambda f: ["eval", "--model", model_dir(f, HUGE_CONFIG)], "GiB, the device (cpu) has"
    ),
    "model-huge-in-generate": Case(
        lambda f: ["generate", "--model", model_dir(f, HUGE_CONFIG)], "GiB, the device (cpu) has"
    ),
    "model-hub-id-offline": Case(
        ["plan", "validate", str(MIXED), "--model", "org/model"],
        "model 'org/model' is not in the local Hugging Face cache and offline mode is on",
    ),
    "corpus-file-missing": Case(["profile", "--sources", "file:/no/such.txt"], "no such file /no/such.txt"),
    "corpus-file-fifo": Case(
        lambda f: ["profile", "--sources", f"file:{f / fifo(f, 'c.txt')}"], "is not a regular file"
    ),
    # ---- profiles
    "profile-not-a-directory": Case(
        ["route", "nowhere", "-o", "out.json", "--budget", "16"], "not a profile directory"
    ),
    "profile-json-a-list": Case(route(lambda m: [1]), "expected a JSON object"),
    "profile-json-malformed": Case(route(files=lambda t: (t / "profile.json").write_text("{")), "malformed JSON"),
    "profile-missing-key": Case(route(drop("key")), "key: required field is missing"),
    "profile-layers-a-string": Case(route(setting("num_layers", "5")), "num_layers"),
    "profile-scopes-unknown": Case(route(setting("scopes", ["middle"])), "scopes"),
    "profile-corpus-missing": Case(route(drop("corpus")), "corpus"),
    "profile-methods-csv-missing": Case(route(files=lambda t: (t / "methods.csv").unlink()), "methods.csv: missing"),
    "profile-methods-csv-fifo": Case(route(files=csv_fifo), "methods.csv: not a regular file"),
    "profile-methods-csv-columns": Case(route(files=csv_without_column), "lacks columns"),
    "profile-methods-csv-layer-range": Case(route(files=csv_layer_out_of_range), "layers outside 0 .. 4"),
    "profile-of-another-model": Case(route(setting("model", "other/model")), "was measured on 'other/model'"),
    "profile-wrong-format": Case(route(setting("format", "x")), "not a version-1 PolyKV profile"),
    # ---- the results database
    "store-random-bytes": Case(damaged_database(os.urandom(4096)), "damaged results database"),
    "store-text-file": Case(damaged_database(b"hello, this is not a database\n" * 10), "damaged results database"),
    "store-foreign-database": Case(damaged_database(foreign=True), "not a PolyKV results database"),
    "store-newer-schema": Case(damaged_database(version=999), "newer PolyKV"),
    "store-a-fifo": Case(special_database(), "ws/results.sqlite: a FIFO, not a results database file"),
    "store-wal-a-fifo": Case(special_database("-wal"), "ws/results.sqlite-wal: a FIFO, not a results database file"),
    "store-shm-a-fifo": Case(special_database("-shm"), "ws/results.sqlite-shm: a FIFO"),
    "store-a-device": Case(special_database(device=True), "a device, not a results database file"),
    "compare-unknown-runs": Case(["compare", "aaa", "bbb", "-w", "ws"], "no run"),
    "compare-a-fifo": Case(
        special_database(command=("compare", "aaa", "bbb")), "ws/results.sqlite: a FIFO, not a results database"
    ),
    # ---- jobs
    "job-id-with-slash": Case(["jobs", "cancel", "../../etc/passwd", "-w", "ws"], "job id"),
    "job-id-dotdot": Case(["jobs", "resume", "..", "-w", "ws"], "job id"),
    "job-id-too-long": Case(["jobs", "cancel", "a" * 300, "-w", "ws"], "job id"),
    "job-unknown": Case(["jobs", "resume", "20260101-000000-eval-abcdef", "-w", "ws"], "no job"),
    "job-file-a-list": Case(jobs_dir_with("20260101-000000-eval-abcdef.json", [1]), "20260101-000000-eval-abcdef"),
    "job-file-empty-runs": Case(
        jobs_dir_with(
            "20260101-000000-eval-abcdef.json",
            {
                "id": "20260101-000000-eval-abcdef",
                "kind": "eval",
                "title": "t",
                "model": "demo",
                "device": "cpu",
                "created": "2026-01-01T00:00:00+00:00",
                "runs": [],
            },
        ),
        "20260101-000000-eval-abcdef",
    ),
}


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every path under `folder` with what identifies its content (files: bytes; others: the kind)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        info = os.lstat(path)
        kind = stat.S_IFMT(info.st_mode)
        out[str(path.relative_to(folder))] = (kind, path.read_bytes() if stat.S_ISREG(info.st_mode) else None)
    return out


def cli(args: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "POLYKV_WORKSPACE": str(cwd / "default-ws"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.pop("POLYKV_DEBUG", None)
    return run_cli(*args, cwd=cwd, env=env, timeout=120, stdin=subprocess.DEVNULL, **kwargs)


# each case is a real process (about a second): two of each family (the name up to its first dash) in the fast loop
@pytest.mark.parametrize("name", slow_after(sorted(CLI_CASES), keep=2, family=lambda name: name.split("-")[0]))
def test_the_cli_answers_hostile_input_with_one_line_and_writes_nothing(name, tmp_path, demo_model):
    case = CLI_CASES[name]
    args = case.args(tmp_path) if callable(case.args) else list(case.args)
    before = snapshot(tmp_path)
    result = cli([str(a) for a in args], tmp_path)
    assert_one_line_error(result, case.expected)
    assert snapshot(tmp_path) == before  # nothing created, changed or removed; no default workspace made
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode) and stat.S_ISCHR(os.stat("/dev/zero").st_mode)


def test_the_cli_lists_damaged_job_files_and_keeps_listing_the_rest(tmp_path):
    jobs_dir = tmp_path / "ws" / "jobs"
    jobs_dir.mkdir(parents=True)
    write(jobs_dir, "20260101-000000-eval-aaaaaa.json", "{")
    write(jobs_dir, "20260101-000000-eval-bbbbbb.json", [1])
    (jobs_dir / "20260101-000000-eval-cccccc.json").mkdir()
    fifo(jobs_dir, "20260101-000000-eval-dddddd.json")
    result = cli(["jobs", "list", "-w", "ws"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert sum("damaged" in line for line in result.stdout.splitlines()) == 4, result.stdout


def test_writing_a_plan_through_a_symlink_keeps_the_link_and_the_umask_mode(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real" / "plan.json", tmp_path / "link.json")
    result = cli(
        ["plan", "homogeneous", "tova", "--capacity", "32", "--layers", "5", "-o", "link.json"], tmp_path, umask=0o027
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "link.json").is_symlink()
    assert Plan.load(tmp_path / "real" / "plan.json").num_layers == 5
    assert stat.S_IMODE(os.stat(tmp_path / "real" / "plan.json").st_mode) == 0o640  # 0666 less the umask
    # an existing file keeps its own mode when replaced
    os.chmod(tmp_path / "real" / "plan.json", 0o604)
    assert (
        cli(["plan", "homogeneous", "h2o", "--capacity", "16", "--layers", "5", "-o", "link.json"], tmp_path).returncode
        == 0
    )
    assert stat.S_IMODE(os.stat(tmp_path / "real" / "plan.json").st_mode) == 0o604
    assert Plan.load(tmp_path / "link.json").name == "h2o-both-16"
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["plan.json"]  # no temporary file left


def test_a_fifo_plan_file_never_hangs_the_reader(tmp_path):
    fifo(tmp_path, "pipe.json")
    # Read in a child process: a reader that opened the FIFO would block forever (no writer ever
    # comes), and the test then fails as TimeoutExpired instead of hanging the run.
    script = (
        "import sys\nfrom polykv.plan import Plan, PlanError\n"
        "try:\n    Plan.load(sys.argv[1])\nexcept PlanError as exc:\n    print('PlanError:', exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "pipe.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("PlanError: ") and "a FIFO, not a plan file" in result.stdout, result.stdout


def test_read_only_commands_honour_the_workspace_variable_and_create_nothing(tmp_path):
    from polykv import jobs

    ws = tmp_path / "elsewhere"
    corpus = {"sources": ["kjv"], "num_sequences": 1, "max_tokens": 64, "seed": 0}
    job = jobs.profile_job("demo", "cpu", corpus, 8, ["decode"], "from the app")
    jobs.save_job(job, ws)  # as the app saves it, never started
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {**os.environ, "POLYKV_WORKSPACE": str(ws)}
    listing = run_cli("jobs", "list", cwd=cwd, env=env, timeout=120)
    assert listing.returncode == 0, listing.stderr
    assert job.id in listing.stdout and "from the app" in listing.stdout
    runs = run_cli("runs", cwd=cwd, env=env, timeout=120)
    assert runs.returncode == 0, runs.stderr
    assert list(cwd.iterdir()) == [] and not (ws / "results.sqlite").exists()


def test_a_bug_is_reported_in_one_line_and_its_traceback_only_under_polykv_debug(tmp_path, monkeypatch):
    # A bug is simulated by a plan file whose reader raises something no user input can cause.
    script = (
        "import sys, polykv.plan as p\n"
        "def boom(*a, **k):\n    raise KeyError('simulated bug')\n"
        "p.Plan.load = classmethod(boom)\n"
        "from polykv.cli import main\nsys.argv = ['polykv', 'plan', 'show', 'x.json']\nmain()\n"
    )
    quiet = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "POLYKV_DEBUG"},
    )
    assert quiet.returncode == 1 and "Traceback" not in quiet.stderr
    assert quiet.stderr.strip().splitlines() == [
        "internal error (a bug in PolyKV): KeyError: 'simulated bug'; run again with POLYKV_DEBUG=1 for the traceback"
    ]
    loud = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "POLYKV_DEBUG": "1"},
    )
    assert loud.returncode == 1 and "Traceback" in loud.stderr and "simulated bug" in loud.stderr


def test_runs_escapes_what_it_prints_from_the_database(tmp_path):
    store = Store(tmp_path / "ws" / "results.sqlite")
    fake_run(store, "r1", {"t": {"kl": 0.1}}, plan_name="evil\nr2  forged  fidelity", model="\x1b[31mred\u202e")
    result = cli(["runs", "-w", "ws"], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[1].startswith("r1 ")  # the header and one row: no forged line
    assert "evil\\nr2  forged" in lines[1] and "\\x1b[31mred\\u202e" in lines[1]
    assert not any(c in result.stdout for c in "\x1b\u202e")


# ---- the Python API ----------------------------------------------------------------------------------
def test_the_api_refuses_a_plan_with_millions_of_layers_before_validating_them():
    data = {"name": "huge", "scope": "decode", "layers": [{"decode": {"method": "tova", "capacity": 8}}] * 1_800_000}
    with pytest.raises(PlanError, match="layers"):
        Plan.from_dict(data)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('{"a": 1, "a": 2}', "a"),
        ('[{"x": {"b": 1, "b": 1}}]', "b"),
        ('{"name": "x", "layers": [], "layers": []}', "layers"),
    ],
)
def test_the_api_refuses_json_with_a_key_twice_in_one_object(text, key):
    from polykv.files import parse_json

    with pytest.raises(FileError, match=f'what: key "{key}" appears twice in one object'):
        parse_json(text, "what")
    assert parse_json('{"a": {"b": 1}, "b": {"a": 2}}') == {"a": {"b": 1}, "b": {"a": 2}}  # once per object is fine


def test_the_api_refuses_bytes_that_are_not_text_and_json_that_nests_too_deep():
    with pytest.raises(PlanError, match="not UTF-8 text"):
        Plan.from_json(b"\xff\xfe")
    with pytest.raises(PlanError, match="nested more than"):
        Plan.from_json("[" * 200_000 + "]" * 200_000)


@pytest.mark.parametrize("target", ["/dev/full", "/dev/null"])
def test_the_api_never_replaces_a_device_with_a_file(target):
    with pytest.raises(FileError, match="a device"):
        Plan.load(MIXED).save(target)
    assert stat.S_ISCHR(os.stat(target).st_mode)


def test_the_api_refuses_directories_and_fifos_as_write_targets(tmp_path):
    fifo(tmp_path, "pipe")
    for target in (tmp_path, tmp_path / "pipe"):
        with pytest.raises(FileError, match="PolyKV writes only regular files or new paths"):
            Plan.load(MIXED).save(target)


@pytest.mark.parametrize(
    ("suite", "text", "message"),
    [
        ("fidelity", "[1]", "expected a JSON object"),
        ("fidelity", '{"tasks": "prose"}', "tasks"),
        ("ruler", '{"length": true}', "length"),
        ("ruler", '{"samples_per_task": 1.5}', "samples_per_task"),
        ("longbench", '{"tasks": ["nope"]}', "unknown LongBench task"),
        ("longbench", '{"max_length": "4k"}', "max_length"),
        ("nope", "{}", "unknown suite"),
    ],
)
def test_the_api_parses_suite_settings_strictly(suite, text, message):
    from polykv.eval.running.settings import suite_settings

    with pytest.raises(SettingsError, match=message):
        suite_settings(suite, text)


@pytest.mark.parametrize("text", ['{"tasks": []}', '{"length": [512, 512]}', '{"samples_per_task": 0}'])
def test_a_suites_own_check_names_its_settings_once(text):
    from polykv.eval.running.settings import suite_settings

    with pytest.raises(SettingsError) as refused:
        suite_settings("ruler", text)
    assert str(refused.value).startswith("ruler settings: ") and str(refused.value).count("ruler settings") == 1


@pytest.mark.parametrize("text", ["0", "1.5", "x", "1,,-2", "9" * 12])
def test_the_api_refuses_budget_lists_that_are_not_positive_whole_numbers(text):
    from polykv.eval.running.settings import parse_budgets

    with pytest.raises(SettingsError, match="positive whole numbers"):
        parse_budgets(text)


def test_the_api_lists_damaged_profiles_beside_the_good_ones(tmp_path):
    from polykv.profile.store import scan_profiles

    shutil.copytree(REAL_PROFILE, tmp_path / "good")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "profile.json").write_text("[1]")
    (tmp_path / "worse").mkdir()
    (tmp_path / "worse" / "profile.json").write_text(
        json.dumps({**json.loads((REAL_PROFILE / "profile.json").read_text()), "capacity": "many"})
    )
    found, damaged = scan_profiles(tmp_path)
    assert [p.path.name for p in found] == ["good"]
    assert len(damaged) == 2 and all("\n" not in d for d in damaged)
    assert any("capacity" in d for d in damaged)


def test_every_user_error_type_is_one_polykv_error():
    from polykv.errors import JobError, RoutedCacheError, StoreError
    from polykv.profile.store import ProfileError

    for cls in (PlanError, ProfileError, RoutedCacheError, StoreError, JobError, SettingsError, FileError):
        assert issubclass(cls, PolyKVError)


# ---- the app's pages -----------------------------------------------------------------------------------
def damage_profiles(ws: Path) -> None:
    root = ws / "profiles"
    shutil.copytree(REAL_PROFILE, root / REAL_PROFILE.name)
    (root / "a-list").mkdir(parents=True)
    (root / "a-list" / "profile.json").write_text("[1]")
    (root / "no-key").mkdir()
    meta = json.loads((REAL_PROFILE / "profile.json").read_text())
    meta.pop("key")
    (root / "no-key" / "profile.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("page", slow_after(["designer", "profiles"]))
def test_pages_list_damaged_profiles_without_failing(app_env, page):
    damage_profiles(app_env / "ws")
    at = open_app(page)
    if page == "profiles":
        warnings = [w.value for w in at.warning]
        assert sum("profile.json" in w for w in warnings) == 2, warnings
        offered = [s for s in at.selectbox if s.label == "Profile"][0].options
        assert len(offered) == 1 and offered[0].startswith(REAL_PROFILE.name)  # the good one still opens
    else:
        assert [t.value for t in at.title] == ["Plan designer"]


@pytest.mark.parametrize("name", slow_after(["план", "...", "日本語"]))
def test_the_designer_offers_a_download_for_a_plan_named_without_ascii_letters(app_env, name):
    at = open_app()
    at.session_state["plan_json"] = Plan.load(MIXED).model_copy(update={"name": name}).to_json()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["plan_json"] and Plan.from_json(at.session_state["plan_json"]).name == name
    assert any(b.label == "Download JSON" for b in at.get("download_button"))


def test_the_designer_says_why_a_saved_plan_that_nests_too_deep_cannot_load(app_env):
    (app_env / "plans" / "deep.json").write_text(deep_plan(50_000))
    (app_env / "plans" / "folder.json").mkdir()
    fifo(app_env / "plans", "pipe.json")
    at = open_app()
    saved = [s for s in at.selectbox if s.label == "Saved plans"][0]
    assert [str(o) for o in saved.options] == ["deep.json"]  # the folder and the FIFO are not offered
    saved.select(Path("deep.json"))
    at.run()
    button(at, "Load").click()
    at.run()
    assert not at.exception
    assert any("deep.json: nested more than 32 levels deep" in e.value for e in at.error), [e.value for e in at.error]


@pytest.mark.parametrize(
    ("settings", "message"),
    slow_after(
        [
            ("[1]", "expected a JSON object"),
            ('{"samples_per_task": "2"}', "samples_per_task"),
            ("{{", "malformed JSON"),
            (nested(5000), "nested more than"),
        ]
    ),
)
def test_the_runs_page_refuses_settings_that_are_not_settings_inline(app_env, settings, message):
    at = open_app("runs")
    at.text_area(key="settings_fidelity").set_value(settings)
    button(at, "Launch").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(e.value.startswith("Not launched: fidelity settings") and message in e.value for e in at.error), [
        e.value for e in at.error
    ]
    assert not (app_env / "ws" / "jobs").exists()

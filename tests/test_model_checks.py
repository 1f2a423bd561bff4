"""What PolyKV runs, told before any weight is allocated: the architecture (Llama, Mistral, Qwen2, Qwen3),
the memory a config implies against the device's, a hub id with no hub (from the cache alone, or one
line at once), and transformers kept quiet unless POLYKV_DEBUG=1."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch
import transformers

from polykv.models import (
    HubUnreachableError,
    ModelTooLargeError,
    UnsupportedModelError,
    config_dimensions,
    hub,
    load_model,
    output_cache,
    support,
)
from tests.helpers import (
    BERT_CONFIG,
    FAMILIES,
    HUGE_CONFIG,
    MIXED,
    REPO,
    assert_one_line_error,
    run_cli,
    slow_after,
    tiny_model,
)

GIB = 1 << 30


def model_dir(folder: Path, config: dict) -> str:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.fixture
def no_weights(monkeypatch):
    """Loading weights fails the test: what is checked must be refused before."""

    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


# ---- sizes from the config ----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_size_estimate_matches_a_real_model(family):
    model = tiny_model(family)
    weights, kv_per_token = support.model_bytes(model.config, 4)
    real = model.num_parameters() * 4
    assert real * 0.98 < weights <= real  # every matrix; only the norms' vectors are left out
    ids = torch.randint(0, model.config.vocab_size, (1, 10))
    with torch.no_grad():
        cache = output_cache(model(ids, use_cache=True))
    held = sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers) * 4
    assert kv_per_token * 10 == held


def test_a_config_larger_than_the_device_is_refused_in_one_line(monkeypatch):
    config = transformers.LlamaConfig(
        hidden_size=16384, intermediate_size=53248, num_hidden_layers=10, num_attention_heads=128, vocab_size=32000
    )
    needed = support.memory_needed(config, support.dtype_bytes(None, config))
    assert needed > 100 * GIB  # float32 weights, and a KV cache at the context
    monkeypatch.setattr(support, "device_memory", lambda device: 24 * GIB)
    with pytest.raises(ModelTooLargeError) as caught:
        support.check_fits(needed, "cpu", "model big")
    assert (
        str(caught.value) == f"model big needs about {needed / GIB:,.1f} GiB, the device (cpu) has 24.0 GiB available"
    )
    monkeypatch.setattr(support, "device_memory", lambda device: 10_000 * GIB)
    support.check_fits(needed, "cpu", "model big")  # fits a larger device


def test_the_kv_cache_is_counted_at_the_context_up_to_a_bound():
    short = transformers.LlamaConfig(max_position_embeddings=512)
    long = transformers.LlamaConfig(max_position_embeddings=1_000_000)
    weights, kv = support.model_bytes(short, 2)
    assert support.memory_needed(short, 2) == weights + 512 * kv
    assert support.memory_needed(long, 2) == weights + support.KV_TOKENS_CHECKED * kv


def test_bytes_per_weight_come_from_the_dtype_asked_else_the_config():
    config = transformers.LlamaConfig(dtype="bfloat16")
    assert support.dtype_bytes(None, config) == 2 and support.dtype_bytes("auto", config) == 2
    assert support.dtype_bytes(torch.float32, config) == 4 and support.dtype_bytes("float16") == 2
    assert support.dtype_bytes(None, transformers.LlamaConfig()) == 4


def test_the_memory_of_a_device_is_read_where_it_can_be():
    assert support.device_memory("cpu") > 0
    assert support.device_memory("mps") is None
    if not torch.cuda.is_available():
        assert support.device_memory("cuda") is None


# ---- before any weight is allocated -------------------------------------------------------------------------
def test_an_unsupported_architecture_is_refused_before_its_weights_load(tmp_path, no_weights):
    bert = model_dir(tmp_path / "bert", BERT_CONFIG)
    for attempt in (lambda: load_model(bert), lambda: config_dimensions(bert)):
        with pytest.raises(
            UnsupportedModelError, match="model_type 'bert'; PolyKV runs Llama, Mistral, Qwen2, Qwen3 and Gemma 3"
        ):
            attempt()


def test_a_model_too_large_for_the_device_is_refused_before_its_weights_load(tmp_path, no_weights):
    huge = model_dir(tmp_path / "huge", HUGE_CONFIG)
    assert config_dimensions(huge).num_layers == 5  # plan checks need no memory
    with pytest.raises(ModelTooLargeError, match=r"needs about [\d,.]+ GiB, the device \(cpu\) has [\d,.]+ GiB"):
        load_model(huge)


def test_a_config_missing_a_size_is_sized_with_its_class_defaults(tmp_path, no_weights, monkeypatch):
    bare = model_dir(tmp_path / "bare", {"model_type": "llama", "num_hidden_layers": 2})  # hidden_size 4096 ...
    monkeypatch.setattr(support, "device_memory", lambda device: GIB)
    with pytest.raises(ModelTooLargeError, match="needs about"):
        load_model(bare)


# ---- transformers kept quiet --------------------------------------------------------------------------------
def _model_missing_a_weight(where: Path, tokenizer) -> str:
    """A tiny Llama directory whose checkpoint lacks lm_head.weight: transformers reports it while loading."""
    from safetensors.torch import save_file

    model = tiny_model("llama", vocab_size=tokenizer.vocab_size)
    model.save_pretrained(where)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(where / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(where)
    return str(where)


def test_transformers_chatter_stays_off_the_terminal_unless_polykv_debug(
    tmp_path, demo_model, capfd, caplog, monkeypatch
):
    quiet, loud = (_model_missing_a_weight(tmp_path / name, demo_model[1]) for name in ("quiet", "loud"))
    capfd.readouterr()
    monkeypatch.delenv("POLYKV_DEBUG", raising=False)
    load_model(quiet)
    assert capfd.readouterr().err == "" and not [r for r in caplog.records if r.name.startswith("transformers")]
    monkeypatch.setenv("POLYKV_DEBUG", "1")
    load_model(loud)  # another directory: transformers says some things once per message
    assert any("lm_head.weight" in r.getMessage() for r in caplog.records)  # there for whoever asks


# ---- a hub id with no hub -----------------------------------------------------------------------------------
def test_a_hub_id_in_offline_mode_is_one_line():
    with pytest.raises(
        HubUnreachableError, match="'org/model' is not in the local Hugging Face cache and offline mode"
    ):
        config_dimensions("org/model")


@pytest.fixture
def local_hub(monkeypatch):
    """A hub address on this machine (offline mode off): `answers` says whether it answers a request."""
    from huggingface_hub import constants

    class Hub(http.server.BaseHTTPRequestHandler):
        answers = True

        def do_HEAD(self):
            if not Hub.answers:
                time.sleep(5)  # connected, silent: a hub that does not answer in time
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield Hub
    server.shutdown()
    server.server_close()


def test_the_hub_is_used_only_when_it_answers_in_time(local_hub):
    assert hub.hub_reachable(timeout=2)
    local_hub.answers = False
    assert not hub.hub_reachable(timeout=0.5)


def _no_network(home: Path) -> dict[str, str]:
    """An environment in which the hub is unreachable: its address and every proxy are a closed local port."""
    closed = "http://127.0.0.1:9"
    dropped = ("NO_PROXY", "POLYKV_DEBUG")  # and every *_OFFLINE switch (HF_HUB_, TRANSFORMERS_): the probe must run
    env = {k: v for k, v in os.environ.items() if k.upper() not in dropped and not k.upper().endswith("_OFFLINE")}
    env.update(
        HF_ENDPOINT=closed,
        HTTP_PROXY=closed,
        HTTPS_PROXY=closed,
        ALL_PROXY=closed,
        HF_HOME=str(home / "hf"),
        HF_HUB_DISABLE_TELEMETRY="1",
        POLYKV_HOME=str(home / "polykv"),
    )
    return env


def _cache_hub_model(hf_home: Path, repo_id: str, files: dict[str, str]) -> None:
    """`files` as the local Hugging Face cache holds a downloaded model (hub/models--org--name)."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    revision = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    for name, text in files.items():
        target = repo / "snapshots" / revision / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


# each is a real process: the hub client's retries (half a minute, a dozen lines) would show on stderr
@pytest.mark.parametrize(
    "command", slow_after([["plan", "validate", str(MIXED), "--model"], ["generate", "--plan", str(MIXED), "--model"]])
)
def test_a_hub_id_with_no_network_fails_in_one_line(tmp_path, command):
    env = _no_network(tmp_path)
    result = run_cli(*command, "org/model", cwd=REPO, env=env, timeout=120)
    assert_one_line_error(
        result, "model 'org/model' is not in the local Hugging Face cache and http://127.0.0.1:9 cannot be reached"
    )


@pytest.mark.slow  # a real process; the no-network test above keeps one in the fast loop
def test_a_cached_hub_model_is_read_from_the_cache_when_the_hub_is_unreachable(tmp_path):
    env = _no_network(tmp_path)
    config = {**HUGE_CONFIG, "hidden_size": 64}
    _cache_hub_model(tmp_path / "hf", "org/cached", {"config.json": json.dumps(config)})
    result = run_cli("plan", "validate", str(MIXED), "--model", "org/cached", cwd=REPO, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "is a valid plan for a 5-layer model" in result.stdout and result.stderr == ""

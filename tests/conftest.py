"""Shared fixtures: tiny random-weight models of every supported family (mechanics tests)."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from polykv.runtime.routed import output_cache

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

_COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention: 2 query heads per KV head
    max_position_embeddings=1024,
)

FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": 4096}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 16}),  # q_norm / k_norm before RoPE
}


def tiny_model(family: str = "llama", seed: int = 0, **overrides):
    config_cls, model_cls, extra = FAMILIES[family]
    config = config_cls(**{**_COMMON, **extra, **overrides})
    torch.manual_seed(seed)
    # _from_config mutates the config it is given: always hand it a copy.
    return model_cls._from_config(copy.deepcopy(config), attn_implementation="sdpa").eval()


@pytest.fixture(params=sorted(FAMILIES))
def family_model(request):
    return tiny_model(request.param)


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory):
    """The embedded demo model (stories260K), imported into a private POLYKV_HOME."""
    from polykv.models import load_model

    patch = pytest.MonkeyPatch()
    patch.setenv("POLYKV_HOME", str(tmp_path_factory.mktemp("polykv-home")))
    yield load_model("demo")
    patch.undo()


@pytest.fixture
def llama():
    return tiny_model("llama")


def decode_logits(model, ids: torch.Tensor, steps: int, cache_name: str, cache=None, after_prefill=None):
    """Prefill, then `steps` greedy single-token steps with the model deriving positions from the cache.

    Returns the prefill logits and the logits of each decode step, plus the final cache.
    """
    kwargs = {} if cache is None else {cache_name: cache}
    with torch.no_grad():
        out = model(ids, use_cache=True, **kwargs)
        cache = output_cache(out)
        if after_prefill is not None:
            after_prefill(cache)
        logits = [out.logits]
        token = out.logits[:, -1:].argmax(-1)
        for _ in range(steps):
            out = model(token, use_cache=True, **{cache_name: cache})
            logits.append(out.logits)
            token = out.logits[:, -1:].argmax(-1)
    return logits, cache

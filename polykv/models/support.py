"""What PolyKV can run, told from a model's config before any weight is allocated: the architecture
(PolyKV's attention and cache run on Llama, Mistral, Qwen2, Qwen3 and Gemma 3 text models) and whether the weights
and a KV cache fit the memory of the chosen device.

The sizes are estimates from the config alone (no weights are read): the parameters of the
embeddings, the attention projections and the gated MLP of every layer, and the KV cache one sequence
needs per token. The KV cache is counted for the model's context, at most KV_TOKENS_CHECKED tokens: the
check is there to refuse what cannot fit at all (a config that asks for terabytes), not to promise that
every prompt fits, and a long-context model is commonly run on far shorter prompts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polykv.errors import PolyKVError, SettingsError

#: the `model_type`s of the configs PolyKV runs
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
SUPPORTED_NAMES = "Llama, Mistral, Qwen2, Qwen3 and Gemma 3"
KV_TOKENS_CHECKED = 32_768
GIB = 1 << 30
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8, "double": 8}


class ModelConfigError(PolyKVError):
    """A model directory whose config.json does not describe a causal LM PolyKV can read."""


class UnsupportedModelError(ModelConfigError):
    """A model of an architecture PolyKV does not run."""


class ModelTooLargeError(PolyKVError):
    """A model whose weights and KV cache cannot fit the memory of the chosen device."""


def check_architecture(config: Mapping[str, Any], where: str) -> None:
    """UnsupportedModelError (one line naming the supported ones) unless the config is one PolyKV runs."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        got = "no model_type" if model_type is None else f"model_type {str(model_type)[:40]!r}"
        raise UnsupportedModelError(
            f"{where}: {got}; PolyKV runs {SUPPORTED_NAMES} models (model_type {', '.join(SUPPORTED_MODEL_TYPES)})"
        )


def dtype_bytes(dtype: Any, config: Any = None) -> int:
    """Bytes per weight: of `dtype` (a torch.dtype or its name) when given and not "auto", else of the
    config's own dtype (what transformers loads by default), else float32's."""
    for candidate in (dtype, getattr(config, "dtype", None)):
        if candidate is None or candidate == "auto":
            continue
        size = getattr(candidate, "itemsize", None)  # a torch.dtype
        if isinstance(size, int):
            return size
        return _DTYPE_BYTES.get(str(candidate).removeprefix("torch."), 4)
    return 4


def _count(config: Any, name: str, default: int | None = None) -> int:
    value = getattr(config, name, None)
    if value is None and default is not None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelConfigError(f"model config: {name} should be a positive integer (got {str(value)[:40]})")
    return value


def model_bytes(config: Any, bytes_per_value: int) -> tuple[int, int]:
    """(bytes of the weights, bytes of the KV cache per token of one sequence) implied by a decoder's
    config (a transformers config or any object with its attributes), at `bytes_per_value` each."""
    hidden = _count(config, "hidden_size")
    layers = _count(config, "num_hidden_layers")
    heads = _count(config, "num_attention_heads")
    kv_heads = _count(config, "num_key_value_heads", heads)
    head_dim = _count(config, "head_dim", max(hidden // heads, 1))
    attention = hidden * head_dim * 2 * (heads + kv_heads)  # q and o, k and v
    mlp = 3 * hidden * _count(config, "intermediate_size")  # gate, up and down
    tied = bool(getattr(config, "tie_word_embeddings", False))
    embeddings = _count(config, "vocab_size") * hidden * (1 if tied else 2)
    weights = (layers * (attention + mlp) + embeddings) * bytes_per_value
    kv_per_token = 2 * layers * kv_heads * head_dim * bytes_per_value
    return weights, kv_per_token


def memory_needed(config: Any, bytes_per_value: int) -> int:
    """Bytes for the weights and one sequence's KV cache at the model's context (at most KV_TOKENS_CHECKED)."""
    weights, kv_per_token = model_bytes(config, bytes_per_value)
    context = getattr(config, "max_position_embeddings", None)
    tokens = min(context, KV_TOKENS_CHECKED) if isinstance(context, int) and context > 0 else KV_TOKENS_CHECKED
    return weights + kv_per_token * tokens


def check_device(device: str) -> str:
    """`device` if this machine has it (cpu; cuda or cuda:N with that many CUDA devices; mps where torch has it),
    else one line saying what is here: checked before any work starts."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise SettingsError(f"--device {device!r} is not a device (cpu, cuda, cuda:N or mps)") from None
    if parsed.type == "cpu":
        return device
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise SettingsError(f"--device {device}: this machine has no CUDA device (torch sees none): use cpu")
        if parsed.index is not None and parsed.index >= count:
            raise SettingsError(
                f"--device {device}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
            )
        return device
    if parsed.type == "mps" and getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return device
    raise SettingsError(f"--device {device}: not available here (cpu{', cuda' if torch.cuda.is_available() else ''})")


def device_memory(device: str) -> int | None:
    """Bytes free for a model on `device` now: the host's available memory for the CPU, the free memory
    of a CUDA device; None where that cannot be told (another kind of device, no /proc)."""
    kind = str(device).split(":")[0]
    if kind == "cpu":
        return _available_host_memory()
    if kind == "cuda":
        import torch

        try:
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
        except (RuntimeError, AssertionError, ValueError):  # no CUDA here, or no such device: said when it loads
            return None
    return None


def _available_host_memory() -> int | None:
    try:  # Linux: what can be allocated without swapping (free memory plus reclaimable caches)
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_fits(needed: int, device: str, what: str) -> None:
    """ModelTooLargeError (one line) when `needed` bytes are more than `device` has available."""
    available = device_memory(device)
    if available is not None and needed > available:
        raise ModelTooLargeError(
            f"{what} needs about {needed / GIB:,.1f} GiB, "
            f"the device ({device}) has {available / GIB:,.1f} GiB available"
        )


# Generation settings under which greedy decoding is more than the argmax of the logits: the batched
# loop does not apply them, so a model whose generation config sets one is run plan by plan instead.
_PROCESSORS = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
    "renormalize_logits": False,
}


def greedy_needs_generate(model) -> str | None:
    """Why greedy decoding of this model needs `generate` itself (a logits processor its generation config
    turns on), or None when the batched loop decodes exactly as `generate(do_sample=False)` does."""
    config = getattr(model, "generation_config", None)
    for name, neutral in _PROCESSORS.items():
        value = getattr(config, name, neutral)
        if value not in (neutral, None):
            return f"its generation config sets {name}={value!r}"
    return None


def eos_ids(model, override: int | Sequence[int] | None = None) -> set[int]:
    """The tokens that end a greedy generation: `override`, else the generation config's eos_token_id."""
    value = override if override is not None else getattr(model.generation_config, "eos_token_id", None)
    if value is None:
        return set()
    return {int(value)} if isinstance(value, int) else {int(v) for v in value}

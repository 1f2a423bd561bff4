"""Where corpus text comes from: the source names a corpus spec may list (kjv, jargon, stdlib, model
samples, file:PATH, hf:NAME), each model's defaults, and reading a text source's files as one stream."""

from __future__ import annotations

import bisect
import math
import os
import sysconfig
from pathlib import Path
from typing import NamedTuple

from polykv.files import atomic_write_text

CORPORA_ENV = "POLYKV_CORPORA"
CORPUS_FILES = {"kjv": "kjv.txt", "jargon": "jargon.txt"}
KNOWN_SOURCES = ("kjv", "jargon", "stdlib", "model")
DEFAULT_SOURCES = ("kjv", "jargon", "stdlib", "model")
# The embedded real model (smollm2) runs on a laptop's CPU, where sampling 2,048-token texts from it costs
# minutes: its defaults are the public-domain texts alone, the stand-ins for the paper's calibration corpora
# (PG-19: kjv; WikiText: jargon; CodeParrot: stdlib; C4 has none here).
TEXT_SOURCES = ("kjv", "jargon", "stdlib")
# The demo model (stories260K) knows only TinyStories: its own samples are the text it models well
# (FullKV perplexity about 2-6 on each family, against about 90 on kjv and jargon, 600 on stdlib). The fidelity
# suite's demo tasks draw the same families from the evaluation split.
DEMO_SOURCES = (
    "model",
    "model@0.7",
    "model@1.2",
    "model:Lily and Ben went to the park",
    "model:A little dog named Max",
    "model:Tom had a red ball",
    "model:The sun was shining",
)
MODEL_PREFIX = "model"
FILE_PREFIX = "file:"
HUB_PREFIX = "hf:"
# A suite's own prompts with their gold answers (`polykv.eval.workloads.workload` draws them; a profile on them
# measures danswer): ruler:TASK[@LENGTH], longbench:PATH. They are not text and are never mixed with text.
WORKLOAD_PREFIXES = ("ruler:", "longbench:")
# Share of each text source (by bytes) that calibration draws from; evaluation texts start after it.
SPLITS = {"calibration": (0.0, 0.8), "evaluation": (0.8, 1.0)}
HUB_CHARACTERS = 20_000_000  # text kept from a hub dataset: plenty for 20 x 2,048-token draws
MODEL_TEMPERATURE = 1.0  # "model" without @T
MAX_MODEL_TEMPERATURE = 10.0  # above this the samples are noise; a typo such as model@70 (for 0.7) is refused
# The package lives at <repo>/polykv/profile; the corpora are shared next to the repository.
_REPO_ROOT = Path(__file__).resolve().parents[2]
_DEFAULT_CORPORA_DIR = _REPO_ROOT.parent / "shared" / "corpora"
_STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


class ModelSource(NamedTuple):
    """A model source parsed: sampling temperature and the opening text after BOS (None: from BOS)."""

    temperature: float
    opening: str | None


def _parse_model_source(source: str) -> tuple[ModelSource | None, str | None]:
    """(parsed, None) for a model source, (None, one-line problem) for a bad one, (None, None) otherwise."""
    if source == MODEL_PREFIX:
        return ModelSource(MODEL_TEMPERATURE, None), None
    rest = source[len(MODEL_PREFIX) :]
    if not source.startswith(MODEL_PREFIX) or rest[:1] not in ("@", ":"):
        return None, None
    temperature, opening = MODEL_TEMPERATURE, None
    if rest.startswith("@"):
        text, colon, after = rest[1:].partition(":")
        try:
            temperature = float(text)
        except ValueError:
            return (
                None,
                f"corpus source {source!r}: temperature {text!r} is not a number; write model@T, e.g. model@0.7",
            )
        if not (math.isfinite(temperature) and 0 < temperature <= MAX_MODEL_TEMPERATURE):
            return (
                None,
                f"corpus source {source!r}: temperature must be above 0 and at most {MAX_MODEL_TEMPERATURE:g} "
                f"(got {text})",
            )
        rest = colon + after
    if rest.startswith(":"):
        opening = rest[1:]
        if not opening.strip():
            return None, f"corpus source {source!r} has an empty opening; write model:TEXT, e.g. model:Once upon a time"
    return ModelSource(temperature, opening), None


def model_source(source: str) -> ModelSource | None:
    """The temperature and opening of a model source (``model``, ``model@T``, ``model:OPENING``,
    ``model@T:OPENING``); None for any other source. Raises a one-line ValueError for a bad one."""
    parsed, problem = _parse_model_source(source)
    if problem:
        raise ValueError(problem)
    return parsed


def default_sources(model_name: str | None) -> tuple[str, ...]:
    """A model's default calibration sources: ``DEMO_SOURCES`` (its own samples) for the demo model,
    ``TEXT_SOURCES`` (the public-domain texts) for smollm2, ``DEFAULT_SOURCES`` (public-domain prose, jargon,
    Python source and its own samples) for any other."""
    from polykv.models import DEMO_MODEL, SMOLLM2_MODEL

    if model_name in (None, DEMO_MODEL):
        return DEMO_SOURCES
    return TEXT_SOURCES if model_name == SMOLLM2_MODEL else DEFAULT_SOURCES


def is_workload_source(source: str) -> bool:
    """A suite's task (ruler:TASK[@LENGTH], longbench:PATH), not a text."""
    return isinstance(source, str) and source.startswith(WORKLOAD_PREFIXES)


def _source_error(source: str) -> str | None:
    if not isinstance(source, str):
        return f"corpus source {source!r} is not a string"
    if source in KNOWN_SOURCES:
        return None
    parsed, problem = _parse_model_source(source)
    if parsed is not None or problem is not None:
        return problem
    if source.startswith(FILE_PREFIX):
        if not source[len(FILE_PREFIX) :].strip():
            return f"corpus source {source!r} names no file: write file:PATH"
        path = Path(source[len(FILE_PREFIX) :]).expanduser()
        if not path.exists():
            return f"corpus source {source!r}: no such file {path}; give an existing text file"
        # checked before any model loads; a device or FIFO would hang or never end
        return None if path.is_file() else f"corpus source {source!r}: {path} is not a regular file"
    if source.startswith(HUB_PREFIX):
        return (
            None if source[len(HUB_PREFIX) :].strip() else f"corpus source {source!r} names no dataset: write hf:NAME"
        )
    if source.startswith(WORKLOAD_PREFIXES):
        return None if source.partition(":")[2].strip() else f"workload source {source!r} names no task"
    return (
        f"unknown corpus source {source!r}: use one of {', '.join(KNOWN_SOURCES)}, model@T, model:OPENING, "
        "file:PATH or hf:NAME[:CONFIG]"
    )


# ---- locating sources -------------------------------------------------------------------------------


def corpora_dir() -> Path:
    """The folder holding kjv.txt and jargon.txt: ``$POLYKV_CORPORA``, else ``<repo>/../shared/corpora``."""
    override = os.environ.get(CORPORA_ENV)
    folder = Path(override).expanduser() if override else _DEFAULT_CORPORA_DIR
    if not folder.is_dir():
        where = f"${CORPORA_ENV}" if override else "the default location"
        raise FileNotFoundError(
            f"corpus folder not found: {folder} ({where}); set {CORPORA_ENV} to the folder holding "
            f"{' and '.join(CORPUS_FILES.values())}"
        )
    return folder


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(
            f"corpus source 'stdlib': the standard library folder {root} does not exist; drop 'stdlib' from sources"
        )
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _STDLIB_SKIP_DIRS]
        found.extend(Path(dirpath) / name for name in filenames if name.endswith(".py"))
    found.sort(key=lambda p: p.relative_to(root).as_posix())
    if not found:
        raise FileNotFoundError(f"corpus source 'stdlib': no .py files under {root}; drop 'stdlib' from sources")
    return found


def source_files(source: str) -> list[Path]:
    """The files a text source reads, in stream order (raises a one-line error when they are missing)."""
    problem = _source_error(source)
    if problem:
        raise ValueError(problem)
    if model_source(source) is not None:
        raise ValueError(f"corpus source {source!r} is sampled from the model and reads no files")
    if source == "stdlib":
        return _stdlib_files()
    if source in CORPUS_FILES:
        folder = corpora_dir()
        path = folder / CORPUS_FILES[source]
        if not path.is_file():
            raise FileNotFoundError(
                f"corpus source {source!r}: {CORPUS_FILES[source]} not found in {folder}; set {CORPORA_ENV} to the "
                f"folder holding it, or drop {source!r} from sources"
            )
        return [path]
    if source.startswith(HUB_PREFIX):
        return [_hub_text(source[len(HUB_PREFIX) :])]
    path = Path(source[len(FILE_PREFIX) :]).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"corpus source {source!r}: no such file {path}; give an existing text file")
    return [path.resolve()]


def _hub_text(name: str) -> Path:
    """The first HUB_CHARACTERS of a hub dataset's train split, cached as a text file (written then renamed)."""
    home = Path(os.environ.get("POLYKV_HOME") or Path.home() / ".cache" / "polykv").expanduser()
    target = home / "corpora" / (name.replace("/", "__").replace(":", "--") + ".txt")
    if target.is_file():
        return target
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"corpus source 'hf:{name}' needs the `datasets` package (pip install datasets) and the hub"
        ) from None
    dataset_name, _, config = name.partition(":")
    try:
        rows = datasets.load_dataset(dataset_name, config or None, split="train", streaming=True)
        parts, size = [], 0
        for row in rows:
            text = row.get("text") or row.get("content") or ""
            parts.append(text)
            size += len(text)
            if size >= HUB_CHARACTERS:
                break
    except Exception as exc:  # noqa: BLE001 - offline, unknown dataset, ...: one line for the user
        raise ValueError(
            f"corpus source 'hf:{name}' could not be loaded ({exc.__class__.__name__}); use a local file:PATH"
        ) from None
    return atomic_write_text(target, "\n".join(parts))


class _TextStream:
    """Files read as one stream; offsets are drawn over their total size in bytes."""

    def __init__(self, source: str, files: list[Path]):
        self.source = source
        self.files = files
        sizes = [f.stat().st_size for f in files]
        self.starts = [0]
        for size in sizes:
            self.starts.append(self.starts[-1] + size)
        self._raw: dict[int, bytes] = {}
        self._text: dict[int, str] = {}
        if self.total == 0:
            raise ValueError(f"corpus source {source!r} is empty ({files[0]}); give a longer text file")

    @property
    def total(self) -> int:
        return self.starts[-1]

    def raw(self, i: int) -> bytes:
        if i not in self._raw:
            self._raw[i] = self.files[i].read_bytes()
        return self._raw[i]

    def text(self, i: int) -> str:
        if i not in self._text:
            self._text[i] = self.raw(i).decode("utf-8", errors="replace").replace("\r\n", "\n")
        return self._text[i]

    def locate(self, byte_offset: int) -> tuple[int, int]:
        """(file index, character offset in it) of a byte offset, moved to the start of the next line."""
        i = bisect.bisect_right(self.starts, byte_offset) - 1
        i = min(max(i, 0), len(self.files) - 1)
        within = byte_offset - self.starts[i]
        char = len(self.raw(i)[:within].decode("utf-8", errors="replace").replace("\r\n", "\n"))
        text = self.text(i)
        if char > 0 and text[char - 1] != "\n":
            newline = text.find("\n", char)
            char = len(text) if newline < 0 else newline + 1
        if char >= len(text) and i + 1 < len(self.files):
            i, char = i + 1, 0
        return i, char

    def read(self, i: int, char: int, n: int) -> tuple[str, bool]:
        """Up to n characters from (file i, char) onwards across files, and whether the stream ended."""
        parts, have = [], 0
        while i < len(self.files) and have < n:
            piece = self.text(i)[char : char + n - have]
            parts.append(piece)
            have += len(piece)
            i, char = i + 1, 0
        ended = have < n
        return "".join(parts), ended

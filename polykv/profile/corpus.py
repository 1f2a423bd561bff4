"""The calibration corpus: token sequences of one exact length, drawn deterministically from offline text.

Sources (``CorpusSpec.sources``), used round-robin in the given order, one sequence at a time:

- ``"kjv"``, ``"jargon"``: kjv.txt / jargon.txt in the corpora folder (``$POLYKV_CORPORA``, else
  ``<repo>/../shared/corpora``): public-domain English prose.
- ``"stdlib"``: the Python standard library's own source (``sysconfig.get_paths()["stdlib"]``), every
  ``.py`` file outside site-packages, sorted by relative path and read as one stream.
- ``"model"``: tokens the model itself samples from BOS at temperature 1 (needs ``model=``); in-domain
  text for a small specialised model such as the demo.
- ``"file:PATH"``: any local UTF-8 text file.
- ``"hf:NAME[:CONFIG]"``: a Hugging Face dataset (the paper's WikiText, C4, PG-19, CodeParrot), where
  the hub and the ``datasets`` package are available: its first documents' text ("text" or "content")
  is saved once under ``$POLYKV_HOME/corpora/`` and then read like a file.

Each text sequence starts at a seeded random character offset (moved to the next line start), and takes
enough text to tokenize to the required length; when a draw runs off the end of its source, an earlier
offset is drawn. The same spec, tokenizer (and model, for "model") always give the same token ids.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import random
import sysconfig
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CORPORA_ENV",
    "CORPUS_FILES",
    "KNOWN_SOURCES",
    "Corpus",
    "CorpusSpec",
    "build_corpus",
    "corpora_dir",
    "source_files",
]

CORPORA_ENV = "POLYKV_CORPORA"
CORPUS_FILES = {"kjv": "kjv.txt", "jargon": "jargon.txt"}
KNOWN_SOURCES = ("kjv", "jargon", "stdlib", "model")
FILE_PREFIX = "file:"
HUB_PREFIX = "hf:"
# Share of each text source (by bytes) that calibration draws from; evaluation texts start after it.
SPLITS = {"calibration": (0.0, 0.8), "evaluation": (0.8, 1.0)}
HUB_CHARACTERS = 20_000_000  # text kept from a hub dataset: plenty for 20 x 2,048-token draws
MODEL_TEMPERATURE = 1.0
# The package lives at <repo>/polykv/profile; the corpora are shared next to the repository.
_REPO_ROOT = Path(__file__).resolve().parents[2]
_DEFAULT_CORPORA_DIR = _REPO_ROOT.parent / "shared" / "corpora"
_STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


def _source_error(source: str) -> str | None:
    if not isinstance(source, str):
        return f"corpus source {source!r} is not a string"
    if source in KNOWN_SOURCES:
        return None
    if source.startswith(FILE_PREFIX):
        return None if source[len(FILE_PREFIX) :].strip() else f"corpus source {source!r} names no file: write file:PATH"
    if source.startswith(HUB_PREFIX):
        return None if source[len(HUB_PREFIX) :].strip() else f"corpus source {source!r} names no dataset: write hf:NAME"
    return f"unknown corpus source {source!r}: use one of {', '.join(KNOWN_SOURCES)}, file:PATH or hf:NAME[:CONFIG]"


@dataclass(frozen=True)
class CorpusSpec:
    """What to draw: sources (round-robin), how many sequences, their length in tokens, and the seed."""

    sources: tuple[str, ...] = ("kjv", "jargon", "stdlib", "model")
    num_sequences: int = 20
    max_tokens: int = 2048
    seed: int = 0
    # Which part of every text source to draw from: "calibration" (profiles) and "evaluation" (the
    # fidelity suite) never overlap, so plans are never scored on the text they were built from.
    split: str = "calibration"

    def __post_init__(self):
        sources = (self.sources,) if isinstance(self.sources, str) else tuple(self.sources)
        object.__setattr__(self, "sources", sources)
        if not sources:
            raise ValueError("CorpusSpec.sources is empty: name at least one source (kjv, jargon, stdlib, model, file:PATH)")
        for source in sources:
            problem = _source_error(source)
            if problem:
                raise ValueError(problem)
        if not isinstance(self.num_sequences, int) or self.num_sequences < 1:
            raise ValueError(f"CorpusSpec.num_sequences must be a positive integer (got {self.num_sequences!r})")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 2:
            raise ValueError(f"CorpusSpec.max_tokens must be an integer of at least 2 (got {self.max_tokens!r})")
        if not isinstance(self.seed, int):
            raise TypeError(f"CorpusSpec.seed must be an integer (got {self.seed!r})")
        if self.split not in SPLITS:
            raise ValueError(f"CorpusSpec.split must be one of {', '.join(SPLITS)} (got {self.split!r})")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["sources"] = list(self.sources)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CorpusSpec:
        return cls(**{**data, "sources": tuple(data.get("sources", cls.sources))})


@dataclass
class Corpus:
    """Token sequences (each exactly ``sequence_length`` ids, BOS first when the tokenizer has one)."""

    sequences: list[list[int]]
    records: list[dict[str, Any]]
    spec: CorpusSpec
    sequence_length: int = 0
    bos_token_id: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.sequences)

    def fingerprint(self) -> str:
        """sha256 of the token ids: equal fingerprints mean identical sequences."""
        return hashlib.sha256(json.dumps(self.sequences, separators=(",", ":")).encode()).hexdigest()

    def to_dict(self, include_ids: bool = False) -> dict[str, Any]:
        """JSON-ready metadata: the spec, length, where each sequence came from and a fingerprint."""
        data = {
            "spec": self.spec.to_dict(),
            "num_sequences": len(self.sequences),
            "sequence_length": self.sequence_length,
            "bos_token_id": self.bos_token_id,
            "fingerprint": self.fingerprint(),
            "records": [dict(r) for r in self.records],
            **self.meta,
        }
        if include_ids:
            data["sequences"] = [list(s) for s in self.sequences]
        return data


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
        raise FileNotFoundError(f"corpus source 'stdlib': the standard library folder {root} does not exist; drop 'stdlib' from sources")
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
    if source == "model":
        raise ValueError("corpus source 'model' is sampled from the model and reads no files")
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
        raise ValueError(f"corpus source 'hf:{name}' needs the `datasets` package (pip install datasets) and the hub") from None
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
        raise ValueError(f"corpus source 'hf:{name}' could not be loaded ({exc.__class__.__name__}); use a local file:PATH") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text("\n".join(parts), encoding="utf-8")
    os.replace(tmp, target)
    return target


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


# ---- drawing sequences ------------------------------------------------------------------------------


def _encode(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]] | None]:
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    except (NotImplementedError, TypeError, ValueError, KeyError):  # slow tokenizers have no offsets
        return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]), None


def _draw_text(
    stream: _TextStream, tokenizer, need: int, rng: random.Random, split: str = "calibration"
) -> tuple[list[int], dict[str, Any]]:
    """`need` token ids from a seeded offset in the split's part of the stream; an earlier offset is
    drawn when the text runs out too soon."""
    lo_share, hi_share = SPLITS[split]
    lower = int(stream.total * lo_share)
    # Calibration draws stop short of the evaluation part by a generous text length (~8 bytes a token).
    upper = int(stream.total * hi_share) - (8 * need if hi_share < 1.0 else 0)
    if upper <= lower:
        raise ValueError(
            f"corpus source {stream.source!r} is too short for {need}-token sequences in its {split} part; "
            "use a longer text or a smaller max_tokens"
        )
    while True:
        start = rng.randrange(lower, upper)
        i, char = stream.locate(start)
        size = max(256, 6 * need)
        while True:
            text, ended = stream.read(i, char, size)
            ids, offsets = _encode(tokenizer, text)
            # One token to spare: the last token of a cut chunk may be a fragment of a longer one.
            if len(ids) > need or (ended and len(ids) >= need):
                used = offsets[need - 1][1] if offsets else len(text)
                return ids[:need], {"file": str(stream.files[i]), "offset": char, "length": used}
            if ended:
                break
            size *= 2
        if start == lower:
            raise ValueError(
                f"corpus source {stream.source!r} is too short: it holds {len(ids)} tokens but each sequence "
                f"needs {need}; use a longer text or a smaller max_tokens"
            )
        upper = start  # draw again, earlier in the source


def _seed_int(*parts: Any) -> int:
    digest = hashlib.sha256(":".join(str(p) for p in ("polykv-corpus", *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _sample_from_model(model, bos: int, length: int, seeds: list[int]) -> list[list[int]]:
    """Sample `length - 1` tokens after BOS for each seed (one batch, one generator per row, on the CPU)."""
    import torch

    from polykv.runtime.routed import cache_argument_name, output_cache

    device = next(model.parameters()).device
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    rows = [[bos] for _ in seeds]
    token = torch.full((len(seeds), 1), bos, dtype=torch.long, device=device)
    cache_name, cache = cache_argument_name(model), None
    with torch.no_grad():
        for _ in range(length - 1):
            kwargs = {} if cache is None else {cache_name: cache}
            out = model(input_ids=token, use_cache=True, **kwargs)
            cache = output_cache(out)
            probs = torch.softmax(out.logits[:, -1].float().cpu() / MODEL_TEMPERATURE, dim=-1)
            picked = [int(torch.multinomial(probs[r], 1, generator=g)) for r, g in enumerate(generators)]
            for row, t in zip(rows, picked):
                row.append(t)
            token = torch.tensor(picked, dtype=torch.long, device=device)[:, None]
    return rows


def _model_context(model) -> int | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def build_corpus(tokenizer, spec: CorpusSpec | None = None, model=None, context_length: int | None = None) -> Corpus:
    """Draw ``spec.num_sequences`` token sequences of min(max_tokens, context_length) tokens each.

    ``context_length`` defaults to the model's ``max_position_embeddings`` when a model is given. Sequence k
    comes from ``spec.sources[k % len(sources)]``. Raises ValueError / FileNotFoundError (one line) for an
    unknown source, a missing file or folder, "model" without a model, or a source too short.
    """
    spec = spec or CorpusSpec()
    if context_length is None and model is not None:
        context_length = _model_context(model)
    if context_length is not None and context_length < 2:
        raise ValueError(f"context_length must be at least 2 (got {context_length})")
    length = spec.max_tokens if context_length is None else min(spec.max_tokens, int(context_length))
    bos = getattr(tokenizer, "bos_token_id", None)
    need = length - 1 if bos is not None else length

    assigned = [spec.sources[k % len(spec.sources)] for k in range(spec.num_sequences)]
    if "model" in assigned:
        if model is None:
            raise ValueError(
                "corpus source 'model' samples text from the model: pass model= to build_corpus, or drop 'model' from sources"
            )
        if bos is None:
            bos = getattr(getattr(model, "config", None), "bos_token_id", None)
            if bos is None:
                raise ValueError("corpus source 'model' samples from BOS, but neither the tokenizer nor the model config has a BOS token")
    # Resolve every text source before any work, so a missing file fails fast.
    streams = {s: _TextStream(s, source_files(s)) for s in dict.fromkeys(assigned) if s != "model"}

    sequences: list[list[int] | None] = [None] * spec.num_sequences
    records: list[dict[str, Any] | None] = [None] * spec.num_sequences
    bos_prefix = [] if getattr(tokenizer, "bos_token_id", None) is None else [tokenizer.bos_token_id]
    for k, source in enumerate(assigned):
        if source == "model":
            continue
        rng = random.Random(_seed_int(spec.seed, k, source))
        ids, where = _draw_text(streams[source], tokenizer, need, rng, spec.split)
        sequences[k] = bos_prefix + ids
        records[k] = {"index": k, "source": source, **where, "tokens": length}

    model_rows = [k for k, s in enumerate(assigned) if s == "model"]
    if model_rows:
        seeds = [_seed_int(spec.seed, k, "model") for k in model_rows]
        for k, seed, ids in zip(model_rows, seeds, _sample_from_model(model, int(bos), length, seeds)):
            sequences[k] = ids
            records[k] = {
                "index": k,
                "source": "model",
                "file": None,
                "offset": None,
                "length": None,
                "tokens": length,
                "temperature": MODEL_TEMPERATURE,
                "sample_seed": seed,
            }

    meta = {"context_length": context_length, "tokenizer": getattr(tokenizer, "name_or_path", None)}
    if model_rows:
        meta["model"] = getattr(getattr(model, "config", None), "_name_or_path", None)
    return Corpus(
        sequences=[list(map(int, s)) for s in sequences],
        records=list(records),
        spec=spec,
        sequence_length=length,
        bos_token_id=bos_prefix[0] if bos_prefix else (int(bos) if model_rows else None),
        meta=meta,
    )

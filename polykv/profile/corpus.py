"""The calibration corpus: token sequences of one exact length, drawn deterministically from offline text.

Sources (``CorpusSpec.sources``), used round-robin in the given order, one sequence at a time:

- ``"kjv"``, ``"jargon"``: kjv.txt / jargon.txt in the corpora folder (``$POLYKV_CORPORA``, else
  ``<repo>/../shared/corpora``): public-domain English prose.
- ``"stdlib"``: the Python standard library's own source (``sysconfig.get_paths()["stdlib"]``), every
  ``.py`` file outside site-packages, sorted by relative path and read as one stream.
- ``"model"``, ``"model@T"``, ``"model:OPENING"``, ``"model@T:OPENING"``: tokens the model itself samples
  (needs ``model=``): in-domain text for a small specialised model such as the demo. Sampling starts
  from BOS, followed by OPENING tokenized when one is given (e.g. ``model:Once upon a time``; the
  opening is kept in the sequence), at temperature T (0 < T <= 10; ``model`` is ``model@1.0``, and
  spellings of the same temperature such as ``model@1`` draw the same samples, so a spec lists each
  temperature and opening once). A sample's seed comes from the spec's seed and split, the source's
  temperature and opening, and the sample's rank among that source's sequences: calibration and
  evaluation draws never share a sample, and a source draws the same samples whatever sources are listed
  with it. All model sources of a corpus are sampled together in one batch.
- ``"file:PATH"``: any local UTF-8 text file.
- ``"hf:NAME[:CONFIG]"``: a Hugging Face dataset (the paper's WikiText, C4, PG-19, CodeParrot), where
  the hub and the ``datasets`` package are available: its first documents' text ("text" or "content")
  is saved once under ``$POLYKV_HOME/corpora/`` and then read like a file.

Each text sequence starts at a seeded random character offset (moved to the next line start), and takes
enough text to tokenize to the required length; when a draw runs off the end of its source, an earlier
offset is drawn. The same spec, tokenizer (and model, for model sources) always give the same token ids.

``default_sources(model_name)`` gives a model's default calibration sources: for the demo model (a
TinyStories model that cannot model Bible, jargon or Python text), text it samples itself in several
families (``DEMO_SOURCES``); for every other model ``DEFAULT_SOURCES``.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import random
import sysconfig
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from polykv.files import atomic_write_text

__all__ = [
    "CORPORA_ENV",
    "CORPUS_FILES",
    "DEFAULT_SOURCES",
    "DEMO_SOURCES",
    "KNOWN_SOURCES",
    "Corpus",
    "CorpusSpec",
    "ModelSource",
    "build_corpus",
    "corpora_dir",
    "default_sources",
    "model_source",
    "source_files",
]

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
    return (
        f"unknown corpus source {source!r}: use one of {', '.join(KNOWN_SOURCES)}, model@T, model:OPENING, "
        "file:PATH or hf:NAME[:CONFIG]"
    )


@dataclass(frozen=True)
class CorpusSpec:
    """What to draw: sources (round-robin), how many sequences, their length in tokens, and the seed."""

    # Model-independent; callers that know the model pass default_sources(model_name).
    sources: tuple[str, ...] = DEFAULT_SOURCES
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
            raise ValueError(
                "CorpusSpec.sources is empty: name at least one source "
                "(kjv, jargon, stdlib, model, model@T, model:OPENING, file:PATH)"
            )
        for source in sources:
            problem = _source_error(source)
            if problem:
                raise ValueError(problem)
        families: dict[ModelSource, str] = {}
        for source in sources:
            parsed = model_source(source)
            if parsed in families:  # their samples would be identical (seeds follow the family, not the spelling)
                raise ValueError(
                    f"corpus sources {families[parsed]!r} and {source!r} sample the same text; list it once"
                )
            if parsed is not None:
                families[parsed] = source
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


def _sample_from_model(
    model, prefixes: list[list[int]], length: int, seeds: list[int], temperatures: list[float]
) -> list[list[int]]:
    """Continue each prefix (BOS, then its opening) to `length` tokens, sampling at its temperature with
    its own generator (drawn on the CPU).

    All rows advance together, one position a step, in one batch (a tiny model's step costs about the
    same for 1 or 20 rows): a row still inside its prefix takes its next prefix token instead of a sample.
    """
    import torch

    from polykv.models import cache_argument_name, output_cache

    device = next(model.parameters()).device
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    scale = torch.tensor(temperatures, dtype=torch.float32)[:, None]
    rows = [[prefix[0]] for prefix in prefixes]
    tokens = torch.tensor(rows, dtype=torch.long, device=device)
    cache_name, cache = cache_argument_name(model), None
    with torch.no_grad():
        for step in range(1, length):
            kwargs = {} if cache is None else {cache_name: cache}
            out = model(input_ids=tokens, use_cache=True, **kwargs)
            cache = output_cache(out)
            probs = torch.softmax(out.logits[:, -1].float().cpu() / scale, dim=-1)
            for r, (row, prefix) in enumerate(zip(rows, prefixes)):
                forced = step < len(prefix)
                row.append(prefix[step] if forced else int(torch.multinomial(probs[r], 1, generator=generators[r])))
            tokens = torch.tensor([row[-1] for row in rows], dtype=torch.long, device=device)[:, None]
    return rows


def build_corpus(tokenizer, spec: CorpusSpec | None = None, model=None, context_length: int | None = None) -> Corpus:
    """Draw ``spec.num_sequences`` token sequences of min(max_tokens, context_length) tokens each.

    ``context_length`` defaults to the model's ``max_position_embeddings`` when a model is given. Sequence k
    comes from ``spec.sources[k % len(sources)]``. Raises ValueError / FileNotFoundError (one line) for an
    unknown or malformed source, a missing file or folder, a model source without a model, an opening
    that leaves no token to sample, or a source too short.
    """
    spec = spec or CorpusSpec()
    if context_length is None and model is not None:
        from polykv.models import context_length as context_of

        context_length = context_of(model)
    if context_length is not None and context_length < 2:
        raise ValueError(f"context_length must be at least 2 (got {context_length})")
    length = spec.max_tokens if context_length is None else min(spec.max_tokens, int(context_length))
    bos = getattr(tokenizer, "bos_token_id", None)
    need = length - 1 if bos is not None else length

    assigned = [spec.sources[k % len(spec.sources)] for k in range(spec.num_sequences)]
    sampled = {s: model_source(s) for s in dict.fromkeys(assigned)}
    sampled = {s: parsed for s, parsed in sampled.items() if parsed is not None}
    if sampled:
        first = next(iter(sampled))
        if model is None:
            raise ValueError(
                f"corpus source {first!r} samples text from the model: pass model= to build_corpus, "
                "or drop it from sources"
            )
        if bos is None:
            bos = getattr(getattr(model, "config", None), "bos_token_id", None)
            if bos is None:
                raise ValueError(
                    f"corpus source {first!r} samples from BOS, but neither the tokenizer nor the model config "
                    "has a BOS token"
                )
    # Resolve every source before any work, so a missing file or an opening too long fails fast.
    streams = {s: _TextStream(s, source_files(s)) for s in dict.fromkeys(assigned) if s not in sampled}
    prefixes = {}
    for source, parsed in sampled.items():
        opening = [] if parsed.opening is None else _encode(tokenizer, parsed.opening)[0]
        prefixes[source] = [int(bos), *opening]
        if len(prefixes[source]) >= length:
            raise ValueError(
                f"corpus source {source!r}: BOS and the opening take {len(prefixes[source])} tokens, leaving none to "
                f"sample in {length}-token sequences; shorten the opening or raise max_tokens"
            )

    sequences: list[list[int] | None] = [None] * spec.num_sequences
    records: list[dict[str, Any] | None] = [None] * spec.num_sequences
    bos_prefix = [] if getattr(tokenizer, "bos_token_id", None) is None else [tokenizer.bos_token_id]
    for k, source in enumerate(assigned):
        if source in sampled:
            continue
        rng = random.Random(_seed_int(spec.seed, k, source))
        ids, where = _draw_text(streams[source], tokenizer, need, rng, spec.split)
        sequences[k] = bos_prefix + ids
        records[k] = {"index": k, "source": source, **where, "tokens": length}

    # A sample's seed names the split, the sampling settings (not their spelling) and its rank among its
    # source's sequences (not its place among other sources): a profile's calibration samples and the
    # fidelity suite's evaluation samples differ even for the same spec seed, and a source draws the same
    # samples whatever other sources are listed with it.
    rows = [k for k, s in enumerate(assigned) if s in sampled]
    if rows:
        settings = [sampled[assigned[k]] for k in rows]
        seeds = [
            _seed_int(spec.seed, spec.split, k // len(spec.sources), MODEL_PREFIX, repr(p.temperature), p.opening)
            for k, p in zip(rows, settings)
        ]
        drawn = _sample_from_model(
            model, [prefixes[assigned[k]] for k in rows], length, seeds, [p.temperature for p in settings]
        )
        for k, parsed, seed, ids in zip(rows, settings, seeds, drawn):
            sequences[k] = ids
            records[k] = {
                "index": k,
                "source": assigned[k],
                "file": None,
                "offset": None,
                "length": None,
                "tokens": length,
                "temperature": parsed.temperature,
                "opening": parsed.opening,
                "sample_seed": seed,
            }

    meta = {"context_length": context_length, "tokenizer": getattr(tokenizer, "name_or_path", None)}
    if sampled:
        meta["model"] = getattr(getattr(model, "config", None), "_name_or_path", None)
    return Corpus(
        sequences=[list(map(int, s)) for s in sequences],
        records=list(records),
        spec=spec,
        sequence_length=length,
        bos_token_id=bos_prefix[0] if bos_prefix else (int(bos) if sampled else None),
        meta=meta,
    )

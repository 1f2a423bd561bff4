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
Where the text comes from (source names, defaults, reading files) is `polykv.profile.sources`; its
names are importable from here too.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from polykv.profile.sources import (
    CORPORA_ENV,
    CORPUS_FILES,
    DEFAULT_SOURCES,
    DEMO_SOURCES,
    KNOWN_SOURCES,
    MODEL_PREFIX,
    SPLITS,
    ModelSource,
    _source_error,
    _TextStream,
    corpora_dir,
    default_sources,
    is_workload_source,
    model_source,
    source_files,
)
from polykv.question_protocol import QuestionProtocol

__all__ = [
    "CORPORA_ENV",
    "CORPUS_FILES",
    "DEFAULT_SOURCES",
    "DEMO_SOURCES",
    "KNOWN_SOURCES",
    "Corpus",
    "CorpusSpec",
    "WorkloadCorpus",
    "ModelSource",
    "build_corpus",
    "calibration_text",
    "corpora_dir",
    "default_sources",
    "model_source",
    "source_files",
]


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
        workload = [s for s in sources if is_workload_source(s)]
        if workload and len(workload) < len(sources):
            raise ValueError(f"corpus sources mix a workload ({workload[0]}) with text: profile one or the other")
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

    @property
    def is_workload(self) -> bool:
        """Sources of a suite's prompts (ruler:..., longbench:...), built by `polykv.eval.workloads.workload`."""
        return is_workload_source(self.sources[0])

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


@dataclass
class WorkloadCorpus:
    """A workload's calibration sequences for the profiler (built by `polykv.eval.workloads.workload.workload_corpus`
    from sources such as ruler:niah_single_2@2048): prompt + gold answer, each scoring its answer.

    In the question's protocol (`QuestionProtocol`): IN_PROMPT, the prompt's pass is the whole prompt
    and the answer follows (its first token, predicted by that pass, is the same under every method: not
    scored); AFTER_COMPRESSION, the prompt's pass is the context, the question follows kept in full (`kept`)
    and then the answer, every token of it scored."""

    sequences: list[list[int]]
    continuations: list[int]  # tokens fed after the prompt's pass (the question when kept, then the answer)
    answer_tokens: list[int]
    records: list[dict]
    scored: list[int] = field(default_factory=list)  # the last tokens of each continuation that are scored
    kept: list[int] = field(default_factory=list)  # the first tokens of each continuation kept in full (question)
    question: QuestionProtocol = QuestionProtocol.IN_PROMPT

    def to_dict(self, spec) -> dict:
        ids = json.dumps(self.sequences, separators=(",", ":")).encode()
        return {
            "spec": spec.to_dict(),
            "num_sequences": len(self.sequences),
            "sequence_length": max(len(s) for s in self.sequences),
            "fingerprint": hashlib.sha256(ids).hexdigest(),
            "records": self.records,
            "workload": True,
            **({} if self.question == QuestionProtocol.IN_PROMPT else {"question": str(self.question)}),
        }


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
    if spec.is_workload:
        raise ValueError(
            f"corpus source {spec.sources[0]!r} is a workload: build it with "
            "polykv.eval.workloads.workload.workload_corpus"
        )
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


def calibration_text(model_name: str, model, tokenizer, sequences: int, tokens: int) -> list[list[int]]:
    """`sequences` sequences of calibration text (the model's default sources, never the evaluation split) of at most
    `tokens` tokens: what a statistic measured before any prompt is known is measured on."""
    spec = CorpusSpec(sources=default_sources(model_name), num_sequences=sequences, max_tokens=tokens)
    return build_corpus(tokenizer, spec, model=model).sequences

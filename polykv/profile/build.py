"""Build (or reuse) a model's profile: corpus -> method profiles + entropy -> profile directory."""

from __future__ import annotations

import datetime
import platform
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
import transformers

from polykv import __version__
from polykv.methods import for_phase
from polykv.models import num_layers
from polykv.plan import Phase
from polykv.profile.confidence import LEVEL, REPLICATES, cell_intervals, fullkv_perplexity
from polykv.profile.corpus import CorpusSpec, build_corpus
from polykv.profile.profiler import (
    CONTINUATION,
    PROFILE_REVISION,
    calibration_params,
    default_calibration_capacity,
    profile_methods,
    profiled_methods,
)
from polykv.profile.store import Profile, ProfileError, find_profile, profile_key, save_profile


def build_profile(
    model_name: str,
    model,
    tokenizer,
    root: Path,
    corpus: CorpusSpec = CorpusSpec(),
    capacity: int | None = None,
    scopes: tuple[Phase, ...] = (Phase.PREFILL, Phase.DECODE),
    continuation: int = CONTINUATION,
    batch_size: int = 20,
    reuse: bool = True,
    progress: Callable[[float, str], None] | None = None,
) -> Profile:
    """Profile `model` on the calibration corpus at b_cal = `capacity` (default: scaled to the context)."""
    texts = build_corpus(tokenizer, corpus, model=model)  # sequences no longer than the model's context
    length = len(texts.sequences[0])
    prompt = length - 1 - continuation
    capacity = capacity if capacity is not None else default_calibration_capacity(prompt)
    if capacity >= prompt:
        raise ProfileError(
            f"b_cal ({capacity}) must be smaller than the calibration prompts ({prompt} tokens: sequences of "
            f"{length} minus a {continuation}-token continuation); lower b_cal or raise --max-tokens"
        )
    settings = {"corpus": texts.spec.to_dict(), "scopes": [s.value for s in scopes], "continuation": continuation}
    methods = profiled_methods(scopes)
    key = profile_key(model_name, settings, capacity, corpus.seed, methods, PROFILE_REVISION)
    existing = find_profile(root, key)
    if reuse and existing is not None:
        return existing

    result = profile_methods(
        model, texts.sequences, capacity, scopes, continuation=continuation, batch_size=batch_size, progress=progress
    )
    sources = [record["source"] for record in texts.records]  # sequence k's calibration source
    metadata = {
        "key": key,
        "model": model_name,
        "num_layers": num_layers(model),
        "capacity": capacity,
        "seed": corpus.seed,
        "scopes": settings["scopes"],
        "continuation": continuation,
        "sequence_length": length,
        "method_params": {m: calibration_params(m, capacity) for phase in scopes for m in for_phase(phase)},
        "methods": methods,
        "profile_revision": PROFILE_REVISION,
        "corpus": texts.to_dict(),
        "entropy": "mean attention entropy over all prompt queries, heads and sequences (nats)",
        "fullkv_ppl": fullkv_perplexity(result.reference_nll, sources, continuation),
        "intervals": {
            "level": LEVEL,
            "replicates": REPLICATES,
            "seed": 0,
            "rule": "percentile bootstrap over the calibration sequences, one draw shared by all cells",
        },
        "seconds": round(result.seconds, 3),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": {
            "polykv": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
    }
    sequences = pd.DataFrame(result.sequences)
    intervals = cell_intervals(sequences, result.reference_nll, continuation, REPLICATES, seed=0)
    table = pd.DataFrame(result.rows).merge(intervals, on=["layer", "scope", "method"], how="left")
    layers = pd.DataFrame({"layer": range(len(result.entropy)), "entropy": result.entropy})
    reference = pd.DataFrame({"sequence": range(len(sources)), "source": sources, "nll": result.reference_nll})
    profile = Profile(metadata=metadata, table=table, layers=layers, sequences=sequences, reference=reference)
    save_profile(profile, root)
    return profile

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
from polykv.plan import Phase
from polykv.profile.corpus import CorpusSpec, build_corpus
from polykv.profile.profiler import (
    CONTINUATION,
    calibration_params,
    compatible_methods,
    default_calibration_capacity,
    profile_methods,
)
from polykv.profile.store import Profile, ProfileError, find_profile, profile_key, save_profile
from polykv.runtime.routed import num_layers_of


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
    context = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
    texts = build_corpus(tokenizer, corpus, model=model, context_length=context)
    length = len(texts.sequences[0])
    prompt = length - 1 - continuation
    capacity = capacity if capacity is not None else default_calibration_capacity(prompt)
    if capacity >= prompt:
        raise ProfileError(
            f"b_cal ({capacity}) must be smaller than the calibration prompts ({prompt} tokens: sequences of "
            f"{length} minus a {continuation}-token continuation); lower b_cal or raise --max-tokens"
        )
    settings = {"corpus": texts.spec.to_dict(), "scopes": [s.value for s in scopes], "continuation": continuation}
    key = profile_key(model_name, settings, capacity, corpus.seed)
    existing = find_profile(root, key)
    if reuse and existing is not None:
        return existing

    result = profile_methods(
        model, texts.sequences, capacity, scopes, continuation=continuation, batch_size=batch_size, progress=progress
    )
    metadata = {
        "key": key,
        "model": model_name,
        "num_layers": num_layers_of(model),
        "capacity": capacity,
        "seed": corpus.seed,
        "scopes": settings["scopes"],
        "continuation": continuation,
        "sequence_length": length,
        "method_params": {
            m: calibration_params(m, capacity) for phase in scopes for m in compatible_methods(phase)
        },
        "corpus": texts.to_dict(),
        "entropy": "attention entropy of the first decoding query, mean over heads and sequences",
        "seconds": round(result.seconds, 3),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"polykv": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
    }
    table = pd.DataFrame(result.rows)
    layers = pd.DataFrame({"layer": range(len(result.entropy)), "entropy": result.entropy})
    profile = Profile(metadata=metadata, table=table, layers=layers)
    save_profile(profile, root)
    return profile

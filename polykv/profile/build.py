"""Build (or reuse) a model's profile: corpus -> method profiles + entropy -> profile directory."""

from __future__ import annotations

import datetime
import platform
from pathlib import Path

import pandas as pd
import torch
import transformers

from polykv import __version__
from polykv.methods import for_phase
from polykv.models import num_layers
from polykv.plan import Phase
from polykv.profile.cell_plan import calibration_params
from polykv.profile.confidence import LEVEL, REPLICATES, cell_intervals, danswer_means, fullkv_perplexity
from polykv.profile.corpus import CorpusSpec, WorkloadCorpus, build_corpus
from polykv.profile.profiler import (
    CONTINUATION,
    PROFILE_REVISION,
    default_calibration_capacity,
    profile_methods,
    profiled_methods,
)
from polykv.profile.store import Profile, ProfileError, find_profile, profile_key, save_profile
from polykv.progress import Fraction
from polykv.question_protocol import QuestionProtocol


def build_profile(
    model_name: str,
    model,
    tokenizer,
    root: Path,
    corpus: CorpusSpec = CorpusSpec(),
    capacity: int | None = None,
    scopes: tuple[Phase, ...] = (Phase.PREFILL, Phase.DECODE),
    continuation: int = CONTINUATION,
    batch_size: int = 4,
    reuse: bool = True,
    progress: Fraction | None = None,
    workload: WorkloadCorpus | None = None,
    compute: bool = True,
) -> Profile:
    """Profile `model` on the calibration corpus at b_cal = `capacity` (default: scaled to the context).

    A workload corpus spec (sources ruler:..., longbench:...) comes with its sequences built by
    `polykv.eval.workloads.workload.workload_corpus` (`workload`): each scores its gold answer, and the profile
    measures danswer beside cosine and dPPL."""
    if corpus.is_workload != (workload is not None):
        raise ValueError(
            "a workload corpus spec needs its sequences (polykv.eval.workloads.workload.workload_corpus)"
            if workload is None
            else "workload sequences need a corpus spec of workload sources"
        )
    if workload is None:
        texts = build_corpus(tokenizer, corpus, model=model)  # sequences no longer than the model's context
        sequences, continuations, answer_tokens = texts.sequences, [continuation] * len(texts.sequences), None
        records, corpus_data = texts.records, texts.to_dict()
        scored, kept = continuations, None
    else:
        sequences, continuations, answer_tokens = workload.sequences, workload.continuations, workload.answer_tokens
        records, corpus_data = workload.records, workload.to_dict(corpus)
        continuation = max(continuations)
        scored, kept = workload.scored or continuations, workload.kept or None
    length = max(len(s) for s in sequences)
    prompt = min(len(s) - 1 - c for s, c in zip(sequences, continuations))
    capacity = capacity if capacity is not None else default_calibration_capacity(prompt)
    if capacity >= prompt:
        raise ProfileError(
            f"b_cal ({capacity}) must be smaller than the calibration prompts ({prompt} tokens: sequences of "
            f"{length} minus a {continuation}-token continuation); lower b_cal or raise --max-tokens"
        )
    settings = {"corpus": corpus.to_dict(), "scopes": [s.value for s in scopes], "continuation": continuation}
    if workload is not None:
        settings["workload"] = {"answer_tokens": max(answer_tokens), "sequences": len(sequences)}
        if workload.question != QuestionProtocol.IN_PROMPT:  # the same sequences, split and scored another way
            settings["workload"]["question"] = str(workload.question)
    methods = profiled_methods(scopes)
    key = profile_key(model_name, settings, capacity, corpus.seed, methods, PROFILE_REVISION)
    existing = find_profile(root, key)
    if reuse and existing is not None:
        return existing
    if not compute:  # a replay: what is not there already is not made
        raise ProfileError(f"no profile {key} in {root}, and this call computes none")

    result = profile_methods(
        model,
        sequences,
        capacity,
        scopes,
        continuation=continuation,
        batch_size=batch_size,
        progress=progress,
        continuations=None if workload is None else continuations,
        scored=None if workload is None else scored,
        kept=kept,
    )
    sources = [record["source"] for record in records]  # sequence k's calibration source
    metadata = {
        "key": key,
        "model": model_name,
        "num_layers": num_layers(model),
        "capacity": capacity,
        "seed": corpus.seed,
        "scopes": settings["scopes"],
        "continuation": continuation,
        "sequence_length": length,
        **({"workload": settings["workload"]} if workload is not None else {}),
        "method_params": {m: calibration_params(m, capacity) for phase in scopes for m in for_phase(phase)},
        "methods": methods,
        "profile_revision": PROFILE_REVISION,
        "corpus": corpus_data,
        "entropy": "mean attention entropy over all prompt queries, heads and sequences (nats)",
        "fullkv_ppl": fullkv_perplexity(result.reference_nll, sources, scored),
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
    per_sequence = pd.DataFrame(result.sequences)
    cells = ["layer", "scope", "method"]
    intervals = cell_intervals(per_sequence, result.reference_nll, scored, REPLICATES, 0, answer_tokens)
    table = pd.DataFrame(result.rows)
    if answer_tokens is not None:
        table = table.merge(danswer_means(per_sequence, result.reference_nll, answer_tokens), on=cells, how="left")
    table = table.merge(intervals, on=cells, how="left")
    layers = pd.DataFrame({"layer": range(len(result.entropy)), "entropy": result.entropy})
    reference = pd.DataFrame({"sequence": range(len(sources)), "source": sources, "nll": result.reference_nll})
    if answer_tokens is not None:
        reference["tokens"], reference["answer_tokens"] = scored, answer_tokens
    profile = Profile(metadata=metadata, table=table, layers=layers, sequences=per_sequence, reference=reference)
    save_profile(profile, root)
    return profile

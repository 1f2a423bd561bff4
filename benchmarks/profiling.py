"""Cost of a full method profile of the demo model, with and without prefix reuse.

(Named profiling.py because a benchmarks/profile.py would shadow the standard library's `profile`
module, which torch imports, for every script run from this folder.)

Profiles every layer x every compatible method x both scopes on the calibration corpus (20 sequences
by default), once reusing the FullKV prefix (each (layer, method) run starts at its layer from cached
hidden states) and once naively (every run starts at the embeddings), interleaved, and prints the
median times and their ratio. Both must give the same profile (checked).

    python benchmarks/profiling.py            # demo model, 20 sequences, 2 repetitions
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import pandas as pd
import torch

from polykv.models import load_model
from polykv.profile.corpus import CorpusSpec, build_corpus
from polykv.profile.profiler import CONTINUATION, default_calibration_capacity, profile_methods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--sequences", type=int, default=20)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model, tokenizer = load_model(args.model)
    corpus = build_corpus(
        tokenizer,
        CorpusSpec(num_sequences=args.sequences),
        model=model,
        context_length=model.config.max_position_embeddings,
    )
    prompt = len(corpus.sequences[0]) - 1 - CONTINUATION
    capacity = default_calibration_capacity(prompt)
    times = {True: [], False: []}
    tables = {}
    for _ in range(args.reps):
        for reuse in (True, False):
            started = time.perf_counter()
            result = profile_methods(model, corpus.sequences, capacity, reuse_prefix=reuse)
            times[reuse].append(time.perf_counter() - started)
            tables[reuse] = pd.DataFrame(result.rows)
    gap = (tables[True][["cosine", "dppl"]] - tables[False][["cosine", "dppl"]]).abs().max().max()
    reuse, naive = statistics.median(times[True]), statistics.median(times[False])
    print(
        f"demo-model profile: {len(tables[True])} (layer, scope, method) cells x {args.sequences} sequences of "
        f"{len(corpus.sequences[0])} tokens, b_cal {capacity}, {torch.get_num_threads()} threads, "
        f"medians of {args.reps} interleaved runs"
    )
    print(f"with prefix reuse  {reuse:8.2f} s")
    print(f"naive loop         {naive:8.2f} s")
    print(f"ratio              {reuse / naive:8.3f}   (largest difference between the two profiles: {gap:.2e})")


if __name__ == "__main__":
    main()

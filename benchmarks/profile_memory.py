"""Peak memory of a model's default profile at two batch sizes (issue 31, item 6).

The profiler holds, per batch, every layer's hidden states over the whole sequences and each cell's cache of
the layer it measures: its peak memory grows with the batch. `polykv profile --model smollm2` profiles 20
sequences of 2,048 tokens in both scopes; with batches of 20 a search's first profile peaked at 14.8 GB RSS
(measured when the issue was filed). The peak is reached on the first batch's first layers, so each setting
runs in a fresh process until the profiler has finished `--layers` layers of its first batch, and reports
that process's peak RSS (getrusage) and the seconds it took. Run, on a quiet machine:

    .venv/bin/python benchmarks/profile_memory.py --model smollm2 --batch 20 --batch 4
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


class _Enough(Exception):
    pass


def measure(model_name: str, batch: int, layers: int, tokens: int) -> dict:
    """In this process: the default corpus's first `batch` sequences profiled (both scopes) until `layers`
    layers are done; peak RSS in GB and seconds."""
    from polykv.models import load_model
    from polykv.profile.corpus import CorpusSpec, build_corpus, default_sources
    from polykv.profile.profiler import default_calibration_capacity, profile_methods

    model, tokenizer = load_model(model_name)
    corpus = build_corpus(
        tokenizer, CorpusSpec(sources=default_sources(model_name), num_sequences=batch, max_tokens=tokens), model
    )
    capacity = default_calibration_capacity(corpus.sequence_length - 33)
    started = time.perf_counter()

    def progress(fraction: float, message: str) -> None:
        if int(message.rsplit(" ", 1)[1]) >= layers:  # "<scope> <method> layer <l>": layer l has begun
            raise _Enough

    try:
        profile_methods(model, corpus.sequences, capacity, batch_size=batch, progress=progress)
    except _Enough:
        pass
    return {
        "batch": batch,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
        "seconds": time.perf_counter() - started,
        "layers": layers,
        "tokens": corpus.sequence_length,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (repeat)")
    parser.add_argument("--layers", type=int, default=2, help="layers of the first batch to profile")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.model, args.child, args.layers, args.tokens)))
        return
    rows = []
    for batch in args.batch or [20, 4]:
        command = [sys.executable, __file__, "--model", args.model, "--layers", str(args.layers)]
        command += ["--tokens", str(args.tokens), "--child", str(batch)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    where = f"(first batch, {args.layers} layers, {rows[0]['tokens']} tokens)"
    print(f"{'batch':>5}  {'peak RSS GB':>11}  {'seconds':>8}  {where}")
    for row in rows:
        print(f"{row['batch']:>5}  {row['peak_rss_gb']:>11.2f}  {row['seconds']:>8.1f}")


if __name__ == "__main__":
    main()

"""What one RULER sample costs on gemma3 against smollm2 at the same length, in `score` mode (answer_nll: the
gold answer teacher-forced), for FullKV alone and for the nine baselines batched on one prompt.

    .venv/bin/python benchmarks/model_cost.py --length 2048 --reps 3

Each model builds its own samples (its own tokenizer: the same text is a different number of tokens, so the
length is the suite's, in each model's tokens). The models take turns within each repetition, so a slower
moment of the machine hits them alike; per model and case, the median over repetitions of one sample's wall
time, and gemma3's ratio to smollm2's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from polykv.eval.method_protocols import baseline_plan
from polykv.eval.running.settings import suite_settings
from polykv.eval.suites import ruler
from polykv.models import load_model, num_layers
from polykv.plan import Plan

NINE = ("streamingllm", "h2o", "tova", "snapkv", "pyramidkv", "cake", "d2o", "scissorhands", "cam")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,gemma3")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--task", default="niah_single_2")
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = suite_settings(
        "ruler", {"length": args.length, "samples_per_task": 1, "tasks": [args.task], "mode": "score"}
    )
    loaded = {}
    for name in args.models.split(","):
        model, tokenizer = load_model(name)
        layers = num_layers(model)
        payload = ruler.build_samples(tokenizer, model, settings, 0)[0][2]
        cases = {"FullKV alone": [Plan.homogeneous("full", None, layers)],
                 "the nine, batched": [baseline_plan(m, args.budget, layers) for m in NINE]}  # fmt: skip
        loaded[name] = (model, payload, cases)
    times = {(name, case): [] for name, (_, _, cases) in loaded.items() for case in cases}
    for _ in range(args.reps):
        for name, (model, payload, cases) in loaded.items():
            for case, plans in cases.items():
                started = time.perf_counter()
                if len(plans) == 1:
                    ruler.score_sample(model, plans[0], payload, settings)
                else:
                    ruler.score_samples(model, plans, payload, settings)
                times[name, case].append(time.perf_counter() - started)
    print(f"RULER {args.task} at {args.length} tokens, score mode, {args.threads} threads, medians of {args.reps} reps")
    first = next(iter(loaded))
    for (name, case), values in times.items():
        median = statistics.median(values)
        ratio = median / statistics.median(times[first, case])
        prompt = len(loaded[name][1]["prompt_ids"])
        print(f"{name:8} {case:18} {median:6.2f} s  ({ratio:.2f}x {first}; prompt {prompt} tokens)")


if __name__ == "__main__":
    main()

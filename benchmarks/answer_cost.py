"""What a question-suite sample costs in each mode: `score` (answer_nll: the gold answer teacher-forced) against
`generate` (RULER's protocol) and `both`, for one plan alone and for a batch of plans on one prompt.

    .venv/bin/python benchmarks/answer_cost.py --model smollm2 --length 1024 --samples 2 --reps 2

Per task and mode: the median over interleaved repetitions of one sample's wall time (the modes take turns
within each repetition, so a slower moment of the machine hits them alike), and its ratio to `score`.
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

MODES = ("score", "generate", "both")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--tasks", default="niah_single_1,niah_multivalue,fwe")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=20, help="plans in the batched case (the nine at several budgets)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    layers = num_layers(model)
    nine = ("streamingllm", "h2o", "tova", "snapkv", "pyramidkv", "cake", "d2o", "scissorhands", "cam")
    many = [baseline_plan(m, b, layers) for b in (64, 128, 256) for m in nine][: args.batch]
    cases = {"one plan (FullKV, alone)": [Plan.homogeneous("full", None, layers)], f"{len(many)} plans": many}
    print(f"{args.model}, RULER at {args.length} tokens, {args.threads} threads, medians of {args.reps} reps")
    for task in args.tasks.split(","):
        settings = {m: suite_settings("ruler", {"length": args.length, "samples_per_task": args.samples,
                                                "tasks": [task], "mode": m}) for m in MODES}  # fmt: skip
        samples = ruler.build_samples(tokenizer, model, settings["score"], 0)
        for label, plans in cases.items():
            times: dict[str, list[float]] = {m: [] for m in MODES}
            for _ in range(args.reps):
                for mode in MODES:
                    for _, _, payload in samples:
                        started = time.perf_counter()
                        if len(plans) == 1:
                            ruler.score_sample(model, plans[0], payload, settings[mode])
                        else:
                            ruler.score_samples(model, plans, payload, settings[mode])
                        times[mode].append(time.perf_counter() - started)
            medians = {m: statistics.median(v) for m, v in times.items()}
            shown = ", ".join(f"{m} {medians[m]:.2f} s ({medians[m] / medians['score']:.2f}x)" for m in MODES)
            answer = len(samples[0][2]["answer_ids"])
            print(f"{task} ({answer} gold tokens), {label}: {shown}")


if __name__ == "__main__":
    main()

"""What a kept prompt pass saves a search: the same batch of plans on one RULER sample (the question after
compression, as the allocation study scores it) with the prompt's pass run, and replayed from
`polykv.runtime.many_plans.PromptPasses` (the objective of a workload search and of the allocation study's
calibration keeps its samples' passes: a search meets the same samples round after round).

    .venv/bin/python benchmarks/prompt_replay.py --model gemma3 --length 4096 --plans 8 --reps 3

Medians over interleaved repetitions (run, then replay, in each), their ratio, and the bytes one kept pass holds.
The answers are checked equal, bit for bit.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from polykv.eval.suites import answers, ruler
from polykv.models import load_model, num_layers
from polykv.plan import Plan
from polykv.runtime.many_plans import PromptPasses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--task", default="niah_single_1")
    parser.add_argument("--plans", type=int, default=8, help="plans in the batch (a search's rung: 8 candidates)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    layers = num_layers(model)
    settings = ruler.RulerSettings(tasks=(args.task,), length=args.length, samples_per_task=1, mode="score")
    settings = dataclasses.replace(settings, question="after-compression")
    (_, _, payload), *_ = ruler.build_samples(tokenizer, model, settings, 0)
    sample = ruler.answer_sample(payload)
    scorers = ("keydiff", "tova")
    plans = [Plan.homogeneous(scorers[i % 2], 64 + 16 * i, layers, "prefill") for i in range(args.plans)]
    kept = PromptPasses()
    answers.answer_many(model, plans, sample, "score", kept=kept)  # keeps the pass
    held = kept.get(model, torch.tensor(sample.prompt_ids[: sample.question_start])).nbytes()
    times: dict[str, list[float]] = {"run": [], "replay": []}
    for _ in range(args.reps):
        results = {}
        for case, store in (("run", None), ("replay", kept)):
            start = time.perf_counter()
            results[case] = answers.answer_many(model, plans, sample, "score", kept=store)
            times[case].append(time.perf_counter() - start)
        assert [a.nll for a in results["run"]] == [a.nll for a in results["replay"]], "replay differs"
    run, replay = statistics.median(times["run"]), statistics.median(times["replay"])
    print(
        f"{args.model}, {len(sample.prompt_ids)} prompt tokens ({sample.question_start} compressed), {args.plans} "
        f"plans, {args.reps} interleaved reps: run {run:.2f} s, replay {replay:.2f} s (x{run / replay:.1f}); "
        f"a kept pass holds {held / 2**20:.0f} MiB; answers equal bit for bit"
    )


if __name__ == "__main__":
    main()

"""Are the needles kept? For RULER needle samples, the share of each needle's tokens that every method still
holds after the prompt (and after the first decode step, for the methods that cut then), per capacity.

    python benchmarks/needle_retention.py --model smollm2 --length 2048 --samples 8 --capacities 128,256,512,1024

For each sample the prompt runs once for every plan (`polykv.runtime.many_plans`); then each plan's cache is read:
the true positions held in every layer and KV head are compared with the positions of the needle sentence's
tokens in the prompt. A method that keeps the needle in every layer and head scores 1.0; one that drops it
everywhere 0.0. It also prints how often each plan answers (greedy, as RULER scores it), so that a low score
with the needle kept (the model cannot use a sparse cache) can be told apart from a needle dropped.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from polykv.eval.suites import ruler
from polykv.eval.suites.chat import resolve
from polykv.eval.suites.ruler.common import split_answer_prefix
from polykv.methods import params_that_fit
from polykv.models import load_model, num_layers
from polykv.models.support import eos_ids
from polykv.plan import Plan
from polykv.runtime.many_plans import greedy, many

PREFILL_METHODS = ("snapkv", "pyramidkv", "tova", "h2o", "streamingllm", "cake", "scissorhands", "knorm")


def needle_positions(tokenizer, sample, use_chat: bool) -> list[int]:
    """The prompt positions of the tokens of every needle sentence (the model's ids, chat template included)."""
    family = ruler.RULER_TASKS[sample.task]
    if use_chat:
        task, prefix = split_answer_prefix(family, sample.prompt)
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": task}], tokenize=False, add_generation_prompt=True
        )
        text += prefix
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    else:
        text = sample.prompt
        encoded = tokenizer(text, return_offsets_mapping=True)
    assert encoded.input_ids == sample.prompt_ids, "the needle's text must be tokenized as the model gets it"
    spans = [(text.find(n), text.find(n) + len(n)) for n in sample.info["needles"]]
    return [i for i, (a, b) in enumerate(encoded.offset_mapping) if any(a < e and b > s for s, e in spans)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--task", default="niah_single_2")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--capacities", default="128,256,512,1024")
    parser.add_argument("--methods", default=",".join(PREFILL_METHODS))
    args = parser.parse_args()
    model, tokenizer = load_model(args.model)
    layers = num_layers(model)
    capacities = [int(c) for c in args.capacities.split(",")]
    plans = [Plan.homogeneous("full", None, layers)]
    for method in args.methods.split(","):
        for capacity in capacities:
            params = params_that_fit(method, capacity)
            plans.append(Plan.homogeneous(method, capacity, layers, "prefill", params=params))
    use_chat = resolve(tokenizer, "auto", "ruler")
    kept: dict[str, list[float]] = {p.name: [] for p in plans}
    worst: dict[str, list[float]] = {p.name: [] for p in plans}
    found: dict[str, list[float]] = {p.name: [] for p in plans}
    stop = eos_ids(model)
    for index in range(args.samples):
        sample = ruler.make_sample(tokenizer, args.task, args.length, 0, index, use_chat=use_chat)
        needle = torch.tensor(needle_positions(tokenizer, sample, use_chat))
        with torch.no_grad(), many(model, plans) as session:
            batch, logits = session.prefill(sample.prompt_ids)
            caches = list(batch.caches)
            answers = greedy(batch, logits, 24, stop)
        for plan, cache, tokens in zip(plans, caches, answers):
            shares = [
                torch.isin(needle, head).float().mean().item() for layer in cache.layers for head in layer.positions[0]
            ]
            kept[plan.name].append(statistics.fmean(shares))
            worst[plan.name].append(min(shares))
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            found[plan.name].append(float(all(answer in text for answer in sample.answers)))
        print(f"sample {index}: {len(sample.prompt_ids)} prompt tokens, needle at {needle.tolist()[:3]}...", flush=True)
    print(
        f"\n{args.model}, {args.task} at {args.length} tokens, {args.samples} samples, chat template "
        f"{'on' if use_chat else 'off'}: needle tokens held after the prompt (mean over layers and KV heads; "
        "the worst layer/head), and answers found"
    )
    print(f"{'plan':32s} {'held':>6s} {'worst':>6s} {'found':>6s}")
    for plan in plans:
        name = plan.name
        print(
            f"{name:32s} {statistics.fmean(kept[name]):6.3f} {statistics.fmean(worst[name]):6.3f} "
            f"{sum(found[name]):3.0f}/{len(found[name])}"
        )


if __name__ == "__main__":
    main()

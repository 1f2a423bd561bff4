"""Does Scissorhands keep the same positions as an older package? Kept positions of every layer and head, after
the prompt and after each of 20 decode steps, for 36 plans on each of three models, each plan alone and in a
batch (216 runs):

- capacities 16, 33, 60 and 128; scopes prefill, decode and both; three parameter sets (the defaults; history 128
  with quantile 0.75 and drop ratio 0.05; history 7 with quantile 0.5 and drop ratio 0.3);
- each plan alone (`routed`), and all of a model's plans as one batch (`polykv.runtime.many_plans`);
- a tiny GQA Llama (300-token prompt), smollm2 (400 tokens of the KJV corpus) and gemma3 (700: past its 512-token
  sliding window).

Every run feeds the same tokens after the prompt (not its own greedy choice), so a difference in the kept positions
is a difference in what the method decided, not in what it was fed. Record with the old package, compare with the
new (PYTHONPATH picks the package; this script and the test helpers come from this checkout):

    PYTHONPATH=/path/to/old/copy python benchmarks/scissorhands_exactness.py record /tmp/sh.pt
    python benchmarks/scissorhands_exactness.py compare /tmp/sh.pt          # "216/216 identical"
    python benchmarks/scissorhands_exactness.py compare /tmp/sh.pt --models tiny
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from polykv.models import cache_argument_name, load_model, num_layers
from polykv.plan import Plan
from polykv.runtime import routed
from polykv.runtime.many_plans import many

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import tiny_model  # noqa: E402

CAPACITIES = (16, 33, 60, 128)
SCOPES = ("prefill", "decode", "both")
PARAMS = (
    {},
    {"history": 128, "importance_quantile": 0.75, "drop_ratio": 0.05},
    {"history": 7, "importance_quantile": 0.5, "drop_ratio": 0.3},
)
PROMPTS = {"tiny": 300, "smollm2": 400, "gemma3": 700}
STEPS = 20
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "kjv.txt"


def plans(layers: int) -> dict[str, Plan]:
    return {
        f"cap{c}-{scope}-params{i}": Plan.homogeneous("scissorhands", c, layers, scope=scope, params=params)
        for c in CAPACITIES
        for scope in SCOPES
        for i, params in enumerate(PARAMS)
    }


def model_and_prompt(name: str):
    length = PROMPTS[name]
    if name == "tiny":
        model = tiny_model("llama", num_hidden_layers=4, num_key_value_heads=2)
        return model, torch.randint(3, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))
    model, tokenizer = load_model(name)
    ids = tokenizer(CORPUS.read_text()[:20_000], return_tensors="pt").input_ids[:, :length]
    return model, ids


def positions(cache) -> list[torch.Tensor]:
    return [layer.positions.clone() for layer in cache.layers]


@torch.inference_mode()
def alone(model, plan: Plan, ids: torch.Tensor, fed: list[int]) -> list[torch.Tensor]:
    name = cache_argument_name(model)
    with routed(model, plan) as session:
        model(ids, use_cache=True, **{name: session.cache})
        kept = positions(session.cache)
        for token in fed:
            model(torch.tensor([[token]]), use_cache=True, **{name: session.cache})
            kept += positions(session.cache)
    return kept


@torch.inference_mode()
def together(model, plans: list[Plan], ids: torch.Tensor, fed: list[int]) -> list[list[torch.Tensor]]:
    with many(model, plans) as session:
        batch, _ = session.prefill(ids[0])
        kept = [positions(cache) for cache in batch.caches]
        for token in fed:
            batch.step([token] * len(plans))
            for row, cache in zip(kept, batch.caches):
                row += positions(cache)
    return kept


def records(models: list[str]) -> dict[str, list[torch.Tensor]]:
    out = {}
    for name in models:
        model, ids = model_and_prompt(name)
        fed = torch.randint(3, model.config.vocab_size, (STEPS,), generator=torch.Generator().manual_seed(2)).tolist()
        by_label = plans(num_layers(model))
        for label, plan in by_label.items():
            out[f"{name}-{label}-alone"] = alone(model, plan, ids, fed)
        for label, kept in zip(by_label, together(model, list(by_label.values()), ids, fed)):
            out[f"{name}-{label}-batch"] = kept
        print(f"{name}: {2 * len(by_label)} runs", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["record", "compare"])
    parser.add_argument("path", type=Path)
    parser.add_argument("--models", default=",".join(PROMPTS), help="of tiny, smollm2, gemma3")
    args = parser.parse_args()
    torch.set_num_threads(2)
    results = records(args.models.split(","))
    if args.mode == "record":
        torch.save(results, args.path)
        print(f"recorded {len(results)} runs")
        return
    recorded = torch.load(args.path)
    same = 0
    for name, kept in results.items():
        old = recorded[name]
        if len(old) == len(kept) and all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(old, kept)):
            same += 1
        else:
            print("differs:", name)
    print(f"{same}/{len(results)} identical (kept positions of every layer after the prompt and each step)")


if __name__ == "__main__":
    main()

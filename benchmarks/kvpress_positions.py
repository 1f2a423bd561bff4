"""Does PolyKV keep the positions NVIDIA kvpress keeps? Prefill compression of one real prompt, every layer and KV
head, for the methods the two share.

For each method and model: PolyKV's prefill-only plan at `--capacity` runs the prompt under `routed()` and its cache
says which positions each layer and head kept; kvpress's press (compression_ratio chosen so that it keeps the same
count) runs the same prompt on the same weights in its own virtualenv (`benchmarks/.kvpress-venv`, made by
`system.py`: kvpress 0.5.5 with the transformers it supports), its `score` wrapped to record the top-k indices its
`ScorerPress.compress` keeps. A layer and head counts as identical when the two sets are equal. Where they are not,
the script says by how much the scores of the swapped positions differ in kvpress's own scores (a tie, or rounding).

    python benchmarks/kvpress_positions.py                      # smollm2, 1,024 tokens, capacity 256
    python benchmarks/kvpress_positions.py --model gemma3       # its global layers only (see below)
    python benchmarks/kvpress_positions.py --adakv 0.2          # head budgets: kvpress's AdaKVPress around each press

With `--adakv ALPHA` both sides split each layer's budget over its KV heads (PolyKV's `head_allocation: adakv`,
kvpress's `AdaKVPress(press, alpha_safeguard=ALPHA)`): kvpress's kept positions per head are those its
`masked_key_indices` do not name (it masks where PolyKV evicts), PolyKV's the slots that are not padding.

On gemma3 only the global layers are compared: kvpress compresses a Gemma3ForCausalLM's sliding layers too, over
the window its sliding cache holds, while PolyKV's local layers hold their window and evict within it.
Writes `benchmarks/results/kvpress-positions-<model>.json`: per method the count of identical layer-heads, and per
layer and head a digest of each side's kept positions (both lists in full where they differ).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
# PolyKV method -> (kvpress press, its parameters under kvpress's names)
PRESSES = {
    "keydiff": ("KeyDiffPress", {}),
    "lagkv": ("LagKVPress", {"n_sink": 4, "lag_size": 64}),
    "expected_attention": ("ExpectedAttentionPress", {}),
    "random": ("RandomPress", {"seed": 0}),
    "knorm": ("KnormPress", {}),
    "streamingllm": ("StreamingLLMPress", {"n_sink": 4}),
    "tova": ("TOVAPress", {}),
}
# PolyKV's parameters where they are not its defaults: LagKV's chunks of 64, so that at 1,024 tokens and capacity 256
# its sinks and tail (4 + 124) leave 128 slots to the chunks' ranks (with 128, 4 + 252 would fill the capacity)
POLYKV_PARAMS = {"lagkv": {"lag_size": 64}}


def digest(positions: list[int]) -> str:
    return hashlib.sha256(json.dumps(positions).encode()).hexdigest()[:16]


def prompt_ids(tokenizer, length: int) -> list[int]:
    text = (HERE.parent.parent / "shared" / "corpora" / "kjv.txt").read_text(encoding="utf-8")[:200_000]
    return tokenizer(text, add_special_tokens=True)["input_ids"][:length]


def kvpress_side(
    model_dir: str, ids: list[int], capacity: int, methods: list[str], layers: list[int], adakv: float | None = None
) -> dict:
    """Run in the kvpress venv: {method: {layer: [[kept positions] per KV head]}}."""
    sys.path.insert(1, str(HERE))
    from system import import_kvpress, keep_ratio
    from transformers import AutoModelForCausalLM, DynamicCache

    kvpress = import_kvpress()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    tokens = torch.tensor([ids])
    out = {}
    for method in methods:
        name, params = PRESSES[method]
        press = getattr(kvpress, name)(compression_ratio=keep_ratio(len(ids), capacity), **params)
        kept: dict[int, list] = {}
        original = press.score

        def score(module, hidden_states, keys, values, attentions, kwargs, original=original, kept=kept, press=press):
            scores = original(module, hidden_states, keys, values, attentions, kwargs)
            n_kept = int(keys.shape[2] * (1 - press.compression_ratio))
            kept[module.layer_idx] = scores.topk(n_kept, dim=-1).indices.sort(-1).values[0].tolist()
            return scores

        press.score = score
        if adakv is not None:
            press = kvpress.AdaKVPress(press=press, alpha_safeguard=adakv)
            compress = press.compress

            def masked(module, *args, compress=compress, kept=kept, n=len(ids), **kwargs):
                out = compress(module, *args, **kwargs)
                _, heads, seq = module.masked_key_indices
                pruned = [set() for _ in range(out[0].shape[1])]
                for head, position in zip(heads.tolist(), seq.tolist()):
                    pruned[head].add(position)
                kept[module.layer_idx] = [[p for p in range(n) if p not in gone] for gone in pruned]
                return out

            press.compress = masked
        try:
            with torch.no_grad(), press(model):
                model(tokens, past_key_values=DynamicCache(config=model.config))
            out[method] = {str(i): kept.get(i) for i in layers}
        except Exception as exc:  # noqa: BLE001 - one line per press that cannot run here
            out[method] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return out


def polykv_side(
    model, ids: list[int], capacity: int, methods: list[str], layers: list[int], adakv: float | None = None
) -> dict:
    from polykv.models import cache_argument_name
    from polykv.plan import Plan
    from polykv.runtime import routed

    out = {}
    for method in methods:
        params = POLYKV_PARAMS.get(method, {})
        plan = Plan.homogeneous(method, capacity, model.config.num_hidden_layers, "prefill", params=params)
        if adakv is not None:
            heads = {"head_allocation": "adakv", "head_allocation_params": {"alpha_safeguard": adakv}}
            plan = plan.model_copy(update=heads)
        with torch.no_grad(), routed(model, plan) as session:
            model(torch.tensor([ids]), use_cache=True, **{cache_argument_name(model): session.new_cache()})
        positions = {i: session.cache.layers[i].positions[0].sort(-1).values.tolist() for i in layers}
        out[method] = {str(i): [[p for p in head if p >= 0] for head in positions[i]] for i in layers}  # no padding
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--capacity", type=int, default=256)
    parser.add_argument("--methods", default=",".join(PRESSES))
    parser.add_argument("--adakv", type=float, help="head budgets: Ada-KV's alpha_safeguard (both sides)")
    parser.add_argument("--kvpress-side", help=argparse.SUPPRESS)  # a JSON request, in the kvpress venv
    args = parser.parse_args()
    if args.kvpress_side:
        request = json.loads(args.kvpress_side)
        print(json.dumps(kvpress_side(**request)))
        return
    from polykv.models import load_model, resolve_model_path

    sys.path.insert(1, str(HERE))
    from system import kvpress_python

    methods = args.methods.split(",")
    model, tokenizer = load_model(args.model, dtype=torch.float32)
    ids = prompt_ids(tokenizer, args.tokens)
    types = getattr(model.config, "layer_types", None)
    layers = [i for i in range(model.config.num_hidden_layers) if not types or types[i] == "full_attention"]
    ours = polykv_side(model, ids, args.capacity, methods, layers, args.adakv)
    request = {"model_dir": resolve_model_path(args.model), "ids": ids, "capacity": args.capacity}
    request |= {"methods": methods, "layers": layers, "adakv": args.adakv}
    proc = subprocess.run(
        [str(kvpress_python()), __file__, "--kvpress-side", json.dumps(request)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        sys.exit(f"kvpress side failed: {proc.stderr.strip().splitlines()[-1:]}")
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    summary, record = {}, {}
    for method in methods:
        if "error" in theirs[method]:
            summary[method] = theirs[method]["error"]
            print(f"{method:<20} kvpress could not run it: {theirs[method]['error']}")
            continue
        same = total = 0
        record[method] = {}
        for layer in map(str, layers):
            for head, (mine, kvp) in enumerate(zip(ours[method][layer], theirs[method][layer] or [])):
                total += 1
                same += mine == kvp
                # each side's kept positions as a digest; both lists in full where they differ
                entry = {"polykv": digest(mine), "kvpress": digest(kvp)}
                if mine != kvp:
                    entry |= {"polykv_kept": mine, "kvpress_kept": kvp}
                record[method][f"{layer}.{head}"] = entry
        summary[method] = {"identical": same, "compared": total}
        print(f"{method:<20} {same}/{total} layer-heads keep identical positions")
    out = HERE / "results" / f"kvpress-positions-{args.model}{'' if args.adakv is None else '-adakv'}.json"
    header = {"model": args.model, "tokens": len(ids), "capacity": args.capacity, "layers": layers}
    header |= {} if args.adakv is None else {"adakv_alpha_safeguard": args.adakv}
    out.write_text(json.dumps(header | {"summary": summary, "layer_heads": record}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()

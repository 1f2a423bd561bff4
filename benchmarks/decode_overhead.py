"""Per-step host overhead of the routed cache on a model whose decode step is bound by host-side work.

An 8B model on one GPU at batch 1 spends most of a decode step issuing small operations per layer, not
computing. A random Llama with 32 tiny layers (hidden 128) on one CPU thread reproduces that regime:
each method runs at capacity 256 on a 1,024-token prompt (decode-phase methods in decode after a full
prefill, prefill-only ones in prefill), 64 greedy steps. Each configuration runs in lockstep with a
vanilla Hugging Face run (their decode steps alternate, each timed alone), and the median of the
per-step ratios over every step of every repetition is reported.

    python benchmarks/decode_overhead.py                    # defaults above, 5 repetitions
    python benchmarks/decode_overhead.py --methods tova h2o --reps 3
    python benchmarks/decode_overhead.py --interval 8       # every evicting layer with interval 8

Set PYTHONPATH to an older copy of the package to measure it with the same script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(1, str(Path(__file__).resolve().parent))  # after PYTHONPATH: an older package copy wins
from runtime import Row, build_model, kv_bytes, lockstep, nominal_bytes, nominal_slots  # noqa: E402

from polykv.methods import REGISTRY  # noqa: E402
from polykv.plan import Phase, Plan  # noqa: E402

HOST_BOUND_CONFIG = dict(
    vocab_size=32000,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=16384,
)


def rows_for(methods: list[str], capacity: int, layers: int, interval: int) -> list[Row]:
    rows = [Row("vanilla HF", None)]
    for name in methods:
        cls = REGISTRY[name]
        if name == "full":
            rows.append(Row("full plan", Plan.homogeneous("full", None, layers)))
            continue
        phase = "decode" if Phase.DECODE in cls.phases else "prefill"
        plan = Plan.homogeneous(name, capacity, layers, phase)
        if interval > 1 and phase == "decode":
            plan = with_interval(plan, interval)
        rows.append(Row(f"{name} {phase} @{capacity}", plan))
    return rows


def benchmark(model, rows: list[Row], prompt_len: int, new_tokens: int, reps: int) -> dict[str, dict[str, list]]:
    """Every configuration in lockstep with its own vanilla run (see `lockstep`); a repetition runs
    every configuration once. Decode ratios are per pair of steps, prefill ratios per pair of runs."""
    ids = torch.randint(3, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    lockstep(model, rows[1].plan, ids[:, :256], 4)  # warm-up
    out: dict[str, dict[str, list]] = {"vanilla HF": {"decode_ms": []}}
    for row in rows[1:]:
        out[row.label] = {"prefill_x": [], "step_x": [], "decode_ms": [], "fastest_x": [], "held_over_nominal": []}
    for _ in range(reps):
        for row in rows[1:]:
            base_prefill, prefill, base_steps, steps, _, cache = lockstep(model, row.plan, ids, new_tokens)
            slots = nominal_slots(row.plan, prompt_len, new_tokens) or [prompt_len + new_tokens] * len(cache.layers)
            r = out[row.label]
            r["prefill_x"].append(prefill / base_prefill)
            r["step_x"].extend(ours / theirs for ours, theirs in zip(steps, base_steps))
            r["decode_ms"].append(statistics.median(steps) * 1e3)
            r["fastest_x"].append(min(steps) / min(base_steps))
            r["held_over_nominal"].append(kv_bytes(cache)[0] / nominal_bytes(model, slots, torch.float32))
            out["vanilla HF"]["decode_ms"].append(statistics.median(base_steps) * 1e3)
            del cache
    return out


def report(results: dict[str, dict[str, list]], title: str) -> str:
    lines = [
        title,
        f"{'configuration':<26} {'prefill x vanilla':>18} {'decode ms/tok':>14} {'decode x vanilla':>17} "
        f"{'(IQR of steps)':>15} {'fastest step x':>15} {'KV held/nominal':>16}",
    ]
    med = statistics.median
    for label, r in results.items():
        if label == "vanilla HF":
            lines.append(f"{label:<26} {'1':>18} {med(r['decode_ms']):>14.2f} {'1':>17}")
            continue
        q1, _, q3 = statistics.quantiles(r["step_x"], n=4)
        lines.append(
            f"{label:<26} {med(r['prefill_x']):>18.3f} {med(r['decode_ms']):>14.2f} {med(r['step_x']):>17.3f} "
            f"{f'{q1:.2f}..{q3:.2f}':>15} {med(r['fastest_x']):>15.3f} {med(r['held_over_nominal']):>16.4f}"
        )
    return "\n".join(lines)


def with_interval(plan: Plan, interval: int) -> Plan:
    data = plan.model_dump(mode="json")
    for layer in data["layers"]:
        if layer["decode"]["method"] != "full":
            layer["decode"]["interval"] = interval
    return Plan.model_validate(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--capacity", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--interval", type=int, default=1, help="eviction interval of every decode layer")
    parser.add_argument("--methods", nargs="*", default=list(REGISTRY), help="registry names (default: all)")
    parser.add_argument("--json", help="also write every measurement to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = HOST_BOUND_CONFIG
    model = build_model(cfg, "cpu", torch.float32)
    rows = rows_for(args.methods, args.capacity, cfg["num_hidden_layers"], args.interval)
    results = benchmark(model, rows, args.prompt_len, args.new_tokens, args.reps)
    title = (
        f"host-bound random Llama (hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, "
        f"{cfg['num_attention_heads']} heads, {cfg['num_key_value_heads']} KV heads), fp32 CPU, "
        f"{torch.get_num_threads()} thread(s); prompt {args.prompt_len}, {args.new_tokens} new tokens, "
        f"interval {args.interval}; {args.reps} repetitions, each configuration in lockstep with vanilla "
        "(median of per-step ratios)"
    )
    print(report(results, title))
    if args.json:
        Path(args.json).write_text(json.dumps({"title": title, "results": results}, indent=1))


if __name__ == "__main__":
    main()

"""Per-step host overhead of the routed cache on a model whose decode step is bound by host-side work.

An 8B model on one GPU at batch 1 spends most of a decode step issuing small operations per layer, not
computing. A random Llama with 32 tiny layers (hidden 128) on one CPU thread reproduces that regime:
each method runs at capacity 256 on a 1,024-token prompt (decode-phase methods in decode after a full
prefill, prefill-only ones in prefill), 64 greedy steps, configurations interleaved within each
repetition, medians reported as ratios to vanilla Hugging Face in the same run.

    python benchmarks/decode_overhead.py                    # defaults above, 5 repetitions
    python benchmarks/decode_overhead.py --methods tova h2o --reps 3
    python benchmarks/decode_overhead.py --interval 8       # every evicting layer with interval 8

Set PYTHONPATH to an older copy of the package to measure it with the same script.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(1, str(Path(__file__).resolve().parent))  # after PYTHONPATH: an older package copy wins
from runtime import Row, build_model, kv_bytes, nominal_bytes, nominal_slots  # noqa: E402

from polykv.methods import REGISTRY  # noqa: E402
from polykv.models import cache_argument_name, output_cache  # noqa: E402
from polykv.plan import Phase, Plan  # noqa: E402
from polykv.runtime import routed  # noqa: E402

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


@torch.no_grad()
def run_config(model, row: Row, ids: torch.Tensor, new_tokens: int):
    """Prefill s, mean decode s per token, the fastest single decode step (s; the steady state with the
    least interference from other load) and the cache."""
    with routed(model, row.plan) if row.plan is not None else contextlib.nullcontext():
        name = cache_argument_name(model)
        t0 = time.perf_counter()
        out = model(ids, use_cache=True, logits_to_keep=1)
        prefill = time.perf_counter() - t0
        cache = output_cache(out)
        token = out.logits[:, -1:].argmax(-1)
        steps = []
        for _ in range(new_tokens):
            t0 = time.perf_counter()
            out = model(token, use_cache=True, **{name: cache})
            token = out.logits[:, -1:].argmax(-1)
            steps.append(time.perf_counter() - t0)
    return prefill, sum(steps) / len(steps), min(steps), cache


def benchmark(model, rows: list[Row], prompt_len: int, new_tokens: int, reps: int) -> dict[str, dict[str, list]]:
    """Paired runs: every configuration right after its own vanilla run, so that the load of other
    processes (which drifts over seconds on a shared machine) hits both alike; ratios are per pair."""
    ids = torch.randint(3, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    run_config(model, rows[0], ids[:, :256], 4)  # warm-up
    out: dict[str, dict[str, list]] = {"vanilla HF": {"decode_ms": []}}
    for row in rows[1:]:
        out[row.label] = {"prefill_x": [], "decode_x": [], "step_x": [], "decode_ms": [], "held_over_nominal": []}
    for _ in range(reps):
        for row in rows[1:]:
            base_prefill, base_decode, base_step, _ = run_config(model, rows[0], ids, new_tokens)
            prefill, decode, step, cache = run_config(model, row, ids, new_tokens)
            slots = nominal_slots(row.plan, prompt_len, new_tokens) or [prompt_len + new_tokens] * len(cache.layers)
            r = out[row.label]
            r["prefill_x"].append(prefill / base_prefill)
            r["decode_x"].append(decode / base_decode)
            r["step_x"].append(step / base_step)
            r["decode_ms"].append(decode * 1e3)
            r["held_over_nominal"].append(kv_bytes(cache)[0] / nominal_bytes(model, slots, torch.float32))
            out["vanilla HF"]["decode_ms"].append(base_decode * 1e3)
            del cache
    return out


def report(results: dict[str, dict[str, list]], title: str) -> str:
    lines = [
        title,
        f"{'configuration':<26} {'prefill x vanilla':>18} {'decode ms/tok':>14} {'decode x vanilla':>17} "
        f"{'(min..max)':>14} {'fastest step x':>15} {'KV held/nominal':>16}",
    ]
    med = statistics.median
    for label, r in results.items():
        if label == "vanilla HF":
            lines.append(f"{label:<26} {'1':>18} {med(r['decode_ms']):>14.2f} {'1':>17}")
            continue
        spread = f"{min(r['decode_x']):.2f}..{max(r['decode_x']):.2f}"
        lines.append(
            f"{label:<26} {med(r['prefill_x']):>18.3f} {med(r['decode_ms']):>14.2f} {med(r['decode_x']):>17.3f} "
            f"{spread:>14} {med(r['step_x']):>15.3f} {med(r['held_over_nominal']):>16.4f}"
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
        f"interval {args.interval}; medians of {args.reps} paired runs (each right after its own vanilla run)"
    )
    print(report(results, title))
    if args.json:
        Path(args.json).write_text(json.dumps({"title": title, "results": results}, indent=1))


if __name__ == "__main__":
    main()

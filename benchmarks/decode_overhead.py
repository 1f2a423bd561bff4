"""Per-step host overhead of the routed cache on a model whose decode step is bound by host-side work.

An 8B model on one GPU at batch 1 spends most of a decode step issuing small operations per layer, not
computing. A random Llama with 32 tiny layers (hidden 128) on one CPU thread reproduces that regime:
each method runs at capacity 256 on a 1,024-token prompt (decode-phase methods in decode after a full
prefill, prefill-only ones in prefill), 64 greedy steps. Each configuration runs in lockstep with a
vanilla Hugging Face run (their decode steps alternate, each timed alone), and the median of the
per-step ratios over every step of every repetition is reported.

    python benchmarks/decode_overhead.py                    # defaults above, 6 repetitions
    python benchmarks/decode_overhead.py --methods tova h2o --reps 2
    python benchmarks/decode_overhead.py --interval 8       # every evicting layer with interval 8
    python benchmarks/decode_overhead.py --model smollm2 --threads 2   # a real model (30 layers, GQA 9/3)

Set PYTHONPATH to an older copy of the package to measure it with the same script.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(1, str(Path(__file__).resolve().parent))  # after PYTHONPATH: an older package copy wins
from runtime import CPU_CONFIG, Row, benchmark, build_model, cpu_name  # noqa: E402

from polykv.files import atomic_write_json  # noqa: E402
from polykv.methods import REGISTRY  # noqa: E402
from polykv.plan import Phase, Plan  # noqa: E402

# the compute-bound model's vocabulary and context, with 32 tiny layers
HOST_BOUND_CONFIG = dict(
    CPU_CONFIG, hidden_size=128, intermediate_size=256, num_hidden_layers=32, num_attention_heads=4
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


def report(rows: list[Row], title: str) -> str:
    """The table of `runtime.benchmark`'s rows (rows[0]: vanilla)."""
    lines = [
        title,
        f"{'configuration':<26} {'prefill x vanilla':>18} {'decode ms/tok':>14} {'decode x vanilla':>17} "
        f"{'(IQR of steps)':>15} {'fastest step x':>15} {'KV held/nominal':>16}",
    ]
    med = statistics.median
    lines.append(f"{rows[0].label:<26} {'1':>18} {med(rows[0].decode_s) * 1e3:>14.2f} {'1':>17}")
    for row in rows[1:]:
        q1, _, q3 = statistics.quantiles(row.step_x, n=4)
        held = med(h / n for h, n in zip(row.measured_bytes, row.nominal_bytes))
        lines.append(
            f"{row.label:<26} {med(row.prefill_x):>18.3f} {med(row.decode_s) * 1e3:>14.2f} {med(row.step_x):>17.3f} "
            f"{f'{q1:.2f}..{q3:.2f}':>15} {med(row.fastest_x):>15.3f} {held:>16.4f}"
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
    parser.add_argument("--reps", type=int, default=6, help="repetitions (even: each order of a pair equally often)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--interval", type=int, default=1, help="eviction interval of every decode layer")
    parser.add_argument("--methods", nargs="*", default=list(REGISTRY), help="registry names (default: all)")
    parser.add_argument("--json", help="also write every measurement to this JSON file")
    parser.add_argument("--model", help="a real model ('smollm2', a directory, a .gguf file) instead of the random one")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model:
        from polykv.models import load_model

        model = load_model(args.model)[0]
        cfg = model.config.to_dict()
        name = f"{args.model}"
    else:
        cfg = HOST_BOUND_CONFIG
        model = build_model(cfg, "cpu", torch.float32)
        name = "host-bound random Llama"
    rows = rows_for(args.methods, args.capacity, cfg["num_hidden_layers"], args.interval)
    benchmark(model, rows, args.prompt_len, args.new_tokens, args.reps, "cpu", torch.float32)
    title = (
        f"{name} (hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, "
        f"{cfg['num_attention_heads']} heads, {cfg['num_key_value_heads']} KV heads), fp32 {cpu_name()}, "
        f"{torch.get_num_threads()} thread(s); prompt {args.prompt_len}, {args.new_tokens} new tokens, "
        f"interval {args.interval}; {args.reps} repetitions, each configuration in lockstep with vanilla "
        "(median of per-step ratios)"
    )
    print(report(rows, title))
    if args.json:
        measured = [{k: v for k, v in dataclasses.asdict(row).items() if k != "plan"} for row in rows]
        atomic_write_json(args.json, {"title": title, "rows": measured})


if __name__ == "__main__":
    main()

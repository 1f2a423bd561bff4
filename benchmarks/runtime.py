"""Runtime overhead of the routed cache, as medians of interleaved runs.

For each configuration (vanilla Hugging Face, a `full` plan, a SnapKV prefill plan, a TOVA decode plan)
it measures prefill time on one long prompt and the per-token time of greedy decode steps, and reports
them as ratios to vanilla. It also compares the KV-cache memory actually held (tensor storage bytes)
with the nominal size implied by the plan's capacities.

    python benchmarks/runtime.py                     # CPU-sized random Llama, 4096-token prompt
    python benchmarks/runtime.py --prompt-len 1024 --reps 2   # quicker

Runs on 2-core machines vary by up to 2x. So every configuration runs in lockstep with its own vanilla
run (`lockstep`: both prefill, then their decode steps alternate, each timed alone), and the ratios are
medians over the pairs (prefill: per pair of runs; decode: per pair of steps); the seconds shown are
medians too.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from polykv.methods import REGISTRY
from polykv.models import cache_argument_name, output_cache
from polykv.plan import Phase, Plan
from polykv.runtime import routed

CPU_CONFIG = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1376,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=16384,
)


@dataclass
class Row:
    label: str
    plan: Plan | None  # None = vanilla Hugging Face
    prefill_s: list[float] = field(default_factory=list)
    decode_s: list[float] = field(default_factory=list)  # per token
    measured_bytes: list[int] = field(default_factory=list)
    nominal_bytes: list[int] = field(default_factory=list)
    prefill_x: list[float] = field(default_factory=list)  # per pair of runs (see `lockstep`)
    step_x: list[float] = field(default_factory=list)  # per pair of decode steps
    fastest_x: list[float] = field(default_factory=list)  # per pair of runs: fastest step / vanilla's fastest


def build_model(config: dict, device: str, dtype: torch.dtype, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(
            copy.deepcopy(LlamaConfig(**config)), attn_implementation="sdpa", dtype=dtype
        )
    return model.eval()


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), for the tables: ratios differ between CPUs."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.no_grad()
def run_once(
    model,
    ids: torch.Tensor,
    new_tokens: int,
    device: str,
    *,
    on_step: Callable[[Any], None] | None = None,
    positions: bool = False,
):
    """Prefill then `new_tokens` greedy steps; returns (prefill s, decode s per token, cache, logits list).

    `on_step(cache)` runs after prefill and after every decode step (its own host time is left out of
    the decode time). `positions` passes explicit position ids to the decode steps, for caches whose
    length stops being the position once they evict (kvpress presses)."""
    name = cache_argument_name(model)
    _sync(device)
    t0 = time.perf_counter()
    out = model(ids, use_cache=True, logits_to_keep=1)
    _sync(device)
    prefill = time.perf_counter() - t0
    cache = output_cache(out)
    if on_step is not None:
        on_step(cache)
    logits = [out.logits[:, -1].float()]
    token = out.logits[:, -1:].argmax(-1)
    extra: dict[str, Any] = {}
    steps = torch.arange(ids.shape[1], ids.shape[1] + new_tokens, device=ids.device).view(1, -1) if positions else None
    hook_s = 0.0
    t0 = time.perf_counter()
    for i in range(new_tokens):
        if steps is not None:
            extra["position_ids"] = steps[:, i : i + 1]
        out = model(token, use_cache=True, **{name: cache}, **extra)
        token = out.logits[:, -1:].argmax(-1)
        logits.append(out.logits[:, -1].float())
        if on_step is not None:
            t1 = time.perf_counter()
            on_step(cache)
            hook_s += time.perf_counter() - t1
    _sync(device)
    decode = (time.perf_counter() - t0 - hook_s) / new_tokens
    return prefill, decode, cache, logits


def run_config(model, row: Row, ids, new_tokens, device, **kwargs):
    if row.plan is None:
        return run_once(model, ids, new_tokens, device, **kwargs)
    with routed(model, row.plan):
        return run_once(model, ids, new_tokens, device, **kwargs)


def kv_bytes(cache) -> tuple[int, list[int]]:
    """Bytes of storage the cache's keys and values really hold, in total and per layer: a storage that
    keys and values share is counted once, and one that layers share (layers merging together, see
    `polykv.runtime.merges`) once in the total and in equal parts per layer."""
    layers = [
        {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in (layer.keys, layer.values)}
        for layer in cache.layers
    ]
    sharers = collections.Counter(ptr for storages in layers for ptr in storages)
    per_layer = [round(sum(size / sharers[ptr] for ptr, size in storages.items())) for storages in layers]
    return sum({ptr: size for storages in layers for ptr, size in storages.items()}.values()), per_layer


def nominal_slots(plan: Plan | None, prompt_len: int, new_tokens: int) -> list[int]:
    """Slots per layer that the plan implies after prefill and `new_tokens` decode steps."""
    layers = plan.layers if plan is not None else None
    if layers is None:
        return []
    slots = []
    for layer in layers:
        cap_p, cap_d = layer[Phase.PREFILL].capacity, layer[Phase.DECODE].capacity
        after_prefill = prompt_len if cap_p is None else min(cap_p, prompt_len)
        grown = after_prefill + new_tokens
        slots.append(grown if cap_d is None else min(cap_d, grown))
    return slots


def nominal_bytes(model, slots: list[int], dtype: torch.dtype) -> int:
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_slot = 2 * cfg.num_key_value_heads * head_dim * torch.finfo(dtype).bits // 8
    return sum(slots) * per_slot


def standard_rows(num_layers: int, capacity: int) -> list[Row]:
    return [
        Row("vanilla HF", None),
        Row("full plan", Plan.homogeneous("full", None, num_layers)),
        Row(f"snapkv prefill @{capacity}", Plan.homogeneous("snapkv", capacity, num_layers, "prefill")),
        Row(f"tova decode @{capacity}", Plan.homogeneous("tova", capacity, num_layers, "decode")),
    ]


def method_rows(num_layers: int, capacity: int, skip: tuple[str, ...] = ("full", "tova", "snapkv")) -> list[Row]:
    """One row per method at `capacity` (those not in the standard rows): decode-phase methods in the
    decode phase, prefill-only ones in prefill."""
    rows = []
    for name, cls in REGISTRY.items():
        if name in skip:
            continue
        phase = "decode" if Phase.DECODE in cls.phases else "prefill"
        rows.append(Row(f"{name} {phase} @{capacity}", Plan.homogeneous(name, capacity, num_layers, phase)))
    return rows


@torch.no_grad()
def lockstep(model, plan: Plan, ids: torch.Tensor, new_tokens: int, device: str = "cpu", plan_first: bool = False):
    """Vanilla Hugging Face and the plan side by side: both prefill the prompt, then they take their
    greedy decode steps in turn (a vanilla step, the plan's step, ...), each timed alone. Load from
    other processes drifts over milliseconds to seconds on a shared machine, so the two steps of a pair
    see nearly the same load. `plan_first`: the plan's prefill and steps go first in each pair (the
    second of a pair runs beside the first one's cache, a bias of about 2% in prefill on this project's
    CPU machine: `benchmark` alternates the order). Returns vanilla's and the plan's prefill seconds, their
    step seconds and their caches."""
    name = cache_argument_name(model)
    order = (1, 0) if plan_first else (0, 1)
    prefill, caches, tokens = [0.0, 0.0], [None, None], [None, None]
    for side in order:
        with routed(model, plan) if side else contextlib.nullcontext():
            _sync(device)
            t0 = time.perf_counter()
            out = model(ids, use_cache=True, logits_to_keep=1)
            _sync(device)
            prefill[side] = time.perf_counter() - t0
        caches[side] = output_cache(out)
        tokens[side] = out.logits[:, -1:].argmax(-1)
    steps: list[list[float]] = [[], []]
    for _ in range(new_tokens):
        for side in order:
            with routed(model, plan) if side else contextlib.nullcontext():  # entered outside the timing
                _sync(device)
                t0 = time.perf_counter()
                out = model(tokens[side], use_cache=True, **{name: caches[side]})
                tokens[side] = out.logits[:, -1:].argmax(-1)
                _sync(device)
                steps[side].append(time.perf_counter() - t0)
    return prefill[0], prefill[1], steps[0], steps[1], caches[0], caches[1]


def benchmark(model, rows: list[Row], prompt_len: int, new_tokens: int, reps: int, device: str, dtype, seed=0):
    """Every configuration in lockstep with its own vanilla run (`lockstep`), each repetition running every
    configuration once, the plan first in every other repetition; rows[0] is vanilla and collects the
    vanilla side of every pair."""
    ids = torch.randint(3, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(seed)).to(
        device
    )
    lockstep(model, rows[1].plan, ids[:, :256], 4, device)  # warm-up: kernels, allocator
    base = rows[0]
    for rep in range(reps):
        for row in rows[1:]:
            base_prefill, prefill, base_steps, steps, base_cache, cache = lockstep(
                model, row.plan, ids, new_tokens, device, plan_first=rep % 2 == 1
            )
            for r, p, st, c in ((base, base_prefill, base_steps, base_cache), (row, prefill, steps, cache)):
                r.prefill_s.append(p)
                r.decode_s.append(statistics.median(st))
                r.measured_bytes.append(kv_bytes(c)[0])
                slots = nominal_slots(r.plan, prompt_len, new_tokens) or [prompt_len + new_tokens] * len(c.layers)
                r.nominal_bytes.append(nominal_bytes(model, slots, dtype))
            row.prefill_x.append(prefill / base_prefill)
            row.step_x.extend(ours / theirs for ours, theirs in zip(steps, base_steps))
            row.fastest_x.append(min(steps) / min(base_steps))
            del cache, base_cache
    return rows


def report(rows: list[Row], title: str) -> str:
    base = rows[0]
    base_prefill, base_decode = statistics.median(base.prefill_s), statistics.median(base.decode_s)
    lines = [
        title,
        f"{'configuration':<26} {'prefill s':>10} {'x vanilla':>10} {'decode ms/tok':>14} {'x vanilla':>10} "
        f"{'KV MiB held':>12} {'KV MiB nominal':>15} {'held/nominal':>13}",
    ]
    for row in rows:
        prefill, decode = statistics.median(row.prefill_s), statistics.median(row.decode_s)
        held, nominal = statistics.median(row.measured_bytes), statistics.median(row.nominal_bytes)
        # ratios of paired runs and steps (1 for vanilla itself)
        prefill_x = statistics.median(row.prefill_x) if row.prefill_x else prefill / base_prefill
        decode_x = statistics.median(row.step_x) if row.step_x else decode / base_decode
        lines.append(
            f"{row.label:<26} {prefill:>10.3f} {prefill_x:>10.3f} {decode * 1e3:>14.2f} "
            f"{decode_x:>10.3f} {held / 2**20:>12.2f} {nominal / 2**20:>15.2f} {held / nominal:>13.4f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-len", type=int, default=4096)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--capacity", type=int, default=256)
    parser.add_argument("--reps", type=int, default=6, help="repetitions (even: each order of a pair equally often)")
    parser.add_argument("--methods", action="store_true", help="add one row per method (decode-phase capacity)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_model(CPU_CONFIG, "cpu", torch.float32)
    rows = standard_rows(CPU_CONFIG["num_hidden_layers"], args.capacity)
    if args.methods:
        rows += method_rows(CPU_CONFIG["num_hidden_layers"], args.capacity)
    benchmark(model, rows, args.prompt_len, args.new_tokens, args.reps, "cpu", torch.float32)
    cfg = CPU_CONFIG
    title = (
        f"random Llama (hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, "
        f"{cfg['num_attention_heads']} heads, {cfg['num_key_value_heads']} KV heads), fp32 {cpu_name()}, "
        f"{torch.get_num_threads()} threads; prompt {args.prompt_len}, "
        f"{args.new_tokens} new tokens; {args.reps} repetitions, each configuration in lockstep with vanilla"
    )
    print(report(rows, title))


if __name__ == "__main__":
    main()

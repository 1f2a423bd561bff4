"""Can torch.compile capture one layer's routed decode step (cache update, attention, method, eviction)?

For each method, a routed layer is brought to steady decode (holding its capacity, one token evicted per
step); then `torch._dynamo.explain` reports the graphs and graph breaks of one step, and the compiled
step runs for a number of steps beside the eager one on a copy of the same layer: outputs and kept
positions must agree. Prints, per method: graphs, graph breaks (with the first reasons), recompiles,
graphs compiled over the run (recompiles included), the largest output difference and eager vs
compiled time per step (CPU, inductor).

    python benchmarks/decode_compile.py                  # tova, streamingllm
    python benchmarks/decode_compile.py --methods tova h2o knorm --steps 30
"""

from __future__ import annotations

import argparse
import copy
import time
from types import SimpleNamespace

import torch

from polykv.methods import make_method
from polykv.plan import PhaseAssignment
from polykv.runtime.attention import polykv_attention
from polykv.runtime.cache import RoutedLayer

B, KV_HEADS, HEADS, HEAD_DIM, PROMPT, CAPACITY = 1, 2, 4, 32, 512, 128


def make_layer(method: str, generator: torch.Generator):
    module = SimpleNamespace(layer_idx=0, num_key_value_groups=HEADS // KV_HEADS, scaling=HEAD_DIM**-0.5)
    decode = make_method(PhaseAssignment(method=method, capacity=CAPACITY))
    layer = RoutedLayer(0, make_method(PhaseAssignment(method="full")), decode)
    keys, values = (torch.randn(B, KV_HEADS, PROMPT, HEAD_DIM, generator=generator) for _ in range(2))
    layer.update(keys, values)
    polykv_attention(module, torch.randn(B, HEADS, PROMPT, HEAD_DIM, generator=generator), keys, values, None)
    for _ in range(3):  # the first step cuts the prompt, the next ones reach the steady state
        step(layer, module, *inputs(generator))
    return layer, module


def inputs(generator: torch.Generator):
    return (
        torch.randn(B, KV_HEADS, 1, HEAD_DIM, generator=generator),
        torch.randn(B, KV_HEADS, 1, HEAD_DIM, generator=generator),
        torch.randn(B, HEADS, 1, HEAD_DIM, generator=generator),
    )


def step(layer, module, key, value, query):
    """One decode step of one layer, as the model runs it: update the cache, then attend."""
    keys, values = layer.update(key, value)
    out, _ = polykv_attention(module, query, keys, values, None)
    return out


def check(method: str, steps: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    layer, module = make_layer(method, generator)
    explained = torch._dynamo.explain(step)(copy.deepcopy(layer), module, *inputs(generator))
    reasons = [str(b.reason).splitlines()[0][:160] for b in explained.break_reasons]
    torch._dynamo.reset()
    eager_layer, compiled_layer = layer, copy.deepcopy(layer)
    compiled = torch.compile(step)
    torch._dynamo.utils.counters.clear()
    worst, same_positions, eager_s, compiled_s = 0.0, True, 0.0, 0.0
    for i in range(steps):
        args = inputs(generator)
        t0 = time.perf_counter()
        expected = step(eager_layer, module, *args)
        t1 = time.perf_counter()
        got = compiled(compiled_layer, module, *args)
        t2 = time.perf_counter()
        if i >= steps // 2:  # after warm-up and recompiles
            eager_s, compiled_s = eager_s + t1 - t0, compiled_s + t2 - t1
        worst = max(worst, (expected - got).abs().max().item())
        same_positions &= torch.equal(eager_layer.positions.sort(-1).values, compiled_layer.positions.sort(-1).values)
    timed = steps - steps // 2
    return {
        "method": method,
        "graphs": explained.graph_count,
        "breaks": explained.graph_break_count,
        "reasons": reasons,
        # graphs compiled over the run: 1 + recompiles (the first change of the true length makes it symbolic)
        "compiled_graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
        "max_diff": worst,
        "same_positions": same_positions,
        "eager_us": eager_s / timed * 1e6,
        "compiled_us": compiled_s / timed * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="*", default=["tova", "streamingllm"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for method in args.methods:
        try:
            r = check(method, args.steps)
        except torch._dynamo.exc.BackendCompilerFailed as exc:  # say what blocks it, go on with the others
            reason = next((line for line in str(exc).splitlines() if "Error" in line), str(exc).splitlines()[0])
            print(f"{method}: compilation failed: {reason.strip()[:300]}")
            continue
        print(
            f"{r['method']}: {r['graphs']} graph(s), {r['breaks']} graph break(s); "
            f"{r['compiled_graphs']} compiled over {args.steps} steps; "
            f"max |eager - compiled| {r['max_diff']:.2e}, same kept positions: {r['same_positions']}; "
            f"eager {r['eager_us']:.0f} us/step, compiled {r['compiled_us']:.0f} us/step"
        )
        for reason in dict.fromkeys(r["reasons"]):
            print(f"    break: {reason}")


if __name__ == "__main__":
    main()

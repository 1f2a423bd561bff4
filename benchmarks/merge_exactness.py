"""Are a merging method's numbers the same as an older package's, bit for bit?

Runs D2O or CaM under many plans (capacities, parameters, GQA, batch rows, prefill methods that leave
layers with different slots, native allocation, intervals, bf16, a cache reset between two sequences,
`generate`, many plans as one batch) on tiny random models of three families, and records every logit of
every step and, at the end, every layer's positions, keys, values and method state. Record with the old
package, compare with the new one (PYTHONPATH picks the package; this script and the test helpers it
uses come from this checkout):

    PYTHONPATH=/path/to/old/copy python benchmarks/merge_exactness.py d2o record /tmp/d2o.pt
    python benchmarks/merge_exactness.py d2o compare /tmp/d2o.pt       # "63/63 identical"

A record that differs says whether its integers (kept positions, generated tokens) are the same and how far
apart its floats are.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from polykv.models import cache_argument_name
from polykv.plan import Plan
from polykv.runtime import routed
from polykv.runtime.many_plans import generate_many

# The package is imported (from PYTHONPATH or the install); the test helpers come from this checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import cache_state, decode_logits, identical, plan_of, prompt, tiny_model  # noqa: E402

# capacities and parameters per method: CaM's usual step needs more than sinks + merge budget slots
SETTINGS = {
    "d2o": dict(
        capacities=(12, 40, 39),
        small=12,
        mid=16,
        params=[dict(sinks=0, heavy_ratio=1.0, alpha=0.0), dict(sinks=2, heavy_ratio=0.25, alpha=0.9)],
    ),
    "cam": dict(
        capacities=(12, 26, 40, 39),
        small=24,
        mid=24,
        params=[dict(sinks=0, merge_budget=4, seed=3), dict(sinks=2, merge_budget=8)],
    ),
}


def _run(model, plan, ids, steps) -> list[torch.Tensor]:
    with routed(model, plan):
        logits, cache = decode_logits(model, ids, steps, cache_argument_name(model))
    return [t.clone() for t in logits] + cache_state(cache)


def _edit(plan: Plan, edit) -> Plan:
    data = plan.model_dump(mode="json")
    edit(data)
    return Plan.model_validate(data)


def configurations(method: str) -> dict:
    s = SETTINGS[method]
    small, mid = s["small"], s["mid"]
    runs = {}
    for family in ("llama", "qwen3", "mistral"):
        for kv_heads in (1, 2, 4):
            for batch in (1, 2):
                for capacity in s["capacities"]:

                    def homogeneous(family=family, kv_heads=kv_heads, batch=batch, capacity=capacity):
                        model = tiny_model(family, num_hidden_layers=4, num_key_value_heads=kv_heads)
                        plan = Plan.homogeneous(method, capacity, 4, scope="decode")
                        return _run(model, plan, prompt(model, length=40, batch=batch), 24)

                    runs[f"{family}-kv{kv_heads}-b{batch}-cap{capacity}"] = homogeneous

    def six_layers(plan):
        model = tiny_model("llama", num_hidden_layers=6)
        return _run(model, plan, prompt(model, length=48), 30)

    mixed = [method, method, "h2o", method, method, "tova"]
    runs["mixed"] = lambda: six_layers(plan_of(mixed, [mid] * 4 + [mid + 4, mid]))

    def with_params(data):
        for i, params in enumerate(s["params"]):
            for layer in data["layers"][2 * i : 2 * i + 2]:
                layer["decode"]["params"] = params

    runs["params"] = lambda: six_layers(_edit(Plan.homogeneous(method, mid, 6, scope="decode"), with_params))
    if method == "d2o":
        runs["native"] = lambda: six_layers(Plan.homogeneous(method, mid, 6, scope="decode", allocation="native"))

    def with_interval(data):
        for layer in data["layers"][:2]:
            layer["decode"]["interval"] = 3

    def interval():
        model = tiny_model("llama", num_hidden_layers=4)
        plan = _edit(Plan.homogeneous(method, mid, 4, scope="decode"), with_interval)
        return _run(model, plan, prompt(model, length=48), 30)

    runs["interval"] = interval

    def with_prefill(data):
        data["scope"] = "both"
        for layer, capacity in zip(data["layers"], (14, 30, 22, 30, 25)):
            layer["prefill"] = {"method": "snapkv", "capacity": capacity, "params": {"window": 4}}

    def prefill_differs():
        model = tiny_model("llama", num_hidden_layers=5)
        plan = _edit(Plan.homogeneous(method, 24, 5, scope="decode"), with_prefill)
        return _run(model, plan, prompt(model, length=48), 30)

    runs["prefill-differs"] = prefill_differs

    def bf16():
        model = tiny_model("llama", num_hidden_layers=4).to(torch.bfloat16)
        return _run(model, Plan.homogeneous(method, small, 4, scope="decode"), prompt(model, length=40), 20)

    runs["bf16"] = bf16

    def reset():
        model = tiny_model("llama", num_hidden_layers=4)
        name = cache_argument_name(model)
        with routed(model, Plan.homogeneous(method, small, 4, scope="decode")):
            first, cache = decode_logits(model, prompt(model, length=40), 20, name)
            state = cache_state(cache)
            cache.reset()
            second, cache = decode_logits(model, prompt(model, length=44, seed=5), 20, name, cache=cache)
        return first + state + second + cache_state(cache)

    runs["reset"] = reset

    def generate():
        model = tiny_model("llama", num_hidden_layers=4)
        with routed(model, Plan.homogeneous(method, small, 4, scope="decode")) as session:
            out = model.generate(prompt(model, length=40), max_new_tokens=24, do_sample=False, min_new_tokens=24)
        return [out] + cache_state(session.cache)

    runs["generate"] = generate

    def many():
        model = tiny_model("llama", num_hidden_layers=4)
        plans = [Plan.homogeneous(method, c, 4, scope="decode") for c in (8, small, small, 30)]
        plans.append(Plan.homogeneous("h2o", 12, 4, scope="decode"))
        return [torch.tensor(generate_many(model, plans, prompt(model, length=40)[0].tolist(), 24, min_new_tokens=24))]

    runs["many"] = many
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("method", choices=sorted(SETTINGS))
    parser.add_argument("mode", choices=["record", "compare"])
    parser.add_argument("path", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {name: run() for name, run in configurations(args.method).items()}
    if args.mode == "record":
        torch.save(results, args.path)
        print(f"recorded {len(results)} configurations")
        return
    recorded = torch.load(args.path)
    differ = [name for name, tensors in results.items() if not identical(recorded[name], tensors)]
    for name in differ:
        print("differs:", name, _how(recorded[name], results[name]))
    print(f"{len(results) - len(differ)}/{len(results)} identical")


def _how(old: list[torch.Tensor], new: list[torch.Tensor]) -> str:
    """How two records differ: whether their integers (positions, tokens) are the same, and how far apart their
    floats (logits, keys, values, states) are at most."""
    if len(old) != len(new) or any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(old, new)):
        return "(different shapes)"
    pairs = list(zip(old, new))
    integers = all(torch.equal(a, b) for a, b in pairs if not a.is_floating_point())
    gap = max(((a.double() - b.double()).abs().max().item() for a, b in pairs if a.is_floating_point()), default=0.0)
    return f"(integers {'identical' if integers else 'DIFFER'}; floats at most {gap:.2g} apart)"


if __name__ == "__main__":
    main()

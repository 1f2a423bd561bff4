"""Invariants every method must keep, parametrized over the whole registry."""

from __future__ import annotations

import pytest
import torch

from polykv.methods import REGISTRY
from polykv.models import cache_argument_name
from polykv.plan import LayerPlan, Phase, PhaseAssignment, Plan, Scope
from polykv.runtime import routed
from tests.helpers import decode_logits, tiny_model

METHODS = sorted(REGISTRY)
# Small windows so that every method's parameters fit the small capacities used here.
SMALL = {"snapkv": {"window": 4}, "pyramidkv": {"window": 4}, "cake": {"window": 4}, "lagkv": {"lag_size": 4}}


def assignment(method: str, phase: Phase, capacity: int) -> PhaseAssignment:
    if method == "full":
        return PhaseAssignment(method="full")
    return PhaseAssignment(method=method, capacity=capacity, params=SMALL.get(method, {}))


def mixed_plan(method: str, num_layers: int, capacity: int) -> Plan:
    """`method` in every phase it declares on even layers, other methods on odd layers."""
    layers = []
    for idx in range(num_layers):
        if idx % 2 == 0:
            layers.append(
                LayerPlan(
                    **{
                        p.value: assignment(method if p in REGISTRY[method].phases else "full", p, capacity)
                        for p in Phase
                    }
                )
            )
        else:
            layers.append(
                LayerPlan(
                    prefill=assignment("snapkv", Phase.PREFILL, capacity),
                    decode=assignment("tova", Phase.DECODE, capacity),
                )
            )
    return Plan(name=f"mixed-{method}", scope=Scope.BOTH, layers=layers)


def step_through(model, plan: Plan, ids: torch.Tensor, steps: int):
    """Prefill + greedy decode; yields the cache after prefill and after every step."""
    name = cache_argument_name(model)
    with routed(model, plan) as session, torch.no_grad():
        out = model(ids, use_cache=True)
        yield session.cache, out.logits
        token = out.logits[:, -1:].argmax(-1)
        for _ in range(steps):
            out = model(token, use_cache=True, **{name: session.cache})
            token = out.logits[:, -1:].argmax(-1)
            yield session.cache, out.logits


def capacities(plan: Plan, phase: Phase) -> list[int | None]:
    return [layer[phase].capacity for layer in plan.layers]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("method", METHODS)
def test_retained_never_exceeds_capacity_in_a_mixed_plan(method, family):
    model = tiny_model(family, num_hidden_layers=4)
    plan = mixed_plan(method, 4, capacity=24)
    ids = torch.randint(3, 96, (1, 60), generator=torch.Generator().manual_seed(3))
    for step, (cache, logits) in enumerate(step_through(model, plan, ids, steps=20)):
        phase = Phase.PREFILL if step == 0 else Phase.DECODE
        for held, cap in zip(cache.retained_per_layer(), capacities(plan, phase)):
            if cap is not None:
                assert held <= cap, (method, step, held, cap)
        assert torch.isfinite(logits).all()


@pytest.mark.parametrize("method", METHODS)
def test_runs_in_a_mixed_plan_on_the_demo_model(method, demo_model):
    model, tokenizer = demo_model
    plan = mixed_plan(method, model.config.num_hidden_layers, capacity=32)
    ids = tokenizer(" ".join(["The cat sat on the mat and looked at the sun."] * 8), return_tensors="pt").input_ids
    with routed(model, plan) as session:
        out = model.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 24
    held = session.cache.retained_per_layer()
    for idx, layer in enumerate(plan.layers):
        if layer.decode.method != "full":
            assert held[idx] <= layer.decode.capacity


@pytest.mark.parametrize("method", [m for m in METHODS if m != "full"])
def test_long_decode_stays_finite(method):
    model = tiny_model("llama", num_hidden_layers=2)
    phases = REGISTRY[method].phases
    scope = Scope.BOTH if len(phases) == 2 else Scope(next(iter(phases)).value)
    plan = Plan.homogeneous(method, 16, 2, scope, SMALL.get(method, {}))
    ids = torch.randint(3, 96, (1, 40), generator=torch.Generator().manual_seed(4))
    last = None
    for cache, logits in step_through(model, plan, ids, steps=200):
        last = cache
        assert torch.isfinite(logits).all()
    for layer in last.layers:
        assert torch.isfinite(layer.keys).all() and torch.isfinite(layer.values).all()
    assert last.get_seq_length() == 240


@pytest.mark.parametrize("method", METHODS)
def test_deterministic_for_a_fixed_seed(method):
    model = tiny_model("llama", num_hidden_layers=2)
    plan = mixed_plan(method, 2, capacity=12)
    ids = torch.randint(3, 96, (1, 30), generator=torch.Generator().manual_seed(5))
    runs = []
    for _ in range(2):
        with routed(model, plan) as session:
            logits, _ = decode_logits(model, ids, 12, cache_argument_name(model))
        runs.append((logits, [layer.values.clone() for layer in session.cache.layers]))
    for a, b in zip(runs[0][0], runs[1][0]):
        assert torch.equal(a, b)
    for a, b in zip(runs[0][1], runs[1][1]):
        assert torch.equal(a, b)

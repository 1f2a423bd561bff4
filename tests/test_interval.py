"""The eviction interval of a decode plan entry: k > 1 evicts k tokens at once every k steps."""

from __future__ import annotations

import pytest
import torch

from polykv.methods import REGISTRY, params_that_fit
from polykv.models import cache_argument_name
from polykv.plan import Phase, Plan, PlanError
from polykv.runtime import routed
from tests.helpers import decode_sizes, prompt, run_routed, tiny_model

PROMPT, CAPACITY, STEPS = 40, 16, 13
EVERY_STEP = ["streamingllm", "tova", "h2o", "d2o", "cam", "knorm", "cake"]  # one token per step at interval 1


def _plan(method: str, interval: int, scope: str = "decode") -> Plan:
    plan = Plan.homogeneous(method, CAPACITY, 3, scope, params_that_fit(method, CAPACITY))
    data = plan.to_dict()
    for layer in data["layers"]:
        layer["decode"]["interval"] = interval
    return Plan.from_dict(data)


def test_interval_defaults_to_one_and_is_left_out_of_the_file():
    plan = Plan.homogeneous("h2o", CAPACITY, 3, "decode")
    assert plan.layers[0].decode.interval == 1
    assert "interval" not in plan.to_json()
    spaced = _plan("h2o", 8)
    again = Plan.from_json(spaced.to_json())
    assert again == spaced and again.layers[0].decode.interval == 8
    assert str(again.layers[0].decode) == "h2o@16 every 8 steps"
    assert any("every 8 steps x3" in line for line in again.summary().lines())
    assert not any("interval" in line for line in plan.summary().lines())


@pytest.mark.parametrize("bad", [0, -1, 2.0, "4", True, None])
def test_interval_must_be_a_positive_integer(bad):
    data = Plan.homogeneous("h2o", CAPACITY, 3, "decode").to_dict()
    data["layers"][0]["decode"]["interval"] = bad
    with pytest.raises(PlanError, match="interval"):
        Plan.from_dict(data)


def test_interval_in_prefill_is_refused():
    data = Plan.homogeneous("tova", CAPACITY, 3, "both").to_dict()
    data["layers"][1]["prefill"]["interval"] = 4
    problems = Plan.from_dict(data).problems(3, REGISTRY)
    assert problems == [
        "layer 1, prefill, interval: an eviction interval applies to the decode phase only (prefill evicts once, "
        "at the end of the prompt); leave it out or set 1 (got 4)"
    ]


@pytest.mark.parametrize("method", ["tova", "h2o", "d2o"])
def test_interval_one_is_the_per_step_rule(method):
    model = tiny_model("llama")
    ids = prompt(model, PROMPT)
    default, _ = run_routed(
        model, Plan.homogeneous(method, CAPACITY, 3, "decode", params_that_fit(method, CAPACITY)), ids
    )
    explicit, _ = run_routed(model, _plan(method, 1), ids)
    assert all(torch.equal(a, b) for a, b in zip(default, explicit))


@pytest.mark.parametrize("method", EVERY_STEP)
@pytest.mark.parametrize("interval", [2, 4])
def test_interval_k_evicts_k_tokens_every_k_steps(method, interval):
    model = tiny_model("llama")
    sizes, cache = decode_sizes(model, _plan(method, interval), prompt(model, PROMPT), STEPS)
    # Step 1 cuts the whole prompt to the capacity; then the layer grows for k - 1 steps and the k-th
    # step, holding capacity + k slots, evicts k of them.
    for step, retained in enumerate(sizes[1:], start=1):
        assert retained == [CAPACITY + (step - 1) % interval] * 3, f"step {step}"
    assert cache.get_seq_length() == PROMPT + STEPS


def test_scissorhands_with_an_interval_stays_within_capacity_plus_interval():
    model = tiny_model("llama")
    sizes, _ = decode_sizes(model, _plan("scissorhands", 4), prompt(model, PROMPT), STEPS)
    assert all(CAPACITY - 4 <= r <= CAPACITY + 3 for step in sizes[1:] for r in step)


def test_streamingllm_with_an_interval_keeps_sinks_and_the_most_recent():
    model = tiny_model("llama")
    name = cache_argument_name(model)
    sinks = params_that_fit("streamingllm", CAPACITY).get("sinks", 4)
    with routed(model, _plan("streamingllm", 4)) as session, torch.no_grad():
        out = model(prompt(model, PROMPT), use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        for _ in range(STEPS):
            out = model(token, use_cache=True, **{name: session.cache})
            token = out.logits[:, -1:].argmax(-1)
            seen = session.cache.get_seq_length()
            for layer in session.cache.layers:
                held = layer.retained
                expected = list(range(sinks)) + list(range(seen - (held - sinks), seen))
                assert layer.positions[0, 0].sort().values.tolist() == expected


@pytest.mark.parametrize("method", EVERY_STEP)
def test_interval_decode_still_makes_no_host_sync(method, monkeypatch):
    model = tiny_model("llama")
    name = cache_argument_name(model)
    with routed(model, _plan(method, 4)) as session, torch.no_grad():
        out = model(prompt(model, PROMPT), use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        with monkeypatch.context() as patch:
            for attr in ("item", "tolist", "cpu", "__bool__", "__int__", "__float__"):
                patch.setattr(torch.Tensor, attr, _raiser(attr))
            for _ in range(6):
                out = model(token, use_cache=True, **{name: session.cache})
                token = out.logits[:, -1:].argmax(-1)


def _raiser(name):
    def call(*args, **kwargs):
        raise AssertionError(f"torch.Tensor.{name} called during a decode step")

    return call


def test_phase_of_an_interval_is_decode():
    assert _plan("tova", 4).layers[0][Phase.DECODE].interval == 4
    assert _plan("tova", 4, "both").layers[0][Phase.PREFILL].interval == 1

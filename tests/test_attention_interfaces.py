"""What PolyKV's attention talks to is declared: an attention step (`polykv.runtime.attention_step.attend`) reads and
calls on its layer only what `SlotHoldingLayer` declares, on every path (decode, prompt, masked, local windows,
merges, recorders, many plans at once)."""

from __future__ import annotations

import pytest
import torch

from polykv.methods import params_that_fit
from polykv.models import cache_argument_name
from polykv.plan import Plan
from polykv.runtime import attention_step, many_plans, routed
from polykv.runtime.attention import record_attention, record_entropy
from polykv.runtime.attention_step import SlotHoldingLayer
from polykv.runtime.cache import RoutedLayer
from tests.helpers import decode_logits, prompt, tiny_model


def _declared(protocol) -> set[str]:
    return set(protocol.__annotations__) | {name for name in vars(protocol) if not name.startswith("_")}


DECLARED = _declared(SlotHoldingLayer)


class OnlyDeclared:
    """A routed layer seen through `SlotHoldingLayer`: any other attribute read or written fails."""

    def __init__(self, layer: RoutedLayer):
        object.__setattr__(self, "_layer", layer)

    def __getattr__(self, name):
        if name not in DECLARED:
            raise AssertionError(f"attend used {name!r}, which SlotHoldingLayer does not declare")
        return getattr(self._layer, name)

    def __setattr__(self, name, value):
        if name not in DECLARED:
            raise AssertionError(f"attend set {name!r}, which SlotHoldingLayer does not declare")
        setattr(self._layer, name, value)


@pytest.fixture
def declared_only(monkeypatch):
    """Every attention step sees its layer through `OnlyDeclared`."""
    attend, shared = attention_step.attend, attention_step.step_on_shared_prompt
    monkeypatch.setattr(RoutedLayer, "attend", lambda self, *args: attend(OnlyDeclared(self), *args))
    monkeypatch.setattr(many_plans, "attend", lambda layer, *args: attend(OnlyDeclared(layer), *args))
    monkeypatch.setattr(many_plans, "step_on_shared_prompt", lambda layer, *args: shared(OnlyDeclared(layer), *args))


def _plans(layers: int) -> list[Plan]:
    capacity = 16
    plans = [Plan.homogeneous("full", None, layers)]
    for method, scope in (("tova", "decode"), ("h2o", "both"), ("snapkv", "prefill"), ("d2o", "decode")):
        plans.append(Plan.homogeneous(method, capacity, layers, scope, params_that_fit(method, capacity)))
    return plans


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_an_attention_step_uses_only_what_slot_holding_layer_declares(family, declared_only):
    overrides = {"sliding_window": 24} if family == "mistral" else {}  # a local layer: its window's paths
    model = tiny_model(family, **overrides)
    ids, name = prompt(model, length=40), cache_argument_name(model)
    plans = _plans(model.config.num_hidden_layers)
    for plan in plans:
        with routed(model, plan), torch.no_grad():
            decode_logits(model, ids, 4, name)
            _, cache = decode_logits(model, ids, 0, name)
            model(ids[:, :3], use_cache=True, **{name: cache})  # a block of tokens after the prompt: masked
    with routed(model, plans[1]), record_attention(), record_entropy(), torch.no_grad():
        decode_logits(model, ids, 2, name)
    many_plans.generate_many(model, plans, ids[0].tolist(), 4)  # one prompt pass, then rows of many plans

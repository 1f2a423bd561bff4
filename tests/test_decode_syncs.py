"""A decode step makes no host-device synchronisation: no .item(), .tolist(), .cpu(), and no Python
branch on a tensor's value (bool / int / float of a tensor), in the model or in PolyKV.

On a GPU each of those stalls the host until the device catches up, which is what makes an 8B model's
batch-1 decode host-bound; they also break CUDA-graph capture. The calls are patched to raise while the
decode steps run (prefill may sync: it runs once). Syncs inside torch's own kernels (e.g. boolean-mask
indexing) never pass through these Python methods; the methods avoid those operations by construction.
"""

from __future__ import annotations

import pytest
import torch

from polykv.methods import REGISTRY, params_that_fit
from polykv.models import cache_argument_name
from polykv.plan import Phase, Plan
from polykv.runtime import routed
from tests.helpers import prompt, tiny_model

PROMPT, CAPACITY, STEPS = 40, 16, 6
_SYNCING = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class SyncCalled(AssertionError):
    pass


def _raiser(name):
    def call(*args, **kwargs):
        raise SyncCalled(f"torch.Tensor.{name} called during a decode step")

    return call


def _plans(layers: int):
    for name, cls in REGISTRY.items():
        if name == "full":
            yield name, Plan.homogeneous("full", None, layers)
            continue
        phase = "decode" if Phase.DECODE in cls.phases else "prefill"
        params = params_that_fit(name, CAPACITY)
        yield f"{name}-{phase}", Plan.homogeneous(name, CAPACITY, layers, phase, params)
        if phase == "decode" and Phase.PREFILL in cls.phases:
            yield f"{name}-both", Plan.homogeneous(name, CAPACITY, layers, "both", params)


PLANS = dict(_plans(3))


def _decode_without_syncs(model, plan, monkeypatch, steps=STEPS):
    ids = prompt(model, PROMPT)
    name = cache_argument_name(model)
    with routed(model, plan) as session, torch.no_grad():
        out = model(ids, use_cache=True)
        cache = session.cache
        tokens = out.logits[:, -1:].argmax(-1)
        # The greedy tokens are chosen on the host side of the loop, outside the patched region.
        with monkeypatch.context() as patch:
            for attr in _SYNCING:
                patch.setattr(torch.Tensor, attr, _raiser(attr))
            for _ in range(steps):
                out = model(tokens, use_cache=True, **{name: cache})
                tokens = out.logits[:, -1:].argmax(-1)
    return cache


@pytest.mark.parametrize("label", sorted(PLANS))
def test_decode_step_makes_no_host_sync(label, monkeypatch):
    model = tiny_model("llama")
    cache = _decode_without_syncs(model, PLANS[label], monkeypatch)
    assert cache.get_seq_length() == PROMPT + STEPS


def test_the_patch_catches_a_sync(monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(torch.Tensor, "item", _raiser("item"))
        with pytest.raises(SyncCalled):
            torch.ones(1).item()
        patch.setattr(torch.Tensor, "__bool__", _raiser("__bool__"))
        with pytest.raises(SyncCalled):
            bool(torch.ones(1))

"""Knorm (Devoto et al., EMNLP 2024): the keys with the smallest L2 norm stay, per KV head."""

from __future__ import annotations

import torch

from polykv.methods import REGISTRY, for_phase
from polykv.methods.attention_free.knorm import Knorm
from polykv.methods.base import NOTHING
from polykv.models import cache_argument_name, output_cache
from polykv.plan import Phase, Plan
from polykv.runtime import routed
from tests.helpers import kept, layer_view, prompt, tiny_model


def view_with_norms(norms: list[list[float]], phase: Phase = Phase.DECODE):
    """A layer whose keys have L2 norms `norms[head][slot]` (all the norm on the first coordinate)."""
    keys = torch.zeros(len(norms), len(norms[0]), 4)
    keys[..., 0] = torch.tensor(norms)
    return layer_view(keys=keys, values=torch.zeros_like(keys), phase=phase)


def test_prefill_keeps_the_lowest_norm_keys_of_each_head():
    view = view_with_norms([[5, 1, 4, 2, 3], [1, 2, 3, 4, 5]], Phase.PREFILL)
    assert kept(Knorm(3).step(view), 5) == [[1, 3, 4], [0, 1, 2]]  # each head its own positions


def test_a_decode_step_drops_the_one_highest_norm_key_and_may_drop_the_new_token():
    view = view_with_norms([[1, 2, 3, 9], [7, 1, 2, 3]])
    eviction = Knorm(3).step(view)
    assert eviction.dropped is not None and kept(eviction, 4) == [[0, 1, 2], [1, 2, 3]]


def test_under_capacity_nothing_happens_and_no_attention_is_ever_asked_for():
    view = view_with_norms([[1, 2, 3]])
    method = Knorm(3)
    assert method.step(view) is None
    assert method.needs(Phase.PREFILL, 100) == NOTHING and method.needs(Phase.DECODE, 100) == NOTHING


def test_knorm_is_registered_for_both_phases_with_its_own_colour():
    assert REGISTRY["knorm"] is Knorm
    assert "knorm" in for_phase(Phase.PREFILL) and "knorm" in for_phase(Phase.DECODE)
    colours = [cls.colour for cls in REGISTRY.values()]
    assert len(set(colours)) == len(colours)


def test_on_a_model_the_prompt_keeps_exactly_the_lowest_norm_keys_of_the_full_cache():
    model = tiny_model("llama")
    ids = prompt(model, length=30)
    with torch.no_grad():
        full = model(ids, use_cache=True)
    full_cache = output_cache(full)
    plan = Plan.homogeneous("knorm", 12, model.config.num_hidden_layers, "prefill")
    with torch.no_grad(), routed(model, plan) as session:
        model(ids, use_cache=True, **{cache_argument_name(model): session.new_cache()})
        cache = session.cache
    for layer, full_layer in zip(cache.layers, full_cache.layers):
        # the straightforward rule: per KV head, the 12 positions whose keys have the smallest norm
        expected = full_layer.keys.float().norm(dim=-1).topk(12, dim=-1, largest=False).indices.sort(-1).values
        assert torch.equal(layer.positions.sort(-1).values, expected)


def test_decode_steps_keep_the_lowest_norm_keys_of_everything_seen():
    # Norms never change, so dropping the largest norm one step at a time keeps the `capacity` lowest
    # norms of all tokens seen. Layer 0's keys depend only on the tokens: compare with FullKV's.
    model = tiny_model("llama")
    ids = prompt(model, length=30)
    with torch.no_grad():
        full = model(ids, use_cache=True)
    full_keys = output_cache(full).layers[0].keys
    plan = Plan.homogeneous("knorm", 12, model.config.num_hidden_layers, "decode")
    name = cache_argument_name(model)
    with torch.no_grad(), routed(model, plan) as session:
        cache = session.new_cache()
        model(ids[:, :16], use_cache=True, **{name: cache})
        for t in range(16, 30):  # one token per step, as in generation
            model(ids[:, t : t + 1], use_cache=True, **{name: cache}, position_ids=torch.tensor([[t]]))
    expected = full_keys.float().norm(dim=-1).topk(12, dim=-1, largest=False).indices.sort(-1).values
    assert torch.equal(cache.layers[0].positions.sort(-1).values, expected)

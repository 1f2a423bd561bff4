"""Random (kvpress's `RandomPress`): the control. Uniform scores, the highest kept; seeded, so reproducible."""

from __future__ import annotations

import torch

from polykv.methods import REGISTRY, for_phase
from polykv.methods.attention_free.random import Random
from polykv.models import cache_argument_name
from polykv.plan import Phase, Plan
from polykv.runtime import routed
from tests.helpers import kept, layer_view, prompt, tiny_model


def kvpress_draw(seed: int, heads: int, n: int) -> torch.Tensor:
    """kvpress: torch.rand(*keys.shape[:-1]) from a fresh generator seeded with `seed`, one batch row."""
    return torch.rand(1, heads, n, generator=torch.Generator().manual_seed(seed))


def test_the_prompt_keeps_the_highest_of_kvpress_draw_per_head():
    view = layer_view(10, phase=Phase.PREFILL)
    expected = kvpress_draw(7, 2, 10).topk(4, dim=-1).indices.sort(-1).values[0].tolist()
    assert kept(Random(4, {"seed": 7}).step(view), 10) == expected
    assert kept(Random(4, {"seed": 8}).step(view), 10) != expected  # another seed, another subset


def test_every_sequence_of_a_batch_draws_alone():
    one = layer_view(10, phase=Phase.PREFILL)
    two = layer_view(10, phase=Phase.PREFILL)
    two.keys, two.values, two.positions = (
        t.expand(2, *t.shape[1:]).clone() for t in (one.keys, one.values, one.positions)
    )
    alone = Random(4).step(one).keep
    batched = Random(4).step(two).keep
    assert torch.equal(batched[0], alone[0]) and torch.equal(batched[1], alone[0])


def test_decode_keeps_the_capacity_highest_draws_of_everything_seen():
    """Each new token draws from `seed` and its position; dropping the lowest score a step keeps, at every step,
    the `capacity` highest of all draws so far: a uniformly random subset of what the layer has seen."""
    model = tiny_model("llama")
    ids = prompt(model, length=30)
    plan = Plan.homogeneous("random", 12, model.config.num_hidden_layers, "both", params={"seed": 3})
    name = cache_argument_name(model)
    heads = model.config.num_key_value_heads
    with torch.no_grad(), routed(model, plan) as session:
        cache = session.new_cache()
        model(ids[:, :16], use_cache=True, **{name: cache})
        draws = [kvpress_draw(3, heads, 16)[0]]
        for t in range(16, 30):
            model(ids[:, t : t + 1], use_cache=True, **{name: cache}, position_ids=torch.tensor([[t]]))
            draws.append(torch.rand(heads, 1, generator=torch.Generator().manual_seed(3 * 1_000_003 + t)))
    every = torch.cat(draws, dim=-1)  # [heads, 30]: each position's score
    expected = every.topk(12, dim=-1).indices.sort(-1).values
    for layer in cache.layers:  # every layer draws the same numbers, as kvpress's seeded press does
        assert torch.equal(layer.positions[0].sort(-1).values, expected)


def test_it_runs_in_both_phases_with_its_own_colour():
    assert REGISTRY["random"] is Random
    assert "random" in for_phase(Phase.PREFILL) and "random" in for_phase(Phase.DECODE)

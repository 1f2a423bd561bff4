"""LagKV (Liang et al., 2025; kvpress's `LagKVPress`): each chunk is scored against the range of the next one;
the sinks and the tail stay; prefill only."""

from __future__ import annotations

import pytest
import torch

from polykv.methods import REGISTRY, params_that_fit, validate_plan
from polykv.methods.attention_free.lagkv import LagKV, lag_scores
from polykv.models import cache_argument_name, output_cache
from polykv.plan import Phase, PhaseAssignment, Plan, PlanError
from polykv.routing import window_floor
from polykv.runtime import routed
from tests.helpers import kept, layer_view, prompt, tiny_model


def test_sinks_and_tail_stay_and_each_chunk_keeps_the_token_that_stands_out_of_the_next_chunks_range():
    # 1 sink, chunks of 2, 8 tokens: chunks (1, 2), (3, 4), (5, 6) and token 7; (5, 6, 7) is the tail.
    # Chunk (1, 2) against (3, 4)'s range [0, 1] per channel: token 1 (0, 0) spreads 0, token 2 (0, 10) spreads
    # 7.07: token 2 wins. Chunk (3, 4) against (5, 6)'s range [0, 2] x [0, 4]: token 3 (0, 0) spreads 0, token 4
    # (1, 1) -> (0.5, 0.25) spreads 0.18: token 4 wins. Values equal the keys, so they agree.
    keys = torch.tensor([[[5.0, 5], [0, 0], [0, 10], [0, 0], [1, 1], [0, 0], [2, 4], [3, 3]]])
    view = layer_view(keys=keys, values=keys.clone(), phase=Phase.PREFILL)
    method = LagKV(6, {"sinks": 1, "lag_size": 2})
    assert kept(method.step(view), 8) == [[0, 2, 4, 5, 6, 7]]
    scores = lag_scores(view.keys, view.values, 1, 2)[0, 0]
    assert scores.tolist() == [1, 0, 0.5, 0, 0.5, 1, 1, 1]  # ranks within a chunk, over the lag


def test_a_prompt_without_a_scored_chunk_keeps_the_sinks_and_the_newest():
    view = layer_view(8, phase=Phase.PREFILL, seed=0)  # 8 < 2 sinks + 2 * 4
    assert kept(LagKV(5, {"sinks": 2, "lag_size": 4}).step(view), 8) == [[0, 1, 5, 6, 7], [0, 1, 5, 6, 7]]


def restated_kvpress(keys, values, sinks, lag):
    """kvpress's LagKVPress.score, restated with its own operations."""
    b, h, n, d = keys.shape
    end = sinks + ((n - sinks) // lag) * lag

    def spread(x):
        x = x[:, :, sinks:end].view(b, h, -1, lag, d)
        ref, v = x[:, :, 1:], x[:, :, :-1]
        lo = ref.min(dim=-2).values.unsqueeze(-2).expand(-1, -1, -1, lag, -1)
        hi = ref.max(dim=-2).values.unsqueeze(-2).expand(-1, -1, -1, lag, -1)
        return ((v - lo) / (hi - lo)).std(dim=-1).softmax(dim=-1)

    score = (spread(keys) + spread(values)) / 2
    score = (score.argsort(dim=-1).argsort(dim=-1) / lag).to(keys.dtype)
    ones = torch.ones
    return torch.cat((ones(b, h, sinks), score.reshape(b, h, -1), ones(b, h, lag + n - end)), dim=-1)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_on_a_model_the_prompt_keeps_what_kvpress_keeps_in_every_layer_and_head(family):
    """Ranks tie across chunks; kvpress breaks them with torch's top-k, and so does PolyKV, on equal scores."""
    model = tiny_model(family)
    ids = prompt(model, length=43)
    with torch.no_grad():
        full = output_cache(model(ids, use_cache=True))
    params = {"sinks": 3, "lag_size": 8}
    plan = Plan.homogeneous("lagkv", 20, model.config.num_hidden_layers, "prefill", params=params)
    with torch.no_grad(), routed(model, plan) as session:
        model(ids, use_cache=True, **{cache_argument_name(model): session.new_cache()})
    types = getattr(model.config, "layer_types", None)
    for i, (layer, full_layer) in enumerate(zip(session.cache.layers, full.layers)):
        if types and types[i] != "full_attention":
            assert layer.positions.shape[-1] <= model.config.sliding_window  # a local layer within its window
            continue
        scores = restated_kvpress(full_layer.keys, full_layer.values, 3, 8)
        assert torch.equal(scores, lag_scores(full_layer.keys, full_layer.values, 3, 8))
        assert torch.equal(layer.positions.sort(-1).values, scores.topk(20, dim=-1).indices.sort(-1).values), i


def test_it_is_refused_in_decode_in_one_line():
    assert REGISTRY["lagkv"] is LagKV and LagKV.phases == frozenset({Phase.PREFILL})
    with pytest.raises(PlanError) as refused:
        validate_plan(Plan.homogeneous("lagkv", 64, 2, "decode"), 2)
    assert "lagkv" in str(refused.value) and len(str(refused.value).splitlines()) == 1


def test_the_sinks_and_the_longest_tail_must_fit_the_capacity_and_a_lag_that_does_not_shrinks():
    """Below s + 2L - 1 slots every sink and tail token scores 1 and top-k's tie order would choose among them:
    such plans are refused in one line, and `params_that_fit` shrinks the lag to a quarter of what the sinks leave."""
    problems = LagKV.check({}, 200)
    assert problems == [
        "params: lagkv: sinks + 2 x lag_size - 1 (259: the sinks and the longest tail, which always stay) must be at "
        "most the capacity (200); lag_size at most 98"
    ]
    assert LagKV.check({"lag_size": 98}, 200) == [] and LagKV.check({"lag_size": 99}, 200) != []
    for capacity in (5, 33, 64, 128, 256, 259, 1024):
        params = params_that_fit("lagkv", capacity)
        assert LagKV.check(params, capacity) == [], (capacity, params)
    assert params_that_fit("lagkv", 256) == {"lag_size": 63} and params_that_fit("lagkv", 259) == {}
    assert window_floor(PhaseAssignment(method="lagkv", capacity=300, params={})) == 259

"""Each method's characteristic choice on hand-made attention patterns."""

from __future__ import annotations

import pytest
import torch

from polykv.methods import REGISTRY
from polykv.methods.attention.h2o import H2O
from polykv.methods.attention.snapkv import SnapKV, pool_votes
from polykv.methods.attention.tova import TOVA
from polykv.methods.attention_free.streamingllm import StreamingLLM
from polykv.plan import Phase
from tests.helpers import kept, layer_view


def test_streamingllm_keeps_sinks_and_most_recent():
    method = StreamingLLM(capacity=6, params={"sinks": 2})
    assert kept(method.step(layer_view(10)), 10) == [[0, 1, 6, 7, 8, 9]] * 2
    assert method.step(layer_view(6)) is None  # at capacity: nothing to evict


def test_h2o_keeps_heavy_hitters_and_recent_window():
    # Column sums: positions 2 and 5 received by far the most attention.
    sums = torch.full((1, 2, 10), 0.1)
    sums[..., 2] = 5.0
    sums[..., 5] = 3.0
    method = H2O(capacity=4, params={"heavy_ratio": 0.5})
    ev = method.step(layer_view(10, phase=Phase.PREFILL, column_sums=sums))
    assert kept(ev, 10) == [[2, 5, 8, 9]] * 2  # 2 heavy hitters + 2 most recent
    assert method.per_token["score"].shape == (1, 2, 10)


def test_h2o_accumulates_scores_across_decode_steps():
    method = H2O(capacity=3, params={"heavy_ratio": 1 / 3})
    # After prefill (3 slots): token 0 has score 1.0, token 1 has 0.9, token 2 has 0.
    method.observe_prefill(layer_view(3, phase=Phase.PREFILL, column_sums=[1.0, 0.9, 0.0]))
    # Step 1: token 1 gets 0.5 more, overtaking token 0 (1.4 vs 1.0); the new token 3 is recent.
    ev = method.step(layer_view(4, column_sums=torch.tensor([0.0, 0.5, 0.2, 0.3]).expand(1, 2, 4)))
    # capacity 3, heavy = 1: keep the 2 most recent (2, 3) + the heaviest of the rest (1).
    assert kept(ev, 4) == [[1, 2, 3]] * 2
    # Scores cover every slot before eviction; the runtime gathers them with the cache.
    assert torch.allclose(method.per_token["score"][0, 0], torch.tensor([1.0, 1.4, 0.2, 0.3]))


def test_h2o_gqa_scores_are_the_group_mean():
    # 2 KV heads x 2 query heads each; KV head 0's query heads disagree, the mean decides.
    sums = torch.zeros(1, 4, 6)
    sums[0, 0, 1], sums[0, 1, 2] = 4.0, 3.0  # KV head 0: mean favours slot 1
    sums[0, 2, 3], sums[0, 3, 3] = 1.0, 1.0  # KV head 1: slot 3
    method = H2O(capacity=2, params={"heavy_ratio": 0.5})
    ev = method.step(layer_view(6, heads=2, groups=2, phase=Phase.PREFILL, column_sums=sums))
    assert kept(ev, 6) == [[1, 5], [3, 5]]  # per-KV-head heavy hitter + the most recent token


def test_tova_drops_the_token_the_current_query_ignores():
    rows = torch.full((1, 4, 1, 8), 1 / 8)
    rows[..., 3] = 0.0  # every head's current query ignores token 3
    rows[0, 0, 0, 6] = 0.001  # one head ignores token 6 too, but the head average keeps it
    method = TOVA(capacity=7)
    ev = method.step(layer_view(8, heads=2, groups=2, rows=rows))
    assert ev.dropped is not None  # one slot goes: found by argmin, no sort
    assert kept(ev, 8) == [[0, 1, 2, 4, 5, 6, 7]] * 2  # one index set for all heads


def test_snapkv_keeps_what_the_window_votes_for_plus_the_window():
    n, w = 12, 3
    rows = torch.full((1, 2, w, n), 0.01)
    rows[..., 1] = 0.5  # the observation window's queries look at prefix tokens 1 and 7
    rows[..., 7] = 0.4
    method = SnapKV(capacity=5, params={"window": w, "kernel_size": 1})
    ev = method.step(layer_view(n, phase=Phase.PREFILL, rows=rows))
    assert kept(ev, n) == [[1, 7, 9, 10, 11]] * 2


def test_snapkv_pooling_keeps_neighbours_of_a_voted_token():
    votes = torch.tensor([[[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.2]]])
    pooled = pool_votes(votes, kernel_size=3, pooling="max")
    assert torch.allclose(pooled[0, 0], torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.2, 0.2]))
    avg = pool_votes(votes, kernel_size=3, pooling="avg")  # counts the zero padding, as torch does
    assert avg[0, 0, 0].item() == 0.0 and abs(avg[0, 0, 7].item() - 0.2 / 3) < 1e-7


def test_snapkv_is_prefill_only_and_checks_its_window():
    assert SnapKV.phases == {Phase.PREFILL}
    assert SnapKV.check({"window": 32}, 16) == [
        "params: snapkv: window (32) must be smaller than the capacity (16); allowed range 1 .. 15"
    ]
    assert SnapKV.check({"window": 32}, 1) == [  # no window fits a capacity of 1: no empty range "1 .. 0"
        "params: snapkv: window (32) must be smaller than the capacity (1); no value fits"
    ]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_method_keeps_all_when_under_capacity(name):
    cls = REGISTRY[name]
    method = cls(capacity=None if name == "full" else 64)
    rows = torch.full((1, 2, 4, 10), 0.1)
    sums = torch.full((1, 2, 10), 0.1)
    phase = Phase.PREFILL if Phase.PREFILL in cls.phases else Phase.DECODE
    assert method.step(layer_view(10, phase=phase, rows=rows, column_sums=sums, num_new=10)) is None


@pytest.mark.parametrize("prefill", ["snapkv", "pyramidkv", "cake"])
def test_a_prefill_method_votes_with_its_own_window_whatever_the_decode_method_asks(prefill):
    # A layer's prompt step computes the newest rows for the larger of its two methods' windows; a prefill method
    # must read only its own (SnapKV and CAKE once read every row given: 100 with Scissorhands in decode).
    from polykv.methods import params_that_fit
    from polykv.plan import Plan
    from polykv.runtime import routed
    from tests.helpers import prompt, tiny_model

    model = tiny_model("llama")
    ids = prompt(model, 120)
    layers = model.config.num_hidden_layers

    def prefill_positions(decode: dict) -> list:
        entry = {"method": prefill, "capacity": 24, "params": params_that_fit(prefill, 24)}
        plan = Plan.from_dict({"name": "p", "scope": "both", "layers": [{"prefill": entry, "decode": decode}] * layers})
        with torch.no_grad(), routed(model, plan) as session:
            model(ids, use_cache=True)
            return [layer.positions.tolist() for layer in session.cache.layers]

    alone = prefill_positions({"method": "full", "capacity": None})
    history = {"method": "scissorhands", "capacity": 100, "params": {"history": 100, "recent": 8}}
    assert prefill_positions(history) == alone

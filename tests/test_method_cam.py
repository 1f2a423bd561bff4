"""CaM: StreamingLLM eviction whose evicted values are merged (Bernoulli-gated) into the kept tokens."""

from __future__ import annotations

import torch

from polykv.methods.merging.cam import CaM
from polykv.models import cache_argument_name
from polykv.plan import Phase, Plan
from tests.helpers import decode_logits, decode_sizes, kept, layer_view, max_diff, prompt, run_routed, tiny_model


def test_merge_with_p_one_and_p_zero_per_kv_head():
    # 2 KV heads x 2 query heads. Slot 1 (the oldest non-sink) is evicted; targets are slots 2 and 3.
    sums = torch.full((1, 4, 6), 0.5)
    sums[0, 0, 1], sums[0, 1, 1] = 2.0, 0.0  # KV head 0: group mean 1.0 >= targets' 0.5 -> p = 1
    sums[0, 2:, 1] = 0.0  # KV head 1: nothing accumulated -> p = 0
    v = layer_view(6, column_sums=sums, groups=2, seed=0)
    keys, values = v.keys.clone(), v.values.clone()
    ev = CaM(capacity=5, params={"sinks": 1, "merge_budget": 2}).step(v)
    assert kept(ev, 6) == [[0, 2, 3, 4, 5]] * 2  # sink + most recent: the oldest non-sink goes
    expected = values.clone()
    expected[0, 0, 2:4] += values[0, 0, 1] / 2
    assert torch.allclose(v.values, expected)  # head 1 unchanged, head 0's targets got v_e / K
    assert torch.equal(v.keys, keys)  # keys are never modified


def test_fewer_targets_than_the_budget_share_the_value():
    sums = torch.ones(1, 2, 4)
    v = layer_view(4, column_sums=sums, seed=0)
    values = v.values.clone()
    ev = CaM(capacity=3, params={"sinks": 1}).step(v)  # budget 16, but only 2 kept tokens follow
    assert kept(ev, 4) == [[0, 2, 3]] * 2
    expected = values.clone()
    expected[0, :, 2:4] += values[0, :, 1:2] / 2  # p = 1/1 = 1 on both heads, K = 2
    assert torch.allclose(v.values, expected)


def test_accumulation_starts_from_the_prompt():
    method = CaM(capacity=4, params={"sinks": 0, "merge_budget": 1})
    prompt_sums = torch.tensor([3.0, 1.0, 1.0, 1.0]).expand(1, 2, 4)
    method.observe_prefill(layer_view(4, phase=Phase.PREFILL, column_sums=prompt_sums))
    v = layer_view(5, column_sums=[0.0, 1.0, 1.0, 1.0, 1.0], seed=0)
    values = v.values.clone()
    method.step(v)
    assert torch.allclose(method.per_token["acc"][0, 0], torch.tensor([3.0, 2.0, 2.0, 2.0, 1.0]))
    expected = values.clone()
    expected[0, :, 1] += values[0, :, 0]  # acc 3 vs target acc 2: p = 1 thanks to the prompt
    assert torch.allclose(v.values, expected)


def test_fractional_p_follows_the_seeded_generator_and_a_bulk_cut_merges_only_the_newest():
    n, cap = 12, 5  # the first decode step after a full prefill: slots 1..7 go at once
    sums = torch.ones(1, 2, n)
    sums[0, :, 1:8] = torch.linspace(0.1, 0.9, 7)  # p = acc_e / 1 in (0, 1)
    v = layer_view(n, column_sums=sums, seed=3)
    values = v.values.clone()
    method = CaM(capacity=cap, params={"sinks": 1, "merge_budget": 2, "seed": 0}, layer_idx=2)
    ev = method.step(v)
    assert kept(ev, n) == [[0, 8, 9, 10, 11]] * 2
    # Only token 7, just outside the recent window, may merge (p = 0.9); tokens 1..6 are dropped, as in
    # the authors' cache. Whether it merges is the layer's seeded draw: for this seed, under 0.9 on KV
    # head 0 and over it on head 1, so the same p gives a merge on one head only.
    draws = torch.rand(1, 2, n, generator=torch.Generator().manual_seed(method.seed_for_layer()))
    m = (draws[0, :, 7] < 0.9).float()  # per KV head
    assert m.tolist() == [1.0, 0.0]
    assert (draws[0, :, 1:7] < sums[0, :, 1:7]).any()  # some older token drew a merge: it must not happen
    expected = values.clone()
    expected[0, :, 8:10] += (m[:, None] * values[0, :, 7] / 2)[:, None]
    assert torch.allclose(v.values, expected, atol=1e-6)
    assert not torch.equal(v.values[0, 0], values[0, 0]) and torch.equal(v.values[0, 1], values[0, 1])


def test_same_seed_same_merge_different_seed_can_differ():
    def merged(seed):
        sums = torch.full((1, 2, 40), 0.5)
        sums[0, :, 30:] = 1.0  # evicted tokens get p = 0.5
        v = layer_view(40, column_sums=sums, seed=0)
        CaM(capacity=12, params={"sinks": 2, "seed": seed}).step(v)
        return v.values

    assert torch.equal(merged(0), merged(0))
    assert not torch.equal(merged(0), merged(1))


def test_phases_params_and_capacity_check():
    assert CaM.phases == {Phase.DECODE} and CaM.merges
    assert CaM.defaults() == {"sinks": 4, "merge_budget": 16, "seed": 0}
    assert CaM.check({"sinks": 8}, 8) == [
        "params: cam: sinks (8) must be smaller than the capacity (8); allowed range 0 .. 7"
    ]
    assert CaM.check({"merge_budget": 0}, 8)[0].startswith("params.merge_budget: cam:")


def test_runtime_holds_capacity_and_stays_finite():
    model = tiny_model("llama")
    ids = prompt(model, length=40)
    plan = Plan.homogeneous("cam", 12, 3, scope="decode", params={"sinks": 2, "merge_budget": 4})

    def finite_values(cache):
        assert all(torch.isfinite(layer.values).all() for layer in cache.layers)

    (_, *sizes), cache = decode_sizes(model, plan, ids, 32, each_step=finite_values)
    assert max(max(s) for s in sizes) <= 12
    assert cache.retained_per_layer() == [12] * 3


def test_runtime_merges_deterministically_and_differs_from_plain_eviction():
    model = tiny_model("llama")
    ids = prompt(model, length=40)
    cam = Plan.homogeneous("cam", 16, 3, scope="decode", params={"sinks": 4})
    first, _ = run_routed(model, cam, ids, steps=8)
    again, _ = run_routed(model, cam, ids, steps=8)
    assert max_diff(first, again) == 0.0
    plain, _ = run_routed(model, Plan.homogeneous("streamingllm", 16, 3, scope="decode"), ids, steps=8)
    assert max_diff(first, plain) > 1e-4  # same kept tokens, merged values


def test_runtime_capacity_above_length_equals_full():
    model = tiny_model("llama")
    ids = prompt(model, length=40)
    vanilla, _ = decode_logits(model, ids, 30, cache_argument_name(model))
    logits, cache = run_routed(model, Plan.homogeneous("cam", 80, 3, scope="decode"), ids, steps=30)
    assert max_diff(vanilla, logits) <= 1e-5
    assert cache.retained_per_layer() == [70] * 3

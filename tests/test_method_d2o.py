"""D2O: H2O-style eviction with EMA-gated merging, and its variance-based layer budgets."""

from __future__ import annotations

import math

import pytest
import torch

from polykv.methods.merging.d2o import D2O
from polykv.models import cache_argument_name
from polykv.plan import Phase, Plan
from polykv.runtime import routed
from tests.helpers import decode_logits, decode_sizes, kept, layer_view, max_diff, prompt, run_routed


def cos(a, b):
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


# One head, 6 slots at positions 0..5; capacity 4 = 2 heavy + 2 recent (4, 5), no sinks. Scores make
# 0 and 2 the heavy hitters, so 1 and 3 go: k1 is close to k0, k3 less close to k2.
KEYS = torch.tensor([[1.0, 0.0], [2.0, 0.2], [0.0, 1.0], [1.0, 2.0], [0.0, -1.0], [-1.0, 0.0]])
VALUES = torch.arange(12, dtype=torch.float32).view(6, 2)
SCORES = [5.0, 0.1, 4.0, 0.2, 0.0, 0.0]


def first_cut():
    method = D2O(capacity=4, params={"sinks": 0, "heavy_ratio": 0.5, "alpha": 0.5})
    view = layer_view(keys=KEYS[None], values=VALUES[None], positions=list(range(6)), column_sums=SCORES)
    return method, view, method.step(view)


def test_d2o_merges_an_evicted_token_only_above_the_threshold():
    method, view, ev = first_cut()
    assert kept(ev, 6) == [[0, 2, 4, 5]]
    s1, s3 = cos(KEYS[1], KEYS[0]), cos(KEYS[3], KEYS[2])  # each one's most similar kept key
    assert method.threshold == pytest.approx((s1 + s3) / 2)  # first eviction: tau = mean(s)
    assert s1 > method.threshold > s3
    # token 1 merges into slot 0 (keys and values, weight s1); token 3 is below tau: slot 2 untouched
    assert torch.allclose(view.keys[0, 0, 0], (KEYS[0] + s1 * KEYS[1]) / 2)
    assert torch.allclose(view.values[0, 0, 0], (VALUES[0] + s1 * VALUES[1]) / 2)
    assert torch.equal(view.keys[0, 0, 2], KEYS[2]) and torch.equal(view.values[0, 0, 2], VALUES[2])
    assert torch.equal(view.keys[0, 0, 4:], KEYS[4:])  # other kept slots unchanged


def test_d2o_threshold_is_an_ema_over_evictions():
    method, view, ev = first_cut()
    tau1 = method.threshold
    # Next step, as the runtime leaves it: the kept slots (merged slot 0 included) plus token 6.
    keep = ev.kept_mask(6)[0, 0]
    new_key = torch.tensor([1.0, -1.0])
    keys = torch.cat([view.keys[0, 0][keep], new_key[None]])
    values = torch.cat([view.values[0, 0][keep], torch.zeros(1, 2)])
    method.per_token["score"] = method.per_token["score"][..., keep]
    # scores: position 4 is the weakest candidate (recent = 5, 6); its nearest kept key is k6
    step = layer_view(
        keys=keys[None], values=values[None], positions=[0, 2, 4, 5, 6], column_sums=[1.0, 1.0, -10.0, 0.0, 0.0]
    )
    ev2 = method.step(step)
    assert ev2.dropped is not None and ev2.dropped.item() == 2
    s = cos(KEYS[4], new_key)
    assert method.threshold == pytest.approx(0.5 * tau1 + 0.5 * s)
    assert s < method.threshold  # not merged: the kept slots are unchanged
    assert torch.equal(step.keys[0, 0], keys) and torch.equal(step.values[0, 0], values)


def test_d2o_gate_is_per_head():
    # Two KV heads evict the same slot index; only head 0's token is close to a kept key.
    keys = torch.stack([KEYS, KEYS.clone()])
    keys[1, 1] = torch.tensor([0.3, -1.0])  # head 1: slot 1 now nearest k4, cos ~0.96
    keys[1, 3] = torch.tensor([-1.0, 0.05])  # head 1: slot 3 nearest k5, cos ~0.999 (merges)
    method = D2O(capacity=4, params={"sinks": 0})
    view = layer_view(keys=keys, values=VALUES.expand(2, 6, 2), positions=list(range(6)), column_sums=SCORES)
    method.step(view)
    s = [cos(KEYS[1], KEYS[0]), cos(KEYS[3], KEYS[2]), cos(keys[1, 1], KEYS[4]), cos(keys[1, 3], KEYS[5])]
    assert method.threshold == pytest.approx(sum(s) / 4)  # mean over heads and tokens
    merged = [not torch.equal(view.keys[0, h, j], keys[h, j]) for h, j in [(0, 0), (0, 2), (1, 4), (1, 5)]]
    assert merged == [s_i >= method.threshold for s_i in s] == [True, False, False, True]


def test_d2o_protects_sinks_and_recent_window():
    torch.manual_seed(0)
    scores = [0.0, 0.0, 1.0, 5.0, 2.0, 4.0, 3.0, 0.0, 0.0, 0.0]  # sinks and recent score lowest
    keys, values = torch.randn(2, 10, 4), torch.randn(2, 10, 4)
    method = D2O(capacity=6, params={"sinks": 2, "heavy_ratio": 0.5})  # 3 heavy (2 sinks + 1), 3 recent
    view = layer_view(keys=keys, values=values, positions=list(range(10)), column_sums=scores)
    assert kept(method.step(view), 10) == [[0, 1, 3, 7, 8, 9]] * 2
    # more sinks than heavy slots: the recent window shrinks so that the sinks still fit
    method = D2O(capacity=5, params={"sinks": 4, "heavy_ratio": 0.2})
    view = layer_view(keys=keys, values=values, positions=list(range(10)), column_sums=scores)
    assert kept(method.step(view), 10) == [[0, 1, 2, 3, 9]] * 2
    assert D2O.check({"sinks": 8}, 8) == [
        "params: d2o: sinks (8) must be smaller than the capacity (8); allowed range 0 .. 7"
    ]


def test_d2o_layer_statistic_and_allocation():
    method = D2O(capacity=8)
    sums = torch.tensor([[[1.0, 1.0, 1.0], [0.0, 3.0, 0.0]]])  # head variances 0 and 3
    method.observe_prefill(layer_view(3, phase=Phase.PREFILL, column_sums=sums))
    assert method.allocation_statistic() == pytest.approx(0.5 * 3 / (3 + 1e-6))
    params = D2O.Params()
    budgets = D2O.allocate(4 * 100 + 3, [0.9, 0.1, 0.5, 0.3], params)
    assert sum(budgets) == 403
    assert budgets[1] > budgets[3] > budgets[2] > budgets[0]  # lower variance, larger budget
    weights = [math.exp(-s) for s in (0.9, 0.1, 0.5, 0.3)]
    assert all(abs(b - 403 * w / sum(weights)) < 1 for b, w in zip(budgets, weights))
    assert D2O.allocate(96, [0.4] * 3, params) == [32, 32, 32]


# ---- end to end on a tiny random Llama ---------------------------------------------------------
def test_d2o_decode_holds_capacity_and_stays_finite(llama):
    ids = prompt(llama, length=40)
    capacity = 12
    (prefilled, *sizes), cache = decode_sizes(llama, Plan.homogeneous("d2o", capacity, 3, scope="decode"), ids, 32)
    assert prefilled == [40] * 3  # no eviction inside prefill
    assert all(s == [capacity] * 3 for s in sizes)
    for layer in cache.layers:
        assert torch.isfinite(layer.keys).all() and torch.isfinite(layer.values).all()
        assert layer.keys.shape[1] == llama.config.num_key_value_heads
        assert layer.methods[Phase.DECODE].threshold is not None
        assert (layer.positions < 4).sum(-1).eq(4).all()  # sinks survive


def test_d2o_with_room_for_everything_equals_full(llama):
    ids = prompt(llama, length=40)
    steps = 16
    vanilla, _ = decode_logits(llama, ids, steps, cache_argument_name(llama))
    logits, cache = run_routed(llama, Plan.homogeneous("d2o", 40 + steps, 3, scope="decode"), ids, steps=steps)
    assert max_diff(vanilla, logits) <= 1e-5
    assert cache.retained_per_layer() == [40 + steps] * 3


def test_d2o_native_allocation_splits_the_total(llama):
    ids = prompt(llama, length=40)
    b, layers = 16, llama.config.num_hidden_layers
    plan = Plan.homogeneous("d2o", b, layers, scope="decode", allocation="native")
    with routed(llama, plan) as session:
        decode_logits(llama, ids, 20, cache_argument_name(llama))
        capacities = session.cache.capacities("decode")
        retained = session.cache.retained_per_layer()
    assert sum(capacities) == layers * b
    assert retained == capacities


def test_d2o_tokens_sharing_a_target_merge_together():
    # 8 evicted tokens, 4 kept slots: several evicted tokens share a target; compare with a plain loop.
    torch.manual_seed(3)
    keys, values = torch.randn(2, 12, 3), torch.randn(2, 12, 3)
    scores = torch.rand(2, 12)
    method = D2O(capacity=4, params={"sinks": 1})
    view = layer_view(keys=keys, values=values, positions=list(range(12)), column_sums=scores)
    view.column_sums = scores[None].clone()
    kept = method.step(view).kept_mask(12)[0]
    expected_k, expected_v, found = keys.clone(), values.clone(), []
    for h in range(2):
        survivors = kept[h].nonzero().flatten().tolist()
        for i in (~kept[h]).nonzero().flatten().tolist():
            s, j = max((cos(keys[h, i], keys[h, j]), j) for j in survivors)
            found.append((h, i, s, j))
    tau = sum(f[2] for f in found) / len(found)
    assert method.threshold == pytest.approx(tau)
    for h in range(2):
        for j in kept[h].nonzero().flatten().tolist():
            merged = [(s, i) for hh, i, s, jj in found if hh == h and jj == j and s >= tau]
            expected_k[h, j] = (keys[h, j] + sum(s * keys[h, i] for s, i in merged)) / (1 + len(merged))
            expected_v[h, j] = (values[h, j] + sum(s * values[h, i] for s, i in merged)) / (1 + len(merged))
    merged_pairs = [(h, j) for h, _, s, j in found if s >= tau]
    assert max(merged_pairs.count(p) for p in merged_pairs) >= 2  # some slot takes two tokens at once
    assert torch.allclose(view.keys[0][kept].view(2, 4, 3), expected_k[kept].view(2, 4, 3), atol=1e-6)
    assert torch.allclose(view.values[0][kept].view(2, 4, 3), expected_v[kept].view(2, 4, 3), atol=1e-6)


def test_d2o_sinks_stay_protected_in_every_sequence():
    # The sinks' scores are set to +inf at a sequence's first eviction (no mask on later steps); a new
    # sequence (or a forgotten state) must protect them again, though its scores start afresh.
    method = D2O(capacity=4, params={"sinks": 1, "heavy_ratio": 0.5})  # 1 sink, 1 heavy, 2 recent
    sums = [0.0, 5.0, 4.0, 3.0, 2.0, 1.0, 1.0]  # the sink scores lowest
    assert kept(method.step(layer_view(7, column_sums=sums)), 7) == [[0, 1, 5, 6]] * 2
    method.forget()
    assert kept(method.step(layer_view(7, column_sums=sums)), 7) == [[0, 1, 5, 6]] * 2
    method.observe_prefill(layer_view(6, phase=Phase.PREFILL, column_sums=sums[:6]))  # a new prompt
    assert kept(method.step(layer_view(7, column_sums=[0.0] * 7)), 7) == [[0, 1, 5, 6]] * 2


def test_d2o_one_slot_merge_with_values_wider_than_keys():
    # Keys and values of different sizes live in separate tensors: the merge must index each by its own.
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [-1.0, 0.0], [0.0, -1.0]])
    values = torch.arange(15, dtype=torch.float32).view(5, 3)
    method = D2O(capacity=4, params={"sinks": 0, "heavy_ratio": 0.5})  # 2 heavy, recent 3 and 4
    view = layer_view(
        keys=keys[None], values=values[None].clone(), positions=list(range(5)), column_sums=[5.0, 0.0, 4.0, 0.0, 0.0]
    )
    ev = method.step(view)
    assert ev.dropped is not None and ev.dropped.item() == 1  # k1 goes; its nearest kept key is k2
    s = cos(keys[1], keys[2])
    assert method.threshold == pytest.approx(s)  # the first eviction: tau = s, so it merges
    assert torch.allclose(view.values[0, 0, 2], (values[2] + s * values[1]) / 2)
    assert torch.equal(view.values[0, 0, [0, 3, 4]], values[[0, 3, 4]])

"""Methods with their own layer-budget rule: PyramidKV and CAKE allocators, and native plans at run time."""

from __future__ import annotations

import math

import pytest
import torch

from polykv.methods import REGISTRY, validate_plan
from polykv.methods.attention.cake import CAKE, CAKEParams
from polykv.methods.attention.pyramidkv import PyramidKV, PyramidKVParams
from polykv.methods.shared import split_total, within_bounds
from polykv.models import cache_argument_name
from polykv.plan import Phase, Plan, PlanError
from polykv.runtime import routed
from tests.helpers import decode_logits, kept, layer_view, tiny_model


def test_split_total_is_exact_bounded_and_proportional():
    assert split_total([1, 1, 1], 10) == [4, 3, 3]
    assert sum(split_total([0.3, 5.0, 2.2, 0.01], 1000)) == 1000
    assert split_total([1, 100], 20, minimum=3) == [3, 17]
    assert split_total([100, 1, 1], 30, maximum=12) == [12, 9, 9]  # the excess is shared by the rest
    assert split_total([2, 1], 30) == split_total([20, 10], 30)  # invariant to scaling
    with pytest.raises(ValueError, match="cannot split 5 over 3 layers"):
        split_total([1, 1, 1], 5, minimum=2)


def test_pyramidkv_budgets_decrease_with_depth_and_sum_to_the_total():
    params = PyramidKVParams(window=8, beta=20)
    budgets = PyramidKV.allocate(32 * 128, [None] * 32, params)
    assert sum(budgets) == 32 * 128
    assert all(a >= b for a, b in zip(budgets, budgets[1:])) and budgets[0] > budgets[-1]
    prefix = 128 - 8
    # the paper's pyramid: top layer (C - w)/beta, bottom 2(C - w) - top, window added to each
    assert abs(budgets[-1] - (prefix / 20 + 8)) <= 1 and abs(budgets[0] - (2 * prefix - prefix / 20 + 8)) <= 1


def test_pyramidkv_budgets_follow_the_prompt_length():
    params = PyramidKVParams(window=8, beta=20)
    assert PyramidKV.allocate(4 * 64, [None] * 4, params, prompt_length=100) == [64] * 4  # n < 2(C - w): uniform
    clipped = PyramidKV.allocate(4 * 64, [None] * 4, params, prompt_length=115)  # bottom clipped to n - w
    assert clipped[0] == 115 and sum(clipped) == 256 and clipped == sorted(clipped, reverse=True)


def test_pyramidkv_selects_like_snapkv():
    n, w = 12, 3
    rows = torch.full((1, 2, w, n), 0.01)
    rows[..., 4] = 0.5
    method = PyramidKV(capacity=4, params={"window": w, "kernel_size": 1})
    ev = method.step(layer_view(n, phase=Phase.PREFILL, rows=rows))
    assert kept(ev, n) == [[4, 9, 10, 11]] * 2


def hand_preference(rows: torch.Tensor, w: int, tau1: float, tau2: float) -> float:
    prefix = rows[..., : rows.shape[-1] - w].double()
    entropy = -(prefix * torch.log(prefix + 1e-10)).sum().item()
    variance = prefix.var(dim=2, unbiased=True).sum().item()
    return entropy ** (1 / tau1) * variance ** (1 / tau2)


def test_cake_preference_follows_the_formula():
    torch.manual_seed(0)
    n, w = 20, 4
    rows = torch.rand(1, 4, w, n).softmax(-1)
    method = CAKE(capacity=None, params={"window": w, "tau1": 1.6, "tau2": 0.4})
    method.step(layer_view(n, heads=2, groups=2, phase=Phase.PREFILL, rows=rows))
    assert math.isclose(method.allocation_statistic(), hand_preference(rows, w, 1.6, 0.4), rel_tol=1e-9)


def test_cake_budgets_are_proportional_to_preferences_and_sum_to_the_total():
    params = CAKEParams(window=4)
    preferences = [1.0, 2.0, 3.0, 4.0]
    budgets = CAKE.allocate(4 * 24, preferences, params, prompt_length=200)
    prefix = [b - 4 for b in budgets]
    assert sum(budgets) == 96
    assert prefix == [8, 16, 24, 32]  # (24 - 4) * 4 = 80 prefix tokens split 1:2:3:4
    capped = CAKE.allocate(4 * 24, [1.0, 1.0, 1.0, 100.0], params, prompt_length=30)
    assert capped[3] == 30 and sum(capped) == 96  # capped at the prompt, excess shared by the others
    assert CAKE.allocate(4 * 24, preferences, params, prompt_length=28) == [24] * 4  # short prompt: uniform


def test_cake_indicator_keeps_high_variance_tokens():
    n, w = 10, 2
    rows = torch.full((1, 2, w, n), 0.05)
    rows[:, :, 0, 3], rows[:, :, 1, 3] = 0.0, 0.6  # token 3: mean 0.3 with a large variance
    rows[:, :, :, 5] = 0.32  # token 5: the larger mean, no variance
    plain = CAKE(capacity=w + 1, params={"window": w, "gamma": 0.0, "kernel_size": 1})
    assert kept(plain.step(layer_view(n, phase=Phase.PREFILL, rows=rows)), n) == [[5, 8, 9]] * 2
    varied = CAKE(capacity=w + 1, params={"window": w, "gamma": 200.0, "kernel_size": 1})
    assert kept(varied.step(layer_view(n, phase=Phase.PREFILL, rows=rows)), n) == [[3, 8, 9]] * 2


def test_cake_decode_protects_the_window():
    n, w = 8, 3
    rows = torch.full((1, 2, 1, n), 0.2)
    rows[..., 7] = 0.0  # the newest token gets no attention, but it is in the window
    rows[..., 2] = 0.01
    ev = CAKE(capacity=n - 1, params={"window": w, "kernel_size": 1}).step(layer_view(n, rows=rows))
    assert kept(ev, n) == [[0, 1, 3, 4, 5, 6, 7]] * 2


def test_native_plans_need_one_method_with_a_budget_rule():
    with pytest.raises(PlanError, match="allocation: 'native' needs one method with its own layer-budget rule"):
        validate_plan(Plan.homogeneous("tova", 16, 3, allocation="native"), 3)
    assert {n for n, m in REGISTRY.items() if m.native_allocation} >= {"pyramidkv", "cake"}


@pytest.mark.parametrize("method, scope", [("pyramidkv", "prefill"), ("cake", "both")])
def test_native_plan_splits_the_total_at_run_time(method, scope):
    model = tiny_model("llama", num_hidden_layers=4)
    ids = torch.randint(3, 96, (1, 80), generator=torch.Generator().manual_seed(0))
    plan = Plan.homogeneous(method, 24, 4, scope, {"window": 4}, allocation="native")
    with routed(model, plan) as session:
        decode_logits(model, ids, 6, cache_argument_name(model))
    cache = session.cache
    budgets = cache.capacities("prefill")
    assert sum(budgets) == 4 * 24
    assert [layer.retained_after_prefill for layer in cache.layers] == budgets
    if method == "pyramidkv":
        assert budgets == sorted(budgets, reverse=True) and budgets[0] > budgets[-1]
        assert cache.retained_per_layer() == [b + 6 for b in budgets]  # SnapKV-style: decode appends
    else:
        assert sum(cache.capacities("decode")) == 4 * 24
        assert all(r <= c for r, c in zip(cache.retained_per_layer(), cache.capacities("decode")))


def test_a_split_within_bounds_caps_a_layer_and_gives_its_surplus_to_the_layers_that_can_hold_it():
    inf = float("inf")
    assert within_bounds([16, 12, 8], [inf, inf, inf]) == [16, 12, 8]  # no local layer: the rule's own split
    capped = within_bounds([20, 12, 4], [15, 15, inf])
    assert sum(capped) == 36 and capped[0] == 15 and capped[1] <= 15 and capped[2] > 4  # the surplus moved
    assert within_bounds([40, 40], [15, 15]) == [15, 15]  # no layer can hold more: the surplus is dropped


@pytest.mark.parametrize("method", ["pyramidkv", "cake"])
def test_on_a_hybrid_model_no_local_layer_is_given_more_than_its_window_holds(method):
    model = tiny_model("gemma3")  # layers 0 and 1 local (window 16: at most 15 held), layer 2 global
    ids = torch.randint(3, 96, (1, 60), generator=torch.Generator().manual_seed(0))
    plan = Plan.homogeneous(method, 20, 3, "prefill", {"window": 4}, allocation="native")
    with routed(model, plan) as session:
        decode_logits(model, ids, 0, cache_argument_name(model))
    budgets = session.cache.capacities("prefill")
    assert max(budgets[:2]) <= 15 and sum(budgets) == 3 * 20  # what the local layers cannot hold went to layer 2
    assert session.cache.retained_per_layer() == budgets

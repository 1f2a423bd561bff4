"""Allocation rules apart from the methods (`polykv.routing.rules`): a rule splits a plan's budget over its layers
for any scoring method; PyramidKV's preset is SnapKV's selection under the pyramid rule; on a hybrid model no local
layer is given more than its window holds; the CLI writes such plans and refuses bad rules in one line."""

from __future__ import annotations

import pytest
import torch

from polykv.methods.attention.pyramidkv import PyramidKV, PyramidKVParams
from polykv.models import cache_argument_name
from polykv.plan import Plan, PlanError
from polykv.routing.rules import apply_rule, rule_capacities
from polykv.runtime import routed
from tests.helpers import assert_one_line_error, decode_logits, tiny_model

PROMPT = 80


def _prefilled(model, plan):
    ids = torch.randint(3, 96, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    with routed(model, plan) as session:
        decode_logits(model, ids, 0, cache_argument_name(model))
    return session.cache


def test_the_pyramid_rule_is_pyramidkvs_layer_rule_and_keeps_the_total():
    capacities = rule_capacities("pyramid", 30 * 64, 30, {"window": 8, "beta": 20})
    assert capacities == PyramidKV.allocate(30 * 64, [None] * 30, PyramidKVParams(window=8, beta=20))
    assert sum(capacities) == 30 * 64 and capacities == sorted(capacities, reverse=True)
    assert rule_capacities("uniform", 10, 3) == [4, 3, 3]


def test_pyramidkv_is_snapkvs_selection_under_the_pyramid_rule():
    model = tiny_model("llama", num_hidden_layers=4)
    preset = Plan.homogeneous("pyramidkv", 24, 4, "prefill", allocation="native")
    snapkv = Plan.homogeneous("snapkv", 24, 4, "prefill", {"window": 8, "kernel_size": 7, "pooling": "max"})
    ruled = apply_rule(snapkv, "pyramid", {"window": 8, "beta": 20}, prompt_length=PROMPT)
    a, b = _prefilled(model, preset), _prefilled(model, ruled)
    assert a.capacities("prefill") == [layer.prefill.capacity for layer in ruled.layers]
    for mine, theirs in zip(a.layers, b.layers):
        assert torch.equal(mine.positions.sort(-1).values, theirs.positions.sort(-1).values)


@pytest.mark.parametrize("method", ["tova", "h2o", "snapkv", "knorm", "keydiff", "streamingllm"])
def test_any_scoring_method_runs_under_the_rule_and_holds_what_it_gives(method):
    model = tiny_model("llama", num_hidden_layers=4)
    plan = apply_rule(
        Plan.homogeneous(method, 24, 4, "prefill", {"window": 4} if method == "snapkv" else {}),
        "pyramid",
        {"window": 4},
    )
    capacities = [layer.prefill.capacity for layer in plan.layers]
    assert sum(capacities) == 4 * 24 and capacities[0] > capacities[-1] and plan.allocation == "fixed"
    assert plan.provenance["rule"] == "pyramid" and "pyramid rule (window 4, beta 20.0)" in plan.description
    assert _prefilled(model, plan).retained_per_layer() == capacities


def test_on_a_hybrid_model_the_rule_gives_no_local_layer_more_than_its_window_holds():
    windows = [16, 16, None]  # the tiny Gemma 3: two local layers, one global
    plan = apply_rule(Plan.homogeneous("tova", 20, 3, "prefill"), "pyramid", {"window": 4}, windows=windows)
    capacities = [layer.prefill.capacity for layer in plan.layers]
    assert capacities[:2] == [15, 15] and sum(capacities) == 60  # the surplus went to the global layer
    assert "what the rule gave it beyond went to the others" in plan.description
    assert _prefilled(tiny_model("gemma3"), plan).retained_per_layer() == capacities


def test_a_rule_refuses_what_it_cannot_split():
    with pytest.raises(PlanError, match="fixed allocation"):
        apply_rule(Plan.homogeneous("pyramidkv", 24, 4, allocation="native"), "pyramid")
    with pytest.raises(ValueError, match="unknown allocation rule 'squeeze'"):
        apply_rule(Plan.homogeneous("tova", 24, 4), "squeeze")
    with pytest.raises(ValueError, match="the pyramid rule's beta"):
        apply_rule(Plan.homogeneous("tova", 24, 4), "pyramid", {"beta": 0})


def test_plan_homogeneous_writes_a_ruled_plan_and_refuses_a_bad_rule_in_one_line(polykv, tmp_path):
    out = tmp_path / "tova-pyramid.json"
    result = polykv("plan", "homogeneous", "tova", "--capacity", "32", "--scope", "prefill", "--rule", "pyramid",
                    "--rule-param", "window=8", "-o", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = Plan.load(out)
    assert sum(layer.prefill.capacity for layer in plan.layers) == 5 * 32 and plan.provenance["rule"] == "pyramid"
    bad = polykv("plan", "homogeneous", "tova", "--capacity", "32", "--rule", "pyramid", "--rule-param", "beta=0",
                 "-o", str(tmp_path / "bad.json"))  # fmt: skip
    assert_one_line_error(bad, "the pyramid rule's beta")
    assert not (tmp_path / "bad.json").exists()

"""Head-level budgets (`head_allocation: "adakv"`, `polykv.methods.head_budgets`): Ada-KV's choice across a layer's KV
heads, computed by hand; in the runtime each head keeps what the rule says (the safeguard included), never more than
capacity x heads per layer, and the padding of heads that keep fewer is never seen; a safeguard of 1 is the method
alone, room for the whole prompt is the vanilla model, batched equals alone, under a layer rule too; on a tiny Gemma
3 no local layer holds more than its window; plans with the rule validate, save and refuse in one line."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from polykv.eval.results.kv_measured import heads_line, measured_kv
from polykv.eval.suites import answers
from polykv.methods import validate_plan
from polykv.methods.head_budgets import adakv_keep
from polykv.models import cache_argument_name
from polykv.plan import Plan, PlanError
from polykv.runtime import routed
from tests.helpers import assert_batched_as_alone, assert_one_line_error, decode_logits, tiny_model
from tests.test_answers import question_for, vanilla_nll

PROMPT = 60
# the scorers, with parameters that fit a capacity of 20 (windows, sinks and lags under it)
SCORERS = {
    "tova": {},
    "h2o": {},
    "snapkv": {"window": 4},
    "knorm": {},
    "keydiff": {},
    "streamingllm": {},
    "random": {},
    "lagkv": {"sinks": 2, "lag_size": 4},
    "expected_attention": {},
    "scissorhands": {},
    "cake": {"window": 4},
}


def adakv(
    method: str, capacity: int = 20, layers: int = 4, alpha: float | None = None, scope: str = "prefill", **changes
) -> Plan:
    plan = Plan.homogeneous(method, capacity, layers, scope, SCORERS.get(method, {}))
    params = {} if alpha is None else {"alpha_safeguard": alpha}
    return plan.model_copy(update={"head_allocation": "adakv", "head_allocation_params": params, **changes})


def prefilled(model, plan, ids=None, steps: int = 0):
    ids = torch.randint(3, 96, (1, PROMPT), generator=torch.Generator().manual_seed(0)) if ids is None else ids
    with routed(model, plan) as session:
        logits, _ = decode_logits(model, ids, steps, cache_argument_name(model))
    return session.cache, logits


def _scramble(cache) -> None:
    """The padding slots' keys and values (dropped tokens) become large noise."""
    for layer in cache.layers:
        room = (layer.positions < 0)[..., None]
        layer.keys.masked_scatter_(room, torch.randn(int(room.sum()) * layer.keys.shape[-1]) * 50)
        layer.values.masked_scatter_(room, torch.randn(int(room.sum()) * layer.values.shape[-1]) * 50)


def tokens_per_head(layer) -> list[int]:
    return (layer.positions >= 0).sum(-1)[0].tolist()


# ---- the rule, by hand ----------------------------------------------------------------------------------------------
def test_adakv_keeps_the_best_across_heads_and_each_heads_safeguard():
    ranked = torch.tensor([[[9.0, 8, 7, 6, 0], [1, 1.5, 1.2, 1.1, 0]]])  # head 0 stands out, head 1 is flat
    # no safeguard: the 4 best of the layer are all head 0's; head 1 holds 4 slots of padding
    keep, padding = adakv_keep(ranked, 2, 0.0)
    assert keep.tolist() == [[[0, 1, 2, 3], [1, 2, 3, 4]]]
    assert padding.tolist() == [[[False] * 4, [True] * 4]]
    # alpha 0.5 of capacity 2: each head keeps its own best 1 (head 1: slot 1, 1.5), the layer 4 in all
    keep, padding = adakv_keep(ranked, 2, 0.5)
    real = keep.masked_fill(padding, -1)
    assert sorted(real[0, 0].tolist()) == [0, 1, 2] and [s for s in real[0, 1].tolist() if s >= 0] == [1]
    assert int((~padding).sum()) == 4
    # alpha 1: each head keeps its own 2 best, no padding: the method alone
    keep, padding = adakv_keep(ranked, 2, 1.0)
    assert keep.tolist() == [[[0, 1], [1, 2]]] and padding is None


def test_protected_slots_stay_whatever_the_split():
    inf = float("inf")
    ranked = torch.tensor([[[9.0, 8, 7, 6, 5], [inf, 0, 0, 0, inf]]])  # head 1's sink and newest are protected
    keep, padding = adakv_keep(ranked, 3, 0.0)
    real = keep.masked_fill(padding, -1)
    assert real[0, 0].tolist() == [0, 1, 2, 3] and sorted(real[0, 1].tolist()) == [-1, -1, 0, 4]


# ---- in the runtime ---------------------------------------------------------------------------------------------
def test_each_head_keeps_what_the_rule_says_of_the_methods_own_scores():
    model = tiny_model("llama", num_hidden_layers=4)
    ids = torch.randint(3, 96, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    cache, _ = prefilled(model, adakv("knorm", alpha=0.2), ids)
    with torch.no_grad():  # Knorm's scores by hand: minus each key's norm, from the unmodified model's cache
        keys = model(ids, use_cache=True).past_key_values.layers
    spread = 0
    for layer, vanilla in zip(cache.layers, keys):
        keep, padding = adakv_keep(-vanilla.keys.float().norm(dim=-1), 20, 0.2)
        expected = keep.masked_fill(padding, -1) if padding is not None else keep
        assert torch.equal(layer.positions.sort(-1).values, expected.sort(-1).values)
        counts = tokens_per_head(layer)
        assert (
            sum(counts) == 20 * 2 and min(counts) >= int(20 * 0.2) and layer.slots.held() == 20
        )  # h x k, the safeguard
        spread += max(counts) - min(counts)
    assert spread > 0  # the heads did keep different numbers: the test saw padding
    held = cache.kv_held()  # measured per head where a layer's heads differ
    for layer, heads in zip(cache.layers, held["heads_entering"]):
        counts = tokens_per_head(layer)
        assert heads == (None if len(set(counts)) == 1 else counts)


@pytest.mark.parametrize("method", sorted(SCORERS))
def test_every_scorer_runs_under_the_rule_within_capacity_times_heads(method):
    model = tiny_model("llama", num_hidden_layers=4)
    cache, logits = prefilled(model, adakv(method), steps=3)
    assert all(torch.isfinite(step).all() for step in logits)
    for layer in cache.layers:  # 20 per head on average after the prompt, every decode token kept
        assert sum(tokens_per_head(layer)) == 2 * (20 + 3) and layer.slots.held() == 23
        assert min(tokens_per_head(layer)) >= int(20 * 0.2) + 3
    assert cache.kv_held()["end"] == [23] * 4


def test_padding_is_never_seen():
    model = tiny_model("llama", num_hidden_layers=4)
    ids = torch.randint(3, 96, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    plan = adakv("keydiff", alpha=0.0)
    _, clean = prefilled(model, plan, ids, steps=4)

    assert any(bool((layer.positions < 0).any()) for layer in prefilled(model, plan, ids)[0].layers)
    with routed(model, plan):
        noisy, _ = decode_logits(model, ids, 4, cache_argument_name(model), after_prefill=_scramble)
    assert all(torch.equal(a, b) for a, b in zip(clean, noisy))


DECODE_SCORERS = ("tova", "h2o", "knorm", "keydiff", "streamingllm", "random")


@pytest.mark.parametrize("method", DECODE_SCORERS)
def test_in_decode_every_step_keeps_capacity_x_heads_across_the_heads_with_the_safeguard(method):
    """The decode rule: each step's new token joins every head, and the layer keeps its capacity x heads best of the
    method's scores across its heads (the h lowest go), every head at least its own floor(capacity x alpha)."""
    model = tiny_model("llama", num_hidden_layers=4)
    plan = adakv(method, alpha=0.2, scope="both")
    for steps in range(7):  # the cache after the prompt, then after each of 6 decode steps
        cache, logits = prefilled(model, plan, steps=steps)
        for layer in cache.layers:
            counts = tokens_per_head(layer)
            assert sum(counts) == 2 * 20 and min(counts) >= int(20 * 0.2), (method, steps, layer.layer_idx, counts)
        assert all(torch.isfinite(step).all() for step in logits) and cache.kv_held()["end"] == [20] * 4


@pytest.mark.parametrize("method", ["knorm", "cake"])  # CAKE reads each step's attention: its signals are masked
def test_in_decode_the_padding_is_never_seen_either(method):
    model = tiny_model("llama", num_hidden_layers=4)
    ids = torch.randint(3, 96, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    plan = adakv(method, alpha=0.0, scope="both")
    _, clean = prefilled(model, plan, ids, steps=6)
    with routed(model, plan):
        noisy, cache = decode_logits(model, ids, 6, cache_argument_name(model), after_prefill=_scramble)
    assert any(bool((layer.positions < 0).any()) for layer in cache.layers)
    assert all(torch.equal(a, b) for a, b in zip(clean, noisy))


def test_a_safeguard_of_one_is_the_method_alone():
    model = tiny_model("llama", num_hidden_layers=4)
    for method in ("knorm", "snapkv", "keydiff"):
        alone = Plan.homogeneous(method, 20, 4, "prefill", SCORERS[method])
        a, logits_a = prefilled(model, alone, steps=3)
        b, logits_b = prefilled(model, adakv(method, alpha=1.0), steps=3)
        assert [x.positions.tolist() for x in a.layers] == [x.positions.tolist() for x in b.layers], method
        assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(logits_a, logits_b)), method


def test_room_for_the_whole_prompt_is_the_vanilla_model():
    model = tiny_model("llama", num_hidden_layers=4)
    question = question_for(model, PROMPT, 6)
    assert answers.answer_alone(model, adakv("tova", 1000), question, "score").nll == vanilla_nll(model, question)


@pytest.mark.parametrize("start", [None, 50])
def test_batched_gives_what_it_gives_alone(start):
    model = tiny_model("llama", num_hidden_layers=4)
    question = dataclasses.replace(question_for(model, PROMPT, 6), question_start=start)
    plans = [adakv(m) for m in ("tova", "snapkv", "knorm", "keydiff", "random")]
    plans += [adakv(m, scope="both") for m in ("knorm", "keydiff", "h2o")]  # the decode rule too
    plans.append(adakv("h2o", allocation="cake", allocation_params={"window": 8}))  # under a layer rule too
    assert_batched_as_alone(model, plans, question)


def test_under_a_layer_rule_each_layer_splits_the_capacity_the_rule_gave_it():
    model = tiny_model("llama", num_hidden_layers=4)
    cake = adakv("tova", allocation="cake", allocation_params={"window": 4})
    cache, _ = prefilled(model, cake)
    uniform_heads, _ = prefilled(model, cake.model_copy(update={"head_allocation": "uniform"}))
    assert cache.capacities("prefill") == uniform_heads.capacities("prefill")
    assert [layer.slots.held() for layer in cache.layers] == cache.capacities("prefill")


def test_on_a_hybrid_model_no_local_layer_holds_more_than_its_window():
    model = tiny_model("gemma3")  # window 16 on layers 0 and 1, layer 2 global
    cache, _ = prefilled(model, adakv("keydiff", 12, 3, alpha=0.0), steps=4)
    for layer in cache.layers[:2]:
        assert max(tokens_per_head(layer)) <= 15 and layer.slots.held() <= 15
    assert max(cache.kv_held()["entering"][:2]) <= 15


def test_plans_with_the_rule_validate_save_and_refuse_in_one_line():
    plan = adakv("tova", alpha=0.3)
    assert Plan.from_json(plan.to_json()) == plan and validate_plan(plan, 4) is plan
    assert "head_allocation" not in Plan.homogeneous("tova", 20, 4).to_dict()  # plans without it read as before
    with pytest.raises(PlanError, match="cannot split a merging method's decode eviction over the heads .layer 0: cam"):
        validate_plan(Plan.homogeneous("cam", 20, 4, "decode").model_copy(update={"head_allocation": "adakv"}), 4)
    intervals = Plan.homogeneous("tova", 20, 4, "decode").to_dict()
    intervals["layers"] = [{"decode": {"method": "tova", "capacity": 20, "interval": 4}}] * 4
    with pytest.raises(PlanError, match="evicts a step at a time: layer 0's decode interval must be 1"):
        validate_plan(Plan.from_dict(intervals | {"head_allocation": "adakv"}), 4)
    with pytest.raises(PlanError, match="head_allocation_params: .*alpha_safeguard"):
        validate_plan(adakv("tova", alpha=1.5), 4)
    with pytest.raises(PlanError, match="only head_allocation 'adakv' takes them"):
        validate_plan(Plan.homogeneous("tova", 20, 4, "prefill").model_copy(
            update={"head_allocation_params": {"alpha_safeguard": 0.2}}), 4)  # fmt: skip


def test_the_measured_kv_keeps_each_heads_mean_where_heads_differ():
    row = lambda heads: SimpleNamespace(  # noqa: E731
        kv_held={
            "entering": [20, 20],
            "end": [20, 20],
            "seen_entering": 60,
            "seen_end": 60,
            "heads_entering": [heads, None],
            "heads_end": [heads, None],
        }  # fmt: skip
    )
    kv = measured_kv([row([10, 30]), row([14, 26])])
    assert kv.heads_entering == [[12, 28], None]
    assert heads_line(kv) == "per KV head entering the answer (layers whose heads differ): 0: 12/28"
    assert heads_line(measured_kv([SimpleNamespace(kv_held={**row([1, 1]).kv_held, "heads_entering": None})])) is None
    even = SimpleNamespace(kv_held={**row([20, 20]).kv_held, "heads_entering": [None, None]})  # heads held the same
    assert measured_kv([row([10, 30]), even]).heads_entering == [[15, 25], None]  # counted, not left out


def test_plan_homogeneous_writes_an_adakv_plan_and_refuses_a_merging_decode_method(polykv, tmp_path):
    out = tmp_path / "adakv.json"
    made = polykv("plan", "homogeneous", "snapkv", "--capacity", "64", "--scope", "prefill", "--heads", "adakv",
                  "--alpha-safeguard", "0.25", "-o", str(out))  # fmt: skip
    assert made.returncode == 0, made.stderr
    plan = Plan.load(out)
    assert plan.head_allocation == "adakv" and plan.head_allocation_params == {"alpha_safeguard": 0.25}
    shown = polykv("plan", "show", str(out)).stdout
    assert "heads adakv" in shown and "at least 0.25 of the capacity" in shown and plan.name.endswith("-adakv")
    bad = polykv("plan", "homogeneous", "cam", "--scope", "decode", "--capacity", "64", "--heads", "adakv",
                 "-o", str(tmp_path / "b.json"))  # fmt: skip
    assert_one_line_error(bad, "cannot split a merging method's decode eviction over the heads")
    assert not (tmp_path / "b.json").exists()

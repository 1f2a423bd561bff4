"""The routed-cache backend executes plans exactly: no drift for `full`, true positions, real eviction."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from polykv.methods import REGISTRY, params_that_fit
from polykv.models import cache_argument_name, layer_windows
from polykv.plan import LayerPlan, PhaseAssignment, Plan, Scope
from polykv.runtime import RoutedCache, RoutedCacheError, routed
from tests.helpers import (
    FAMILIES,
    STEPS,
    decode_logits,
    decode_sizes,
    evict_positions,
    max_diff,
    prompt,
    run_routed,
    tiny_model,
)

TOL = 1e-5


def capacity_plan(model, method: str, capacity: int, **params) -> Plan:
    """Homogeneous plan over every phase the method supports."""
    phases = REGISTRY[method].phases
    scope = Scope.BOTH if len(phases) == 2 else Scope(next(iter(phases)).value)
    return Plan.homogeneous(method, capacity, model.config.num_hidden_layers, scope, params)


def test_full_plan_is_exact_on_every_family(family_model):
    ids = prompt(family_model)
    vanilla, _ = decode_logits(family_model, ids, STEPS, cache_argument_name(family_model))
    plan = Plan.homogeneous("full", None, family_model.config.num_hidden_layers)
    logits, cache = run_routed(family_model, plan, ids)
    assert isinstance(cache, RoutedCache)
    assert len(logits) == STEPS + 1 and logits[0].shape[1] == ids.shape[1]  # prefill logits at every position
    assert max_diff(vanilla, logits) <= TOL


def test_full_plan_is_exact_on_the_demo_model(demo_model):
    model, tokenizer = demo_model
    ids = tokenizer("Once upon a time, there was a little girl named Lily.", return_tensors="pt").input_ids
    vanilla, _ = decode_logits(model, ids, STEPS, cache_argument_name(model))
    logits, _ = run_routed(model, Plan.homogeneous("full", None, model.config.num_hidden_layers), ids)
    assert max_diff(vanilla, logits) <= TOL


def test_mixed_plan_on_the_demo_model_keeps_capacities(demo_model):
    model, tokenizer = demo_model
    plan = Plan.load(Path(__file__).resolve().parents[1] / "plans" / "demo" / "mixed.json")
    ids = tokenizer(" ".join(["Lily saw a big red ball in the park."] * 12), return_tensors="pt").input_ids
    with routed(model, plan) as session:
        out = model.generate(ids, max_new_tokens=40, min_new_tokens=40, do_sample=False)
    cache = session.cache
    assert [layer.retained_after_prefill for layer in cache.layers] == [a.prefill.capacity for a in plan.layers]
    assert cache.retained_per_layer() == [a.decode.capacity for a in plan.layers]
    assert cache.get_seq_length() == out.shape[1] - 1  # the last token is never fed back


def test_mistral_sliding_window_matches_vanilla_past_the_window():
    model = tiny_model("mistral", sliding_window=24)
    ids = prompt(model, length=20)
    vanilla, _ = decode_logits(model, ids, STEPS, cache_argument_name(model))
    logits, _ = run_routed(model, Plan.homogeneous("full", None, 3), ids)
    assert max_diff(vanilla, logits) <= TOL  # 20 + 16 tokens crosses the 24-token window


@pytest.mark.parametrize("method", [m for m in REGISTRY if m != "full"])
def test_capacity_at_least_length_behaves_like_full(method, llama):
    ids = prompt(llama)
    vanilla, _ = decode_logits(llama, ids, STEPS, cache_argument_name(llama))
    capacity = ids.shape[1] + STEPS + 1
    logits, cache = run_routed(llama, capacity_plan(llama, method, capacity, **params_that_fit(method, capacity)), ids)
    assert max_diff(vanilla, logits) <= TOL
    assert cache.retained_per_layer() == [ids.shape[1] + STEPS] * 3


def test_physical_eviction_equals_masking_reference(llama):
    """Evicting positions from one layer == keeping them and masking them out of that layer's attention."""
    layer, evicted = 1, torch.tensor([0, 3, 7, 10, 11, 12, 13, 14, 15, 30])
    ids = prompt(llama)

    def masked_reference(module, query, key, value, attention_mask, **kwargs):
        if module.layer_idx == layer and query.shape[2] == 1:  # decode steps only: eviction follows prefill
            allowed = torch.ones(key.shape[2], dtype=torch.bool)
            allowed[evicted] = False
            mask = allowed.view(1, 1, 1, -1).expand(query.shape[0], query.shape[1], 1, -1)
            rep = module.num_key_value_groups
            out = torch.nn.functional.scaled_dot_product_attention(
                query,
                key.repeat_interleave(rep, 1),
                value.repeat_interleave(rep, 1),
                attn_mask=mask,
                scale=module.scaling,
            )
            return out.transpose(1, 2).contiguous(), None
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("polykv_test_masked", masked_reference)
    llama.set_attn_implementation("polykv_test_masked")
    try:
        reference, _ = decode_logits(llama, ids, 8, cache_argument_name(llama))
    finally:
        llama.set_attn_implementation("sdpa")

    def evict(cache):
        evict_positions(cache.layers[layer], evicted)

    logits, cache = run_routed(llama, Plan.homogeneous("full", None, 3), ids, steps=8, after_prefill=evict)
    assert max_diff(reference, logits) <= TOL
    held = cache.retained_per_layer()
    assert held[layer] == ids.shape[1] + 8 - len(evicted) and held[0] == ids.shape[1] + 8
    assert cache.get_seq_length() == ids.shape[1] + 8  # true length: RoPE positions continue from it
    assert not torch.isin(cache.layers[layer].positions, evicted).any()


def _within(n: int, held: int | None) -> int:
    return n if held is None else min(n, held)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_compression_holds_capacity_every_step_in_a_mixed_plan(family):
    model = tiny_model(family)
    ids = prompt(model, length=48)
    plan = Plan(
        name="mixed",
        scope=Scope.BOTH,
        layers=[
            LayerPlan(
                prefill=PhaseAssignment(method="snapkv", capacity=20, params={"window": 4}),
                decode=PhaseAssignment(method="tova", capacity=24),
            ),
            LayerPlan(
                prefill=PhaseAssignment(method="h2o", capacity=30), decode=PhaseAssignment(method="h2o", capacity=16)
            ),
            LayerPlan(
                prefill=PhaseAssignment(method="streamingllm", capacity=64),
                decode=PhaseAssignment(method="streamingllm", capacity=52),
            ),
        ],
    )
    (prefilled, *sizes), cache = decode_sizes(model, plan, ids, 12)
    # a local layer (gemma3's first two) holds at most its window less the coming token, whatever the plan
    held = [None if w is None else w - 1 for w in layer_windows(model)]
    assert prefilled == [_within(n, h) for n, h in zip([20, 30, 48], held)]  # min(capacity, length)
    # tova grows from 20 to its decode capacity 24 and stays; h2o cuts 30 -> 16; streamingllm fills to 52.
    assert [s[0] for s in sizes] == [_within(n, held[0]) for n in [21, 22, 23, 24] + [24] * 8]
    assert all(s[1] == _within(16, held[1]) for s in sizes)
    assert [s[2] for s in sizes] == [_within(n, held[2]) for n in [49, 50, 51, 52] + [52] * 8]
    assert cache.get_seq_length() == 48 + 12
    for layer in cache.layers:  # every slot holds a distinct true position
        pos = layer.positions.sort(dim=-1).values
        assert (pos[..., 1:] > pos[..., :-1]).all()
        assert layer.keys.shape[1] == model.config.num_key_value_heads  # GQA: cache stays at KV-head size


def test_generate_with_a_plan_and_restores_the_model(llama):
    ids = prompt(llama)
    plan = capacity_plan(llama, "tova", 16)
    with routed(llama, plan) as session:
        out = llama.generate(ids, max_new_tokens=10, min_new_tokens=10, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 10)
    assert session.cache.retained_per_layer() == [16, 16, 16]
    assert llama.config._attn_implementation == "sdpa"
    assert not llama._forward_pre_hooks
    vanilla = llama.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    with torch.no_grad():
        assert not isinstance(llama(ids, use_cache=True).past_key_values, RoutedCache)
    assert vanilla.shape[1] == ids.shape[1] + 4


def test_equal_length_batch_matches_single_rows(llama):
    ids = prompt(llama, batch=2)
    plan = capacity_plan(llama, "h2o", 20)
    batched, _ = run_routed(llama, plan, ids, steps=6)
    for row in range(2):
        single, _ = run_routed(llama, plan, ids[row : row + 1], steps=6)
        assert max_diff([b[row : row + 1] for b in batched], single) <= 1e-4


def test_padded_batch_is_refused_with_a_clear_error(llama):
    ids = prompt(llama, batch=2)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with routed(llama, capacity_plan(llama, "tova", 16)):
        with pytest.raises(RoutedCacheError, match="padded batches are not supported"):
            llama(ids, attention_mask=mask, use_cache=True)
        with pytest.raises(RoutedCacheError, match="this forward would get no padding mask"):
            llama(ids, attention_mask=mask, use_cache=False)  # no routed cache, and still no mask in this thread


def test_routed_refuses_a_plan_for_another_model(llama):
    from polykv.plan import PlanError

    with pytest.raises(PlanError, match="the plan has 5 layers but the model has 3"):
        with routed(llama, Plan.homogeneous("tova", 8, 5)):
            pass
    assert llama.config._attn_implementation == "sdpa"


def test_kv_bytes_are_nominal(llama):
    ids = prompt(llama, length=64)
    _, cache = run_routed(llama, capacity_plan(llama, "streamingllm", 32), ids, steps=4)
    cfg = llama.config
    nominal = 2 * 32 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4  # k+v, fp32
    assert [layer.keys.nbytes + layer.values.nbytes for layer in cache.layers] == [nominal] * 3


def test_decode_phase_methods_after_full_prefill(llama):
    ids = prompt(llama, length=40)
    for method in ("h2o", "tova", "streamingllm"):
        plan = Plan.homogeneous(method, 12, 3, scope="decode")
        logits, cache = run_routed(llama, plan, ids, steps=3)
        assert cache.retained_per_layer() == [12, 12, 12], method
        # prefill is untouched: its logits equal the vanilla model's
        vanilla, _ = decode_logits(llama, ids, 0, cache_argument_name(llama))
        assert max_diff(vanilla, logits[:1]) <= TOL


def test_a_routed_cache_cannot_be_cropped_so_assisted_decoding_refuses_it():
    cache = RoutedCache(Plan.homogeneous("tova", 8, 3))
    assert cache.is_croppable is False  # transformers checks this before assisted decoding crops a draft away

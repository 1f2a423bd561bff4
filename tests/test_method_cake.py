"""CAKE in a decode-only plan: the prompt is cut with CAKE's prompt rule at the first decode step."""

from __future__ import annotations

import pytest
import torch

from polykv.methods.attention.cake import CAKE
from polykv.models import cache_argument_name, output_cache
from polykv.plan import Phase, Plan
from polykv.runtime import routed
from tests.helpers import decode_logits, kept, layer_view, tiny_model

LAYERS, PROMPT, WINDOW = 3, 48, 4


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _prompt(seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 96, (1, PROMPT), generator=torch.Generator().manual_seed(seed))


def _kept_positions(model, plan: Plan, ids: torch.Tensor, steps: int):
    """Per layer, per KV head: the sorted positions the cache holds after prefill + `steps` decode steps."""
    with routed(model, plan) as session:
        decode_logits(model, ids, steps, cache_argument_name(model))
    return [layer.positions[0].sort(dim=-1).values.tolist() for layer in session.cache.layers], session.cache


@pytest.mark.parametrize("capacity", [WINDOW + 2, 12, 30, PROMPT])
def test_first_decode_cut_equals_the_prompt_rule_on_the_same_prompt(model, capacity):
    # A decode-only CAKE at capacity C holds, after the first decode step, the new token plus C - 1
    # prompt tokens: the window and the C - 1 - w prompt tokens of highest indicator. A prefill CAKE
    # at capacity C - 1 keeps the window and the C - 1 - w highest: the same prompt tokens. (Both see
    # the same prompt attention: prefill outputs are computed over the whole prompt either way.)
    # C = PROMPT: the first decode step drops a single slot (the one-slot path of the cut).
    params = {"window": WINDOW, "gamma": 200.0}
    for seed in (0, 1):
        ids = _prompt(seed)
        decode_only, cache = _kept_positions(
            model, Plan.homogeneous("cake", capacity, LAYERS, "decode", params), ids, 1
        )
        prefill_only, _ = _kept_positions(
            model, Plan.homogeneous("cake", capacity - 1, LAYERS, "prefill", params), ids, 0
        )
        assert cache.retained_per_layer() == [capacity] * LAYERS
        for layer_dec, layer_pre in zip(decode_only, prefill_only):
            for head_dec, head_pre in zip(layer_dec, layer_pre):
                assert head_dec[-1] == PROMPT  # the new token stays
                assert head_dec[:-1] == head_pre  # and the prompt tokens are the prompt rule's
                assert head_pre[-WINDOW:] == list(range(PROMPT - WINDOW, PROMPT))  # the window among them
        # The heads chose differently somewhere: the comparison is not trivially about the window.
        assert any(len({tuple(h) for h in layer}) > 1 for layer in prefill_only) or capacity == PROMPT


def test_later_decode_steps_follow_the_decode_rule(model):
    capacity = 16
    plan = Plan.homogeneous("cake", capacity, LAYERS, "decode", {"window": WINDOW})
    with routed(model, plan) as session:
        needs = []
        decode_logits(model, _prompt(), 0, cache_argument_name(model))
        cache = session.cache
        layer = cache.layers[0]
        cake = layer.methods[Phase.DECODE]
        assert cake.per_token["prompt_score"].shape[-1] == PROMPT  # stored at prefill, nothing evicted yet
        # One more token: the first cut needs no attention rows (it uses the stored indicator) ...
        needs.append(cake.needs(Phase.DECODE, PROMPT + 1))
        decode_logits(model, _prompt()[:, :1], 2, cache_argument_name(model), cache=cache)
    assert needs[0].rows == 0
    # ... it was dropped after that first step, and later steps ask for the current query's row.
    assert "prompt_score" not in cake.per_token and cake.needs(Phase.DECODE, capacity + 1).rows == 1
    assert cache.retained_per_layer() == [capacity] * LAYERS


def test_hand_made_prompt_indicator_beats_the_current_query():
    # 10 prompt tokens, window 2: the indicator favours token 3 (high variance) and token 5 (high mean);
    # the first decode query attends only to token 1, which the prompt rule ranks lowest but one.
    n, w = 10, 2
    rows = torch.full((1, 2, w, n), 0.05)
    rows[:, :, 0, 3], rows[:, :, 1, 3] = 0.0, 0.6
    rows[:, :, :, 5] = 0.32
    method = CAKE(capacity=w + 3, params={"window": w, "gamma": 200.0, "kernel_size": 1})
    method.observe_prefill(layer_view(n, phase=Phase.PREFILL, rows=rows))
    decode_rows = torch.zeros(1, 2, 1, n + 1)
    decode_rows[..., 1] = 1.0
    ev = method.step(layer_view(n + 1, rows=decode_rows))
    assert kept(ev, n + 1) == [[3, 5, 8, 9, 10]] * 2  # two best prompt tokens, the window, the new token


def test_decode_pooling_follows_positions_when_slots_are_unordered():
    # Slot 0 holds the newest token (position 7, the window); the others hold positions 0..6. By
    # position the attention is [0.2, 0, 0.3, 0.3, 0.3, 0, 0, | 0.9], pooled (avg, kernel 3, zero padding)
    # [0.07, 0.17, 0.2, 0.3, 0.2, 0.1, 0.3]: position 0 goes. Pooling in slot order instead would drop
    # position 6 (slot 7, whose slot neighbours score 0).
    by_position = [0.2, 0.0, 0.3, 0.3, 0.3, 0.0, 0.0, 0.9]
    positions = [7, 0, 1, 2, 3, 4, 5, 6]
    rows = torch.tensor([by_position[p] for p in positions]).expand(2, 1, 8)
    method = CAKE(capacity=7, params={"window": 1, "kernel_size": 3})
    ev = method.step(layer_view(positions=positions, rows=rows))
    assert kept(ev, 8) == [[0, 2, 3, 4, 5, 6, 7]] * 2  # slot 1 (position 0) went


def test_a_capacity_without_room_for_window_and_new_token_keeps_the_most_recent():
    # Native allocation may give a layer just its window (budget 0 + w): then the w most recent stay.
    n, w = 10, 3
    rows = torch.rand(1, 2, w, n, generator=torch.Generator().manual_seed(0)).softmax(-1)
    method = CAKE(capacity=w, params={"window": w, "kernel_size": 1})
    method.observe_prefill(layer_view(n, phase=Phase.PREFILL, rows=rows))
    assert kept(method.step(layer_view(n + 1)), n + 1) == [[8, 9, 10]] * 2


def test_a_prompt_cut_at_prefill_keeps_the_decode_rule(model):
    # CAKE in both phases: the prefill already cut the prompt, so the first decode step is the usual
    # one-slot step scored by the current query (the stored indicator no longer covers the whole prompt).
    plan = Plan.homogeneous("cake", 16, LAYERS, "both", {"window": WINDOW})
    with routed(model, plan) as session:
        decode_logits(model, _prompt(), 0, cache_argument_name(model))
        cake = session.cache.layers[0].methods[Phase.DECODE]
        assert cake.per_token["prompt_score"].shape[-1] == 16 < cake.prompt_length == PROMPT
        assert cake.needs(Phase.DECODE, 17).rows == 1


def test_native_decode_only_plan_runs_within_its_budgets():
    model = tiny_model("llama", num_hidden_layers=4)
    plan = Plan.homogeneous("cake", 20, 4, "decode", {"window": WINDOW}, allocation="native")
    with routed(model, plan) as session:
        decode_logits(model, _prompt(), 3, cache_argument_name(model))
    cache = session.cache
    budgets = cache.capacities("decode")
    assert sum(budgets) == 4 * 20 and len(set(budgets)) > 1  # the layer preferences split the total
    assert cache.retained_per_layer() == budgets
    assert [layer.retained_after_prefill for layer in cache.layers] == [PROMPT] * 4  # prefill kept everything


@pytest.mark.parametrize("scope", ["decode", "both", "tova-prefill"])
def test_the_one_argmin_step_chooses_what_the_masked_rule_chooses(model, monkeypatch, scope):
    # Once the window holds only decode tokens they are all held and sort last, so the usual step takes
    # one argmin over the others instead of masking the window: the same tokens go, step after step,
    # also after a prefill method that evicted part of the prompt's window (TOVA here).
    capacity, steps = 12, 3 * WINDOW
    if scope == "tova-prefill":
        data = Plan.homogeneous("cake", capacity, LAYERS, "both", {"window": WINDOW}).model_dump(mode="json")
        for layer in data["layers"]:
            layer["prefill"] = {"method": "tova", "capacity": capacity}
        plan = Plan.model_validate(data)
    else:
        plan = Plan.homogeneous("cake", capacity, LAYERS, scope, {"window": WINDOW})

    def run():
        positions, logits = [], []
        name = cache_argument_name(model)
        with routed(model, plan), torch.no_grad():
            out = model(_prompt(), use_cache=True)
            cache = output_cache(out)
            for _ in range(steps):
                out = model(out.logits[:, -1:].argmax(-1), use_cache=True, **{name: cache})
                logits.append(out.logits)
                positions.append([layer.positions.sort(dim=-1).values.clone() for layer in cache.layers])
        return positions, logits

    calls = []
    original = CAKE._window_is_last
    monkeypatch.setattr(CAKE, "_window_is_last", lambda self, view: calls.append(original(self, view)) or calls[-1])
    fast = run()
    monkeypatch.setattr(CAKE, "_window_is_last", lambda self, view: False)
    masked = run()
    assert any(calls) and not all(calls)  # both paths ran in the first run
    for fast_step, masked_step in zip(fast[0], masked[0]):
        assert all(torch.equal(a, b) for a, b in zip(fast_step, masked_step))
    assert all(torch.equal(a, b) for a, b in zip(fast[1], masked[1]))

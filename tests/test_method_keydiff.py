"""KeyDiff (Park et al., 2025; kvpress's `KeyDiffPress`): the keys least like the mean key direction stay."""

from __future__ import annotations

import pytest
import torch

from polykv.methods import REGISTRY, for_phase
from polykv.methods.attention_free.keydiff import KeyDiff
from polykv.methods.base import NOTHING
from polykv.models import cache_argument_name, output_cache
from polykv.plan import Phase, Plan
from polykv.runtime import routed
from tests.helpers import kept, layer_view, prompt, tiny_model

# Head 0: three keys along x, one along y, one along -x. The mean unit key is (0.4, 0.2); the cosines are
# 0.894 (x), 0.447 (y), -0.894 (-x): minus the cosines rank -x first, then y, then the x keys.
# Head 1: unit keys (0,1) three times, (1,0), (0.707,0.707): mean (0.341, 0.741); the cosines are 0.908 (y),
# 0.418 (x), 0.938 (the diagonal): x first, then the y keys (tied), the diagonal last.
KEYS = torch.tensor(
    [
        [[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [0.0, 1.0], [-1.0, 0.0]],
        [[0.0, 1.0], [0.0, 5.0], [1.0, 0.0], [0.0, 2.0], [1.0, 1.0]],
    ]
)


def test_scores_are_minus_the_cosine_to_the_mean_unit_key_and_the_most_distinctive_stay():
    view = layer_view(keys=KEYS, values=torch.zeros_like(KEYS), phase=Phase.PREFILL)
    assert kept(KeyDiff(1).step(view), 5) == [[4], [2]]
    assert kept(KeyDiff(2).step(view), 5)[0] == [3, 4]  # head 1's second place is a three-way tie
    anchor = torch.tensor([0.341421, 0.741421])
    cosine = KEYS[1] @ anchor / (KEYS[1].norm(dim=-1) * anchor.norm())
    assert cosine.tolist() == pytest.approx([0.9083, 0.9083, 0.4183, 0.9083, 0.9381], abs=1e-4)
    assert kept(KeyDiff(4).step(view), 5)[1] == [0, 1, 2, 3]  # the diagonal key, the most typical, goes


def test_a_decode_step_takes_the_anchor_again_with_the_new_key_and_drops_one():
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [1.0, 0.1]]])  # the new key last, close to x
    view = layer_view(keys=keys, values=torch.zeros_like(keys))
    eviction = KeyDiff(3).step(view)
    # mean unit key ~ (0.25, 0.27): the new key and the first x key are the least distinctive; the first goes
    cosines = torch.nn.functional.cosine_similarity(keys[0], torch.nn.functional.normalize(keys[0]).mean(0), dim=-1)
    assert eviction.dropped is not None and eviction.dropped[0, 0, 0] == int(cosines.argmax())


def test_hidden_slots_are_left_out_of_the_anchor_and_go_first():
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]]])
    view = layer_view(keys=keys, values=torch.zeros_like(keys), phase=Phase.PREFILL)
    view.hidden = torch.tensor([[[False, False, False, True, True]]])  # two x keys no query sees
    # seen: x, y, y: the anchor leans to y, so x (slot 0) is the distinctive one; hidden slots go first
    assert kept(KeyDiff(1).step(view), 5) == [[0]]


def test_it_runs_in_both_phases_and_reads_no_attention():
    assert REGISTRY["keydiff"] is KeyDiff
    assert "keydiff" in for_phase(Phase.PREFILL) and "keydiff" in for_phase(Phase.DECODE)
    assert KeyDiff(3).needs(Phase.PREFILL, 100) == NOTHING and KeyDiff(3).needs(Phase.DECODE, 100) == NOTHING


def test_on_a_model_the_prompt_keeps_what_kvpress_keeps_in_every_layer_and_head():
    model = tiny_model("qwen3")
    ids = prompt(model, length=30)
    with torch.no_grad():
        full = output_cache(model(ids, use_cache=True))
    plan = Plan.homogeneous("keydiff", 12, model.config.num_hidden_layers, "prefill")
    with torch.no_grad(), routed(model, plan) as session:
        model(ids, use_cache=True, **{cache_argument_name(model): session.new_cache()})
    for layer, full_layer in zip(session.cache.layers, full.layers):
        keys = full_layer.keys  # kvpress: minus the cosine to the mean of the unit keys, top-k
        anchor = torch.nn.functional.normalize(keys, p=2, dim=-1).mean(dim=2, keepdim=True)
        scores = -torch.nn.functional.cosine_similarity(keys, anchor, dim=-1)
        assert torch.equal(layer.positions.sort(-1).values, scores.topk(12, dim=-1).indices.sort(-1).values)

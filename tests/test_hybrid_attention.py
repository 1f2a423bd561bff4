"""Local (sliding-window) layers under routed plans, on a tiny random Gemma 3 (two local layers with a 16-token
window, one global layer; 2 KV heads, so heads keep different tokens): a local layer holds only what a later
query can see, never more than its window less one, whatever its plan; its method chooses within the window."""

from __future__ import annotations

import pytest
import torch

from polykv.kv_memory import window_notes
from polykv.methods import REGISTRY, params_that_fit
from polykv.models import layer_windows
from polykv.plan import Plan
from tests.helpers import decode_sizes, prompt, tiny_model

WINDOW = 16


def every_method(capacity: int, layers: int = 3) -> list[Plan]:
    return [
        Plan.homogeneous(name, capacity, layers, phase.value, params=params_that_fit(name, capacity))
        for name, cls in REGISTRY.items()
        if name != "full"
        for phase in sorted(cls.phases, key=str)
    ]


@pytest.fixture(scope="module")
def gemma():
    model = tiny_model("gemma3")
    assert layer_windows(model) == [WINDOW, WINDOW, None]
    return model


@pytest.mark.parametrize("capacity", [8, 40], ids=["within-the-window", "above-the-window"])
def test_no_local_layer_ever_holds_what_its_window_hides(gemma, capacity):
    ids = prompt(gemma, length=40)

    def check(cache):
        for layer in cache.layers[:2]:
            assert layer.retained <= WINDOW - 1
            if layer.window_clean:  # every slot visible to the next query: the step needs no mask
                assert (layer.positions > layer.seen - WINDOW).all()

    for plan in [Plan.homogeneous("full", None, 3), *every_method(capacity)]:
        (prefilled, *sizes), cache = decode_sizes(gemma, plan, ids, 24, each_step=check)
        assert max(prefilled[:2]) <= WINDOW - 1, plan.name
        decode = plan.layers[0].decode
        if capacity < WINDOW - 1 and decode.capacity is not None:  # the method evicts within the window
            assert max(sizes[-1][:2]) <= capacity + decode.interval, plan.name


def test_a_local_layer_chooses_among_the_tokens_its_window_still_shows(gemma):
    # TOVA keeps the slots the newest query attends most; a token out of the window gets no attention, so it is
    # never among them: after the prompt, a local layer's 8 slots all lie in the last 15 positions
    ids = prompt(gemma, length=40)
    (prefilled, *_), cache = decode_sizes(gemma, Plan.homogeneous("tova", 8, 3, "prefill"), ids, 0)
    assert prefilled == [8, 8, 8]
    for layer in cache.layers[:2]:
        assert (layer.positions >= 40 - (WINDOW - 1)).all()
    assert (cache.layers[2].positions < 40 - (WINDOW - 1)).any()  # the global layer may keep older ones


def test_the_validator_notes_say_what_a_plan_asks_of_a_local_layer():
    windows = [512, 512, None, 512]
    roomy = Plan.homogeneous("tova", 768, 4)
    assert window_notes(roomy, windows) == [
        "prefill and decode: layers 0-1, 3 are local (sliding window 512): capacity 768 keeps the window there "
        "(at most 511 tokens), as 'full' does"
    ]
    sinks = Plan.homogeneous("streamingllm", 128, 4, "decode")
    assert window_notes(sinks, windows) == [
        "decode: layers 0-1, 3 are local (sliding window 512): streamingllm's sink tokens leave the window once "
        "the layer has seen 512 tokens (its queries cannot see them)"
    ]
    assert window_notes(Plan.homogeneous("tova", 128, 4), windows) == []
    assert window_notes(roomy, [None] * 4) == []
    pyramid = Plan.homogeneous("pyramidkv", 128, 4, "prefill", allocation="native")
    assert window_notes(pyramid, windows) == [
        "native allocation: the method's rule splits the budget over the layers at run time; layers 0-1, 3 are "
        "local and hold at most their window less one, so what the rule gives them beyond goes to the layers that "
        "can hold it (the total is kept)"
    ]
    assert window_notes(pyramid, [None] * 4) == []


def test_layer_windows_read_the_config_as_transformers_does(gemma):
    from transformers import MistralConfig, Qwen2Config

    assert layer_windows(MistralConfig(num_hidden_layers=2, sliding_window=64)) == [64, 64]  # every layer slides
    assert layer_windows(MistralConfig(num_hidden_layers=2, sliding_window=None)) == [None, None]
    qwen = Qwen2Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=64, max_window_layers=2)
    assert layer_windows(qwen) == [None, None, 64, 64]
    assert layer_windows(Qwen2Config(num_hidden_layers=2)) == [None, None]
    assert layer_windows(gemma.config.to_dict()) == [WINDOW, WINDOW, None]  # a config.json read as a dict


# Knorm is left out: Gemma's k_norm makes every key's norm about the same (4.0 +- 1e-4 here), so its choices are
# ties that a batch's rounding breaks differently
@pytest.mark.parametrize(
    "plan", [p for p in every_method(10) if p.layers[0].decode.method not in ("full", "knorm")], ids=lambda p: p.name
)
def test_a_batch_of_two_prompts_keeps_what_each_keeps_alone_within_the_window(gemma, plan):
    # two prompts at once (and 2 KV heads): heads keep different tokens, so some pad with slots the window hides;
    # a method evicts those first, so the visible slots are the ones each row keeps alone
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, gemma.config.vocab_size, (2, 40), generator=g)
    _, cache = decode_sizes(gemma, plan, ids, 20)
    alone = [decode_sizes(gemma, plan, ids[i : i + 1], 20)[1] for i in range(2)]
    for row in range(2):
        for layer, single in zip(cache.layers, alone[row].layers):
            mine = layer.positions[row]
            visible = mine > layer.seen - (layer.window or layer.seen + 1)
            for head in range(mine.shape[0]):
                assert sorted(mine[head][visible[head]].tolist()) == sorted(single.positions[0, head].tolist())

"""Static-shape decode: an evicting layer writes each new token into the slot its last eviction freed.

The reference (`concatenating_storage`, the path the runtime took before, now kept here) uses no blocks and
writes nothing in place: every step concatenates onto new tensors, and a one-slot drop gathers every slot but
the dropped one into new tensors. Both must keep the same positions and give the same logits, for every method.
"""

from __future__ import annotations

import collections
import contextlib

import pytest
import torch

from polykv.methods import REGISTRY, params_that_fit
from polykv.methods.slots import SlotBlock, SlotStates
from polykv.models import cache_argument_name
from polykv.plan import Phase, Plan
from polykv.runtime import routed
from polykv.runtime.slots import LayerSlots
from tests.helpers import prompt, tiny_model

PROMPT, CAPACITY, STEPS = 40, 16, 12


def _plans(layers: int) -> dict[str, Plan]:
    plans = {}
    for name, cls in REGISTRY.items():
        if name == "full":
            plans[name] = Plan.homogeneous("full", None, layers)
            continue
        params = params_that_fit(name, CAPACITY)
        phase = "decode" if Phase.DECODE in cls.phases else "prefill"
        plans[f"{name}-{phase}"] = Plan.homogeneous(name, CAPACITY, layers, phase, params)
        if phase == "decode" and Phase.PREFILL in cls.phases:
            plans[f"{name}-both"] = Plan.homogeneous(name, CAPACITY, layers, "both", params)
    return plans


PLANS = _plans(3)


def _without(tensor: torch.Tensor, dropped: torch.Tensor) -> torch.Tensor:
    """A new [b, h, n - 1, ...] tensor: slot dropped[b, h, 0] of each head gone, the last slot in its place (the
    slot order the runtime keeps)."""
    b, h, n = tensor.shape[:3]
    index = torch.arange(n - 1, device=tensor.device).expand(b, h, n - 1)
    index = torch.where(index == dropped, n - 1, index)
    index = index.view(b, h, n - 1, *[1] * (tensor.dim() - 3)).expand(b, h, n - 1, *tensor.shape[3:])
    return tensor.gather(2, index)


@contextlib.contextmanager
def concatenating_storage():
    """The reference: inside the block, routed layers keep no blocks and write nothing in place."""

    def write(self, layer, key_states, value_states):  # what a layer that keeps everything does
        self.append(key_states, value_states, layer.seen)

    def drop_one(self, layer, dropped, n, newest_last, deferred):
        keep = _without(torch.arange(n, device=dropped.device).expand(*dropped.shape[:2], n), dropped)
        self.gather(keep)

    def grow(self, name, q, fill, room):
        tensor = self[name]
        new = tensor.new_empty(*tensor.shape[:2], q, *tensor.shape[3:])
        if fill is not None:
            new.fill_(fill)
        grown = self[name] = torch.cat([tensor, new], dim=2)
        return grown

    def drop_states(self, dropped):
        for name, tensor in self.items():
            self[name] = _without(tensor, dropped)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LayerSlots, "holds_kv", lambda self, slots: False)
        patch.setattr(LayerSlots, "write", write)
        patch.setattr(LayerSlots, "drop_one", drop_one)
        patch.setattr(SlotStates, "grow", grow)
        patch.setattr(SlotStates, "drop_one", drop_states)
        yield


def _run(model, plan, ids, steps=STEPS):
    """Logits of prefill and each step, and each layer's sorted kept positions after every step."""

    kept = []
    name = cache_argument_name(model)
    with routed(model, plan) as session, torch.no_grad():
        out = model(ids, use_cache=True)
        logits = [out.logits]
        token = out.logits[:, -1:].argmax(-1)
        for _ in range(steps):
            out = model(token, use_cache=True, **{name: session.cache})
            logits.append(out.logits)
            token = out.logits[:, -1:].argmax(-1)
            kept.append([layer.positions.sort(dim=-1).values.clone() for layer in session.cache.layers])
    return logits, kept, session.cache


@pytest.mark.parametrize("label", sorted(PLANS))
def test_in_place_decode_matches_the_concatenating_path(label):
    model = tiny_model("llama")
    ids = prompt(model, PROMPT, batch=2)
    logits, kept, _ = _run(model, PLANS[label], ids)
    with concatenating_storage():
        ref_logits, ref_kept, _ = _run(model, PLANS[label], ids)
    assert max((a - b).abs().max().item() for a, b in zip(logits, ref_logits)) <= 1e-5
    for step, (ours, theirs) in enumerate(zip(kept, ref_kept)):
        for layer, (a, b) in enumerate(zip(ours, theirs)):
            assert torch.equal(a, b), f"step {step}, layer {layer}: kept positions differ"


@pytest.mark.parametrize("method", ["tova", "streamingllm", "h2o", "d2o", "cam", "knorm", "cake"])
def test_steady_decode_reuses_one_buffer_of_capacity_plus_one(method):
    """After the first cut, every step writes into the same storage: no reallocation, fixed shapes."""
    model = tiny_model("llama")
    plan = Plan.homogeneous(method, CAPACITY, 3, "decode", params_that_fit(method, CAPACITY))
    name = cache_argument_name(model)

    with routed(model, plan) as session, torch.no_grad():
        out = model(prompt(model, PROMPT), use_cache=True)
        cache = session.cache
        token = out.logits[:, -1:].argmax(-1)
        seen = []
        for step in range(8):
            out = model(token, use_cache=True, **{name: cache})
            token = out.logits[:, -1:].argmax(-1)
            if step >= 2:  # the first step cuts the prompt, the second reallocates once to capacity + 1
                seen.append([_storage(layer) for layer in cache.layers])
    assert all(step == seen[0] for step in seen)
    slot_bytes = lambda t: t[:, :, :1].numel() * t.element_size()  # noqa: E731
    # layers that merge together (D2O's) hold one block for all of them (`polykv.runtime.merges`)
    sharing = collections.Counter(layer.keys.untyped_storage().data_ptr() for layer in cache.layers)
    for layer in cache.layers:
        assert layer.retained == CAPACITY
        # keys and values share one block of capacity + 1 slots each
        storage = layer.keys.untyped_storage()
        assert storage.data_ptr() == layer.values.untyped_storage().data_ptr()
        assert storage.nbytes() == sharing[storage.data_ptr()] * 2 * (CAPACITY + 1) * slot_bytes(layer.keys)
        for state in layer.methods[Phase.DECODE].per_token.values():
            assert state.untyped_storage().nbytes() == (CAPACITY + 1) * slot_bytes(state)


def _storage(layer):
    tensors = [layer.keys, layer.values, layer.positions, *layer.methods[Phase.DECODE].per_token.values()]
    return [t.untyped_storage().data_ptr() for t in tensors]


def test_per_slot_state_grows_in_its_block_only_while_it_is_the_view_handed_out():
    method = REGISTRY["h2o"](capacity=4)
    method.per_token["score"] = torch.arange(2 * 3.0).view(1, 2, 3)
    grown = method.grow("score", 1, 0.0)  # not from a block yet: copied into one of capacity + 1 slots
    assert grown.shape == (1, 2, 4) and grown.untyped_storage().nbytes() == 2 * 5 * 4
    assert torch.equal(grown[:, :, :3], torch.arange(6.0).view(1, 2, 3)) and not grown[:, :, 3].any()
    again = method.grow("score", 1, 7.0)  # the view handed out: written in place
    assert again.untyped_storage().data_ptr() == grown.untyped_storage().data_ptr()
    assert again[:, :, 4].eq(7).all()
    method.per_token["score"] = again[:, :, [0, 1, 2, 3]]  # replaced (e.g. by a cut): a new block
    third = method.grow("score", 1)
    assert third.untyped_storage().data_ptr() != again.untyped_storage().data_ptr()


def test_slot_block_hands_out_the_same_views_and_drops_one_slot_per_head():
    block = SlotBlock.around(torch.arange(2 * 4.0).view(1, 2, 4), size=5)
    assert block.prefix(4) is block.prefix(4)  # cached: a steady step creates no view objects
    assert block.holds(block.prefix(4), room=5) and not block.holds(block.prefix(4), room=6)
    assert not block.holds(block.prefix(4).clone())  # the same numbers elsewhere: not in the block
    kept = block.drop(torch.tensor([[[1], [3]]]), 4)  # head 0 drops slot 1, head 1 its last slot
    assert kept is block.prefix(3)
    assert kept.tolist() == [[[0.0, 3.0, 2.0], [4.0, 5.0, 6.0]]]
    kv = SlotBlock.around(torch.arange(2 * 2 * 3 * 2.0).view(2, 1, 2, 3, 2), size=4, dim=3)
    kv.drop(torch.tensor([[[0], [1]]]), 3)  # keys and values move together, per head
    assert kv.prefix(2)[:, 0, :, :, 0].tolist() == [[[4.0, 2.0], [6.0, 10.0]], [[16.0, 14.0], [18.0, 22.0]]]


def test_a_block_keeps_only_the_views_used_last_and_still_knows_the_one_in_use():
    # a layer that keeps everything in reserved room asks for a new length at every step: its block must not keep
    # every view it handed out (a long batched generation held them all), yet a steady step reuses its own
    from polykv.methods.slots import CACHED_VIEWS

    block = SlotBlock(torch.zeros(1, 2, 200))
    steady = block.prefix(5)
    for n in range(6, 6 + 3 * CACHED_VIEWS):  # one new length a step, as a growing layer writes
        block.span(n - 1, n).fill_(n)
        current = block.prefix(n)
        assert block.prefix(5) is steady  # used every step: never the one to go
        assert block.holds(current) and block.prefix(n) is current
    assert len(block._prefixes) <= CACHED_VIEWS and len(block._views) <= CACHED_VIEWS
    assert block.prefix(n)[0, 0, 5:].tolist() == [float(v) for v in range(6, n + 1)]  # the writes went into the block
    assert not block.holds(block.storage.narrow(2, 0, 6))  # a view of a length it let go is not one it handed out


@pytest.mark.parametrize("heads", [(1, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("feature", [None, 3])
def test_a_one_slot_drop_works_for_every_memory_layout(heads, feature):
    # The last slot is scattered from its own view of the block unless torch would refuse that (both
    # dense, e.g. one head of one sequence); every storage order of the dimensions, full or partial
    # prefix, must give the plain per-head result.
    import itertools

    b, h = heads
    shape = (b, h, 7) if feature is None else (b, h, 7, feature)
    generator = torch.Generator().manual_seed(0)
    for order in itertools.permutations(range(len(shape))):
        stored = torch.arange(float(torch.tensor(shape).prod())).view([shape[i] for i in order])
        tensor = stored.permute([order.index(i) for i in range(len(shape))])  # this shape, that memory order
        for n in (7, 5):
            expected = tensor.narrow(2, 0, n).clone()
            dropped = torch.randint(0, n, (b, h, 1), generator=generator)
            for i, j in itertools.product(range(b), range(h)):
                expected[i, j, dropped[i, j, 0]] = expected[i, j, n - 1]
            assert torch.equal(SlotBlock(tensor.clone().copy_(tensor)).drop(dropped, n), expected[:, :, : n - 1])


def test_the_reference_allocates_at_every_step_and_the_default_again_after_it():
    model = tiny_model("llama")
    plan = Plan.homogeneous("tova", CAPACITY, 3, "decode")
    name = cache_argument_name(model)

    def decode(steps: int) -> list:
        with routed(model, plan) as session, torch.no_grad():
            out = model(prompt(model, PROMPT), use_cache=True)
            token, held = out.logits[:, -1:].argmax(-1), []
            for _ in range(steps):
                out = model(token, use_cache=True, **{name: session.cache})
                token = out.logits[:, -1:].argmax(-1)
                held.append(session.cache.layers[0].keys)  # held: the allocator cannot hand its memory out again
        return [keys.untyped_storage().data_ptr() for keys in held]

    with concatenating_storage():
        assert len(set(decode(4))) == 4  # new storage at every step
    assert len(set(decode(6)[2:])) == 1  # in place, once the first steps have made the block


def _paths(monkeypatch, run) -> set:
    from polykv.runtime import attention_step, row_storage

    seen, real = set(), attention_step.choose_path
    for module in (attention_step, row_storage):  # one plan's layer, and many plans' rows attending together
        monkeypatch.setattr(module, "choose_path", lambda *a: seen.add(real(*a)) or real(*a))
    run()
    return seen


def test_each_attention_path_is_taken_where_its_table_says(monkeypatch):
    from polykv.runtime.attention_step import Path
    from polykv.runtime.many_plans import generate_many

    model = tiny_model("llama")
    ids = prompt(model, PROMPT)

    def run(plan, steps=2):
        return lambda: _run(model, plan, ids, steps)

    assert _paths(monkeypatch, run(PLANS["full"])) == {Path.SDPA}  # a full plan alone: vanilla
    assert Path.FUSED_DECODE in _paths(monkeypatch, run(PLANS["tova-decode"]))  # one query, signals needed
    h2o = _paths(monkeypatch, run(Plan.homogeneous("h2o", CAPACITY, 3, "both")))
    assert Path.FUSED_PROMPT in h2o  # a fresh prompt whose method sums columns
    snap = Plan.homogeneous("streamingllm", CAPACITY, 3, "prefill", params_that_fit("streamingllm", CAPACITY))
    two_tokens = lambda: _run_chunks(model, snap, ids)  # noqa: E731 - a 2-token step after a compressed prompt
    assert Path.MASKED in _paths(monkeypatch, two_tokens)
    full = PLANS["full"]
    rows = _paths(monkeypatch, lambda: generate_many(model, [full, PLANS["tova-decode"]], ids[0].tolist(), 3))
    assert Path.IDLE_ROW in rows  # many plans' rows: the full plan's decode step
    long_ids = prompt(model, 130)  # Scissorhands' default history, 100 queries, under the prompt
    scissorhands = _paths(
        monkeypatch, lambda: _run(model, Plan.homogeneous("scissorhands", 64, 3, "both"), long_ids, 2)
    )
    assert Path.PROMPT_ROWS in scissorhands  # a fresh prompt whose method reads its last 100 queries


def test_a_prompt_whose_last_queries_give_their_output_from_their_rows_keeps_the_same_slots(monkeypatch):
    """`Path.PROMPT_ROWS`: the last w queries' output from the rows their method reads equals SDPA's up to float
    rounding, and the method keeps the same slots."""
    from polykv.runtime import attention_step

    model = tiny_model("llama")
    ids = prompt(model, 130)
    plan = Plan.homogeneous("scissorhands", 64, 3, "both")

    def run():
        with routed(model, plan) as session, torch.no_grad():
            logits = model(ids, use_cache=True).logits
            return logits, [layer.positions.clone() for layer in session.cache.layers]

    logits, kept = run()
    monkeypatch.setattr(attention_step, "PROMPT_ROWS_AT_LEAST", 10**9)  # every output from SDPA
    sdpa_logits, sdpa_kept = run()
    assert all(torch.equal(a, b) for a, b in zip(kept, sdpa_kept))
    assert kept[0].shape[-1] == 64  # the prompt was cut
    torch.testing.assert_close(logits, sdpa_logits, rtol=1e-5, atol=1e-5)
    assert not torch.equal(logits, sdpa_logits)  # (the path was taken: other rounding)


def _run_chunks(model, plan, ids):
    name = cache_argument_name(model)
    with routed(model, plan) as session, torch.no_grad():
        model(ids, use_cache=True)
        model(ids[:, :2], use_cache=True, **{name: session.cache})

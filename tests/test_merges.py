"""Layers that merge together (`polykv.runtime.merges`): the one-slot merges of D2O and CaM in every layer of
the same parameters (and, for CaM, capacity), done at once after the step's last of them, give the numbers of
each layer merging alone, bit for bit. The reference (`merging_alone`) is each layer merging at its own step: the
methods then say they cannot merge together (`Method.merges_together`), so the runtime forms no group."""

from __future__ import annotations

import collections
import contextlib

import pytest
import torch

from polykv.methods import REGISTRY
from polykv.methods.merging.cam import CaM
from polykv.methods.merging.d2o import D2O
from polykv.models import cache_argument_name
from polykv.plan import Plan
from polykv.runtime import routed
from polykv.runtime.many_plans import generate_many, many
from tests.helpers import cache_state, decode_logits, identical, plan_of, prompt, tiny_model

LAYERS, PROMPT, STEPS = 4, 40, 20


def _with_prefill(plan: Plan, prefill: list[tuple[str, int]]) -> Plan:
    """`plan` with these prefill methods (each layer then enters decode with its own number of slots)."""
    data = plan.model_dump(mode="json")
    data["scope"] = "both"
    for layer, (method, capacity) in zip(data["layers"], prefill):
        layer["prefill"] = {"method": method, "capacity": capacity, "params": {"window": 4}}
    return Plan.model_validate(data)


def _plans(method: str) -> dict[str, Plan]:
    # capacities over CaM's sinks + merge budget, so that its steps take the path that merges together
    plans = {
        "homogeneous": Plan.homogeneous(method, 24, LAYERS, scope="decode"),
        # one slot over the capacity after the prompt: the first eviction is a one-slot step (D2O: no tau yet)
        "first-eviction-one-slot": Plan.homogeneous(method, PROMPT, LAYERS, scope="decode"),
        "two-capacities-and-h2o": plan_of([method, "h2o", method, method], [24, 24, 28, 24]),
        "prefill-differs": _with_prefill(
            Plan.homogeneous(method, 24, LAYERS, scope="decode"), [("snapkv", c) for c in (14, 30, 22, 28)]
        ),
    }
    if REGISTRY[method].native_allocation:
        plans["native"] = Plan.homogeneous(method, 24, LAYERS, scope="decode", allocation="native")
    return plans


CASES = [(method, label) for method in ("d2o", "cam") for label in sorted(_plans(method))]
PLANS = _plans("d2o")


@contextlib.contextmanager
def merging_alone():
    """The reference: inside the block, every layer of D2O or CaM merges alone, at its own step."""
    with pytest.MonkeyPatch.context() as patch:
        for method in (D2O, CaM):
            patch.setattr(method, "merges_together", False)
        yield


def _count_merges(patch, method, key) -> collections.Counter:
    """Counts of `method`'s merge_together calls from here on, by `key(methods, lengths)`."""
    calls = collections.Counter()
    original = method.merge_together.__func__

    def counting(cls, methods, kv, dropped, lengths=None):
        calls[key(methods, lengths)] += 1
        return original(cls, methods, kv, dropped, lengths)

    patch.setattr(method, "merge_together", classmethod(counting))
    return calls


def _run(model, plan, ids, steps=STEPS, alone=False):
    """Logits of every step and the state after each; and how many layers each merge_together call had.
    `alone`: each layer merges at its own step (`merging_alone`)."""
    name = cache_argument_name(model)
    reference = merging_alone() if alone else contextlib.nullcontext()
    with reference, pytest.MonkeyPatch.context() as patch, routed(model, plan) as session, torch.no_grad():
        sizes = _count_merges(patch, REGISTRY[plan.layers[0].decode.method], lambda methods, _: len(methods))
        out = model(ids, use_cache=True)
        logits, states = [out.logits], []
        for _ in range(steps):
            out = model(out.logits[:, -1:].argmax(-1), use_cache=True, **{name: session.cache})
            logits.append(out.logits)
            states.append(cache_state(session.cache))
            assert not session.cache.layers[0].merge_groups.pending  # nothing waits between forward passes
    return logits + [t for state in states for t in state], sizes


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize(("method", "label"), CASES)
def test_merging_together_gives_the_numbers_of_each_layer_alone(method, label, batch):
    model = tiny_model("llama", num_hidden_layers=LAYERS)
    ids = prompt(model, PROMPT, batch=batch)
    plan = _plans(method)[label]
    together, sizes = _run(model, plan, ids)
    alone, sizes_alone = _run(model, plan, ids, alone=True)
    assert identical(together, alone)
    assert not sizes_alone  # the reference merged each layer at its own step
    if label != "native":  # native allocation gives each layer its own capacity: alone, no group
        assert max(sizes, default=0) >= 2, f"no layers merged together: {dict(sizes)}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_heads", [1, 4])
def test_merge_together_equals_each_layer_merging_alone(kv_heads, dtype):
    torch.manual_seed(0)
    layers, b, n, d = 5, 2, 9, 8
    kv = torch.randn(2, layers, b, kv_heads, n, d).to(dtype)
    dropped = torch.randint(0, n, (layers, b, kv_heads, 1))
    for first in (True, False):  # the first eviction (no tau yet) and a later one
        alone = [D2O(n - 1, layer_idx=i) for i in range(layers)]
        together = [D2O(n - 1, layer_idx=i) for i in range(layers)]
        if not first:
            for a, t in zip(alone, together):
                a.tau = torch.rand(b, dtype=torch.float64)
                t.tau = a.tau.clone()
        expected = kv.clone()
        for i, method in enumerate(alone):
            block = expected[:, i]
            D2O.merge_together([method], block.unsqueeze(1), dropped[i].unsqueeze(0))
        merged = kv.clone()
        D2O.merge_together(together, merged, dropped)
        assert torch.equal(merged, expected)
        assert all(torch.equal(a.tau, t.tau) and t.tau.shape == (b,) for a, t in zip(alone, together))
        assert not torch.equal(merged, kv)  # something merged


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cam_merge_together_equals_each_layer_merging_alone(dtype):
    torch.manual_seed(2)
    layers, b, h, n, d, k = 4, 2, 2, 24, 8, 16

    def methods():
        made = [CaM(n - 1, layer_idx=i) for i in range(layers)]
        for i, method in enumerate(made):
            method.per_token["acc"] = acc[i].clone()
            method.deferred_targets = targets[i]
        return made

    kv = torch.randn(2, layers, b, h, n, d).to(dtype)
    acc = torch.rand(layers, b, h, n)
    ranked = torch.rand(layers, b, h, n).argsort(dim=-1)  # distinct slots per head
    dropped, targets = ranked[..., :1], ranked[..., 1 : k + 1]
    expected = kv.clone()
    for i, method in enumerate(methods()):
        CaM.merge_together([method], expected[:, i].unsqueeze(1), dropped[i].unsqueeze(0))
    merged = kv.clone()
    CaM.merge_together(methods(), merged, dropped)
    assert torch.equal(merged, expected)
    assert torch.equal(merged[0], kv[0])  # keys never change
    assert not torch.equal(merged, kv)  # some value merged


def test_merge_together_with_some_layers_before_their_first_eviction():
    torch.manual_seed(1)
    kv, dropped = torch.randn(2, 3, 1, 2, 7, 4), torch.randint(0, 7, (3, 1, 2, 1))
    methods = [D2O(6, layer_idx=i) for i in range(3)]
    methods[1].tau = torch.tensor([0.25], dtype=torch.float64)
    expected, references = kv.clone(), [D2O(6, layer_idx=i) for i in range(3)]
    references[1].tau = methods[1].tau.clone()
    for i, method in enumerate(references):
        D2O.merge_together([method], expected[:, i].unsqueeze(1), dropped[i].unsqueeze(0))
    D2O.merge_together(methods, kv, dropped)
    assert torch.equal(kv, expected)
    assert all(torch.equal(m.tau, r.tau) for m, r in zip(methods, references))


@pytest.mark.parametrize("first", [True, False, "some"])
def test_d2o_layers_of_different_lengths_merge_together_as_each_alone(first):
    """Layers of different capacities in one padded block: each layer's numbers are those of merging alone over
    its own n slots, and nothing past its n is read or written (`first`: every layer's first eviction, none, or
    some layers', which merge one by one)."""
    torch.manual_seed(3)
    lengths = [9, 5, 13, 7]
    layers, b, h, d, size = len(lengths), 2, 2, 8, max(lengths)
    kv = torch.zeros(2, layers, b, h, size, d)
    for i, n in enumerate(lengths):
        kv[:, i, :, :, :n] = torch.randn(2, b, h, n, d)
    kv[:, 1, :, :, 5:] = float("nan")  # padding: never read (a NaN there would spread into the layer's numbers)
    dropped = torch.stack([torch.randint(0, n, (b, h, 1)) for n in lengths])
    fresh = {True: range(4), False: (), "some": (1, 3)}[first]  # layers at their first eviction: no tau yet
    taus = [None if i in fresh else torch.rand(b, dtype=torch.float64) for i in range(len(lengths))]
    alone, together = [D2O(n - 1, layer_idx=i) for i, n in enumerate(lengths)], [D2O(n - 1) for n in lengths]
    for method, tau in zip(alone + together, taus + taus):
        method.tau = None if tau is None else tau.clone()
    expected = kv.clone()
    for i, (method, n) in enumerate(zip(alone, lengths)):
        D2O.merge_together([method], expected[:, i : i + 1, :, :, :n], dropped[i : i + 1])
    merged = kv.clone()
    D2O.merge_together(together, merged, dropped, torch.tensor(lengths))
    torch.testing.assert_close(merged, expected, rtol=0, atol=0, equal_nan=True)  # bit for bit; padding still NaN
    assert all(torch.equal(a.tau, t.tau) for a, t in zip(alone, together))
    assert not torch.equal(merged[:, 0], kv[:, 0])  # something merged


@pytest.mark.parametrize("method", ["d2o", "cam"])
def test_layers_of_one_method_and_capacity_share_one_block(method):
    model = tiny_model("llama", num_hidden_layers=LAYERS)
    plan = plan_of([method, method, "h2o", method], [20, 24, 20, 20])
    with routed(model, plan) as session, torch.no_grad():
        decode_logits(model, prompt(model, PROMPT), 4, cache_argument_name(model))
    storage = [layer.keys.untyped_storage() for layer in session.cache.layers]
    assert storage[0].data_ptr() == storage[3].data_ptr()  # the two layers at 20: one block
    assert len({s.data_ptr() for s in storage}) == 3  # the layer at 24 and h2o each their own
    slot = session.cache.layers[0].keys[:, :, :1].nbytes
    assert storage[0].nbytes() == 2 * 2 * 21 * slot  # 2 layers x keys and values x capacity + 1 slots: no padding


# capacities 20 and 44 either side of the prompt: layer 1 evicts first when the others already have a tau
MANY_D2O = [PLANS["native"], PLANS["two-capacities-and-h2o"], plan_of(["d2o"] * 4, [20, 44, 20, 20])]


def _many_steps(model, plans, ids, steps):
    """Many plans stepping on fixed tokens: every step's logits and every cache's state after it; and how many
    layers each D2O merge had, with or without a padded block."""
    with pytest.MonkeyPatch.context() as patch, many(model, plans) as session, torch.no_grad():
        calls = _count_merges(patch, D2O, lambda methods, lengths: (len(methods), lengths is not None))
        batch, logits = session.prefill(ids)
        out = [logits]
        for step in range(steps):
            out.append(batch.step([3 + step] * len(plans)))
            out += [t for cache in batch.caches for t in cache_state(cache)]
    return out, calls


def test_many_plans_merge_d2o_layers_of_different_capacities_together_as_by_capacity():
    """In many plans' batch D2O's layers share one padded block whatever their capacities and merge at once, with
    the numbers of merging by capacity (the reference: `merges_across_capacities` off), bit for bit."""
    model = tiny_model("llama", num_hidden_layers=LAYERS)
    ids = prompt(model, PROMPT)[0].tolist()
    padded, calls = _many_steps(model, MANY_D2O, ids, STEPS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(D2O, "merges_across_capacities", False)
        by_capacity, calls_by_capacity = _many_steps(model, MANY_D2O, ids, STEPS)
    assert identical(padded, by_capacity)
    assert calls[LAYERS, True] >= STEPS - 1  # the native plan: every layer at once, in a padded block
    assert calls[3, True] >= STEPS - 1  # the plan with h2o: its three d2o layers of capacities 24 and 28
    assert not any(padded for _, padded in calls_by_capacity)


def test_a_routed_cache_alone_keeps_one_capacity_per_block():
    """Alone, D2O's layers of different capacities keep blocks of their own capacity + 1 slots: the KV memory a plan
    holds is what its capacities say."""
    model = tiny_model("llama", num_hidden_layers=LAYERS)
    plan = plan_of(["d2o"] * 4, [20, 24, 20, 28])
    with routed(model, plan) as session, torch.no_grad():
        decode_logits(model, prompt(model, PROMPT), 4, cache_argument_name(model))
    slot = session.cache.layers[0].keys[:, :, :1].nbytes
    held = {
        layer.keys.untyped_storage().data_ptr(): layer.keys.untyped_storage().nbytes() for layer in session.cache.layers
    }
    assert sorted(held.values()) == sorted([2 * 2 * 21 * slot, 2 * 25 * slot, 2 * 29 * slot])


def test_a_new_sequence_in_the_same_cache_gets_a_new_block_and_the_same_numbers():
    model = tiny_model("llama", num_hidden_layers=LAYERS)
    plan, name = PLANS["homogeneous"], cache_argument_name(model)

    def two_sequences():
        with routed(model, plan), torch.no_grad():
            first, cache = decode_logits(model, prompt(model, PROMPT), 12, name)
            held = [layer.keys for layer in cache.layers]
            before = [t.clone() for t in held]
            cache.reset()
            second, cache = decode_logits(model, prompt(model, PROMPT + 4, seed=5), 12, name, cache=cache)
            assert all(torch.equal(t, b) for t, b in zip(held, before))  # the old sequence's keys untouched
        return first + second + cache_state(cache)

    together = two_sequences()
    with merging_alone():
        assert identical(together, two_sequences())


def test_plans_decoding_as_one_batch_merge_as_alone():
    model = tiny_model("llama", num_hidden_layers=LAYERS)
    ids = prompt(model, PROMPT)[0].tolist()
    plans = [Plan.homogeneous("d2o", c, LAYERS, scope="decode") for c in (8, 12, 30)]
    together = generate_many(model, plans, ids, 20, min_new_tokens=20)
    with merging_alone():
        assert together == generate_many(model, plans, ids, 20, min_new_tokens=20)


def test_a_forward_pass_stopped_halfway_merges_before_the_layer_runs_again():
    model = tiny_model("llama", num_hidden_layers=LAYERS)
    name = cache_argument_name(model)
    last = model.model.layers[-1]

    def fail(*args, **kwargs):
        raise RuntimeError("stopped")

    with routed(model, PLANS["homogeneous"]) as session, torch.no_grad():
        decode_logits(model, prompt(model, PROMPT), 3, name)
        cache = session.cache
        handle = last.register_forward_pre_hook(fail)
        with pytest.raises(RuntimeError, match="stopped"):
            model(torch.tensor([[5]]), use_cache=True, **{name: cache})
        handle.remove()
        group = cache.layers[0].merge_groups.pending[0]
        assert group.waits_for(cache.layers[0])  # layers 0-2 stepped; the last never did
        cache.layers[0].update(cache.layers[0].keys[:, :, :1].clone(), cache.layers[0].values[:, :, :1].clone())
        assert not cache.layers[0].merge_groups.pending


def test_many_plans_padded_merges_make_no_host_sync(monkeypatch):
    """The padded merges (layers of different lengths, some at their first eviction) read no number back from the
    device during a step (`tests/test_decode_syncs.py`)."""
    from tests.test_decode_syncs import _SYNCING, _raiser

    model = tiny_model("llama", num_hidden_layers=LAYERS)
    with many(model, MANY_D2O) as session, torch.no_grad():
        batch, _ = session.prefill(prompt(model, PROMPT)[0].tolist())
        batch.step([3] * len(MANY_D2O))  # the first step cuts the prompt (it may sync, as a prefill may)
        with monkeypatch.context() as patch:
            for attr in _SYNCING:
                patch.setattr(torch.Tensor, attr, _raiser(attr))
            for step in range(8):  # layer 1 of the last plan (capacity 44) first evicts among them
                batch.step([4 + step] * len(MANY_D2O))


def test_a_layer_cut_by_its_window_takes_its_slice_again_and_the_group_keeps_merging():
    """A local layer whose window cuts what it holds gets storage of its own and asks for a block again at its next
    write: within the sequence it takes its own slice back, so the group keeps one block (before, each such ask made
    the whole group a new block, and the others then merged alone), with the numbers of merging alone."""
    from polykv.runtime import merges

    model = tiny_model("gemma3")  # two local layers (a 16-token window) and a global one
    plan = Plan.homogeneous("d2o", 12, 3, scope="decode")
    made = collections.Counter()
    original = merges.MergeGroup.__init__

    def counting(self, *args):
        made["blocks"] += 1
        original(self, *args)

    ids = prompt(model, PROMPT)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(merges.MergeGroup, "__init__", counting)
        together, sizes = _run(model, plan, ids)
    alone, _ = _run(model, plan, ids, alone=True)
    assert identical(together, alone)
    assert made["blocks"] == 1  # (12 in these 20 steps when each ask made a new block)
    # the three layers merged at once whenever each had a slot to merge (a step whose window cut left a layer under
    # its capacity has nothing to merge there: 7 of these 20 steps merged all three)
    assert sizes[3] >= 5, dict(sizes)

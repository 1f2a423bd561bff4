"""Scissorhands: drop, m at a time, the tokens unimportant most often over the last `history` queries."""

from __future__ import annotations

import pytest
import torch

from polykv.methods.attention.scissorhands import Scissorhands
from polykv.methods.slots import gather_slots
from polykv.models import cache_argument_name
from polykv.plan import Phase, Plan
from polykv.runtime import routed
from tests.helpers import (
    decode_logits,
    decode_sizes,
    identical,
    kept,
    layer_view,
    max_diff,
    prompt,
    run_routed,
    tiny_model,
)

H, L = 0.5, 0.05  # attention of an important / unimportant token in hand-made rows


def decode(method, rows: list[list[float]]):
    """Feed one decode step per row (slot i = position i, no eviction in between); last step's eviction."""
    for row in rows:
        eviction = method.step(layer_view(positions=range(len(row)), heads=1, rows=[row]))
    return eviction


def test_keeps_the_persistently_important_token_over_an_old_spike():
    # B (slot 1) got a huge spike from the first query, which has left the 2-query window; A (slot 2)
    # is important to every query in the window. Accumulated attention (H2O) would keep B.
    method = Scissorhands(capacity=3, params={"history": 2, "recent": 1})
    ev = decode(
        method,
        [
            [L, 0.9, L, L],
            [L, L, H, L, L],
            [L, L, H, L, L, L],
        ],
    )
    assert kept(ev, 6) == [[2, 4, 5]]  # A, then the newer of the tokens tied at 2 events, + the recent one
    assert method.per_token["unimportant"][0, 0].sum(-1).tolist() == [2, 2, 0, 2, 2, 1]


def test_events_older_than_the_history_window_are_forgotten():
    # C (slot 1) was unimportant to the first query only; D (slot 2) to the last query only.
    # Over all time they tie (1 event each: the older, C, would go); within the window only D has one.
    method = Scissorhands(capacity=2, params={"history": 2, "recent": 1})
    ev = decode(
        method,
        [
            [L, L, H, L],
            [L, H, H, L, L],
            [L, H, L, L, L, L],
        ],
    )
    assert kept(ev, 6) == [[1, 5]]


def test_prefill_protects_recent_breaks_ties_to_the_older_and_flags_causally():
    # 8 prompt tokens, last 3 queries (positions 5, 6, 7) look at slots 0-2; rows are causal.
    rows = torch.full((3, 8), L)
    rows[:, :3] = H
    rows[0, 6:] = 0.0
    rows[1, 7:] = 0.0
    # Two query heads per KV head that disagree on slot 3; their mean is the pattern above.
    rows = torch.stack([rows, rows])
    rows[0, :, 3] += 0.4
    rows[1, :, 3] -= 0.04
    method = Scissorhands(capacity=4, params={"history": 3, "recent": 2})
    ev = method.step(layer_view(positions=range(8), heads=1, rows=rows, phase=Phase.PREFILL, groups=2))
    flags = method.per_token["unimportant"][0, 0]  # [slot, query]
    assert flags[:, 0].tolist() == [False] * 3 + [True] * 3 + [False] * 2  # query 5 cannot see slots 6, 7
    assert flags[:, 1].tolist() == [False] * 3 + [True] * 4 + [False]
    assert flags.sum(-1).tolist() == [0, 0, 0, 3, 3, 3, 2, 1]
    # Without protection the 0-event slots 0-2 and slot 7 would stay; the recent 6, 7 always do, and
    # among the tied slots 0-2 the oldest goes. Prefill cuts to exactly the capacity.
    assert kept(ev, 8) == [[1, 2, 6, 7]]


def test_drops_m_at_once_then_refills_up_to_the_capacity():
    cap, recent = 10, 2
    method = Scissorhands(capacity=cap, params={"history": 4, "recent": recent, "drop_ratio": 0.3})  # m = 3
    g = torch.Generator().manual_seed(0)
    positions = torch.zeros(1, 1, 0, dtype=torch.long)
    sizes = []
    for pos in range(30):
        positions = torch.cat([positions, torch.tensor([[[pos]]])], dim=-1)
        n = positions.shape[-1]
        rows = torch.rand(1, 1, n, generator=g).softmax(-1)
        ev = method.step(layer_view(positions=positions[0, 0], heads=1, rows=rows))
        if ev is not None:  # apply it as the runtime does: slots and per-token state together
            keep = ev.kept_mask(n).nonzero()[:, -1].view(1, 1, -1)
            assert n - keep.shape[-1] == 3
            positions = gather_slots(positions, keep)
            for name, tensor in method.per_token.items():
                method.per_token[name] = gather_slots(tensor, keep)
            assert {pos - 1, pos} <= set(positions.flatten().tolist())  # the recent window stays
        sizes.append(positions.shape[-1])
    assert max(sizes) == cap
    assert sizes[:12] == list(range(1, 11)) + [8, 9]
    assert sizes[12:15] == [10, 8, 9]


def test_params_and_capacity_check():
    assert Scissorhands.phases == {Phase.PREFILL, Phase.DECODE}
    assert Scissorhands.defaults() == {"history": 100, "recent": 10, "importance_quantile": 0.9, "drop_ratio": 0.1}
    assert Scissorhands.check({}, 10) == [
        "params: scissorhands: recent (10) must be smaller than the capacity (10); allowed range 0 .. 9"
    ]
    assert Scissorhands.check({"importance_quantile": 1.0}, 64)[0].startswith(
        "params.importance_quantile: scissorhands:"
    )


def run_steps(plan, steps=32):
    """Retained slots per layer after each of `steps` decode steps of a 40-token prompt."""
    model = tiny_model("llama")
    return decode_sizes(model, plan, prompt(model, length=40), steps)[0][1:]


def test_runtime_holds_capacity_in_both_phases():
    sizes = run_steps(Plan.homogeneous("scissorhands", 16, 3, params={"history": 8, "recent": 4}))
    assert max(max(s) for s in sizes) <= 16
    # m = round(0.1 * 16) = 2: the layer falls to 15 after each full step, refills to 16
    assert {s[0] for s in sizes} == {15, 16}


def test_runtime_decode_only_after_full_prefill():
    # The ring starts from the prompt's last rows; the first step cuts 41 slots to the capacity (m = 1
    # is less than the excess) and then drops one token per step.
    sizes = run_steps(Plan.homogeneous("scissorhands", 12, 3, scope="decode", params={"recent": 4}))
    assert all(s == [12] * 3 for s in sizes)


def test_runtime_capacity_above_length_equals_full():
    model = tiny_model("llama")
    ids = prompt(model, length=40)
    vanilla, _ = decode_logits(model, ids, 30, cache_argument_name(model))
    logits, cache = run_routed(model, Plan.homogeneous("scissorhands", 80, 3), ids, steps=30)
    assert max_diff(vanilla, logits) <= 1e-5
    assert cache.retained_per_layer() == [70] * 3


@pytest.mark.parametrize("history", [8, 16])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_deferred_decode_rows_flag_as_each_step_would(family, history, monkeypatch):
    """A decode step that evicts nothing keeps its row, and the rows waiting are flagged together at the next
    eviction, when DEFERRED_ROWS wait, or before the runtime moves slots (a local layer's window, a batch
    reordered): the same kept positions after every step, and the same flags once settled, as flagging every
    step at once."""
    model = tiny_model(family)
    ids = prompt(model, length=40, batch=2)
    # m = 12 steps between evictions: 8 rows of history fill up and settle in between, 16 wait for the eviction
    plan = Plan.homogeneous("scissorhands", 24, 3, scope="decode", params={"history": history, "drop_ratio": 0.5})
    name = cache_argument_name(model)

    def trace() -> tuple[list, list, bool]:
        positions = []
        with routed(model, plan) as session, torch.no_grad():
            out = model(ids, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            for step in range(30):
                if step == 20:  # the batch's rows swap places, as a beam search reorders them
                    session.cache.reorder_cache(torch.tensor([1, 0]))
                    token = token.flip(0)
                out = model(token, use_cache=True, **{name: session.cache})
                token = out.logits[:, -1:].argmax(-1)
                positions.append([layer.positions.sort(-1).values for layer in session.cache.layers])
            methods = [layer.methods[Phase.DECODE] for layer in session.cache.layers]
            waited = any(method.waiting for method in methods)
            for method in methods:
                method._settle()
            return positions, [method.per_token["unimportant"].clone() for method in methods], waited

    deferred, deferred_flags, waited = trace()
    monkeypatch.setattr(Scissorhands, "_defer", lambda self, view: False)
    each_step, flags, _ = trace()
    assert waited  # rows were waiting at the end
    assert all(identical(a, b) for a, b in zip(deferred, each_step))
    assert identical(deferred_flags, flags)

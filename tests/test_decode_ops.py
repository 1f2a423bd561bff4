"""Cheaper per-step operations that must give the same numbers as the ones they replace."""

from __future__ import annotations

import pytest
import torch

from polykv.methods.attention import scissorhands
from polykv.methods.attention.scissorhands import row_quantile, visible_row_quantile


@pytest.mark.parametrize("q", [0.9, 0.5, 0.1, 0.75, 0.95, 0.999, 1 / 3])
def test_row_quantile_equals_torch_quantile(q):
    g = torch.Generator().manual_seed(0)
    for n in [1, 2, 3, 7, 10, 100, 257, 1000, 4097]:
        rows = torch.rand(2, 3, 1, n, generator=g)
        rows[0, 0, 0, : n // 2] = 0.25  # ties
        assert torch.equal(row_quantile(rows, q), torch.quantile(rows, q, dim=-1, keepdim=True)), n


@pytest.mark.parametrize("selection", ["by size", "numpy", "torch"])
@pytest.mark.parametrize("q", [0.9, 0.5, 0.1, 0.999, 1 / 3])
def test_visible_row_quantile_equals_torch_nanquantile(q, selection, monkeypatch):
    # Scissorhands' prompt history: each query row sees a different subset of the slots (causal, in
    # any slot order, or arbitrary), with ties among the values; its top-k from numpy's selection or torch's,
    # whatever the rows' size (as the sizes choose: the small ones torch, (1024, 100) and (1500, 7) numpy)
    if selection != "by size":
        limit = 0 if selection == "numpy" else 1 << 60
        monkeypatch.setattr(scissorhands, "_SELECT_LONG_ROWS", limit)
        monkeypatch.setattr(scissorhands, "_SELECT_MANY_ENTRIES", limit)
    g = torch.Generator().manual_seed(3)
    for n, w in [(1, 1), (2, 2), (7, 3), (100, 100), (257, 40), (1024, 100), (1500, 7)]:
        for pattern in ("causal", "random"):
            rows = torch.rand(2, 2, w, n, generator=g)
            rows[0, 0] = (rows[0, 0] * 8).floor() / 8  # ties
            if pattern == "causal":
                positions = torch.randperm(n, generator=g).expand(2, 2, n)
                visible = positions[:, :, None, :] <= (n - w + torch.arange(w))[:, None]
            else:
                visible = torch.rand(2, 2, w, n, generator=g) < 0.6
                visible[..., 0] = True  # every row sees something (no NaN in the reference)
            rows = rows.masked_fill(~visible, 0.0)  # attention probabilities: 0 where the query cannot see
            rows[1, 1] = rows[1, 1] * (rows[1, 1] > 0.5)  # and visible zeros, as underflow gives
            expected = torch.nanquantile(rows.masked_fill(~visible, float("nan")), q, dim=-1, keepdim=True)
            assert torch.equal(visible_row_quantile(rows, visible.sum(-1, keepdim=True), q), expected), (n, w, pattern)


@pytest.mark.parametrize("groups", [1, 2, 3, 4, 8])
def test_a_kv_heads_mean_attention_equals_torch_mean(groups):
    # LayerView.grouped: the sum divided by g, the same numbers as .mean (underflowed zeros included)
    from polykv.methods.base import LayerView
    from polykv.plan import Phase

    g = torch.Generator().manual_seed(2)
    empty = torch.zeros(1, 2, 0, 4)
    view = LayerView(Phase.DECODE, empty, empty, torch.zeros(1, 2, 0), 1, groups)
    for shape in [(2, 2 * groups, 1, 300), (1, 2 * groups, 100, 1024), (3, 2 * groups, 7)]:
        attention = torch.softmax(torch.randn(*shape, generator=g) * 4, dim=-1)
        attention[0, 0, ..., :5] = 0.0  # underflow
        expected = attention.view(shape[0], 2, groups, *shape[2:]).mean(2)
        assert torch.equal(view.grouped(attention), expected), shape


def test_the_largest_probabilities_from_numpy_equal_torch_topk(monkeypatch):
    # numpy's selection of a row's k largest, made a block of rows at a time: the same values as torch's top-k, in
    # the same order; ties, zeros and rows of one value included
    monkeypatch.setattr(scissorhands, "_SELECT_LONG_ROWS", 0)
    monkeypatch.setattr(scissorhands, "_SELECT_MANY_ENTRIES", 0)
    monkeypatch.setattr(scissorhands, "_SELECT_BLOCK_ENTRIES", 5000)  # several blocks, the last one short
    g = torch.Generator().manual_seed(5)
    for n, k in [(1, 1), (7, 7), (512, 52), (1024, 105), (1000, 101), (1025, 3), (1500, 700), (4097, 1)]:
        rows = torch.rand(3, 2, 4, n, generator=g)
        rows[0, 0] = (rows[0, 0] * 8).floor() / 8  # ties
        rows[0, 1] = 0.0  # a row of zeros (every entry hidden)
        rows[1] = rows[1] * (rows[1] > 0.7)  # mostly zeros
        expected = rows.topk(k, dim=-1).values
        assert torch.equal(scissorhands._largest(rows, k), expected), (n, k)


@pytest.mark.parametrize("chunk", [1, 3, 7, 256])
@pytest.mark.parametrize("groups", [1, 2])
def test_fused_prompt_attention_equals_sdpa_and_the_general_column_sums(chunk, groups, monkeypatch):
    from polykv.runtime import attention_math

    monkeypatch.setattr(attention_math, "_CAUSAL_CHUNK", {"cpu": chunk})
    g = torch.Generator().manual_seed(1)
    n, heads = 23, 2
    query = torch.randn(2, heads * groups, n, 8, generator=g)
    key = torch.randn(2, heads, n, 8, generator=g)
    value = torch.randn(2, heads, n, 6, generator=g)
    positions = torch.arange(n).expand(2, heads, n)
    expected = attention_math.column_sums(query, key, torch.arange(n), positions, 0.35, None)
    output, sums = attention_math.causal_attention_and_column_sums(query, key, value, 0.35)
    assert sums.shape == expected.shape
    assert torch.allclose(sums, expected, rtol=1e-5, atol=1e-6)
    assert torch.allclose(sums.sum(-1), torch.full((2, heads * groups), float(n)), rtol=1e-5)  # each query sums to 1
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        query,
        key.repeat_interleave(groups, 1),
        value.repeat_interleave(groups, 1),
        is_causal=True,
        scale=0.35,
    )
    assert output.shape == (2, n, heads * groups, 6)  # [b, n, query heads, d], as SDPA's transposed output
    assert torch.allclose(output, sdpa.transpose(1, 2), atol=1e-6)
    nothing, alone = attention_math.causal_attention_and_column_sums(query, key, value, 0.35, with_output=False)
    assert nothing is None and torch.equal(alone, sums)  # the sums without the output: the same bits


def test_fused_prompt_attention_returns_the_input_dtype():
    from polykv.runtime.attention_math import causal_attention_and_column_sums

    g = torch.Generator().manual_seed(2)
    query, key, value = (torch.randn(1, 2, 9, 8, generator=g).bfloat16() for _ in range(3))
    output, sums = causal_attention_and_column_sums(query, key, value, 0.35)
    assert output.dtype == torch.bfloat16 and sums.dtype == torch.float32
    reference = torch.nn.functional.scaled_dot_product_attention(
        query.float(), key.float(), value.float(), is_causal=True, scale=0.35
    )
    assert torch.allclose(output.float(), reference.transpose(1, 2), atol=1e-2)


def test_attention_function_takes_arguments_in_the_order_transformers_uses():
    # Wrappers (kvpress patches every registered attention function) pass dropout positionally after
    # the mask, as transformers' own functions take it.
    import inspect

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from polykv.runtime.attention import polykv_attention

    ours = list(inspect.signature(polykv_attention).parameters)[:7]
    assert ours == list(inspect.signature(sdpa_attention_forward).parameters)[:7]


@pytest.mark.parametrize("groups", [1, 3])
def test_a_whole_prompt_masks_only_its_last_slots_and_scissorhands_reads_it_as_the_general_mask(groups):
    """A fresh prompt's rows (`LayerView.fresh`: slot i holds position i) mask only their last w slots; the
    probabilities, and Scissorhands' flags read from them without a visibility mask, are the same bits as the
    general mask built from positions gives."""
    from dataclasses import replace

    from polykv.methods.attention.scissorhands import Scissorhands
    from polykv.methods.base import LayerView
    from polykv.plan import Phase
    from polykv.runtime.attention_math import attention_probs

    g = torch.Generator().manual_seed(4)
    for n, w in [(1, 1), (5, 5), (40, 7), (300, 100)]:
        heads = 2
        query = torch.randn(1, heads * groups, w, 8, generator=g)
        key = torch.randn(1, heads, n, 8, generator=g)
        positions = torch.arange(n).expand(1, heads, n)
        query_pos = torch.arange(n - w, n)
        general = attention_probs(query, key, query_pos, positions, 0.35)
        fresh = attention_probs(query, key, query_pos, positions, 0.35, fresh=True)
        assert torch.equal(fresh, general), (n, w)
        view = LayerView(Phase.PREFILL, key, key, positions, n, groups, rows=fresh, fresh=True)
        flags = []
        for v in (view, replace(view, fresh=False)):
            method = Scissorhands(n, {"history": w})
            method.observe_prefill(v)
            flags.append(method.per_token["unimportant"])
        assert torch.equal(flags[0], flags[1]) and (n == 1 or flags[0].any()), (n, w)

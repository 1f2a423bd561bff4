"""Cheaper per-step operations that must give the same numbers as the ones they replace."""

from __future__ import annotations

import pytest
import torch

from polykv.methods.scissorhands import row_quantile


@pytest.mark.parametrize("q", [0.9, 0.5, 0.1, 0.75, 0.95, 0.999, 1 / 3])
def test_row_quantile_equals_torch_quantile(q):
    g = torch.Generator().manual_seed(0)
    for n in [1, 2, 3, 7, 10, 100, 257, 1000, 4097]:
        rows = torch.rand(2, 3, 1, n, generator=g)
        rows[0, 0, 0, : n // 2] = 0.25  # ties
        assert torch.equal(row_quantile(rows, q), torch.quantile(rows, q, dim=-1, keepdim=True)), n


@pytest.mark.parametrize("chunk", [1, 3, 7, 256])
@pytest.mark.parametrize("groups", [1, 2])
def test_causal_column_sums_equal_the_general_pass(chunk, groups, monkeypatch):
    from polykv.runtime import attention

    monkeypatch.setattr(attention, "_CAUSAL_CHUNK", chunk)
    g = torch.Generator().manual_seed(1)
    n, heads = 23, 2
    query = torch.randn(2, heads * groups, n, 8, generator=g)
    key = torch.randn(2, heads, n, 8, generator=g)
    positions = torch.arange(n).expand(2, heads, n)
    expected = attention._column_sums(query, key, torch.arange(n), positions, 0.35, None)
    got = attention._causal_column_sums(query, key, 0.35)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert torch.allclose(got.sum(-1), torch.full((2, heads * groups), float(n)), rtol=1e-5)  # each query sums to 1

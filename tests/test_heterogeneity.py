"""Attention heterogeneity (Figure 1): support sizes, where the support lies, and the demo measurement."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from polykv.profile.corpus import CorpusSpec, build_corpus
from polykv.profile.heterogeneity import (
    HeterogeneityResult,
    bootstrap_median_interval,
    layer_attention,
    measure_heterogeneity,
    support_density,
    support_positions,
    support_size,
)

# ---- support sizes on hand-made rows -----------------------------------------------------------------


def test_support_size_of_hand_made_rows():
    assert int(support_size(torch.full((10,), 0.1), 0.9)) == 9
    assert int(support_size(torch.tensor([0.0, 0.0, 1.0, 0.0]), 0.9)) == 1
    row = torch.tensor([0.5, 0.3, 0.15, 0.05])
    assert int(support_size(row, 0.9)) == 3
    assert int(support_size(row, 0.8)) == 2
    assert int(support_size(row, 0.5)) == 1
    assert int(support_size(row, 1.0)) == 4
    assert int(support_size(row.flip(0), 0.8)) == 2  # order does not matter


def test_support_size_works_on_batches_and_dtypes():
    rows = torch.stack([torch.full((4,), 0.25), torch.tensor([0.05, 0.15, 0.3, 0.5])]).to(torch.bfloat16)
    sizes = support_size(rows.expand(3, 2, 4), 0.8)
    assert sizes.shape == (3, 2) and sizes.dtype == torch.int64
    assert sizes[0].tolist() == [4, 2]
    # a row that sums to less than the coverage counts every position
    assert int(support_size(torch.tensor([0.2, 0.2, 0.2]), 0.9)) == 3


def test_support_size_rejects_bad_coverage():
    for coverage in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="coverage"):
            support_size(torch.full((4,), 0.25), coverage)


def test_support_positions_and_density_of_a_hand_made_row():
    row = torch.zeros(16)
    row[[1, 2, 13, 14]] = torch.tensor([0.3, 0.05, 0.4, 0.25])
    chosen = support_positions(row, 0.9)
    assert chosen.tolist() == [1, 13, 14]
    assert support_positions(row, 0.9, positions=torch.arange(100, 116)).tolist() == [101, 113, 114]
    density = support_density(chosen, 16, bins=4)  # bins [0,4) [4,8) [8,12) [12,16)
    assert density.shape == (4,)
    assert torch.allclose(density, torch.tensor([1 / 3, 0.0, 0.0, 2 / 3]))
    assert float(density.sum()) == pytest.approx(1.0)
    # more bins than positions: each position still lands in its own bin
    fine = support_density(torch.tensor([0, 9]), 10, bins=32)
    assert fine.nonzero().flatten().tolist() == [0, 28] and float(fine.sum()) == pytest.approx(1.0)
    assert support_density(torch.tensor([], dtype=torch.long), 10, bins=4).tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="positions"):
        support_density(torch.tensor([10]), 10)


def test_layer_attention_follows_the_recorded_positions():
    # 4 query heads over 2 KV heads; KV head 1 holds its slots in reverse position order
    rows = torch.zeros(1, 4, 1, 3)
    rows[0, :, 0] = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.5, 0.5]])
    positions = torch.tensor([[[0, 1, 2], [2, 1, 0]]])
    dense = layer_attention(rows, positions)
    assert dense.tolist() == pytest.approx([(1 + 1 + 1 + 0.5) / 4, 0.5 / 4, 0.0])
    assert layer_attention(rows, positions, length=5).shape == (5,)


# ---- the bootstrap interval --------------------------------------------------------------------------


def test_bootstrap_interval_contains_the_median_and_is_deterministic():
    rng = np.random.default_rng(7)
    values = rng.integers(1, 200, size=(25, 5))
    low, high = bootstrap_median_interval(values, bootstrap=500, seed=3)
    median = np.median(values, axis=0)
    assert low.shape == high.shape == (5,)
    assert np.all(low <= median) and np.all(median <= high) and np.all(low < high)
    again = bootstrap_median_interval(values, bootstrap=500, seed=3)
    assert np.array_equal(again[0], low) and np.array_equal(again[1], high)
    other = bootstrap_median_interval(values, bootstrap=500, seed=4)
    assert not (np.array_equal(other[0], low) and np.array_equal(other[1], high))
    one_low, one_high = bootstrap_median_interval([5.0], bootstrap=10)
    assert float(one_low) == float(one_high) == 5.0


# ---- the measurement on the demo model ---------------------------------------------------------------


@pytest.fixture(scope="module")
def short_inputs(demo_model):
    _, tokenizer = demo_model
    spec = CorpusSpec(sources=("kjv", "jargon", "stdlib"), num_sequences=3, max_tokens=64)
    return build_corpus(tokenizer, spec).sequences


@pytest.fixture(scope="module")
def measured(demo_model, short_inputs):
    return measure_heterogeneity(demo_model[0], short_inputs, coverage=0.9, bins=8, bootstrap=200, seed=1)


def test_measure_heterogeneity_on_the_demo_model(demo_model, measured):
    model = demo_model[0]
    layers = model.config.num_hidden_layers
    result = measured
    assert isinstance(result, HeterogeneityResult)
    assert result.sizes.shape == (3, layers) and result.lengths == [65, 65, 65]  # 64 prompt tokens + the new one
    assert np.all(result.sizes >= 1) and np.all(result.sizes <= 65)
    assert result.median.shape == result.ci_low.shape == result.ci_high.shape == (layers,)
    assert np.array_equal(result.median, np.median(result.sizes, axis=0))
    assert np.all(result.ci_low <= result.median) and np.all(result.median <= result.ci_high)
    assert result.density.shape == (layers, 8)
    assert np.allclose(result.density.sum(axis=1), 1.0) and np.all(result.density >= 0)
    assert result.params["coverage"] == 0.9 and result.params["bins"] == 8
    assert result.params["bootstrap"] == 200 and result.params["seed"] == 1 and result.params["num_inputs"] == 3
    assert result.params["truncated_inputs"] == 0
    assert model.config._attn_implementation == "sdpa"  # routed() put the model back


def test_measure_heterogeneity_matches_eager_attention(demo_model, short_inputs, measured):
    """The routed recording equals the attention a plain eager forward reports for the decoded token."""
    model = demo_model[0]
    ids = torch.tensor([short_inputs[0]])
    with torch.no_grad():
        token = model(ids).logits[:, -1:].argmax(-1)
        full = torch.cat([ids, token], dim=1)
        model.set_attn_implementation("eager")
        try:
            attentions = model(full, output_attentions=True).attentions
        finally:
            model.set_attn_implementation("sdpa")
    expected = [int(support_size(a[0, :, -1].mean(0), 0.9)) for a in attentions]
    assert measured.sizes[0].tolist() == expected


def test_measure_heterogeneity_is_deterministic_and_serialises(demo_model, short_inputs, measured):
    again = measure_heterogeneity(demo_model[0], short_inputs, coverage=0.9, bins=8, bootstrap=200, seed=1)
    assert np.array_equal(again.sizes, measured.sizes) and np.array_equal(again.ci_low, measured.ci_low)
    assert np.array_equal(again.density, measured.density)
    data = json.loads(json.dumps(measured.to_dict()))
    assert data["sizes"] == measured.sizes.tolist() and data["params"]["bins"] == 8
    frame = measured.to_frame()
    assert list(frame["layer"]) == list(range(measured.num_layers))
    assert {"median", "ci_low", "ci_high"} <= set(frame.columns)
    assert len(measured.to_frame("sizes")) == 3 * measured.num_layers
    assert len(measured.to_frame("density")) == measured.num_layers * 8


def test_measure_heterogeneity_cuts_prompts_to_the_context(demo_model, short_inputs):
    model = demo_model[0]
    long = (short_inputs[0] * 9)[:600]
    result = measure_heterogeneity(model, [long], bins=4, bootstrap=10)
    assert result.params["truncated_inputs"] == 1
    assert result.lengths == [model.config.max_position_embeddings]
    assert np.allclose(result.density.sum(axis=1), 1.0)

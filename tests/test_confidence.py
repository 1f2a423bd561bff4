"""Bootstrap intervals and route confidence on hand-made per-sequence values (no model)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from polykv.methods import for_phase
from polykv.plan import FULL, Phase
from polykv.profile.confidence import bootstrap_weights, cell_intervals, fullkv_perplexity, replicate_values
from polykv.profile.profiler import PROFILE_REVISION, profiled_methods
from polykv.profile.store import Profile, ProfileError
from polykv.routing import NOISY_ROUTE, is_noisy, route_confidence, toprank

T = 4  # continuation tokens per sequence


def frame(cells: dict[tuple[int, str, str], list[tuple[float, float]]]) -> pd.DataFrame:
    """{(layer, scope, method): [(cosine, nll) per sequence]} -> sequences.csv rows."""
    return pd.DataFrame(
        [
            {"layer": l, "scope": s, "method": m, "sequence": k, "cosine": c, "nll": n}
            for (l, s, m), values in cells.items()
            for k, (c, n) in enumerate(values)
        ]
    )


def test_bootstrap_weights_draw_n_per_replicate_and_repeat_for_a_seed():
    weights = bootstrap_weights(5, replicates=200, seed=3)
    assert weights.shape == (200, 5) and (weights.sum(axis=1) == 5).all()
    assert (weights == bootstrap_weights(5, replicates=200, seed=3)).all()
    assert not (weights == bootstrap_weights(5, replicates=200, seed=4)).all()
    with pytest.raises(ValueError, match="at least one sequence"):
        bootstrap_weights(0)


def test_replicates_follow_the_drawn_sequences():
    sequences = frame({(0, "decode", "tova"): [(0.9, 8.0), (0.5, 12.0)]})
    reference = [4.0, 8.0]
    # replicate 0: the full sample; 1: sequence 0 twice; 2: sequence 1 twice
    weights = np.array([[1.0, 1.0], [2.0, 0.0], [0.0, 2.0]])
    _, cosine = replicate_values(sequences, reference, T, "cosine", weights)
    assert cosine[0] == pytest.approx([0.7, 0.9, 0.5])
    _, dppl = replicate_values(sequences, reference, T, "dppl", weights)
    # exp(mean NLL per token under the method) - exp(mean NLL per token under FullKV)
    assert dppl[0] == pytest.approx(
        [math.exp(20 / 8) - math.exp(12 / 8), math.exp(2) - math.exp(1), math.exp(3) - math.exp(2)]
    )


def test_paired_resampling_gives_a_method_equal_to_fullkv_a_zero_interval():
    # Sequences differ wildly, but the method scores exactly FullKV's NLL on each: every replicate draws
    # the same sequences for both, so dPPL is 0 in all of them.
    reference = [4.0, 40.0, 9.0, 25.0]
    sequences = frame(
        {(0, "decode", "tova"): [(1.0, n) for n in reference], (0, "decode", "h2o"): [(0.8, n + T) for n in reference]}
    )
    intervals = cell_intervals(sequences, reference, T, replicates=300).set_index("method")
    assert intervals.loc["tova", "dppl_low"] == 0 and intervals.loc["tova", "dppl_high"] == 0
    # a constant cosine has a constant interval; one more nat per token always costs something
    assert intervals.loc["h2o", "cosine_low"] == pytest.approx(0.8) and intervals.loc[
        "h2o", "cosine_high"
    ] == pytest.approx(0.8)
    assert intervals.loc["h2o", "dppl_low"] > 0
    assert list(intervals.columns) == ["layer", "scope", "cosine_low", "cosine_high", "dppl_low", "dppl_high"]


def test_intervals_are_percentiles_of_the_replicates():
    rng = np.random.default_rng(0)
    reference = rng.uniform(10, 20, size=6).tolist()
    sequences = frame(
        {(1, "prefill", "snapkv"): [(c, n) for c, n in zip(rng.uniform(0.8, 1, 6), rng.uniform(10, 20, 6))]}
    )
    got = cell_intervals(sequences, reference, T, replicates=500, seed=2).iloc[0]
    weights = bootstrap_weights(6, 500, 2)
    _, cosine = replicate_values(sequences, reference, T, "cosine", weights)
    assert (got.cosine_low, got.cosine_high) == pytest.approx(tuple(np.quantile(cosine[0], [0.025, 0.975])))
    assert got.cosine_low < got.cosine_high


def profile_from(cosines: dict[tuple[int, str], list[float]], layers: int, phase: str = "decode") -> Profile:
    """A current in-memory profile of one phase: the given per-sequence cosines, and 0.0 for every other
    (layer, method) of the phase; every NLL equals FullKV's."""
    n = len(next(iter(cosines.values())))
    reference = [10.0] * n
    methods = [FULL, *for_phase(Phase(phase))]
    cells = {
        (l, phase, m): [(c, 10.0) for c in cosines.get((l, m), [1.0 if m == FULL else 0.0] * n)]
        for l in range(layers)
        for m in methods
    }
    sequences = frame(cells)
    table = sequences.groupby(["layer", "scope", "method"], as_index=False).agg(cosine=("cosine", "mean"))
    table["dppl"] = 0.0
    metadata = {
        "key": "hand",
        "model": "demo",
        "num_layers": layers,
        "capacity": 8,
        "seed": 0,
        "scopes": [phase],
        "continuation": T,
        "methods": profiled_methods([Phase(phase)]),
        "profile_revision": PROFILE_REVISION,
        "corpus": {"num_sequences": n, "spec": {"sources": ["model"], "num_sequences": n, "max_tokens": 64}},
    }
    reference_frame = pd.DataFrame({"sequence": range(n), "source": ["model"] * n, "nll": reference})
    return Profile(
        metadata,
        table,
        pd.DataFrame({"layer": range(layers), "entropy": [1.0] * layers}),
        sequences=sequences,
        reference=reference_frame,
    )


def test_route_confidence_counts_the_replicates_the_winner_survives():
    # layer 0: tova beats h2o on both sequences; layer 1: tova wins on average (0.7 vs 0.65) but loses
    # whenever the draw is sequence 1 twice.
    profile = profile_from(
        {(0, "tova"): [0.9, 0.8], (0, "h2o"): [0.5, 0.4], (1, "tova"): [0.9, 0.5], (1, "h2o"): [0.6, 0.7]}, layers=2
    )
    got = route_confidence(profile, "decode", "cosine", replicates=400, seed=5)
    assert list(got.winner) == toprank(profile.table, "decode", "cosine") == ["tova", "tova"]
    assert list(got.runner_up) == ["h2o", "h2o"]
    assert list(got.margin) == pytest.approx([0.4, 0.05])
    weights = bootstrap_weights(2, 400, 5)
    assert got.win_frequency[0] == 1.0
    assert got.win_frequency[1] == pytest.approx(np.mean(weights[:, 1] < 2))
    assert 0.6 < got.win_frequency[1] < 0.9  # about 3/4


def test_route_confidence_breaks_ties_in_registry_order_like_toprank():
    first, second = for_phase(Phase.DECODE)[:2]
    profile = profile_from({(0, first): [0.9, 0.1], (0, second): [0.9, 0.1]}, layers=1)
    got = route_confidence(profile, "decode", "cosine", replicates=100)
    assert got.winner[0] == first and got.runner_up[0] == second
    assert got.margin[0] == 0 and got.win_frequency[0] == 1.0  # equal in every replicate: the earlier one


def test_route_confidence_refuses_a_stale_or_unmeasured_profile(monkeypatch):
    profile = profile_from({(0, "tova"): [0.9, 0.8]}, layers=1)
    with pytest.raises(ProfileError, match="has no prefill measurements"):
        route_confidence(profile, "prefill")
    from polykv.methods import REGISTRY

    monkeypatch.setattr(REGISTRY["tova"], "revision", REGISTRY["tova"].revision + 1)
    with pytest.raises(ProfileError, match="measured tova at revision"):
        route_confidence(profile, "decode")


def test_noisy_route_threshold():
    assert is_noisy(pd.DataFrame({"win_frequency": [0.3, 0.5, 0.9]}))
    assert not is_noisy(pd.DataFrame({"win_frequency": [0.3, NOISY_ROUTE, 0.9]}))


def test_fullkv_perplexity_per_source():
    # per-token NLL: a -> (2 + 4) / 2 = 3 nats, b -> 1 nat
    got = fullkv_perplexity([2.0 * T, 1.0 * T, 4.0 * T], ["a", "b", "a"], T)
    assert list(got) == ["a", "b"] and got["a"] == pytest.approx(math.exp(3)) and got["b"] == pytest.approx(math.e)


def test_a_profile_of_few_sequences_is_warned_of_whatever_its_win_frequencies():
    from polykv.routing.confidence import FEW_SEQUENCES, few_sequences_warning

    assert "only 2 calibration sequence(s)" in few_sequences_warning(2)
    assert few_sequences_warning(FEW_SEQUENCES) is None

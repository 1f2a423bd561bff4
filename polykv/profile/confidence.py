"""How much to trust a profile: bootstrap intervals over the calibration sequences.

A profile cell (layer, scope, method) is a mean over the calibration sequences, so a small corpus gives
noisy cells and a route picked from them may be noise. We resample the sequences with replacement
(the same draw for every cell, so methods stay paired: each replicate is one alternative corpus) and
recompute every cell per replicate:
  cosine   the mean of the drawn sequences' cosines;
  dPPL     exp(mean NLL per token under the method) - exp(mean NLL per token under FullKV), both over
           the drawn sequences (each sequence's NLL is summed over its `continuation` tokens);
  danswer  (a workload profile) the mean over the drawn sequences of the gold answer's NLL per answer token
           under the method minus under FullKV: the change of the suite's answer_nll.
`cell_intervals` gives each cell's percentile 95% interval; `polykv.routing.confidence` says, per
layer, how often TopRank's pick stays the best across the same replicates. Replicates are seeded: the
same profile, seed and count always give the same numbers.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from polykv.profile.store import NO_ANSWER, STATISTICS

REPLICATES = 1000
LEVEL = 0.95


def bootstrap_weights(num_sequences: int, replicates: int = REPLICATES, seed: int = 0) -> np.ndarray:
    """[replicates, num_sequences]: how many times each sequence is drawn in each replicate (n draws with
    replacement per replicate, from numpy's default generator seeded with `seed`)."""
    if num_sequences < 1 or replicates < 1:
        raise ValueError(
            f"a bootstrap needs at least one sequence and one replicate (got {num_sequences}, {replicates})"
        )
    draws = np.random.default_rng(seed).integers(0, num_sequences, size=(replicates, num_sequences))
    weights = np.zeros((replicates, num_sequences))
    np.add.at(weights, (np.arange(replicates)[:, None], draws), 1.0)
    return weights


def _cell_matrix(sequences: pd.DataFrame, column: str, num_sequences: int) -> tuple[list[tuple], np.ndarray]:
    """The cells (layer, scope, method) in sorted order and their [cells, sequences] values of `column`."""
    wide = sequences.pivot_table(index=["layer", "scope", "method"], columns="sequence", values=column, aggfunc="first")
    wide = wide.reindex(columns=range(num_sequences))
    return [(int(l), str(s), str(m)) for l, s, m in wide.index], wide.to_numpy(dtype=float)


def replicate_values(
    sequences: pd.DataFrame,
    reference_nll,
    continuation,
    statistic: str,
    weights: np.ndarray,
    answer_tokens=None,
) -> tuple[list[tuple], np.ndarray]:
    """Every cell's `statistic` in every replicate: the cells (layer, scope, method) and [cells, replicates].

    `weights` [replicates, sequences] (from `bootstrap_weights`; a row of ones is the full sample).
    `continuation`: the tokens each sequence's NLL is summed over (one number, or one per sequence).
    `answer_tokens`: each sequence's gold-answer length (a workload profile; None for text), the divisor of
    danswer: the change of the answer's mean NLL per token (answer_nll) against FullKV."""
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r} (known: {', '.join(STATISTICS)})")
    reference = np.asarray(reference_nll, dtype=float)
    n = len(reference)
    drawn = weights.sum(axis=1)  # n per replicate
    if statistic == "cosine":
        cells, values = _cell_matrix(sequences, "cosine", n)
        return cells, values @ weights.T / drawn
    cells, nll = _cell_matrix(sequences, "nll", n)
    if statistic == "danswer":
        if answer_tokens is None:
            raise ValueError(NO_ANSWER)
        per_sequence = (nll - reference) / np.asarray(answer_tokens, dtype=float)
        return cells, per_sequence @ weights.T / drawn
    tokens = weights @ np.broadcast_to(np.asarray(continuation, dtype=float), (n,))  # scored tokens per replicate
    return cells, np.exp(nll @ weights.T / tokens) - np.exp(weights @ reference / tokens)


def cell_intervals(
    sequences: pd.DataFrame,
    reference_nll,
    continuation,
    replicates: int = REPLICATES,
    seed: int = 0,
    answer_tokens=None,
) -> pd.DataFrame:
    """Per cell: layer, scope, method, cosine_low, cosine_high, dppl_low, dppl_high (and danswer_low,
    danswer_high for a workload profile): percentile 95% bootstrap intervals over the calibration sequences;
    one draw of sequences shared by all cells."""
    weights = bootstrap_weights(len(reference_nll), replicates, seed)
    tail = (1 - LEVEL) / 2
    out = None
    for statistic in STATISTICS:
        if statistic == "danswer" and answer_tokens is None:
            continue
        cells, values = replicate_values(sequences, reference_nll, continuation, statistic, weights, answer_tokens)
        low, high = np.quantile(values, [tail, 1 - tail], axis=1)
        frame = pd.DataFrame(cells, columns=["layer", "scope", "method"])
        frame[f"{statistic}_low"], frame[f"{statistic}_high"] = low, high
        out = frame if out is None else out.merge(frame, on=["layer", "scope", "method"])
    return out


def danswer_means(sequences: pd.DataFrame, reference_nll, answer_tokens) -> pd.DataFrame:
    """Per cell: layer, scope, method, danswer (the mean over sequences of the answer's NLL per token under the
    cell minus under FullKV)."""
    ones = np.ones((1, len(reference_nll)))
    cells, values = replicate_values(sequences, reference_nll, 0, "danswer", ones, answer_tokens)
    frame = pd.DataFrame(cells, columns=["layer", "scope", "method"])
    frame["danswer"] = values[:, 0]
    return frame


def fullkv_perplexity(reference_nll, sources, continuation) -> dict[str, float]:
    """{source: FullKV perplexity of the continuations of that source's calibration sequences}, in the
    order sources first appear (`continuation`: scored tokens, one number or one per sequence)."""
    nll = np.asarray(reference_nll, dtype=float)
    tokens = np.broadcast_to(np.asarray(continuation, dtype=float), nll.shape)
    sources = list(sources)
    if len(sources) != len(nll):
        raise ValueError(f"{len(sources)} sources for {len(nll)} sequences")
    out = {}
    for source in dict.fromkeys(sources):
        mine = np.array([s == source for s in sources])
        out[source] = float(math.exp(nll[mine].sum() / tokens[mine].sum()))
    return out


__all__ = [
    "LEVEL",
    "NO_ANSWER",
    "REPLICATES",
    "bootstrap_weights",
    "cell_intervals",
    "danswer_means",
    "fullkv_perplexity",
    "replicate_values",
]

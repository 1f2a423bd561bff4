"""The paper's numbers that a study report puts beside its own, quoted (not recomputed) from

  Chao Fei, Kaihua Liang, Hanzhi Hu, Hongcheng Guo, Jian Weng, Marco Canini, Panos Kalnis, "Exploring a
  Layer-Wise Design Space for KV Cache Eviction", arXiv:2606.15157 (version 2): Appendix Tables 2, 4 and 5
  and the task-level robustness paragraph of B.1 (LLaMA-3.1-8B-Instruct, LongBench, 21-task macro average,
  higher is better).

Only this version is quoted; an earlier version of the same arXiv id has other numbers.
"""

from __future__ import annotations

CITATION = (
    'Fei et al., "Exploring a Layer-Wise Design Space for KV Cache Eviction", arXiv:2606.15157 v2 '
    "(LLaMA-3.1-8B-Instruct on LongBench, 21-task macro average, higher is better)"
)

# Table 2: the matched LongBench factorial at a 512-token average budget (decode-only).
TABLE_2 = {
    "budget": 512,
    "anchor": "TOVA (decode-only)",
    "cells": {
        ("homogeneous", "uniform"): 37.3500,
        ("homogeneous", "allocated"): 37.5833,
        ("routed", "uniform"): 37.6138,
        ("routed", "allocated"): 37.7776,
    },
    "allocation": "PPL",
    # B.1: the routing contrast under uniform allocation, its task-bootstrap interval (10,000 replicates over
    # the 21 tasks), wins / ties / losses and the leave-one-task-out range
    "routing": {"difference": 0.2638, "low": 0.0005, "high": 0.5976, "wins": 11, "ties": 2, "losses": 8},
    "leave_one_out": (0.1285, 0.3150),
}

# Table 4: the count-matched placement control (3 D2O + 29 TOVA layers, uniform allocation, 512 tokens).
TABLE_4 = {
    "random_controls": 99,
    "guided_score": 37.6138,
    "random_mean": 37.3034,
    "random_sd": 0.1303,
    "random_range": (37.0324, 37.6210),
    "guided_minus_mean": 0.3105,
    "random_at_least_guided": 1,
    "guided_rank": "2/100",
    # Section 4.2: the profile validation over the 99 random placements
    "spearman": 0.459,
    "spearman_p": 0.0001,
    "monte_carlo_p": 0.020,
}

# Table 5: the budget sweep of the fixed cosine route against the nine baselines.
TABLE_5_BUDGETS = (128, 256, 512, 768, 1024)
TABLE_5_FULLKV = 38.9857
TABLE_5 = {
    "CAKE": (32.1214, 34.6248, 36.3514, 36.9890, 37.5705),
    "CaM": (29.5862, 31.4490, 32.7248, 33.9633, 34.5600),
    "D2O": (11.9476, 11.5695, 11.6457, 11.9238, 11.8486),
    "H2O": (29.0733, 31.3352, 32.7910, 33.9533, 34.7167),
    "PyramidKV": (31.7910, 34.1567, 35.8090, 36.6376, 37.1414),
    "Scissorhands": (27.1529, 29.2233, 31.1881, 32.0886, 33.2905),
    "SnapKV": (32.2457, 34.5805, 35.9352, 36.5167, 36.9905),
    "StreamingLLM": (17.6043, 16.8233, 15.8124, 15.5871, 15.1319),
    "TOVA": (33.5924, 34.4814, 35.6962, 36.4300, 37.0571),
    "Route-only": (35.7476, 36.8410, 37.5890, 37.8690, 38.0267),
    "Route + PPL allocation": (35.4362, 36.6681, 37.7929, 38.0814, 38.2181),
}
TABLE_5_ROUTES = ("Route-only", "Route + PPL allocation")
# Section 4.3: route-only minus the per-budget best baseline ranges over these margins
SWEEP_MARGINS = (0.46, 2.22)


def table_5_envelope() -> dict[int, tuple[str, float]]:
    """Per budget of Table 5, the best of the nine baselines and its score (the paper's envelope)."""
    out = {}
    for i, budget in enumerate(TABLE_5_BUDGETS):
        rows = {name: values[i] for name, values in TABLE_5.items() if name not in TABLE_5_ROUTES}
        best = max(rows, key=rows.get)
        out[budget] = (best, rows[best])
    return out


__all__ = [
    "CITATION",
    "SWEEP_MARGINS",
    "TABLE_2",
    "TABLE_4",
    "TABLE_5",
    "TABLE_5_BUDGETS",
    "TABLE_5_FULLKV",
    "TABLE_5_ROUTES",
    "table_5_envelope",
]

"""PyramidKV: SnapKV's selection with budgets that shrink with depth.

Cai, Zhang, Gao, Liu, Liu, Lu, Xiong, Dong, Chang, Hu, Xiao. "PyramidKV: Dynamic KV Cache Compression
based on Pyramidal Information Funneling." arXiv:2406.02069 (code: Zefan-Cai/KVCache-Factory).
"""

from __future__ import annotations

from polykv.methods.attention.snapkv import SnapKV, SnapKVParams
from polykv.methods.params import Real, real, tokens
from polykv.methods.shared import split_total


class PyramidKVParams(SnapKVParams):
    window: int = tokens(8, ge=1, description="observation window (also kept in every layer); below the capacity")
    beta: Real = real(
        20.0,
        gt=1.0,
        le=1000.0,
        description="top-to-bottom budget ratio of the pyramid (the authors' 20; at 1000 the top layers keep "
        "about nothing beyond the window already)",
    )


class PyramidKV(SnapKV):
    """SnapKV scoring at the end of prefill; its own rule gives lower layers more of the budget.

    Token rule: exactly SnapKV's (window votes, pooling, the window always kept), at prefill only.
    Layer rule (native allocation), with average capacity C per layer, window w, L layers, prompt n:
    the prefix budgets fall linearly from k_0 = 2(C - w) - k_{L-1} at the bottom to
    k_{L-1} = (C - w) / beta at the top; when k_0 would exceed n - w it is clipped to n - w and k_{L-1}
    raised to keep the mean; prompts shorter than 2(C - w) get uniform budgets (shorter than C: none
    evicted). Each layer keeps k_l + w. We round with largest remainders so that the budgets sum to
    exactly L*C (the authors' integer division loses a few tokens). Defaults window 8, kernel 7, max
    pooling, beta 20: the authors' LongBench script (run_longbench.py). In a plan with fixed allocation
    the plan's per-layer capacity wins and PyramidKV is SnapKV with these defaults.
    """

    name = "pyramidkv"
    colour = "#56B4E9"
    standalone_source = "PyramidKV (Cai et al., 2024): SnapKV's prompt compression, budgets falling with depth"
    Params = PyramidKVParams
    params: PyramidKVParams  # this instance's, parsed
    native_allocation = True

    @classmethod
    def allocate(cls, total, statistics, params, prompt_length=None):
        layers = len(statistics)
        average = total / layers
        prefix = average - params.window
        if layers == 1 or prefix <= 0 or (prompt_length is not None and prompt_length < 2 * prefix):
            return split_total([1.0] * layers, total)
        low = prefix / params.beta
        high = 2 * prefix - low
        if prompt_length is not None and high >= prompt_length - params.window:
            high = prompt_length - params.window
            low = 2 * prefix - high
        step = (high - low) / (layers - 1)
        budgets = split_total([high - i * step for i in range(layers)], total - layers * params.window, minimum=1)
        return [b + params.window for b in budgets]

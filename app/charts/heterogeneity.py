"""Attention heterogeneity (Figure 1a, 1b): support size per layer and where the support lies."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from app.charts.base import layer_axis, layout

MIN_SPAN = math.log10(3)  # the y axis spans at least a factor of 3, so a 1-token difference near 16 is small
PAD = 0.08  # share of the data's log span added above and below it
MAX_TICKS = 12


def _number(value: float) -> str:
    """A support size as the axis and hover print it: "17", "10.5", "1,024", "0.6"."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def _linear_ticks(bottom: float, top: float) -> list[float]:
    """Multiples of the largest step of 1, 2, 5 x 10^k that puts at least 3 of them in [bottom, top]."""
    steps = sorted(
        (
            m * 10.0**k
            for k in range(math.floor(math.log10(top - bottom)) - 2, math.ceil(math.log10(top)) + 1)
            for m in (1, 2, 5)
        ),
        reverse=True,
    )
    for step in steps:
        ticks = [round(i * step, 12) for i in range(math.ceil(bottom / step), math.floor(top / step) + 1)]
        if len(ticks) >= 3:
            return ticks
    return [bottom, (bottom + top) / 2, top]  # not reached: the smallest step fits hundreds


def log_axis(low: float, high: float) -> tuple[list[float], list[float]]:
    """A log axis for data between `low` and `high` (> 0): its range (log10 units, as plotly takes it)
    and tick values, at least 3 of them inside the range whatever the range. The range is the data's,
    padded, and widened about its centre to at least a factor of 3 (MIN_SPAN). Ticks: 1, 2, 5 x 10^k when
    3 to MAX_TICKS of them fall inside; powers of ten (every n-th) over many decades; else linear steps
    of 1, 2, 5 x 10^k (a narrow range)."""
    lo, hi = math.log10(low), math.log10(high)
    pad = max(PAD * (hi - lo), 0.02)
    lo, hi = lo - pad, hi + pad
    if hi - lo < MIN_SPAN:
        centre = (lo + hi) / 2
        lo, hi = centre - MIN_SPAN / 2, centre + MIN_SPAN / 2
    bottom, top = 10**lo, 10**hi

    def inside(values):
        return [v for v in values if bottom <= v <= top]

    decades = range(math.floor(lo), math.ceil(hi) + 1)
    ticks = inside([round(m * 10.0**k, 12) for k in decades for m in (1, 2, 5)])
    if len(ticks) > MAX_TICKS:  # many decades: powers of ten, every n-th so that at most MAX_TICKS remain
        powers = inside([round(10.0**k, 12) for k in decades])
        ticks = powers[:: math.ceil(len(powers) / MAX_TICKS)]
    elif len(ticks) < 3:  # a narrow range: linear steps
        ticks = _linear_ticks(bottom, top)
    return [lo, hi], ticks


def support_figure(frame: pd.DataFrame, coverage: float, windows: Sequence[int | None] = ()) -> go.Figure:
    """Per-layer median support size with its bootstrap 95% interval, log scale (Figure 1a). The axis's
    range and ticks follow the data (`log_axis`); the hover names the median and the interval's ends. On a hybrid
    model (`windows`: each layer's sliding window or None), a local layer's window bounds its support: drawn as a
    short line over the layer, and the layer's tick says L (local) or G (global)."""
    ends = [
        [_number(m), _number(lo), _number(hi)] for m, lo, hi in zip(frame["median"], frame["ci_low"], frame["ci_high"])
    ]
    fig = go.Figure(
        go.Scatter(
            x=frame["layer"],
            y=frame["median"],
            mode="lines+markers",
            name="median",
            error_y=dict(
                type="data",
                symmetric=False,
                array=frame["ci_high"] - frame["median"],
                arrayminus=frame["median"] - frame["ci_low"],
            ),
            customdata=ends,
            hovertemplate="layer %{x}<br>median %{customdata[0]}, 95% interval "
            "[%{customdata[1]}, %{customdata[2]}]<extra></extra>",
        )
    )
    # the exact layers: the markers would pad the axis to -1 and L, ticks that are no layer
    fig.update_xaxes(title_text="layer", **layer_axis(frame["layer"]))
    values = [float(v) for c in ("median", "ci_low", "ci_high") for v in frame[c] if v > 0 and math.isfinite(v)]
    local = [(int(layer), windows[int(layer)]) for layer in frame["layer"] if int(layer) < len(windows)]
    local = [(layer, w) for layer, w in local if w is not None]
    if local:
        values.extend(float(w) for _, w in local)
        xs = [x for layer, _ in local for x in (layer - 0.4, layer + 0.4, None)]
        ys = [y for _, w in local for y in (w, w, None)]
        fig.add_trace(
            go.Scatter(x=xs, y=ys, mode="lines", name="a local layer's window", line=dict(color="#555", dash="dot"))
        )
        fig.update_xaxes(
            tickmode="array",
            tickvals=list(frame["layer"]),
            ticktext=[f"{int(i)} {'L' if int(i) < len(windows) and windows[int(i)] else 'G'}" for i in frame["layer"]],
        )
    span, ticks = log_axis(min(values), max(values)) if values else log_axis(1.0, 10.0)
    fig.update_yaxes(
        type="log",
        range=span,
        tickvals=ticks,
        ticktext=[_number(t) for t in ticks],
        title_text=f"positions holding {coverage:.0%} of attention",
    )
    return layout(fig, f"{coverage:.0%} attention support per layer (median, 95% interval)", 380)


def density_figure(density: np.ndarray) -> go.Figure:
    """Where each layer's support set lies along the input: layers x position bins (Figure 1b)."""
    fig = go.Figure(
        go.Heatmap(
            z=density,
            x=[f"{(b + 0.5) / density.shape[1]:.2f}" for b in range(density.shape[1])],
            y=list(range(density.shape[0])),
            colorscale="Viridis",
            colorbar=dict(title="share"),
            hovertemplate="layer %{y}, position %{x} of the input<br>share of support %{z:.3f}<extra></extra>",
        )
    )
    fig.update_xaxes(title_text="relative position in the input (bin centre)")
    layers = density.shape[0]
    fig.update_yaxes(title_text="layer", **layer_axis(layers, reverse=True))
    # a readable row per layer: 5 layers fit the base height, 30 need about 18 px each
    return layout(fig, "support density over the input (one input)", max(380, min(900, 120 + 18 * layers)))

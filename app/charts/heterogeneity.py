"""Attention heterogeneity (Figure 1a, 1b): support size per layer and where the support lies."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from app.charts.base import layout


def support_figure(frame: pd.DataFrame, coverage: float) -> go.Figure:
    """Per-layer median support size with its bootstrap 95% interval, log scale (Figure 1a)."""
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
            hovertemplate="layer %{x}<br>median %{y}<extra></extra>",
        )
    )
    top = max(1.0, float(frame["ci_high"].max()) if len(frame) else 1.0)
    ticks = [m * 10**k for k in range(int(math.log10(top)) + 2) for m in (1, 2, 5) if m * 10**k <= 2 * top]
    fig.update_yaxes(
        type="log",
        tickvals=ticks,
        ticktext=[f"{t:,}" for t in ticks],
        title_text=f"positions holding {coverage:.0%} of attention",
    )
    fig.update_xaxes(title_text="layer", dtick=1 if len(frame) <= 40 else None)
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
    fig.update_yaxes(title_text="layer", autorange="reversed")
    return layout(fig, "support density over the input (one input)", 380)

"""Controlled experiments: the budget sweep (Figure 3) and the placement control (Figure 4)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from app.charts.base import layout, method_color


def sweep_figure(frame: pd.DataFrame, metric: str) -> go.Figure:
    """Suite score against budget: the route, each baseline, and the best-baseline envelope."""
    fig = go.Figure()
    baselines = [c for c in frame.columns if c not in ("budget", "route", "best baseline", "envelope")]
    for name in baselines:
        fig.add_trace(
            go.Scatter(
                x=frame["budget"],
                y=frame[name],
                mode="lines+markers",
                name=name,
                line=dict(color=method_color(name), width=1.5),
            )
        )
    fig.add_trace(
        go.Scatter(
            x=frame["budget"],
            y=frame["envelope"],
            mode="lines+markers",
            name="best baseline (envelope)",
            marker=dict(symbol="circle-open", size=12),
            line=dict(color="#444", dash="dash", width=2),
            text=frame["best baseline"],
            hovertemplate="budget %{x}<br>%{text}: %{y:.4f}<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=frame["budget"], y=frame["route"], mode="lines+markers", name="route", line=dict(color="#D62728", width=3)
        )
    )
    fig.update_xaxes(
        title_text="budget (average capacity per layer, tokens)", type="log" if len(frame) > 2 else "linear"
    )
    fig.update_yaxes(title_text=metric)
    return layout(fig, f"budget sweep: route vs baselines ({metric})", 400)


def placement_figure(guided: float, controls: Sequence[float], metric: str, rank: int, p_value: float) -> go.Figure:
    """Histogram of the random placements' scores with the guided route marked."""
    fig = go.Figure(
        go.Histogram(
            x=list(controls),
            name="random placements",
            marker_color="#8c8c8c",
            nbinsx=max(5, min(30, int(math.sqrt(len(controls))) * 2)),
        )
    )
    fig.add_vline(
        x=guided,
        line_color="#D62728",
        line_width=3,
        annotation_text=f"guided route: rank {rank} of {len(controls) + 1}, p = {p_value:.3f}",
    )
    fig.update_xaxes(title_text=metric)
    fig.update_yaxes(title_text="placements")
    return layout(fig, f"placement control ({metric})", 360)

"""Method profiles: per-layer, per-method preservation against FullKV, and attention entropy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from app.charts.base import layout


def profile_heatmap(table: pd.DataFrame, scope: str, value: str) -> go.Figure:
    """Layer x method grid of `value` (cosine or dppl) for one scope; hover shows the number. FullKV,
    the reference every number is measured against, is left out. dPPL is drawn on a diverging scale
    centred on 0 (blue: better than FullKV, red: worse)."""
    rows = table[(table["scope"] == scope) & (table["method"] != "full")]
    grid = rows.pivot_table(index="layer", columns="method", values=value).sort_index()
    better = "higher" if value == "cosine" else "lower"
    colors = dict(colorscale="Viridis") if value == "cosine" else dict(colorscale="RdBu_r", zmid=0.0)
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(),
            x=list(grid.columns),
            y=list(grid.index),
            **colors,
            text=np.vectorize(lambda v: f"{v:.4g}")(grid.to_numpy()),
            texttemplate="%{text}" if grid.size <= 200 else None,
            textfont=dict(size=11),
            hovertemplate="layer %{y}, %{x}<br>" + value + " %{z:.5g}<extra></extra>",
            colorbar=dict(title=value),
        )
    )
    fig.update_yaxes(title_text="layer", autorange="reversed", dtick=1 if len(grid) <= 40 else None)
    return layout(
        fig, f"{scope}: {value} per layer and method ({better} is better)", max(320, min(900, 140 + 36 * len(grid)))
    )


def entropy_figure(entropy: Sequence[float]) -> go.Figure:
    fig = go.Figure(
        go.Bar(
            x=list(range(len(entropy))),
            y=list(entropy),
            marker_color="#4C72B0",
            hovertemplate="layer %{x}<br>entropy %{y:.4f} nats<extra></extra>",
        )
    )
    fig.update_xaxes(title_text="layer")
    fig.update_yaxes(title_text="attention entropy (nats)")
    return layout(fig, "attention entropy per layer", 320)

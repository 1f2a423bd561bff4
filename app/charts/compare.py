"""Two runs compared task by task."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from app.charts.base import layout


def difference_figure(table: pd.DataFrame, difference: float, low: float, high: float, metric: str) -> go.Figure:
    """Per-task A - B bars with the macro-average difference and its paired bootstrap 95% interval."""
    fig = go.Figure(
        go.Bar(
            x=table["task"],
            y=table["A - B"],
            name="A - B per task",
            marker_color="#4C72B0",
            hovertemplate="%{x}<br>A - B %{y:+.4f}<extra></extra>",
        )
    )
    fig.add_hrect(
        y0=low,
        y1=high,
        fillcolor="#DD8452",
        opacity=0.2,
        line_width=0,
        annotation_text=f"95% CI [{low:+.4g}, {high:+.4g}]",
        annotation_position="top left",
    )
    fig.add_hline(
        y=difference,
        line_dash="dash",
        line_color="#DD8452",
        annotation_text=f"mean {difference:+.4g}",
        annotation_position="bottom right",
    )
    fig.add_hline(y=0, line_color="#444", line_width=1)
    fig.update_yaxes(title_text=f"{metric}: A - B")
    return layout(fig, f"{metric} difference per task (A - B)", 380)

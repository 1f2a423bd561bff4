"""Two runs compared task by task."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from app.charts.base import layout
from polykv.eval.comparing.compare import OUTCOMES
from polykv.eval.statistics.contrast import outcome
from polykv.eval.statistics.render import interval_text, ratio_text, signed

# Better / worse for the metric's direction (`polykv.eval.statistics.contrast.outcome`): bar colours, and the
# Streamlit colour names of the summary's delta (st.metric's `delta_color`).
OUTCOME_COLORS = {"A better": "#2E7D32", "B better": "#C62828", "tie": "#9E9E9E"}
OUTCOME_DELTA_COLORS = {
    "A better": "green",
    "B better": "red",
    "tie": "gray",
    "no significant difference": "gray",
    "not tested": "gray",
}


def difference_figure(
    table: pd.DataFrame, difference: float, low: float, high: float, metric: str, log: bool = False
) -> go.Figure:
    """Per-task A - B bars coloured by which run is better there (for the metric's direction), with the
    macro-average difference and its paired bootstrap 95% interval. `log`: the table holds log(metric),
    so differences are log-ratios (the hover and the interval also say them as ratios A / B)."""
    outcomes = [outcome(d, metric) for d in table["A - B"]]
    ratios = [ratio_text(math.exp(d)) if log else "" for d in table["A - B"]]
    name = f"log {metric}" if log else metric
    fig = go.Figure(
        go.Bar(
            x=table["task"],
            y=table["A - B"],
            name="A - B per task",
            marker_color=[OUTCOME_COLORS[o] for o in outcomes],
            customdata=list(zip(outcomes, ratios)),
            hovertemplate="%{x}<br>A - B %{y:+.4g} %{customdata[1]}<br>%{customdata[0]}<extra></extra>",
            showlegend=False,  # the legend says what the colours mean (the entries below)
        )
    )
    for label in (o for o in OUTCOMES if o in outcomes):  # a legend entry per colour drawn (no data: no bar)
        fig.add_trace(go.Bar(x=[None], y=[None], name=label, marker_color=OUTCOME_COLORS[label]))
    ends = interval_text(low, high)
    if log:
        ends += f" (A / B {ratio_text(math.exp(low))} to {ratio_text(math.exp(high))})"
    fig.add_hrect(
        y0=low,
        y1=high,
        fillcolor="#DD8452",
        opacity=0.2,
        line_width=0,
        annotation_text=f"95% CI {ends}",
        annotation_position="top left",
    )
    mean = f"mean {signed(difference, low, high)}" + (f" (A / B {ratio_text(math.exp(difference))})" if log else "")
    fig.add_hline(
        y=difference,
        line_dash="dash",
        line_color="#DD8452",
        annotation_text=mean,
        annotation_position="bottom right",
    )
    fig.add_hline(y=0, line_color="#444", line_width=1)
    fig.update_yaxes(title_text=f"{name}: A - B")
    # grouped, the empty legend traces would take room beside each bar; hovermode "x": a click anywhere in a task's
    # column picks its bar, even one of height 0 (a task where A and B tie)
    fig.update_layout(barmode="overlay", hovermode="x")
    return layout(fig, f"{name} difference per task (A - B)", 380)

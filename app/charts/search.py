"""The plan search: its objective against plan executions, as the search goes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from app.charts.base import layout

EVENT_STYLE = {  # trace events drawn as markers: what the search did at that point
    "start": dict(symbol="circle", color="#444"),
    "accepted": dict(symbol="triangle-down", color="#2CA02C"),
    "rejected": dict(symbol="x", color="#D62728"),
}


def search_trace_figure(trace: Sequence[Mapping], metric: str) -> go.Figure:
    """The best objective so far (a step line) against executions used; accepted and rejected rounds marked,
    with the move in the hover."""
    fig = go.Figure(
        go.Scatter(
            x=[p["evaluations"] for p in trace],
            y=[p["objective"] for p in trace],
            mode="lines",
            line=dict(shape="hv", color="#1F77B4", width=2),
            name="best so far",
            hovertemplate="%{x} executions<br>" + metric + " %{y:.5g}<extra></extra>",
        )
    )
    for event, style in EVENT_STYLE.items():
        points = [p for p in trace if p["event"] == event]
        if not points:
            continue
        fig.add_trace(
            go.Scatter(
                x=[p["evaluations"] for p in points],
                y=[p["candidate"] if p.get("candidate") is not None else p["objective"] for p in points],
                mode="markers",
                name=event,
                marker=dict(size=9, **style),
                text=[p.get("move") or p.get("plan", "") for p in points],
                hovertemplate="%{x} executions<br>" + metric + " %{y:.5g}<br>%{text}<extra></extra>",
            )
        )
    fig.update_xaxes(title_text="plan executions (one plan on one sequence)", rangemode="tozero")
    fig.update_yaxes(title_text=f"{metric} on the search sequences (lower is better)")
    return layout(fig, f"search trace: {metric} of the best plan so far", 360)

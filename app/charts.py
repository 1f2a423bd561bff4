"""Plotly figures for the app: pure functions of data (no Streamlit), so pytest can check them.

Selectable charts draw cells as square scatter markers, not `go.Heatmap`: Streamlit reports no
selection from heatmaps. Every point of the plan chart carries (layer, phase) in `customdata`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from polykv.methods import REGISTRY
from polykv.methods.base import Method
from polykv.plan import Phase, Plan

# One fixed colour per method, declared by the method itself, so a method looks the same everywhere
# and adding one changes no other method's colour. No chart spells a method's colour.
METHOD_COLORS = {name: cls.colour for name, cls in REGISTRY.items()}
OTHER_METHOD_COLOR = Method.colour  # a name no registered method has (e.g. an old run's removed method)
PHASE_ROWS = [Phase.DECODE.value, Phase.PREFILL.value]  # top to bottom in the strip: prefill, then decode


def method_color(name: str) -> str:
    """The colour of method `name` in every chart (`OTHER_METHOD_COLOR` for a name not registered)."""
    return METHOD_COLORS.get(name, OTHER_METHOD_COLOR)


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, y=0.98, yanchor="top"),
        height=height,
        template="plotly_white",
        margin=dict(l=60, r=20, t=40, b=40),
        legend=dict(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0),
    )
    return fig


def plan_figure(plan: Plan, selected: Iterable[int] = (), phases: Iterable[str] = ("prefill", "decode")) -> go.Figure:
    """Figure 1c: a strip of method cells (one row per phase) over capacity bars, the uniform average
    of each phase as a dashed line. Cells and bars are selectable (click, box, lasso); the cells of the
    `selected` layers in `phases` are outlined."""
    selected, phases = set(selected), set(phases)
    layers = list(range(plan.num_layers))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.4, 0.6], vertical_spacing=0.06)
    size = max(8, min(40, int(900 / max(1, plan.num_layers))))
    used = {layer[phase].method for layer in plan.layers for phase in Phase}
    for method in [*(m for m in REGISTRY if m in used), *sorted(used - set(REGISTRY))]:  # registry order
        xs, ys, data, text = [], [], [], []
        for i, layer in enumerate(plan.layers):
            for phase in Phase:
                a = layer[phase]
                if a.method == method:
                    xs.append(i)
                    ys.append(phase.value)
                    data.append([i, phase.value])
                    text.append(f"layer {i} {phase.value}: {a}")
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="markers",
                name=method,
                customdata=data,
                hovertext=text,
                hoverinfo="text",
                marker=dict(symbol="square", size=size, color=method_color(method), line=dict(width=0.5, color="#222")),
            ),
            row=1,
            col=1,
        )
    outlined = [(i, p) for i in sorted(selected) for p in PHASE_ROWS[::-1] if p in phases and 0 <= i < plan.num_layers]
    if outlined:  # a trace of its own, so the legend's swatches stay plain
        fig.add_trace(
            go.Scatter(
                x=[i for i, _ in outlined],
                y=[p for _, p in outlined],
                customdata=[[i, p] for i, p in outlined],
                mode="markers",
                name="selected",
                showlegend=False,
                hoverinfo="skip",
                marker=dict(symbol="square-open", size=size + 8, color="#111", line=dict(width=3)),
            ),
            row=1,
            col=1,
        )
    for phase, color in ((Phase.PREFILL, "#4C72B0"), (Phase.DECODE, "#DD8452")):
        caps = [layer[phase].capacity for layer in plan.layers]
        if all(c is None for c in caps):
            continue
        fig.add_trace(
            go.Bar(
                x=layers,
                y=[c or 0 for c in caps],
                name=f"{phase.value} capacity",
                marker_color=color,
                customdata=[[i, phase.value] for i in layers],
                hovertext=[
                    f"layer {i} {phase.value}: {'full (no cap)' if c is None else c}" for i, c in enumerate(caps)
                ],
                hoverinfo="text",
                marker_opacity=[
                    1.0 if not selected or (i in selected and phase.value in phases) else 0.45 for i in layers
                ],
            ),
            row=2,
            col=1,
        )
        average = plan.summary().phases[phase].average_capacity
        if average is not None:
            fig.add_trace(
                go.Scatter(
                    x=[-0.5, plan.num_layers - 0.5],
                    y=[average, average],
                    mode="lines",
                    name=f"{phase.value} uniform average {average:g}",
                    line=dict(dash="dash", color=color, width=1.5),
                    hoverinfo="name",
                ),
                row=2,
                col=1,
            )
    fig.update_yaxes(categoryorder="array", categoryarray=PHASE_ROWS, row=1, col=1)
    fig.update_yaxes(title_text="capacity (tokens)", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="layer", range=[-0.6, plan.num_layers - 0.4], row=2, col=1)
    fig.update_layout(barmode="group", clickmode="event+select")
    return _layout(fig, f"{plan.name}: method and capacity per layer", 520)


def selected_cells(points: Sequence[dict]) -> tuple[list[int], list[str]]:
    """Layers and phases named by a Streamlit plotly selection's points (cells or bars of `plan_figure`)."""
    layers, phases = set(), set()
    for point in points:
        data = point.get("customdata")
        if isinstance(data, (list, tuple)) and len(data) == 2:
            layers.add(int(data[0]))
            phases.add(str(data[1]))
        elif point.get("x") is not None:
            layers.add(int(round(float(point["x"]))))
    return sorted(layers), sorted(phases)


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
    return _layout(fig, f"{coverage:.0%} attention support per layer (median, 95% interval)", 380)


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
    return _layout(fig, "support density over the input (one input)", 380)


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
    return _layout(
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
    return _layout(fig, "attention entropy per layer", 320)


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
    return _layout(fig, f"{metric} difference per task (A - B)", 380)


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
    return _layout(fig, f"budget sweep: route vs baselines ({metric})", 400)


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
    return _layout(fig, f"placement control ({metric})", 360)


def download_config(fmt: str, filename: str) -> dict:
    """Plotly's modebar camera button saves the figure in `fmt` ("png" or "svg") under `filename`."""
    return {
        "toImageButtonOptions": {"format": fmt, "filename": filename, "scale": 2 if fmt == "png" else 1},
        "displaylogo": False,
    }

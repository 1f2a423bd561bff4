"""The plan chart (Figure 1c): method cells over capacity bars, selectable. Cells are square scatter
markers, not `go.Heatmap`: Streamlit reports no selection from heatmaps. Every point carries (layer,
phase) in `customdata`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.charts.base import PHASE_ROWS, SELECTION_COLOR, layer_axis, layout, method_color
from polykv.methods import REGISTRY
from polykv.plan import Phase, Plan

PLAN_CHART_HEIGHT = 350  # px


def plan_figure(
    plan: Plan,
    selected: Iterable[int] = (),
    phases: Iterable[str] = ("prefill", "decode"),
    boxes: Sequence[dict] = (),
    windows: Sequence[int | None] = (),
) -> go.Figure:
    """Figure 1c: a strip of method cells (one row per phase) over capacity bars, the uniform average
    of each phase as a dashed line. Cells and bars are selectable (click, box, lasso); the cells of the
    `selected` layers in `phases` are outlined. On a hybrid model (`windows`: each layer's sliding window or
    None), every layer's tick says local (L) or global (G), and a local layer's window caps its bar: it never
    holds more than W - 1 tokens, whatever its capacity."""
    selected, phases = set(selected), set(phases)
    layers = list(range(plan.num_layers))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.4, 0.6], vertical_spacing=0.06)
    # At most 28 px: the strip's two rows are about 40 px apart in the chart's height, so cells never overlap.
    size = max(8, min(28, int(900 / max(1, plan.num_layers))))
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
                marker=dict(symbol="square-open", size=size + 8, color=SELECTION_COLOR, line=dict(width=3)),
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
                    name=f"{phase.value} average {round(average, 1):g}",
                    line=dict(dash="dash", color=color, width=1.5),
                    hoverinfo="name",
                ),
                row=2,
                col=1,
            )
    # both rows' axes: the strip's square markers would otherwise pad its (shared) axis past the layers
    fig.update_xaxes(**layer_axis(plan.num_layers))
    fig.update_xaxes(title_text="layer", row=2, col=1)
    if any(w is not None for w in windows):
        _mark_local_layers(fig, list(windows))
    fig.update_yaxes(categoryorder="array", categoryarray=PHASE_ROWS, row=1, col=1)
    fig.update_yaxes(title_text="capacity (tokens)", rangemode="tozero", row=2, col=1)
    for box in boxes:  # the selection's boxes, drawn again: a shift-drag adds a box to them
        fig.add_selection(
            x0=box["x"][0], x1=box["x"][1], y0=box["y"][0], y1=box["y"][1], xref=box["xref"], yref=box["yref"]
        )
    # Drags select (a box) rather than pan, and the chart keeps its zoom and drag mode across reruns.
    fig.update_layout(barmode="group", clickmode="event+select", dragmode="select", uirevision="plan")
    fig.update_layout(legend=dict(font=dict(size=11), tracegroupgap=0, y=-0.16))  # one row at 800 px
    # Short enough that the paint controls fit under it in a 1280x800 window.
    return layout(fig, f"{plan.name}: method and capacity per layer", PLAN_CHART_HEIGHT)


def memory_figure(
    plan: Plan, kept: Sequence[float], fullkv: Sequence[float], token_bytes: int, windows: Sequence[int | None] = ()
) -> go.Figure:
    """Where the KV memory is: the MiB each layer holds entering the answer under `plan` (bars) and under FullKV
    (open markers), from `polykv.kv_memory.layer_tokens` / `fullkv_tokens` and one token's bytes in one layer."""
    mib = 2**20 / token_bytes
    layers = list(range(plan.num_layers))
    kinds = [("global" if w is None else f"local, window {w}") for w in (list(windows) or [None] * plan.num_layers)]
    fig = go.Figure(
        [
            go.Bar(
                x=layers,
                y=[k / mib for k in kept],
                name=f"{plan.name}: {sum(kept) / mib:,.1f} MiB",
                marker_color="#4C72B0",
                hovertext=[
                    f"layer {i} ({kind}): {k:,.0f} tokens, {k / mib:,.2f} MiB"
                    for i, kind, k in zip(layers, kinds, kept)
                ],
                hoverinfo="text",
            ),
            go.Scatter(
                x=layers,
                y=[f / mib for f in fullkv],
                mode="markers",
                name=f"FullKV: {sum(fullkv) / mib:,.1f} MiB",
                marker=dict(symbol="line-ew-open", size=18, line=dict(width=2, color="#222")),
                hovertext=[f"layer {i} FullKV: {f:,.0f} tokens, {f / mib:,.2f} MiB" for i, f in zip(layers, fullkv)],
                hoverinfo="text",
            ),
        ]
    )
    fig.update_xaxes(title_text="layer", **layer_axis(plan.num_layers))
    if any(w is not None for w in windows):
        ticks = [f"{i} {'G' if w is None else 'L'}" for i, w in zip(layers, windows)]
        fig.update_xaxes(tickmode="array", tickvals=layers, ticktext=ticks)
    fig.update_yaxes(title_text="KV memory (MiB)", rangemode="tozero")
    fig.update_layout(legend=dict(orientation="h", y=-0.3))
    return layout(fig, f"{plan.name}: KV memory per layer entering the answer", 300)


def _mark_local_layers(fig: go.Figure, windows: list[int | None]) -> None:
    """Ticks "3 L" / "5 G" under every layer, and the most a local layer holds (its window less one) as a
    short line over its bars."""
    layers = range(len(windows))
    fig.update_xaxes(
        tickmode="array",
        tickvals=list(layers),
        ticktext=[f"{i} {'G' if w is None else 'L'}" for i, w in zip(layers, windows)],
        row=2,
        col=1,
    )
    xs, ys = [], []
    for i, w in zip(layers, windows):
        if w is not None:
            xs += [i - 0.45, i + 0.45, None]
            ys += [w - 1, w - 1, None]
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            mode="lines",
            name="local layer: its window (L = local, G = global)",
            line=dict(color="#555", width=2, dash="dot"),
            hoverinfo="skip",
        ),
        row=2,
        col=1,
    )


def selection_boxes(layers: Iterable[int], phases: Iterable[str]) -> list[dict]:
    """Boxes (in the strip's axes) around the cells of `layers` in `phases`, one per run of adjacent layers.
    Drawn as the chart's selection, they let a shift-drag add to it; they hug the cells, so that a new
    drag started in the gap between two cells does not grab a box's edge."""
    rows = [PHASE_ROWS.index(p) for p in set(phases) if p in PHASE_ROWS]
    if not rows:
        return []
    boxes, run = [], []
    for layer in sorted(set(layers)):
        if run and layer != run[-1] + 1:
            boxes.append(run)
            run = []
        run.append(layer)
    if run:
        boxes.append(run)
    y = [min(rows) - 0.4, max(rows) + 0.4]
    return [{"xref": "x", "yref": "y", "x": [r[0] - 0.4, r[-1] + 0.4], "y": y} for r in boxes]


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

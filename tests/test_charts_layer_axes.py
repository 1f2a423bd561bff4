"""Every per-layer figure's layer axis spans exactly the layers: half a layer beyond the first and the last, with
integer ticks, so no tick -1 or L shows (left to autorange, plotly padded a 30-layer chart from -1 to 30)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from app import charts
from polykv.plan import Plan
from polykv.routing.confidence import ranked_cells


def shown_ticks(axis) -> list[float]:
    """The ticks plotly draws on `axis` within its (fixed) range: its tick values, or tick0 + k * dtick."""
    low, high = sorted(axis.range)
    if axis.tickmode == "array":
        return [v for v in axis.tickvals if low <= v <= high]
    start, step = axis.tick0, axis.dtick
    return [start + k * step for k in range(math.ceil((low - start) / step), math.floor((high - start) / step) + 1)]


def assert_spans_the_layers(axis, layers: int, reverse: bool = False) -> None:
    assert axis.autorange is False  # plotly's autorange would pad it again
    assert list(axis.range) == ([layers - 0.5, -0.5] if reverse else [-0.5, layers - 0.5])
    ticks = shown_ticks(axis)
    assert ticks and all(float(t).is_integer() and 0 <= t <= layers - 1 for t in ticks), ticks


def profile_cells(layers: int) -> pd.DataFrame:
    rows = [
        {"layer": layer, "scope": "decode", "method": method, "cosine": 0.9 + 0.01 * k, "dppl": 0.1 * k}
        for layer in range(layers)
        for k, method in enumerate(["full", "h2o", "tova"])
    ]
    return pd.DataFrame(rows)


def support_frame(layers: int) -> pd.DataFrame:
    medians = [10.0 + layer for layer in range(layers)]
    return pd.DataFrame(
        {
            "layer": range(layers),
            "median": medians,
            "ci_low": [m - 2 for m in medians],
            "ci_high": [m + 3 for m in medians],
        }
    )


@pytest.mark.parametrize("layers", [1, 5, 30])
@pytest.mark.parametrize("windows", [False, True])  # a hybrid model labels every layer "3 L" / "4 G"
def test_every_per_layer_figure_spans_exactly_its_layers(layers, windows):
    local = [8 if i % 2 else None for i in range(layers)] if windows else []
    plan = Plan.homogeneous("tova", 16, layers)
    plan_fig = charts.plan_figure(plan, selected=[0, layers - 1], windows=local)
    assert_spans_the_layers(plan_fig.layout.xaxis2, layers)  # the bars' axis, labelled
    assert_spans_the_layers(plan_fig.layout.xaxis, layers)  # the strip's (shared) axis: its markers pad it too
    kept = [16.0] * layers
    memory = charts.memory_figure(plan, kept, [100.0] * layers, token_bytes=1024, windows=local)
    assert_spans_the_layers(memory.layout.xaxis, layers)
    table = profile_cells(layers)
    for value in ("cosine", "dppl"):
        assert_spans_the_layers(charts.profile_heatmap(table, "decode", value).layout.yaxis, layers, reverse=True)
    cells = ranked_cells(table, "decode", "cosine")
    for view in charts.PROFILE_VIEWS:  # the winners' stars sit above their cells: they must not pad the axis
        decision = charts.profile_decision_figure(cells, "decode", view, "cosine", windows=local)
        assert_spans_the_layers(decision.layout.yaxis, layers, reverse=True)
    assert_spans_the_layers(charts.entropy_figure([1.0] * layers).layout.xaxis, layers)
    assert_spans_the_layers(charts.support_figure(support_frame(layers), 0.9, local).layout.xaxis, layers)
    assert_spans_the_layers(charts.density_figure(np.ones((layers, 8))).layout.yaxis, layers, reverse=True)


def test_a_30_layer_axis_labels_every_layer_and_a_deep_one_every_few():
    assert_spans_the_layers(charts.entropy_figure([1.0] * 30).layout.xaxis, 30)
    assert shown_ticks(charts.entropy_figure([1.0] * 30).layout.xaxis) == list(range(30))  # 0 to 29: no -1, no 30
    deep = charts.entropy_figure([1.0] * 126).layout.xaxis  # at most MAX_LAYER_TICKS labels
    assert_spans_the_layers(deep, 126)
    assert shown_ticks(deep) == list(range(0, 126, 5))


def test_a_profile_of_some_layers_spans_those_layers():
    table = profile_cells(6)
    table = table[table["layer"] >= 2]  # layers 2 to 5 profiled
    axis = charts.profile_heatmap(table, "decode", "cosine").layout.yaxis
    assert list(axis.range) == [5.5, 1.5] and shown_ticks(axis) == [2, 3, 4, 5]

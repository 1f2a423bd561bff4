"""The app's figures are pure functions of data: check what they draw."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from app import charts
from polykv.plan import Plan

MIXED = Path(__file__).resolve().parents[1] / "plans" / "demo" / "mixed.json"


def test_plan_figure_draws_one_selectable_marker_per_cell_and_the_uniform_averages():
    plan = Plan.load(MIXED)
    fig = charts.plan_figure(plan, selected=[1])
    cells = [t for t in fig.data if t.type == "scatter" and t.mode == "markers"]
    assert all(
        t.marker.symbol in ("square", "square-open") for t in cells
    )  # markers, not go.Heatmap: Streamlit reports selections
    drawn = {(int(x), y): t.name for t in cells if t.name != "selected" for x, y in zip(t.x, t.y)}
    assert drawn == {(i, p): plan.layers[i][p].method for i in range(5) for p in ("prefill", "decode")}
    assert all(list(d) == [x, y] for t in cells for d, x, y in zip(t.customdata, t.x, t.y))
    bars = {t.name: list(t.y) for t in fig.data if t.type == "bar"}
    assert bars["decode capacity"] == [lay.decode.capacity for lay in plan.layers]
    averages = {t.name: t.y[0] for t in fig.data if t.type == "scatter" and t.mode == "lines"}
    assert averages == {"prefill average 36.8": 36.8, "decode average 46.4": 46.4}
    assert {t.line.dash for t in fig.data if t.type == "scatter" and t.mode == "lines"} == {"dash"}
    # an average of 640/3 reads 213.3, not 213.333
    odd = Plan.homogeneous("tova", 213, 3, "decode").with_layers(
        [Plan.homogeneous("tova", c, 1, "decode").layers[0] for c in (213, 213, 214)]
    )
    assert any(t.name == "decode average 213.3" for t in charts.plan_figure(odd).data)
    (outline,) = [t for t in cells if t.name == "selected"]
    assert [list(d) for d in outline.customdata] == [[1, "prefill"], [1, "decode"]]  # the selected layer is outlined
    decode_only = charts.plan_figure(plan, selected=[1, 2], phases=["decode"])
    (outline,) = [t for t in decode_only.data if t.name == "selected"]
    assert [list(d) for d in outline.customdata] == [[1, "decode"], [2, "decode"]]


def test_the_selection_outline_has_a_colour_far_from_every_methods():
    """The outline must stand out on any cell: not black (Scissorhands) nor near any method's colour."""
    outline = charts.plan_figure(Plan.load(MIXED), selected=[0]).data
    (selected,) = [t for t in outline if t.name == "selected"]
    assert selected.marker.color == charts.SELECTION_COLOR

    def rgb(hex_colour: str) -> np.ndarray:
        return np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)], dtype=float)

    nearest = min(np.linalg.norm(rgb(charts.SELECTION_COLOR) - rgb(c)) for c in charts.METHOD_COLORS.values())
    assert nearest > 100, nearest  # of 441 (black to white)


def test_selected_cells_reads_layers_and_phases_from_selection_points():
    points = [
        {"x": 2, "y": "decode", "customdata": [2, "decode"]},
        {"x": 3, "y": "decode", "customdata": [3, "decode"]},
        {"x": 4.0, "y": 30},
    ]  # a bar without customdata still names its layer
    assert charts.selected_cells(points) == ([2, 3, 4], ["decode"])
    assert charts.selected_cells([]) == ([], [])


def test_a_full_phase_has_no_capacity_bars():
    fig = charts.plan_figure(Plan.homogeneous("tova", 16, 3, "decode"))
    assert [t.name for t in fig.data if t.type == "bar"] == ["decode capacity"]


def test_on_a_hybrid_model_every_layer_is_marked_local_or_global_and_a_local_bar_shows_its_window():
    fig = charts.plan_figure(Plan.homogeneous("tova", 16, 3), windows=[8, 8, None])
    assert list(fig.layout.xaxis2.ticktext) == ["0 L", "1 L", "2 G"]
    window = next(t for t in fig.data if t.name.startswith("local layer"))
    assert list(window.y) == [7, 7, None, 7, 7, None]  # over layers 0 and 1: at most the window less one
    plain = charts.plan_figure(Plan.homogeneous("tova", 16, 3), windows=[None, None, None])
    assert plain.layout.xaxis2.ticktext is None and not [t for t in plain.data if t.name.startswith("local")]


def test_the_memory_figure_draws_each_layers_kv_against_fullkv_in_mib():
    from polykv.kv_memory import fullkv_tokens, layer_tokens

    plan, windows = Plan.homogeneous("tova", 16, 3, "prefill"), [8, 8, None]
    kept = [entering for entering, _ in layer_tokens(plan, 100, windows=windows)]
    full = fullkv_tokens(100, windows)
    assert kept == [7, 7, 16] and full == [7, 7, 100]  # a local layer holds its window less one, whatever the plan
    fig = charts.memory_figure(plan, kept, full, token_bytes=2**19, windows=windows)  # half a MiB a token
    bars, fullkv = fig.data
    assert list(bars.y) == [3.5, 3.5, 8.0] and list(fullkv.y) == [3.5, 3.5, 50.0]
    assert bars.name.endswith("15.0 MiB") and fullkv.name == "FullKV: 57.0 MiB"
    assert list(fig.layout.xaxis.ticktext) == ["0 L", "1 L", "2 G"]


def test_the_profile_chart_marks_each_layer_local_or_global_on_a_hybrid_model():
    from polykv.routing.confidence import ranked_cells

    rows = [
        {"layer": layer, "scope": "prefill", "method": method, "cosine": 0.9 + 0.01 * k, "dppl": 0.1 * k}
        for layer in range(3)
        for k, method in enumerate(["full", "h2o", "tova"])
    ]
    cells = ranked_cells(pd.DataFrame(rows), "prefill", "cosine")
    fig = charts.profile_decision_figure(cells, "prefill", "rank", "cosine", windows=[8, 8, None])
    assert list(fig.layout.yaxis.ticktext) == ["0 L", "1 L", "2 G"]
    assert charts.profile_decision_figure(cells, "prefill", "rank", "cosine").layout.yaxis.ticktext is None


def test_support_figure_is_log_scale_with_asymmetric_intervals():
    frame = pd.DataFrame({"layer": [0, 1], "median": [10.0, 40.0], "ci_low": [8.0, 20.0], "ci_high": [15.0, 41.0]})
    fig = charts.support_figure(frame, 0.9)
    assert fig.layout.yaxis.type == "log" and list(fig.layout.yaxis.tickvals) == [10, 20, 30, 40]  # from the data
    assert list(fig.data[0].error_y.array) == [5.0, 1.0] and list(fig.data[0].error_y.arrayminus) == [2.0, 20.0]


def test_profile_heatmap_is_layers_by_methods_with_hover_numbers():
    table = pd.DataFrame(
        {
            "layer": [0, 0, 0, 1, 1, 1],
            "scope": ["decode"] * 6,
            "method": ["full", "h2o", "tova"] * 2,
            "cosine": [1.0, 0.9, 0.8, 1.0, 0.7, 0.6],
            "dppl": [0.0, 0.1, 0.2, 0.0, 0.3, -0.4],
        }
    )
    fig = charts.profile_heatmap(table, "decode", "cosine")  # FullKV, the reference, is not drawn
    assert list(fig.data[0].x) == ["h2o", "tova"] and list(fig.data[0].y) == [0, 1]
    assert np.array(fig.data[0].z).tolist() == [[0.9, 0.8], [0.7, 0.6]]
    assert "cosine" in fig.data[0].hovertemplate
    dppl = charts.profile_heatmap(table, "decode", "dppl")
    assert dppl.data[0].zmid == 0.0 and np.array(dppl.data[0].z).tolist() == [[0.1, 0.2], [0.3, -0.4]]


def test_comparison_figures_mark_intervals_envelopes_and_the_guided_route():
    table = pd.DataFrame({"task": ["a", "b"], "A - B": [0.1, -0.05]})
    fig = charts.difference_figure(table, 0.025, -0.05, 0.1, "kl")
    assert list(fig.data[0].y) == [0.1, -0.05]
    assert any(s.type == "rect" and s.y0 == -0.05 and s.y1 == 0.1 for s in fig.layout.shapes)
    sweep = pd.DataFrame(
        {
            "budget": [16, 32],
            "route": [0.3, 0.2],
            "tova": [0.4, 0.15],
            "best baseline": ["tova", "tova"],
            "envelope": [0.4, 0.15],
        }
    )
    names = [t.name for t in charts.sweep_figure(sweep, "kl").data]
    assert names == ["tova", "best baseline (envelope)", "route"]
    placement = charts.placement_figure(0.1, [0.2, 0.3], "kl", 1, 1 / 3)
    assert any(s.type == "line" and s.x0 == 0.1 for s in placement.layout.shapes)


def test_download_config_picks_the_format():
    assert charts.download_config("svg", "plan")["toImageButtonOptions"]["format"] == "svg"

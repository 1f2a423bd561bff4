"""Plotly figures for the app: pure functions of data (no Streamlit), so pytest can check them. One module
per page's charts; every figure is importable from here (`charts.plan_figure`)."""

from app.charts.base import (
    METHOD_COLORS,
    OTHER_METHOD_COLOR,
    PHASE_ROWS,
    SELECTION_COLOR,
    download_config,
    layout,
    method_color,
)
from app.charts.compare import OUTCOME_COLORS, OUTCOME_DELTA_COLORS, difference_figure
from app.charts.experiments import (
    factorial_contrasts,
    factorial_table,
    placement_figure,
    placement_scatter,
    selected_placement,
    sweep_figure,
    sweep_frames,
)
from app.charts.heterogeneity import density_figure, log_axis, support_figure
from app.charts.plan import memory_figure, plan_figure, selected_cells, selection_boxes
from app.charts.profiles import PROFILE_VIEWS, entropy_figure, profile_decision_figure, profile_heatmap
from app.charts.search import search_trace_figure

__all__ = [
    "METHOD_COLORS",
    "OTHER_METHOD_COLOR",
    "OUTCOME_COLORS",
    "OUTCOME_DELTA_COLORS",
    "PHASE_ROWS",
    "PROFILE_VIEWS",
    "SELECTION_COLOR",
    "density_figure",
    "difference_figure",
    "download_config",
    "entropy_figure",
    "factorial_contrasts",
    "factorial_table",
    "layout",
    "log_axis",
    "method_color",
    "placement_figure",
    "placement_scatter",
    "memory_figure",
    "plan_figure",
    "profile_decision_figure",
    "profile_heatmap",
    "selected_cells",
    "selection_boxes",
    "selected_placement",
    "support_figure",
    "search_trace_figure",
    "sweep_figure",
    "sweep_frames",
]

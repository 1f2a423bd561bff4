"""Plotly figures for the app: pure functions of data (no Streamlit), so pytest can check them. One module
per page's charts; every figure is importable from here (`charts.plan_figure`)."""

from app.charts.base import METHOD_COLORS, OTHER_METHOD_COLOR, PHASE_ROWS, download_config, layout, method_color
from app.charts.compare import difference_figure
from app.charts.experiments import placement_figure, sweep_figure
from app.charts.heterogeneity import density_figure, support_figure
from app.charts.plan import plan_figure, selected_cells
from app.charts.profiles import entropy_figure, profile_heatmap

__all__ = [
    "METHOD_COLORS",
    "OTHER_METHOD_COLOR",
    "PHASE_ROWS",
    "density_figure",
    "difference_figure",
    "download_config",
    "entropy_figure",
    "layout",
    "method_color",
    "placement_figure",
    "plan_figure",
    "profile_heatmap",
    "selected_cells",
    "support_figure",
    "sweep_figure",
]

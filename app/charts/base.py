"""What every chart shares: one colour per method, the common layout, the download button."""

from __future__ import annotations

from collections.abc import Iterable

import plotly.graph_objects as go

from polykv.methods import REGISTRY
from polykv.methods.base import Method
from polykv.plan import Phase

# One fixed colour per method, declared by the method itself, so a method looks the same everywhere
# and adding one changes no other method's colour. No chart spells a method's colour.
METHOD_COLORS = {name: cls.colour for name, cls in REGISTRY.items()}
OTHER_METHOD_COLOR = Method.colour  # a name no registered method has (e.g. an old run's removed method)
# The selection outline on the plan chart: a violet that no method's colour is near (Scissorhands is black).
SELECTION_COLOR = "#7B1FA2"
PHASE_ROWS = [Phase.DECODE.value, Phase.PREFILL.value]  # top to bottom in the strip: prefill, then decode


def method_color(name: str) -> str:
    """The colour of method `name` in every chart (`OTHER_METHOD_COLOR` for a name not registered)."""
    return METHOD_COLORS.get(name, OTHER_METHOD_COLOR)


# Most layer ticks a per-layer axis labels; more layers, and it labels every 2nd, 5th, 10th... layer.
MAX_LAYER_TICKS = 40


def layer_axis(layers: int | Iterable[int], reverse: bool = False) -> dict:
    """The layer axis of a per-layer chart (pass to `update_xaxes` / `update_yaxes`): it spans exactly the
    layers (`layers`: their count, or the layers drawn), half a layer beyond the first and the last, with
    integer ticks. Left to autorange, plotly pads an axis for its markers, and a 30-layer chart ran from -1 to
    30. `reverse`: layer 0 at the top (a heatmap's rows)."""
    drawn = list(range(layers)) if isinstance(layers, int) else [int(v) for v in layers]
    first, last = (min(drawn), max(drawn)) if drawn else (0, 0)
    span = [first - 0.5, last + 0.5]
    step = next(s for s in (m * 10**k for k in range(6) for m in (1, 2, 5)) if (last - first) // s < MAX_LAYER_TICKS)
    return dict(range=span[::-1] if reverse else span, autorange=False, tickmode="linear", tick0=0, dtick=step)


def layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, y=0.98, yanchor="top"),
        height=height,
        template="plotly_white",
        margin=dict(l=60, r=20, t=40, b=40),
        legend=dict(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0),
    )
    return fig


def download_config(fmt: str, filename: str) -> dict:
    """Plotly's modebar camera button saves the figure in `fmt` ("png" or "svg") under `filename`."""
    return {
        "toImageButtonOptions": {"format": fmt, "filename": filename, "scale": 2 if fmt == "png" else 1},
        "displaylogo": False,
    }

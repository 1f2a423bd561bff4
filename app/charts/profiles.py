"""Method profiles: per-layer, per-method preservation against FullKV (which method wins each layer, by
how much), and attention entropy."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from app.charts.base import layer_axis, layout
from polykv.eval.statistics.render import interval


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
    fig.update_yaxes(title_text="layer", **layer_axis(grid.index, reverse=True))
    return layout(
        fig, f"{scope}: {value} per layer and method ({better} is better)", max(320, min(900, 140 + 36 * len(grid)))
    )


PROFILE_VIEWS = ("rank", "1 - cosine (log)", "dPPL")
# 1 - cosine below this is drawn at it: a float32 cosine cannot resolve smaller gaps, and log(0) is -inf.
COSINE_GAP_FLOOR = 1e-9
# The winner's star sits this far (in layers) above its cell's centre, so the cell's number stays readable.
STAR_OFFSET = 0.3


def _interval(low: float, high: float, digits: str) -> str:
    return f"95% {interval(low, high, digits)}"  # "95% not estimable" without the profile's intervals


def cell_hover(cell: Mapping, statistic: str) -> str:
    """One cell's hover: cosine and dPPL, each with its bootstrap interval, and the cell's rank."""
    rank = cell["rank"]
    return (
        f"layer {int(cell['layer'])}, {cell['method']}<br>"
        f"cosine {cell['cosine']:.6f} {_interval(cell['cosine_low'], cell['cosine_high'], '.6f')}"
        f" (1 - cosine {1 - cell['cosine']:.2e})<br>"
        f"dPPL {cell['dppl']:+.3f} {_interval(cell['dppl_low'], cell['dppl_high'], '+.3f')}<br>"
        + (f"rank {int(rank)} by {statistic}" if not math.isnan(rank) else f"not ranked by {statistic}")
        + (" · TopRank winner" if cell["winner"] else "")
    )


def _grid(cells: pd.DataFrame, column: str) -> pd.DataFrame:
    """layers x methods of `column`, methods in the order of `cells` (registry order)."""
    methods = list(dict.fromkeys(cells["method"]))
    return cells.pivot(index="layer", columns="method", values=column).reindex(columns=methods).sort_index()


def profile_decision_figure(
    cells: pd.DataFrame,
    scope: str,
    view: str,
    statistic: str,
    confidence: pd.DataFrame | None = None,
    windows: Sequence[int | None] = (),
) -> go.Figure:
    """Layer x method grid of one scope that shows which method is best in each layer and by how much.

    `cells`: `polykv.routing.confidence.ranked_cells` of the scope for `statistic`. `view` (PROFILE_VIEWS):
    "rank" (1 = best in the layer), "1 - cosine (log)" (the small gaps a cosine of 0.999 hides, as a
    log10 colour scale) or "dPPL" (diverging around 0). Every view colours the better cells alike.
    A star in an outlined cell marks each layer's TopRank winner (the star's `customdata` is its layer):
    from `confidence` (`route_confidence`, whose hover adds the runner-up, margin and win frequency) when
    given, else from `cells`. Each cell's hover gives cosine and dPPL with their intervals, and its rank. On a
    hybrid model (`windows`: each layer's sliding window or None) every layer's tick says local (L) or global (G)."""
    if view not in PROFILE_VIEWS:
        raise ValueError(f"unknown view {view!r} (known: {', '.join(PROFILE_VIEWS)})")
    ranks = _grid(cells, "rank")
    methods, layers = list(ranks.columns), list(ranks.index)
    hover = cells.assign(hover=[cell_hover(c, statistic) for c in cells.to_dict("records")])
    if view == "rank":
        z = ranks.to_numpy(dtype=float)
        text = np.vectorize(lambda v: "" if math.isnan(v) else str(int(v)))(z)
        colors = dict(colorscale="Viridis_r", colorbar=dict(title=f"rank by {statistic}"))
    elif view == "dPPL":
        z = _grid(cells, "dppl").to_numpy(dtype=float)
        text = np.vectorize(lambda v: f"{v:.3g}")(z)
        colors = dict(colorscale="RdBu_r", zmid=0.0, colorbar=dict(title="dPPL"))
    else:
        gap = 1 - _grid(cells, "cosine").to_numpy(dtype=float)
        z = np.log10(np.clip(gap, COSINE_GAP_FLOOR, None))
        text = np.vectorize(lambda v: f"{v:.1e}")(gap)
        finite = z[np.isfinite(z)]
        ticks = list(range(math.floor(finite.min()), math.ceil(finite.max()) + 1)) if finite.size else []
        colors = dict(
            colorscale="Viridis_r",
            colorbar=dict(title="1 - cosine", tickvals=ticks, ticktext=[f"1e{t}" for t in ticks]),
        )
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=methods,
            y=layers,
            **colors,
            text=text,
            texttemplate="%{text}" if z.size <= 200 else None,
            textfont=dict(size=11),
            customdata=_grid(hover, "hover").to_numpy(dtype=object),
            hovertemplate="%{customdata}<extra></extra>",
            name=view,
        )
    )
    if confidence is not None:
        wins = confidence
        marks = [
            f"layer {row.layer}: TopRank winner {row.winner}<br>runner-up {row.runner_up or 'none'}, "
            f"margin {row.margin:.3g} {statistic}<br>win frequency {row.win_frequency:.0%} of bootstrap replicates"
            for row in wins.itertuples()
        ]
    else:
        wins = cells.loc[cells["winner"], ["layer", "method"]].rename(columns={"method": "winner"})
        marks = [f"layer {row.layer}: TopRank winner {row.winner}" for row in wins.itertuples()]
    fig.add_trace(
        go.Scatter(
            x=list(wins["winner"]),
            y=[int(v) - STAR_OFFSET for v in wins["layer"]],  # the y axis runs downwards: minus is up
            mode="markers",
            marker=dict(symbol="star", size=11, color="white", line=dict(color="black", width=1.2)),
            name=f"TopRank winner (by {statistic})",
            customdata=[int(v) for v in wins["layer"]],
            hovertext=marks,
            hovertemplate="%{hovertext}<extra></extra>",
            showlegend=True,
        )
    )
    for layer, winner in zip(wins["layer"], wins["winner"]):  # and an outline around the winner's cell
        column = methods.index(winner)  # shapes on a category axis are placed by the category's index
        fig.add_shape(
            type="rect",
            x0=column - 0.5,
            x1=column + 0.5,
            y0=int(layer) - 0.5,
            y1=int(layer) + 0.5,
            line=dict(color="black", width=2),
        )
    fig.update_xaxes(categoryorder="array", categoryarray=methods)
    # the exact layers: the stars' markers (drawn above their cells' centres) would pad the axis past layer 0
    fig.update_yaxes(title_text="layer", **layer_axis(layers, reverse=True))
    if any(w is not None for w in windows):
        ticks = [f"{int(i)} {'G' if windows[int(i)] is None else 'L'}" for i in layers]
        fig.update_yaxes(tickmode="array", tickvals=layers, ticktext=ticks)
    better = "1 is best" if view == "rank" else "lower is better"
    return layout(
        fig,
        f"{scope}: {view} per layer and method ({better}); ★ TopRank winner by {statistic}",
        max(360, min(900, 160 + 36 * len(layers))),
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
    fig.update_xaxes(title_text="layer", **layer_axis(len(entropy)))
    fig.update_yaxes(title_text="attention entropy (nats)")
    return layout(fig, "attention entropy per layer", 320)

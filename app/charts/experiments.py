"""Controlled experiments: the budget sweep (Figure 3), the placement control (Figure 4) and the factorial
table (Table 2). Pure functions of data: a report's typed `data` (`polykv.eval.experiments.report`) or the
tables the pages build with the library."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.charts.base import layout, method_color
from polykv.eval.experiments.report import GUIDED_INDEX, FactorialData, PlacedRun, SweepData

ROUTE_COLORS = {"route": "#D62728", "route-uniform": "#D62728", "route-ppl": "#6A3D9A"}
GUIDED_COLOR = "#D62728"
NOT_BASELINES = ("budget", "best baseline", "envelope", "best alone in scope", "alone in scope")


def _is_route(column: str) -> bool:
    return column in ROUTE_COLORS


def sweep_figure(
    frame: pd.DataFrame, metric: str, full: float | None = None, versus: pd.DataFrame | None = None
) -> go.Figure:
    """Suite score against budget: each baseline, the best-baseline envelope and the route(s); the budget
    axis is logarithmic when the budgets span more than a factor 2. `full`: the FullKV score, drawn as a
    horizontal line. `versus` (columns series, against, budget, difference, low, high): route minus the best
    alone in its scope (like with like) and minus the envelope per budget with its paired CI, in a second panel.
    The best method alone in the route's scope ("alone in scope"), when the sweep ran it, is drawn too."""
    columns = [c for c in frame.columns if c not in NOT_BASELINES and " - " not in c]
    baselines = [c for c in columns if not _is_route(c)]
    routes = [c for c in columns if _is_route(c)]
    panels = versus is not None and len(versus) > 0
    fig = (
        make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.65, 0.35], vertical_spacing=0.08)
        if panels
        else go.Figure()
    )
    top = dict(row=1, col=1) if panels else {}
    budgets = [int(b) for b in frame["budget"]]
    for name in baselines:
        fig.add_trace(
            go.Scatter(
                x=budgets,
                y=frame[name],
                mode="lines+markers",
                name=name,
                line=dict(color=method_color(name), width=1.5),
            ),
            **top,
        )
    fig.add_trace(
        go.Scatter(
            x=budgets,
            y=frame["envelope"],
            mode="lines+markers",
            name="best baseline (envelope)",
            marker=dict(symbol="circle-open", size=12),
            line=dict(color="#444", dash="dash", width=2),
            text=frame["best baseline"],
            hovertemplate="budget %{x}<br>%{text}: %{y:.4f}<extra></extra>",
        ),
        **top,
    )
    if "alone in scope" in frame:  # like with like: the best method alone in the route's own scope
        fig.add_trace(
            go.Scatter(
                x=budgets,
                y=frame["alone in scope"],
                mode="lines+markers",
                name="best alone in the route's scope",
                marker=dict(symbol="diamond-open", size=11),
                line=dict(color="#111", width=2),
                text=frame["best alone in scope"],
                hovertemplate="budget %{x}<br>%{text}: %{y:.4f}<extra></extra>",
            ),
            **top,
        )
    for name in routes:
        fig.add_trace(
            go.Scatter(
                x=budgets, y=frame[name], mode="lines+markers", name=name, line=dict(color=ROUTE_COLORS[name], width=3)
            ),
            **top,
        )
    if full is not None and budgets:
        fig.add_trace(
            go.Scatter(
                x=[min(budgets), max(budgets)],
                y=[full, full],
                mode="lines",
                name="FullKV",
                line=dict(color="#1F1F7A", dash="dot", width=2),
                hovertemplate=f"FullKV (every token kept): {full:.4f}<extra></extra>",
            ),
            **top,
        )
    if panels:
        for (name, against), rows in versus.groupby(["series", "against"], sort=False):
            rows = rows.sort_values("budget")
            alone = against == "alone in scope"
            fig.add_trace(
                go.Scatter(
                    x=[int(b) for b in rows["budget"]],
                    y=rows["difference"],
                    mode="lines+markers",
                    name=f"{name} - {'best alone in its scope' if alone else 'envelope (across protocols)'} (95% CI)",
                    line=dict(color=ROUTE_COLORS.get(name, "#D62728"), width=2, dash="solid" if alone else "dot"),
                    error_y=dict(
                        type="data",
                        array=list(rows["high"] - rows["difference"]),
                        arrayminus=list(rows["difference"] - rows["low"]),
                    ),
                ),
                row=2,
                col=1,
            )
        fig.add_hline(y=0, line_color="#888", line_width=1, row=2, col=1)
        fig.update_yaxes(title_text=f"route - best ({metric})", row=2, col=1)
        fig.update_yaxes(title_text=metric, row=1, col=1)
    else:
        fig.update_yaxes(title_text=metric)
    log = bool(budgets) and max(budgets) > 2 * min(budgets)
    fig.update_xaxes(type="log" if log else "linear")
    fig.update_xaxes(title_text="budget (average capacity per layer, tokens)", row=2 if panels else None)
    return layout(fig, f"budget sweep: route vs baselines ({metric})", 560 if panels else 400)


def sweep_frames(data: SweepData) -> tuple[pd.DataFrame, pd.DataFrame, float | None]:
    """(scores per budget, route minus envelope per budget with its CI, the FullKV score) from a sweep
    report's data: the three inputs of `sweep_figure`."""
    scores, envelope = data.scores, data.envelope
    frame = pd.DataFrame(
        [
            {
                "budget": b,
                **{label: scores[label][b] for label in data.baselines},
                "best baseline": envelope[b].baseline,
                "envelope": envelope[b].score,
                **(
                    {
                        "best alone in scope": data.matched_envelope[b].baseline,
                        "alone in scope": data.matched_envelope[b].score,
                    }
                    if data.matched
                    else {}
                ),
                **{label: scores[label][b] for label in data.routes},
            }
            for b in data.budgets
        ]
    )
    contrasts = [
        ("route-uniform", "alone in scope", data.versus_matched),
        ("route-uniform", "envelope", data.versus_envelope),
        ("route-ppl", "envelope", data.ppl_versus_envelope),
    ]
    versus = pd.DataFrame(
        [
            {"series": label, "against": against, "budget": b, "difference": c.difference, "low": c.low, "high": c.high}
            for label, against, per_budget in contrasts
            for b, c in per_budget.items()
        ],
        columns=["series", "against", "budget", "difference", "low", "high"],
    ).astype({"difference": float, "low": float, "high": float})  # an undefined one (None) is NaN: not drawn
    return frame, versus, data.full.score


def placement_figure(
    guided: float | None, controls: Sequence[float | None], metric: str, rank: int, p_value: float
) -> go.Figure:
    """Histogram of the random placements' scores with the guided route marked (unless its score is undefined)."""
    fig = go.Figure(
        go.Histogram(
            x=list(controls),
            name="random placements",
            marker_color="#8c8c8c",
            nbinsx=max(5, min(30, int(math.sqrt(len(controls))) * 2)),
        )
    )
    if guided is not None:
        fig.add_vline(
            x=guided,
            line_color=GUIDED_COLOR,
            line_width=3,
            annotation_text=f"guided route: rank {rank} of {len(controls) + 1}, p = {p_value:.3f}",
        )
    fig.update_xaxes(title_text=metric)
    fig.update_yaxes(title_text="placements")
    return layout(fig, f"placement control ({metric})", 360)


def placement_scatter(
    guided: PlacedRun, random: Sequence[PlacedRun], metric: str, spearman: float | None, p: float | None
) -> go.Figure:
    """Profile score S(rho) (x) against suite score (y) of the random placements, the guided route marked,
    Spearman's rho over the random ones and its one-sided permutation p in the title (Figure 4). Each point
    carries its placement index in `customdata` (`GUIDED_INDEX` for the guided route): see `selected_placement`."""
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[r.profile_score for r in random],
            y=[r.score for r in random],
            mode="markers",
            name="random placements",
            marker=dict(color="#8c8c8c", size=9),
            customdata=[[r.index] for r in random],
            text=[r.plan for r in random],
            hovertemplate="%{text}<br>S(rho) %{x:.4f}<br>" + metric + " %{y:.4f}<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[guided.profile_score],
            y=[guided.score],
            mode="markers",
            name="guided route",
            marker=dict(color=GUIDED_COLOR, size=16, symbol="star"),
            customdata=[[guided.index]],
            text=[guided.plan],
            hovertemplate="%{text} (guided)<br>S(rho) %{x:.4f}<br>" + metric + " %{y:.4f}<extra></extra>",
        )
    )
    if spearman is None or p is None:
        stats = "Spearman not estimable (needs 2 or more placements with varying scores)"
    else:
        stats = f"Spearman rho = {spearman:+.3f}, one-sided permutation p = {p:.4f}"
    fig.update_xaxes(title_text="profile score S(rho)")
    fig.update_yaxes(title_text=metric)
    return layout(fig, f"profile score vs {metric} over {len(random)} random placements: {stats}", 420)


def selected_placement(
    points: Sequence[Mapping[str, Any]], guided: PlacedRun, random: Sequence[PlacedRun]
) -> PlacedRun | None:
    """The placement (`guided`, or the entry of `random` with that index) of the first selected point of a
    `placement_scatter`; None when nothing (known) is selected."""
    for point in points:
        data = point.get("customdata")
        if isinstance(data, (list, tuple)) and data:
            data = data[0]
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            if int(data) == GUIDED_INDEX:
                return guided
            return next((r for r in random if r.index == int(data)), None)
    return None


def factorial_table(data: FactorialData) -> pd.DataFrame:
    """The factorial's 2x2 table from its report data: routing (rows) x allocation (columns), the score in
    each cell."""
    cells = data.cells
    return pd.DataFrame(
        {
            "routing": ["homogeneous", "routed"],
            "uniform": [cells["homogeneous-uniform"].score, cells["routed-uniform"].score],
            data.allocation: [cells["homogeneous-allocated"].score, cells["routed-allocated"].score],
        }
    )


FACTORIAL_CONTRASTS = {
    "routing_uniform": "primary: routing under uniform allocation (routed-uniform - homogeneous-uniform)",
    "allocation_homogeneous": "allocation effect under homogeneous routing",
    "allocation_routed": "allocation effect under TopRank routing",
    "interaction": "interaction ((r_a - r_u) - (h_a - h_u))",
}


def factorial_contrasts(data: FactorialData) -> pd.DataFrame:
    """One row per contrast of a factorial report (primary first): difference, 95% CI, wins/ties/losses, and
    the sample-level test's p, the difference it could detect at 80% power and the verdict it gives (empty
    for reports made before samples were paired)."""
    rows = []
    for key, label in FACTORIAL_CONTRASTS.items():
        contrast = getattr(data, key)
        sample = contrast.sample
        rows.append(
            {
                "contrast": label,
                "difference": contrast.difference,
                "95% CI low": contrast.low,
                "95% CI high": contrast.high,
                "wins / ties / losses": f"{contrast.wins} / {contrast.ties} / {contrast.losses}",
                "tasks": contrast.tasks,
                "sign-flip p (samples)": None if sample is None else sample.p,
                "detectable (80% power)": contrast.task_mde if sample is None else sample.mde,
                "verdict": contrast.verdict,
            }
        )
    return pd.DataFrame(rows)

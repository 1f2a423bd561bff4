"""The study report's figures (matplotlib, no display): the profile, the placement control, each sweep and,
on RULER, the needles found per method and budget. `polykv.eval.study.report` writes them beside the report."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from polykv.eval.experiments.report import SweepData
from polykv.eval.statistics.render import number


def niah_curves(result) -> pd.DataFrame | None:
    """RULER: each series' mean over the niah tasks (in the study's metric) at each budget (and FullKV's), from
    the sweep's runs."""
    data = result.sweep.data
    scores = result.task_scores

    def niah(run: str) -> float | None:
        values = [v for task, v in scores.get(run, {}).items() if task.split("@")[0].startswith("niah")]
        return sum(values) / len(values) if values else None

    if niah(data.full.run) is None:
        return None
    rows = [
        {"series": name, **{str(b): niah(data.runs[name][b]) for b in data.budgets}}
        for name in data.routes + data.baselines
    ]
    rows.append({"series": "FullKV", **{str(b): niah(data.full.run) for b in data.budgets}})
    return pd.DataFrame(rows)


def figures(result, folder: Path) -> dict[str, str]:
    """The report's PNG figures (matplotlib, no display); returns name -> file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, str] = {}
    settings = result.settings
    layers = result.profile.num_layers
    tall = max(3.2, 0.16 * layers + 1.2)  # readable row labels for 30 layers

    table = result.profile.table
    scopes = [s for s in ("prefill", "decode") if s in set(table["scope"])]
    fig, axes = plt.subplots(1, len(scopes), figsize=(5.2 * len(scopes), tall), squeeze=False)
    statistic = settings.statistic
    for ax, scope in zip(axes[0], scopes):
        rows = table[(table["scope"] == scope) & (table["method"] != "full")]
        grid = rows.pivot_table(index="layer", columns="method", values=statistic)
        image = ax.imshow(grid.values, aspect="auto", cmap="RdBu_r" if statistic == "dppl" else "viridis")
        if statistic == "dppl":
            bound = max(abs(float(grid.values.min())), abs(float(grid.values.max()))) or 1.0
            image.set_clim(-bound, bound)
        ax.set_xticks(range(len(grid.columns)), grid.columns, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(grid.index)), [f"L{i}" for i in grid.index], fontsize=7 if layers > 12 else 8)
        best = (grid * (-1 if statistic == "dppl" else 1)).values.argmax(axis=1)
        for layer, column in enumerate(best):
            ax.add_patch(plt.Rectangle((column - 0.5, layer - 0.5), 1, 1, fill=False, lw=2, ec="black"))
        ax.set_title(f"{scope}: {statistic} (TopRank pick outlined)", fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.04)
    fig.tight_layout()
    out["profile"] = "profile.png"
    fig.savefig(folder / out["profile"], dpi=130)
    plt.close(fig)

    data = result.placement.data
    metric, randoms, guided = data.metric, data.random, data.guided
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    left.hist([r.score for r in randoms if r.score is not None], bins=20, color="#9aa7b8")
    if guided.score is not None:
        left.axvline(guided.score, color="#c0392b", lw=2, label=f"guided (rank {data.guided_rank})")
    left.set_xlabel(f"suite {metric}")
    left.set_ylabel("random placements")
    left.legend(fontsize=8)
    right.scatter(
        [_or_nan(r.profile_score) for r in randoms],
        [_or_nan(r.score) for r in randoms],
        s=14,
        color="#5b6b80",
        label="random",
    )
    right.scatter(
        [_or_nan(guided.profile_score)], [_or_nan(guided.score)], s=50, color="#c0392b", marker="*", label="guided"
    )
    right.set_xlabel(f"profile score S(rho) by {data.statistic}")
    right.set_ylabel(f"suite {metric}")
    right.set_title(
        f"Spearman over the random placements {data.spearman:+.3f}, one-sided p {number(data.spearman_p)}"
        if data.spearman is not None
        else "Spearman not estimable",
        fontsize=9,
    )
    right.legend(fontsize=8)
    fig.tight_layout()
    out["placement"] = "placement.png"
    fig.savefig(folder / out["placement"], dpi=130)
    plt.close(fig)

    for phase, report in result.sweeps.items():
        out[f"sweep {phase}"] = _sweep_figure(plt, report.data, folder, f"sweep-{phase}.png")
    curves = niah_curves(result)
    if curves is not None:
        budgets = result.sweep.data.budgets
        fig, ax = plt.subplots(figsize=(8, 4.2))
        for row in curves.to_dict("records"):
            style = {"lw": 2.5, "marker": "o"} if row["series"].startswith("route") else {"lw": 1, "marker": "."}
            if row["series"] == "FullKV":
                style = {"lw": 1.2, "ls": ":", "color": "#27ae60"}
            ax.plot(budgets, [row[str(b)] for b in budgets], label=row["series"], **style)
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlabel("average capacity per layer (tokens)")
        ax.set_ylabel(f"mean {result.sweep.data.metric} over the niah tasks")
        ax.set_title(f"needles found per method ({result.sweep.data.route})", fontsize=9)
        ax.legend(fontsize=7, ncol=3)
        fig.tight_layout()
        out["niah"] = "niah.png"
        fig.savefig(folder / out["niah"], dpi=130)
        plt.close(fig)
    return out


def _or_nan(value: float | None) -> float:
    """A number for matplotlib: an undefined one (None) is NaN, which it leaves out."""
    return float("nan") if value is None else value


def _sweep_figure(plt, data: SweepData, folder: Path, name: str) -> str:
    """Every series against the budget (log axis), the envelope and FullKV; route - envelope with CIs."""
    budgets, metric = data.budgets, data.metric
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [2, 1]})

    def series_of(label: str) -> list[float]:
        return [_or_nan(data.scores[label][b]) for b in budgets]

    for series in data.baselines:
        top.plot(budgets, series_of(series), lw=0.9, alpha=0.6, marker=".", label=series)
    envelope = [_or_nan(data.envelope[b].score) for b in budgets]
    top.plot(budgets, envelope, "k--", lw=1.5, label="best baseline (envelope)")
    for series, style in zip(data.routes, ("#c0392b", "#e67e22")):
        top.plot(budgets, series_of(series), color=style, lw=2.5, marker="o", label=series)
    if data.full.score is not None:
        top.axhline(data.full.score, color="#27ae60", lw=1, ls=":", label="FullKV")
    top.set_xscale("log", base=2)
    top.set_ylabel(f"suite {metric}")
    top.set_title(f"{data.route} ({data.scope})", fontsize=9)
    top.legend(fontsize=7, ncol=3)
    versus = [data.versus_envelope[b] for b in budgets]
    diffs = [_or_nan(v.difference) for v in versus]
    errors = [
        [_or_nan(v.difference) - _or_nan(v.low) for v in versus],
        [_or_nan(v.high) - _or_nan(v.difference) for v in versus],
    ]
    bottom.errorbar(budgets, diffs, yerr=errors, fmt="o-", color="#c0392b", capsize=4)
    bottom.axhline(0, color="black", lw=0.8)
    bottom.set_xscale("log", base=2)
    bottom.set_xticks(budgets, [str(b) for b in budgets])
    bottom.set_xlabel("average capacity per layer (tokens)")
    bottom.set_ylabel(f"route-uniform - envelope\n({metric}, 95% CI)")
    fig.tight_layout()
    fig.savefig(folder / name, dpi=130)
    plt.close(fig)
    return name

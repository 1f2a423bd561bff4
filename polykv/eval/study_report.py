"""The study's Markdown report and figures (`polykv.eval.study.run_study` makes what they render).

Every number is read from the study's result (the experiments' reports and the task scores of the runs
they cite); the report prints each run id beside its number, the settings, the timing of each step, and
what the numbers say in sentences whichever way they come out.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

import pandas as pd

from polykv.files import atomic_write_text
from polykv.plan import Phase

# The paper: Chao Fei and Panos Kalnis, "PolyKV: Heterogeneous Retention and Allocation for KV Cache
# Compression", arXiv:2606.15157 (2026). Only its abstract could be read here; these are its numbers.
PAPER = (
    "The paper (Fei and Kalnis, arXiv:2606.15157) reports, on LLaMA-3.1-8B and Qwen3-8B with LongBench: at a "
    "512-token average budget the route recovers 54.5% and 25.7% of the gap between the strongest single-policy "
    "baseline and FullKV; across its 128-1024 sweep it improves over the strongest baseline by 1.7%-6.4%, "
    "40.0%-54.5% of the FullKV gap. Only the paper's abstract could be read in this environment (its Tables 2, "
    "4 and 5 could not), so the comparison is with those numbers: the gap recovery (route - best baseline) / "
    "(FullKV - best baseline) below is the same quantity."
)


def md_table(frame: pd.DataFrame, floats: str = "{:.4f}") -> str:
    """A Markdown table (pandas' to_markdown needs the `tabulate` package; this needs nothing)."""

    def cell(value) -> str:
        if isinstance(value, float):
            return "" if value != value else floats.format(value)
        return str(value).replace("|", "\\|")

    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def ci_text(contrast: dict, digits: int = 4) -> str:
    return f"{contrast['difference']:+.{digits}f} [{contrast['low']:+.{digits}f}, {contrast['high']:+.{digits}f}]"


def better(contrast: dict, sign: int) -> str:
    """'better' / 'worse' / 'no significant difference' for A - B, from the CI in the better direction."""
    low, high = sorted((sign * contrast["low"], sign * contrast["high"]))
    return "better" if low > 0 else "worse" if high < 0 else "no significant difference"


def gap_recovery(sweep: dict, label: str = "route-uniform") -> dict[int, float | None]:
    """Per budget, (route - envelope) / (FullKV - envelope): the share of the best baseline's gap to FullKV the
    route closes (None where FullKV is not better than the envelope: there is no gap to close)."""
    full, sign = sweep["full"]["score"], sweep["direction"]
    out: dict[int, float | None] = {}
    for b in sweep["budgets"]:
        best, route = sweep["envelope"][b]["score"], sweep["scores"][label][b]
        out[b] = (route - best) / (full - best) if sign * (full - best) > 0 else None
    return out


def niah_curves(result) -> pd.DataFrame | None:
    """RULER: each series' mean score over the niah tasks at each budget (and FullKV's), from the sweep's runs."""
    data = result.sweep.data
    scores = result.task_scores

    def niah(run: str) -> float | None:
        values = [v for task, v in scores.get(run, {}).items() if task.split("@")[0].startswith("niah")]
        return sum(values) / len(values) if values else None

    if niah(data["full"]["run"]) is None:
        return None
    rows = [
        {"series": name, **{str(b): niah(data["runs"][name][b]) for b in data["budgets"]}}
        for name in data["routes"] + data["baselines"]
    ]
    rows.append({"series": "FullKV", **{str(b): niah(data["full"]["run"]) for b in data["budgets"]}})
    return pd.DataFrame(rows)


# ---- figures --------------------------------------------------------------------------------------------
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
    metric = data["metric"]
    randoms = data["random"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    left.hist([r["score"] for r in randoms], bins=20, color="#9aa7b8")
    left.axvline(data["guided"]["score"], color="#c0392b", lw=2, label=f"guided (rank {data['guided_rank']})")
    left.set_xlabel(f"suite {metric}")
    left.set_ylabel("random placements")
    left.legend(fontsize=8)
    right.scatter([r["S"] for r in randoms], [r["score"] for r in randoms], s=14, color="#5b6b80", label="random")
    right.scatter([data["guided"]["S"]], [data["guided"]["score"]], s=50, color="#c0392b", marker="*", label="guided")
    right.set_xlabel(f"profile score S(rho) by {data['statistic']}")
    right.set_ylabel(f"suite {metric}")
    spearman = data["spearman"]
    right.set_title(
        f"Spearman over the random placements {spearman:+.3f}, one-sided p {data['spearman_p']:.4f}"
        if spearman == spearman
        else "Spearman undefined",
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
        budgets = result.sweep.data["budgets"]
        fig, ax = plt.subplots(figsize=(8, 4.2))
        for row in curves.to_dict("records"):
            style = {"lw": 2.5, "marker": "o"} if row["series"].startswith("route") else {"lw": 1, "marker": "."}
            if row["series"] == "FullKV":
                style = {"lw": 1.2, "ls": ":", "color": "#27ae60"}
            ax.plot(budgets, [row[str(b)] for b in budgets], label=row["series"], **style)
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlabel("average capacity per layer (tokens)")
        ax.set_ylabel("mean niah score (0-100)")
        ax.set_title(f"needles found per method ({result.sweep.data['route']})", fontsize=9)
        ax.legend(fontsize=7, ncol=3)
        fig.tight_layout()
        out["niah"] = "niah.png"
        fig.savefig(folder / out["niah"], dpi=130)
        plt.close(fig)
    return out


def _sweep_figure(plt, data: dict, folder: Path, name: str) -> str:
    """Every series against the budget (log axis), the envelope and FullKV; route - envelope with CIs."""
    budgets, metric = data["budgets"], data["metric"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for series in data["baselines"]:
        top.plot(budgets, [data["scores"][series][b] for b in budgets], lw=0.9, alpha=0.6, marker=".", label=series)
    top.plot(budgets, [data["envelope"][b]["score"] for b in budgets], "k--", lw=1.5, label="best baseline (envelope)")
    for series, style in zip(data["routes"], ("#c0392b", "#e67e22")):
        top.plot(budgets, [data["scores"][series][b] for b in budgets], color=style, lw=2.5, marker="o", label=series)
    top.axhline(data["full"]["score"], color="#27ae60", lw=1, ls=":", label="FullKV")
    top.set_xscale("log", base=2)
    top.set_ylabel(f"suite {metric}")
    top.set_title(f"{data['route']} ({data['scope']})", fontsize=9)
    top.legend(fontsize=7, ncol=3)
    versus = data["versus_envelope"]
    diffs = [versus[b]["difference"] for b in budgets]
    errors = [
        [versus[b]["difference"] - versus[b]["low"] for b in budgets],
        [versus[b]["high"] - versus[b]["difference"] for b in budgets],
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


# ---- sentences ----------------------------------------------------------------------------------------
def _k_note(result) -> str:
    k = result.placement.data["k"]
    if k >= result.settings.placements:
        return ""
    return (
        f" (asked for {result.settings.placements}; the route admits only {k} other count-matched placements on "
        f"{result.route.num_layers} layers, so all of them run: an exhaustive control)"
    )


def findings(result) -> list[str]:
    """What the numbers say, in sentences, whichever way they come out."""
    f = result.factorial.data
    metric, sign = f["metric"], (1 if f["direction"] > 0 else -1)
    direction = "higher" if sign > 0 else "lower"
    primary = f["routing_uniform"]
    lines = [
        f"Routing under uniform allocation (TopRank route vs {result.baseline} in every layer, both at "
        f"{f['budget']} tokens per layer): {metric} difference {ci_text(primary)} ({direction} is better): "
        f"{better(primary, sign)}; the route wins {primary['wins']} of {primary['tasks']} tasks, and "
        f"{primary['loto_better']} of {len(primary['leave_one_out'])} leave-one-task-out values favour it.",
        f"Allocation ({f['allocation']} vs uniform) under TopRank routing: {ci_text(f['allocation_routed'])} "
        f"({better(f['allocation_routed'], sign)}); interaction {ci_text(f['interaction'])} "
        f"({better(f['interaction'], sign)}).",
    ]
    p = result.placement.data
    lines.append(
        f"Placement control ({p['metric']}): over {p['k']} random count-matched placements the profile score "
        f"S(rho) and the suite score correlate with Spearman {p['spearman']:+.3f} (one-sided permutation p = "
        f"{p['spearman_p']:.4f}); the guided route ranks {p['guided_rank']} of {p['k'] + 1} (p = "
        f"{p['guided_p']:.3f}), {p['guided_minus_mean']:+.4f} {p['metric']} from the random mean."
    )
    for phase, report in result.sweeps.items():
        s = report.data
        ssign = 1 if s["direction"] > 0 else -1
        verdicts = [
            f"{b}: {better(s['versus_envelope'][b], ssign)} (vs {s['versus_envelope'][b]['baseline']})"
            for b in s["budgets"]
        ]
        lines.append(
            f"Sweep of the {phase} route, route-uniform against the best standalone baseline at each budget: "
            + "; ".join(verdicts)
            + "."
        )
        recovered = gap_recovery(s)
        shown = [f"{b}: {v:+.1%}" for b, v in recovered.items() if v is not None]
        if shown:
            closes = f"Share of the best baseline's gap to FullKV the {phase} route closes: "
            lines.append(closes + "; ".join(shown) + ".")
        if s["double"]:
            lines.append(
                f"{phase} route at b vs the best baseline at 2b: "
                + "; ".join(f"{b}: {d['verdict']} ({ci_text(d)})" for b, d in s["double"].items())
                + "."
            )
    return lines


# ---- the report ---------------------------------------------------------------------------------------
def _describe(result) -> str:
    s = result.settings
    if s.suite == "fidelity":
        return "the fidelity suite (next-token agreement with FullKV on held-out text)"
    settings = result.suite_settings
    chat = {True: "in the model's chat template", False: "without a chat template", None: ""}[result.chat_template]
    length = settings.get("length")
    return (
        f"RULER ({', '.join(settings.get('tasks', []))} at {length} tokens, {settings.get('samples_per_task')} samples "
        f"per task, prompts {chat}); the placement control on {s.placement_suite or s.suite}"
    )


def write_report(result, path: Path, command: str = "") -> Path:
    """Write the Markdown report at `path` and its figures in `<path without .md>/` (written, then renamed)."""
    from polykv.routing import route_confidence

    path = Path(path)
    drawn = figures(result, path.with_suffix(""))
    folder = path.with_suffix("").name
    s, profile = result.settings, result.profile
    meta, extra = profile.meta, profile.metadata  # typed fields; the rest (sequence_length, seconds, spec)
    f = result.factorial.data
    store = result.store_path
    title = "PolyKV demo study" if s.model == "demo" else f"PolyKV study on {s.model}"
    tasks = result.suite_settings.get("tasks", [])
    lines = [
        f"# {title}: should every layer use the same KV eviction method?",
        "",
        f"The paper's protocol (profile, TopRank route, routing x allocation factorial, placement control with "
        f"K = {result.placement.data['k']}{_k_note(result)}, budget sweep) on the {meta.num_layers}-layer model "
        f"`{s.model}` and {_describe(result)}. Generated by a real run of",
        "",
        f"```bash\n{command or 'polykv experiment study'}\n```",
        "",
        f"on {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}, {platform.machine()}, "
        f"{os.cpu_count()} CPU cores, backend `{s.backend}`{', runs of a suite batched together' if s.batched else ''}."
        " Wall time: "
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in result.seconds.items())
        + f"; total {sum(result.seconds.values()) / 60:.1f} min.",
        "",
        f"Every number below is a run in the results database `{store}` (SQLite; `polykv runs --workspace "
        f"{store.parent}` lists them, `polykv compare RUN_A RUN_B --workspace {store.parent}` recomputes any "
        f"contrast); run ids are printed beside the numbers. Metric: **{f['metric']}** "
        f"({'higher' if f['direction'] > 0 else 'lower'} is better), the macro-average over {len(tasks)} tasks; "
        f"intervals are 95% paired bootstrap intervals over tasks.",
        "",
        "Settings: " + json.dumps(s.to_dict()),
        "",
        "Suite: " + json.dumps(result.suite_settings) + "; placement suite: " + json.dumps(result.placement_settings),
        "",
        "## What it shows",
        "",
        *[f"- {line}" for line in findings(result)],
        "",
        "## 1. Profile",
        "",
        f"Profile `{profile.key}` (`{profile.path}`): {meta.corpus.num_sequences} calibration "
        f"sequences of {extra.get('sequence_length')} tokens from "
        f"{', '.join(extra['corpus'].get('spec', {}).get('sources', []))}, "
        f"b_cal = {meta.b_cal}, computed in {extra.get('seconds')} s. FullKV perplexity of the calibration "
        f"text per source: " + ", ".join(f"{k} {v:.2f}" for k, v in meta.fullkv_ppl.items()) + ".",
        "",
        f"![profile]({folder}/{drawn['profile']})",
        "",
    ]
    for phase in (Phase.PREFILL, Phase.DECODE):
        confidence = route_confidence(profile, phase, s.statistic)
        lines += [
            f"TopRank by {s.statistic} in {phase.value}, with the winner's margin over the runner-up and how often "
            f"it still wins when the calibration sequences are resampled (1,000 bootstrap replicates):",
            "",
            md_table(confidence),
            "",
        ]
    lines += ["## 2. The TopRank routes", ""]
    for phase, route in result.routes.items():
        methods = [layer[Phase(phase)].method for layer in route.layers]
        lines += [
            f"`{route.name}`: "
            + ", ".join(f"L{i} {m}" for i, m in enumerate(methods))
            + f" ({phase} phase; the other phase keeps everything).",
            "",
        ]
    lines += [
        "## 3. Routing x allocation factorial (Table 2)",
        "",
        md_table(pd.DataFrame(result.factorial.rows)),
        "",
        *[f"- {line}" for line in result.factorial.lines],
        "",
    ]
    p = result.placement
    lines += [
        "## 4. Placement control (Table 4, Figure 4)",
        "",
        *[f"- {line}" for line in p.lines],
        "",
        f"![placement]({folder}/{drawn['placement']})",
        "",
        "<details><summary>All placements (plan, run, score, S(rho))</summary>",
        "",
        md_table(pd.DataFrame(p.rows)),
        "",
        "</details>",
        "",
    ]
    for number, (phase, report) in enumerate(result.sweeps.items(), start=5):
        lines += _sweep_section(number, phase, report.data, report.lines, folder, drawn[f"sweep {phase}"])
    curves = niah_curves(result)
    if curves is not None:
        lines += [
            "## Needles by method and budget",
            "",
            f"Mean score over the niah tasks of each series of the {s.scope} route's sweep (baselines under their "
            "own protocols), from the same runs:",
            "",
            md_table(curves, "{:.1f}"),
            "",
            f"![niah]({folder}/{drawn['niah']})",
            "",
        ]
    lines += ["## Beside the paper", "", PAPER, ""]
    for phase, report in result.sweeps.items():
        recovered = gap_recovery(report.data)
        lines.append(
            f"- {phase} route: "
            + "; ".join(f"b = {b}: {'no gap' if v is None else f'{v:+.1%}'}" for b, v in recovered.items())
        )
    return atomic_write_text(path, "\n".join(lines) + "\n")


def _sweep_section(number: int, phase: str, data: dict, notes: list[str], folder: str, figure: str) -> list[str]:
    budgets, series = data["budgets"], data["routes"] + data["baselines"]
    grid = pd.DataFrame(
        [{"series": name, **{str(b): data["scores"][name][b] for b in budgets}} for name in series]
        + [
            {"series": "envelope", **{str(b): data["envelope"][b]["score"] for b in budgets}},
            {"series": "best baseline", **{str(b): data["envelope"][b]["baseline"] for b in budgets}},
            {"series": "route-uniform - envelope", **{str(b): ci_text(data["versus_envelope"][b]) for b in budgets}},
        ]
    )
    runs = pd.DataFrame([{"series": name, **{str(b): data["runs"][name][b] for b in budgets}} for name in series])
    return [
        f"## {number}. Budget sweep of the {phase} route (Table 5)",
        "",
        f"`{data['route']}`. Suite {data['metric']} per average capacity; FullKV (budget-independent, run "
        f"`{data['full']['run']}`) scores {data['full']['score']:.4f}.",
        "",
        md_table(grid),
        "",
        *[f"- {line}" for line in notes],
        "",
        f"![sweep]({folder}/{figure})",
        "",
        "<details><summary>Run ids of the sweep</summary>",
        "",
        md_table(runs),
        "",
        "</details>",
        "",
    ]

"""The paper's study at demo scale, as one call: profile -> TopRank route -> factorial -> placement -> sweep,
then a Markdown report with tables and figures.

Every number in the report comes from a run in the study's results database (its id is printed beside
it), and the report names the database, the profile directory and the exact settings, so anyone can
trace a number back or rerun the study: finished runs are found again by their ids and not recomputed.

The experiments themselves are `polykv.eval.experiments` (the same code as `polykv experiment ...`);
this module only chooses their inputs, runs them in order and renders what they return.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from polykv.files import atomic_write_text
from polykv.plan import Phase, Plan, Scope


@dataclass(frozen=True)
class StudySettings:
    """What the study runs. Defaults: the demo model, a decode-phase route at average capacity 64."""

    model: str = "demo"
    scope: str = "decode"  # the phase the route (and the placement control) acts in
    budget: int = 64  # average capacity of the route, the factorial and the placement control
    budgets: tuple[int, ...] = (16, 32, 64, 128, 256)  # the sweep's average capacities
    placements: int = 99  # K random count-matched placements
    statistic: str = "dppl"  # TopRank's profile statistic
    allocation: str = "ppl"  # the factorial's allocated arm (and the sweep's route-ppl row)
    baseline: str | None = None  # the factorial's homogeneous method; None: best mean profile score
    metric: str = "kl"  # the fidelity metric that scores a run
    samples_per_task: int = 3
    calibration_sequences: int = 20
    seed: int = 0
    backend: str = "local"  # "ray": runs as Ray tasks on a local cluster (one per core)
    device: str = "cpu"

    def __post_init__(self):
        if Scope(self.scope) is Scope.BOTH:
            raise ValueError("the study routes one phase: scope must be prefill or decode")
        if self.budget < 1 or any(b < 1 for b in self.budgets) or not self.budgets:
            raise ValueError("budgets must be positive integers")
        if self.placements < 1:
            raise ValueError("placements must be at least 1")


@dataclass
class StudyResult:
    settings: StudySettings
    profile: Any
    route: Plan
    baseline: str
    factorial: Any
    placement: Any
    sweep: Any
    seconds: dict[str, float] = field(default_factory=dict)
    store_path: Path | None = None
    suite_settings: dict = field(default_factory=dict)


def best_mean_method(profile, phase: Phase, statistic: str) -> str:
    """The method with the best profile statistic averaged over layers (the factorial's homogeneous arm
    when none is given): the strongest single method by the same evidence TopRank uses."""
    from polykv.profile.store import STATISTICS

    rows = profile.table[(profile.table["scope"] == phase.value) & (profile.table["method"] != "full")]
    means = rows.groupby("method")[statistic].mean()
    return str((means * STATISTICS[statistic]).idxmax())


def run_study(
    settings: StudySettings,
    workspace: Path,
    progress: Callable[[str], None] | None = None,
    *,
    on_run: Callable[[str], None] | None = None,
    on_sample: Callable[[int, int, str], None] | None = None,
    on_profile: Callable[[float, str], None] | None = None,
) -> StudyResult:
    """Run the whole study into `workspace` (profiles/ and results.sqlite); finished work is reused.

    `progress` is told each step (and `run <plan>` before each run unless `on_run` is given, which is then
    told the plan's name instead); `on_sample` is `ExperimentRunner.on_sample`, `on_profile` is
    `build_profile(progress=)`: for progress bars."""
    from polykv.eval.experiments import ExperimentRunner, factorial, placement, sweep
    from polykv.eval.store import Store
    from polykv.eval.suites.fidelity import FidelitySettings, default_tasks
    from polykv.models import load_model
    from polykv.profile.build import build_profile
    from polykv.profile.corpus import CorpusSpec, default_sources
    from polykv.routing import placement_count, plan_from_profile

    say = progress or (lambda message: None)
    seconds: dict[str, float] = {}
    workspace.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(settings.model, device=settings.device)  # quiet: no progress bars
    phase = Phase(settings.scope)

    started = time.perf_counter()
    say("profile")
    spec = CorpusSpec(
        sources=default_sources(settings.model), num_sequences=settings.calibration_sequences, seed=settings.seed
    )
    profile = build_profile(
        settings.model,
        model,
        tokenizer,
        workspace / "profiles",
        spec,
        scopes=(Phase.PREFILL, Phase.DECODE),
        progress=on_profile,
    )
    seconds["profile"] = time.perf_counter() - started

    route = plan_from_profile(profile, settings.scope, settings.budget, settings.statistic, "uniform")
    baseline = settings.baseline or best_mean_method(profile, phase, settings.statistic)
    suite_settings = FidelitySettings(tasks=default_tasks(settings.model), samples_per_task=settings.samples_per_task)
    runner = ExperimentRunner(
        Store(workspace / "results.sqlite"),
        settings.model,
        model,
        tokenizer,
        "fidelity",
        suite_settings,
        settings.seed,
        settings.metric,
        progress=on_run or (lambda name: say(f"run {name}")),
        on_sample=on_sample,
        backend=settings.backend,
        device=settings.device,
    )

    # A short route may admit fewer distinct count-matched placements than asked for (5 layers with one
    # method twice: 59): then every one of them is run, which makes the control exhaustive, not sampled.
    placements = min(settings.placements, placement_count([layer[phase].method for layer in route.layers]))
    if placements < settings.placements:
        say(f"placement: the route admits only {placements} other placements; running all of them")
    steps = {
        "factorial": lambda: factorial(
            runner, profile, settings.scope, settings.budget, baseline, settings.statistic, settings.allocation
        ),
        "placement": lambda: placement(runner, profile, route, placements, settings.statistic),
        "sweep": lambda: sweep(runner, route, list(settings.budgets), profile=profile),
    }
    reports = {}
    for name, step in steps.items():
        say(name)
        started = time.perf_counter()
        reports[name] = step()
        seconds[name] = time.perf_counter() - started
    runner.store.checkpoint()  # the database file alone then holds every run the report cites
    return StudyResult(
        settings,
        profile,
        route,
        baseline,
        reports["factorial"],
        reports["placement"],
        reports["sweep"],
        seconds,
        runner.store.path,
        suite_settings.to_dict(),
    )


# ---- the report ----------------------------------------------------------------------------------------
def _md_table(frame: pd.DataFrame, floats: str = "{:.4f}") -> str:
    """A Markdown table (pandas' to_markdown needs the `tabulate` package; this needs nothing)."""

    def cell(value) -> str:
        if isinstance(value, float):
            return "" if value != value else floats.format(value)
        return str(value).replace("|", "\\|")

    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def _ci_text(contrast: dict, digits: int = 4) -> str:
    return f"{contrast['difference']:+.{digits}f} [{contrast['low']:+.{digits}f}, {contrast['high']:+.{digits}f}]"


def _better(contrast: dict, sign: int) -> str:
    """'better' / 'worse' / 'no significant difference' for A - B, from the CI in the better direction."""
    low, high = sorted((sign * contrast["low"], sign * contrast["high"]))
    return "better" if low > 0 else "worse" if high < 0 else "no significant difference"


def _figures(result: StudyResult, folder: Path) -> dict[str, str]:
    """The report's PNG figures (matplotlib, no display); returns name -> file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, str] = {}
    metric = result.settings.metric

    # Profile: dPPL (or the study's statistic) per layer and method, the TopRank winner outlined.
    table = result.profile.table
    scopes = [s for s in ("prefill", "decode") if s in set(table["scope"])]
    fig, axes = plt.subplots(1, len(scopes), figsize=(5.2 * len(scopes), 3.2), squeeze=False)
    statistic = result.settings.statistic
    for ax, scope in zip(axes[0], scopes):
        rows = table[(table["scope"] == scope) & (table["method"] != "full")]
        grid = rows.pivot_table(index="layer", columns="method", values=statistic)
        image = ax.imshow(grid.values, aspect="auto", cmap="RdBu_r" if statistic == "dppl" else "viridis")
        if statistic == "dppl":
            bound = max(abs(float(grid.values.min())), abs(float(grid.values.max()))) or 1.0
            image.set_clim(-bound, bound)
        ax.set_xticks(range(len(grid.columns)), grid.columns, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(grid.index)), [f"L{i}" for i in grid.index], fontsize=8)
        best = (grid * (-1 if statistic == "dppl" else 1)).values.argmax(axis=1)
        for layer, column in enumerate(best):
            ax.add_patch(plt.Rectangle((column - 0.5, layer - 0.5), 1, 1, fill=False, lw=2, ec="black"))
        ax.set_title(f"{scope}: {statistic} (TopRank pick outlined)", fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.04)
    fig.tight_layout()
    out["profile"] = "profile.png"
    fig.savefig(folder / out["profile"], dpi=130)
    plt.close(fig)

    # Placement control: the K random placements' scores, the guided one marked; S(rho) vs score (Figure 4).
    data = result.placement.data
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
    right.set_title(
        f"Spearman over the random placements {data['spearman']:+.3f}, one-sided p {data['spearman_p']:.4f}", fontsize=9
    )
    right.legend(fontsize=8)
    fig.tight_layout()
    out["placement"] = "placement.png"
    fig.savefig(folder / out["placement"], dpi=130)
    plt.close(fig)

    # Sweep: every series against the budget (log axis), the envelope and FullKV; route - envelope with CIs.
    data = result.sweep.data
    budgets = data["budgets"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for name in data["baselines"]:
        top.plot(budgets, [data["scores"][name][b] for b in budgets], lw=0.9, alpha=0.6, marker=".", label=name)
    top.plot(budgets, [data["envelope"][b]["score"] for b in budgets], "k--", lw=1.5, label="best baseline (envelope)")
    for name, style in zip(data["routes"], ("#c0392b", "#e67e22")):
        top.plot(budgets, [data["scores"][name][b] for b in budgets], color=style, lw=2.5, marker="o", label=name)
    top.axhline(data["full"]["score"], color="#27ae60", lw=1, ls=":", label="FullKV")
    top.set_xscale("log", base=2)
    top.set_ylabel(f"suite {metric}")
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
    out["sweep"] = "sweep.png"
    fig.savefig(folder / out["sweep"], dpi=130)
    plt.close(fig)
    return out


def _k_note(result: StudyResult) -> str:
    k = result.placement.data["k"]
    if k >= result.settings.placements:
        return ""
    return (
        f" (asked for {result.settings.placements}; the route admits only {k} other count-matched placements on "
        f"{result.route.num_layers} layers, so all of them run: an exhaustive control)"
    )


def findings(result: StudyResult) -> list[str]:
    """What the numbers say, in sentences, whichever way they come out."""
    metric, sign = result.settings.metric, (1 if result.factorial.data["direction"] > 0 else -1)
    better = "higher" if sign > 0 else "lower"
    f = result.factorial.data
    primary = f["routing_uniform"]
    lines = [
        f"Routing under uniform allocation (TopRank route vs {result.baseline} in every layer, both at "
        f"{f['budget']} tokens per layer): {metric} difference {_ci_text(primary)} ({better} is better): "
        f"{_better(primary, sign)}; the route wins {primary['wins']} of {primary['tasks']} tasks, and "
        f"{primary['loto_better']} of {len(primary['leave_one_out'])} leave-one-task-out values favour it.",
        f"Allocation ({f['allocation']} vs uniform) under TopRank routing: {_ci_text(f['allocation_routed'])} "
        f"({_better(f['allocation_routed'], sign)}); interaction {_ci_text(f['interaction'])} "
        f"({_better(f['interaction'], sign)}).",
    ]
    p = result.placement.data
    lines.append(
        f"Placement control: over {p['k']} random count-matched placements the profile score S(rho) and the suite "
        f"score correlate with Spearman {p['spearman']:+.3f} (one-sided permutation p = {p['spearman_p']:.4f}); "
        f"the guided route ranks {p['guided_rank']} of {p['k'] + 1} (p = {p['guided_p']:.3f}), "
        f"{p['guided_minus_mean']:+.4f} {metric} from the random mean."
    )
    s = result.sweep.data
    verdicts = [
        f"{b}: {_better(s['versus_envelope'][b], sign)} (vs {s['versus_envelope'][b]['baseline']})"
        for b in s["budgets"]
    ]
    lines.append(
        "Sweep, route-uniform against the best standalone baseline at each budget: " + "; ".join(verdicts) + "."
    )
    if s["double"]:
        lines.append(
            "Route at b vs the best baseline at 2b: "
            + "; ".join(f"{b}: {d['verdict']} ({_ci_text(d)})" for b, d in s["double"].items())
            + "."
        )
    return lines


def write_report(result: StudyResult, path: Path, command: str = "") -> Path:
    """Write the Markdown report at `path` and its figures in `<path without .md>/` (written, then renamed)."""
    from polykv.routing import route_confidence

    path = Path(path)
    figures = _figures(result, path.with_suffix(""))
    folder = path.with_suffix("").name
    s, profile = result.settings, result.profile
    meta, extra = profile.meta, profile.metadata  # typed fields; the rest (sequence_length, seconds, spec)
    metric = s.metric
    store = result.store_path
    lines = [
        "# PolyKV demo study: should every layer use the same KV eviction method?",
        "",
        f"The paper's protocol (profile, TopRank route, routing x allocation factorial, placement control with "
        f"K = {result.placement.data['k']}{_k_note(result)}, budget sweep) at demo scale: the embedded "
        f"{meta.num_layers}-layer model "
        f"`{s.model}` on the fidelity suite (next-token agreement with FullKV on the model's own kind of text). "
        f"Generated by a real run of",
        "",
        f"```bash\n{command or 'polykv experiment study'}\n```",
        "",
        f"on {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}, {platform.machine()}, "
        f"{os.cpu_count()} CPU cores, backend `{s.backend}`. Wall time: "
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in result.seconds.items())
        + f"; total {sum(result.seconds.values()) / 60:.1f} min.",
        "",
        f"Every number below is a run in the results database `{store}` (SQLite; `polykv runs --workspace "
        f"{store.parent}` lists them, `polykv compare RUN_A RUN_B --workspace {store.parent}` recomputes any "
        f"contrast); "
        f"run ids are printed beside the numbers. Metric: **{metric}** "
        f"({'higher' if result.factorial.data['direction'] > 0 else 'lower'} is better), the macro-average over "
        f"{len(result.suite_settings.get('tasks', []))} tasks of {s.samples_per_task} samples each; intervals are "
        f"95% paired bootstrap intervals over tasks.",
        "",
        "Settings: "
        + json.dumps({**asdict(s), "budgets": list(s.budgets)})
        + "; suite: "
        + json.dumps(result.suite_settings),
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
        f"![profile]({folder}/{figures['profile']})",
        "",
    ]
    for phase in (Phase.PREFILL, Phase.DECODE):
        confidence = route_confidence(profile, phase, s.statistic)
        lines += [
            f"TopRank by {s.statistic} in {phase.value}, with the winner's margin over the runner-up and how often "
            f"it still wins when the calibration sequences are resampled (1,000 bootstrap replicates):",
            "",
            _md_table(confidence),
            "",
        ]
    route_methods = [layer[Phase(s.scope)].method for layer in result.route.layers]
    lines += [
        "## 2. The TopRank route",
        "",
        f"`{result.route.name}`: "
        + ", ".join(f"L{i} {m}" for i, m in enumerate(route_methods))
        + f" ({s.scope} phase; the other phase keeps everything).",
        "",
    ]
    f = result.factorial
    lines += [
        "## 3. Routing x allocation factorial (Table 2)",
        "",
        _md_table(pd.DataFrame(f.rows)),
        "",
        *[f"- {line}" for line in f.lines],
        "",
    ]
    p = result.placement
    random_rows = pd.DataFrame(p.rows)
    lines += [
        "## 4. Placement control (Table 4, Figure 4)",
        "",
        *[f"- {line}" for line in p.lines],
        "",
        f"![placement]({folder}/{figures['placement']})",
        "",
        "<details><summary>All placements (plan, run, score, S(rho))</summary>",
        "",
        _md_table(random_rows),
        "",
        "</details>",
        "",
    ]
    w = result.sweep
    data = w.data
    grid = pd.DataFrame(
        [
            {"series": name, **{str(b): data["scores"][name][b] for b in data["budgets"]}}
            for name in data["routes"] + data["baselines"]
        ]
        + [
            {"series": "envelope", **{str(b): data["envelope"][b]["score"] for b in data["budgets"]}},
            {"series": "best baseline", **{str(b): data["envelope"][b]["baseline"] for b in data["budgets"]}},
            {
                "series": "route-uniform - envelope",
                **{str(b): _ci_text(data["versus_envelope"][b]) for b in data["budgets"]},
            },
        ]
    )
    runs = pd.DataFrame(
        [
            {"series": name, **{str(b): data["runs"][name][b] for b in data["budgets"]}}
            for name in data["routes"] + data["baselines"]
        ]
    )
    lines += [
        "## 5. Budget sweep (Table 5)",
        "",
        f"Suite {metric} per average capacity; FullKV (budget-independent, run `{data['full']['run']}`) scores "
        f"{data['full']['score']:.4f}.",
        "",
        _md_table(grid),
        "",
        *[f"- {line}" for line in w.lines],
        "",
        f"![sweep]({folder}/{figures['sweep']})",
        "",
        "<details><summary>Run ids of the sweep</summary>",
        "",
        _md_table(runs),
        "",
        "</details>",
        "",
    ]
    return atomic_write_text(path, "\n".join(lines) + "\n")

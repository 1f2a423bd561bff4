"""The workload search's report as Markdown, and its figure (`polykv.search.workload` builds the report).

`python -m polykv.search.workload_markdown REPORT.json --out PAGE.md` renders a saved report again.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polykv.search.workload import FAMILIES, ROLES

PAPER_OPEN = (
    '"These results do not identify a globally optimal route or establish reliable selection on unseen '
    'workloads." (the paper, Section 5)'
)
METRIC_WORDS = {"answer_nll": "answer_nll (lower is better)", "score": "accuracy, the suite's score 0-100"}


def _number(value: float, spec: str = "+.4f") -> str:
    return "n/a" if value is None or value != value else format(value, spec)


def _mde(value: float, short: bool = False) -> str:
    """The minimal detectable difference; in tables "n/e" where there is none (the note under them says why)."""
    from polykv.eval.paired_samples import detectable

    value = math.nan if value is None else value
    return "n/e" if short and value != value else detectable(value, ".4g")


MDE_NOTE = "n/e: the MDE is not estimable (fewer than 6 samples differ, or their differences do not vary)."


def _contrast_text(c: Mapping[str, Any]) -> str:
    return (
        f"{_number(c['difference'])} [{_number(c['low'])}, {_number(c['high'])}], p = {c['p']:.4f}, "
        f"MDE {_mde(c['mde'])}, W/T/L {c['wins']}/{c['ties']}/{c['losses']} over {c['samples']} samples: "
        f"**{c['verdict']}**"
    )


def verdict_rows(entry: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """One row per family and contrast of one budget (the CLI's table)."""
    rows = []
    for family, data in entry["verdict"].items():
        for c in data["contrasts"]:
            rows.append(
                (
                    family,
                    f"{c['a']} - {c['b']}",
                    c["metric"],
                    f"{_number(c['difference'])} [{_number(c['low'])}, {_number(c['high'])}]",
                    f"{c['p']:.4f}",
                    _mde(c["mde"], short=True),
                    f"{c['wins']}/{c['ties']}/{c['losses']}",
                    c["verdict"],
                )
            )
    return rows


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(str(x) for x in row) + " |" for row in rows),
    ]


def _find(entry: Mapping[str, Any], family: str, a: str, b: str, metric: str) -> Mapping[str, Any] | None:
    data = entry["verdict"].get(family)
    if data is None:
        return None
    return next((c for c in data["contrasts"] if (c["a"], c["b"], c["metric"]) == (a, b, metric)), None)


def _cells(plan: Mapping[str, Any], scope: str) -> str:
    """The plan's methods per layer in the searched phase, run-length encoded (e.g. tova x12, h2o x3, ...)."""
    phase = "decode" if scope in ("decode", "both") else "prefill"
    cells = [(layer[phase]["method"], layer[phase].get("capacity")) for layer in plan["layers"]]
    runs: list[list] = []
    for cell in cells:
        if runs and runs[-1][0] == cell:
            runs[-1][1] += 1
        else:
            runs.append([cell, 1])
    return ", ".join(f"{m}@{c}" + (f" x{n}" if n > 1 else "") for (m, c), n in runs)


def _held_out_table(entry: Mapping[str, Any], family: str) -> list[str]:
    data = entry["verdict"].get(family)
    if data is None:
        return []
    rows = []
    for role in (*ROLES, "fullkv"):
        if role not in data["means"]:
            continue
        means = data["means"][role]
        name = entry["plans"][role]["name"] if role in entry["plans"] else "fullkv"
        search = entry["search_values"].get(role)
        rows.append(
            (
                role,
                f"`{name}`",
                _number(search, ".4f") if family == FAMILIES[0] and search is not None else "",
                _number(means["answer_nll"], ".4f"),
                _number(means["score"], ".1f"),
                " / ".join(dict.fromkeys(f"`{entry['runs'][m][role]}`" for m in ("answer_nll", "score"))),
            )
        )
    header = ("role", "plan", "search answer_nll", "held-out answer_nll", "accuracy", "runs (answer_nll / accuracy)")
    return _table(header, rows)


def markdown(report: Mapping[str, Any], store_dir: Path | None = None, figure: Path | None = None, page=None) -> str:
    samples = report["samples"]
    settings = samples["settings"]
    tasks = ", ".join(settings["tasks"])
    length = f" at {settings['length']} tokens" if "length" in settings else ""
    where = str(store_dir) if store_dir is not None else "the output folder"  # as the command was given
    steps = dict(report.get("seconds_steps", {}))
    lines = [
        f"# Plans for a workload on {report['model']}: searched on {tasks}, judged on held-out samples",
        "",
        "Which plan should this model use for this workload at this budget, and how sure is that? A plan is "
        f"searched on the workload's own calibration samples ({report['objective']}, the gold answer's mean NLL "
        "per token) and judged, with every contender, on held-out samples of the same tasks and of tasks it never "
        f"saw. The paper leaves this open: {PAPER_OPEN}",
        "",
        "Generated by a real run of",
        "",
        "```bash",
        report.get("command") or "(the command was not recorded)",
        "```",
        "",
        f"on {report['created']} UTC, {report['machine']['platform']}, {report['machine']['cpus']} CPU cores. Wall "
        "time: "
        + ", ".join(f"{name} {seconds / 60:.1f} min" for name, seconds in steps.items())
        + (", " if steps else "")
        + ", ".join(
            f"budget {b['budget']} {b['seconds']['contenders'] / 60:.1f} min (contenders and search) + "
            f"{b['seconds']['verdict'] / 60:.1f} min (verdict)"
            for b in report["budgets"]
        )
        + f"; total {(report['seconds'] + sum(steps.values())) / 60:.1f} min.",
        "",
        f"Every held-out number is a run in `{where}/results.sqlite`: `polykv runs show RUN --workspace {where}` "
        f"lists a run's samples with the model's answers, `polykv compare A B --samples --workspace {where}` any "
        "contrast sample by sample.",
        "",
        "## What ran",
        "",
        f"- Model `{report['model']}`; workload {samples['suite']} {tasks}{length} (sources "
        f"{', '.join(samples['sources'])}), gold answers scored over at most {settings.get('answer_tokens')} tokens.",
        f"- Search samples: {samples['search_per_task']} per task from the calibration split (the suite's "
        f"generator at seed {samples['seed']} + 1,000,003; any prompt equal to a held-out one is dropped). "
        f"Held-out samples: {samples['held_out_per_task']} per task at seed {samples['seed']} (what `polykv eval` "
        f"draws), scored (answer_nll); accuracy generated on the first {samples['accuracy_per_task']} of them.",
        f"- Transfer tasks (judged, never searched on): {', '.join(samples['transfer']) or 'none'}.",
        "- FullKV's accuracy per task on the held-out samples that generate (can the model do the task at all?): "
        + ", ".join(f"{task} {value:.1f}" for task, value in report.get("fullkv_accuracy", {}).items())
        + ". Where it is near 0, accuracy cannot tell plans apart and answer_nll carries the verdict.",
        f"- Searched scope {report['scope']}; evaluation budget {report['evaluations']} plan executions per budget, "
        f"{report['candidates']} candidates a round; the workload profile `{report['workload_profile']['key']}` "
        f"(b_cal {report['workload_profile']['b_cal']}, statistic danswer) ranks the moves and gives "
        "toprank-workload"
        + (
            f"; toprank-text comes from the text profile `{report['text_profile']['key']}` (b_cal "
            f"{report['text_profile']['b_cal']}, statistic {report['text_profile']['statistic']})."
            if report.get("text_profile")
            else "; no text profile was given (no toprank-text row)."
        ),
        "- Contenders, each chosen on the search samples: **searched** (the local search from toprank-workload and "
        "the best fixed homogeneous plan), **toprank-workload**, **toprank-text**, **homogeneous** (the best "
        "one-method plan of the scope), **envelope** (the best of the nine baselines, each under its own protocol: "
        "its phases and allocation, as the sweep runs them). FullKV beside them.",
        "- Verdicts: the sample-level sign-flip permutation test (tasks fixed), the within-task bootstrap 95% "
        "interval, and the minimal detectable difference (MDE) at 80% power; W/T/L counts samples.",
        "",
        "## Did the searched plan beat the envelope on held-out samples?",
        "",
    ]
    for entry in report["budgets"]:
        lines += [f"- **Budget {entry['budget']}** (envelope `{entry['plans']['envelope']['name']}`):"]
        for family in FAMILIES:
            for metric in ("answer_nll", "score"):
                c = _find(entry, family, "searched", "envelope", metric)
                if c is not None:
                    lines.append(f"  - {family}, {METRIC_WORDS[metric]}: {_contrast_text(c)}")
    lines += [
        "",
        "## ... and the best one-method plan of the searched scope?",
        "",
        "The envelope runs each baseline under its own protocol (TOVA, for one, compresses the prompt too); the "
        "searched plan acts in the searched scope only. Against the best homogeneous plan of that scope (chosen on "
        "the search samples), the same tests (answer_nll):",
        "",
    ]
    for entry in report["budgets"]:
        parts = []
        for family in FAMILIES:
            c = _find(entry, family, "searched", "homogeneous", "answer_nll")
            if c is not None:
                parts.append(f"{family} {_contrast_text(c)}")
        lines.append(f"- **Budget {entry['budget']}** (`{entry['plans']['homogeneous']['name']}`): " + "; ".join(parts))
    lines += [""]
    if figure is not None and figure.exists():
        lines += [f"![held-out answer_nll by budget]({_relative(figure, page)})", ""]
    for entry in report["budgets"]:
        lines += [f"## Budget {entry['budget']}", ""]
        for family in FAMILIES:
            table = _held_out_table(entry, family)
            if table:
                lines += [f"Held-out, {family} ({', '.join(entry['verdict'][family]['tasks'])}):", "", *table, ""]
        lines += ["Contrasts (A - B; answer_nll lower is better, accuracy higher):", ""]
        lines += _table(
            ("family", "A - B", "metric", "difference [95% CI]", "p", "MDE", "W/T/L", "A is"), verdict_rows(entry)
        )
        lines += ["", MDE_NOTE]
        search = entry["search"]
        lines += [
            "",
            f"Search: from `{search['start']}`, {len(search['moves'])} accepted moves in {search['rounds']} rounds, "
            f"{search['evaluations']} executions, stopped: {search['stopped']}. Searched plan: "
            f"{_cells(entry['plans']['searched'], report['scope'])}.",
            "",
            "Chosen on the search samples (answer_nll): envelope among "
            + ", ".join(
                f"{name} {value:.4f}" for name, value in sorted(entry["envelope_scores"].items(), key=lambda kv: kv[1])
            )
            + "; homogeneous among "
            + ", ".join(
                f"{name} {value:.4f}"
                for name, value in sorted(entry["homogeneous_scores"].items(), key=lambda kv: kv[1])
            )
            + ".",
            "",
        ]
    lines += ["## Transfer", ""]
    transfer_rows = []
    for entry in report["budgets"]:
        for role in ROLES:
            if role == "envelope":
                continue
            for metric in ("answer_nll", "score"):
                c = _find(entry, FAMILIES[1], role, "envelope", metric)
                own = _find(entry, FAMILIES[0], role, "envelope", metric)
                if c is not None:
                    transfer_rows.append(
                        (
                            entry["budget"],
                            role,
                            metric,
                            f"{_number(own['difference'])} ({own['verdict']})" if own else "",
                            f"{_number(c['difference'])} [{_number(c['low'])}, {_number(c['high'])}]",
                            f"{c['p']:.4f}",
                            _mde(c["mde"], short=True),
                            c["verdict"],
                        )
                    )
    if transfer_rows:
        lines += [
            "Each plan minus the envelope on the tasks it was searched on and on the transfer tasks it never saw:",
            "",
            *_table(
                ("budget", "plan", "metric", "searched tasks", "transfer tasks [95% CI]", "p", "MDE", "verdict"),
                transfer_rows,
            ),
            "",
            MDE_NOTE,
            "",
        ]
    else:
        lines += ["No transfer tasks were given.", ""]
    return "\n".join(lines)


def _relative(path: Path | None, page) -> str:
    if path is None:
        return ""
    if page is None:
        return str(path)
    return os.path.relpath(Path(path).resolve(), Path(page).resolve().parent)


def figure(report: Mapping[str, Any], folder: Path) -> str:
    """Held-out answer_nll of every role by budget, one panel per family of tasks; the file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [f for f in FAMILIES if any(f in b["verdict"] for b in report["budgets"])]
    fig, axes = plt.subplots(1, len(families), figsize=(5.5 * len(families), 3.6), squeeze=False)
    budgets = [b["budget"] for b in report["budgets"]]
    for ax, family in zip(axes[0], families):
        for role in (*ROLES, "fullkv"):
            values = [
                b["verdict"][family]["means"].get(role, {}).get("answer_nll", math.nan) for b in report["budgets"]
            ]
            if not all(v != v for v in values):
                ax.plot(budgets, values, marker="o", label=role, linestyle="--" if role == "fullkv" else "-")
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlabel("budget (tokens per layer)")
        ax.set_ylabel("held-out answer_nll")
        ax.set_title(family)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    name = "workload.png"
    fig.savefig(Path(folder) / name, dpi=110)
    plt.close(fig)
    return name


def main(argv: list[str] | None = None) -> int:
    from polykv.files import atomic_write_text, read_json

    parser = argparse.ArgumentParser(description="Render a saved workload search report as Markdown.")
    parser.add_argument("report", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    data = read_json(args.report, "workload report")
    folder = args.report.parent
    atomic_write_text(args.out, markdown(data, folder, folder / "workload.png", args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

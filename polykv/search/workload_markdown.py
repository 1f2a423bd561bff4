"""The workload search's report as Markdown, and its figure (`polykv.search.workload` builds the report).

A verdict line names its two plans with the phases each acts in, its test (the sample-level sign-flip test: exact
when few samples differ), the samples it rests on, the interval that agrees with the test and the minimal
detectable difference; a contrast of plans of different scopes says so in the line ("across protocols").

`python -m polykv.search.workload_markdown REPORT.json --out PAGE.md` renders a saved report again, its verdicts
recomputed from the runs in the results database beside it (`polykv.search.workload_verdict.rejudge`); the saved
report keeps the verdicts the search computed.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polykv.eval.paired_samples import EXACT_DIFFERING, PERMUTATIONS
from polykv.eval.settings import COMPETENCE_THRESHOLD
from polykv.kv_memory import kv_kept, token_bytes
from polykv.search.workload_verdict import FAMILIES, ROLES

PAPER_OPEN = (
    '"These results do not identify a globally optimal route or establish reliable selection on unseen '
    'workloads." (the paper, Section 5)'
)
METRIC_WORDS = {"answer_nll": "answer_nll (lower is better)", "score": "accuracy (the suite's score 0-100)"}
SCOPE_WORDS = {
    "prefill": "prefill only (the prompt compressed, every answer token kept)",
    "decode": "decode only (the prompt held whole until the first answer token)",
    "both": "prefill and decode",
}
PROTOCOL_WORDS = {
    "in-prompt": "in the prompt (the plan compresses context and question together)",
    "after-compression": "after compression (the plan compresses the context; the question follows, kept in full)",
}
MDE_NOTE = "n/e: no minimal detectable difference (fewer than 6 samples differ, or their differences do not vary)."


def number(value: float | None, spec: str = "+.4f") -> str:
    return "n/a" if value is None or value != value else format(value, spec)


def interval(c: Mapping[str, Any]) -> str:
    """The interval that agrees with the test; an unbounded side when the test can reject no shift there."""
    low = "-inf" if c["low"] is None else number(c["low"])
    high = "+inf" if c["high"] is None else number(c["high"])
    return f"[{low}, {high}]"


def mde_text(value: float | None, short: bool = False) -> str:
    from polykv.eval.paired_samples import detectable

    value = math.nan if value is None else value
    return "n/e" if short and value != value else detectable(value, ".4g")


def test_text(c: Mapping[str, Any]) -> str:
    from polykv.eval.paired_samples import format_p

    kind = "exact sign-flip" if c.get("exact") else f"sign-flip ({PERMUTATIONS:,} random flips)"
    return f"{kind} p = {format_p(c['p'])} over {c['samples']} samples in {c['tasks']} tasks ({c['differing']} differ)"


def scope_of(entry: Mapping[str, Any], role: str) -> str:
    plan = entry["plans"].get(role)
    return "both" if plan is None else plan["scope"]


def name_of(entry: Mapping[str, Any], role: str) -> str:
    plan = entry["plans"].get(role)
    return "fullkv" if plan is None else plan["name"]


def contrast_line(entry: Mapping[str, Any], c: Mapping[str, Any]) -> str:
    """A verdict in one line: the difference, its interval, the test, the MDE, W/T/L, the verdict, and whether the
    two plans act in the same phases."""
    line = (
        f"{number(c['difference'])} {interval(c)}, {test_text(c)}, MDE {mde_text(c['mde'])}, "
        f"W/T/L {c['wins']}/{c['ties']}/{c['losses']}: **{c['verdict']}**"
    )
    if not c.get("agrees", True):
        line += " (the interval and the exact test disagree at the level: the interval comes from random flips)"
    if not c.get("matched", True):
        line += (
            f"; across protocols: {c['a']} acts in {SCOPE_WORDS[scope_of(entry, c['a'])]}, {c['b']} in "
            f"{SCOPE_WORDS[scope_of(entry, c['b'])]}"
        )
    return line


def find(entry: Mapping[str, Any], family: str, a: str, b: str, metric: str) -> Mapping[str, Any] | None:
    data = entry["verdict"].get(family)
    if data is None:
        return None
    return next((c for c in data["contrasts"] if (c["a"], c["b"], c["metric"]) == (a, b, metric)), None)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    escape = lambda x: str(x).replace("|", "\\|")  # noqa: E731
    return [
        "| " + " | ".join(escape(h) for h in header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(escape(x) for x in row) + " |" for row in rows),
    ]


def verdict_rows(entry: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """One row per family and contrast of one budget (the CLI's table and the page's)."""
    from polykv.eval.paired_samples import format_p

    rows = []
    for family, data in entry["verdict"].items():
        for c in data["contrasts"]:
            rows.append(
                (
                    family,
                    c.get("kind", ""),
                    f"{c['a']} - {c['b']}",
                    "yes" if c.get("matched", True) else "no",
                    c["metric"],
                    f"{number(c['difference'])} {interval(c)}",
                    format_p(c["p"]),
                    mde_text(c["mde"], short=True),
                    f"{c['wins']}/{c['ties']}/{c['losses']}",
                    c["verdict"],
                )
            )
    return rows


VERDICT_HEADER = ("family", "kind", "A - B", "same scope", "metric", "difference [95% CI]", "p", "MDE", "W/T/L", "A is")


def cells(plan: Mapping[str, Any]) -> str:
    """The plan's methods per layer in its active phase, run-length encoded (e.g. tova@64 x12, h2o@64 x3)."""
    phase = "decode" if plan["scope"] == "decode" else "prefill"
    runs: list[list] = []
    for layer in plan["layers"]:
        cell = (layer[phase]["method"], layer[phase].get("capacity"))
        if runs and runs[-1][0] == cell:
            runs[-1][1] += 1
        else:
            runs.append([cell, 1])
    return ", ".join(f"{m}@{c}" + (f" x{n}" if n > 1 else "") for (m, c), n in runs)


def kv_rows(report: Mapping[str, Any], budgets: Sequence[Mapping[str, Any]], roles=(*ROLES, "fullkv")) -> list[tuple]:
    """Per budget and role: the KV kept entering the answer and after it, in tokens per layer and MB (mean over
    the searched tasks' held-out samples), and as a share of FullKV's."""
    from polykv.plan import Plan

    dims = report.get("kv")
    tasks = report["samples"]["settings"]["tasks"]
    lengths = [report["samples"]["lengths"][t] for t in tasks if t in report["samples"].get("lengths", {})]
    if not dims or not lengths:
        return []
    per_token = token_bytes(dims) / 1e6  # MB per token and layer
    full = Plan.homogeneous("full", None, dims["layers"])
    windows = dims.get("windows")  # reports before hybrid models: every layer global
    mean = lambda plan: [sum(v) / len(lengths) for v in zip(*(kv_kept(plan, x, windows) for x in lengths))]  # noqa: E731
    reference = mean(full)
    rows = []
    for entry in budgets:
        for role in roles:
            if role == "fullkv" and entry is not budgets[0] or role not in (*entry["plans"], "fullkv"):
                continue
            plan = full if role == "fullkv" else Plan.from_dict(entry["plans"][role])
            entering, after = mean(plan)
            rows.append(
                (
                    "" if role == "fullkv" else entry["budget"],
                    role,
                    f"`{plan.name}`",
                    plan.scope.value,
                    f"{entering / dims['layers']:.0f} ({entering * per_token:.1f} MB, {entering / reference[0]:.0%})",
                    f"{after / dims['layers']:.0f} ({after * per_token:.1f} MB, {after / reference[1]:.0%})",
                )
            )
    return rows


def hybrid_budget_lines(report: Mapping[str, Any]) -> list[str]:
    """On a model with local (sliding-window) layers, what a budget counts and what the search conserves."""
    windows = (report.get("kv") or {}).get("windows") or []
    local = [w for w in windows if w is not None]
    if not local:
        return []
    bound = min(local) - 1
    return [
        f"- What a budget counts on this hybrid model ({len(local)} local layers, window "
        f"{'/'.join(map(str, sorted(set(local))))}, and {len(windows) - len(local)} global): b is the capacity per "
        f"layer as plans write it; a local layer never holds more than its window less one ({bound} tokens), so at "
        f"b >= {bound} every local layer keeps its window and the budget cuts the global layers only. The search "
        "conserves the KV actually held: it moves capacity only between layers that hold all of it, and changes a "
        "layer's method only where its capacity is under the window. Plans of other allocations (the envelope's "
        "pyramids) hold less than they write on a local layer: the KV table below gives what each plan keeps."
    ]


KV_HEADER = ("budget", "role", "plan", "scope", "entering the answer", "after the answer")


def kv_note(report: Mapping[str, Any]) -> str:
    dims = report["kv"]
    return (
        "KV kept per layer in tokens (one K and one V per KV head; MB for all "
        f"{dims['layers']} layers at {dims['kv_heads']} KV heads x {dims['head_dim']} x {dims['bytes']} bytes; % of "
        "FullKV's), the mean over the searched tasks' held-out samples: nominal, each active layer keeps "
        "min(capacity, what it has seen), as the methods do"
        + (", and a local layer at most its sliding window less one" if any(dims.get("windows") or ()) else "")
        + ". Entering the answer is after the prompt's pass (and the "
        "question, when it comes after compression); a decode-only plan holds the whole prompt until then."
    )


def _held_out_table(entry: Mapping[str, Any], family: str) -> list[str]:
    data = entry["verdict"].get(family)
    if data is None:
        return []
    rows = []
    for role in (*ROLES, "fullkv"):
        if role not in data["means"]:
            continue
        means = data["means"][role]
        search = entry["search_values"].get(role)
        rows.append(
            (
                role,
                f"`{name_of(entry, role)}`",
                scope_of(entry, role) if role in entry["plans"] else "",
                number(search, ".4f") if family == FAMILIES[0] and search is not None else "",
                number(means["answer_nll"], ".4f"),
                number(means["score"], ".1f"),
                " / ".join(dict.fromkeys(f"`{entry['runs'][m][role]}`" for m in ("answer_nll", "score"))),
            )
        )
    header = ("role", "plan", "scope", "search answer_nll", "held-out answer_nll", "accuracy", "runs (nll / accuracy)")
    return table(header, rows)


def _lines_for(report, kind_pairs, families=FAMILIES, metrics=("answer_nll", "score")) -> list[str]:
    lines = []
    for entry in report["budgets"]:
        lines.append(f"- **Budget {entry['budget']}**:")
        for a, b in kind_pairs:
            for family in families:
                for metric in metrics:
                    c = find(entry, family, a, b, metric)
                    if c is not None:
                        lines.append(
                            f"  - {a} `{name_of(entry, a)}` - {b} `{name_of(entry, b)}`, {family}, "
                            f"{METRIC_WORDS[metric]}: {contrast_line(entry, c)}"
                        )
    return lines


def competence_lines(report: Mapping[str, Any]) -> list[str]:
    competence = report.get("competence", {})
    threshold = competence.get("threshold", COMPETENCE_THRESHOLD)
    accuracy = report.get("fullkv_accuracy", {})
    n = competence.get("samples", "?")
    out = [
        f"FullKV's accuracy, generating, on {n} samples per task of the evaluation split (RULER: the first {n} "
        f"held-out ones; run `{competence.get('pilot', '?')}`), before any plan was judged; a task under "
        f"{threshold:g}% leaves the verdict (it cannot tell plans apart, and its answer_nll scores an answer the "
        "model cannot give):",
        "",
    ]
    rows = [(task, f"{value:.1f}", "yes" if value >= threshold else "no: left out") for task, value in accuracy.items()]
    return out + table(("task", "FullKV accuracy", "judged"), rows)


def markdown(report: Mapping[str, Any], store_dir: Path | None = None, figure: Path | None = None, page=None) -> str:
    samples = report["samples"]
    settings = samples["settings"]
    tasks = ", ".join(settings["tasks"])
    length = f" at {settings['length']} tokens" if "length" in settings else ""
    question = samples.get("question", "in-prompt")
    where = str(store_dir) if store_dir is not None else "the output folder"
    steps = dict(report.get("seconds_steps", {}))
    scope = report["scope"]
    lines = [
        f"# Plans for a workload on {report['model']}, {scope} scope, question {question}: searched on {tasks}",
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
        "contrast sample by sample."
        + (
            " The verdicts below were computed again from those runs by `python -m polykv.search.workload_markdown` "
            "(the current statistics); `report.json` keeps the ones the search printed."
            if report.get("rejudged")
            else ""
        ),
        "",
        "## What ran",
        "",
        f"- Model `{report['model']}`; workload {samples['suite']} {tasks}{length} (sources "
        f"{', '.join(samples['sources'])}), gold answers scored over at most {settings.get('answer_tokens')} tokens.",
        f"- The question: {PROTOCOL_WORDS[question]}. Searched scope: {SCOPE_WORDS[scope]}.",
        f"- Search samples: {samples['search_per_task']} per task from the calibration split (the suite's "
        f"generator at seed {samples['seed']} + 1,000,003; any prompt equal to a held-out one is dropped). "
        f"Held-out samples: {samples['held_out_per_task']} per task at seed {samples['seed']} (what `polykv eval` "
        f"draws), scored (answer_nll); accuracy generated on the first {samples['accuracy_per_task']} of them.",
        f"- Transfer tasks (judged, never searched on): {', '.join(samples['transfer']) or 'none'}.",
        f"- Evaluation budget {report['evaluations']} plan executions per budget, {report['candidates']} candidates a "
        f"round; the workload profile `{report['workload_profile']['key']}` (b_cal "
        f"{report['workload_profile']['b_cal']}, statistic danswer, under this question protocol) ranks the moves "
        "and gives toprank-workload"
        + (
            f"; toprank-text comes from the text profile `{report['text_profile']['key']}` (b_cal "
            f"{report['text_profile']['b_cal']}, statistic {report['text_profile']['statistic']})."
            if report.get("text_profile")
            else "; no text profile was given (no toprank-text row)."
        ),
        "- Contenders, each chosen on the search samples: **searched** (the local search from toprank-workload and "
        "the best fixed homogeneous plan), **toprank-workload**, **toprank-text**, **homogeneous** (the best "
        "one-method plan of the searched scope: the primary comparator, like with like), **anchor** (toprank-"
        "workload's majority method in every layer of the scope), **tova** (TOVA under its standalone protocol, "
        "prefill and decode), **envelope** (the best of the nine baselines, each under its own protocol: its phases "
        "and allocation, as the sweep runs them). FullKV beside them. Every plan runs under the same question "
        "protocol.",
        *hybrid_budget_lines(report),
        "- Verdicts: the sample-level sign-flip permutation test (tasks fixed; exact by enumeration when at most "
        f"{EXACT_DIFFERING} samples differ, else {PERMUTATIONS:,} random flips seeded by the data), the 95% interval "
        "of the shifts the test does not reject (it agrees with the test; a line says so where an exact p and an "
        "interval from random flips disagree at the level), and the minimal detectable difference (MDE) at 80% "
        "power; W/T/L counts samples.",
        "",
        "## Competence",
        "",
        *competence_lines(report),
        "",
        "## The verdict: the searched plan against the best homogeneous plan of its scope",
        "",
        "Like with like: both act in the searched scope, under the same question protocol.",
        "",
        *_lines_for(report, [("searched", "homogeneous")]),
        "",
        "## Against the envelope (each baseline under its own protocol)",
        "",
        *_lines_for(report, [("searched", "envelope"), ("homogeneous", "envelope")], metrics=("answer_nll",)),
        "",
        "## The paper's Section 4.4 shape: the workload route against its anchor and against TOVA",
        "",
        *_lines_for(report, [("toprank-workload", "anchor"), ("toprank-workload", "tova")], metrics=("answer_nll",)),
        "",
        "## KV memory each plan keeps",
        "",
        kv_note(report) if report.get("kv") else "The report does not say the model's KV dimensions.",
        "",
        *table(KV_HEADER, kv_rows(report, report["budgets"])),
        "",
    ]
    if figure is not None and figure.exists():
        lines += [f"![held-out answer_nll by budget]({_relative(figure, page)})", ""]
    for entry in report["budgets"]:
        lines += [f"## Budget {entry['budget']}", ""]
        for family in FAMILIES:
            held = _held_out_table(entry, family)
            if held:
                lines += [f"Held-out, {family} ({', '.join(entry['verdict'][family]['tasks'])}):", "", *held, ""]
        lines += ["Contrasts (A - B; answer_nll lower is better, accuracy higher):", ""]
        lines += [*table(VERDICT_HEADER, verdict_rows(entry)), "", MDE_NOTE]
        search = entry["search"]
        lines += [
            "",
            f"Search: from `{search['start']}`, {len(search['moves'])} accepted moves in {search['rounds']} rounds, "
            f"{search['evaluations']} executions, stopped: {search['stopped']}. Searched plan: "
            f"{cells(entry['plans']['searched'])}.",
            "",
            "Chosen on the search samples (answer_nll): envelope among "
            + ", ".join(f"{n} {v:.4f}" for n, v in sorted(entry["envelope_scores"].items(), key=lambda kv: kv[1]))
            + "; homogeneous among "
            + ", ".join(f"{n} {v:.4f}" for n, v in sorted(entry["homogeneous_scores"].items(), key=lambda kv: kv[1]))
            + ".",
            "",
        ]
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
                b["verdict"].get(family, {}).get("means", {}).get(role, {}).get("answer_nll", math.nan)
                for b in report["budgets"]
            ]
            if not all(v != v for v in values):
                ax.plot(budgets, values, marker="o", label=role, linestyle="--" if role == "fullkv" else "-")
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlabel("budget (tokens per layer)")
        ax.set_ylabel("held-out answer_nll")
        ax.set_title(f"{family}: {report['scope']}, question {report['samples'].get('question', 'in-prompt')}")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    name = "workload.png"
    fig.savefig(Path(folder) / name, dpi=110)
    plt.close(fig)
    return name


def main(argv: list[str] | None = None) -> int:
    from polykv.eval.store import Store
    from polykv.files import atomic_write_text, read_report
    from polykv.search.workload import FORMAT
    from polykv.search.workload_verdict import rejudge

    parser = argparse.ArgumentParser(description="Render a saved workload search report as Markdown again.")
    parser.add_argument("report", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    data = read_report(args.report, FORMAT, "workload report")
    folder = args.report.parent
    data = rejudge(data, Store(folder / "results.sqlite", readonly=True))
    atomic_write_text(args.out, markdown(data, folder, folder / figure(data, folder), args.out))
    return 0


if __name__ == "__main__":
    from polykv.errors import script_exit

    raise SystemExit(script_exit(main))

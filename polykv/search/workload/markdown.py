"""The workload search's report as a page of Markdown, and its figure (`polykv.search.workload.run` builds the
report; `verdict_text` words its contrasts, `kv_table` the KV memory its plans keep).

A verdict line names its two plans with the phases each acts in, its test (the sample-level sign-flip test: exact
when few samples differ), the samples it rests on, the interval that agrees with the test and the minimal
detectable difference; a contrast of plans of different scopes says so in the line ("across protocols").

`python -m polykv.search.workload.markdown REPORT.json --out PAGE.md` renders a saved report again, its verdicts
recomputed from the runs in the results database beside it (`polykv.search.workload.verdict.rejudge`); the saved
report keeps the verdicts the search computed.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polykv.eval.statistics.render import markdown_table, number
from polykv.eval.statistics.samples import EXACT_DIFFERING, PERMUTATIONS
from polykv.plan import Plan
from polykv.question_protocol import QuestionProtocol
from polykv.search.workload.kv_table import hybrid_budget_lines, kv_header, kv_note, kv_rows
from polykv.search.workload.report import WorkloadBudget, WorkloadReport
from polykv.search.workload.verdict import FAMILIES, ROLES
from polykv.search.workload.verdict_text import (
    MDE_NOTE,
    METRIC_WORDS,
    PAPER_OPEN,
    SCOPE_WORDS,
    VERDICT_HEADER,
    contrast_line,
    verdict_rows,
)
from polykv.workspace import RESULTS_FILE, results_path


def cells(plan: Plan) -> str:
    """The plan's methods per layer in its active phase, run-length encoded (e.g. tova@64 x12, h2o@64 x3)."""
    phase = "decode" if plan.scope.value == "decode" else "prefill"
    runs: list[list] = []
    for layer in plan.layers:
        cell = (layer[phase].method, layer[phase].capacity)
        if runs and runs[-1][0] == cell:
            runs[-1][1] += 1
        else:
            runs.append([cell, 1])
    return ", ".join(f"{m}@{c}" + (f" x{n}" if n > 1 else "") for (m, c), n in runs)


def _held_out_table(entry: WorkloadBudget, family: str) -> list[str]:
    data = entry.verdict.get(family)
    if data is None:
        return []
    rows = []
    for role in (*ROLES, "fullkv"):
        if role not in data.means:
            continue
        means = data.means[role]
        search = entry.search_values.get(role)
        rows.append(
            (
                role,
                f"`{entry.name_of(role)}`",
                entry.scope_of(role) if role in entry.plans else "",
                number(search, ".4f") if family == FAMILIES[0] and search is not None else "",
                number(means.answer_nll, ".4f"),
                number(means.score, ".1f"),
                " / ".join(dict.fromkeys(f"`{entry.runs[m][role]}`" for m in ("answer_nll", "score"))),
            )
        )
    header = ("role", "plan", "scope", "search answer_nll", "held-out answer_nll", "accuracy", "runs (nll / accuracy)")
    return markdown_table(header, rows)


def _lines_for(
    report: WorkloadReport, kind_pairs, families=FAMILIES, metrics=("answer_nll", "score"), store=None
) -> list[str]:
    lines = []
    for entry in report.budgets:
        lines.append(f"- **Budget {entry.budget}**:")
        for a, b in kind_pairs:
            unequal = _unequal_kv(report, entry, a, b, store)
            for family in families:
                for metric in metrics:
                    c = entry.find(family, a, b, metric)
                    if c is not None:
                        lines.append(
                            f"  - {a} `{entry.name_of(a)}` - {b} `{entry.name_of(b)}`, {family}, "
                            f"{METRIC_WORDS[metric]}: {contrast_line(entry, c)}{unequal}"
                        )
    return lines


def _unequal_kv(report: WorkloadReport, entry: WorkloadBudget, a: str, b: str, store) -> str:
    """ "; not at equal KV ..." when the two roles' held-out runs held measured KV more than 1% apart entering the
    answer (or one was not measured while the other was); "" otherwise or without a database."""
    from polykv.eval.results.kv_measured import measured_kv, unequal_kv

    if store is None or report.kv is None:
        return ""
    windows = report.kv.windows or [None] * report.kv.layers
    held = []
    for role in (a, b):
        run = entry.runs.get("answer_nll", {}).get(role)
        rows = [] if run is None else [r for r in store.samples(run) if r.task.split("@")[0] in report.samples.tasks]
        held.append(measured_kv(rows, windows))
    line = unequal_kv(*held, names=(a, b))
    return "" if line is None else "; " + line.removeprefix("note: ")


def competence_lines(report: WorkloadReport) -> list[str]:
    competence = report.competence
    threshold = competence.threshold
    accuracy = report.fullkv_accuracy
    n = "?" if competence.samples is None else competence.samples
    out = [
        f"FullKV's accuracy, generating, on {n} samples per task of the evaluation split (RULER: the first {n} "
        f"held-out ones; run `{'?' if competence.pilot is None else competence.pilot}`), before any plan was judged; "
        "a task under "
        f"{threshold:g}% leaves the verdict (it cannot tell plans apart, and its answer_nll scores an answer the "
        "model cannot give):",
        "",
    ]
    rows = [(task, f"{value:.1f}", "yes" if value >= threshold else "no: left out") for task, value in accuracy.items()]
    return out + markdown_table(("task", "FullKV accuracy", "judged"), rows)


def markdown(
    report: WorkloadReport | Mapping[str, Any], store_dir: Path | None = None, figure: Path | None = None, page=None
) -> str:
    """The report (or its saved JSON) as a page; `store_dir`: where its results database is, `figure`: the figure
    to show (its path relative to `page`, the page's own path)."""
    if not isinstance(report, WorkloadReport):
        report = WorkloadReport.from_dict(report)
    samples = report.samples
    settings = samples.settings
    tasks = ", ".join(samples.tasks)
    length = f" at {settings['length']} tokens" if "length" in settings else ""
    question = samples.question
    where = str(store_dir) if store_dir is not None else "the output folder"
    store = _results(store_dir)
    steps = dict(report.seconds_steps)
    scope = report.scope
    lines = [
        f"# Plans for a workload on {report.model}, {scope} scope, question {question}: searched on {tasks}",
        "",
        "Which plan should this model use for this workload at this budget, and how sure is that? A plan is "
        f"searched on the workload's own calibration samples ({report.objective}, the gold answer's mean NLL "
        "per token) and judged, with every contender, on held-out samples of the same tasks and of tasks it never "
        f"saw. The paper leaves this open: {PAPER_OPEN}",
        "",
        "Generated by a real run of",
        "",
        "```bash",
        report.command or "(the command was not recorded)",
        "```",
        "",
        f"on {report.created} UTC, {report.machine.platform}, {report.machine.cpus} CPU cores. Wall "
        "time: "
        + ", ".join(f"{name} {seconds / 60:.1f} min" for name, seconds in steps.items())
        + (", " if steps else "")
        + ", ".join(
            f"budget {b.budget} {b.seconds.contenders / 60:.1f} min (contenders and search) + "
            f"{b.seconds.verdict / 60:.1f} min (verdict)"
            for b in report.budgets
        )
        + f"; total {(report.seconds + sum(steps.values())) / 60:.1f} min.",
        "",
        f"Every held-out number is a run in `{where}/{RESULTS_FILE}`: `polykv runs show RUN --workspace {where}` "
        f"lists a run's samples with the model's answers, `polykv compare A B --samples --workspace {where}` any "
        "contrast sample by sample."
        + (
            " The verdicts below were computed again from those runs by `python -m polykv.search.workload.markdown` "
            "(the current statistics); `report.json` keeps the ones the search printed."
            if report.rejudged
            else ""
        ),
        "",
        "## What ran",
        "",
        f"- Model `{report.model}`; workload {samples.suite} {tasks}{length} (sources "
        f"{', '.join(samples.sources)}), gold answers scored over at most {settings.get('answer_tokens')} tokens.",
        f"- The question: {QuestionProtocol(question).words}. Searched scope: {SCOPE_WORDS[scope]}.",
        f"- Search samples: {samples.search_per_task} per task from the calibration split (the suite's "
        f"generator at seed {samples.seed} + 1,000,003; any prompt equal to a held-out one is dropped). "
        f"Held-out samples: {samples.held_out_per_task} per task at seed {samples.seed} (what `polykv eval` "
        f"draws), scored (answer_nll); accuracy generated on the first {samples.accuracy_per_task} of them.",
        f"- Transfer tasks (judged, never searched on): {', '.join(samples.transfer) or 'none'}.",
        f"- Evaluation budget {report.evaluations} plan executions per budget, {report.candidates} candidates a "
        f"round; the workload profile `{report.workload_profile.key}` (b_cal "
        f"{report.workload_profile.b_cal}, statistic danswer, under this question protocol) ranks the moves "
        "and gives toprank-workload"
        + (
            f"; toprank-text comes from the text profile `{report.text_profile.key}` (b_cal "
            f"{report.text_profile.b_cal}, statistic {report.text_profile.statistic})."
            if report.text_profile
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
        *_lines_for(report, [("searched", "homogeneous")], store=store),
        "",
        "## Against the envelope (each baseline under its own protocol)",
        "",
        *_lines_for(
            report, [("searched", "envelope"), ("homogeneous", "envelope")], metrics=("answer_nll",), store=store
        ),
        "",
        "## The paper's Section 4.4 shape: the workload route against its anchor and against TOVA",
        "",
        *_lines_for(
            report, [("toprank-workload", "anchor"), ("toprank-workload", "tova")], metrics=("answer_nll",), store=store
        ),
        "",
        "## KV memory each plan keeps",
        "",
        kv_note(report) if report.kv is not None else "The report does not say the model's KV dimensions.",
        "",
        *markdown_table(kv_header(store), kv_rows(report, report.budgets, store=store)),
        "",
    ]
    if figure is not None and figure.exists():
        lines += [f"![held-out answer_nll by budget]({_relative(figure, page)})", ""]
    for entry in report.budgets:
        lines += [f"## Budget {entry.budget}", ""]
        for family in FAMILIES:
            held = _held_out_table(entry, family)
            if held:
                lines += [f"Held-out, {family} ({', '.join(entry.verdict[family].tasks)}):", "", *held, ""]
        lines += ["Contrasts (A - B; answer_nll lower is better, accuracy higher):", ""]
        lines += [*markdown_table(VERDICT_HEADER, verdict_rows(entry)), "", MDE_NOTE]
        search = entry.search
        lines += [
            "",
            f"Search: from `{search.start}`, {len(search.moves)} accepted moves in {search.rounds} rounds, "
            f"{search.evaluations} executions, stopped: {search.stopped}. Searched plan: "
            f"{cells(entry.plans['searched'])}.",
            "",
            "Chosen on the search samples (answer_nll): envelope among "
            + ", ".join(f"{n} {v:.4f}" for n, v in sorted(entry.envelope_scores.items(), key=lambda kv: kv[1]))
            + "; homogeneous among "
            + ", ".join(f"{n} {v:.4f}" for n, v in sorted(entry.homogeneous_scores.items(), key=lambda kv: kv[1]))
            + ".",
            "",
        ]
    return "\n".join(lines)


def _results(store_dir: Path | None):
    """The report's results database, read-only (None where there is none): the KV its runs held, measured."""
    from polykv.eval.results.store import Store

    path = None if store_dir is None else results_path(store_dir)
    return Store(path, readonly=True) if path is not None and path.is_file() else None


def _relative(path: Path | None, page) -> str:
    if path is None:
        return ""
    if page is None:
        return str(path)
    return os.path.relpath(Path(path).resolve(), Path(page).resolve().parent)


def figure(report: WorkloadReport, folder: Path) -> str:
    """Held-out answer_nll of every role by budget, one panel per family of tasks; the file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [f for f in FAMILIES if any(f in b.verdict for b in report.budgets)]
    fig, axes = plt.subplots(1, len(families), figsize=(5.5 * len(families), 3.6), squeeze=False)
    budgets = [b.budget for b in report.budgets]
    for ax, family in zip(axes[0], families):
        for role in (*ROLES, "fullkv"):
            values = [_held_out_nll(b, family, role) for b in report.budgets]
            if not all(v != v for v in values):
                ax.plot(budgets, values, marker="o", label=role, linestyle="--" if role == "fullkv" else "-")
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlabel("budget (tokens per layer)")
        ax.set_ylabel("held-out answer_nll")
        ax.set_title(f"{family}: {report.scope}, question {report.samples.question}")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    name = "workload.png"
    fig.savefig(Path(folder) / name, dpi=110)
    plt.close(fig)
    return name


def _held_out_nll(entry: WorkloadBudget, family: str, role: str) -> float:
    """A role's held-out answer_nll on a family (NaN where the verdict has none)."""
    data = entry.verdict.get(family)
    means = None if data is None else data.means.get(role)
    return math.nan if means is None or means.answer_nll is None else means.answer_nll


def main(argv: list[str] | None = None) -> int:
    from polykv.eval.results.store import Store
    from polykv.files import atomic_write_text
    from polykv.search.workload.verdict import rejudge

    parser = argparse.ArgumentParser(description="Render a saved workload search report as Markdown again.")
    parser.add_argument("report", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    folder = args.report.parent
    data = rejudge(WorkloadReport.load(args.report), Store(results_path(folder), readonly=True))
    atomic_write_text(args.out, markdown(data, folder, folder / figure(data, folder), args.out))
    return 0


if __name__ == "__main__":
    from polykv.errors import script_exit

    raise SystemExit(script_exit(main))

"""One page over several workload searches of one model and workload that differ in scope and question protocol
(`polykv.search.workload.markdown` renders each alone): like-with-like verdicts side by side, where the KV memory
is saved, and the paper's Section 4.4 shape beside the paper's numbers.

    python -m polykv.search.workload.summary --out docs/smollm2-workload.md [--reading NOTES.md] \
        docs/smollm2-workload/<run> ...

Each folder holds a search's report.json and results.sqlite; the verdicts are recomputed from the runs
(`polykv.search.workload.verdict.rejudge`) and every run id printed is in the database named beside it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polykv.eval.statistics.render import markdown_table, number
from polykv.eval.statistics.samples import EXACT_DIFFERING, detectable
from polykv.question_protocol import QuestionProtocol
from polykv.search.workload.kv_table import kv_header, kv_note, kv_rows
from polykv.search.workload.report import SampleContrast, WorkloadBudget, WorkloadReport
from polykv.search.workload.verdict import FAMILIES
from polykv.search.workload.verdict_text import PAPER_OPEN, SCOPE_WORDS, interval, test_text
from polykv.workspace import RESULTS_FILE, results_path

# The paper's Section 4.4 (RULER, prefill-only, 512 average budget), quoted.
PAPER_44 = (
    '"The large matched-anchor gain does not make the guided uniform construction the best observed policy: it is '
    'about 16 points above homogeneous SnapKV but 0.10 points below standalone TOVA overall." (the paper, Section '
    '4.4; its RULER route is prefill-only at a 512-token average budget, "Because SnapKV occupies 18 of the 32 '
    "layers in the frozen route, the factorial comparison uses homogeneous SnapKV as the dominant-method ablation "
    'anchor"; the Introduction: "improves over matched SnapKV by 15.98 points")'
)


def title(report: WorkloadReport) -> str:
    return f"{report.scope} scope, question {report.samples.question}"


def _contrast_row(name: str, entry, family: str, a: str, b: str, metric: str = "answer_nll") -> tuple | None:
    c = entry.find(family, a, b, metric)
    if c is None:
        return None
    return (
        name,
        entry.budget,
        family,
        metric,
        f"{a} `{entry.name_of(a)}` - {b} `{entry.name_of(b)}`",
        "yes" if c.matched else "no",
        f"{number(c.difference, '+.4f')} {interval(c)}",
        test_text(c),
        detectable(c.mde, ".4g", short=True),
        f"{c.wins}/{c.ties}/{c.losses}",
        c.verdict,
        f"`{entry.runs[metric][a]}` / `{entry.runs[metric][b]}`",
    )


HEADER = ("searches", "budget", "family", "metric", "A - B", "same scope", "difference [95% CI]", "test", "MDE")
HEADER += ("W/T/L", "A is", "runs A / B")


def _rows(runs, pairs, families=FAMILIES, metric="answer_nll") -> list[tuple]:
    rows = []
    for name, report, _ in runs:
        for entry in report.budgets:
            for a, b in pairs:
                for family in families:
                    row = _contrast_row(name, entry, family, a, b, metric)
                    if row is not None:
                        rows.append(row)
    return rows


def _kept(runs) -> list[str]:
    """Per search: the share of FullKV's KV its searched plan keeps entering the answer, at each budget."""
    from polykv.plan import Plan

    out = []
    for name, report, _ in runs:
        samples = report.samples
        lengths = [samples.lengths[t] for t in samples.tasks if t in samples.lengths]
        if not lengths or report.kv is None:
            continue
        windows = report.kv.windows
        full = _entering(Plan.homogeneous("full", None, report.kv.layers), lengths, windows)
        shares = [
            f"{entry.budget}: {_entering(entry.plans['searched'], lengths, windows) / full:.0%}"
            for entry in report.budgets
        ]
        out.append(f"{name}: " + ", ".join(shares))
    return out


def _entering(plan, lengths, windows=None) -> float:
    """The KV tokens a plan keeps entering the answer, summed over layers, mean over the tasks' lengths."""
    from polykv.kv_memory import kv_kept

    return sum(kv_kept(plan, x, windows)[0] for x in lengths) / len(lengths)


def _tally(runs, a: str, b: str, family: str) -> list[str]:
    """Per search: how many budgets the contrast is better, worse or not significantly different."""
    out = []
    for name, report, _ in runs:
        shown = [c for c in (e.find(family, a, b, "answer_nll") for e in report.budgets) if c is not None]
        better, worse = (sum(c.verdict == v for c in shown) for v in ("better", "worse"))
        if shown:
            same = f"no significant difference at {len(shown) - better - worse} of {len(shown)} budgets"
            out.append(f"{name}: better at {better}, worse at {worse}, {same}")
    return out


def _protocol_section(runs, stores: Mapping[str, Any]) -> list[str]:
    """The page's section on the question protocol: the same plans under both, or why the page cannot say."""
    rows = protocol_rows(runs, stores)
    head = ["## What the question protocol changes: the same plan, in the prompt and after compression", ""]
    if not rows:
        return [
            *head,
            "Nothing here: no scope on this page was searched under both question protocols, so no plan ran "
            "under both (each search runs its contenders under its own protocol).",
            "",
        ]
    return [
        *head,
        "answer_nll on the searched tasks, sample by sample (the two searches scored the same prompts), for every "
        "plan both searches ran (the same layers, methods, capacities and parameters): after compression a "
        "prefill method compresses the context without the question in view (SnapKV's window, TOVA's last "
        "query); FullKV, which evicts nothing, is the control:",
        "",
        *markdown_table(PROTOCOL_HEADER, rows),
        "",
    ]


def protocol_rows(runs, stores: Mapping[str, Any]) -> list[tuple]:
    """The same plan under both question protocols, sample by sample on the searched tasks both judged (the same
    prompts: the protocols split them, they do not change them): AFTER_COMPRESSION minus IN_PROMPT, per scope and
    budget, for every plan both searches ran (FullKV among them: nothing evicted, so nothing should change)."""
    from polykv.eval.comparing.compare import sample_scores
    from polykv.search.workload.verdict import contrast

    by_scope: dict[str, dict[str, tuple]] = {}
    for name, report, _ in runs:
        by_scope.setdefault(report.scope, {})[report.samples.question] = (name, report)
    rows = []
    for scope, pair in by_scope.items():
        if set(pair) != set(QuestionProtocol):
            continue
        (inside, before), (after, later) = pair[QuestionProtocol.IN_PROMPT], pair[QuestionProtocol.AFTER_COMPRESSION]
        earlier = {entry.budget: entry for entry in before.budgets}
        shown = set()  # run pairs already in the table: FullKV's runs are every budget's
        for entry in later.budgets:
            other = earlier.get(entry.budget)
            if other is None:
                continue
            tasks = _tasks(entry) & _tasks(other)
            roles_before = {_plan_of(other, role): role for role in other.runs["answer_nll"]}
            done = set()
            for role in entry.runs["answer_nll"]:
                plan = _plan_of(entry, role)  # the same plan, not the same name: a search's plans differ by protocol
                if plan in done or plan not in roles_before:
                    continue
                done.add(plan)
                run_after, run_before = (
                    entry.runs["answer_nll"][role],
                    other.runs["answer_nll"][roles_before[plan]],
                )
                if (run_after, run_before) in shown:
                    continue
                shown.add((run_after, run_before))
                a = {t: v for t, v in sample_scores(stores[after], run_after, "answer_nll").items() if t in tasks}
                b = {t: v for t, v in sample_scores(stores[inside], run_before, "answer_nll").items() if t in tasks}
                if not a or not b:
                    continue
                c = SampleContrast(a=role, b=role, **contrast(a, b, "answer_nll", later.seed))
                rows.append(
                    (
                        scope,
                        entry.budget,
                        f"`{entry.name_of(role)}`",
                        f"{number(c.difference, '+.4f')} {interval(c)}",
                        test_text(c),
                        detectable(c.mde, ".4g", short=True),
                        f"{c.wins}/{c.ties}/{c.losses}",
                        c.verdict,
                        f"`{run_after}` ({after}) / `{run_before}` ({inside})",
                    )
                )
    return rows


def _tasks(entry: WorkloadBudget) -> set[str]:
    """The searched tasks the budget's verdict judged."""
    data = entry.verdict.get(FAMILIES[0])
    return set() if data is None else set(data.tasks)


def _plan_of(entry: WorkloadBudget, role: str) -> str:
    """A role's plan as its key (`plan_key`: what it runs, not what it is called); FullKV's for fullkv."""
    from polykv.search.objective import plan_key

    plan = entry.plans.get(role)
    return "fullkv" if plan is None else plan_key(plan)


_AFTER_MINUS_IN = f"after - {QuestionProtocol.IN_PROMPT} [95% CI]"
PROTOCOL_HEADER = ("scope", "budget", "plan", _AFTER_MINUS_IN, "test", "MDE", "W/T/L", "after is", "runs")


def means_rows(runs, family: str = FAMILIES[0]) -> list[tuple]:
    """Per search and budget, every role's held-out answer_nll on a family (macro over its tasks)."""
    roles = ("fullkv", "searched", "toprank-workload", "toprank-text", "homogeneous", "anchor", "tova", "envelope")
    rows = []
    for name, report, _ in runs:
        for entry in report.budgets:
            data = entry.verdict.get(family)
            means = {} if data is None else data.means
            rows.append((name, entry.budget, *(_mean_cell(entry, means, role) for role in roles)))
    return rows


def _mean_cell(entry, means: Mapping[str, Any], role: str) -> str:
    if role not in means:
        return ""
    named = "" if role in ("fullkv", "searched") else f" `{entry.name_of(role)}`"
    return f"{means[role].answer_nll:.3f}{named}"


MEANS_HEADER = ("searches", "budget", "FullKV", "searched", "toprank-workload", "toprank-text", "homogeneous")
MEANS_HEADER += ("anchor", "tova", "envelope")


def summary(
    runs: Sequence[tuple[str, WorkloadReport, Path]], page: Path, stores: Mapping[str, Any], reading: str = ""
) -> str:
    """The page; `runs`: (name, report, folder) of each search, `stores`: name -> its results database, `reading`:
    Markdown a person wrote about what the numbers show (placed before them, under "Reading")."""
    first = runs[0][1]
    samples = first.samples
    tasks = ", ".join(samples.tasks)
    length = samples.settings.get("length")
    here = lambda folder: os.path.relpath(Path(folder).resolve(), page.resolve().parent)  # noqa: E731
    lines = [
        f"# Plans for a workload on {first.model}, by scope and question protocol",
        "",
        f"Which plan should `{first.model}` use for {samples.suite}'s {tasks}"
        + (f" at {length} tokens" if length else "")
        + ", where the KV memory of a long prompt is actually saved, and does it matter whether the question is "
        "in the prompt the plan compresses? One workload search per scope and question protocol, each judged on "
        "held-out samples and on transfer tasks it never saw, every plan against the best homogeneous plan of its "
        f"own scope and protocol first. The paper leaves plan selection open: {PAPER_OPEN}",
        "",
        "The searches (each a real run of the command in its report; every number below is a run in the database "
        "named beside its search, and each report lists every sample's answer):",
        "",
    ]
    for name, report, folder in runs:
        seconds = (report.seconds + sum(report.seconds_steps.values())) / 60
        lines.append(
            f"- **{name}**: question {report.samples.question.words}; "
            f"scope {SCOPE_WORDS[report.scope]}. Report [{here(folder)}/report.md]({here(folder)}/report.md), "
            f"database `{here(folder)}/{RESULTS_FILE}`; {seconds:.1f} min on {report.machine.cpus} cores."
        )
    held, accuracy = samples.held_out_per_task, samples.accuracy_per_task
    lines += [
        "",
        f"Samples: {samples.search_per_task} search samples per task from the calibration split, {held} held-out "
        f"samples per task scored (answer_nll, the gold answer's mean NLL per token; lower is better), accuracy "
        f"generated on the first {accuracy}; transfer tasks {', '.join(samples.transfer) or 'none'}; the same "
        "held-out prompts in every search. Tests: the sample-level sign-flip test (exact when at most "
        f"{EXACT_DIFFERING} samples differ), the interval of shifts it does not reject, the minimal detectable "
        "difference at 80% power.",
        "",
        *(["## Reading", "", reading.strip(), ""] if reading.strip() else []),
        "## What it shows",
        "",
        "The searched plan against the best homogeneous plan of its own scope and protocol (answer_nll, the "
        "primary contrast):",
        "",
        *(f"- {line}" for line in _tally(runs, "searched", "homogeneous", FAMILIES[0])),
        "",
        "The same on the transfer tasks:",
        "",
        *(f"- {line}" for line in _tally(runs, "searched", "homogeneous", FAMILIES[1])),
        "",
        "The best homogeneous plan of each scope against the envelope of the nine baselines, each under its own "
        "protocol (a comparison across protocols wherever the envelope's plan acts in other phases):",
        "",
        *(f"- {line}" for line in _tally(runs, "homogeneous", "envelope", FAMILIES[0])),
        "",
        "The workload's TopRank route against the homogeneous plan of its majority method (the paper's Section 4.4 "
        "anchor, same scope):",
        "",
        *(f"- {line}" for line in _tally(runs, "toprank-workload", "anchor", FAMILIES[0])),
        "",
        "What each search's plans keep of the KV cache entering the answer (the searched plan, share of FullKV's):",
        "",
        *(f"- {line}" for line in _kept(runs)),
        "",
        "## Held-out answer_nll of every contender",
        "",
        "Searched tasks, macro over the tasks judged (lower is better; each plan named beside its number):",
        "",
        *markdown_table(MEANS_HEADER, means_rows(runs)),
        "",
        "Transfer tasks:",
        "",
        *markdown_table(MEANS_HEADER, means_rows(runs, FAMILIES[1])),
        "",
        "## Like with like: the searched plan against the best homogeneous plan of its scope",
        "",
        *markdown_table(HEADER, _rows(runs, [("searched", "homogeneous")])),
        "",
        "## TopRank routes against the same homogeneous plans",
        "",
        *markdown_table(HEADER, _rows(runs, [("toprank-workload", "homogeneous"), ("toprank-text", "homogeneous")])),
        "",
        "## Against the envelope (each baseline under its own protocol)",
        "",
        *markdown_table(HEADER, _rows(runs, [("searched", "envelope"), ("homogeneous", "envelope")])),
        "",
        "## The paper's Section 4.4 shape at our scale",
        "",
        f"The paper: {PAPER_44}. Ours: the workload's TopRank route in the prefill scope against the homogeneous "
        "plan of its majority method (the anchor, same scope and capacities) and against TOVA under its standalone "
        "protocol (prefill and decode), on answer_nll and accuracy:",
        "",
        *markdown_table(
            HEADER,
            _rows(
                [r for r in runs if r[1].scope == "prefill"],
                [("toprank-workload", "anchor"), ("toprank-workload", "tova")],
                FAMILIES[:1],
            )
            + _rows(
                [r for r in runs if r[1].scope == "prefill"],
                [("toprank-workload", "anchor"), ("toprank-workload", "tova")],
                FAMILIES[:1],
                "score",
            ),
        ),
        "",
        *_protocol_section(runs, stores),
        "## Where the KV memory is saved",
        "",
        kv_note(first) if first.kv is not None else "",
        "",
    ]
    for name, report, _ in runs:
        store = stores.get(name)
        rows = kv_rows(report, report.budgets, ("searched", "homogeneous", "envelope", "fullkv"), store=store)
        lines += [f"{name}:", "", *markdown_table(kv_header(store), rows), ""]
    lines += ["## Competence", ""]
    accuracy_rows = []
    for name, report, _ in runs:
        competence = report.competence
        for task, value in report.fullkv_accuracy.items():
            judged = "yes" if value >= competence.threshold else "no: left out"
            accuracy_rows.append((name, task, f"{value:.1f}", judged, f"`{competence.pilot or ''}`"))
    lines += [
        "FullKV's accuracy on a pilot of the held-out samples decides, before any plan is judged, which tasks stay "
        "in the verdict (the study's competence rule, searched and transfer tasks alike):",
        "",
        *markdown_table(("searches", "task", "FullKV accuracy", "judged", "pilot run"), accuracy_rows),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from polykv.eval.results.store import Store
    from polykv.files import atomic_write_text
    from polykv.search.workload.verdict import rejudge

    parser = argparse.ArgumentParser(description="One page over several workload searches (report.json folders).")
    parser.add_argument("folders", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reading", type=Path, help="a Markdown file: what the numbers show, in a person's words")
    args = parser.parse_args(argv)
    reading = args.reading.read_text(encoding="utf-8") if args.reading else ""
    runs, stores = [], {}
    for folder in args.folders:
        report = WorkloadReport.load(folder / "report.json")
        stores[folder.name] = Store(results_path(folder), readonly=True)
        runs.append((folder.name, rejudge(report, stores[folder.name]), folder))
    atomic_write_text(args.out, summary(runs, args.out, stores, reading))
    return 0


if __name__ == "__main__":
    from polykv.errors import script_exit

    raise SystemExit(script_exit(main))

"""A leaderboard (`LeaderboardData`) as a Markdown page: per metric, the methods by budget with their contrasts
against each reference, then every contrast's test in full (the page names the database that holds its runs)."""

from __future__ import annotations

from pathlib import Path

from polykv.eval.experiments.report import BoardContrast, BoardEntry, LeaderboardData
from polykv.eval.statistics.contrast import direction
from polykv.eval.statistics.render import format_p, interval

SHORT = {"better": "better", "worse": "worse", "no significant difference": "n.s."}


def _num(value: float | None, spec: str = ".3f") -> str:
    return "n/e" if value is None else format(value, spec)


def _versus(entry: BoardEntry, reference: str, metric: str) -> BoardContrast | None:
    return next((c for c in entry.versus if c.reference == reference and c.metric == metric), None)


def _cell(contrast: BoardContrast | None) -> str:
    if contrast is None:
        return "(reference)"
    test = contrast.sample
    unequal = ", unequal KV" if contrast.equal_kv is False else ""
    return (
        f"{test.difference:+.3f} ({SHORT[contrast.verdict]}, p_H {format_p(contrast.p_holm)}, MDE {_num(test.mde)}"
        f"{unequal})"
    )


def _held(entry: BoardEntry) -> str:
    if entry.kv_entering is None:
        return "not measured"
    share = "" if entry.kv_share is None else f" ({entry.kv_share:.1%})"
    return f"{entry.kv_entering:,.0f}{share}"


def _kv_section(data: LeaderboardData, entries: dict) -> list[str]:
    """The KV each plan held entering the answer, measured from its cache, by method and budget."""
    if all(e.kv_entering is None for e in data.entries):
        return [
            "KV held entering the answer: not measured (these runs predate PolyKV's measurement); each plan holds its "
            "capacity in every layer, or its rule's split of the same total, plus the question where it is kept "
            "in full, as far as a layer's window allows.",
            "",
        ]
    lines = [
        f"### KV held entering the answer, measured (token-layers per KV head, mean over the samples; share of "
        f"FullKV's: {_held(data.full)})",
        "",
        'A contrast between plans whose measured KV differ by more than 1% says "unequal KV" in its cell.',
        "",
        "| method | " + " | ".join(str(b) for b in data.budgets) + " |",
        "|---|" + "---|" * len(data.budgets),
    ]
    for method in data.methods:
        lines.append(f"| `{method}` | " + " | ".join(_held(entries[method, b]) for b in data.budgets) + " |")
    return [*lines, ""]


def contrast_table(labelled: list[tuple[str, BoardEntry]], first: str = "method") -> list[str]:
    """Every contrast of the entries in full, each row led by its entry's label (the column `first`)."""
    lines = [
        "### Every contrast",
        "",
        f"| {first} | budget | reference | metric | difference | 95% interval | p | p_H | family | MDE | samples "
        "(differ) | W/T/L | verdict | run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, e in labelled:
        for c in e.versus:
            s = c.sample
            lines.append(
                f"| {label} | {e.budget} | {c.reference} | {c.metric} | {s.difference:+.4f} | "
                f"{interval(s.low, s.high)} | {format_p(s.p)} | {format_p(c.p_holm)} | "
                f"{c.family} | {_num(s.mde, '.4f')} | {s.samples} ({s.differing}) | {c.wins}/{c.ties}/{c.losses} | "
                f"{c.verdict} | `{e.run}` |"
            )
    return lines


def leaderboard_markdown(data: LeaderboardData, database: Path | str) -> str:
    entries = {(e.method, e.budget): e for e in data.entries}
    lines = [
        f"## {len(data.methods)} methods alone, {data.scope} scope, question {data.question}",
        "",
        f"Budgets (tokens per layer) {', '.join(map(str, data.budgets))}; samples per task: "
        + ", ".join(f"{task} {n}" for task, n in data.samples.items())
        + f" ({sum(data.samples.values())} in all); database `{database}`. "
        + "Each contrast is the method minus the reference at the same budget over the paired samples (sign-flip "
        + "test; p_H: Holm-adjusted over its family, every method and budget against one reference in one metric; "
        + "verdicts at family-wise 5%; the 95% intervals are the test's, not adjusted).",
        "",
    ]
    natives = sorted({e.method for e in data.entries if e.allocation == "native"})
    if natives:
        lines += [f"{', '.join(natives)} split each budget over the layers by their own rule (native allocation).", ""]
    lines += _kv_section(data, entries)
    for metric in data.metrics:
        better = "lower" if direction(metric) < 0 else "higher"
        full = data.full.means.get(metric)
        lines += [f"### {metric} ({better} is better; FullKV {_num(full)})", ""]
        header = ["method", *[f"{b}" for b in data.budgets]]
        for reference in data.references:
            header += [f"vs {reference} @{b}" for b in data.budgets]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        middle = data.budgets[len(data.budgets) // 2]
        sign = 1 if better == "lower" else -1
        order = sorted(data.methods, key=lambda m: sign * (entries[m, middle].means.get(metric) or 0.0))
        for method in order:
            row = [f"`{method}`", *[_num(entries[method, b].means.get(metric)) for b in data.budgets]]
            for reference in data.references:
                row += [_cell(_versus(entries[method, b], reference, metric)) for b in data.budgets]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines += contrast_table([(f"`{e.method}`", e) for e in data.entries])
    lines += ["", f"FullKV: run `{data.full.run}`.", ""]
    if data.question_dependence:
        lines += _question_section(data)
    return "\n".join(lines)


def _question_section(data: LeaderboardData) -> list[str]:
    first = data.question_dependence[0]
    lines = [
        f"### The question {data.question} against {first.other_question}",
        "",
        f"Each plan against itself under the other protocol on the same samples ({first.metric}, {data.question} "
        f"minus {first.other_question}; Holm over the {first.family} evicting plans, FullKV the control). Not only "
        "the question's place differs: after compression the question is kept in full beside the budget, in the "
        "prompt it is compressed with the context.",
        "",
        f"| method | budget | {data.question} | {first.other_question} | difference | p | p_H | MDE | W/T/L | verdict "
        f"| {first.other_question} run |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(data.question_dependence, key=lambda c: c.sample.difference):
        lines.append(
            f"| `{c.method}` | {c.budget if c.budget is not None else '-'} | {_num(c.here)} | {_num(c.other)} | "
            f"{c.sample.difference:+.4f} | {format_p(c.sample.p)} | {format_p(c.p_holm)} | {_num(c.sample.mde, '.4f')} "
            f"| {c.wins}/{c.ties}/{c.losses} | {c.verdict} | `{c.run}` |"
        )
    return [*lines, ""]

"""The allocation study (`AllocationData`) as a Markdown page: per budget, each scorer's splits with their measured
KV and their contrasts, the rule each scorer's calibration chose, the searches, then every contrast in full."""

from __future__ import annotations

from pathlib import Path

from polykv.eval.experiments.allocation import CONTENDERS, AllocationData, AllocationEntry
from polykv.eval.experiments.leaderboard_page import _cell, _held, _num, contrast_table

WHAT = {
    "uniform": "the same capacity in every layer",
    "pyramid": "PyramidKV's layer rule",
    "squeeze": "SqueezeAttention's three groups, by attention similarity on calibration text",
    "ppl": "proportional to the profile's per-layer PPL sensitivity",
    "cake": "CAKE's preference, decided at prefill from each prompt",
    "adakv": "uniform layers, Ada-KV's split over each layer's KV heads (safeguard 0.2)",
    "adakv+best": "the calibration's best layer rule with Ada-KV's head split",
    "searched": "a capacity-only search (transfers between layers, the scorer fixed) on the calibration samples",
}


def allocation_markdown(data: AllocationData, database: Path | str) -> str:
    entries = {(e.method, e.contender, e.budget): e for e in data.entries}
    lines = [
        f"## Allocation: {', '.join(data.scorers)} under {len(data.contenders)} splits, prefill, question "
        f"{data.question}",
        "",
        f"Budgets (tokens per layer) {', '.join(map(str, data.budgets))}; samples per task: "
        + ", ".join(f"{task} {n}" for task, n in data.samples.items())
        + f" ({sum(data.samples.values())} in all), {data.calibration_samples} calibration samples apart from them; "
        + f"database `{database}`. FullKV {data.metric} {_num(data.full.means.get(data.metric))}, KV held "
        + f"{_held(data.full)}. Each contrast is the contender minus its reference with the same scorer and budget "
        + "over the paired samples (sign-flip test; p_H: Holm over its family: the primary, every rule against "
        + "uniform; the secondary, adakv+best against its layer rule and searched against uniform and the best "
        + 'rule; verdicts at family-wise 5%). "unequal KV": the two held more than 1% apart, measured.',
        "",
        "| split | what it is |",
        "|---|---|",
        *[f"| {c} | {WHAT[c]} |" for c in data.contenders],
        "",
    ]
    for budget in data.budgets:
        lines += [
            f"### Budget {budget} ({data.metric}, {'lower' if data.direction < 0 else 'higher'} is better)",
            "",
            "| scorer | split | " + data.metric + " | KV held (share of FullKV's) | vs uniform | vs best rule |",
            "|---|---|---|---|---|---|",
        ]
        for scorer in data.scorers:
            for contender in CONTENDERS:
                e = entries.get((scorer, contender, budget))
                if e is not None:
                    lines.append(_row(e, data.best_rule.get(f"{scorer}@{budget}")))
        lines.append("")
    if data.calibration:
        lines += _calibration_section(data)
    lines += contrast_table([(f"`{e.method}` {e.contender}", e) for e in data.entries], "contender")
    lines += ["", f"FullKV: run `{data.full.run}`.", ""]
    return "\n".join(lines)


def _row(e: AllocationEntry, best: str | None) -> str:
    uniform = next((c for c in e.versus if c.reference == "uniform"), None)
    versus_best = next((c for c in e.versus if c.reference == "best rule"), None)
    first = "(reference)" if e.contender == "uniform" else _cell(uniform) if uniform else ""
    chosen = " (best on calibration)" if e.contender == best else ""
    if e.contender == "adakv+best" and best == "uniform":
        chosen = " (the best rule is uniform: the same plan as adakv)"
    if e.shrunk_params:
        chosen += f" ({e.method} with {e.shrunk_params}: the contrast changes it too)"
    return (
        f"| `{e.method}` | {e.contender}{chosen} | {_num(e.means.get('answer_nll'))} | {_held(e)} | {first} | "
        f"{_cell(versus_best) if versus_best else ''} |"
    )


def _calibration_section(data: AllocationData) -> list[str]:
    rules = list(next(iter(data.calibration.values())))
    lines = [
        f"### What the calibration samples chose ({data.calibration_samples} samples, {data.metric})",
        "",
        "| scorer@budget | " + " | ".join(rules) + " | best |",
        "|---|" + "---|" * (len(rules) + 1),
    ]
    for name, values in data.calibration.items():
        lines.append(f"| {name} | " + " | ".join(_num(values[r]) for r in rules) + f" | {data.best_rule[name]} |")
    if data.searches:
        lines += [
            "",
            "| search | kept going from | accepted moves | executions | calibration value |",
            "|---|---|---|---|---|",
        ]
        for s in data.searches:
            moves = "; ".join(s.moves) or "none"
            lines.append(f"| {s.scorer}@{s.budget} | {s.start} | {moves} | {s.evaluations} | {_num(s.calibration)} |")
    return [*lines, ""]

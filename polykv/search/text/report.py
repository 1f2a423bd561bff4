"""The text search's report (`polykv.search.text.run` makes it): its typed models, one contrast of its held-out
verdict, and its Markdown.

`SearchReport` is what `report.json` holds: per budget (`TextBudget`) the search's record, the searched plan,
TopRank and the best homogeneous plan, every homogeneous plan's objective on the search sequences, and the
held-out verdict (`HeldOutVerdict`: each plan's means and per-sequence scores, and the pairwise contrasts, a
paired percentile bootstrap over sequences: KL and top-1 as differences, perplexity as a log-ratio, reported as the
ratio A / B of geometric means). A saved report reads back into the same models (`SearchReport.load`).

`markdown(report)` renders it, and `python -m polykv.search.text.report REPORT.json --out docs/search.md` writes
that file from a saved report.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from polykv.eval.statistics.render import interval, markdown_table
from polykv.plan import Plan
from polykv.search.report_parts import (
    Count,
    Machine,
    ProfileRef,
    ReportData,
    SavedPlan,
    SavedReport,
    SearchRecord,
)

FORMAT = "polykv.search-report"
VERSION = 1
ROLES = ("searched", "toprank", "homogeneous")
CONTRASTS = (("searched", "toprank"), ("searched", "homogeneous"), ("toprank", "homogeneous"))
METRICS = ("kl", "top1", "ppl")


# ---- the report's models ---------------------------------------------------------------------------------
class SequenceScores(ReportData):
    kl: float
    top1: float
    nll: float


class HeldOutPlan(ReportData):
    """One role's plan on the held-out sequences: its means (perplexity: the geometric mean) and every score."""

    name: str
    kl: float
    top1: float
    ppl: float
    per_sequence: list[SequenceScores]


class HeldOutContrast(ReportData):
    """A - B on the held-out sequences (`held_out_contrast`): the difference and its 95% interval (perplexity,
    `log`: also as the ratio A / B), wins, ties and losses of A, and the verdict."""

    a: str
    b: str
    metric: str
    log: bool
    difference: float
    low: float
    high: float
    wins: Count
    ties: Count
    losses: Count
    replicates: Count
    ratio: float | None = None  # perplexity only
    ratio_low: float | None = None
    ratio_high: float | None = None
    verdict: str


class HeldOutVerdict(ReportData):
    """Plans scored on the held-out sequences (role -> `HeldOutPlan`) and their pairwise contrasts."""

    sequences: Count
    plans: dict[str, HeldOutPlan]
    fullkv_ppl: float
    contrasts: list[HeldOutContrast] = Field(default_factory=list)


class TextBudget(ReportData):
    """The search at one budget: its record, the searched plan (with its provenance), TopRank, the best homogeneous
    plan (chosen on the search sequences among `homogeneous_scores`) and the held-out verdict."""

    budget: Count
    seconds: float
    search: SearchRecord
    plan: SavedPlan
    toprank: SavedPlan
    homogeneous: SavedPlan
    homogeneous_scores: dict[str, float]  # every homogeneous plan's objective on the search sequences
    selection_evaluations: Count  # executions spent choosing the best homogeneous plan
    verdict: HeldOutVerdict


class SequenceSet(ReportData):
    """The search or the held-out sequences: how many, of how many tokens, drawn how, and their fingerprint."""

    count: Count
    tokens: Count
    split: str
    seed: Count
    sources: list[str]
    fingerprint: str


class SequencesRecord(ReportData):
    continuation: Count
    search: SequenceSet
    held_out: SequenceSet

    @classmethod
    def of(cls, sequences) -> SequencesRecord:
        """The record of a `polykv.search.objective.SearchSequences`."""

        def part(corpus: Mapping[str, Any]) -> SequenceSet:
            spec = corpus["spec"]
            return SequenceSet(
                count=corpus["num_sequences"],
                tokens=corpus["sequence_length"],
                split=spec["split"],
                seed=spec["seed"],
                sources=spec["sources"],
                fingerprint=corpus["fingerprint"],
            )

        search, held_out = part(sequences.search_corpus), part(sequences.held_out_corpus)
        return cls(continuation=sequences.continuation, search=search, held_out=held_out)


class SearchReport(SavedReport):
    """The search at every budget on one pair of sequence sets (`polykv.search.text.run.build_report`)."""

    FORMAT = FORMAT
    VERSION = VERSION
    WHAT = "search report"

    format: Literal["polykv.search-report"]
    version: Count
    model: str
    scope: str
    metric: str
    statistic: str
    seed: Count
    evaluations: Count
    candidates: Count
    budgets: list[TextBudget]
    profile: ProfileRef
    sequences: SequencesRecord
    command: str = ""
    created: str
    machine: Machine
    seconds: float
    first_candidate_seconds: float | None = None  # start-up, model load included (`polykv search`'s clock)


def held_out_contrast(
    a: str, b: str, metric: str, scores: Mapping[str, Mapping[str, float]], seed: int
) -> dict[str, Any]:
    """A - B in `metric` over the held-out sequences (`scores`: role -> sequence -> score), as `HeldOutContrast`'s
    fields: the paired bootstrap over sequences (`polykv.eval.comparing.compare.paired`, 10,000 replicates)."""
    from polykv.eval.comparing.compare import paired

    log = metric == "ppl"
    result = paired(scores[a], scores[b], metric, seed=seed, log=log)
    out = {
        "a": a,
        "b": b,
        "metric": metric,
        "log": log,
        "difference": result.difference,
        "low": result.low,
        "high": result.high,
        "wins": result.wins,
        "ties": result.ties,
        "losses": result.losses,
        "replicates": result.replicates,
    }
    if log:
        out["ratio"], out["ratio_low"], out["ratio_high"] = result.ratio()
    out["verdict"] = result.verdict()  # the paired bootstrap's interval over sequences
    return out


# ---- Markdown -----------------------------------------------------------------------------------------
def _cells(plan: Plan) -> str:
    parts = []
    for i, layer in enumerate(plan.layers):
        cells = [(layer[p].method, layer[p].capacity) for p in plan.scope.phases]
        parts.append(f"L{i} " + " / ".join(f"{m}@{'-' if c is None else c}" for m, c in cells))
    return ", ".join(parts)


def difference_text(c: HeldOutContrast) -> str:
    """A contrast's A - B and its interval (perplexity: the ratio A / B)."""
    if c.log:
        return f"x{c.ratio:.4f} [x{c.ratio_low:.4f}, x{c.ratio_high:.4f}]"
    return f"{c.difference:+.5f} {interval(c.low, c.high, '+.5f')}"


def markdown(report: SearchReport | Mapping[str, Any]) -> str:
    """The report (or its saved JSON) as Markdown: held-out means and contrasts per budget, the search and its
    trace."""
    if not isinstance(report, SearchReport):
        report = SearchReport.from_dict(report)
    seq = report.sequences
    s, h = seq.search, seq.held_out
    budgets = ", ".join(str(b.budget) for b in report.budgets)
    lines = [
        "# Searching for a better plan, with held-out proof",
        "",
        f"Model `{report.model}`, scope `{report.scope}`, budgets {budgets} "
        f"(average capacity per layer; every active phase keeps exactly L x b tokens). Objective: mean "
        f"{report.metric.upper()}(FullKV || plan) over {seq.continuation} teacher-forced continuation steps, "
        f"the plan really executed. Moves ranked by profile `{report.profile.key}` ({report.statistic}); "
        f"evaluation budget {report.evaluations} plan executions (one plan on one sequence) per budget, "
        f"{report.candidates} candidates per round, seed {report.seed}.",
        "",
        f"Search sequences: {s.count} of {s.tokens} tokens, split `{s.split}`, seed {s.seed} "
        f"(fingerprint `{s.fingerprint[:12]}`). Held-out sequences: {h.count} of {h.tokens} tokens, split "
        f"`{h.split}`, seed {h.seed} (fingerprint `{h.fingerprint[:12]}`); no held-out sequence, nor its "
        f"scored tail, appears among the search sequences (checked). Sources: {', '.join(s.sources)}.",
        "",
        "Generated from a real run by",
        "",
        "```bash",
        report.command or "polykv search ...",
        "```",
        "",
        f"on {report.created}, {report.machine.platform}, {report.machine.cpus} CPUs; wall time "
        f"{report.seconds / 60:.1f} min in all ("
        + ", ".join(f"b={b.budget}: {b.seconds / 60:.1f} min" for b in report.budgets)
        + ").",
        "",
        "The best homogeneous plan is chosen on the search sequences (never on the held-out ones) among every "
        "method of the scope in every layer at the same budget (fixed, and native where the method has its own "
        "layer rule). TopRank: the profile's per-layer winner, uniform capacities. Intervals: 95% paired "
        "bootstrap over the held-out sequences (10,000 replicates); perplexity is compared as a ratio of "
        "geometric means.",
        "",
        "## Verdict",
        "",
    ]
    for b in report.budgets:
        v = b.verdict
        words = []
        for c in v.contrasts:
            if c.metric == report.metric and c.a == "searched":
                words.append(f"vs {c.b} {difference_text(c)}: {c.verdict}")
        r = b.search
        fitted = {  # the same plans' objective on the search sequences: how much of the gain held out
            "searched": r.objective,
            "toprank": r.starts.get(b.toprank.name),
            "homogeneous": b.homogeneous_scores.get(b.homogeneous.name),
        }
        held = {role: getattr(v.plans[role], report.metric) for role in fitted}
        lines.append(
            f"- b = {b.budget}, {report.metric} on {v.sequences} held-out sequences: "
            + "; ".join(words)
            + ". Objective on the search sequences / held out: "
            + ", ".join(f"{role} {fitted[role]:.5f} / {held[role]:.5f}" for role in fitted if fitted[role] is not None)
            + "."
        )
    for b in report.budgets:
        lines += _budget_lines(b)
    return "\n".join(lines) + "\n"


def _budget_lines(b: TextBudget) -> list[str]:
    v, r = b.verdict, b.search
    lines = [
        "",
        f"## Budget {b.budget}",
        "",
        f"Held-out ({v.sequences} sequences; FullKV perplexity {v.fullkv_ppl:.3f}):",
        "",
    ]
    lines += markdown_table(
        ("role", "plan", "KL", "top-1", "perplexity"),
        [(role, f"`{p.name}`", f"{p.kl:.5f}", f"{p.top1:.4f}", f"{p.ppl:.4f}") for role, p in v.plans.items()],
    )
    lines += ["", "Differences A - B (perplexity: ratio A / B), 95% paired bootstrap CI over sequences:", ""]
    lines += markdown_table(
        ("A", "B", "metric", "A - B [95% CI]", "wins / ties / losses of A", "A is"),
        [(c.a, c.b, c.metric, difference_text(c), f"{c.wins} / {c.ties} / {c.losses}", c.verdict) for c in v.contrasts],
    )
    starts = ", ".join(f"`{name}` {value:.5f}" for name, value in r.starts.items())
    homog = sorted(b.homogeneous_scores.items(), key=lambda kv: kv[1])
    lines += [
        "",
        f"Search: started from `{r.start}` (objective on the search sequences: {starts}); {r.rounds} rounds, "
        f"{r.evaluations} executions (stopped: {r.stopped}), plus {b.selection_evaluations} to choose "
        f"the best homogeneous plan ({', '.join(f'`{n}` {x:.5f}' for n, x in homog[:4])}, ...). "
        f"Final objective {r.objective:.5f}; moves taken: " + ("; ".join(m.text for m in r.moves) or "none") + ".",
        "",
        f"Searched plan `{b.plan.name}`: {_cells(b.plan)}.",
        "",
        f"TopRank `{b.toprank.name}`: {_cells(b.toprank)}.",
        "",
        "Trace (executions used, incumbent objective on the search sequences, event):",
        "",
    ]
    points = [t for t in r.trace if t.event != "rejected"]
    lines += markdown_table(
        ("executions", "objective", "event", "move"),
        [(t.evaluations, f"{t.objective:.5f}", t.event, t.move or "") for t in points],
    )
    rejected = sum(t.event == "rejected" for t in r.trace)
    lines.append(f"\n({rejected} rounds ended with the best candidate rejected; every round is in the JSON.)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a search report's Markdown from its saved JSON.")
    parser.add_argument("report", type=Path, help="report.json written by `polykv search`")
    parser.add_argument("--out", type=Path, default=None, help="Markdown file (default: stdout)")
    args = parser.parse_args(argv)
    from polykv.files import atomic_write_text

    text = markdown(SearchReport.load(args.report))
    if args.out is None:
        print(text, end="")
    else:
        atomic_write_text(args.out, text)
    return 0


if __name__ == "__main__":
    from polykv.errors import script_exit

    raise SystemExit(script_exit(main))


__all__ = [
    "CONTRASTS",
    "FORMAT",
    "METRICS",
    "ROLES",
    "VERSION",
    "HeldOutContrast",
    "HeldOutPlan",
    "HeldOutVerdict",
    "SearchReport",
    "SequenceScores",
    "SequenceSet",
    "SequencesRecord",
    "TextBudget",
    "difference_text",
    "held_out_contrast",
    "markdown",
]

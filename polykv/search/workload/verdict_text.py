"""A workload verdict in words: one contrast as a line of the page (`contrast_line`: its difference and interval,
its test, the samples it rests on, the minimal detectable difference, W/T/L and the verdict, and "across
protocols" when its two plans act in different phases) or as a table row (`verdict_rows`, the CLI's table and the
app's), and the words the pages share for scopes and question protocols.
"""

from __future__ import annotations

from polykv.eval.statistics import render
from polykv.eval.statistics.render import NOT_ESTIMABLE, format_p, number
from polykv.eval.statistics.samples import NO_MDE_WHY, PERMUTATIONS, detectable
from polykv.search.workload.report import SampleContrast, WorkloadBudget

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
MDE_NOTE = f"{NOT_ESTIMABLE}: no minimal detectable difference ({NO_MDE_WHY})."
VERDICT_HEADER = ("family", "kind", "A - B", "same scope", "metric", "difference [95% CI]", "p", "MDE", "W/T/L", "A is")


def interval(c: SampleContrast) -> str:
    """The interval that agrees with the test; an unbounded side when the test can reject no shift there."""
    return render.interval(c.low, c.high)


def test_text(c: SampleContrast) -> str:
    kind = "exact sign-flip" if c.exact else f"sign-flip ({PERMUTATIONS:,} random flips)"
    differ = "" if c.differing is None else f" ({c.differing} differ)"
    return f"{kind} p = {format_p(c.p)} over {c.samples} samples in {c.tasks} tasks{differ}"


def contrast_line(entry: WorkloadBudget, c: SampleContrast) -> str:
    """A verdict in one line: the difference, its interval, the test, the MDE, W/T/L, the verdict, and whether the
    two plans act in the same phases."""
    line = (
        f"{number(c.difference, '+.4f')} {interval(c)}, {test_text(c)}, MDE {detectable(c.mde, '.4g')}, "
        f"W/T/L {c.wins}/{c.ties}/{c.losses}: **{c.verdict}**"
    )
    if not c.agrees:
        line += " (the interval and the exact test disagree at the level: the interval comes from random flips)"
    if not c.matched:
        line += (
            f"; across protocols: {c.a} acts in {SCOPE_WORDS[entry.scope_of(c.a)]}, {c.b} in "
            f"{SCOPE_WORDS[entry.scope_of(c.b)]}"
        )
    return line


def verdict_rows(entry: WorkloadBudget) -> list[tuple[str, ...]]:
    """One row per family and contrast of one budget (the CLI's table and the page's), under `VERDICT_HEADER`."""
    rows = []
    for family, data in entry.verdict.items():
        for c in data.contrasts:
            rows.append(
                (
                    family,
                    c.kind,
                    f"{c.a} - {c.b}",
                    "yes" if c.matched else "no",
                    c.metric,
                    f"{number(c.difference, '+.4f')} {interval(c)}",
                    format_p(c.p),
                    detectable(c.mde, ".4g", short=True),
                    f"{c.wins}/{c.ties}/{c.losses}",
                    c.verdict,
                )
            )
    return rows


__all__ = [
    "MDE_NOTE",
    "METRIC_WORDS",
    "PAPER_OPEN",
    "SCOPE_WORDS",
    "VERDICT_HEADER",
    "contrast_line",
    "interval",
    "test_text",
    "verdict_rows",
]

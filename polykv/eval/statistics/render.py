"""Numbers as every report and page prints them: statistics, intervals, p-values, detectable differences,
ratios and Markdown tables.

A statistic that has no value (NaN or infinite as computed, None as saved: Spearman over one placement, the
minimal detectable difference where too few samples differ) is printed as "not estimable", the one word for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeGuard

NOT_ESTIMABLE = "not estimable"


def estimable(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value)


def number(value: float | None, spec: str = ".4f") -> str:
    """`value` formatted by `spec`, or "not estimable"."""
    return format(value, spec) if estimable(value) else NOT_ESTIMABLE


def interval(low: float | None, high: float | None, spec: str = "+.4f", bounded: bool = False) -> str:
    """ "[low, high]"; a side the test bounds nowhere (None or infinite) reads -inf or +inf; "not estimable" when a
    side could not be computed (NaN; None too where the interval is `bounded`, a bootstrap's, whose reports keep
    a NaN as None)."""
    if any((side is None and bounded) or (side is not None and math.isnan(side)) for side in (low, high)):
        return NOT_ESTIMABLE
    low_text = format(low, spec) if estimable(low) else "-inf"
    high_text = format(high, spec) if estimable(high) else "+inf"
    return f"[{low_text}, {high_text}]"


def _decimals(low: float, high: float) -> int | None:
    """Decimals that show an interval's width to 2 significant digits and its largest end to at least 2;
    None when fixed-point would be unreadable (ends of a million or more, or below 1e-6)."""
    size = max(abs(low), abs(high))
    if not (math.isfinite(size) and size < 1e6):
        return None
    if size == 0:
        return 0
    width = high - low
    places = 1 - math.floor(math.log10(size))
    if width > 0:
        places = max(places, 1 - math.floor(math.log10(width)))
    return max(0, places) if places <= 6 else None


def signed(value: float, low: float, high: float) -> str:
    """`value` (+/- signed) at the precision of the interval [low, high]: "+0.025", "-12", "+1583"."""
    places = _decimals(min(low, value), max(high, value))
    return f"{value:+.3g}" if places is None else f"{value:+.{places}f}"


def interval_text(low: float, high: float) -> str:
    """An interval at a precision its width deserves: "[-12, +1583]", "[-0.05, +0.10]" (no exponents
    below a million)."""
    return f"[{signed(low, low, high)}, {signed(high, low, high)}]"


def ratio_text(ratio: float) -> str:
    """A ratio A / B as "×1.12" (3 significant digits)."""
    return f"×{ratio:.3g}"


def format_p(p: float | None) -> str:
    """A p-value: four decimals, or two significant digits below 0.0001 (an exact p can be that small)."""
    if not estimable(p):
        return NOT_ESTIMABLE
    return f"{p:.4f}" if p >= 1e-4 else f"{p:.2g}"


def detectable(mde: float | None, spec: str = ".3g", why: str = "") -> str:
    """A minimal detectable difference: the number, or "not estimable" (and `why`, when given)."""
    if estimable(mde):
        return format(mde, spec)
    return f"{NOT_ESTIMABLE} ({why})" if why else NOT_ESTIMABLE


def markdown_table(header: Sequence[Any], rows: Sequence[Sequence[Any]], floats: str = "{:.4f}") -> list[str]:
    """A Markdown table's lines; a "|" in a cell is escaped, a float printed by `floats`, a missing one empty."""

    def cell(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, float):
            return floats.format(value) if math.isfinite(value) else ""
        return str(value).replace("|", "\\|").replace("\n", " ")

    return [
        "| " + " | ".join(cell(h) for h in header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(cell(value) for value in row) + " |" for row in rows),
    ]


__all__ = [
    "NOT_ESTIMABLE",
    "detectable",
    "estimable",
    "format_p",
    "interval",
    "interval_text",
    "markdown_table",
    "number",
    "ratio_text",
    "signed",
]

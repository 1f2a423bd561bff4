"""Text that reaches a terminal: names that hold no control characters, and what PolyKV prints from a file
or a database escaped, so that one row is one line and reads as it is stored.

A control character (ESC starts a terminal's escape sequences, a newline forges a row) or a
bidirectional control (U+202E and its kin reorder what follows on the line) has no place in a name.
"""

from __future__ import annotations

import math
import unicodedata

# Unicode's bidirectional embedding, override, isolate and mark characters.
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _unsafe(char: str) -> bool:
    return char in BIDI_CONTROLS or unicodedata.category(char) == "Cc"


def control_characters(text: str, allowed: str = "") -> list[str]:
    """The control and bidirectional characters in `text` (those in `allowed` aside), as U+XXXX."""
    return [f"U+{ord(c):04X}" for c in dict.fromkeys(text) if _unsafe(c) and c not in allowed]


def check_text(text: str, allowed: str = "") -> str:
    """`text` itself; ValueError (one line, for a validator) when it holds a control character."""
    found = control_characters(text, allowed)
    if found:
        raise ValueError(f"must not hold control characters (found {', '.join(found[:3])})")
    return text


def printable(text: str) -> str:
    """`text` with every control and bidirectional character written as its escape (\\n, \\x1b, \\u202e)."""
    if not any(_unsafe(c) for c in text):
        return text
    return "".join(c.encode("unicode_escape").decode("ascii") if _unsafe(c) else c for c in text)


def whole_number(text: str, most_digits: int = 12) -> int | None:
    """`text` as an int when it is ASCII digits only (at most `most_digits` of them), else None: Python's
    isdigit() also says yes to '²' and to other scripts' digits, which int() then refuses or reads."""
    if text.isascii() and text.isdigit() and len(text) <= most_digits:
        return int(text)
    return None


_YEAR_S = 365 * 24 * 3600


def duration(seconds: float) -> str:
    """A duration as people say it: `45 s`, `3 min 5 s`, `2 h 10 min`; past a year (or not a number: a damaged
    record), `over a year`."""
    if not math.isfinite(seconds) or seconds > _YEAR_S:
        return "over a year" if seconds > 0 else "0 s"
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"

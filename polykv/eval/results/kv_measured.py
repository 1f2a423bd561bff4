"""The KV a run's plan actually held, measured from its cache (`RoutedCache.kv_held`, stored with each sample):
per layer, the mean over the run's samples of the slots held per KV head entering the answer and at the end,
beside what FullKV holds on the same samples (every token seen; a local layer at most its window less one).

Measured, not computed from the plan: a native allocation's split, a local layer's window, a question kept in
full and a method that keeps fewer than its capacity all show as they ran."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polykv.eval.results.rows import SampleRow
from polykv.kv_memory import KVHeld, window_bound

MEASURED_TOLERANCE = 0.01  # two plans whose measured KV differ by more than this share do not hold equal KV


@dataclass(frozen=True)
class MeasuredKV:
    """A run's measured KV, per layer (mean slots per KV head over `samples` samples)."""

    samples: int
    entering: list[float]
    end: list[float]
    fullkv_entering: float | None = None  # token-layers FullKV holds on the same samples (None: windows unknown)
    fullkv_end: float | None = None
    # per layer, each KV head's mean tokens entering the answer where the heads held different numbers (a head-level
    # split, `head_allocation: adakv`), else None
    heads_entering: list[list[float] | None] | None = None

    @property
    def total_entering(self) -> float:
        return sum(self.entering)

    @property
    def total_end(self) -> float:
        return sum(self.end)


def measured_kv(rows: Sequence[SampleRow], windows: Sequence[int | None] | None = None) -> MeasuredKV | None:
    """The mean over `rows` that carry a measurement (None when none does); FullKV's totals when each layer's
    window is known (`windows`: None for a global layer; the list's length must be the plan's layer count)."""
    held = [row.kv_held for row in rows if row.kv_held]
    if not held:
        return None
    layers = len(held[0]["entering"])
    held = [h for h in held if len(h["entering"]) == layers]
    n = len(held)
    entering = [sum(h["entering"][i] for h in held) / n for i in range(layers)]
    end = [sum(h["end"][i] for h in held) / n for i in range(layers)]
    full_entering = full_end = None
    if windows is not None and len(windows) == layers:
        bounds = [window_bound(w) for w in windows]
        full_entering = sum(sum(min(h["seen_entering"], b) for b in bounds) for h in held) / n
        full_end = sum(sum(min(h["seen_end"], b) for b in bounds) for h in held) / n
    return MeasuredKV(n, entering, end, full_entering, full_end, _per_head(held, layers))


def _per_head(held: list[KVHeld], layers: int) -> list[list[float] | None] | None:
    """Each layer's per-head means over every sample, for the layers whose heads some sample held apart (None for
    the others); a sample whose heads held the same there counts its per-head value, `entering`, for each head."""
    if not any(h.get("heads_entering") for h in held):
        return None
    out: list[list[float] | None] = []
    for i in range(layers):
        apart = [split for h in held if (split := _heads_at(h, i))]
        if not apart:
            out.append(None)
            continue
        rows = [_heads_at(h, i) or [h["entering"][i]] * len(apart[0]) for h in held]
        out.append([sum(col) / len(rows) for col in zip(*rows)])
    return out


def _heads_at(held: KVHeld, layer: int) -> list[float] | None:
    """Each head's tokens in `layer` where the sample's heads held different numbers there, else None."""
    return (held.get("heads_entering") or [None] * (layer + 1))[layer]


def _share(held: float, full: float | None) -> str:
    return "" if not full else f", {held / full:.1%} of FullKV's {full:,.0f}"


def measured_line(kv: MeasuredKV, token_bytes: int | None = None) -> str:
    """One line: the token-layers (per KV head) held entering the answer and at the end, against FullKV's."""
    memory = "" if token_bytes is None else f" ({kv.total_entering * token_bytes / 2**20:,.1f} MiB)"
    return (
        f"KV held, measured (mean of {kv.samples} sample{'s' * (kv.samples != 1)}): entering the answer "
        f"{kv.total_entering:,.1f} token-layers{memory}{_share(kv.total_entering, kv.fullkv_entering)}; at the end "
        f"{kv.total_end:,.1f}{_share(kv.total_end, kv.fullkv_end)}"
    )


def layers_line(kv: MeasuredKV) -> str:
    """Each layer's mean slots entering the answer, in layer order."""
    return "per layer entering the answer: " + " ".join(f"{v:g}" if v == int(v) else f"{v:.1f}" for v in kv.entering)


def heads_line(kv: MeasuredKV) -> str | None:
    """Each layer's tokens per KV head entering the answer, where its heads held different numbers; else None."""
    if not kv.heads_entering:
        return None
    layers = [f"{i}: {'/'.join(f'{v:.0f}' for v in heads)}" for i, heads in enumerate(kv.heads_entering) if heads]
    return "per KV head entering the answer (layers whose heads differ): " + ", ".join(layers)


def equal_kv(a: MeasuredKV | None, b: MeasuredKV | None) -> bool | None:
    """Did the two hold the same KV entering the answer, within MEASURED_TOLERANCE of the larger? None: one of them
    was not measured."""
    if a is None or b is None:
        return None
    larger = max(a.total_entering, b.total_entering)
    return larger == 0 or abs(a.total_entering - b.total_entering) <= MEASURED_TOLERANCE * larger


def unequal_kv(a: MeasuredKV | None, b: MeasuredKV | None, names: tuple[str, str] = ("A", "B")) -> str | None:
    """A line when two runs' measured KV entering the answer differ by more than MEASURED_TOLERANCE of the larger
    (a contrast between them is then not at equal KV), or when one of them was not measured; else None."""
    if a is None and b is None:
        return None
    if a is None or b is None:
        missing = names[0] if a is None else names[1]
        return f"note: {missing}'s KV was not measured (a run from before PolyKV measured it), so equal KV is not shown"
    if equal_kv(a, b):
        return None
    change = a.total_entering / b.total_entering - 1 if b.total_entering else 0.0
    return (
        f"note: not at equal KV: entering the answer {names[0]} held {a.total_entering:,.1f} token-layers and "
        f"{names[1]} {b.total_entering:,.1f} ({change:+.1%} for {names[0]}), measured"
    )

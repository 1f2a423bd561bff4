"""The designer's small decisions, here so that the app's pages only draw: which phases a choice names, which
layers of a selection exist, which methods the palette offers and their shortcut keys, and what an edit says."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from polykv.methods import REGISTRY
from polykv.plan import Phase, Plan, Scope

PHASE_CHOICES = (Scope.BOTH.value, Phase.PREFILL.value, Phase.DECODE.value)  # what a paint applies to


def _phases_text(phases: Phase | str | Iterable[Phase | str]) -> str:
    if isinstance(phases, (Phase, str)):
        return Phase(phases).value if phases not in ("both", Scope.BOTH) else Scope.BOTH.value
    values = [Phase(p).value for p in phases]
    return Scope.BOTH.value if len(set(values)) == 2 else ", ".join(values)


def _phases(phases: Phase | str | Iterable[Phase | str]) -> tuple[Phase, ...]:
    if isinstance(phases, (Phase, str)):
        phases = Scope(phases).phases if phases in ("both", Scope.BOTH) else (Phase(phases),)
    return tuple(Phase(p) for p in phases)


def phase_values(choice: str) -> tuple[str, ...]:
    """The phases a choice of `PHASE_CHOICES` names: both phases for "both", else that one."""
    return tuple(p.value for p in _phases(choice))


def phase_choice(phases: Iterable[str]) -> str | None:
    """The `PHASE_CHOICES` entry for a set of selected phases: the phase when there is one, "both" when
    there are several, None (nothing to choose) when there are none."""
    phases = sorted(set(phases))
    if not phases:
        return None
    return phases[0] if len(phases) == 1 else Scope.BOTH.value


def layers_in(layers: Iterable[int], num_layers: int) -> list[int]:
    """The selected `layers` that exist in a plan of `num_layers` layers, in their order."""
    return [i for i in layers if 0 <= i < num_layers]


def palette(choice: str) -> list[tuple[str, str | None]]:
    """Every method, in registry order, with None when it can be painted onto the phase(s) of `choice`
    (a `PHASE_CHOICES` entry), else why not (the palette greys it and says this)."""
    phases = _phases(choice)
    entries = []
    for name, cls in REGISTRY.items():
        missing = [p.value for p in phases if p not in cls.phases]
        runs = " and ".join(p.value for p in Phase if p in cls.phases)
        why = f" ({cls.phase_refusal})" if cls.phase_refusal else ""
        entries.append((name, f"{name} runs only in the {runs} phase{why}" if missing else None))
    return entries


def shortcuts(names: Sequence[str]) -> dict[str, str]:
    """A one-key shortcut per name: its first letter or digit that is free (C and R are Streamlit's own)."""
    taken, keys = {"C", "R"}, {}
    for name in names:
        key = next((ch for ch in name.upper() if ch.isalnum() and ch not in taken), None)
        if key is not None:
            taken.add(key)
            keys[name] = key
    return keys


def scope_change(before: Plan, after: Plan) -> str | None:
    """The sentence announcing that an edit changed which phases the plan compresses, if it did."""
    if before.scope == after.scope:
        return None
    return f"The plan's scope changed from {before.scope.value} to {after.scope.value}."


def paint_message(layers: Sequence[int], phases: str, method: str | None, capacity: int | None) -> str:
    """What a successful `paint(plan, layers, phases, method, capacity)` did, in one sentence."""
    what = " ".join(part for part in (method, None if capacity is None else f"@{capacity}") if part)
    return f"Painted {what} onto layers {', '.join(map(str, layers))} ({phases})."

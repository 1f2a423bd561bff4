"""Editing plans by hand: paint a method and/or capacity onto chosen layers, edit a per-layer table,
compare two plans, and name plan files safely.

These are the plan designer's operations (the web app calls them; nothing here draws anything). Every
operation returns a new, validated `Plan` or raises `PlanError` with a one-line message; the plan it
started from is never changed, so a rejected edit loses nothing. Rescaling a plan to another budget is
`polykv.routing.scale_budget`; `rescale` is the designer's use of it (the plan keeps its name and
description). The rest are the designer's small decisions (which phases a choice names, what a paint
did, whether a save may overwrite), here so that the app's pages only draw.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pandas as pd

from polykv.errors import first_line
from polykv.files import parse_json
from polykv.methods import REGISTRY, for_phase, params_that_fit, validate_plan
from polykv.plan import FULL, Phase, Plan, PlanError, Scope
from polykv.text import check_text

if TYPE_CHECKING:
    from polykv.profile.store import Profile

TABLE_COLUMNS = [
    "layer",
    "prefill_method", "prefill_capacity", "prefill_params",
    "decode_method", "decode_capacity", "decode_params",
]  # fmt: skip
DEFAULT_CAPACITY = 64  # what a layer gets when a bounded method is painted on a `full` cell without a capacity
PHASE_CHOICES = (Scope.BOTH.value, Phase.PREFILL.value, Phase.DECODE.value)  # what a paint applies to
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
EDITED_SUFFIX = "-edited"  # added (once) to the name of a built plan when it is first edited by hand
MAX_EDITS = 200  # the provenance keeps the newest this many edit summaries
_NOT_BUILT = (None, "hand")  # `built_by` values of plans written by hand: their names stay as they are


# ---- provenance -------------------------------------------------------------------------------------
def _same_content(a: Plan, b: Plan) -> bool:
    """Whether two plans route the same way (layers, scope, allocation), whatever their names say."""
    return (a.layers, a.scope, a.allocation) == (b.layers, b.scope, b.allocation)


def record_edit(before: Plan, after: Plan, summary: str) -> Plan:
    """`after` (an edit of `before`) with `summary` appended to the provenance's "edits" list, the
    provenance of `before` (its `built_by`, ...) kept and marked `edited`. A built plan (from a profile,
    homogeneous, ...) edited for the first time gets the suffix "-edited" on its name (once). An edit
    that changed nothing returns `before` unchanged (nothing to record)."""
    if _same_content(before, after):
        return before
    provenance = dict(before.provenance)
    recorded = [*edits(before), " ".join(summary.split())]  # one line each
    provenance.update(edited=True, edits=recorded[-MAX_EDITS:])
    name = before.name
    if provenance.get("built_by") not in _NOT_BUILT and not name.endswith(EDITED_SUFFIX):
        name += EDITED_SUFFIX
    return after.model_copy(update={"provenance": provenance, "name": name})


def edits(plan: Plan) -> list[str]:
    """The edit summaries recorded in `plan`'s provenance, oldest first (none for an unedited plan)."""
    found = plan.provenance.get("edits")
    return [str(e) for e in found] if isinstance(found, list) else []


def _phases_text(phases: Phase | str | Iterable[Phase | str]) -> str:
    if isinstance(phases, (Phase, str)):
        return Phase(phases).value if phases not in ("both", Scope.BOTH) else Scope.BOTH.value
    values = [Phase(p).value for p in phases]
    return Scope.BOTH.value if len(set(values)) == 2 else ", ".join(values)


def _phases(phases: Phase | str | Iterable[Phase | str]) -> tuple[Phase, ...]:
    if isinstance(phases, (Phase, str)):
        phases = Scope(phases).phases if phases in ("both", Scope.BOTH) else (Phase(phases),)
    return tuple(Phase(p) for p in phases)


def _scope_of(layers: list[dict[str, dict[str, Any]]], fallback: Scope) -> Scope:
    """The phases in which some layer evicts; a plan that evicts nowhere keeps its old scope."""
    active = [p for p in Phase if any(layer[p.value]["method"] != FULL for layer in layers)]
    if len(active) == 2:
        return Scope.BOTH
    return Scope(active[0].value) if active else fallback


def _rebuild(plan: Plan, layers: list[dict[str, dict[str, Any]]], **changes: Any) -> Plan:
    data = plan.to_dict()
    data.update(layers=layers, scope=_scope_of(layers, plan.scope).value, **changes)
    return validate_plan(Plan.from_dict(data), plan.num_layers)


def _layer_dicts(plan: Plan) -> list[dict[str, dict[str, Any]]]:
    return [{p.value: layer[p].model_dump() for p in Phase} for layer in plan.layers]


def paint(
    plan: Plan,
    layers: Sequence[int],
    phases: Phase | str | Iterable[Phase | str],
    method: str | None = None,
    capacity: int | None = None,
) -> Plan:
    """`method` and/or `capacity` on `layers` in `phases`; the rest of the plan stays as it was.

    A new method gets its default parameters, with windows and sinks shrunk to fit the capacity (as in
    profiles); painting `full` removes the capacity. Painted capacities are explicit, so the plan's
    allocation becomes "fixed". The scope follows the phases in which some layer evicts."""
    if method is None and capacity is None:
        raise PlanError("paint: choose a method, a capacity, or both")
    if method is not None and method not in REGISTRY:
        raise PlanError(f"paint: unknown method {method!r} (known: {', '.join(REGISTRY)})")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
        raise PlanError(f"paint: capacity must be a positive integer (got {capacity!r})")
    bad = [i for i in layers if not 0 <= i < plan.num_layers]
    if bad:
        raise PlanError(f"paint: layer {bad[0]} does not exist (the plan has layers 0-{plan.num_layers - 1})")
    if not layers:
        raise PlanError("paint: select at least one layer")
    summary = f"painted {_what(method, capacity)} onto layers {', '.join(map(str, layers))} ({_phases_text(phases)})"
    phases = _phases(phases)
    new = _layer_dicts(plan)
    average = {p: plan.summary().phases[p].average_capacity for p in Phase}
    for i in layers:
        for phase in phases:
            cell = new[i][phase.value]
            name = method or cell["method"]
            if name == FULL:
                new[i][phase.value] = {"method": FULL, "capacity": None, "params": {}}
                continue
            if phase not in REGISTRY[name].phases:
                allowed = ", ".join(p.value for p in REGISTRY[name].phases)
                raise PlanError(f"paint: {name!r} does not run in the {phase.value} phase (it runs in: {allowed})")
            cap = capacity or cell["capacity"] or round(average[phase] or DEFAULT_CAPACITY)
            params = cell["params"] if name == cell["method"] else params_that_fit(name, cap)
            new[i][phase.value] = {"method": name, "capacity": cap, "params": params}
    return record_edit(plan, _rebuild(plan, new, allocation="fixed"), summary)


def _what(method: str | None, capacity: int | None) -> str:
    """ "h2o@40", "h2o" or "@40": what a paint put on the layers."""
    return f"{method or ''}{'' if capacity is None else f'@{capacity}'}"


# ---- the editable table ----------------------------------------------------------------------------
def to_table(plan: Plan) -> pd.DataFrame:
    """One row per layer: method, capacity and parameters (JSON) for each phase."""
    rows = []
    for i, layer in enumerate(plan.layers):
        row: dict[str, Any] = {"layer": i}
        for p in Phase:
            a = layer[p]
            row[f"{p.value}_method"] = a.method
            row[f"{p.value}_capacity"] = a.capacity
            row[f"{p.value}_params"] = json.dumps(a.params) if a.params else ""
        rows.append(row)
    frame = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    for p in Phase:
        frame[f"{p.value}_capacity"] = frame[f"{p.value}_capacity"].astype("Int64")
    return frame


def _cell_capacity(value: Any, where: str) -> int | None:
    if value is None or (not isinstance(value, str) and pd.isna(value)) or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise PlanError(f"{where}, capacity: not a number ({value!r})") from None
    if number != int(number) or number < 1:
        raise PlanError(f"{where}, capacity: must be a positive whole number of tokens (got {value!r})")
    return int(number)


def _cell_params(value: Any, where: str) -> dict[str, Any]:
    if value is None or (not isinstance(value, str) and pd.isna(value)) or not str(value).strip():
        return {}
    try:
        params = parse_json(str(value), error=PlanError)
    except PlanError as exc:
        raise PlanError(f'{where}, params: not JSON (write e.g. {{"window": 16}}): {exc}') from None
    if not isinstance(params, dict):
        raise PlanError(f'{where}, params: expected a JSON object such as {{"window": 16}}')
    return params


def from_table(plan: Plan, table: pd.DataFrame) -> Plan:
    """The plan with its layers read back from an edited `to_table` frame (same layers, same order)."""
    if len(table) != plan.num_layers:
        raise PlanError(f"table: {len(table)} rows but the plan has {plan.num_layers} layers")
    new = []
    for i, row in enumerate(table.to_dict("records")):
        layer = {}
        for p in Phase:
            where = f"layer {i}, {p.value}"
            method = str(row.get(f"{p.value}_method") or "").strip()
            if not method:
                raise PlanError(f"{where}, method: choose a method")
            capacity = _cell_capacity(row.get(f"{p.value}_capacity"), where)
            if method == FULL:
                capacity = None
            layer[p.value] = {
                "method": method,
                "capacity": capacity,
                "params": _cell_params(row.get(f"{p.value}_params"), where),
            }
        new.append(layer)
    old = _layer_dicts(plan)
    if new == old:
        return _rebuild(plan, new)
    return record_edit(plan, _rebuild(plan, new, allocation="fixed"), _table_summary(old, new))


def _table_summary(old: list[dict[str, dict[str, Any]]], new: list[dict[str, dict[str, Any]]], shown: int = 3) -> str:
    """One line naming the table's changed cells ("table: layer 2 decode capacity 32 -> 40; ..."), the
    first `shown` of them and how many more."""

    def text(field: str, value: Any) -> str:
        return json.dumps(value, sort_keys=True) if field == "params" else str(value)

    changes = [
        f"layer {i} {p.value} {field} {text(field, a[p.value][field])} -> {text(field, b[p.value][field])}"
        for i, (a, b) in enumerate(zip(old, new))
        for p in Phase
        for field in ("method", "capacity", "params")
        if a[p.value][field] != b[p.value][field]
    ]
    more = f" and {len(changes) - shown} more" if len(changes) > shown else ""
    return f"table: {'; '.join(changes[:shown])}{more}"


# ---- whole-plan operations -------------------------------------------------------------------------
def diff(a: Plan, b: Plan) -> pd.DataFrame:
    """Where two plans differ: plan-level fields first, then each (layer, phase) cell that changed."""
    rows = [
        {
            "where": field,
            "a": str(getattr(a, field).value if field == "scope" else getattr(a, field)),
            "b": str(getattr(b, field).value if field == "scope" else getattr(b, field)),
        }
        for field in ("scope", "allocation")
        if getattr(a, field) != getattr(b, field)
    ]
    if a.num_layers != b.num_layers:
        rows.append({"where": "layers", "a": str(a.num_layers), "b": str(b.num_layers)})
    for i, (la, lb) in enumerate(zip(a.layers, b.layers)):
        for p in Phase:
            if la[p] != lb[p]:
                rows.append({"where": f"layer {i} {p.value}", "a": str(la[p]), "b": str(lb[p])})
    return pd.DataFrame(rows, columns=["where", "a", "b"])


def plan_filename(name: str) -> str:
    """A safe file name for a plan called `name`: letters, digits, '.', '_' and '-' only, no path. A name
    with no ASCII letter or digit (e.g. 'план', '...') gets a stable generated one, `plan-<hash>.json`."""
    if not name.strip():
        raise PlanError("plan name: give the plan a name")
    try:
        check_text(name)
    except ValueError as exc:
        raise PlanError(f"plan name: {exc}") from None
    stem = _UNSAFE.sub("-", name.strip()).strip(".-")[:80]
    if not re.search(r"[A-Za-z0-9]", stem):
        stem = f"plan-{hashlib.sha256(name.strip().encode()).hexdigest()[:10]}"
    return stem if stem.endswith(".json") else f"{stem}.json"


# ---- the designer's choices -------------------------------------------------------------------------
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
        entries.append((name, f"{name} runs only in the {runs} phase" if missing else None))
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


def change_summary(before: Plan, after: Plan) -> str:
    """What turned `before` into `after`, in a few words (what Undo and Redo say they undid or redid): the edits
    `after` records beyond `before`'s, else the cells that differ and, when the name changed, the two names
    (a plan loaded, built or reset)."""
    old, new = edits(before), edits(after)
    if after.name in (before.name, before.name + EDITED_SUFFIX):  # an edit of `before` records one summary
        for kept in (len(old), len(old) - 1):  # the provenance keeps the newest MAX_EDITS: one may have dropped
            if kept >= 0 and len(new) == kept + 1 and new[:kept] == old[len(old) - kept :]:
                return new[-1]
    changed = diff(before, after)
    cells = int(changed["where"].str.startswith("layer ").sum())
    text = f"{cells} cell{'s' * (cells != 1)} changed" if cells else "no cell changed"
    return text + (f" ({before.name!r} -> {after.name!r})" if before.name != after.name else "")


def paint_message(layers: Sequence[int], phases: str, method: str | None, capacity: int | None) -> str:
    """What a successful `paint(plan, layers, phases, method, capacity)` did, in one sentence."""
    what = " ".join(part for part in (method, None if capacity is None else f"@{capacity}") if part)
    return f"Painted {what} onto layers {', '.join(map(str, layers))} ({phases})."


def table_methods(phase: Phase | str) -> list[str]:
    """The methods a table cell of `phase` may hold: `full` first, then those that run in it."""
    return [FULL, *for_phase(phase)]


def current_budget(plan: Plan) -> float:
    """The plan's budget to start a rescale from: the average capacity of its first active phase that
    has one, else `DEFAULT_CAPACITY`."""
    summary = plan.summary().phases
    return next(
        (summary[p].average_capacity for p in plan.scope.phases if summary[p].average_capacity), float(DEFAULT_CAPACITY)
    )


def rescale(plan: Plan, budget: float) -> Plan:
    """The same plan (route, name and description) at another budget (average capacity per layer);
    PlanError with one line when it cannot be (a budget too small for the layers' windows, ...)."""
    from polykv.routing import scale_budget

    try:
        scaled = scale_budget(plan, budget, name=plan.name, description=plan.description)
    except ValueError as exc:  # a PlanError, or a budget too small for the layers' windows
        raise PlanError(f"rescale to budget {budget:g}: {first_line(exc)}") from None
    return record_edit(plan, scaled, f"rescaled to budget {budget:g}")


def reset_to_full(plan: Plan) -> Plan:
    """The plan with every layer `full` in both phases (no eviction), allocation "fixed": a fresh plan
    (its name kept), with a new provenance saying it was reset from the old one."""
    return plan.with_layers(
        Plan.homogeneous(FULL, None, plan.num_layers).layers,
        scope=Scope.BOTH,
        allocation="fixed",
        provenance={"built_by": "reset_to_full", "source": plan.name},
    )


def profile_scopes(profile: Profile) -> list[str]:
    """The scopes a plan can be built for from `profile`: those whose every phase it measured."""
    return [s.value for s in Scope if all(p.value in profile.meta.scopes for p in s.phases)]


def build_from_profile(profile: Profile, scope: Scope | str, budget: int, statistic: str, allocation: str) -> Plan:
    """`polykv.routing.plan_from_profile`, with any refusal (a stale profile, a scope it did not measure,
    a budget too small) as a one-line PlanError."""
    from polykv.routing import plan_from_profile

    try:
        return plan_from_profile(profile, scope, int(budget), statistic, allocation)
    except ValueError as exc:
        raise PlanError(str(exc)) from None


class SavedPlan(NamedTuple):
    """What `save_plan` did: the file written (None when it refused), a one-line message, and the plan
    under its new name (whether or not it was written)."""

    path: Path | None
    message: str
    plan: Plan


def save_plan(plan: Plan, folder: str | os.PathLike, name: str, overwrite: bool = False) -> SavedPlan:
    """Save `plan`, renamed `name` (stripped; a new name's description says which plan it was edited from), to
    `folder` under the safe file name `plan_filename(name)`.
    An existing file (or link) of that name is replaced only when `overwrite` is true; otherwise nothing
    is written and the message says the file exists. PlanError for an empty name, OSError when the
    file cannot be written."""
    folder = Path(folder)
    target = folder / plan_filename(name)
    renamed = name.strip() != plan.name
    # a new name is a new plan: the old one's description no longer says what it is
    description = f"edited from {plan.name}" if renamed else plan.description
    named = plan.model_copy(update={"name": name.strip(), "description": description})
    if os.path.lexists(target) and not overwrite:
        return SavedPlan(None, f"{target.name} exists in {folder}", named)
    named.save(target)
    return SavedPlan(target, f"Saved {target}", named)


__all__ = [
    "DEFAULT_CAPACITY", "EDITED_SUFFIX", "PHASE_CHOICES", "TABLE_COLUMNS", "SavedPlan", "build_from_profile",
    "change_summary", "current_budget", "diff", "edits", "from_table", "layers_in", "paint", "paint_message",
    "palette", "phase_choice", "phase_values", "plan_filename", "profile_scopes", "record_edit", "rescale",
    "reset_to_full", "save_plan", "scope_change", "shortcuts", "table_methods", "to_table",
]  # fmt: skip

"""The designer's glue: one-time messages, committing an edit, the layer selection (from the chart or the
list), the paint palette, and the plan files a user saves, loads or uploads."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import streamlit as st

from app import charts, session, state
from app.plan_draft import REPO, plan, set_plan
from app.session import check_plan, current_model
from polykv.files import read_text
from polykv.plan import MAX_PLAN_BYTES, Plan, PlanError
from polykv.plan_edits import choices
from polykv.workspace import results_path

KEEP = "(keep)"  # the paint palette's "leave the method as it is"
PLAN_MESSAGES = "plan"  # the message slot under the paint controls (paint, undo, redo, rescale, build, reset)


def plans_dir() -> Path:
    """Where the designer saves and loads plans: `$POLYKV_PLANS`; else the workspace's `plans/` when
    `$POLYKV_WORKSPACE` names one (a user's plans stay with their runs, out of the repository); else the repo's."""
    if os.environ.get("POLYKV_PLANS"):
        return Path(os.environ["POLYKV_PLANS"])
    if os.environ.get("POLYKV_WORKSPACE"):
        return Path(os.environ["POLYKV_WORKSPACE"]) / "plans"
    return REPO / "plans"


def model_plans_dir(model: str) -> Path:
    """Where the designer saves a plan of `model`: plans/<model>/ for an embedded model (beside its shipped plans),
    plans/ for a model given by path or hub id."""
    from polykv.models import EMBEDDED_MODELS

    return plans_dir() / model if model in EMBEDDED_MODELS else plans_dir()


def flash(key: str, text: str, kind: str = "success") -> None:
    """Show `text` (st.success, st.warning, ...) once, after the next rerun, where `show_flash(key)` is."""
    st.session_state.setdefault(key, []).append((kind, text))


def show_flash(key: str) -> bool:
    """Show what `flash(key, ...)` left; whether there was anything."""
    shown = st.session_state.pop(key, [])
    for kind, text in shown:
        getattr(st, kind)(text)
    return bool(shown)


def commit(new: Plan, message: str | None = None, where: str = PLAN_MESSAGES) -> None:
    """Make `new` the plan and redraw the designer, `message` shown at slot `where`; a PlanError leaves the plan
    as it was and says why, here. A change of the plan's scope is announced, whatever made it."""
    before = plan()
    try:
        set_plan(new)
    except PlanError as exc:
        st.error(str(exc))
        return
    if message:
        flash(state.designer_flash(where), message)
    changed = choices.scope_change(before, new)
    if changed:
        flash(state.designer_flash(where), changed, "warning")
    st.rerun()


def attempt(build: Callable[[], Plan], message: str | None = None, where: str = PLAN_MESSAGES) -> None:
    """`commit(build(), message, where)`, or the PlanError `build` raised, said here in one line."""
    try:
        new = build()
    except PlanError as exc:
        st.error(str(exc))
        return
    commit(new, message, where)


def follow_chart_selection(layers: int) -> None:
    """Copy a new selection on the plan chart into the layer list and phase (once per selection: the
    list stays editable), and drop selected layers the model does not have."""
    chart = st.session_state.get(state.PLAN_CHART) or {}
    picked = charts.selected_cells((chart.get("selection") or {}).get("points", []))
    if picked != st.session_state.get(state.CHART_SEEN):
        st.session_state[state.CHART_SEEN] = picked
        chart_layers, chart_phases = picked
        if chart_layers:
            st.session_state[state.DESIGNER_LAYERS] = chart_layers
            phase = choices.phase_choice(chart_phases)
            if phase is not None:
                st.session_state[state.DESIGNER_PHASE] = phase
    st.session_state[state.DESIGNER_LAYERS] = choices.layers_in(st.session_state.get(state.DESIGNER_LAYERS, []), layers)


def selection_boxes() -> list[dict]:
    """The selection as boxes on the plan chart's strip (`charts.selection_boxes`), however it was made."""
    return charts.selection_boxes(selected_layers(), shown_phases())


def selected_layers() -> list[int]:
    return list(st.session_state.get(state.DESIGNER_LAYERS, []))


def select_layers(layers: Iterable[int]) -> None:
    """A button's callback: make `layers` the selection."""
    st.session_state[state.DESIGNER_LAYERS] = list(layers)


def phase_follows_scope(current: Plan) -> None:
    """The paint phase starts at the plan's scope, and follows it whenever the scope changes (a plan
    loaded, built or painted), so painting a decode plan does not silently make it a "both" one."""
    if st.session_state.get(state.SCOPE_SEEN) != current.scope.value:
        st.session_state[state.SCOPE_SEEN] = current.scope.value
        st.session_state[state.DESIGNER_PHASE] = current.scope.value


def paint_palette() -> list[tuple[str, str | None]]:
    """The palette for the chosen phase: every method with None or why it cannot be painted there. A chosen
    method that cannot run in the phase is dropped (back to keeping the method)."""
    entries = choices.palette(st.session_state.get(state.DESIGNER_PHASE, choices.PHASE_CHOICES[0]))
    if dict(entries).get(st.session_state.get(state.PAINT_METHOD)) is not None:
        st.session_state[state.PAINT_METHOD] = KEEP
    return entries


def choose_method(method: str) -> None:
    """A palette button's callback."""
    st.session_state[state.PAINT_METHOD] = method


def chosen_method() -> str:
    return st.session_state.get(state.PAINT_METHOD, KEEP)


def shown_phases() -> tuple[str, ...]:
    """The phases whose selected cells the chart outlines: those the phase choice names."""
    return choices.phase_values(st.session_state.get(state.DESIGNER_PHASE, choices.PHASE_CHOICES[0]))


def paint_request() -> tuple[list[int], str, str | None, int | None]:
    """(layers, phase choice, method or None to keep it, capacity or None to keep it) from the palette."""
    method = st.session_state.get(state.PAINT_METHOD, KEEP)
    capacity = st.session_state.get(state.PAINT_CAPACITY)
    return (
        selected_layers(),
        st.session_state.get(state.DESIGNER_PHASE, choices.PHASE_CHOICES[0]),
        None if method == KEEP else method,
        None if capacity is None else int(capacity),
    )


def new_upload(upload) -> bool:
    """Whether `upload` (a file uploader's file) is one not loaded yet; remembers it as loaded."""
    if upload is None or st.session_state.get(state.UPLOAD_SEEN) == upload.file_id:
        return False
    st.session_state[state.UPLOAD_SEEN] = upload.file_id
    return True


def saved_plans(layers: int | None = None) -> list[Path]:
    """Plan files under the plans directory (regular files only), relative to it; with `layers`, only the plans of
    that many layers (a file that does not read as a plan stays listed: picking it says what is wrong)."""
    root = plans_dir()
    found = sorted(p.relative_to(root) for p in root.rglob("*.json") if p.is_file()) if root.is_dir() else []
    return found if layers is None else [p for p in found if _layer_count(root / p) in (layers, None)]


def _layer_count(path: Path) -> int | None:
    """How many layers a plan file lists, or None when it does not read as a plan."""
    try:
        data = json.loads(read_text(path, "plan file", MAX_PLAN_BYTES, error=PlanError))
    except (PlanError, OSError, ValueError):
        return None
    layers = data.get("layers") if isinstance(data, dict) else None
    return len(layers) if isinstance(layers, list) else None


def read_plan_file(relative: Path) -> Plan:
    """A saved plan, read safely (a regular file of bounded size) and checked against the current model."""
    return read_plan(read_text(plans_dir() / relative, "plan file", MAX_PLAN_BYTES, error=PlanError), str(relative))


def read_plan(text: str | bytes, where: str) -> Plan:
    """A plan from user-provided JSON, checked against the current model; PlanError (one line) if not."""
    try:
        loaded = Plan.from_json(text)
    except PlanError as exc:
        raise PlanError(f"{where}: {exc}") from None
    try:
        return check_plan(loaded)
    except PlanError as exc:
        raise PlanError(f"{where}: this plan does not fit {current_model()[0]!r}: {exc}") from None


def measured_runs(plan: Plan) -> list:
    """The workspace's runs of this plan (the same layers and allocation) on the current model whose samples carry
    the KV their cache held, newest first."""
    from polykv.eval.results.store import Store

    store = Store(results_path(session.workspace()), readonly=True)
    model = session.current_model()[0]
    found = []
    for run in store.runs():
        try:
            ran = Plan.from_json(run.plan_json)
        except PlanError:
            continue
        same_rules = (ran.allocation, ran.head_allocation) == (plan.allocation, plan.head_allocation)
        if run.model == model and ran.layers == plan.layers and same_rules:
            found.append(run)
    return sorted(found, key=lambda r: r.created, reverse=True)


def measured_kv_of(run):
    """What `run`'s plan held per layer, measured (`polykv.eval.results.kv_measured.MeasuredKV`; None: not measured)."""
    from polykv.eval.results.kv_measured import measured_kv
    from polykv.eval.results.store import Store

    store = Store(results_path(session.workspace()), readonly=True)
    return measured_kv(store.samples(run.id), session.layer_windows())

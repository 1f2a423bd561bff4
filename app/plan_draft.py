"""The plan being designed: the session's draft per model (saved as it changes), its undo and redo history,
and switching the model, which asks first when the plan on the designer would not fit the new one."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app import state
from app.session import (
    DEMO,
    check_plan,
    current_model,
    load_cached,
    load_model,
    model_error,
    num_layers,
    remember_model,
    session_id,
    set_model_error,
    workspace,
)
from polykv import drafts, models
from polykv.errors import PolyKVError, first_line
from polykv.methods import validate_plan
from polykv.plan import Plan, PlanError
from polykv.plan_edits.comparison import change_summary

REPO = Path(__file__).resolve().parents[1]


SHIPPED_PLANS = REPO / "plans"  # plans/<embedded model>/mixed.json: where the designer starts for that model


def fall_back_to_demo() -> None:
    """Make the demo model the current one again (the chosen one could not be reloaded)."""
    switch_model(DEMO, "cpu")


def request_model(name: str, device: str) -> None:
    """The sidebar's Load: load the model, then switch to it at once when the plan on the designer fits it
    (the plan comes along); when it does not fit, ask first (`pending_model`)."""
    problem = load_model(name, device, switch=False)
    set_model_error(problem)
    if problem:
        return
    st.session_state.pop(state.PENDING_MODEL, None)
    old_name = current_model()[0]
    if name == old_name:  # another device: the same plan
        switch_model(name, device)
        return
    current, model = plan(), load_cached(name, device)[0]
    try:
        validate_plan(current, models.num_layers(model), models.context_length(model), within_context=True)
    except PlanError as exc:
        st.session_state[state.PENDING_MODEL] = (
            name,
            device,
            f"The plan on the designer, {current.name!r}, does not fit {name!r} ({first_line(exc)}). "
            f"Switch anyway? The plan stays a draft of {old_name!r} and comes back when you load "
            f"{old_name!r} again.",
        )
        return
    switch_model(name, device, carry=current)


def request_model_from_form() -> None:
    """The sidebar form's Load (an on_click callback, run before the page's widgets): `request_model` with the
    typed name and the chosen device; after a failed load the box shows the model that is loaded again."""
    request_model(st.session_state[state.MODEL_TEXT].strip(), st.session_state[state.MODEL_DEVICE])
    if model_error():
        st.session_state[state.MODEL_TEXT] = current_model()[0]


def pending_model() -> tuple[str, str, str] | None:
    """(name, device, question) of a model switch waiting for the user's answer."""
    return st.session_state.get(state.PENDING_MODEL)


def answer_pending_model(switch: bool) -> None:
    pending = st.session_state.pop(state.PENDING_MODEL, None)
    if pending is not None and switch:
        switch_model(pending[0], pending[1])


def switch_model(name: str, device: str, carry: Plan | None = None) -> None:
    """Make (name, device) the current model. Its own draft comes up on the designer, unless `carry` (a
    plan that fits it) is given: then that plan, with its undo history, becomes the new model's draft."""
    st.session_state[state.MODEL] = (name, device)
    remember_model(name, device)
    if carry is None:  # `plan()` opens the new model's draft
        st.session_state.pop(state.PLAN_MODEL, None)
        st.session_state.pop(state.PLAN_JSON, None)
    else:
        st.session_state[state.PLAN_MODEL] = name
        st.session_state[state.PLAN_JSON] = carry.to_json()
        _save_draft()
    new_plan_version()


def plan() -> Plan:
    """The designer's current plan (always valid for the current model): this session's draft for the
    model (from memory, else from its draft file), else the model's shipped mixed plan (`plans/<name>/`, for
    the embedded models) or a fresh one."""
    name, layers = current_model()[0], num_layers()
    text = st.session_state.get(state.PLAN_JSON)
    owner = st.session_state.get(state.PLAN_MODEL)
    if text is not None and owner == name:
        return Plan.from_json(text)
    if text is not None and owner is None and Plan.from_json(text).num_layers == layers:
        st.session_state[state.PLAN_MODEL] = name  # a plan put in the session directly (a script, a test)
        return Plan.from_json(text)
    draft = _read_draft(name)
    if draft is None or draft.plan.num_layers != layers:
        shipped = SHIPPED_PLANS / name / "mixed.json"
        start = Plan.load(shipped) if name in models.EMBEDDED_MODELS and shipped.is_file() else None
        if start is None or start.num_layers != layers:
            start = Plan.homogeneous("tova", 256, layers, "decode", name="new-plan")
        draft = drafts.Draft(start)
    st.session_state[state.PLAN_JSON] = draft.plan.to_json()
    st.session_state[state.UNDO] = list(draft.undo)
    st.session_state[state.REDO] = list(draft.redo)
    st.session_state[state.PLAN_MODEL] = name
    _restore_selection(draft)
    new_plan_version()
    return draft.plan


def _restore_selection(draft: drafts.Draft) -> None:
    """The designer's selection as the draft left it; the phase then stays as saved, not reset to the scope."""
    st.session_state[state.DESIGNER_LAYERS] = list(draft.layers)
    if draft.phase is not None:
        st.session_state[state.DESIGNER_PHASE] = draft.phase
        st.session_state[state.SCOPE_SEEN] = draft.plan.scope.value
    st.session_state[state.SELECTION_SAVED] = None  # `keep_selection` takes the page's first selection as saved


def _selection() -> tuple[list[int], str | None]:
    return list(st.session_state.get(state.DESIGNER_LAYERS, [])), st.session_state.get(state.DESIGNER_PHASE)


def keep_selection() -> None:
    """Save the draft when the designer's selection changed since it was last saved (a reload keeps it); the
    selection the page opens with is the saved one (a plan only looked at writes nothing)."""
    if st.session_state.get(state.SELECTION_SAVED) is None:
        st.session_state[state.SELECTION_SAVED] = _selection()
    elif st.session_state[state.SELECTION_SAVED] != _selection():
        _save_draft()


def _read_draft(model_name: str) -> drafts.Draft | None:
    try:
        return drafts.load_draft(workspace(), session_id(), model_name)
    except (PolyKVError, OSError) as exc:  # a damaged draft: say so, start afresh (the file stays)
        st.session_state[state.DRAFT_PROBLEM] = f"Could not reopen the draft: {first_line(exc)}"
        return None


def _save_draft() -> None:
    """Write the session's plan, undo, redo and selection for the current model to its draft file."""
    layers, phase = _selection()
    draft = drafts.Draft(
        Plan.from_json(st.session_state[state.PLAN_JSON]),
        list(st.session_state.get(state.UNDO, [])),
        list(st.session_state.get(state.REDO, [])),
        layers,
        phase,
    )
    st.session_state[state.SELECTION_SAVED] = (layers, phase)
    try:
        drafts.save_draft(workspace(), session_id(), st.session_state[state.PLAN_MODEL], draft)
    except (PolyKVError, OSError) as exc:  # e.g. a read-only workspace: the edit stands, unsaved
        st.session_state[state.DRAFT_PROBLEM] = f"The plan is not saved as a draft: {first_line(exc)}"
    else:
        st.session_state.pop(state.DRAFT_PROBLEM, None)


def draft_problem() -> str | None:
    """Why the session's plan or model could not be saved or reopened, if it could not."""
    return st.session_state.get(state.DRAFT_PROBLEM)


def plan_version() -> int:
    """How many times the plan has changed: the per-version widgets (table, name) are keyed by it."""
    return st.session_state.get(state.PLAN_VERSION, 0)


def new_plan_version() -> None:
    """Start fresh per-version widgets (e.g. drop the table's pending edits)."""
    st.session_state[state.PLAN_VERSION] = plan_version() + 1


def set_plan(new: Plan) -> None:
    """Make `new` the current plan (validated for the model), keeping the old one for undo; saved as the
    session's draft."""
    check_plan(new)
    old = plan().to_json()
    if old != new.to_json():
        _push(state.UNDO, old)
        st.session_state[state.REDO] = []  # a new edit: what was undone is gone, as in any editor
    st.session_state[state.PLAN_JSON] = new.to_json()
    _save_draft()
    new_plan_version()


def _push(key: str, text: str) -> None:
    stack = st.session_state.setdefault(key, [])
    stack.append(text)
    del stack[: -drafts.HISTORY]


def can_undo() -> bool:
    return bool(st.session_state.get(state.UNDO))


def can_redo() -> bool:
    return bool(st.session_state.get(state.REDO))


def undo() -> str | None:
    """Back to the plan before the last edit (Redo brings the edit back); says what it undid."""
    restored = _step(state.UNDO, state.REDO)
    return None if restored is None else f"Undid: {change_summary(restored, _after_step(state.REDO))}."


def redo() -> str | None:
    """The edit Undo took back, again; says what it redid."""
    restored = _step(state.REDO, state.UNDO)
    return None if restored is None else f"Redid: {change_summary(_after_step(state.UNDO), restored)}."


def _after_step(target: str) -> Plan:
    return Plan.from_json(st.session_state[target][-1])  # the plan the step left, now on top of `target`


def _step(source: str, target: str) -> Plan | None:
    """Move the current plan to `target`'s history and make the newest of `source`'s the plan (None: empty)."""
    stack = st.session_state.get(source) or []
    if not stack:
        return None
    _push(target, plan().to_json())
    st.session_state[state.PLAN_JSON] = stack.pop()
    _save_draft()
    new_plan_version()
    return Plan.from_json(st.session_state[state.PLAN_JSON])

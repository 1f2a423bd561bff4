"""Plan designer: select layers, paint methods and capacities, fine-tune in a table, save and load.

One function per section, called top to bottom at the end. The page only draws: every decision is in
`polykv.design` (the plan operations) or the app's glue (`app.editing`: edits and selection,
`app.designing`: the plan and its history); keys are in `app.state`.
"""

import streamlit as st

from app import charts, common, designing, editing, session, state
from polykv import design
from polykv.plan import Phase, PlanError
from polykv.routing import ALLOCATIONS

# Message slots beside the controls that fill them (the paint controls' is `editing.PLAN_MESSAGES`).
TABLE, FILES, LOADS = "table", "files", "loads"


def chart_selection(layers: int) -> None:
    """The chart's last selection feeds the layer list and the phase below."""
    editing.follow_chart_selection(layers)


def chart(plan) -> None:
    figure = charts.plan_figure(plan, editing.selected_layers(), editing.shown_phases(), editing.selection_boxes())
    common.show(figure, "plan", key=state.PLAN_CHART, on_select="rerun", selection_mode=("points", "box", "lasso"))


def summary(plan) -> None:
    st.text("\n".join(plan.summary().lines()))


def provenance(plan) -> None:
    """Where the plan came from and every edit made to it since, oldest first."""
    edits = design.edits(plan)
    with st.expander(f"Provenance ({len(edits)} edit{'' if len(edits) == 1 else 's'})"):
        st.caption(f"Built by: {plan.provenance.get('built_by', 'unknown')}")
        st.text("\n".join(f"{i}. {edit}" for i, edit in enumerate(edits, 1)) if edits else "No edits yet.")


def paint(plan, layers: int) -> None:
    """Selection, phase, capacity, the palette, then Paint, Undo and Redo in one row, under them the one place
    where what they and the plan tools below did (or why not) is said: all in view with the chart."""
    left, middle, right = st.columns([4, 3, 3])
    with left:
        st.multiselect("Selected layers", list(range(layers)), key=state.DESIGNER_LAYERS)
    with middle:
        st.radio("Phase", design.PHASE_CHOICES, key=state.DESIGNER_PHASE, horizontal=True)
    with right:
        st.number_input(
            "Capacity (tokens per KV head)",
            step=1,  # no min_value: a bad number is refused by the paint with its reason, not clamped quietly
            value=None,
            key=state.PAINT_CAPACITY,
            placeholder="keep",
        )
    palette()
    with st.container(horizontal=True, vertical_alignment="center"):
        painted = st.button("Paint selection", type="primary")
        undone = st.button("Undo", disabled=not designing.can_undo(), shortcut="Ctrl+Z")
        redone = st.button("Redo", disabled=not designing.can_redo(), shortcut="Ctrl+Shift+Z")
        st.button("Select all", on_click=editing.select_layers, args=(range(layers),))
        st.button("Clear", on_click=editing.select_layers, args=((),))
    # What the controls around here did, or why not: said here, so nothing above the chart moves.
    editing.show_flash(state.designer_flash(editing.PLAN_MESSAGES))
    if designing.draft_problem():
        st.warning(designing.draft_problem())
    if painted:
        chosen, phase, method, capacity = editing.paint_request()
        editing.attempt(
            lambda: design.paint(plan, chosen, phase, method, capacity),
            design.paint_message(chosen, phase, method, capacity),
        )
    if undone or redone:
        said = designing.undo() if undone else designing.redo()
        if said:
            editing.flash(state.designer_flash(editing.PLAN_MESSAGES), said, "info")
        st.rerun()
    with st.container(horizontal=True, vertical_alignment="center"):
        with st.popover("Rescale to a budget"):
            rescale_to_budget(plan)
        with st.popover("Build from profile"):
            build_from_profile()
        if st.button("Reset to full"):
            editing.commit(design.reset_to_full(plan), "Reset every layer to full (no eviction).")
    unavailable = [why for _, why in editing.paint_palette() if why]
    if unavailable:
        st.caption("Not offered here: " + "; ".join(unavailable) + ".")


def palette() -> None:
    """One button per method: the chosen one highlighted, those that cannot run in the phase greyed with
    the reason as their tooltip; each has a one-key shortcut (shown on the button)."""
    entries = editing.paint_palette()
    keys = design.shortcuts([name for name, _ in entries])
    chosen = editing.chosen_method()
    with st.container(horizontal=True):
        for name, why_not in [(editing.KEEP, None), *entries]:
            st.button(
                name,
                key=state.palette_button(name),
                type="primary" if name == chosen else "secondary",
                disabled=why_not is not None,
                help=why_not or ("Leave each cell's method as it is" if name == editing.KEEP else None),
                shortcut=keys.get(name, "0" if name == editing.KEEP else None),
                on_click=editing.choose_method,
                args=(name,),
            )


def rescale_to_budget(plan) -> None:
    target = st.number_input(
        "Budget (average capacity per layer)", min_value=1.0, value=float(round(design.current_budget(plan))), step=1.0
    )
    if st.button("Rescale (keep the route)"):
        editing.attempt(
            lambda: design.rescale(plan, target), f"Rescaled to a budget of {target:g} (average capacity per layer)."
        )


def build_from_profile() -> None:
    by_key = {p.key: p for p in common.fitting_profiles()}
    if not by_key:
        st.info("No profile for this model yet: compute one on the Profiles page.")
        return
    picked = by_key[st.selectbox("Profile", list(by_key))]
    scope = st.selectbox("Scope", design.profile_scopes(picked), key=state.BUILD_SCOPE)
    budget = st.number_input(
        "Budget (average capacity per layer)", min_value=1, value=picked.meta.b_cal, step=1, key=state.BUILD_BUDGET
    )
    statistics = picked.statistics()
    if st.session_state.get(state.BUILD_STATISTIC) not in statistics:  # danswer, then a text profile picked
        st.session_state.pop(state.BUILD_STATISTIC, None)
    statistic = st.radio("TopRank statistic", statistics, horizontal=True, key=state.BUILD_STATISTIC)
    allocation = st.radio("Allocation", list(ALLOCATIONS), horizontal=True, key=state.BUILD_ALLOCATION)
    if st.button("Build plan"):
        editing.attempt(
            lambda: design.build_from_profile(picked, scope, budget, statistic, allocation),
            f"Built from profile {picked.key} ({statistic}, {allocation}).",
        )


def layer_table(plan) -> None:
    st.subheader("Per-layer table")
    st.caption("Fine-tune methods, capacities and parameters (JSON) per layer; edits apply when they are valid.")
    columns = {
        **{
            f"{p.value}_method": st.column_config.SelectboxColumn(
                f"{p.value} method", options=design.table_methods(p), required=True
            )
            for p in Phase
        },
        **{f"{p.value}_capacity": st.column_config.NumberColumn(f"{p.value} capacity", step=1) for p in Phase},
        **{f"{p.value}_params": st.column_config.TextColumn(f"{p.value} params") for p in Phase},
    }
    edited = st.data_editor(
        design.to_table(plan),
        key=state.plan_table(designing.plan_version()),
        hide_index=True,
        disabled=["layer"],
        column_config=columns,
    )
    try:
        from_table = design.from_table(plan, edited)
    except PlanError as exc:
        st.error(f"Table: {exc}. The plan keeps its last valid state; fix the cell or press Undo edits.")
        if st.button("Undo edits"):
            designing.new_plan_version()
            st.rerun()
        return
    if from_table != plan:
        editing.commit(from_table, "Table edit applied.", TABLE)
    editing.show_flash(state.designer_flash(TABLE))


def files(plan) -> None:
    st.subheader("Save, load, compare")
    saved = editing.saved_plans()
    save_col, load_col, diff_col = st.columns(3)
    with save_col:
        save(plan)
    with load_col:
        load(saved)
    with diff_col:
        diff(plan, saved)


def save(plan) -> None:
    name = st.text_input("Plan name", value=plan.name, key=state.plan_name(designing.plan_version()))
    overwrite = st.checkbox("Overwrite an existing file")
    if st.button("Save to plans/"):
        try:
            outcome = design.save_plan(plan, editing.plans_dir(), name, overwrite)
        except (PlanError, OSError) as exc:
            st.error(common.first_line(exc))
        else:
            if outcome.path is None:
                st.warning(f"{outcome.message}: tick 'Overwrite' to replace it.")
            else:
                editing.commit(outcome.plan, outcome.message, FILES)
    editing.show_flash(state.designer_flash(FILES))
    st.download_button(
        "Download JSON", plan.to_json(), file_name=design.plan_filename(plan.name), mime="application/json"
    )


def load(saved) -> None:
    choice = st.selectbox("Saved plans", saved, index=None, placeholder="choose a plan file", format_func=str)
    if st.button("Load", disabled=choice is None):
        editing.attempt(lambda: editing.read_plan_file(choice), f"Loaded {choice}.", LOADS)
    upload = st.file_uploader("Upload a plan (JSON)", type=["json"], key=state.PLAN_UPLOAD)
    if editing.new_upload(upload):
        editing.attempt(lambda: editing.read_plan(upload.getvalue(), upload.name), f"Loaded {upload.name}.", LOADS)
    editing.show_flash(state.designer_flash(LOADS))


def diff(plan, saved) -> None:
    other = st.selectbox(
        "Diff against", saved, index=None, placeholder="choose a plan file", format_func=str, key=state.DIFF_WITH
    )
    if other is None:
        return
    try:
        against = editing.read_plan_file(other)
    except PlanError as exc:
        st.error(str(exc))
        return
    changes = design.diff(against, plan)
    st.caption(f"a = {other}, b = the current plan: {len(changes)} difference(s)")
    st.dataframe(changes, hide_index=True, width="stretch")


st.title(
    "Plan designer",
    help="Select layers on the chart (drag a box over cells or bars; shift-drag adds to the selection) or in the "
    "list below, then paint a method and/or a capacity onto them. Every edit is checked against the model at once "
    "and kept as this session's draft (the URL brings it back).",
)
current, num_layers = designing.plan(), session.num_layers()
editing.phase_follows_scope(current)
chart_selection(num_layers)
chart(current)
paint(current, num_layers)
designing.keep_selection()
summary(current)
provenance(current)
layer_table(current)
files(current)

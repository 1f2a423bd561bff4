"""Plan designer: select layers, paint methods and capacities, fine-tune in a table, save and load.

One function per section, called top to bottom at the end. The page only draws: every decision is in
`polykv.plan_edits` (the plan operations) or the app's glue (`app.designer_controls`: edits and selection,
`app.plan_draft`: the plan and its history); keys are in `app.state`.
"""

import streamlit as st

from app import charts, common, designer_tools, plan_draft, session, state
from app import designer_controls as controls
from polykv.errors import first_line
from polykv.plan import Phase, PlanError
from polykv.plan_edits import choices, comparison, edit_history, painting, saving, table, whole_plan
from polykv.routing import ALLOCATIONS

# Message slots beside the controls that fill them (the paint controls' is `controls.PLAN_MESSAGES`).
TABLE, FILES, LOADS = "table", "files", "loads"


def chart_selection(layers: int) -> None:
    """The chart's last selection feeds the layer list and the phase below."""
    controls.follow_chart_selection(layers)


def chart(plan) -> None:
    figure = charts.plan_figure(
        plan, controls.selected_layers(), controls.shown_phases(), controls.selection_boxes(), session.layer_windows()
    )
    common.show(figure, "plan", key=state.PLAN_CHART, on_select="rerun", selection_mode=("points", "box", "lasso"))


def summary(plan) -> None:
    from polykv.kv_memory import window_notes

    notes = [f"note: {n}" for n in window_notes(plan, session.layer_windows())]
    st.text("\n".join([*plan.summary().lines(), *notes]))


def memory(plan) -> None:
    """Where the plan keeps its KV memory after a prompt of the chosen length. On a hybrid model a chart, layer by
    layer (local layers hold their window at most, global ones the prompt); on others, where memory follows the
    capacity bars above, its total against FullKV's."""
    from polykv.kv_memory import fullkv_tokens, kept_line, layer_tokens
    from polykv.models import context_length

    windows = session.layer_windows()
    longest = context_length(session.current_model()[2]) or 131072
    hybrid = any(w is not None for w in windows)
    with st.expander("KV memory per layer", expanded=hybrid):
        tokens = st.number_input(
            "After a prompt of (tokens)",
            min_value=1,
            max_value=longest,
            value=min(4096, longest),
            step=256,
            key=state.MEMORY_TOKENS,
        )
        token_bytes = session.kv_token_bytes()
        if hybrid:
            kept = [entering for entering, _ in layer_tokens(plan, tokens, windows=windows)]
            full = fullkv_tokens(tokens, windows)
            common.show(charts.memory_figure(plan, kept, full, token_bytes, windows), "kv-memory")
        st.caption(
            f"Kept entering the answer: {kept_line(plan, tokens, windows, token_bytes)}"
            + ("; a local layer never holds more than its window less one." if hybrid else ".")
        )
        designer_tools.measured(plan)


def provenance(plan) -> None:
    """Where the plan came from and every edit made to it since, oldest first."""
    edits = edit_history.edits(plan)
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
        st.radio("Phase", choices.PHASE_CHOICES, key=state.DESIGNER_PHASE, horizontal=True)
    with right:
        st.number_input(
            "Capacity (tokens per KV head)",
            step=1,  # no min_value: a bad number is refused by the paint with its reason, not clamped quietly
            value=None,
            key=state.PAINT_CAPACITY,
            placeholder="keep",
        )
    entries = palette()
    with st.container(horizontal=True, vertical_alignment="center"):
        painted = st.button("Paint selection", type="primary")
        undone = st.button("Undo", disabled=not plan_draft.can_undo(), shortcut="Ctrl+Z")
        redone = st.button("Redo", disabled=not plan_draft.can_redo(), shortcut="Ctrl+Shift+Z")
        st.button("Select all", on_click=controls.select_layers, args=(range(layers),))
        st.button("Clear", on_click=controls.select_layers, args=((),))
    # What the controls around here did, or why not: said here, so nothing above the chart moves.
    controls.show_flash(state.designer_flash(controls.PLAN_MESSAGES))
    if plan_draft.draft_problem():
        st.warning(plan_draft.draft_problem())
    if painted:
        chosen, phase, method, capacity = controls.paint_request()
        controls.attempt(
            lambda: painting.paint(plan, chosen, phase, method, capacity),
            choices.paint_message(chosen, phase, method, capacity),
        )
    if undone or redone:
        said = plan_draft.undo() if undone else plan_draft.redo()
        if said:
            controls.flash(state.designer_flash(controls.PLAN_MESSAGES), said, "info")
        st.rerun()
    with st.container(horizontal=True, vertical_alignment="center"):
        with st.popover("Rescale to a budget"):
            rescale_to_budget(plan)
        with st.popover("Split by a rule"):
            designer_tools.split_by_rule(plan)
        with st.popover("Build from profile"):
            build_from_profile()
        if st.button("Reset to full"):
            controls.commit(whole_plan.reset_to_full(plan), "Reset every layer to full (no eviction).")
    unavailable = [why for _, why in entries if why]
    if unavailable:
        st.caption("Not offered here: " + "; ".join(unavailable) + ".")


def palette() -> list[tuple[str, str | None]]:
    """One button per method: the chosen one highlighted, those that cannot run in the phase greyed with
    the reason as their tooltip; each has a one-key shortcut (shown on the button). Returns the entries."""
    entries = controls.paint_palette()
    keys = choices.shortcuts([name for name, _ in entries])
    chosen = controls.chosen_method()
    with st.container(horizontal=True, gap="xsmall"):  # two rows of fifteen methods, in view at 1280x800
        for name, why_not in [(controls.KEEP, None), *entries]:
            st.button(
                name,
                key=state.palette_button(name),
                type="primary" if name == chosen else "secondary",
                disabled=why_not is not None,
                help=why_not or ("Leave each cell's method as it is" if name == controls.KEEP else None),
                shortcut=keys.get(name, "0" if name == controls.KEEP else None),
                on_click=controls.choose_method,
                args=(name,),
            )
    return entries


def rescale_to_budget(plan) -> None:
    with st.form(state.RESCALE_FORM, border=False):  # a form: Enter in the budget rescales (it closed the popover)
        target = st.number_input(
            "Budget (average capacity per layer)",
            min_value=1.0,
            value=float(round(whole_plan.current_budget(plan))),
            step=1.0,
        )
        rescale = st.form_submit_button("Rescale (keep the route)")
    if rescale:
        controls.attempt(
            lambda: whole_plan.rescale(plan, target),
            f"Rescaled to a budget of {target:g} (average capacity per layer).",
        )


def build_from_profile() -> None:
    by_key = {p.key: p for p in common.fitting_profiles()}
    if not by_key:
        st.info("No profile for this model yet: compute one on the Profiles page.")
        return
    picked = by_key[st.selectbox("Profile", list(by_key))]
    scope = st.selectbox("Scope", whole_plan.profile_scopes(picked), key=state.BUILD_SCOPE)
    budget = st.number_input(
        "Budget (average capacity per layer)", min_value=1, value=picked.meta.b_cal, step=1, key=state.BUILD_BUDGET
    )
    statistics = picked.statistics()
    if st.session_state.get(state.BUILD_STATISTIC) not in statistics:  # danswer, then a text profile picked
        st.session_state.pop(state.BUILD_STATISTIC, None)
    statistic = st.radio("TopRank statistic", statistics, horizontal=True, key=state.BUILD_STATISTIC)
    allocation = st.radio("Allocation", list(ALLOCATIONS), horizontal=True, key=state.BUILD_ALLOCATION)
    if st.button("Build plan"):
        controls.attempt(
            lambda: whole_plan.build_from_profile(picked, scope, budget, statistic, allocation),
            f"Built from profile {picked.key} ({statistic}, {allocation}).",
        )


def layer_table(plan) -> None:
    st.subheader("Per-layer table")
    st.caption("Fine-tune methods, capacities and parameters (JSON) per layer; edits apply when they are valid.")
    columns = {
        **{
            f"{p.value}_method": st.column_config.SelectboxColumn(
                f"{p.value} method", options=table.table_methods(p), required=True
            )
            for p in Phase
        },
        **{f"{p.value}_capacity": st.column_config.NumberColumn(f"{p.value} capacity", step=1) for p in Phase},
        **{f"{p.value}_params": st.column_config.TextColumn(f"{p.value} params") for p in Phase},
    }
    problem = st.container()  # above the table: a refused cell is said where the eye is, not below ten rows
    edited = st.data_editor(
        table.to_table(plan),
        key=state.plan_table(plan_draft.plan_version()),
        hide_index=True,
        disabled=["layer"],
        column_config=columns,
    )
    try:
        from_table = table.from_table(plan, edited)
    except PlanError as exc:
        with problem:
            st.error(f"Table: {exc}. The plan keeps its last valid state; fix the cell or press Undo edits.")
            if st.button("Undo edits"):
                plan_draft.new_plan_version()  # a fresh table: the refused cell shows the plan's value again
                st.rerun()
        return
    if from_table != plan:
        controls.commit(from_table, "Table edit applied.", TABLE)
    controls.show_flash(state.designer_flash(TABLE))


def files(plan) -> None:
    st.subheader("Save, load, compare")
    saved = controls.saved_plans()
    save_col, load_col, diff_col = st.columns(3)
    with save_col:
        save(plan)
    with load_col:
        load(saved)
    with diff_col:
        diff(plan, saved)


def drafts_list() -> None:
    """This workspace's drafts (every session's, every model's), to reopen by their link or delete."""
    from polykv import drafts

    found = drafts.list_drafts(session.workspace())
    here = (session.session_id(), session.current_model()[0])
    with st.expander(f"Drafts in this workspace ({len(found)})"):
        if not found:
            st.caption("No draft yet: every edit here is kept as this session's draft.")
            return
        st.dataframe(
            [
                {
                    "model": d.model,
                    "plan": d.plan_name if d.problem is None else f"damaged: {d.problem}",
                    "last edit (UTC)": d.modified,
                    "open": f"?session={d.session}",
                    "session": d.session + (" (this one)" if d.session == here[0] else ""),
                }
                for d in found
            ],
            column_config={"open": st.column_config.LinkColumn("open", display_text="open")},
            hide_index=True,
            width="stretch",
        )
        others = [d for d in found if (d.session, d.model) != here]  # the plan being designed is not deleted here
        by_label = {f"{d.model} · {d.plan_name} · {d.modified} · session {d.session}": d for d in others}
        chosen = st.selectbox("Delete a draft", list(by_label), index=None, key=state.DRAFT_DELETE)
        if st.button("Delete", disabled=chosen is None):
            drafts.delete_draft(by_label[chosen])
            st.session_state.pop(state.DRAFT_DELETE, None)
            st.rerun()


def save(plan) -> None:
    name = st.text_input("Plan name", value=plan.name, key=state.plan_name(plan_draft.plan_version()))
    overwrite = st.checkbox("Overwrite an existing file")
    if st.button("Save to plans/"):
        try:
            folder = controls.model_plans_dir(session.current_model()[0])
            folder.mkdir(parents=True, exist_ok=True)
            outcome = saving.save_plan(plan, folder, name, overwrite)
        except (PlanError, OSError) as exc:
            st.error(first_line(exc))
        else:
            if outcome.path is None:
                st.warning(f"{outcome.message}: tick 'Overwrite' to replace it.")
            else:
                controls.commit(outcome.plan, outcome.message, FILES)
    controls.show_flash(state.designer_flash(FILES))
    st.download_button(
        "Download JSON", plan.to_json(), file_name=saving.plan_filename(plan.name), mime="application/json"
    )
    designer_tools.export_kvpress(plan)


def load(saved) -> None:
    choice = st.selectbox("Saved plans", saved, index=None, placeholder="choose a plan file", format_func=str)
    if st.button("Load", disabled=choice is None):
        controls.attempt(lambda: controls.read_plan_file(choice), f"Loaded {choice}.", LOADS)
    # no type filter: a file of another kind is refused by PolyKV in one line, not by a red chip that says nothing
    upload = st.file_uploader("Upload a plan (JSON)", key=state.PLAN_UPLOAD)
    if controls.new_upload(upload):
        controls.attempt(lambda: controls.read_plan(upload.getvalue(), upload.name), f"Loaded {upload.name}.", LOADS)
    controls.show_flash(state.designer_flash(LOADS))


def diff(plan, saved) -> None:
    other = st.selectbox(
        "Diff against", saved, index=None, placeholder="choose a plan file", format_func=str, key=state.DIFF_WITH
    )
    if other is None:
        return
    try:
        against = controls.read_plan_file(other)
    except PlanError as exc:
        st.error(str(exc))
        return
    changes = comparison.diff(against, plan)
    st.caption(f"a = {other}, b = the current plan: {len(changes)} difference(s)")
    st.dataframe(changes, hide_index=True, width="stretch")


st.title(
    "Plan designer",
    help="Select layers on the chart (drag a box over cells or bars; shift-drag adds to the selection) or in the "
    "list below, then paint a method and/or a capacity onto them. Every edit is checked against the model at once "
    "and kept as this session's draft (the URL brings it back).",
)
current, num_layers = plan_draft.plan(), session.num_layers()
controls.phase_follows_scope(current)
chart_selection(num_layers)
chart(current)
paint(current, num_layers)
plan_draft.keep_selection()
summary(current)
memory(current)
provenance(current)
layer_table(current)
files(current)
drafts_list()

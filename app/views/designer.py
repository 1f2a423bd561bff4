"""Plan designer: select layers, paint methods and capacities, fine-tune in a table, save and load."""

import os

import streamlit as st

from app import charts, common
from polykv import design
from polykv.methods import REGISTRY, for_phase
from polykv.plan import FULL, Phase, Plan, PlanError, Scope
from polykv.routing import ALLOCATIONS, plan_from_profile, scale_budget

st.title("Plan designer")
st.caption("Select layers on the chart (click a cell, or drag a box over cells or bars) or in the list below, "
           "then paint a method and/or a capacity onto them. Every edit is checked against the model at once.")

plan = common.plan()
layers = common.num_layers()
for kind, text in st.session_state.pop("designer_flash", []):
    getattr(st, kind)(text)


def commit(new, message=None):
    """Make `new` the plan and redraw; a PlanError leaves the plan as it was and says why."""
    try:
        common.set_plan(new)
    except PlanError as exc:
        st.error(str(exc))
        return
    if message:
        st.session_state["designer_flash"] = [("success", message)]
    st.rerun()


def attempt(build, message=None):
    try:
        new = build()
    except PlanError as exc:
        st.error(str(exc))
        return
    commit(new, message)


# ---- selection: the chart's selection feeds the layer list ---------------------------------------
chart_state = st.session_state.get("plan_chart") or {}
points = (chart_state.get("selection") or {}).get("points", [])
chart_layers, chart_phases = charts.selected_cells(points)
if (chart_layers, chart_phases) != st.session_state.get("chart_seen"):
    st.session_state["chart_seen"] = (chart_layers, chart_phases)
    if chart_layers:
        st.session_state["designer_layers"] = chart_layers
        if len(chart_phases) == 1:
            st.session_state["designer_phase"] = chart_phases[0]
        elif chart_phases:
            st.session_state["designer_phase"] = "both"
st.session_state["designer_layers"] = [i for i in st.session_state.get("designer_layers", []) if 0 <= i < layers]

shown_phases = ("prefill", "decode") if st.session_state.get("designer_phase", "both") == "both" else (st.session_state["designer_phase"],)
common.show(charts.plan_figure(plan, st.session_state["designer_layers"], shown_phases), "plan", key="plan_chart",
            on_select="rerun", selection_mode=("points", "box", "lasso"))
st.text("\n".join(plan.summary().lines()))

# ---- paint ---------------------------------------------------------------------------------------------
st.subheader("Paint")
left, middle, right = st.columns([3, 2, 2])
with left:
    chosen = st.multiselect("Selected layers", list(range(layers)), key="designer_layers")
    buttons = st.columns(2)
    buttons[0].button("Select all", on_click=lambda: st.session_state.update(designer_layers=list(range(layers))))
    buttons[1].button("Clear", on_click=lambda: st.session_state.update(designer_layers=[]))
with middle:
    phase = st.radio("Phase", ["both", Phase.PREFILL.value, Phase.DECODE.value], key="designer_phase", horizontal=True)
    method = st.selectbox("Method", ["(keep)", *REGISTRY], key="paint_method")
with right:
    capacity = st.number_input("Capacity (tokens per KV head)", min_value=1, step=1, value=None, key="paint_capacity",
                               placeholder="keep")
    paint_clicked = st.button("Paint selection", type="primary")
if paint_clicked:
    attempt(lambda: design.paint(plan, chosen, phase, None if method == "(keep)" else method,
                                 None if capacity is None else int(capacity)),
            f"Painted {'' if method == '(keep)' else method + ' '}{'' if capacity is None else f'@{int(capacity)} '}"
            f"onto layers {', '.join(map(str, chosen))} ({phase}).")

tools = st.columns(4)
if tools[0].button("Undo", disabled=not st.session_state.get("undo")):
    common.undo()
    st.rerun()
with tools[1].popover("Rescale to a budget"):
    summary = plan.summary().phases
    current = next((summary[p].average_capacity for p in plan.scope.phases if summary[p].average_capacity), 64.0)
    target = st.number_input("Budget (average capacity per layer)", min_value=1.0, value=float(round(current)), step=1.0)
    if st.button("Rescale (keep the route)"):
        def rescale():
            try:  # the same plan, name and description, with each active phase's capacities rescaled
                return scale_budget(plan, target, name=plan.name, description=plan.description)
            except ValueError as exc:  # a PlanError, or a budget too small for the layers' windows
                raise PlanError(f"rescale to budget {target:g}: {common.first_line(exc)}") from None
        attempt(rescale, f"Rescaled to a budget of {target:g} (average capacity per layer).")
with tools[2].popover("Build from profile"):
    mine = [p for p in common.profiles(common.current_model()[0])[0] if p.num_layers == layers]
    if not mine:
        st.info("No profile for this model yet: compute one on the Profiles page.")
    else:
        by_key = {p.key: p for p in mine}
        picked = by_key[st.selectbox("Profile", list(by_key))]
        scope = st.selectbox("Scope", [s.value for s in Scope if all(p.value in picked.meta.scopes for p in s.phases)],
                             key="build_scope")
        budget = st.number_input("Budget (average capacity per layer)", min_value=1, value=picked.meta.b_cal, step=1,
                                 key="build_budget")
        statistic = st.radio("TopRank statistic", ["cosine", "dppl"], horizontal=True, key="build_statistic")
        allocation = st.radio("Allocation", list(ALLOCATIONS), horizontal=True, key="build_allocation")
        if st.button("Build plan"):
            def build():
                try:
                    return plan_from_profile(picked, scope, int(budget), statistic, allocation)
                except ValueError as exc:
                    raise PlanError(str(exc)) from None
            attempt(build, f"Built from profile {picked.key} ({statistic}, {allocation}).")
if tools[3].button("Reset to full"):
    commit(plan.with_layers(Plan.homogeneous("full", None, layers).layers, scope=Scope.BOTH, allocation="fixed"))

# ---- table ---------------------------------------------------------------------------------------------
st.subheader("Per-layer table")
st.caption("Fine-tune methods, capacities and parameters (JSON) per layer; edits apply when they are valid.")
table = design.to_table(plan)
methods_for = {p: [FULL, *for_phase(p)] for p in Phase}  # `full` first, as in the registry
edited = st.data_editor(
    table, key=f"plan_table_{st.session_state.get('plan_version', 0)}", hide_index=True, disabled=["layer"],
    column_config={
        **{f"{p.value}_method": st.column_config.SelectboxColumn(f"{p.value} method", options=methods_for[p], required=True) for p in Phase},
        **{f"{p.value}_capacity": st.column_config.NumberColumn(f"{p.value} capacity", step=1) for p in Phase},
        **{f"{p.value}_params": st.column_config.TextColumn(f"{p.value} params") for p in Phase},
    },
)
try:
    from_table = design.from_table(plan, edited)
except PlanError as exc:
    st.error(f"Table: {exc}. The plan keeps its last valid state; fix the cell or press Undo edits.")
    if st.button("Undo edits"):
        st.session_state["plan_version"] = st.session_state.get("plan_version", 0) + 1
        st.rerun()
else:
    if from_table != plan:
        commit(from_table, "Table edit applied.")

# ---- files ---------------------------------------------------------------------------------------------
st.subheader("Save, load, compare")
saved = common.saved_plans()
save_col, load_col, diff_col = st.columns(3)
with save_col:
    name = st.text_input("Plan name", value=plan.name, key=f"plan_name_{st.session_state.get('plan_version', 0)}")
    overwrite = st.checkbox("Overwrite an existing file")
    if st.button("Save to plans/"):
        try:
            target = common.plans_dir() / design.plan_filename(name)
            named = plan.model_copy(update={"name": name.strip()})
            if os.path.lexists(target) and not overwrite:
                st.warning(f"{target.name} exists in {common.plans_dir()}: tick 'Overwrite' to replace it.")
            else:
                named.save(target)
                common.set_plan(named)
                st.session_state["designer_flash"] = [("success", f"Saved {target}")]
                st.rerun()
        except (PlanError, OSError) as exc:
            st.error(common.first_line(exc))
    st.download_button("Download JSON", plan.to_json(), file_name=design.plan_filename(plan.name), mime="application/json")
with load_col:
    choice = st.selectbox("Saved plans", saved, index=None, placeholder="choose a plan file", format_func=str)
    if st.button("Load", disabled=choice is None):
        attempt(lambda: common.read_plan_file(choice), f"Loaded {choice}.")
    upload = st.file_uploader("Upload a plan (JSON)", type=["json"], key="plan_upload")
    if upload is not None and st.session_state.get("upload_seen") != upload.file_id:
        st.session_state["upload_seen"] = upload.file_id
        attempt(lambda: common.read_plan(upload.getvalue(), upload.name), f"Loaded {upload.name}.")
with diff_col:
    other = st.selectbox("Diff against", saved, index=None, placeholder="choose a plan file", format_func=str, key="diff_with")
    if other is not None:
        try:
            against = common.read_plan_file(other)
        except PlanError as exc:
            st.error(str(exc))
        else:
            changes = design.diff(against, plan)
            st.caption(f"a = {other}, b = the current plan: {len(changes)} difference(s)")
            st.dataframe(changes, hide_index=True, width="stretch")

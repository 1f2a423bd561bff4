"""The designer's allocation and export tools, drawn inside its sections (`app.views.designer`): a rule's split of
the budget drawn before it is applied, the plan as a kvpress press, and a run's measured KV beside the plan."""

import streamlit as st

from app import designer_controls as controls
from app import session, state
from polykv.errors import PolyKVError, first_line
from polykv.eval.results.kv_measured import heads_line
from polykv.plan import PlanError
from polykv.plan_edits import saving, whole_plan


def split_by_rule(plan) -> None:
    """An allocation rule for the plan's methods, over every layer or the selected ones: the capacities it gives,
    drawn before they are applied; then how each layer's budget splits over its KV heads."""
    rule = st.radio("Rule", list(whole_plan.RULE_CHOICES), horizontal=True, key=state.SPLIT_RULE)
    selected = controls.selected_layers()
    over = "all layers"
    if selected and len(selected) < plan.num_layers:
        some = f"the {len(selected)} selected layer{'s' * (len(selected) != 1)}"
        over = st.radio("Over", ["all layers", some], horizontal=True, key=state.SPLIT_OVER)
    layers = None if over == "all layers" else selected
    budget = st.number_input(
        "Budget of the split (average capacity per layer)",
        min_value=1.0,
        value=float(round(whole_plan.selection_budget(plan, layers))),
        step=1.0,
        key=state.SPLIT_BUDGET,
    )
    windows = session.layer_windows()
    try:
        preview = whole_plan.rule_preview(plan, rule, budget, windows, layers)
    except PlanError as exc:
        st.error(str(exc))
    else:
        if rule == "cake":
            predict_cake(plan, budget, windows)
        else:
            st.bar_chart({phase: capacities for phase, capacities in preview.items()}, stack=False, height=180)
            st.caption(
                "Capacity per layer (layer 0 first) that the rule gives"
                + ("" if layers is None else "; the layers not selected keep theirs")
                + ("; a local layer gets at most its window less one." if any(w is not None for w in windows) else ".")
            )
        if st.button("Apply the rule", key=state.SPLIT_APPLY):
            where = "" if layers is None else f" over layers {', '.join(map(str, sorted(layers)))}"
            controls.attempt(
                lambda: whole_plan.split_by_rule(plan, rule, budget, windows, layers),
                f"Split by the {rule} rule{where} at a budget of {budget:g} (average capacity per layer).",
            )
    heads = st.radio(
        "KV heads",
        list(whole_plan.HEAD_CHOICES),
        index=whole_plan.HEAD_CHOICES.index(plan.head_allocation),
        horizontal=True,
        key=state.SPLIT_HEADS,
        help="uniform: every KV head keeps the layer's capacity. adakv (Ada-KV): the layer keeps its capacity x heads "
        "best scores across its heads at each cut (the prompt, every decode step), each head at least 0.2 of capacity.",
    )
    if heads != plan.head_allocation and st.button("Apply to the KV heads", key=state.SPLIT_HEADS_APPLY):
        controls.attempt(lambda: whole_plan.with_head_rule(plan, heads), f"KV heads: {heads}.")


PREDICT_SEQUENCES, PREDICT_TOKENS = 2, 1024  # calibration text CAKE's split is predicted on


def predict_cake(plan, budget: float, windows) -> None:
    """CAKE's rule splits each prompt's total at run time: its split on calibration text, on request (it runs the
    model), drawn as what a prompt like it would get."""
    from polykv.models import context_length
    from polykv.profile.corpus import calibration_text
    from polykv.routing.rules import predicted_split
    from polykv.search.objective import plan_key

    st.caption(
        "CAKE's rule splits each phase's total at run time, from each prompt's attention; the KV each layer held is "
        "measured with every sample. Its split on calibration text predicts what a prompt like it gets."
    )
    ruled = whole_plan.split_by_rule(plan, "cake", budget, windows)
    key = (plan_key(ruled), budget)
    predicted = st.session_state.get(state.SPLIT_PREDICTED, {})
    if key not in predicted and st.button("Predict on calibration text", key=state.SPLIT_PREDICT):
        name, _, model, tokenizer = session.current_model()
        tokens = min(PREDICT_TOKENS, context_length(model) or PREDICT_TOKENS)
        try:
            with st.spinner("Running the model on calibration text..."):
                text = calibration_text(name, model, tokenizer, PREDICT_SEQUENCES, tokens)
                predicted = {key: (predicted_split(model, ruled, text), min(len(ids) for ids in text))}
        except (PolyKVError, ValueError, OSError) as exc:  # a plan the prompts cannot run, a missing source
            st.error(f"Not predicted: {first_line(exc)}")
            return
        st.session_state[state.SPLIT_PREDICTED] = predicted
    if key in predicted:
        split, tokens = predicted[key]
        st.bar_chart(split, stack=False, height=180)
        st.caption(
            f"Capacity per layer (layer 0 first) CAKE's rule gave on {PREDICT_SEQUENCES} calibration sequences of "
            f"{tokens} tokens, their mean; each prompt gets its own."
        )


def export_kvpress(plan) -> None:
    """The plan as a kvpress press for one prompt length, or why kvpress cannot express it."""
    from polykv.kvpress_export import kvpress_source

    with st.popover("Export to kvpress"):
        tokens = st.number_input("Prompt length (tokens)", min_value=1, value=8192, step=1024, key=state.EXPORT_TOKENS)
        try:
            source = kvpress_source(plan, int(tokens), session.layer_windows())
        except PlanError as exc:
            st.info(f"Not expressible in kvpress: {exc}")
            return
        st.caption("A Python file that builds the kvpress press keeping what this plan keeps at that prompt length.")
        st.download_button(
            "Download kvpress press (.py)",
            source,
            file_name=saving.plan_filename(plan.name).removesuffix(".json") + "_kvpress.py",
            mime="text/x-python",
        )


def measured(plan) -> None:
    """Beside the plan's capacities, what a run of it held per layer, measured from its cache."""
    runs = controls.measured_runs(plan)
    kv = None
    if runs:
        run = st.selectbox(
            "Measured in a run of this plan",
            runs,
            format_func=lambda r: f"{r.id} ({r.suite}, {r.created[:16]})",
            key=state.MEASURED_RUN,
        )
        kv = controls.measured_kv_of(run)
    if kv is None:
        st.caption("No run of this plan has measured the KV it held yet (a run's samples measure it: Runs page).")
        return
    # a prefill phase decides what is held entering the answer; a decode-only plan holds the prompt until then
    first = plan.scope.phases[0]
    held, when = (kv.entering, "entering the answer") if first.value == "prefill" else (kv.end, "at the end")
    st.bar_chart(
        {"planned capacity": [layer[first].capacity or 0 for layer in plan.layers], "held, measured": held},
        stack=False,
        height=200,
    )
    st.caption(
        f"Per layer (layer 0 first): the {first.value} capacity as planned, and the slots each layer held {when}, "
        f"measured (mean of {kv.samples} sample{'s' * (kv.samples != 1)})."
    )
    heads = heads_line(kv)
    if heads:  # a head-level split (adakv): what each KV head held, where a layer's heads differ
        st.caption(heads[0].upper() + heads[1:] + ".")

"""Heterogeneity: how many positions hold most of each layer's attention, and where they lie (Figure 1)."""

import streamlit as st

from app import charts, common, job_controls, session, state
from polykv.errors import first_line
from polykv.eval.launch.work import heterogeneity_work
from polykv.profile.corpus import default_sources
from polykv.text import duration

st.title("Attention heterogeneity")
st.caption(
    "For each input, the first decoding query's attention (mean over heads) in each layer; the support "
    "set is the fewest positions that hold the chosen share of it. Inputs are drawn from the model's "
    "default calibration sources: public-domain text, Python source and text the model samples (for the "
    "demo model, only its own samples: the text it models well)."
)

name, device, _, _ = session.current_model()
with st.form(state.HETEROGENEITY_FORM, enter_to_submit=False):
    cols = st.columns(5)
    inputs = cols[0].number_input("Inputs", min_value=1, max_value=64, value=8, step=1)
    max_tokens = cols[1].number_input(
        "Tokens per input", min_value=16, max_value=32768, value=512, step=16, help="Clipped to the model's context"
    )
    coverage = cols[2].slider("Attention share", 0.5, 0.99, 0.9, 0.01)
    sources = cols[3].multiselect("Sources", common.source_choices(name), default=list(default_sources(name)))
    density_input = cols[4].number_input("Density map of input", min_value=0, max_value=63, value=0, step=1)
    cols = st.columns([1, 1, 4])
    measured = cols[0].form_submit_button("Measure", type="primary")
    cols[1].form_submit_button("Estimate", help="Estimate the time these settings take here, without measuring")
estimated = job_controls.show_estimate(
    lambda: heterogeneity_work(sources, int(inputs), min(int(max_tokens), session.context_length() or int(max_tokens))),
    state.HETEROGENEITY_MEASURE_SPEED,
)
if measured:
    st.session_state[state.HETEROGENEITY_ASKED] = True
if not st.session_state.get(state.HETEROGENEITY_ASKED):  # opening the page computes nothing
    st.info(
        "Nothing is measured until you press Measure: each input is one pass of the model over its tokens "
        "(the defaults take seconds on the demo model, about a minute on a 135M model on a laptop CPU)."
    )
    st.stop()

if not sources:
    st.error("Choose at least one source.")
    st.stop()
try:
    frame, density, length, index, seconds = common.heterogeneity(
        (name, device), int(inputs), int(max_tokens), float(coverage), tuple(sources), int(density_input)
    )
except (ValueError, OSError) as exc:
    st.error(f"Could not measure: {first_line(exc)}")
    st.stop()

st.caption(
    f"{int(inputs)} inputs of {length} tokens; median over inputs with a bootstrap 95% interval."
    if int(inputs) > 1
    else f"1 input of {length} tokens: one measurement per layer, no interval (a bootstrap interval needs 2 inputs)."
)
took = f"Measured in {duration(seconds)}"  # when measured (a cached measurement keeps its own time)
st.caption(took + (f" (estimated about {duration(estimated.seconds)})." if estimated is not None else "."))
common.show(charts.support_figure(frame, coverage, session.layer_windows()), "support")
st.caption(f"Density map: input {index}.")
common.show(charts.density_figure(density), "density")
with st.expander("Numbers"):
    st.dataframe(frame.round(3), hide_index=True)

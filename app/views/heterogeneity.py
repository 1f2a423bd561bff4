"""Heterogeneity: how many positions hold most of each layer's attention, and where they lie (Figure 1)."""

import streamlit as st

from app import charts, common
from polykv.profile.corpus import KNOWN_SOURCES, CorpusSpec, build_corpus, default_sources
from polykv.profile.heterogeneity import measure_heterogeneity

st.title("Attention heterogeneity")
st.caption("For each input, the first decoding query's attention (mean over heads) in each layer; the support "
           "set is the fewest positions that hold the chosen share of it. Inputs are drawn from the model's "
           "default calibration sources: public-domain text, Python source and text the model samples (for the "
           "demo model, only its own samples: the text it models well).")

name, device, model, tokenizer = common.current_model()
with st.form("heterogeneity_form"):
    cols = st.columns(5)
    inputs = cols[0].number_input("Inputs", min_value=1, max_value=64, value=8, step=1)
    max_tokens = cols[1].number_input("Tokens per input", min_value=16, max_value=32768, value=512, step=16,
                                      help="Clipped to the model's context")
    coverage = cols[2].slider("Attention share", 0.5, 0.99, 0.9, 0.01)
    sources = cols[3].multiselect("Sources", list(dict.fromkeys((*default_sources(name), *KNOWN_SOURCES))),
                                  default=list(default_sources(name)))
    density_input = cols[4].number_input("Density map of input", min_value=0, max_value=63, value=0, step=1)
    st.form_submit_button("Measure")


@st.cache_data(show_spinner="Building the inputs...", max_entries=8)
def inputs_for(model_key, inputs, max_tokens, sources):
    _, _, model, tokenizer = common.current_model()
    spec = CorpusSpec(sources=sources, num_sequences=inputs, max_tokens=max_tokens, seed=0)
    return build_corpus(tokenizer, spec, model=model).sequences


@st.cache_data(show_spinner="Measuring attention support...", max_entries=16)
def measure(model_key, inputs, max_tokens, coverage, sources, density_input):
    model = common.current_model()[2]
    sequences = inputs_for(model_key, inputs, max_tokens, sources)
    result = measure_heterogeneity(model, sequences, coverage=coverage)
    index = min(density_input, len(sequences) - 1)
    density = result.density if index == 0 else measure_heterogeneity(model, [sequences[index]], coverage=coverage, bootstrap=1).density
    return result.to_frame("layers"), density, len(sequences[0]), index


if not sources:
    st.error("Choose at least one source.")
    st.stop()
try:
    frame, density, length, index = measure((name, device), int(inputs), int(max_tokens), float(coverage),
                                            tuple(sources), int(density_input))
except (ValueError, OSError) as exc:
    st.error(f"Could not measure: {common.first_line(exc)}")
    st.stop()

st.caption(f"{int(inputs)} inputs of {length} tokens; median over inputs with a bootstrap 95% interval.")
common.show(charts.support_figure(frame, coverage), "support")
st.caption(f"Density map: input {index}.")
common.show(charts.density_figure(density), "density")
with st.expander("Numbers"):
    st.dataframe(frame.round(3), hide_index=True)

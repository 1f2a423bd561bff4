"""PolyKV's web app: `streamlit run app/app.py --server.address 127.0.0.1`.

The model is chosen once in the sidebar (the embedded demo model by default; any Hugging Face id or
local path; CPU or GPU) and loaded once per process. Pages live in `app/views/` (one thin file each);
everything they compute comes from `polykv`.
"""

import sys
from pathlib import Path

# The repo root first, so that `app` is this folder's package and not this script.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path[:1]:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from app import common  # noqa: E402

st.set_page_config(page_title="PolyKV", page_icon=":material/view_column:", layout="wide")

with st.sidebar:
    st.markdown("### PolyKV")
    name, device = st.session_state.get("model", ("demo", "cpu"))
    with st.form("model_form"):
        typed = st.text_input("Model", value=name, help="'demo' (the embedded stories260K), a Hugging Face id or a local path")
        devices = ["cpu"] + (["cuda"] if common.cuda_available() else [])
        chosen = st.selectbox("Device", devices, index=devices.index(device) if device in devices else 0)
        if st.form_submit_button("Load model"):
            problem = common.load_model(typed.strip(), chosen)
            if problem:
                st.session_state["model_error"] = problem
            else:
                st.session_state.pop("model_error", None)
    if st.session_state.get("model_error"):
        st.error(st.session_state["model_error"])
    try:
        loaded_name, loaded_device, model, _ = common.current_model()
        st.caption(f"Model: **{loaded_name}** on {loaded_device}, {common.num_layers()} layers")
    except Exception as exc:  # the last good model could not be reloaded: fall back to the demo
        st.session_state["model"] = ("demo", "cpu")
        st.error(f"Model unavailable ({common.first_line(exc)}); using the demo model.")
    st.radio("Figure downloads (camera button)", ["png", "svg"], horizontal=True, key="figure_format")

pages = [
    st.Page("views/heterogeneity.py", title="Heterogeneity", icon=":material/scatter_plot:", url_path="heterogeneity"),
    st.Page("views/profiles.py", title="Profiles", icon=":material/grid_on:", url_path="profiles"),
    st.Page("views/designer.py", title="Plan designer", icon=":material/brush:", url_path="designer", default=True),
    st.Page("views/runs.py", title="Runs", icon=":material/play_circle:", url_path="runs"),
    st.Page("views/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
]
try:
    st.navigation(pages).run()
except Exception as exc:  # Streamlit's own rerun/stop signals are not Exceptions: they pass through
    common.show_failure(exc)

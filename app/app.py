"""PolyKV's web app: `streamlit run app/app.py --server.address 127.0.0.1`.

The model is chosen once in the sidebar (smollm2, the embedded SmolLM2-135M-Instruct, by default; the
5-layer `demo`, any Hugging Face id or local path; CPU or GPU) and loaded once per process. Pages live in
`app/views/` (one thin file each); everything they compute comes from `polykv`.
"""

import sys
from pathlib import Path

# The repo root first, so that `app` is this folder's package and not this script.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path[:1]:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from app import common, plan_draft, session, state  # noqa: E402
from polykv.errors import first_line  # noqa: E402

# An emoji favicon is drawn in the browser; a ":material/...:" one would be fetched from a CDN.
st.set_page_config(page_title="PolyKV", page_icon="🧩", layout="wide")

# Less empty space above each page's title (Streamlit's default is 6rem): the designer's chart and its paint
# controls then fit together in a 1280x800 window. A style-only st.html takes no room on the page.
st.html("<style>[data-testid='stMainBlockContainer'] { padding-top: 1.5rem; }</style>")

session.session_id()  # first: a reload finds this session's model and drafts through the URL
session.remember_pages()  # what was entered on a page is there when it opens again (and `save_pages`, last)

with st.sidebar:
    st.markdown("### PolyKV")
    name, device = session.chosen_model()
    st.session_state.setdefault(state.MODEL_TEXT, name)
    with st.form(state.MODEL_FORM):
        st.text_input(
            "Model",
            key=state.MODEL_TEXT,
            help="'demo' (the embedded stories260K), 'smollm2' (SmolLM2-135M-Instruct, 30 layers), 'gemma3' (Gemma 3 "
            "270M, 18 layers: 15 local, 3 global), a Hugging Face id, a local model directory or a .gguf file",
        )
        devices = session.devices()
        st.selectbox("Device", devices, index=common.index_of(devices, device), key=state.MODEL_DEVICE)
        st.form_submit_button("Load model", on_click=plan_draft.request_model_from_form)
    if session.model_error():
        st.error(session.model_error())
    try:
        loaded_name, loaded_device, model, _ = session.current_model()
        st.caption(f"Model: **{loaded_name}** on {loaded_device}, {session.num_layers()} layers{session.layer_kinds()}")
    except Exception as exc:  # the last good model could not be reloaded: fall back to the demo
        plan_draft.fall_back_to_demo()
        st.error(f"Model unavailable ({first_line(exc)}); using the demo model.")
    st.radio("Figure downloads (camera button)", ["png", "svg"], horizontal=True, key=state.FIGURE_FORMAT)

pending = plan_draft.pending_model()
if pending is not None:  # the plan does not fit the new model: ask, at the top of the page, before it leaves
    with st.container(border=True):
        st.warning(pending[2])
        with st.container(horizontal=True):
            st.button("Switch", type="primary", on_click=plan_draft.answer_pending_model, args=(True,))
            st.button("Stay", on_click=plan_draft.answer_pending_model, args=(False,))

# Navigation icons (":material/...:") come with Streamlit's own font: nothing is fetched for them.
designer = st.Page("views/designer.py", title="Plan designer", icon=":material/brush:", url_path="designer")


def _home() -> None:
    """`/` opens the designer at its own URL, `/designer` (a default page is served only at `/`)."""
    st.switch_page(designer)


pages = [
    st.Page(_home, title="PolyKV", url_path="home", default=True, visibility="hidden"),
    st.Page("views/heterogeneity.py", title="Heterogeneity", icon=":material/scatter_plot:", url_path="heterogeneity"),
    st.Page("views/profiles.py", title="Profiles", icon=":material/grid_on:", url_path="profiles"),
    designer,
    st.Page("views/runs.py", title="Runs", icon=":material/play_circle:", url_path="runs"),
    st.Page("views/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
    st.Page("views/experiments.py", title="Experiments", icon=":material/science:", url_path="experiments"),
    st.Page("views/search.py", title="Plan search", icon=":material/travel_explore:", url_path="search"),
]
try:
    st.navigation(pages).run()
except Exception as exc:  # Streamlit's own rerun/stop signals are not Exceptions: they pass through
    session.show_failure(exc)
finally:  # also on a rerun or stop: what was entered before it is saved
    session.save_pages()

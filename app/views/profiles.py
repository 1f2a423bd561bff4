"""Profiles: how well each method preserves each layer against FullKV, and each layer's entropy."""

import streamlit as st

from app import charts, common, state
from polykv import jobs
from polykv.errors import PolyKVError
from polykv.plan import Scope
from polykv.profile.corpus import default_sources
from polykv.profile.store import refresh_command

st.title("Method profiles")
st.caption(
    "Each method runs alone in one layer at the calibration capacity b_cal (all other layers FullKV): "
    "the cosine of the layer's mean hidden state and the perplexity change (dPPL) against FullKV."
)

name, device, _, _ = common.current_model()
workspace = common.workspace()
root = workspace / "profiles"

# ---- compute one in the background --------------------------------------------------------------
with st.expander("Compute a profile", expanded=not root.is_dir()):
    with st.form(state.PROFILE_FORM):
        cols = st.columns(5)
        defaults = common.profile_defaults(name)
        sequences = cols[0].number_input("Sequences", min_value=1, max_value=200, value=defaults["sequences"])
        max_tokens = cols[1].number_input(
            "Tokens per sequence", min_value=32, max_value=32768, value=defaults["max_tokens"], step=32
        )
        b_cal = cols[2].number_input("b_cal (0: automatic)", min_value=0, value=0, step=1)
        scopes = [s.value for s in Scope]
        scope = cols[3].selectbox("Scopes", scopes, index=common.index_of(scopes, Scope.BOTH.value))
        # The model's own default sources first (for the demo: its samples, the text it models well).
        sources = cols[4].multiselect("Sources", common.source_choices(name), default=list(default_sources(name)))
        if st.form_submit_button("Start profiling"):
            if not sources:
                st.error("Choose at least one source.")
            else:
                try:
                    job = common.profile_job(name, device, sources, sequences, max_tokens, b_cal, scope)
                    jobs.start(job, workspace)
                except (PolyKVError, ValueError) as exc:
                    st.error(f"Not started: {common.first_line(exc)}")
                else:
                    st.rerun()


profile_jobs = common.jobs_of(jobs.list_jobs(workspace), "profile", name, limit=3)
running_at_load = common.running(profile_jobs, workspace)


@st.fragment(run_every=2 if running_at_load else None)
def profile_progress():
    """Polls while a profile job runs; redraws the whole page when one finishes (its profile appears)."""
    for job in profile_jobs:
        progress = jobs.state(job, workspace)
        if job.id in running_at_load and progress.status != "running":
            st.rerun()
        if progress.status == "failed":
            st.error(f"{job.id} failed: {progress.error}")
            continue
        st.progress(
            min(1.0, progress.fraction),
            text=f"{job.id}: {progress.status} · {progress.summary()}"
            + (f" · {progress.message}" if progress.message else ""),
        )
        if progress.status == "running" and st.button("Cancel", key=state.cancel_button(job.id)):
            try:
                jobs.cancel(job, workspace)
            except PolyKVError as exc:
                st.error(common.first_line(exc))
            else:
                st.rerun()


profile_progress()

# ---- open a saved one --------------------------------------------------------------------------------
mine, unreadable = common.profiles(name)
for text in unreadable:
    st.warning(text)
if not mine:
    st.info(f"No profile of {name!r} in {root} yet: compute one above (it runs in the background).")
    st.stop()
by_key = {p.key: p for p in mine}
profile = by_key[st.selectbox("Profile", list(by_key), format_func=lambda k: f"{k}  (b_cal {by_key[k].meta.b_cal})")]
st.caption(
    f"{profile.path} · computed {profile.metadata.get('created', '?')} in {profile.metadata.get('seconds', '?')} s"
)
if profile.meta.fullkv_ppl:
    st.caption(
        "FullKV perplexity of the calibration continuations: "
        + ", ".join(f"{source} {ppl:.2f}" for source, ppl in profile.meta.fullkv_ppl.items())
        + f" · the table gives each cell's 95% bootstrap interval over the "
        f"{profile.meta.corpus.num_sequences} calibration sequences"
    )
stale = profile.stale_reasons()
if stale:  # routes from it are refused; say so here rather than only in the designer
    st.warning(
        f"Stale profile ({'; '.join(stale)}): recompute it before building routes from it "
        f"(`{refresh_command(profile)}`)."
    )
for scope in profile.meta.scopes:
    st.subheader(scope)
    common.show(charts.profile_heatmap(profile.table, scope, "cosine"), f"{profile.key}-{scope}-cosine")
    common.show(charts.profile_heatmap(profile.table, scope, "dppl"), f"{profile.key}-{scope}-dppl")
common.show(charts.entropy_figure(profile.entropy), f"{profile.key}-entropy")
with st.expander("Table"):
    st.dataframe(profile.table, hide_index=True)

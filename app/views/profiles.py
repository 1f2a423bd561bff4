"""Profiles: how well each method preserves each layer against FullKV, which one wins each layer and by how
much (TopRank's pick, its margin and bootstrap win frequency), and each layer's entropy."""

import itertools

import streamlit as st

from app import charts, common, job_controls, job_forms, session, state
from polykv import jobs
from polykv.errors import PolyKVError, first_line
from polykv.eval.statistics.render import number
from polykv.plan import Scope
from polykv.profile.corpus import default_sources
from polykv.profile.store import ProfileError, refresh_command
from polykv.routing.confidence import NOISE_WARNING, few_sequences_warning, is_noisy, ranked_cells, route_confidence

st.title("Method profiles")
st.caption(
    "Each method runs alone in one layer at the calibration capacity b_cal (all other layers FullKV): "
    "the cosine of the layer's mean hidden state and the perplexity change (dPPL) against FullKV."
)

name, device, _, _ = session.current_model()
workspace = session.workspace()
root = workspace / "profiles"

# ---- compute one in the background --------------------------------------------------------------
with st.expander("Compute a profile", expanded=not root.is_dir()):
    with st.form(state.PROFILE_FORM, enter_to_submit=False):
        cols = st.columns(5)
        defaults = job_forms.profile_defaults(name)
        sequences = cols[0].number_input("Sequences", min_value=1, max_value=200, value=defaults["sequences"])
        max_tokens = cols[1].number_input(
            "Tokens per sequence", min_value=32, max_value=32768, value=defaults["max_tokens"], step=32
        )
        b_cal = cols[2].number_input("b_cal (0: automatic)", min_value=0, value=0, step=1)
        scopes = [s.value for s in Scope]
        scope = cols[3].selectbox("Scopes", scopes, index=common.index_of(scopes, Scope.BOTH.value))
        # The model's own default sources first (for the demo: its samples, the text it models well).
        sources = cols[4].multiselect("Sources", common.source_choices(name), default=list(default_sources(name)))
        cols = st.columns([1, 1, 4])
        started = cols[0].form_submit_button("Start profiling", type="primary")
        cols[1].form_submit_button("Estimate", help="Estimate the time these settings take here, without starting")

    def described_job():
        return job_forms.profile_job(name, device, sources, sequences, max_tokens, b_cal, scope)

    if not sources:
        st.error("Choose at least one source.")
    else:
        job_controls.launch_estimate(described_job, state.PROFILE_MEASURE_SPEED)
        if started:
            job_controls.start_job(described_job)


profile_jobs = job_controls.jobs_of(jobs.list_jobs(workspace), "profile", name, limit=3)
running_at_load = job_controls.running(profile_jobs, workspace)


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
                st.error(first_line(exc))
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
if profile.meta.fullkv_ppl:  # the reference every dPPL is measured against, one number per source
    for column, (source, ppl) in zip(
        itertools.cycle(st.columns(min(4, len(profile.meta.fullkv_ppl)))), profile.meta.fullkv_ppl.items()
    ):
        column.metric(f"FullKV perplexity · {source}", number(ppl, ".2f"))
    st.caption(
        f"Each cell's 95% interval is a bootstrap over the {profile.meta.corpus.num_sequences} calibration "
        "sequences; the win frequency is how often the winner stays the best across those resamples."
    )
stale = profile.stale_reasons()
if stale:  # routes from it are refused; say so here rather than only in the designer
    st.warning(
        f"Stale profile ({'; '.join(stale)}): recompute it before building routes from it "
        f"(`{refresh_command(profile)}`)."
    )
left, right = st.columns(2)
statistics = profile.statistics()
if st.session_state.get(state.PROFILE_STATISTIC) not in statistics:  # danswer chosen on a workload profile
    st.session_state.pop(state.PROFILE_STATISTIC, None)
statistic = left.radio(
    "Statistic",
    statistics,
    format_func=lambda s: "dPPL" if s == "dppl" else s,
    horizontal=True,
    key=state.PROFILE_STATISTIC,
    help="What ranks the methods of a layer and picks TopRank's winner: cosine (higher is better), dPPL (lower) "
    "and, in a profile of a workload's own prompts, danswer: the change of the gold answer's NLL per token "
    "(lower).",
)
view = right.radio(
    "View",
    charts.PROFILE_VIEWS,
    horizontal=True,
    key=state.PROFILE_VIEW,
    help="rank: 1 = best in the layer; 1 - cosine on a log scale shows the gaps a cosine near 1 hides.",
)
windows = session.layer_windows() if profile.num_layers == session.num_layers() else []
local = sorted({w for w in windows if w is not None})
if local and profile.meta.b_cal >= local[0] - 1:
    st.caption(
        f"Local layers (L) keep their window ({local[0] - 1} tokens at most) at this profile's b_cal of "
        f"{profile.meta.b_cal}: no method evicts there, so their rows tie; the global layers (G) are what it ranks."
    )
for scope in profile.meta.scopes:
    st.subheader(scope)
    try:
        cells = ranked_cells(profile.table, scope, statistic)
    except ValueError as exc:
        st.error(f"{scope}: {first_line(exc)}")
        continue
    try:
        confidence = route_confidence(profile, scope, statistic)
    except (ProfileError, ValueError) as exc:  # stale, or saved without per-sequence values
        confidence = None
        st.info(f"No win frequencies for {scope}: {first_line(exc)}")
    figure = charts.profile_decision_figure(cells, scope, view, statistic, confidence, windows)
    common.show(figure, f"{profile.key}-{scope}-{view}-{statistic}")
    if confidence is None:
        continue
    few = few_sequences_warning(profile.meta.corpus.num_sequences)
    if few is not None:
        st.warning(f"{scope}: {few}.")
    if is_noisy(confidence):
        st.warning(f"{scope}: {NOISE_WARNING} (median win frequency {confidence['win_frequency'].median():.0%}).")
    st.dataframe(
        confidence.rename(columns={"runner_up": "runner-up", "win_frequency": "win frequency"}),
        hide_index=True,
        column_config={
            # cosine margins are 1e-5-ish: scientific notation keeps their digits readable
            "margin": st.column_config.NumberColumn(
                f"margin ({statistic})", format="%.2e" if statistic == "cosine" else "%.3f"
            ),
            "win frequency": st.column_config.NumberColumn(format="percent"),
        },
    )
common.show(charts.entropy_figure(profile.entropy), f"{profile.key}-entropy")
with st.expander("Table"):
    st.dataframe(profile.table, hide_index=True)

"""Plan search: from the designer's plan (and TopRank, and the best homogeneous plan), search for a plan that
executes closer to FullKV at the same total capacity, as a background job; follow its trace and its best
plan live; read the held-out verdict; open the result in the designer. The work is `polykv.search`."""

import pandas as pd
import streamlit as st

from app import charts, common, designing, editing, session, state
from polykv import jobs
from polykv.errors import PolyKVError
from polykv.eval.experiments import plan_budget
from polykv.jobs.search import launch_search, live, read_search, start_problem
from polykv.plan import Plan, PlanError, Scope
from polykv.search.report import difference_text

st.title("Plan search")
st.caption(
    "Local search over methods and capacities per layer at an exactly fixed total capacity, minimising "
    "KL(FullKV || plan) on calibration sequences with the plan really executed; the verdict compares the "
    "searched plan with TopRank and the best homogeneous plan on separate held-out sequences (paired "
    "bootstrap over sequences)."
)
name, device, _, _ = session.current_model()
workspace = session.workspace()
plan = designing.plan()
demo = name == session.DEFAULT_MODEL[0]

# ---- launch ------------------------------------------------------------------------------------------------
profiles = common.fitting_profiles()
if not profiles:
    st.info("No profile of this model yet: compute one on the Profiles page (it ranks the moves and gives TopRank).")
else:
    with st.form(state.SEARCH_FORM):
        cols = st.columns(4)
        profile = cols[0].selectbox("Profile", [p.key for p in profiles])
        scopes = [s.value for s in Scope]
        scope = cols[1].selectbox("Scope", scopes, index=common.index_of(scopes, plan.scope.value))
        budget = cols[2].number_input(
            "Budget", min_value=2, value=plan_budget(plan) or 32, step=1, help="Average capacity per layer"
        )
        evaluations = cols[3].number_input(
            "Evaluations", min_value=1, value=120 if demo else 800, step=10, help="Plan executions the search may run"
        )
        cols = st.columns(4)
        search_sequences = cols[0].number_input("Search sequences", min_value=1, value=4 if demo else 16)
        held_out = cols[1].number_input("Held-out sequences", min_value=2, value=8 if demo else 48)
        max_tokens = cols[2].number_input("Tokens per sequence", min_value=16, value=256 if demo else 512, step=16)
        seed = cols[3].number_input("Seed", min_value=0, value=0, step=1)
        started = st.form_submit_button("Start search", type="primary")
    problem = start_problem(plan, scope, int(budget))
    st.caption(
        f"Starts from the designer's plan {plan.name!r}, TopRank and the best homogeneous plan."
        if problem is None
        else f"The designer's plan is not a start ({problem}): the search starts from TopRank and the best "
        "homogeneous plan."
    )
    if started:
        common.start_job(
            lambda: launch_search(
                workspace,
                name,
                device,
                profile=profile,
                scope=scope,
                budget=int(budget),
                start=plan,
                evaluations=int(evaluations),
                seed=int(seed),
                search_sequences=int(search_sequences),
                held_out=int(held_out),
                max_tokens=int(max_tokens),
            ),
            state.SEARCH_FLASH,
        )
editing.show_flash(state.SEARCH_FLASH)

# ---- the searches (polled while one runs) -----------------------------------------------------------------------
searches = common.jobs_of(jobs.list_jobs(workspace), "search", name, limit=10)
if not searches:
    st.stop()
chosen = st.selectbox("Search", searches, format_func=lambda j: f"{j.title} · {j.id}", key=state.SEARCH_JOB)
running_at_load = common.running([chosen], workspace)


def verdict(job) -> None:
    """The held-out verdict of a finished search, and its plan into the designer."""
    try:
        entry = read_search(job, workspace)["budgets"][0]
    except PolyKVError as exc:
        st.error(common.first_line(exc))
        return
    found = entry["verdict"]
    st.subheader(f"Held-out verdict: {found['sequences']} sequences (FullKV perplexity {found['fullkv_ppl']:.3f})")
    st.dataframe(
        pd.DataFrame(
            [{"role": role, **{k: p[k] for k in ("name", "kl", "top1", "ppl")}} for role, p in found["plans"].items()]
        ),
        hide_index=True,
        width="stretch",
    )
    rows = [
        {
            "A - B": f"{c['a']} - {c['b']}",
            "metric": c["metric"],
            "difference [95% CI]": difference_text(c),
            "A is": c["verdict"],
        }
        for c in found["contrasts"]
        if c["a"] == "searched"
    ]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    moves = entry["plan"].get("provenance", {}).get("moves", [])
    st.caption(f"{len(moves)} moves taken: " + ("; ".join(moves) if moves else "none (the start was best)"))
    if st.button("Open the searched plan in the designer", type="primary"):
        try:
            designing.set_plan(Plan.from_dict(entry["plan"]))
        except PlanError as exc:
            st.error(common.first_line(exc))
        else:
            st.switch_page("views/designer.py")


@st.fragment(run_every=2 if running_at_load else None)
def follow() -> None:
    progress = jobs.state(chosen, workspace)
    if chosen.id in running_at_load and progress.status != "running":
        st.rerun()  # finished: redraw the page (and stop polling)
    st.markdown(f"**{chosen.title}** · `{chosen.id}` · {progress.status}")
    st.progress(min(1.0, progress.fraction), text=f"{progress.summary()} · {progress.message}")
    if progress.error:
        st.error(progress.error)
    common.job_controls(chosen, progress, workspace)
    trace, best = live(progress)
    if trace:
        common.show(charts.search_trace_figure(trace, chosen.search["metric"]), f"{chosen.id}-trace")
    if best is not None:
        st.caption(f"Best plan so far: {best.name}")
        common.show(charts.plan_figure(best), f"{chosen.id}-best")
    if progress.status == "finished":
        verdict(chosen)


follow()

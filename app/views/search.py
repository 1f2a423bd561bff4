"""Plan search: from the designer's plan (and TopRank, and the best homogeneous plan), search for a plan that
executes closer to FullKV at the same total capacity, as a background job; follow its trace and its best
plan live; read the held-out verdict; open the result in the designer. The work is `polykv.search`."""

import pandas as pd
import streamlit as st

from app import charts, common, designer_controls, job_controls, plan_draft, session, state
from polykv import jobs, question_protocol
from polykv.errors import PolyKVError, first_line
from polykv.eval.experiments import plan_budget
from polykv.eval.running.settings import COMPETENCE_THRESHOLD
from polykv.jobs.search import launch_search, live, read_search, search_start
from polykv.plan import Plan, PlanError, Scope
from polykv.question_protocol import QuestionProtocol
from polykv.search.text.report import difference_text
from polykv.search.workload.report import WorkloadReport
from polykv.search.workload.verdict_text import MDE_NOTE, VERDICT_HEADER, verdict_rows

st.title("Plan search")
st.caption(
    "Local search over methods and capacities per layer at an exactly fixed total capacity, minimising "
    "KL(FullKV || plan) on calibration sequences with the plan really executed; the verdict compares the "
    "searched plan with TopRank and the best homogeneous plan on separate held-out sequences (paired "
    "bootstrap over sequences). With the answer_nll objective the search runs on a workload's own prompts and "
    "its verdict, on held-out samples of those tasks and of transfer tasks, sets it against the best homogeneous "
    "plan of its own scope and question protocol (like with like) and against the envelope (the best of the nine "
    "baselines under their own protocols: across protocols, as each line says), sample by sample."
)
OBJECTIVES = {"kl": "KL on text", "answer_nll": "answer_nll on a workload"}
SOURCES_HELP = "Comma-separated ruler:TASK@LENGTH (one length) or longbench:PATH/<task>.jsonl"
name, device, _, _ = session.current_model()
workspace = session.workspace()
plan = plan_draft.plan()
demo = session.is_demo(name)


def default_workload() -> str:
    """A first workload that fits the loaded model: RULER's single needle at up to 1,024 tokens."""
    from polykv.models import context_length

    return f"ruler:niah_single_1@{min(1024, context_length(session.current_model()[2]) or 1024)}"


# ---- launch ------------------------------------------------------------------------------------------------
profiles = common.fitting_profiles()
objective = st.radio(
    "Objective",
    list(OBJECTIVES),
    format_func=OBJECTIVES.get,
    horizontal=True,
    key=state.SEARCH_OBJECTIVE,
    help="kl: closest to FullKV on calibration text. answer_nll: the gold answer's likelihood on a workload's own "
    "prompts (RULER tasks, a LongBench file), judged on held-out samples against the best of the nine baselines.",
)
workload = objective == "answer_nll"
text_profiles = [p.key for p in profiles if not p.is_workload]
if not workload and not text_profiles:
    st.info("No profile of this model yet: compute one on the Profiles page (it ranks the moves and gives TopRank).")
else:
    with st.form(state.SEARCH_FORM, enter_to_submit=False):
        cols = st.columns(4)
        if workload:
            choices = ["auto", *(p.key for p in profiles if p.is_workload)]
            profile = cols[0].selectbox("Workload profile", choices, help="auto: profiled on the search samples")
        else:
            profile = cols[0].selectbox("Profile", text_profiles)
        scopes = [s.value for s in Scope]
        scope = cols[1].selectbox("Scope", scopes, index=common.index_of(scopes, plan.scope.value))
        budget = cols[2].number_input(
            "Budget", min_value=2, value=plan_budget(plan) or 32, step=1, help="Average capacity per layer"
        )
        default_evaluations = (40 if demo else 136) if workload else (120 if demo else 800)
        evaluations = cols[3].number_input(
            "Evaluations", min_value=1, value=default_evaluations, step=10, help="Plan executions the search may run"
        )
        cols = st.columns(4)
        unit = "samples per task" if workload else "sequences"
        search_sequences = cols[0].number_input(
            f"Search {unit}", min_value=1, value=(2 if workload else 4 if demo else 16)
        )
        held_out = cols[1].number_input(f"Held-out {unit}", min_value=2, value=(4 if workload else 8 if demo else 48))
        max_tokens = cols[2].number_input("Tokens per sequence", min_value=16, value=256 if demo else 512, step=16)
        seed = cols[3].number_input("Seed", min_value=0, value=0, step=1)
        if workload:
            cols = st.columns([2, 2, 1])
            sources = cols[0].text_input("Workload", value=default_workload(), help=SOURCES_HELP)
            transfer = cols[1].text_input(
                "Transfer tasks", value="", help="Judged but never searched on, e.g. ruler:vt"
            )
            text_profile = cols[2].selectbox("Text profile (toprank-text)", ["none", *text_profiles])
            cols = st.columns([3, 1])
            question = cols[0].radio(
                "Question",
                list(QuestionProtocol),
                horizontal=True,
                help=f"Where the question goes: {question_protocol.HELP}",
            )
            competence = cols[1].number_input(
                "FullKV competence (%)",
                min_value=0.0,
                max_value=100.0,
                value=COMPETENCE_THRESHOLD,
                help="A task on which FullKV's accuracy (a pilot of 10 held-out samples) is under this leaves the "
                "verdict: no plan can be told from another where the model itself fails.",
            )
        cols = st.columns([1, 1, 4])
        started = cols[0].form_submit_button("Start search", type="primary")
        cols[1].form_submit_button("Estimate", help="Estimate the time these settings take here, without starting")
    if workload:
        st.caption("Starts from TopRank by danswer and the best homogeneous plan, chosen on the search samples.")
    else:
        start, start_note = search_start(plan, scope, int(budget))
        also = ", TopRank and the best homogeneous plan." if start else ": the search starts from TopRank and the best"
        st.caption(start_note + also + ("" if start else " homogeneous plan."))
    extra = (
        {
            "metric": "answer_nll",
            "sources": sources,
            "transfer": transfer.strip() or None,
            "text_profile": None if text_profile == "none" else text_profile,
            "question": question,
            "competence": float(competence),
            "loaded": session.current_model()[2:],
        }
        if workload
        else {}
    )

    def described_job():
        return launch_search(
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
            **extra,
        )

    job_controls.launch_estimate(described_job, state.SEARCH_MEASURE_SPEED)
    if started:
        job_controls.start_job(described_job, state.SEARCH_FLASH)
designer_controls.show_flash(state.SEARCH_FLASH)

# ---- the searches (polled while one runs) -----------------------------------------------------------------------
searches = job_controls.jobs_of(jobs.list_jobs(workspace), "search", name, limit=10)
if not searches:
    st.stop()
chosen = st.selectbox("Search", searches, format_func=lambda j: f"{j.title} · {j.id}", key=state.SEARCH_JOB)
running_at_load = job_controls.running([chosen], workspace)


def workload_verdict(entry) -> None:
    """A workload search's verdict: each role's held-out means per family of tasks, and the contrasts."""
    for family, data in entry.verdict.items():
        st.subheader(f"Held-out, {family}: {', '.join(data.tasks)}")
        st.dataframe(
            pd.DataFrame(
                [
                    {"role": role, "plan": entry.name_of(role), "answer_nll": means.answer_nll, "score": means.score}
                    for role, means in data.means.items()
                ]
            ).rename(columns={"score": "accuracy"}),
            hide_index=True,
            width="stretch",
        )
    st.dataframe(pd.DataFrame(verdict_rows(entry), columns=VERDICT_HEADER), hide_index=True, width="stretch")
    st.caption(MDE_NOTE)


def verdict(job) -> None:
    """The held-out verdict of a finished search, and its plan into the designer."""
    try:
        found_report = read_search(job, workspace)
    except PolyKVError as exc:
        st.error(first_line(exc))
        return
    entry = found_report.budgets[0]
    if isinstance(found_report, WorkloadReport):
        workload_verdict(entry)
        open_in_designer(entry.plans["searched"], [m.text for m in entry.search.moves])
        return
    found = entry.verdict
    st.subheader(f"Held-out verdict: {found.sequences} sequences (FullKV perplexity {found.fullkv_ppl:.3f})")
    st.dataframe(
        pd.DataFrame(
            [dict(role=role, name=p.name, kl=p.kl, top1=p.top1, ppl=p.ppl) for role, p in found.plans.items()]
        ),
        hide_index=True,
        width="stretch",
    )
    rows = [
        {"A - B": f"{c.a} - {c.b}", "metric": c.metric, "difference [95% CI]": difference_text(c), "A is": c.verdict}
        for c in found.contrasts
        if c.a == "searched"
    ]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    open_in_designer(entry.plan, [m.text for m in entry.search.moves])


def open_in_designer(plan: Plan, moves: list[str]) -> None:
    st.caption(f"{len(moves)} moves taken: " + ("; ".join(moves) if moves else "none (the start was best)"))
    if st.button("Open the searched plan in the designer", type="primary"):
        try:
            plan_draft.set_plan(plan)
        except PlanError as exc:
            st.error(first_line(exc))
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
    job_controls.job_controls(chosen, progress, workspace)
    trace, best = live(progress)
    if trace:
        common.show(charts.search_trace_figure(trace, chosen.search.metric), f"{chosen.id}-trace")
    if best is not None:
        st.caption(f"Best plan so far: {best.name}")
        common.show(charts.plan_figure(best), f"{chosen.id}-best")
    if progress.status == "finished":
        verdict(chosen)


follow()

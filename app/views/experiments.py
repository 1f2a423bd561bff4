"""Experiments: launch the library's factorial, placement control and budget sweep as background jobs and
draw their reports; then the budget sweeps and placement controls of evaluation jobs launched from Runs."""

import json

import pandas as pd
import streamlit as st

from app import charts, common, designer_controls, job_controls, job_forms, plan_draft, session, state
from polykv import jobs
from polykv.errors import PolyKVError, StoreError, first_line
from polykv.eval.comparing.compare import metrics_of, suite_score, sweep_table
from polykv.eval.experiments import FactorialData, PlacementData, SweepData, suite_metrics
from polykv.eval.experiments.placement import placement_summary
from polykv.eval.method_protocols import baseline_methods
from polykv.eval.results.store import Store
from polykv.eval.running.settings import parse_budgets, suite_settings
from polykv.eval.running.suite_runner import SUITES
from polykv.eval.statistics.render import interval, number
from polykv.jobs.experiment import launch_job, read_report
from polykv.plan import Plan, PlanError
from polykv.profile.statistics import STATISTICS
from polykv.workspace import results_path

st.title("Experiments")
name, device, _, _ = session.current_model()
workspace = session.workspace()
demo = session.is_demo(name)

# ---- launch ------------------------------------------------------------------------------------------------
st.subheader("Launch an experiment")
kind = st.selectbox(
    "Experiment",
    jobs.EXPERIMENTS,
    key=state.EXPERIMENT_KIND,
    help="factorial: routing x allocation (Table 2); placement: the guided route vs K random placements "
    "(Figure 4); sweep: the route across budgets vs every baseline (Figure 3)",
)
profiles = common.fitting_profiles()
if not profiles:
    st.info("No profile of this model yet: compute one on the Profiles page (every experiment routes from one).")
else:
    suite = st.selectbox("Suite", list(SUITES), key=state.EXPERIMENT_SUITE)
    metrics = suite_metrics(suite)
    with st.form(state.EXPERIMENT_FORM, enter_to_submit=False):
        profile = st.selectbox("Profile", [p.key for p in profiles])  # keys: profiles do not compare
        cols = st.columns(4)
        scopes = ["decode", "prefill"] if kind == "placement" else ["decode", "prefill", "both"]
        scope = cols[0].selectbox("Scope", scopes, help="The routed phase(s)")
        budget = cols[1].number_input(
            "Budget", min_value=1, value=24 if demo else 256, step=1, help="Average capacity per layer of the route"
        )
        statistic = cols[2].radio(
            "Statistic", list(STATISTICS), horizontal=True, help="TopRank's profile score (danswer: a workload's)"
        )
        allocation = cols[3].selectbox(
            "Allocation",
            ["entropy", "ppl"] if kind == "factorial" else ["uniform", "entropy", "ppl"],
            help="The factorial's allocated arm" if kind == "factorial" else "How the route's capacities are split",
        )
        baseline, baselines, k, budgets_text = None, None, 0, ""
        if kind == "factorial":
            baseline = st.selectbox("Baseline", baseline_methods(), help="The homogeneous cells' method")
        elif kind == "placement":
            k = st.number_input("Random placements (K)", min_value=1, max_value=9999, value=9 if demo else 99)
        else:
            budgets_text = st.text_input("Budgets", value="16,32,64" if demo else "128,256,512,1024")
            baselines = st.multiselect(
                "Baselines", baseline_methods(), help="None chosen: every one, each under its protocol"
            )
        st.session_state.setdefault(state.experiment_settings(suite), job_forms.default_settings(suite, name))
        settings_text = st.text_area("Suite settings (JSON)", key=state.experiment_settings(suite))
        cols = st.columns(2)
        metric = cols[0].selectbox("Metric", metrics, index=common.default_metric(metrics))
        seed = cols[1].number_input("Seed", min_value=0, value=0, step=1)
        cols = st.columns([1, 1, 4])
        launched = cols[0].form_submit_button("Start experiment", type="primary")
        cols[1].form_submit_button("Estimate", help="Estimate the time these settings take here, without starting")

    def described_job():
        return launch_job(
            workspace,
            name,
            device,
            kind,
            profile=profile,
            scope=scope,
            budget=int(budget),
            budgets=parse_budgets(budgets_text),
            baseline=baseline,
            baselines=baselines or None,
            statistic=statistic,
            allocation=allocation,
            k=int(k),
            suite=suite,
            settings=suite_settings(suite, settings_text).to_dict(),
            metric=metric,
            seed=int(seed),
            loaded=session.current_model()[2:],
        )

    if job_forms.settings_ready(settings_text, suite, state.experiment_settings(suite), name, state.EXPERIMENT_RESET):
        job_controls.launch_estimate(described_job, state.EXPERIMENT_MEASURE_SPEED)
        if launched:
            job_controls.start_job(described_job, state.EXPERIMENT_FLASH)
designer_controls.show_flash(state.EXPERIMENT_FLASH)

# ---- experiment jobs (polled while any runs) ----------------------------------------------------------------
st.subheader("Experiment jobs")
experiment_jobs = job_controls.jobs_of(jobs.list_jobs(workspace), "experiment", name, limit=10)
running_at_load = job_controls.running(experiment_jobs, workspace)


@st.fragment(run_every=2 if running_at_load else None)
def job_list():
    if not experiment_jobs:
        st.info("No experiment yet: start one above.")
    for job in experiment_jobs:
        progress = jobs.state(job, workspace)
        if job.id in running_at_load and progress.status != "running":
            st.rerun()  # finished: redraw the page (its report below, and stop polling)
        with st.container(border=True):
            st.markdown(f"**{job.title}** · `{job.id}` · {progress.status}")
            st.progress(min(1.0, progress.fraction), text=f"{progress.summary()} · {progress.message}")
            if progress.error:
                st.error(progress.error)
            job_controls.job_controls(job, progress, workspace)


job_list()


# ---- the report of a finished experiment ----------------------------------------------------------------------
def show_factorial(data: FactorialData) -> None:
    st.dataframe(charts.factorial_table(data), hide_index=True)
    primary = data.routing_uniform
    cols = st.columns(3)
    cols[0].metric("Primary: routed-uniform - homogeneous-uniform", number(primary.difference, "+.4f"))
    cols[1].metric("95% paired bootstrap CI", interval(primary.low, primary.high, bounded=True))
    cols[2].metric("Wins / ties / losses", f"{primary.wins} / {primary.ties} / {primary.losses}")
    if primary.verdict_text:  # reports made before samples were paired have none
        st.caption(common.literal(f"Primary: {primary.verdict_text}"))
    st.dataframe(charts.factorial_contrasts(data), hide_index=True, width="stretch")


def show_placement(data: PlacementData) -> None:
    random, guided = data.random, data.guided
    common.show(
        charts.placement_figure(guided.score, [r.score for r in random], data.metric, data.guided_rank, data.guided_p),
        "placement-control",
    )
    event = common.show(
        charts.placement_scatter(guided, random, data.metric, data.spearman, data.spearman_p),
        "placement-scatter",
        key=state.PLACEMENT_SCATTER,
        on_select="rerun",
        selection_mode=("points",),
    )
    if data.spearman is None:
        st.caption("Spearman over the random placements is not estimable (fewer than 2, or constant scores).")
    else:
        st.caption(
            f"Spearman rho (S(rho) vs {data.metric} in the better direction, {data.k} random placements) = "
            f"{data.spearman:+.4f}; one-sided permutation p = {number(data.spearman_p)}. Guided route rank "
            f"{data.guided_rank} of {data.k + 1}. Click a point to open its placement."
        )
    points = ((event or {}).get("selection") or {}).get("points", [])
    entry = charts.selected_placement(points, guided, random)
    if entry is None:
        return
    st.markdown(
        f"Selected: **{entry.plan}** · S(rho) {number(entry.profile_score)} · {data.metric} {number(entry.score)}"
    )
    if st.button("Open in the designer", type="primary"):
        try:
            plan_draft.set_plan(Plan.from_json(entry.plan_json))
        except PlanError as exc:
            st.error(f"Not opened: {first_line(exc)}")
        else:
            st.switch_page("views/designer.py")


def show_sweep(data: SweepData, rows: list) -> None:
    frame, versus, full = charts.sweep_frames(data)
    common.show(charts.sweep_figure(frame, data.metric, full, versus), "sweep-experiment")
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


finished = [j for j in experiment_jobs if jobs.state(j, workspace).status == "finished"]
if finished:
    st.subheader("Experiment report")
    job = st.selectbox(
        "Finished experiment", finished, format_func=lambda j: f"{j.title} · {j.id}", key=state.EXPERIMENT_JOB
    )
    try:
        report = read_report(job, workspace)
        st.markdown(f"**{report.title}**")
        if isinstance(report.data, FactorialData):
            show_factorial(report.data)
        elif isinstance(report.data, PlacementData):
            show_placement(report.data)
        elif isinstance(report.data, SweepData):
            show_sweep(report.data, report.rows)
        with st.expander("Report lines and data"):
            st.text("\n".join(report.lines))
            st.code(json.dumps(report.to_dict()["data"], indent=1)[:20_000], language="json")
    except (PolyKVError, KeyError, TypeError, ValueError) as exc:  # a report from another version, edited
        st.error(f"Cannot draw report of {job.id}: {first_line(exc)}")

# ---- sweeps and placements from the evaluation jobs that launched them ----------------------------------------
try:  # read-only: opening the page never creates or changes the results database
    store = Store(results_path(workspace), readonly=True)
except StoreError as exc:
    st.error(first_line(exc))
    st.stop()
eval_jobs = job_controls.jobs_of(jobs.list_jobs(workspace), "eval", name)  # the loaded model's: its layers, its budgets
sweeps, placements = common.sweep_jobs(eval_jobs), common.placement_jobs(eval_jobs)

st.subheader("Budget sweep: route vs baselines")
if not sweeps:
    st.caption("Launch the plan with baselines (and budgets) on the Runs page to draw this.")
else:
    job = st.selectbox("Job", sweeps, format_func=lambda j: f"{j.title} · {j.id}", key=state.SWEEP_JOB)
    choices = metrics_of(store, sorted(common.finished_runs(store, job)))
    if not choices:
        st.caption("No finished run in this job yet.")
    else:
        metric = st.selectbox("Metric", choices, key=state.SWEEP_METRIC)
        frame = sweep_table(store, common.sweep_runs(job), metric)
        common.show(charts.sweep_figure(frame, metric), "sweep")
        st.dataframe(frame, hide_index=True, width="stretch")

st.subheader("Placement control")
if not placements:
    st.caption("Launch the plan with random placements on the Runs page to draw this.")
else:
    job = st.selectbox("Job", placements, format_func=lambda j: f"{j.title} · {j.id}", key=state.PLACEMENT_JOB)
    done = common.finished_runs(store, job)
    guided, controls = common.placement_runs(job, done)
    if guided is None or guided.run_id not in done or not controls:
        st.caption("Waiting for the guided run and at least one placement to finish.")
    else:
        choices = metrics_of(store, [guided.run_id] + [r.run_id for r in controls])
        metric = st.selectbox("Metric", choices, key=state.PLACEMENT_METRIC)
        summary = placement_summary(
            suite_score(store, guided.run_id, metric), [suite_score(store, r.run_id, metric) for r in controls], metric
        )
        common.show(
            charts.placement_figure(summary.guided, summary.controls, metric, summary.rank, summary.p_value),
            "placement",
        )
        st.caption(
            f"Guided route rank {summary.rank} of {len(controls) + 1}; one-sided Monte Carlo p = {summary.p_value:.4f}."
        )

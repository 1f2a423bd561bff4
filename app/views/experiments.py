"""Experiments: budget sweeps and placement controls from the jobs that launched them."""

import streamlit as st

from app import charts, common, state
from polykv import jobs
from polykv.errors import StoreError
from polykv.eval.compare import metrics_of, placement_summary, suite_score, sweep_table
from polykv.eval.store import Store

st.title("Experiments")
workspace = common.workspace()
try:  # read-only: opening the page never creates or changes the results database
    store = Store(workspace / "results.sqlite", readonly=True)
except StoreError as exc:
    st.error(common.first_line(exc))
    st.stop()

# ---- sweeps and placements from the jobs that launched them ------------------------------------------------
eval_jobs = common.jobs_of(jobs.list_jobs(workspace), "eval")
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

"""Compare: two runs task by task (paired bootstrap, W/T/L, leave-one-task-out), budget sweeps and
placement controls from the jobs that launched them."""

import streamlit as st

from app import charts, common, state
from polykv import jobs
from polykv.errors import StoreError
from polykv.eval.compare import compare_runs, direction, metrics_of, placement_summary, suite_score, sweep_table
from polykv.eval.store import Store

st.title("Compare")
workspace = common.workspace()
try:  # read-only: opening the page never creates or changes the results database
    store = Store(workspace / "results.sqlite", readonly=True)
    finished = common.finished_run_rows(store)
except StoreError as exc:
    st.error(common.first_line(exc))
    st.stop()
if not finished:
    st.info("No finished run yet: launch one on the Runs page.")
    st.stop()
label = {r["id"]: common.run_label(r) for r in finished}
ids = [r["id"] for r in finished]

# ---- two runs --------------------------------------------------------------------------------------------
st.subheader("Two runs, task by task")
cols = st.columns(3)
run_a = cols[0].selectbox("A", ids, format_func=label.get, key=state.COMPARE_A)
run_b = cols[1].selectbox("B", ids, index=common.default_b(ids), format_func=label.get, key=state.COMPARE_B)
metrics = metrics_of(store, [run_a, run_b])
if not metrics:
    st.warning("These runs share no metric (different suites?).")
else:
    metric = cols[2].selectbox("Metric", metrics, index=common.default_metric(metrics), key=state.COMPARE_METRIC)
    better = "higher" if direction(metric) > 0 else "lower"
    try:
        result = compare_runs(store, run_a, run_b, metric)
    except ValueError as exc:
        st.warning(common.first_line(exc))
    else:
        if run_a == run_b:
            st.info("A and B are the same run: pick two different runs.")
        summary = st.columns([1, 1, 1, 1.7, 1])  # the interval needs the room
        summary[0].metric(f"Suite score A ({metric})", f"{suite_score(store, run_a, metric):.4g}")
        summary[1].metric(f"Suite score B ({metric})", f"{suite_score(store, run_b, metric):.4g}")
        summary[2].metric(f"A - B ({better} is better)", f"{result.difference:+.4g}")
        summary[3].metric("95% paired bootstrap CI", f"[{result.low:+.2g}, {result.high:+.2g}]")
        summary[4].metric("A wins / ties / losses", f"{result.wins} / {result.ties} / {result.losses}")
        st.caption(" · ".join(result.lines()))
        common.show(
            charts.difference_figure(result.table, result.difference, result.low, result.high, metric), "difference"
        )
        left, right = st.columns(2)
        left.dataframe(result.table, hide_index=True, width="stretch")
        if result.leave_one_out:
            right.caption("Leave one task out: A - B over the other tasks")
            right.dataframe(
                {"task left out": list(result.leave_one_out), "A - B": list(result.leave_one_out.values())},
                hide_index=True,
                width="stretch",
            )
        if result.only_in_a or result.only_in_b:
            st.caption(f"Left out (not in both runs): {', '.join(result.only_in_a + result.only_in_b)}")

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

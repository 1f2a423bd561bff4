"""Compare: two runs task by task (paired bootstrap, W/T/L, leave-one-task-out), and every run with its
tags. Budget sweeps and placement controls are on the Experiments page."""

import math

import streamlit as st

from app import charts, common, job_controls, session, state
from polykv import jobs
from polykv.errors import StoreError, first_line
from polykv.eval.comparing import answers as sample_view
from polykv.eval.comparing.compare import (
    TASKS_FOR_INTERVAL,
    can_log,
    compare_runs,
    metrics_of,
    preferred_metric,
    suite_score,
)
from polykv.eval.comparing.default_pair import default_pair
from polykv.eval.comparing.run_table import runs_table
from polykv.eval.results.store import Store
from polykv.eval.statistics.contrast import direction
from polykv.eval.statistics.render import detectable, format_p, interval_text, ratio_text
from polykv.workspace import results_path

st.title("Compare")
workspace = session.workspace()
try:  # read-only: opening the page never creates or changes the results database
    store = Store(results_path(workspace), readonly=True)
    finished = common.finished_run_rows(store)
except StoreError as exc:
    st.error(first_line(exc))
    st.stop()
eval_jobs = job_controls.jobs_of(jobs.list_jobs(workspace), "eval")


def show_runs() -> None:
    st.subheader("Runs")
    st.caption("Every run, with the tags of the job that launched it; click a column header to sort.")
    st.dataframe(runs_table(store, eval_jobs), hide_index=True, width="stretch")


if not finished:
    st.info("No finished run yet: launch one on the Runs page.")
    if store.runs():
        show_runs()
    st.stop()
label = {r.id: common.run_label(r) for r in finished}
ids = [r.id for r in finished]
pair = default_pair(finished, eval_jobs, store)

# ---- two runs --------------------------------------------------------------------------------------------
st.subheader("Two runs, task by task")
cols = st.columns([3, 3, 2, 1.4])
run_a = cols[0].selectbox("A", ids, index=common.index_of(ids, pair.a), format_func=label.get, key=state.COMPARE_A)
run_b = cols[1].selectbox("B", ids, index=common.index_of(ids, pair.b), format_func=label.get, key=state.COMPARE_B)
if (run_a, run_b) == (pair.a, pair.b):
    st.caption(f"Starting pair: {pair.reason}.")
rows = {r.id: r for r in finished}
across = sample_view.like_with_like(rows[run_a], rows[run_b])
if across is not None:
    st.caption(f"Not like with like, {across}.")
models = sample_view.other_models(rows[run_a], rows[run_b])
if models is not None:
    st.warning(f"{models}.")
metrics = metrics_of(store, [run_a, run_b])
if not metrics:
    st.warning("These runs share no metric (different suites?).")
else:
    metric = cols[2].selectbox(
        "Metric", metrics, index=common.index_of(metrics, preferred_metric(metrics)), key=state.COMPARE_METRIC
    )
    # a perplexity spans orders of magnitude across tasks: compared as log(ppl) unless the user says otherwise
    log = can_log(metric) and cols[3].toggle(
        f"log {metric}", value=True, key=state.COMPARE_LOG, help="Compare log(ppl) per task: differences are log-ratios"
    )
    better = "higher" if direction(metric) > 0 else "lower"
    try:
        result = compare_runs(store, run_a, run_b, metric, log=log)
    except ValueError as exc:
        st.warning(first_line(exc))
    else:
        if run_a == run_b:
            st.info("A and B are the same run: pick two different runs.")
        verdict = result.badge()  # the test's verdict: a winner only when it is significant
        test = result.samples  # the sample-level test: the headline when the runs share samples
        summary = st.columns([1, 1, 1.2, 1.7, 1])  # the interval needs the room
        summary[0].metric(f"Suite score A ({metric})", f"{suite_score(store, run_a, metric):.4g}")
        summary[1].metric(f"Suite score B ({metric})", f"{suite_score(store, run_b, metric):.4g}")
        shown = result.difference if test is None else test.difference
        summary[2].metric(
            f"A - B in {result.label} ({better} is better)",
            f"{shown:+.4g} ({ratio_text(math.exp(shown))})" if log else f"{shown:+.4g}",
            delta=verdict,
            delta_color=charts.OUTCOME_DELTA_COLORS[verdict],
            delta_arrow="off",
            help="Over the paired samples the two runs share (the sign-flip test's difference)"
            if test is not None
            else "Macro-average over the tasks the two runs share",
        )
        if test is not None:
            summary[3].metric(
                "Sign-flip test",
                f"p = {format_p(test.p_value)}",
                delta=f"{test.samples} paired samples · {detectable(test.mde, '.3g')} detectable",
                delta_color="gray",
                delta_arrow="off",
                help="The sample-level test the verdict rests on, and the smallest difference it detects with 80% "
                "power (two-sided 5%)",
            )
        elif result.task_interval:
            ratios = result.ratio() if log else None  # raw differences are not log-ratios: no ratio to show
            summary[3].metric(
                "95% paired bootstrap CI",
                interval_text(result.low, result.high),
                delta=f"A / B {ratio_text(ratios[1])} to {ratio_text(ratios[2])}" if log else None,
                delta_color="gray",
                delta_arrow="off",
                help="Over the task means",
            )
        else:
            summary[3].metric(
                "Interval over tasks",
                "none",
                delta=f"{len(result.table)} tasks: too few (at least {TASKS_FOR_INTERVAL})",
                delta_color="gray",
                delta_arrow="off",
            )
        summary[4].metric("A wins / ties / losses", f"{result.wins} / {result.ties} / {result.losses}")
        st.caption(" · ".join(result.lines()))
        chart = common.show(
            charts.difference_figure(result.table, result.difference, result.low, result.high, metric, log=log),
            "difference",
            key=state.COMPARE_CHART,
            on_select="rerun",
            selection_mode="points",
        )
        tasks = list(result.table["task"])
        clicked = common.clicked_task(chart, tasks)
        if clicked != st.session_state.get(state.COMPARE_CLICKED):  # a new click (the selection outlives reruns)
            st.session_state[state.COMPARE_CLICKED] = clicked
            if clicked is not None:
                st.session_state[state.COMPARE_TASK] = clicked
        below_chart = st.container()  # the clicked task's samples
        left, right = st.columns(2)
        left.dataframe(result.report_table(), hide_index=True, width="stretch")
        if result.leave_one_out:
            right.caption(f"Leave one task out: A - B in {result.label} over the other tasks")
            right.dataframe(
                {"task left out": list(result.leave_one_out), "A - B": list(result.leave_one_out.values())},
                hide_index=True,
                width="stretch",
            )
        if result.only_in_a or result.only_in_b:
            st.caption(f"Left out (not in both runs): {', '.join(result.only_in_a + result.only_in_b)}")

        # ---- the samples behind a task: click its bar, or pick it ----
        # A clicked bar's samples open right under the chart, in view where the click was (below the tables they
        # rendered out of sight); picked from the list with no bar selected, they stay at the end.
        with below_chart if clicked is not None else st.container():
            st.subheader("Samples of a task, side by side")
            pick = st.columns([3, 2])
            task = pick[0].selectbox("Task (or click its bar above)", tasks, key=state.COMPARE_TASK)
            only = pick[1].toggle("Only where A and B differ", value=False, key=state.COMPARE_DIFFERING)
            rows = sample_view.side_by_side(store, run_a, run_b, task, only_differing=only)
            if not rows:
                st.info("No sample of this task to show" + (" where A and B differ." if only else "."))
            else:
                if all(row["A"] is None and row["B"] is None for row in rows):
                    st.caption(
                        "These runs scored the gold answer without generating (mode score): no answers to show."
                        + (
                            ""
                            if any(row.get("FullKV metrics") for row in rows)
                            else " No FullKV run of these settings yet: add `full` to the baselines on Runs to read "
                            "FullKV's answer_nll beside each sample."
                        )
                    )
                st.table(common.samples_frame(rows).set_index("sample"))  # HTML: long answers wrap and can be read

show_runs()

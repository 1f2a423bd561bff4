"""Compare: two runs task by task (paired bootstrap, W/T/L, leave-one-task-out). Budget sweeps and
placement controls are on the Experiments page."""

import streamlit as st

from app import charts, common, state
from polykv.errors import StoreError
from polykv.eval.compare import compare_runs, direction, metrics_of, suite_score
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

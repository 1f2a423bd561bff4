"""Runs: evaluate the current plan (and baselines, budgets, placements) in the background; follow them."""

import json

import pandas as pd
import streamlit as st

from app import common
from polykv import jobs
from polykv.errors import PolyKVError
from polykv.eval.compare import macro_average
from polykv.eval.unit import Unit
from polykv.eval.experiments import baseline_methods, launch_plans, plan_budget
from polykv.eval.runner import SUITES
from polykv.eval.settings import parse_budgets, suite_settings
from polykv.eval.store import Store, StoreError
from polykv.eval.suites.fidelity import default_tasks

st.title("Runs")
name, device, _, _ = common.current_model()
plan = common.plan()
workspace = common.workspace()

# Small defaults on the demo model so a first run takes seconds on a laptop CPU.
DEMO_SETTINGS = {"fidelity": {"samples_per_task": 2, "prompt_tokens": 256}}


def default_settings(suite: str) -> str:
    settings = SUITES[suite].Settings().to_dict()
    if suite == "fidelity":  # the model's own default tasks (for the demo: text it models well)
        settings["tasks"] = list(default_tasks(name))
    if name == "demo":
        settings.update(DEMO_SETTINGS.get(suite, {}))
    return json.dumps(settings)


# ---- launch --------------------------------------------------------------------------------------------
st.subheader(f"Evaluate the current plan: {plan.name}")
st.caption(" · ".join(plan.summary().lines()[1:]))
suite = st.selectbox("Suite", list(SUITES), key="run_suite")
with st.form("launch_form"):
    settings_text = st.text_area("Suite settings (JSON)", value=default_settings(suite), key=f"settings_{suite}")
    cols = st.columns(4)
    budgets_text = cols[0].text_input("Budgets", placeholder=f"the plan's own ({plan_budget(plan)})",
                                      help="Comma-separated budgets (average capacities per layer): the plan is rescaled to each")
    baselines = cols[1].multiselect("Baselines", baseline_methods(),
                                    help="Each method alone at the same budget, under its own protocol (phases, allocation)")
    placements = cols[2].number_input("Random placements", min_value=0, max_value=999, value=0,
                                      help="Placement control: count-matched random routes (single-phase plans)")
    seed = cols[3].number_input("Seed", min_value=0, value=0, step=1)
    launched = st.form_submit_button("Launch", type="primary")

if launched:
    try:
        budgets = parse_budgets(budgets_text)
        settings = suite_settings(suite, settings_text)
        labelled = launch_plans(plan, budgets, baselines, int(placements), int(seed))
        units = [(label, Unit.of(name, p, suite, settings, int(seed), device)) for label, p in labelled]
        job = jobs.eval_job(units, f"{plan.name} on {suite}" + (f" + {len(units) - 1} more" if len(units) > 1 else ""))
    except (PolyKVError, ValueError) as exc:
        st.error(f"Not launched: {common.first_line(exc)}")
    else:
        jobs.start(job, workspace)
        st.session_state["runs_flash"] = f"Started {job.id} ({len(units)} run{'s' * (len(units) > 1)})."
        st.rerun()
if "runs_flash" in st.session_state:
    st.success(st.session_state.pop("runs_flash"))

# ---- jobs (polled while any runs) -----------------------------------------------------------------------
# Cancel and Resume refuse with a JobError (or a FileError when the job file cannot be written)
from polykv.errors import PolyKVError as _JobsError

st.subheader("Jobs")
all_jobs, damaged_jobs = jobs.scan_jobs(workspace)
all_jobs = [j for j in all_jobs if j.kind == "eval"]
for damaged in damaged_jobs:  # listed, never fatal: the valid jobs below still show
    st.warning(f"Damaged job file {damaged.path.name}: {damaged.reason}")
running_at_load = {j.id for j in all_jobs if jobs.state(j, workspace).status == "running"}


@st.fragment(run_every=2 if running_at_load else None)
def job_list():
    if not all_jobs:
        st.info("No evaluation yet: launch one above.")
    for job in all_jobs[:10]:
        state = jobs.state(job, workspace)
        if job.id in running_at_load and state.status != "running":
            st.rerun()  # finished: redraw the page (and stop polling)
        with st.container(border=True):
            st.markdown(f"**{job.title}** · `{job.id}` · {state.status}")
            st.progress(min(1.0, state.fraction), text=f"{state.fraction:.0%} {state.message}")
            for run in state.runs:
                total = run.total or 0
                label = ", ".join(f"{k} {v}" for k, v in run.label.items())
                st.progress(run.done / total if total else 0.0,
                            text=f"{run.plan_name} ({label}) · {run.done}/{total or '?'} samples · {run.status}")
            if state.error:
                st.error(state.error)
            buttons = st.columns(6)
            if state.status == "running" and buttons[0].button("Cancel", key=f"cancel_{job.id}"):
                try:  # waits until the worker has exited
                    jobs.cancel(job, workspace)
                except _JobsError as exc:
                    st.error(f"Not cancelled: {common.first_line(exc)}")
                else:
                    st.rerun()
            if state.status in ("stopped", "cancelled", "failed") and buttons[0].button("Resume", key=f"resume_{job.id}"):
                try:
                    jobs.start(job, workspace)
                except _JobsError as exc:  # e.g. its worker still runs
                    st.error(f"Not resumed: {common.first_line(exc)}")
                else:
                    st.rerun()
            with st.expander("Log"):
                st.code(jobs.log_tail(job, workspace) or "(empty)", language=None)


job_list()

# ---- results ----------------------------------------------------------------------------------------------
st.subheader("Runs in the results database")
rows = []
try:  # read-only: showing the runs never creates or changes the results database
    store = Store(workspace / "results.sqlite", readonly=True)
    for run in reversed(store.runs()):
        row = {"run": run["id"], "plan": run["plan_name"], "suite": run["suite"], "model": run["model"],
               "status": run["status"], "samples": f"{run['done_samples']}/{run['total_samples']}", "created": run["created"][:19]}
        scores = store.task_scores(run["id"])
        for metric in sorted({m for values in scores.values() for m in values}):
            row[metric] = macro_average({task: values[metric] for task, values in scores.items()})
        rows.append(row)
except StoreError as exc:
    st.error(common.first_line(exc))
    st.stop()
if rows:
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    st.caption("Scores are macro-averages over tasks; compare runs task by task on the Compare page.")
else:
    st.info(f"No runs in {store.path} yet.")

"""Runs: evaluate the current plan (and baselines, budgets, placements) in the background; follow them."""

import pandas as pd
import streamlit as st

from app import common, designer_controls, job_controls, job_forms, plan_draft, session, state
from polykv import jobs
from polykv.errors import PolyKVError, StoreError, first_line
from polykv.eval.comparing import answers as sample_view
from polykv.eval.comparing.run_table import empty_runs, runs_table
from polykv.eval.experiments import baseline_methods, plan_budget
from polykv.eval.launch import first_run
from polykv.eval.results.store import Store
from polykv.eval.running.suite_runner import SUITES
from polykv.eval.workloads.competence import floor_warnings
from polykv.question_protocol import QuestionProtocol
from polykv.workspace import results_path

ANSWERS_SHOWN = 50  # samples a run's answers table shows at once

st.title("Runs")
launch_slot = None  # after a launch, where the job list shows (then back under its heading)
name, device, model, tokenizer = session.current_model()
workspace = session.workspace()


# ---- launch --------------------------------------------------------------------------------------------
choices = [common.DESIGNER_PLAN, *designer_controls.saved_plans(session.num_layers())]  # the model's plans only
picked = st.selectbox(
    "Plan to evaluate",
    choices,
    format_func=lambda c: "the designer's plan (this session's draft)" if c == common.DESIGNER_PLAN else str(c),
    key=state.RUN_PLAN,
    help="The plan on the designer, or a plan file saved under plans/",
)
try:
    plan = plan_draft.plan() if picked == common.DESIGNER_PLAN else designer_controls.read_plan_file(picked)
except PolyKVError as exc:
    st.error(first_line(exc))
    st.stop()
st.subheader(f"Evaluate {'the current plan' if picked == common.DESIGNER_PLAN else 'the saved plan'}: {plan.name}")
st.caption(" · ".join(plan.summary().lines()[1:]))

with st.expander("Proposed: a first run that can tell this plan from a homogeneous one", expanded=True):
    minutes = st.number_input(
        "Time it may take here (minutes)", min_value=1, max_value=600, value=10, key=state.FIRST_RUN_MINUTES
    )
    try:
        proposed = job_forms.first_run(name, device, plan, float(minutes))
    except (PolyKVError, ValueError) as exc:
        st.info(f"No first run to propose: {first_line(exc)}")
    else:
        tasks = proposed.settings.tasks
        if proposed.pilot:
            st.markdown(
                f"**Step 1 of 2, the pilot:** {plan.name} and {proposed.baseline} (same scope and budget) on "
                f"{proposed.settings.samples_per_task} samples of {len(tasks)} RULER tasks at "
                f"{proposed.settings.length} tokens, scored by answer_nll (the gold answer's likelihood, no "
                "generation). What the decisive run can detect is stated once the pilot has finished."
            )
        else:
            chosen = proposed.samples
            st.markdown(
                f"**Step 2 of 2, the decisive run:** {plan.name}, {proposed.baseline} and FullKV on "
                f"{chosen.samples_per_task} samples of each of {len(tasks)} RULER tasks at {proposed.settings.length} "
                f"tokens, answer_nll. It is expected to detect a difference of **{chosen.expected_mde:.3f} nats** "
                "between the plan and the baseline (80% power, two-sided 5%; a normal approximation from the "
                f"pilot's spread over {first_run.PILOT_SAMPLES} samples per task, so a rough figure: Compare states "
                "the test's own). Then open Compare for the verdict."
            )
        for line in proposed.reasons:
            st.caption(line)
        job_controls.launch_estimate(
            lambda: job_forms.first_run_job(name, device, proposed), state.FIRST_RUN_MEASURE_SPEED
        )
        if st.button("Launch the pilot" if proposed.pilot else "Launch the decisive run", key=state.FIRST_RUN_LAUNCH):
            job_controls.start_job(
                lambda: job_forms.first_run_job(name, device, proposed), state.FIRST_RUN_FLASH, refused="Not launched"
            )
        if designer_controls.show_flash(state.FIRST_RUN_FLASH):
            launch_slot = st.container()  # the job list goes here this once: under the button, not below the fold
suite = st.selectbox("Suite", list(SUITES), key=state.RUN_SUITE)
st.session_state.setdefault(state.settings_text(suite), job_forms.default_settings(suite, name))
with st.container(border=True):  # no form: what is typed here is kept (`state.REMEMBERED`) until launched
    settings_text = st.text_area("Suite settings (JSON)", key=state.settings_text(suite))
    if suite in ("ruler", "longbench"):
        st.caption(
            f'Where the question goes: "question": "{QuestionProtocol.IN_PROMPT}" (the default: the plan compresses it '
            f'with the prompt) or "{QuestionProtocol.AFTER_COMPRESSION}" (the plan compresses the context before the '
            "question is known, as for a reused document; the question then follows, kept in full)."
        )
    if suite == "ruler" and device == "cpu":
        st.caption(
            "These settings start small on a CPU (one sample of one task per RULER category at up to 1,024 "
            "tokens): a look at answers, not evidence; the proposed first run above is sized to decide."
        )
    cols = st.columns(4)
    budgets_text = cols[0].text_input(
        "Budgets",
        placeholder=f"the plan's own ({plan_budget(plan)})",
        help="Comma-separated budgets (average capacities per layer): the plan is rescaled to each",
        key=state.RUN_BUDGETS,
    )
    st.session_state.setdefault(state.RUN_BASELINES, ["full"])  # FullKV, the reference, unless taken out
    baselines = cols[1].multiselect(
        "Baselines",
        ["full", *baseline_methods()],
        help="Each method alone at the same budget, under its own protocol (phases, allocation); full: FullKV "
        "once, the reference an answer's agreement is measured against",
        key=state.RUN_BASELINES,
    )
    placements = cols[2].number_input(
        "Random placements",
        min_value=0,
        max_value=999,
        help="Placement control: count-matched random routes (single-phase plans)",
        key=state.RUN_PLACEMENTS,
    )
    seed = cols[3].number_input("Seed", min_value=0, step=1, key=state.RUN_SEED)

    def described_job():
        return job_forms.eval_job(
            name, device, plan, suite, settings_text, budgets_text, baselines, placements, seed, (model, tokenizer)
        )

    ready = job_forms.settings_ready(settings_text, suite, state.settings_text(suite), name)
    if ready:
        job_controls.launch_estimate(described_job, state.RUN_MEASURE_SPEED)
    launched = st.button("Launch", type="primary", disabled=not ready)

if launched:
    job_controls.start_job(described_job, state.RUNS_FLASH, refused="Not launched")
if designer_controls.show_flash(state.RUNS_FLASH):
    launch_slot = st.container()  # the job list goes here this once: under the button, not below the fold

# ---- jobs (polled while any runs) -----------------------------------------------------------------------
# Cancel and Resume refuse with a JobError (or a FileError when the job file cannot be written)
st.subheader("Jobs")
all_jobs, damaged_jobs = jobs.scan_jobs(workspace)
all_jobs = job_controls.jobs_of(all_jobs, "eval")
for damaged in damaged_jobs:  # listed, never fatal: the valid jobs below still show
    st.warning(f"Damaged job file {damaged.path.name}: {damaged.reason}")
running_at_load = job_controls.running(all_jobs, workspace)


@st.fragment(run_every=2 if running_at_load else None)
def job_list():
    if not all_jobs:
        st.info("No evaluation yet: launch one above.")
    for job in all_jobs[:10]:
        progress = jobs.state(job, workspace)
        if job.id in running_at_load and progress.status != "running":
            st.rerun()  # finished: redraw the page (and stop polling)
        with st.container(border=True):
            st.markdown(f"**{job.title}** · `{job.id}` · {progress.status}")
            st.progress(min(1.0, progress.fraction), text=f"{progress.summary()} · {progress.message}")
            for run in progress.runs:
                total = run.total or 0
                label = common.label_text(run.label)
                st.progress(
                    run.done / total if total else 0.0,
                    text=f"{run.plan_name} ({label}) · {run.done}/{total or '?'} samples · {run.status}",
                )
            if progress.error:
                st.error(progress.error)
            job_controls.job_controls(job, progress, workspace)


with launch_slot if launch_slot is not None else st.container():
    job_list()

# ---- results ----------------------------------------------------------------------------------------------
st.subheader("Runs in the results database")
try:  # read-only: showing the runs never creates or changes the results database
    store = Store(results_path(workspace), readonly=True)
    rows = runs_table(store, all_jobs)
except StoreError as exc:
    st.error(first_line(exc))
    st.stop()
if len(rows):
    st.dataframe(rows, hide_index=True, width="stretch")
    empty = empty_runs(store)
    st.caption(
        "Scores are macro-averages over tasks; compare runs task by task on the Compare page."
        + (f" Not listed: {empty} run{'s' * (empty != 1)} cancelled before a sample." if empty else "")
    )
    with st.expander("A run's answers, beside the gold answer and FullKV's"):
        names = {r.id: f"{r.id} · {r.plan_name} · {r.suite}" for r in store.runs()}
        cols = st.columns([3, 2])
        read = cols[0].selectbox("Run", list(names), format_func=names.get, key=state.RUNS_READ)
        answers = sample_view.answers(store, read)
        tasks = sorted({row["task"] for row in answers})
        task = cols[1].selectbox("Task", ["every task", *tasks], key=state.RUNS_READ_TASK)
        shown = [row for row in answers if task in ("every task", row["task"])]
        # a table, not a data grid: answers are sentences to read whole, and a screen reader reads a table
        st.table(pd.DataFrame(shown[:ANSWERS_SHOWN]))
        if len(shown) > ANSWERS_SHOWN:
            st.caption(f"The first {ANSWERS_SHOWN} of {len(shown)} samples: choose a task, or `polykv runs show`.")
        st.caption(
            f"{sample_view.AGREEMENT}. FullKV's answer is shown when the database holds a finished FullKV run of "
            "the same model, suite and settings (launch `full` as a baseline)."
        )
    for warning in floor_warnings(store):  # tasks the model fails with its whole cache
        st.warning(warning)
else:
    st.info(f"No runs in {store.path} yet.")

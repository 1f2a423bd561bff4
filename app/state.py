"""Every key the app keeps in `st.session_state`: one constant per key, one place to look.

Widgets that are read back (or set) through the session state get their key from here too, so a page
never spells a key as a string. Keys that belong to one item (a job, a suite, a version of the plan)
are built by the functions at the end. The values are part of the app's interface: tests address
widgets by them, so change a value only together with its tests.
"""

from __future__ import annotations

# ---- the whole session (sidebar and app/session.py) ------------------------------------------------
MODEL = "model"  # (name, device) of the model the pages use; the demo model on CPU until another loads
MODEL_ERROR = "model_error"  # the sidebar's last model-loading error, shown until a load succeeds
FIGURE_FORMAT = "figure_format"  # radio: the camera button's download format, "png" or "svg"
MODEL_FORM = "model_form"  # form: the sidebar's model name and device
MODEL_TEXT = "model_text"  # the sidebar's model box (back on the loaded model after a failed load)
MODEL_DEVICE = "model_device"  # the sidebar's device choice
SESSION_ID = "session_id"  # this browser session's id, also in the URL (?session=): it names the drafts
PENDING_MODEL = "pending_model"  # (name, device, question): a model switch that waits for Switch or Stay
DRAFT_PROBLEM = "draft_problem"  # why the plan or the session could not be saved or reopened (shown once)

# ---- the plan being designed (app/plan_draft.py, app/designer_controls.py) -------------------------------------
PLAN_JSON = "plan_json"  # the designer's current plan, as JSON (valid for the current model)
UNDO = "undo"  # earlier plans, as JSON, newest last (at most 50): what Undo restores
REDO = "redo"  # undone plans, as JSON, newest last: what Redo restores (emptied by a new edit)
PLAN_MODEL = "plan_model"  # the model name the plan in PLAN_JSON belongs to (its draft's model)
PLAN_VERSION = "plan_version"  # a counter bumped on every plan change: new table and name widgets

# ---- the plan designer (app/views/designer.py) ----------------------------------------------------
PLAN_CHART = "plan_chart"  # plotly chart: the plan figure and its selection (points)
CHART_SEEN = "chart_seen"  # (layers, phases) of the chart selection already copied to the layer list
DESIGNER_LAYERS = "designer_layers"  # multiselect: the selected layers (the chart's selection feeds it)
DESIGNER_PHASE = "designer_phase"  # radio: the phase painted and outlined, "both", "prefill" or "decode"
PAINT_METHOD = "paint_method"  # the palette's chosen method to paint, or "(keep)" (set by its buttons)
SELECTION_SAVED = "selection_saved"  # (layers, phase) of the selection last written to the draft
SCOPE_SEEN = "scope_seen"  # the plan scope the paint phase last followed (a new scope resets the phase)
PAINT_CAPACITY = "paint_capacity"  # number input: the capacity to paint, or None (keep)
BUILD_SCOPE = "build_scope"  # selectbox: the scope of a plan built from a profile
BUILD_BUDGET = "build_budget"  # number input: the budget of a plan built from a profile
BUILD_STATISTIC = "build_statistic"  # radio: the TopRank statistic, "cosine" or "dppl"
BUILD_ALLOCATION = "build_allocation"  # radio: how the budget is split over the layers
SPLIT_RULE = "split_rule"  # radio: the allocation rule of "Split by a rule"
SPLIT_BUDGET = "split_budget"  # number: its budget (average capacity per layer)
SPLIT_APPLY = "split_apply"  # button: apply it
SPLIT_OVER = "split_over"  # radio: over every layer or the selected ones
SPLIT_PREDICT = "split_predict"  # button: predict CAKE's run-time split on calibration text
SPLIT_PREDICTED = "split_predicted"  # {(plan key, budget): the predicted split} of the last prediction
SPLIT_HEADS = "split_heads"  # radio: how each layer's budget splits over its KV heads
SPLIT_HEADS_APPLY = "split_heads_apply"  # button: apply that
EXPORT_TOKENS = "export_tokens"  # number: the prompt length of the kvpress export
MEASURED_RUN = "measured_run"  # select: the run whose measured KV the designer draws beside the plan
LAUNCH_TO_CONFIRM = "launch_to_confirm"  # the long launch pressed once, waiting for its second press
EXPERIMENT_RESET = "experiment_reset"  # button: the suggested settings back in Experiments' settings box
PLAN_UPLOAD = "plan_upload"  # file uploader: a plan file to load
UPLOAD_SEEN = "upload_seen"  # file id of the upload already loaded (so a rerun does not load it again)
HETEROGENEITY_ASKED = "heterogeneity_asked"  # Measure was pressed once: the page measures (and remeasures) from then on
MEMORY_TOKENS = "memory_tokens"  # number input: the prompt length the designer's KV memory chart is drawn at
RESCALE_FORM = "rescale_form"  # form: the designer's Rescale popover (Enter in its budget submits it)
DRAFT_DELETE = "draft_delete"  # selectbox: the draft (its file) the designer's draft list would delete
DIFF_WITH = "diff_with"  # selectbox: the saved plan file the current plan is compared with

# ---- runs (app/views/runs.py) ---------------------------------------------------------------------
RUN_PLAN = "run_plan"  # selectbox: the plan to evaluate, the designer's ("(designer)") or a saved file
RUN_SUITE = "run_suite"  # selectbox: the suite the current plan is evaluated on
RUNS_FLASH = "runs_flash"  # the "Started <job>" message, shown once after the launch's rerun
# the "Measure speed" buttons beside each launch (`job_controls.launch_estimate`): the model's rates, measured once
RUN_MEASURE_SPEED = "run_measure_speed"
PROFILE_MEASURE_SPEED = "profile_measure_speed"
EXPERIMENT_MEASURE_SPEED = "experiment_measure_speed"
SEARCH_MEASURE_SPEED = "search_measure_speed"
HETEROGENEITY_MEASURE_SPEED = "heterogeneity_measure_speed"

# ---- compare (app/views/compare.py) ---------------------------------------------------------------
COMPARE_A = "compare_a"  # selectbox: run A (id) of the two-run comparison
COMPARE_B = "compare_b"  # selectbox: run B (id)
COMPARE_METRIC = "compare_metric"  # selectbox: the metric A and B are compared on
COMPARE_LOG = "compare_log"  # toggle: compare log(metric) (perplexity), the difference a log-ratio
COMPARE_CHART = "compare_chart"  # plotly chart: the per-task differences; a clicked bar opens that task's samples
COMPARE_TASK = "compare_task"  # selectbox: the task whose samples are shown side by side
COMPARE_CLICKED = "compare_clicked"  # the task of the last bar click applied (a selection outlives reruns)
COMPARE_DIFFERING = "compare_differing"  # toggle: show only the samples where A and B differ
SWEEP_JOB = "sweep_job"  # selectbox: the job whose budget sweep is drawn
SWEEP_METRIC = "sweep_metric"  # selectbox: the sweep's metric
PLACEMENT_JOB = "placement_job"  # selectbox: the job whose placement control is drawn
PLACEMENT_METRIC = "placement_metric"  # selectbox: the placement control's metric

# ---- experiments (app/views/experiments.py) -------------------------------------------------------
EXPERIMENT_KIND = "experiment_kind"  # selectbox: the experiment to launch, factorial, placement or sweep
EXPERIMENT_SUITE = "experiment_suite"  # selectbox: the suite the experiment's runs are scored on
EXPERIMENT_FORM = "experiment_form"  # form: profile, scope, budget(s), baseline(s), statistic, ..., seed
EXPERIMENT_FLASH = "experiment_flash"  # the "Started <job>" message, shown once after the launch's rerun
EXPERIMENT_JOB = "experiment_job"  # selectbox: the finished experiment job whose report is drawn
PLACEMENT_SCATTER = "placement_scatter"  # plotly chart: S(rho) vs suite score and its selection (points)


def experiment_settings(suite: str) -> str:
    """Text area: the settings (JSON) of `suite` in the experiment launcher (its own, not the Runs page's)."""
    return f"experiment_settings_{suite}"


# ---- plan search (app/views/search.py) -------------------------------------------------------------
SEARCH_OBJECTIVE = "search_objective"  # radio: kl on text, or answer_nll on a workload
SEARCH_FORM = "search_form"  # form: profile, scope, budget, evaluations, sequences, seed of a search
SEARCH_FLASH = "search_flash"  # the "Started <job>" message, shown once after the launch's rerun
SEARCH_JOB = "search_job"  # selectbox: the search job followed (trace, best plan, verdict)

# ---- profiles and heterogeneity (app/views/profiles.py, heterogeneity.py) -------------------------
PROFILE_FORM = "profile_form"  # form: the settings of a profile to compute
PROFILE_STATISTIC = "profile_statistic"  # radio: the statistic profiles are ranked and won by, "cosine" or "dppl"
PROFILE_VIEW = "profile_view"  # radio: the profile grid's view, one of charts.PROFILE_VIEWS
HETEROGENEITY_FORM = "heterogeneity_form"  # form: inputs, tokens, attention share, sources


# ---- per-item keys --------------------------------------------------------------------------------
def plan_table(version: int) -> str:
    """Data editor: the per-layer table of plan version `version` (its edit state lives under this key)."""
    return f"plan_table_{version}"


def designer_flash(slot: str) -> str:
    """[(kind, text)]: the designer's messages for `slot` (beside the controls that made them), shown once."""
    return f"designer_flash_{slot}"


def palette_button(method: str) -> str:
    """Button: choose `method` (or "(keep)") in the designer's paint palette."""
    return f"palette_{method}"


def plan_name(version: int) -> str:
    """Text input: the name under which plan version `version` is saved."""
    return f"plan_name_{version}"


def settings_text(suite: str) -> str:
    """Text area: the settings (JSON) of `suite`, one per suite so each keeps its own edits."""
    return f"settings_{suite}"


def cancel_button(job_id: str) -> str:
    """Button: cancel the running job `job_id`."""
    return f"cancel_{job_id}"


def edit_button(job_id: str) -> str:
    """The Edit settings button of a job that failed before its first sample."""
    return f"edit_{job_id}"


def resume_button(job_id: str) -> str:
    """Button: resume the stopped, cancelled or failed job `job_id`."""
    return f"resume_{job_id}"


# ---- what the pages remember across page changes and reloads -------------------------------------------------
# Streamlit forgets a widget's value once a page without it has run; `session.remember_pages` re-stores these
# keys on every run, so a page shows what was last entered on it, and saves them in the session's pages.json
# for a reload (the designer keeps its plan and selection in its draft).
RUN_BUDGETS = "run_budgets"  # text: the Runs page's budgets
RUN_BASELINES = "run_baselines"  # multiselect: the Runs page's baselines
RUN_PLACEMENTS = "run_placements"  # number: random placements
RUN_SEED = "run_seed"  # number: the Runs page's seed
RUNS_READ = "runs_read"  # selectbox: the run whose answers the Runs page shows
RUNS_READ_TASK = "runs_read_task"  # selectbox: the task whose answers it shows (or every task)
FIRST_RUN_MINUTES = "first_run_minutes"  # number: the time the proposed first run may take here
FIRST_RUN_LAUNCH = "first_run_launch"  # button: launch the proposed first run (its pilot, then the decisive run)
FIRST_RUN_MEASURE_SPEED = "first_run_measure_speed"
FIRST_RUN_FLASH = "first_run_flash"  # the "Started <job>" message of the proposed first run, under its button
REMEMBERED = (
    RUN_PLAN,
    RUN_SUITE,
    RUN_BUDGETS,
    RUN_BASELINES,
    RUN_PLACEMENTS,
    RUN_SEED,
    FIRST_RUN_MINUTES,
    EXPERIMENT_KIND,
    EXPERIMENT_SUITE,
    SEARCH_OBJECTIVE,
    DESIGNER_LAYERS,
    DESIGNER_PHASE,
)
KEPT_IN_DRAFT = (DESIGNER_LAYERS, DESIGNER_PHASE)  # the designer's selection: saved with its plan (per model)
PAGES_SAVED = "pages_saved"  # the page entries last written to (or read from) the session's pages.json
PAGES_KEPT = "pages_kept"  # the pages' entries as the last full run left them (what a fragment's run makes lost)
PAGES_FIRST_SEEN = "pages_first_seen"  # each page entry's value when it first appeared in this session
REMEMBERED_PREFIXES = ("settings_", "experiment_settings_")  # each suite's settings text (Runs, Experiments)

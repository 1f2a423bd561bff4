"""What every page shares: where files live, the model (loaded once per process), the plan being
designed, the pages' small decisions (defaults, which jobs and runs to show) and figure display. UI
glue only; the work is done by `polykv`. Session-state keys come from `app.state`."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import streamlit as st

from app import charts, state
from polykv import design, drafts, jobs, models
from polykv.errors import PolyKVError, debug, first_line
from polykv.files import read_text
from polykv.methods import validate_plan
from polykv.plan import MAX_PLAN_BYTES, Plan, PlanError
from polykv.workspace import default_workspace

REPO = Path(__file__).resolve().parents[1]
SHIPPED_PLANS = REPO / "plans"  # plans/<embedded model>/mixed.json: where the designer starts for that model
DEFAULT_MODEL = ("demo", "cpu")  # (name, device) until another model is loaded
KEEP = "(keep)"  # the paint palette's "leave the method as it is"
DESIGNER_PLAN = "(designer)"  # the Runs page's plan picker: the plan on the designer, not a saved file


def workspace() -> Path:
    """Results database, profiles, jobs and logs: the library's one rule (`polykv.workspace`)."""
    return default_workspace()


def plans_dir() -> Path:
    """Where the designer saves and loads plans (`$POLYKV_PLANS`, default the repo's `plans/`)."""
    return Path(os.environ.get("POLYKV_PLANS", REPO / "plans"))


@st.cache_resource(show_spinner="Loading the model (once per app process)...")
def _load(name: str, device: str):
    model, tokenizer = models.load_model(name, device=device)  # quiet: no download progress bars
    if device == "cpu" and sum(p.numel() for p in model.parameters()) < 20_000_000:
        import torch

        # A tiny model's matmuls are too small to share: extra threads only add hand-offs, which stall
        # badly when another process holds a core (measured: 4.2 s -> 1.1 s for the demo's inputs).
        torch.set_num_threads(1)
    return model, tokenizer


def show_failure(exc: BaseException) -> None:
    """One inline line for what escaped a page: the message of a user error (a bad file, a damaged
    database, a read-only workspace); for anything else, that it is a bug (traceback: POLYKV_DEBUG=1)."""
    if isinstance(exc, (PolyKVError, OSError, sqlite3.Error)):
        st.error(first_line(exc))
    elif debug():
        raise exc
    else:
        st.error(
            f"Internal error (a bug in PolyKV): {exc.__class__.__name__}: {first_line(exc)}. "
            "Start the app with POLYKV_DEBUG=1 to see the traceback."
        )


def load_model(name: str, device: str, switch: bool = True) -> str | None:
    """Load (name, device) and, with `switch`, make it the current model; returns an error message (and
    keeps the old model) on failure."""
    try:
        _load(name, device)
    except Exception as exc:  # any failure to load is the user's input: say it in one line
        return f"Could not load model {name!r} on {device}: {first_line(exc)}"
    if switch:
        st.session_state[state.MODEL] = (name, device)
    return None


def chosen_model() -> tuple[str, str]:
    """(name, device) of the model chosen in the sidebar (the demo model until another is loaded)."""
    return st.session_state.get(state.MODEL, DEFAULT_MODEL)


def fall_back_to_demo() -> None:
    """Make the demo model the current one again (the chosen one could not be reloaded)."""
    switch_model(*DEFAULT_MODEL)


def set_model_error(problem: str | None) -> None:
    """Remember the sidebar's model-loading error (None: the load succeeded, forget it)."""
    if problem:
        st.session_state[state.MODEL_ERROR] = problem
    else:
        st.session_state.pop(state.MODEL_ERROR, None)


def model_error() -> str | None:
    return st.session_state.get(state.MODEL_ERROR)


def devices() -> list[str]:
    """The devices a model can be loaded on here: the CPU, and CUDA when there is one."""
    return ["cpu"] + (["cuda"] if cuda_available() else [])


def index_of(options: Sequence[Any], value: Any, default: int = 0) -> int:
    """The index of `value` among `options` (a widget's initial choice), `default` when it is not there."""
    return list(options).index(value) if value in options else default


def current_model():
    """(name, device, model, tokenizer) of the chosen model; the demo model until another is loaded."""
    name, device = st.session_state.setdefault(state.MODEL, DEFAULT_MODEL)
    model, tokenizer = _load(name, device)
    return name, device, model, tokenizer


def num_layers() -> int:
    return models.num_layers(current_model()[2])


# ---- the browser session: its id (in the URL), its model and its drafts ---------------------------------
def session_id() -> str:
    """This browser session's id, carried in the URL (`?session=...`) so that a reload or an app restart
    finds the session's drafts and model again; a new id when the URL has none (or a bad one)."""
    sid = st.session_state.get(state.SESSION_ID)
    if sid is None:
        sid = drafts.valid_session_id(st.query_params.get("session")) or drafts.new_session_id()
        st.session_state[state.SESSION_ID] = sid
        _restore_model(sid)
    if st.query_params.get("session") != sid:  # a page switch drops it from the URL: put it back
        st.query_params["session"] = sid
    return sid


def _restore_model(sid: str) -> None:
    """The model this session used last (a reload starts where it was); the demo model if it fails."""
    remembered = drafts.load_session_model(workspace(), sid)
    if remembered is None or remembered == DEFAULT_MODEL:
        return
    problem = load_model(*remembered)
    if problem:
        set_model_error(f"{problem}; using the demo model.")


def _remember_model(name: str, device: str) -> None:
    try:
        drafts.save_session_model(workspace(), session_id(), name, device)
    except (PolyKVError, OSError) as exc:  # a read-only workspace: the session still works, unsaved
        st.session_state[state.DRAFT_PROBLEM] = f"The session is not saved: {first_line(exc)}"


def request_model(name: str, device: str) -> None:
    """The sidebar's Load: load the model, then switch to it at once when the plan on the designer fits it
    (the plan comes along); when it does not fit, ask first (`pending_model`)."""
    problem = load_model(name, device, switch=False)
    set_model_error(problem)
    if problem:
        return
    st.session_state.pop(state.PENDING_MODEL, None)
    old_name = current_model()[0]
    if name == old_name:  # another device: the same plan
        switch_model(name, device)
        return
    current, model = plan(), _load(name, device)[0]
    try:
        validate_plan(current, models.num_layers(model), models.context_length(model))
    except PlanError as exc:
        st.session_state[state.PENDING_MODEL] = (
            name,
            device,
            f"The plan on the designer, {current.name!r}, does not fit {name!r} ({first_line(exc)}). "
            f"Switch anyway? The plan stays a draft of {old_name!r} and comes back when you load "
            f"{old_name!r} again.",
        )
        return
    switch_model(name, device, carry=current)


def pending_model() -> tuple[str, str, str] | None:
    """(name, device, question) of a model switch waiting for the user's answer."""
    return st.session_state.get(state.PENDING_MODEL)


def answer_pending_model(switch: bool) -> None:
    pending = st.session_state.pop(state.PENDING_MODEL, None)
    if pending is not None and switch:
        switch_model(pending[0], pending[1])


def switch_model(name: str, device: str, carry: Plan | None = None) -> None:
    """Make (name, device) the current model. Its own draft comes up on the designer, unless `carry` (a
    plan that fits it) is given: then that plan, with its undo history, becomes the new model's draft."""
    st.session_state[state.MODEL] = (name, device)
    _remember_model(name, device)
    if carry is None:  # `plan()` opens the new model's draft
        st.session_state.pop(state.PLAN_MODEL, None)
        st.session_state.pop(state.PLAN_JSON, None)
    else:
        st.session_state[state.PLAN_MODEL] = name
        st.session_state[state.PLAN_JSON] = carry.to_json()
        _save_draft()
    new_plan_version()


# ---- the plan being designed ------------------------------------------------------------------------
def plan() -> Plan:
    """The designer's current plan (always valid for the current model): this session's draft for the
    model (from memory, else from its draft file), else the model's shipped mixed plan (`plans/<name>/`, for
    the embedded models) or a fresh one."""
    name, layers = current_model()[0], num_layers()
    text = st.session_state.get(state.PLAN_JSON)
    owner = st.session_state.get(state.PLAN_MODEL)
    if text is not None and owner == name:
        return Plan.from_json(text)
    if text is not None and owner is None and Plan.from_json(text).num_layers == layers:
        st.session_state[state.PLAN_MODEL] = name  # a plan put in the session directly (a script, a test)
        return Plan.from_json(text)
    draft = _read_draft(name)
    if draft is None or draft.plan.num_layers != layers:
        shipped = SHIPPED_PLANS / name / "mixed.json"
        start = Plan.load(shipped) if name in models.EMBEDDED_MODELS and shipped.is_file() else None
        if start is None or start.num_layers != layers:
            start = Plan.homogeneous("tova", 256, layers, "decode", name="new-plan")
        draft = drafts.Draft(start)
    st.session_state[state.PLAN_JSON] = draft.plan.to_json()
    st.session_state[state.UNDO] = list(draft.undo)
    st.session_state[state.REDO] = list(draft.redo)
    st.session_state[state.PLAN_MODEL] = name
    new_plan_version()
    return draft.plan


def _read_draft(model_name: str) -> drafts.Draft | None:
    try:
        return drafts.load_draft(workspace(), session_id(), model_name)
    except (PolyKVError, OSError) as exc:  # a damaged draft: say so, start afresh (the file stays)
        st.session_state[state.DRAFT_PROBLEM] = f"Could not reopen the draft: {first_line(exc)}"
        return None


def _save_draft() -> None:
    """Write the session's plan, undo and redo for the current model to its draft file."""
    draft = drafts.Draft(
        Plan.from_json(st.session_state[state.PLAN_JSON]),
        list(st.session_state.get(state.UNDO, [])),
        list(st.session_state.get(state.REDO, [])),
    )
    try:
        drafts.save_draft(workspace(), session_id(), st.session_state[state.PLAN_MODEL], draft)
    except (PolyKVError, OSError) as exc:  # e.g. a read-only workspace: the edit stands, unsaved
        st.session_state[state.DRAFT_PROBLEM] = f"The plan is not saved as a draft: {first_line(exc)}"
    else:
        st.session_state.pop(state.DRAFT_PROBLEM, None)


def draft_problem() -> str | None:
    """Why the session's plan or model could not be saved or reopened, if it could not."""
    return st.session_state.get(state.DRAFT_PROBLEM)


def plan_version() -> int:
    """How many times the plan has changed: the per-version widgets (table, name) are keyed by it."""
    return st.session_state.get(state.PLAN_VERSION, 0)


def new_plan_version() -> None:
    """Start fresh per-version widgets (e.g. drop the table's pending edits)."""
    st.session_state[state.PLAN_VERSION] = plan_version() + 1


def set_plan(new: Plan) -> None:
    """Make `new` the current plan (validated for the model), keeping the old one for undo; saved as the
    session's draft."""
    validate_plan(new, num_layers())
    old = plan().to_json()
    if old != new.to_json():
        _push(state.UNDO, old)
        st.session_state[state.REDO] = []  # a new edit: what was undone is gone, as in any editor
    st.session_state[state.PLAN_JSON] = new.to_json()
    _save_draft()
    new_plan_version()


def _push(key: str, text: str) -> None:
    stack = st.session_state.setdefault(key, [])
    stack.append(text)
    del stack[: -drafts.HISTORY]


def can_undo() -> bool:
    return bool(st.session_state.get(state.UNDO))


def can_redo() -> bool:
    return bool(st.session_state.get(state.REDO))


def undo() -> bool:
    """Back to the plan before the last edit (Redo brings the edit back)."""
    return _step(state.UNDO, state.REDO)


def redo() -> bool:
    return _step(state.REDO, state.UNDO)


def _step(source: str, target: str) -> bool:
    stack = st.session_state.get(source) or []
    if not stack:
        return False
    _push(target, plan().to_json())
    st.session_state[state.PLAN_JSON] = stack.pop()
    _save_draft()
    new_plan_version()
    return True


# ---- the designer's glue: messages, edits, the selection ----------------------------------------------
def flash(key: str, text: str, kind: str = "success") -> None:
    """Show `text` (st.success, st.warning, ...) once, after the next rerun, where `show_flash(key)` is."""
    st.session_state[key] = [(kind, text)]


def show_flash(key: str) -> None:
    for kind, text in st.session_state.pop(key, []):
        getattr(st, kind)(text)


def commit(new: Plan, message: str | None = None) -> None:
    """Make `new` the plan and redraw the designer; a PlanError leaves the plan as it was and says why.
    A change of the plan's scope is announced, whatever made it."""
    before = plan()
    try:
        set_plan(new)
    except PlanError as exc:
        st.error(str(exc))
        return
    messages = [("success", message)] if message else []
    changed = design.scope_change(before, new)
    if changed:
        messages.append(("warning", changed))
    st.session_state[state.DESIGNER_FLASH] = messages
    st.rerun()


def attempt(build: Callable[[], Plan], message: str | None = None) -> None:
    """`commit(build(), message)`, or the PlanError `build` raised, said in one line."""
    try:
        new = build()
    except PlanError as exc:
        st.error(str(exc))
        return
    commit(new, message)


def follow_chart_selection(layers: int) -> None:
    """Copy a new selection on the plan chart into the layer list and phase (once per selection: the
    list stays editable), and drop selected layers the model does not have."""
    chart = st.session_state.get(state.PLAN_CHART) or {}
    picked = charts.selected_cells((chart.get("selection") or {}).get("points", []))
    if picked != st.session_state.get(state.CHART_SEEN):
        st.session_state[state.CHART_SEEN] = picked
        chart_layers, chart_phases = picked
        if chart_layers:
            st.session_state[state.DESIGNER_LAYERS] = chart_layers
            phase = design.phase_choice(chart_phases)
            if phase is not None:
                st.session_state[state.DESIGNER_PHASE] = phase
    st.session_state[state.DESIGNER_LAYERS] = design.layers_in(st.session_state.get(state.DESIGNER_LAYERS, []), layers)


def selection_boxes() -> list[dict]:
    """The selection as boxes on the plan chart's strip (`charts.selection_boxes`), however it was made."""
    return charts.selection_boxes(selected_layers(), shown_phases())


def selected_layers() -> list[int]:
    return list(st.session_state.get(state.DESIGNER_LAYERS, []))


def select_layers(layers: Iterable[int]) -> None:
    """A button's callback: make `layers` the selection."""
    st.session_state[state.DESIGNER_LAYERS] = list(layers)


def phase_follows_scope(current: Plan) -> None:
    """The paint phase starts at the plan's scope, and follows it whenever the scope changes (a plan
    loaded, built or painted), so painting a decode plan does not silently make it a "both" one."""
    if st.session_state.get(state.SCOPE_SEEN) != current.scope.value:
        st.session_state[state.SCOPE_SEEN] = current.scope.value
        st.session_state[state.DESIGNER_PHASE] = current.scope.value


def paint_palette() -> list[tuple[str, str | None]]:
    """The palette for the chosen phase: every method with None or why it cannot be painted there. A chosen
    method that cannot run in the phase is dropped (back to keeping the method)."""
    entries = design.palette(st.session_state.get(state.DESIGNER_PHASE, design.PHASE_CHOICES[0]))
    if dict(entries).get(st.session_state.get(state.PAINT_METHOD)) is not None:
        st.session_state[state.PAINT_METHOD] = KEEP
    return entries


def choose_method(method: str) -> None:
    """A palette button's callback."""
    st.session_state[state.PAINT_METHOD] = method


def chosen_method() -> str:
    return st.session_state.get(state.PAINT_METHOD, KEEP)


def shown_phases() -> tuple[str, ...]:
    """The phases whose selected cells the chart outlines: those the phase choice names."""
    return design.phase_values(st.session_state.get(state.DESIGNER_PHASE, design.PHASE_CHOICES[0]))


def paint_request() -> tuple[list[int], str, str | None, int | None]:
    """(layers, phase choice, method or None to keep it, capacity or None to keep it) from the palette."""
    method = st.session_state.get(state.PAINT_METHOD, KEEP)
    capacity = st.session_state.get(state.PAINT_CAPACITY)
    return (
        selected_layers(),
        st.session_state.get(state.DESIGNER_PHASE, design.PHASE_CHOICES[0]),
        None if method == KEEP else method,
        None if capacity is None else int(capacity),
    )


def new_upload(upload) -> bool:
    """Whether `upload` (a file uploader's file) is one not loaded yet; remembers it as loaded."""
    if upload is None or st.session_state.get(state.UPLOAD_SEEN) == upload.file_id:
        return False
    st.session_state[state.UPLOAD_SEEN] = upload.file_id
    return True


def saved_plans() -> list[Path]:
    """Plan files under the plans directory (regular files only), relative to it."""
    root = plans_dir()
    return sorted(p.relative_to(root) for p in root.rglob("*.json") if p.is_file()) if root.is_dir() else []


def read_plan_file(relative: Path) -> Plan:
    """A saved plan, read safely (a regular file of bounded size) and checked against the current model."""
    return read_plan(read_text(plans_dir() / relative, "plan file", MAX_PLAN_BYTES, error=PlanError), str(relative))


def read_plan(text: str | bytes, where: str) -> Plan:
    """A plan from user-provided JSON, checked against the current model; PlanError (one line) if not."""
    try:
        loaded = Plan.from_json(text)
    except PlanError as exc:
        raise PlanError(f"{where}: {exc}") from None
    try:
        return validate_plan(loaded, num_layers())
    except PlanError as exc:
        raise PlanError(f"{where}: this plan does not fit {current_model()[0]!r}: {exc}") from None


# ---- profiles ------------------------------------------------------------------------------------
def profiles(model_name: str) -> tuple[list, list[str]]:
    """The saved profiles of `model_name` in the workspace, and a message for each damaged one."""
    from polykv.profile.store import scan_profiles

    found, damaged = scan_profiles(workspace() / "profiles")
    return [p for p in found if p.meta.model == model_name], damaged


def fitting_profiles() -> list:
    """The current model's readable profiles with its number of layers (what a plan can be built from)."""
    layers = num_layers()
    return [p for p in profiles(current_model()[0])[0] if p.num_layers == layers]


def source_choices(model_name: str) -> list[str]:
    """Calibration sources to offer for `model_name`: its default ones first, then every known one."""
    from polykv.profile.corpus import KNOWN_SOURCES, default_sources

    return list(dict.fromkeys((*default_sources(model_name), *KNOWN_SOURCES)))


def profile_defaults(model_name: str) -> dict[str, int]:
    """The profile form's starting sequences and tokens per sequence: small on the demo model, so that a
    first profile takes seconds on a laptop CPU."""
    demo = model_name == DEFAULT_MODEL[0]
    return {"sequences": 4 if demo else 20, "max_tokens": 512 if demo else 2048}


# ---- jobs and runs -------------------------------------------------------------------------------------
RESUMABLE = ("stopped", "cancelled", "failed")  # the job states that Resume restarts
# Small defaults on the demo model so a first run takes seconds on a laptop CPU.
DEMO_SETTINGS = {"fidelity": {"samples_per_task": 2, "prompt_tokens": 256}}


def default_settings(suite: str, model_name: str) -> str:
    """The Runs page's starting settings (JSON) of `suite` for `model_name`: the suite's defaults, the
    fidelity suite on the model's own default tasks, smaller on the demo model."""
    from polykv.eval.runner import SUITES
    from polykv.eval.suites.fidelity import default_tasks

    settings = SUITES[suite].Settings().to_dict()
    if suite == "fidelity":  # the model's own default tasks (for the demo: text it models well)
        settings["tasks"] = list(default_tasks(model_name))
    if model_name == DEFAULT_MODEL[0]:
        settings.update(DEMO_SETTINGS.get(suite, {}))
    return json.dumps(settings)


def eval_job(
    model_name: str,
    device: str,
    plan: Plan,
    suite: str,
    settings_text: str,
    budgets_text: str,
    baselines: Sequence[str],
    placements: int,
    seed: int,
):
    """The evaluation job the Runs page's form describes (not started): the plan at each budget, the
    baselines and the random placements. PolyKVError or ValueError with one line when the form is wrong."""
    from polykv.eval.experiments import launch_plans
    from polykv.eval.settings import parse_budgets, suite_settings
    from polykv.eval.unit import Unit

    budgets = parse_budgets(budgets_text)
    settings = suite_settings(suite, settings_text)
    labelled = launch_plans(plan, budgets, list(baselines), int(placements), int(seed))
    units = [(label, Unit.of(model_name, p, suite, settings, int(seed), device)) for label, p in labelled]
    more = f" + {len(units) - 1} more" if len(units) > 1 else ""
    return jobs.eval_job(units, f"{plan.name} on {suite}{more}")


def profile_job(
    model_name: str, device: str, sources: Sequence[str], sequences: int, max_tokens: int, b_cal: int, scope: str
):
    """The profile job the Profiles page's form describes (not started); `b_cal` 0 is automatic. ValueError
    with one line when the form is wrong (no source, a bad one)."""
    from polykv.plan import Scope
    from polykv.profile.corpus import CorpusSpec

    spec = CorpusSpec(sources=tuple(sources), num_sequences=int(sequences), max_tokens=int(max_tokens))
    return jobs.profile_job(
        model_name,
        device,
        spec.to_dict(),
        int(b_cal) or None,
        [p.value for p in Scope(scope).phases],
        f"profile {model_name}",
    )


def jobs_of(all_jobs: Iterable, kind: str, model_name: str | None = None, limit: int | None = None) -> list:
    """The jobs of `kind` ("eval" or "profile"), of `model_name` when given, newest first, at most `limit`."""
    found = [j for j in all_jobs if j.kind == kind and (model_name is None or j.model == model_name)]
    return found[:limit]


def running(job_list: Iterable, where: Path) -> set[str]:
    """The ids of the jobs that run now (a page polls while any does)."""
    return {j.id for j in job_list if jobs.state(j, where).status == "running"}


def start_job(build: Callable[[], Any], flash_key: str | None = None, refused: str = "Not started") -> None:
    """Build a job (`build()`) and start it in the background, then redraw the page (saying "Started <id>"
    where `show_flash(flash_key)` is). Bad input, or a job that cannot start, is one inline line
    ("<refused>: why") and starts nothing."""
    try:
        job = build()
        jobs.start(job, workspace())
    except (PolyKVError, ValueError) as exc:
        st.error(f"{refused}: {first_line(exc)}")
        return
    if flash_key is not None:
        runs = len(job.runs)
        flash(flash_key, f"Started {job.id}" + (f" ({runs} run{'s' * (runs > 1)})." if runs else f": {job.title}."))
    st.rerun()


def job_controls(job, progress, where: Path) -> None:
    """Cancel (a running job: waits until its worker has exited), Resume (a stopped, cancelled or failed
    one: finished runs are found in the store, not recomputed) and the job's log tail."""
    if progress.status == "running" and st.button("Cancel", key=state.cancel_button(job.id)):
        try:
            jobs.cancel(job, where)
        except PolyKVError as exc:
            st.error(f"Not cancelled: {first_line(exc)}")
        else:
            st.rerun()
    if progress.status in RESUMABLE and st.button("Resume", key=state.resume_button(job.id)):
        try:
            jobs.start(job, where)
        except PolyKVError as exc:  # e.g. its worker still runs
            st.error(f"Not resumed: {first_line(exc)}")
        else:
            st.rerun()
    with st.expander("Log"):
        st.code(jobs.log_tail(job, where) or "(empty)", language=None)


def run_rows(store) -> list[dict[str, Any]]:
    """One row per run in `store`, newest first: what it is, its progress, and the macro-average over its
    tasks of each metric (over the tasks that report it)."""
    from polykv.eval.compare import macro_average

    rows = []
    for run in reversed(store.runs()):
        row = {
            "run": run["id"],
            "plan": run["plan_name"],
            "suite": run["suite"],
            "model": run["model"],
            "status": run["status"],
            "samples": f"{run['done_samples']}/{run['total_samples']}",
            "created": run["created"][:19],
        }
        scores = store.task_scores(run["id"])
        for metric in sorted({m for values in scores.values() for m in values}):
            row[metric] = macro_average({task: values[metric] for task, values in scores.items() if metric in values})
        rows.append(row)
    return rows


def finished_run_rows(store) -> list[dict[str, Any]]:
    """The finished runs in `store`, newest first (what the Compare page offers)."""
    return [r for r in reversed(store.runs()) if r["status"] == "finished"]


def run_label(run: dict[str, Any]) -> str:
    """A run as the Compare page lists it."""
    return f"{run['plan_name']} · {run['suite']} · {run['model']} · {run['id'][:8]}"


def default_metric(metrics: Sequence[str]) -> int:
    """Index of the metric to compare on first: KL divergence when the runs report it."""
    return index_of(metrics, "kl")


def sweep_jobs(eval_jobs: Iterable) -> list:
    """The jobs that evaluated baselines (a budget sweep to draw)."""
    return [j for j in eval_jobs if any(r.label.get("series") not in ("route", "placement", None) for r in j.runs)]


def placement_jobs(eval_jobs: Iterable) -> list:
    """The jobs that evaluated random placements (a placement control to draw)."""
    return [j for j in eval_jobs if any(r.label.get("series") == "placement" for r in j.runs)]


def finished_runs(store, job) -> set[str]:
    """The ids of the job's runs that have finished."""
    progress = store.progress([r.run_id for r in job.runs])
    return {run_id for run_id, (_, _, status) in progress.items() if status == "finished"}


def sweep_runs(job) -> list[tuple[dict[str, Any], str]]:
    """(label, run id) of the job's route and baseline runs: the points of its budget sweep."""
    return [(r.label, r.run_id) for r in job.runs if r.label.get("series") != "placement"]


def placement_runs(job, finished: set[str]):
    """(the guided run or None, the finished placement runs) of a placement job."""
    guided = next((r for r in job.runs if r.label.get("role") == "guided"), None)
    return guided, [r for r in job.runs if r.label.get("series") == "placement" and r.run_id in finished]


# ---- figures -------------------------------------------------------------------------------------
def show(fig, name: str, **kwargs):
    """A plotly figure whose camera button downloads it as PNG or SVG (the sidebar's choice)."""
    fmt = st.session_state.get(state.FIGURE_FORMAT, "png")
    return st.plotly_chart(fig, config=charts.download_config(fmt, name), theme=None, **kwargs)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


# ---- heterogeneity ---------------------------------------------------------------------------------
@st.cache_data(show_spinner="Building the inputs...", max_entries=8)
def _inputs(model_key, inputs: int, max_tokens: int, sources: tuple[str, ...]):
    from polykv.profile.corpus import CorpusSpec, build_corpus

    _, _, model, tokenizer = current_model()
    spec = CorpusSpec(sources=sources, num_sequences=inputs, max_tokens=max_tokens, seed=0)
    return build_corpus(tokenizer, spec, model=model).sequences


@st.cache_data(show_spinner="Measuring attention support...", max_entries=16)
def heterogeneity(
    model_key, inputs: int, max_tokens: int, coverage: float, sources: tuple[str, ...], density_input: int
):
    """The current model's attention support over `inputs` inputs (cached per `model_key`, the model's
    (name, device)): (per-layer support frame, density map of input `density_input`, clipped to the
    inputs built, the inputs' length, that input's index)."""
    from polykv.profile.heterogeneity import measure_heterogeneity

    model = current_model()[2]
    sequences = _inputs(model_key, inputs, max_tokens, sources)
    result = measure_heterogeneity(model, sequences, coverage=coverage)
    index = min(density_input, len(sequences) - 1)
    if index:  # the map of another input than the first: measure that one alone
        density = measure_heterogeneity(model, [sequences[index]], coverage=coverage, bootstrap=1).density
    else:
        density = result.density
    return result.to_frame("layers"), density, len(sequences[0]), index

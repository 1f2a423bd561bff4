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
from polykv import design, jobs, models
from polykv.errors import PolyKVError, debug, first_line
from polykv.files import read_text
from polykv.methods import validate_plan
from polykv.plan import MAX_PLAN_BYTES, Plan, PlanError
from polykv.workspace import default_workspace

REPO = Path(__file__).resolve().parents[1]
DEMO_PLAN = REPO / "plans" / "demo" / "mixed.json"
DEFAULT_MODEL = ("demo", "cpu")  # (name, device) until another model is loaded
KEEP = "(keep)"  # the paint palette's "leave the method as it is"


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


def load_model(name: str, device: str) -> str | None:
    """Make (name, device) the current model; returns an error message (and keeps the old model) on failure."""
    try:
        _load(name, device)
    except Exception as exc:  # any failure to load is the user's input: say it in one line
        return f"Could not load model {name!r} on {device}: {first_line(exc)}"
    st.session_state[state.MODEL] = (name, device)
    return None


def chosen_model() -> tuple[str, str]:
    """(name, device) of the model chosen in the sidebar (the demo model until another is loaded)."""
    return st.session_state.get(state.MODEL, DEFAULT_MODEL)


def fall_back_to_demo() -> None:
    """Make the demo model the current one again (the chosen one could not be reloaded)."""
    st.session_state[state.MODEL] = DEFAULT_MODEL


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


# ---- the plan being designed ------------------------------------------------------------------------
def plan() -> Plan:
    """The designer's current plan (always valid for the current model)."""
    layers = num_layers()
    text = st.session_state.get(state.PLAN_JSON)
    if text is not None:
        current = Plan.from_json(text)
        if current.num_layers == layers:
            return current
    start = Plan.load(DEMO_PLAN) if DEMO_PLAN.is_file() else None
    if start is None or start.num_layers != layers:
        start = Plan.homogeneous("tova", 256, layers, "decode", name="new-plan")
    st.session_state[state.PLAN_JSON] = start.to_json()
    st.session_state[state.UNDO] = []
    return start


def plan_version() -> int:
    """How many times the plan has changed: the per-version widgets (table, name) are keyed by it."""
    return st.session_state.get(state.PLAN_VERSION, 0)


def new_plan_version() -> None:
    """Start fresh per-version widgets (e.g. drop the table's pending edits)."""
    st.session_state[state.PLAN_VERSION] = plan_version() + 1


def set_plan(new: Plan) -> None:
    """Make `new` the current plan (validated for the model), keeping the old one for undo."""
    validate_plan(new, num_layers())
    old = st.session_state.get(state.PLAN_JSON)
    if old is not None and old != new.to_json():
        st.session_state.setdefault(state.UNDO, []).append(old)
        del st.session_state[state.UNDO][:-50]
    st.session_state[state.PLAN_JSON] = new.to_json()
    new_plan_version()


def can_undo() -> bool:
    return bool(st.session_state.get(state.UNDO))


def undo() -> bool:
    stack = st.session_state.get(state.UNDO) or []
    if not stack:
        return False
    st.session_state[state.PLAN_JSON] = stack.pop()
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
    """Make `new` the plan and redraw the designer; a PlanError leaves the plan as it was and says why."""
    try:
        set_plan(new)
    except PlanError as exc:
        st.error(str(exc))
        return
    if message:
        flash(state.DESIGNER_FLASH, message)
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


def selected_layers() -> list[int]:
    return list(st.session_state.get(state.DESIGNER_LAYERS, []))


def select_layers(layers: Iterable[int]) -> None:
    """A button's callback: make `layers` the selection."""
    st.session_state[state.DESIGNER_LAYERS] = list(layers)


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


def default_b(run_ids: Sequence[str]) -> int:
    """Index of run B to compare with run A (the newest) first: the next newest, when there is one."""
    return min(1, len(run_ids) - 1)


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

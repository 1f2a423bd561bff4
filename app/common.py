"""What every page shares: where files live, the model (loaded once per process), the plan being
designed, and figure display. UI glue only; the work is done by `polykv`."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import streamlit as st

from app import charts
from polykv import models
from polykv.errors import PolyKVError, debug, first_line
from polykv.files import read_text
from polykv.methods import validate_plan
from polykv.plan import MAX_PLAN_BYTES, Plan, PlanError
from polykv.workspace import default_workspace

REPO = Path(__file__).resolve().parents[1]
DEMO_PLAN = REPO / "plans" / "demo" / "mixed.json"


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
        st.error(f"Internal error (a bug in PolyKV): {exc.__class__.__name__}: {first_line(exc)}. "
                 "Start the app with POLYKV_DEBUG=1 to see the traceback.")


def load_model(name: str, device: str) -> str | None:
    """Make (name, device) the current model; returns an error message (and keeps the old model) on failure."""
    try:
        _load(name, device)
    except Exception as exc:  # any failure to load is the user's input: say it in one line
        return f"Could not load model {name!r} on {device}: {first_line(exc)}"
    st.session_state["model"] = (name, device)
    return None


def current_model():
    """(name, device, model, tokenizer) of the chosen model; the demo model until another is loaded."""
    name, device = st.session_state.setdefault("model", ("demo", "cpu"))
    model, tokenizer = _load(name, device)
    return name, device, model, tokenizer


def num_layers() -> int:
    return models.num_layers(current_model()[2])


# ---- the plan being designed ------------------------------------------------------------------------
def plan() -> Plan:
    """The designer's current plan (always valid for the current model)."""
    layers = num_layers()
    text = st.session_state.get("plan_json")
    if text is not None:
        current = Plan.from_json(text)
        if current.num_layers == layers:
            return current
    start = Plan.load(DEMO_PLAN) if DEMO_PLAN.is_file() else None
    if start is None or start.num_layers != layers:
        start = Plan.homogeneous("tova", 256, layers, "decode", name="new-plan")
    st.session_state["plan_json"] = start.to_json()
    st.session_state["undo"] = []
    return start


def set_plan(new: Plan) -> None:
    """Make `new` the current plan (validated for the model), keeping the old one for undo."""
    validate_plan(new, num_layers())
    old = st.session_state.get("plan_json")
    if old is not None and old != new.to_json():
        st.session_state.setdefault("undo", []).append(old)
        del st.session_state["undo"][:-50]
    st.session_state["plan_json"] = new.to_json()
    st.session_state["plan_version"] = st.session_state.get("plan_version", 0) + 1


def undo() -> bool:
    stack = st.session_state.get("undo") or []
    if not stack:
        return False
    st.session_state["plan_json"] = stack.pop()
    st.session_state["plan_version"] = st.session_state.get("plan_version", 0) + 1
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


# ---- figures -------------------------------------------------------------------------------------
def show(fig, name: str, **kwargs):
    """A plotly figure whose camera button downloads it as PNG or SVG (the sidebar's choice)."""
    fmt = st.session_state.get("figure_format", "png")
    return st.plotly_chart(fig, config=charts.download_config(fmt, name), theme=None, **kwargs)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()

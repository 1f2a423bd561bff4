"""This browser session and its model: the session id (carried in the URL), the model loaded once per app
process and chosen per session, the workspace, and the one-line message for a failure on a page."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import streamlit as st

from app import state
from polykv import drafts, models
from polykv.errors import PolyKVError, debug, first_line
from polykv.methods import validate_plan
from polykv.plan import Plan
from polykv.workspace import default_workspace

DEMO = "demo"  # the embedded 5-layer stories260K: the fallback, and the tests' fast model
APP_MODEL_ENV = "POLYKV_APP_MODEL"  # the model the app opens on (`demo` in the tests)


def default_model() -> tuple[str, str]:
    """(name, device) the app opens on: smollm2 (SmolLM2-135M-Instruct: 30 layers, an 8K context, a chat
    template), a model that can ask the paper's questions, on CPU; `$POLYKV_APP_MODEL` names another."""
    return (os.environ.get(APP_MODEL_ENV) or "smollm2", "cpu")


def is_demo(name: str) -> bool:
    """Is `name` the demo model (whose page defaults are small, so a first run takes seconds)?"""
    return name == DEMO


def workspace() -> Path:
    """Results database, profiles, jobs and logs: the library's one rule (`polykv.workspace`)."""
    return default_workspace()


@st.cache_resource(show_spinner="Loading the model (once per app process)...")
def load_cached(name: str, device: str):
    model, tokenizer = models.load_model(name, device=device)  # quiet: no download progress bars
    if device == "cpu" and sum(p.numel() for p in model.parameters()) < 20_000_000:
        # A tiny model's matmuls are too small to share: extra threads only add hand-offs, which stall
        # badly when another process holds a core (measured: 4.2 s -> 1.1 s for the demo's inputs).
        run_forwards_on_threads(model, 1)
    return model, tokenizer


def run_forwards_on_threads(model, threads: int) -> None:
    """Every forward of `model` runs on `threads` intra-op threads: torch's count is set for the calling thread
    as the forward starts and put back when it ends (an error included), so the count belongs to this model,
    not to the process, whose other work and other models keep theirs. Kept on the model as `polykv_threads`."""
    import torch

    model.polykv_threads = threads
    outer = threading.local()  # per calling thread: the count to put back, and how deep in forwards it is

    def before(module, args):
        depth = getattr(outer, "depth", 0)
        if depth == 0:
            outer.previous = torch.get_num_threads()
            torch.set_num_threads(module.polykv_threads)
        outer.depth = depth + 1

    def after(module, args, output):
        outer.depth -= 1
        if outer.depth == 0:
            torch.set_num_threads(outer.previous)

    model.register_forward_pre_hook(before)
    model.register_forward_hook(after, always_call=True)


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
        load_cached(name, device)
    except Exception as exc:  # any failure to load is the user's input: say it in one line
        return f"Could not load model {name!r} on {device}: {first_line(exc)}"
    if switch:
        st.session_state[state.MODEL] = (name, device)
    return None


def chosen_model() -> tuple[str, str]:
    """(name, device) of the model chosen in the sidebar (`default_model()` until another is loaded)."""
    return st.session_state.get(state.MODEL, default_model())


def set_model_error(problem: str | None) -> None:
    """Remember the sidebar's model-loading error (None: the load succeeded, forget it)."""
    if problem:
        st.session_state[state.MODEL_ERROR] = problem
    else:
        st.session_state.pop(state.MODEL_ERROR, None)


def model_error() -> str | None:
    return st.session_state.get(state.MODEL_ERROR)


def devices() -> list[str]:
    """The devices a model can be loaded on here: the CPU and, when there are GPUs, `cuda` (the current one) and
    each of them by index (`cuda:0`, `cuda:1`, ...: a second GPU for a second job)."""
    count = cuda_count()
    return ["cpu"] + (["cuda", *(f"cuda:{i}" for i in range(count))] if count else [])


def current_model():
    """(name, device, model, tokenizer) of the chosen model; `default_model()` until another is loaded."""
    name, device = st.session_state.setdefault(state.MODEL, default_model())
    model, tokenizer = load_cached(name, device)
    return name, device, model, tokenizer


def num_layers() -> int:
    return models.num_layers(current_model()[2])


def context_length() -> int | None:
    return models.context_length(current_model()[2])


def layer_windows() -> list[int | None]:
    """Each layer's sliding window (a local layer) or None (a global one) of the current model."""
    return models.layer_windows(current_model()[2])


def kv_token_bytes() -> int:
    """One token's key and value in one layer of the current model, in bytes."""
    from polykv.kv_memory import kv_dimensions, token_bytes

    return token_bytes(kv_dimensions(current_model()[2]))


def layer_kinds() -> str:
    """ ", 15 local (window 512) and 3 global" for a hybrid model; "" when every layer is global."""
    windows = layer_windows()
    local = [w for w in windows if w is not None]
    if not local:
        return ""
    sizes = "/".join(str(w) for w in sorted(set(local)))
    return f", {len(local)} local (window {sizes}) and {len(windows) - len(local)} global"


def check_plan(plan: Plan) -> Plan:
    """`plan` if it fits the current model (its layers, and its context for every token count, capacities
    included); PlanError (one line) otherwise."""
    model = current_model()[2]
    return validate_plan(plan, models.num_layers(model), models.context_length(model), within_context=True)


def remember_pages() -> None:
    """Keep the pages' entries (`state.REMEMBERED`) across page changes: a widget's value survives a run of a
    page without it only when the script sets it (Streamlit's documented way). First in every run.

    A fragment's run (the Runs page polls a running job every 2 s) counts only the fragment's widgets as seen,
    so a page switch right after one drops every other widget of that page: the values the last full run left
    (`save_pages` keeps them) are put back."""
    for key, value in st.session_state.get(state.PAGES_KEPT, {}).items():
        if key not in st.session_state:
            st.session_state[key] = value
    for key in list(st.session_state.keys()):
        if _remembered(key):
            st.session_state[key] = st.session_state[key]


def _remembered(key) -> bool:
    return key in state.REMEMBERED or str(key).startswith(state.REMEMBERED_PREFIXES)


def save_pages() -> None:
    """Write the pages' entries to the session's `pages.json` (a reload brings them back) when one has changed
    since it first appeared: pages only looked at write nothing. Last in every run, so that an entry's first
    value is the one its page drew."""
    st.session_state[state.PAGES_KEPT] = {k: v for k, v in st.session_state.items() if _remembered(k)}
    entries = {}
    first_seen = st.session_state.setdefault(state.PAGES_FIRST_SEEN, {})
    for key in list(st.session_state.keys()):
        value = st.session_state[key]
        if _remembered(key) and key not in state.KEPT_IN_DRAFT and _saveable(value):
            entries[str(key)] = value
            first_seen.setdefault(str(key), value)
    saved = st.session_state.get(state.PAGES_SAVED)
    entered = saved is not None or any(first_seen[key] != value for key, value in entries.items())
    if entered and entries != saved:
        try:
            drafts.save_pages(workspace(), session_id(), entries)
        except (PolyKVError, OSError):  # a read-only workspace: the pages still remember until a reload
            return
        st.session_state[state.PAGES_SAVED] = entries


def _saveable(value) -> bool:
    """A value `pages.json` can hold (a plan file's Path, say, is not: that entry is kept until a reload only)."""
    plain = (str, int, float, bool, type(None))
    return isinstance(value, plain) or (isinstance(value, list) and all(isinstance(v, plain[:3]) for v in value))


def _restore_pages(sid: str) -> None:
    """A new session (a reload) opens its pages as they were left."""
    entries = drafts.load_pages(workspace(), sid)
    for key, value in entries.items():
        if _remembered(key):
            st.session_state[key] = value
    if entries:
        st.session_state[state.PAGES_SAVED] = entries


def session_id() -> str:
    """This browser session's id, carried in the URL (`?session=...`) so that a reload or an app restart
    finds the session's drafts and model again; a new id when the URL has none (or a bad one)."""
    sid = st.session_state.get(state.SESSION_ID)
    if sid is None:
        sid = drafts.valid_session_id(st.query_params.get("session")) or drafts.new_session_id()
        st.session_state[state.SESSION_ID] = sid
        _restore_model(sid)
        _restore_pages(sid)
    if st.query_params.get("session") != sid:  # a page switch drops it from the URL: put it back
        st.query_params["session"] = sid
    return sid


def _restore_model(sid: str) -> None:
    """The model this session used last (a reload starts where it was); the default model if it fails."""
    remembered = drafts.load_session_model(workspace(), sid)
    if remembered is None or remembered == default_model():
        return
    problem = load_model(*remembered)
    if problem:
        set_model_error(f"{problem}; using {default_model()[0]}.")


def remember_model(name: str, device: str) -> None:
    try:
        drafts.save_session_model(workspace(), session_id(), name, device)
    except (PolyKVError, OSError) as exc:  # a read-only workspace: the session still works, unsaved
        st.session_state[state.DRAFT_PROBLEM] = f"The session is not saved: {first_line(exc)}"


def cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0

"""Working plans that outlive a browser tab: the designer's plan, with its undo and redo history, saved as
a draft file per browser session and model, so a reload, an app restart or a model switch loses nothing.

  <workspace>/drafts/<session id>/session.json      the session's model (name, device)
  <workspace>/drafts/<session id>/pages.json        what was entered on the pages (Runs, Experiments, ...)
  <workspace>/drafts/<session id>/<model key>.json  the plan being designed for that model, undo, redo,
                                                    and the designer's selection

The session id travels in the page's URL (`?session=...`): the same URL opens the same drafts. Drafts are
written whole and renamed into place (`polykv.files.atomic_write_json`) and read back validated; a
damaged one is reported as a `DraftError` (one line), never fatal to the caller.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from polykv.errors import PolyKVError, validation_line
from polykv.files import atomic_write_json, read_json
from polykv.plan import MAX_LAYERS, Plan, PlanError

HISTORY = 50  # plans kept for undo (and for redo)
MAX_DRAFT_BYTES = 16 * 1024 * 1024
_SESSION_ID = re.compile(r"[a-f0-9]{8,32}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class DraftError(PolyKVError):
    """A draft file that cannot be read back (damaged, foreign, too large)."""


def new_session_id() -> str:
    return uuid.uuid4().hex[:16]


def valid_session_id(value: object) -> str | None:
    """`value` when it can name a session (it names a folder: hex digits only), else None."""
    return value if isinstance(value, str) and _SESSION_ID.fullmatch(value) else None


@dataclass
class Draft:
    """The plan being designed for one model in one session, with what Undo and Redo bring back (plans
    as JSON, newest last) and the designer's selection (a reload keeps it)."""

    plan: Plan
    undo: list[str] = field(default_factory=list)
    redo: list[str] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)  # the designer's selection: layers and phase choice
    phase: str | None = None


class _DraftFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    plan: str
    undo: list[str] = Field(default_factory=list, max_length=HISTORY)
    redo: list[str] = Field(default_factory=list, max_length=HISTORY)
    layers: list[int] = Field(default_factory=list, max_length=MAX_LAYERS)  # absent in older drafts
    phase: Literal["both", "prefill", "decode"] | None = None


class _SessionFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    device: str


def _folder(workspace: Path, session: str) -> Path:
    if valid_session_id(session) is None:
        raise DraftError(f"not a session id: {session!r}")
    return Path(workspace) / "drafts" / session


def model_key(model: str) -> str:
    """A file name for a model name or path: readable, and unique through a hash of the full name."""
    tail = _UNSAFE.sub("-", model.rstrip("/").rsplit("/", 1)[-1]).strip("-.")[:40] or "model"
    return f"{tail}-{hashlib.sha1(model.encode()).hexdigest()[:10]}"


def draft_path(workspace: Path, session: str, model: str) -> Path:
    return _folder(workspace, session) / f"{model_key(model)}.json"


def save_draft(workspace: Path, session: str, model: str, draft: Draft) -> Path:
    data = {
        "model": model,
        "plan": draft.plan.to_json(),
        "undo": draft.undo[-HISTORY:],
        "redo": draft.redo[-HISTORY:],
        "layers": [int(i) for i in draft.layers],
        "phase": draft.phase,
    }
    return atomic_write_json(draft_path(workspace, session, model), data, indent=None)


def load_draft(workspace: Path, session: str, model: str) -> Draft | None:
    """The session's draft for `model`, None when there is none; DraftError when it cannot be read."""
    path = draft_path(workspace, session, model)
    if not path.exists():
        return None
    try:
        checked = _DraftFile.model_validate(read_json(path, "draft", MAX_DRAFT_BYTES, error=DraftError))
    except ValidationError as exc:
        raise DraftError(f"{path}: {validation_line(exc)}") from None
    if checked.model != model:
        raise DraftError(f"{path}: a draft of {checked.model!r}, not of {model!r}")
    try:
        plan = Plan.from_json(checked.plan)
    except PlanError as exc:
        raise DraftError(f"{path}: {exc}") from None
    layers = [i for i in checked.layers if 0 <= i < plan.num_layers]
    return Draft(plan, list(checked.undo), list(checked.redo), layers, checked.phase)


def save_session_model(workspace: Path, session: str, model: str, device: str) -> Path:
    return atomic_write_json(_folder(workspace, session) / "session.json", {"model": model, "device": device})


def load_session_model(workspace: Path, session: str) -> tuple[str, str] | None:
    """(model, device) the session last used, None when unknown or unreadable (the demo model then)."""
    path = _folder(workspace, session) / "session.json"
    if not path.exists():
        return None
    try:
        checked = _SessionFile.model_validate(read_json(path, "session file", 4096, error=DraftError))
    except (DraftError, ValidationError):
        return None
    return checked.model, checked.device


@dataclass(frozen=True)
class DraftEntry:
    """One draft of the workspace as a list shows it: whose session, which model, the plan's name, when it was
    last written (UTC, ISO seconds), and why it cannot be read when it cannot (`problem`)."""

    session: str
    model: str
    plan_name: str
    modified: str
    path: Path
    problem: str | None = None


def list_drafts(workspace: Path) -> list[DraftEntry]:
    """Every draft of the workspace, newest first; a damaged one listed with its problem (never fatal)."""
    import datetime

    root = Path(workspace) / "drafts"
    found = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if not folder.is_dir() or valid_session_id(folder.name) is None:
            continue
        for path in folder.glob("*.json"):
            if path.name in ("session.json", "pages.json") or not path.is_file():
                continue
            stamp = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC).isoformat(timespec="seconds")
            try:
                checked = _DraftFile.model_validate(read_json(path, "draft", MAX_DRAFT_BYTES, error=DraftError))
                name = Plan.from_json(checked.plan).name
            except (DraftError, PlanError, ValidationError, OSError) as exc:
                found.append(
                    DraftEntry(
                        folder.name,
                        "?",
                        "?",
                        stamp,
                        path,
                        validation_line(exc) if isinstance(exc, ValidationError) else str(exc).splitlines()[0],
                    )
                )
                continue
            found.append(DraftEntry(folder.name, checked.model, name, stamp, path))
    return sorted(found, key=lambda d: d.modified, reverse=True)


def delete_draft(entry: DraftEntry) -> None:
    """Remove a draft's file (its session's other files stay: another model's draft, the pages' entries)."""
    if entry.path.parent.parent.name != "drafts" or valid_session_id(entry.path.parent.name) is None:
        raise DraftError(f"{entry.path} is not a draft")
    entry.path.unlink(missing_ok=True)


# What a page entry may be, as saved: a text, a number, a flag, or a list of texts or numbers.
PageValue = str | int | float | bool | None | list[str | int | float]
MAX_PAGES_BYTES = 256 * 1024


class _PagesFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    entries: dict[str, PageValue] = Field(max_length=256)


def save_pages(workspace: Path, session: str, entries: dict[str, PageValue]) -> Path:
    """Save the entries of the session's pages (the Runs page's suite and settings, ...), by widget key."""
    return atomic_write_json(_folder(workspace, session) / "pages.json", {"entries": entries}, indent=None)


def load_pages(workspace: Path, session: str) -> dict[str, PageValue]:
    """The session's saved page entries ({} when none, or unreadable: the pages then start afresh)."""
    path = _folder(workspace, session) / "pages.json"
    if not path.exists():
        return {}
    try:
        return _PagesFile.model_validate(read_json(path, "pages file", MAX_PAGES_BYTES, error=DraftError)).entries
    except (DraftError, ValidationError):
        return {}


__all__ = [
    "HISTORY",
    "Draft",
    "DraftEntry",
    "DraftError",
    "delete_draft",
    "list_drafts",
    "draft_path",
    "load_draft",
    "load_pages",
    "load_session_model",
    "model_key",
    "new_session_id",
    "save_draft",
    "save_pages",
    "save_session_model",
    "valid_session_id",
]

"""Saving a plan from the designer: a safe file name for a plan's name (`plan_filename`), and the plan saved
under it, never over an existing file unless asked (`save_plan`)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import NamedTuple

from polykv.plan import Plan, PlanError
from polykv.text import check_text

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def plan_filename(name: str) -> str:
    """A safe file name for a plan called `name`: letters, digits, '.', '_' and '-' only, no path. A name
    with no ASCII letter or digit (e.g. 'план', '...') gets a stable generated one, `plan-<hash>.json`."""
    if not name.strip():
        raise PlanError("plan name: give the plan a name")
    try:
        check_text(name)
    except ValueError as exc:
        raise PlanError(f"plan name: {exc}") from None
    stem = _UNSAFE.sub("-", name.strip()).strip(".-")[:80]
    if not re.search(r"[A-Za-z0-9]", stem):
        stem = f"plan-{hashlib.sha256(name.strip().encode()).hexdigest()[:10]}"
    return stem if stem.endswith(".json") else f"{stem}.json"


class SavedPlan(NamedTuple):
    """What `save_plan` did: the file written (None when it refused), a one-line message, and the plan
    under its new name (whether or not it was written)."""

    path: Path | None
    message: str
    plan: Plan


def save_plan(plan: Plan, folder: str | os.PathLike, name: str, overwrite: bool = False) -> SavedPlan:
    """Save `plan`, renamed `name` (stripped; a new name's description says which plan it was edited from), to
    `folder` under the safe file name `plan_filename(name)`.
    An existing file (or link) of that name is replaced only when `overwrite` is true; otherwise nothing
    is written and the message says the file exists. PlanError for an empty name, OSError when the
    file cannot be written."""
    folder = Path(folder)
    target = folder / plan_filename(name)
    renamed = name.strip() != plan.name
    # a new name is a new plan: the old one's description no longer says what it is
    description = f"edited from {plan.name}" if renamed else plan.description
    named = plan.model_copy(update={"name": name.strip(), "description": description})
    if os.path.lexists(target) and not overwrite:
        return SavedPlan(None, f"{target.name} exists in {folder}", named)
    named.save(target)
    return SavedPlan(target, f"Saved {target}", named)

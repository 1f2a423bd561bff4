"""Options of an evaluation as a user writes them: a suite's settings (JSON) and a list of budgets.

One function each, used by the CLI, the app and the jobs alike, so every caller refuses the same input
with the same one-line `SettingsError` (a suite's defaults on a model: `polykv.eval.running.defaults`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from polykv.errors import PolyKVError, SettingsError, first_line, validation_line
from polykv.files import parse_json
from polykv.text import whole_number

SUITE_NAMES = ("fidelity", "longbench", "ruler")
COMPETENCE_THRESHOLD = (
    20.0  # FullKV accuracy (0-100) under which a task is at the floor (`polykv.eval.workloads.competence`)
)


def suite_module(suite: str):
    """The module of a suite (`Settings`, `build_samples`, `score_sample`); imported on demand (torch)."""
    if suite not in SUITE_NAMES:
        raise SettingsError(f"unknown suite {suite!r} (suites: {', '.join(SUITE_NAMES)})")
    from importlib import import_module

    return import_module(f"polykv.eval.suites.{suite}")


def suite_settings(suite: str, settings: str | bytes | Mapping[str, Any] | None = None):
    """The suite's `Settings` from JSON text or a mapping (None or empty text: the defaults).

    Types are strict (no "2" for 2, no true for 1; lists stand for tuples), unknown keys are refused, and
    the suite's own checks run (the fields', then the module's `check_settings`, e.g. that LongBench's
    `data_dir` holds the chosen tasks' files); every problem is one line naming the field."""
    from polykv import limits

    module = suite_module(suite)
    parsed = _parse(suite, module.Settings, settings)
    limits.check_at_most(
        f"{suite} samples_per_task", getattr(parsed, "samples_per_task", None), limits.SAMPLES_PER_TASK
    )
    check = getattr(module, "check_settings", None)  # what a suite checks beyond the fields (files, ...)
    if check is not None:
        try:
            check(parsed)
        except (PolyKVError, OSError, ValueError) as exc:
            raise SettingsError(about_settings(suite, first_line(exc))) from None
    return parsed


def _parse(suite: str, cls, settings: str | bytes | Mapping[str, Any] | None):
    from pydantic import TypeAdapter, ValidationError

    if settings is None or (isinstance(settings, (str, bytes)) and not settings.strip()):
        return cls()
    data = (
        parse_json(settings, f"{suite} settings", error=SettingsError)
        if isinstance(settings, (str, bytes))
        else settings
    )
    if not isinstance(data, Mapping):
        raise SettingsError(
            f'{suite} settings: expected a JSON object such as {{"samples_per_task": 2}}, got {type(data).__name__}'
        )
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = [str(k) for k in data if k not in known]
    if unknown:
        raise SettingsError(
            f"{suite} settings: unknown field {', '.join(map(repr, unknown))} (fields: {', '.join(known)})"
        )
    try:
        return TypeAdapter(cls).validate_json(json.dumps(dict(data)), strict=True)
    except ValidationError as exc:
        raise SettingsError(about_settings(suite, validation_line(exc))) from None
    except (PolyKVError, OSError, ValueError, TypeError) as exc:  # a suite's own check outside pydantic
        raise SettingsError(about_settings(suite, first_line(exc))) from None


def about_settings(suite: str, problem: str) -> str:
    """The problem, said once to be about this suite's settings ("ruler settings: ..."); a suite's own checks
    may name the suite already ("ruler settings: ...", "ruler length 4096 exceeds ...")."""
    return problem if problem.startswith(f"{suite} ") else f"{suite} settings: {problem}"


def parse_settings_object(text: str | None, what: str = "settings") -> dict | None:
    """A JSON object given on the command line (None or empty: None); anything else is one line."""
    if text is None or not text.strip():
        return None
    data = parse_json(text, what, error=SettingsError)
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise SettingsError(f'{what}: expected a JSON object such as {{"samples_per_task": 2}}, got {kind}')
    return data


def parse_budgets(text: str | None, what: str = "budgets") -> list[int]:
    """'128, 256,512' -> [128, 256, 512]: positive whole numbers separated by commas (empty: [])."""
    budgets = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        value = whole_number(item, most_digits=9)
        if value is None or value < 1:
            raise SettingsError(f"{what} are positive whole numbers separated by commas, e.g. 64,128 (got {item!r})")
        budgets.append(value)
    return budgets


__all__ = ["SUITE_NAMES", "parse_budgets", "parse_settings_object", "suite_module", "suite_settings"]

"""A suite's defaults on a model, decided once for the CLI (`polykv eval`, `polykv experiment ...`), the study
(`polykv.eval.study`) and the app's launch forms: `suite_defaults` (every field, as the forms show them) and
`settings_on_model` (a run's `Settings`: the user's JSON over a command's options over those defaults)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from polykv.errors import SettingsError
from polykv.eval.running.settings import suite_module, suite_settings
from polykv.files import parse_json

# What the app's launch forms start from on the demo model: a first run of seconds on a laptop CPU.
SMALL_SETTINGS: dict[str, dict[str, Any]] = {"fidelity": {"samples_per_task": 2, "prompt_tokens": 256}}


def _model_fields(suite: str, model: str | None) -> dict[str, Any]:
    """The fields of a suite's settings whose default depends on the model: the fidelity suite's tasks (text a
    model of its kind models well, `polykv.eval.suites.fidelity.default_tasks`)."""
    if suite != "fidelity":
        return {}
    from polykv.eval.suites.fidelity import default_tasks

    return {"tasks": list(default_tasks(model))}


def suite_defaults(
    suite: str,
    model: str | None,
    *,
    small: bool = False,
    loaded: tuple[Any, Any] | None = None,
    first_run: bool = False,
) -> dict[str, Any]:
    """A suite's default settings on `model`, every field (a JSON object): the suite's defaults where the model
    has none of its own (the fidelity suite's tasks are the model's); `small`: the sizes of a first run of seconds
    (`SMALL_SETTINGS`, the app's forms on the demo model); RULER, with `loaded` (the model and tokenizer): the
    largest standard length within the model's context on the tasks that fit there (`first_run`: a first run of a
    minute or two on a CPU, `polykv.eval.running.fit.fitting_ruler_settings`). What the app's forms show, and what
    `settings_on_model` starts from for the CLI and the study."""
    if suite == "ruler" and loaded is not None:
        from polykv.eval.running.fit import fitting_ruler_settings

        return fitting_ruler_settings(*loaded, first_run=first_run).to_dict()
    defaults = suite_module(suite).Settings().to_dict()
    defaults.update(_model_fields(suite, model))
    if small:
        defaults.update(SMALL_SETTINGS.get(suite, {}))
    return defaults


def settings_on_model(
    suite: str,
    model: str | None,
    given: str | bytes | Mapping[str, Any] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    metric: str | None = None,
):
    """A suite's `Settings` for a run on `model`: `given` (the user's JSON object) over a command's `options`
    (its own fields, e.g. --samples) over the suite's defaults on the model (`suite_defaults`); a question suite
    scored by `metric` runs in the mode that reports it unless `given` names one (answer_nll: score, no
    generation; other metrics: the runner refuses them). Every problem is one line (`suite_settings`)."""
    from polykv.eval.suites.answer_settings import MODE_METRICS, mode_for

    data = given
    if isinstance(given, (str, bytes)):
        data = parse_json(given, f"{suite} settings", error=SettingsError) if given.strip() else None
    if data is not None and not isinstance(data, Mapping):
        return suite_settings(suite, data)  # refused: not a JSON object
    settings = suite_settings(suite, {**_model_fields(suite, model), **(options or {}), **(data or {})})
    if metric in MODE_METRICS["both"] and hasattr(settings, "mode"):
        settings = dataclasses.replace(settings, mode=mode_for(metric, (data or {}).get("mode")))
    return settings


__all__ = ["SMALL_SETTINGS", "settings_on_model", "suite_defaults"]

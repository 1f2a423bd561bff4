"""Can these runs start on this model? Checked before anything is written or launched.

A run that cannot start fails the same way at every sample: a RULER length past the model's context, a task
whose shortest prompt does not fit the length, a plan whose capacities exceed the context. A job launched
with such settings failed seconds later in the background and stayed listed with a Resume that could not
succeed; `check_fits` says it at once, in one line, as the first sample of each task would. The CLI (`eval`,
the study) and the app's Runs page call it before they create a job, a run or a results database.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from polykv.errors import PolyKVError, SettingsError, first_line
from polykv.plan import Plan


def check_fits(suite: str, settings, model, tokenizer, plans: Sequence[Plan] = (), seed: int = 0) -> None:
    """SettingsError (one line) when the plans or the suite's first sample of a task cannot run on `model`."""
    from polykv.eval.running.settings import about_settings, suite_module
    from polykv.methods import validate_plan
    from polykv.models import context_length, num_layers

    layers, context = num_layers(model), context_length(model)
    for plan in plans:
        try:
            validate_plan(plan, layers, context, within_context=True)
        except (PolyKVError, ValueError) as exc:
            raise SettingsError(f"plan {plan.name}: {first_line(exc)}") from None
    one = dataclasses.replace(settings, samples_per_task=1) if hasattr(settings, "samples_per_task") else settings
    try:
        suite_module(suite).build_samples(tokenizer, model, one, seed)  # what every run builds first
    except (PolyKVError, OSError, ValueError) as exc:
        raise SettingsError(about_settings(suite, first_line(exc))) from None


# RULER's standard lengths, and the shorter ones a small model's context allows.
STANDARD_RULER_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


# A first RULER run on a CPU, sized to end in a minute or two: one sample of one task per RULER category that
# needs no data file (retrieval, multi-hop tracing, aggregation), at the largest standard length up to 1,024.
FIRST_RUN_TASKS = ("niah_single_1", "vt", "fwe")
FIRST_RUN_LENGTH = 1024


def fitting_ruler_settings(model, tokenizer, seed: int = 0, first_run: bool = False):
    """RULER's default settings made to fit `model`: the largest standard length within its context, on the
    default tasks whose first sample fits at that length (a tiny context leaves tasks out). With `first_run`
    (the app on a CPU): `FIRST_RUN_TASKS` at the largest standard length up to `FIRST_RUN_LENGTH`, one sample
    each (measured on smollm2 here: 25 s for the three), to be raised for evidence."""
    from polykv.eval.suites.ruler import RulerSettings
    from polykv.models import context_length

    defaults = RulerSettings()
    context = context_length(model)
    limit = min(context or FIRST_RUN_LENGTH, FIRST_RUN_LENGTH) if first_run else context
    within = [n for n in STANDARD_RULER_LENGTHS if limit is None or n <= limit]
    length = within[-1] if within else limit
    candidates = FIRST_RUN_TASKS if first_run else defaults.tasks
    tasks = []
    for task in candidates:
        try:
            check_fits(
                "ruler", dataclasses.replace(defaults, tasks=(task,), length=length), model, tokenizer, seed=seed
            )
        except SettingsError:
            continue
        tasks.append(task)
    fitted = dataclasses.replace(defaults, tasks=tuple(tasks) or candidates, length=length)
    return dataclasses.replace(fitted, samples_per_task=1) if first_run else fitted


__all__ = ["FIRST_RUN_LENGTH", "FIRST_RUN_TASKS", "STANDARD_RULER_LENGTHS", "check_fits", "fitting_ruler_settings"]

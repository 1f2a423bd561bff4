"""Jobs on a page: which to list, starting one (with its estimate beside the button), and a job's controls
(Cancel, Resume, Edit settings, its log)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import streamlit as st

from app import state
from app.designer_controls import flash
from app.session import current_model, workspace
from polykv import jobs
from polykv.errors import PolyKVError, first_line

RESUMABLE = ("stopped", "cancelled", "failed")  # the job states that Resume restarts


def jobs_of(all_jobs: Iterable, kind: str, model_name: str | None = None, limit: int | None = None) -> list:
    """The jobs of `kind` ("eval" or "profile"), of `model_name` when given, newest first, at most `limit`."""
    found = [j for j in all_jobs if j.kind == kind and (model_name is None or j.model == model_name)]
    return found[:limit]


def running(job_list: Iterable, where: Path) -> set[str]:
    """The ids of the jobs that run now (a page polls while any does)."""
    return {j.id for j in job_list if jobs.state(j, where).status == "running"}


CONFIRM_ABOVE_S = 15 * 60  # a launch estimated longer asks for a second press that restates its estimate


def start_job(build: Callable[[], Any], flash_key: str | None = None, refused: str = "Not started") -> None:
    """Build a job (`build()`) and start it in the background, then redraw the page (saying "Started <id>"
    where `show_flash(flash_key)` is). Bad input, or a job that cannot start, is one inline line
    ("<refused>: why") and starts nothing."""
    from polykv.jobs.costs import with_estimate
    from polykv.text import duration

    try:
        job = build()
        _, _, model, tokenizer = current_model()
        job = with_estimate(job, model, tokenizer, workspace())  # the estimate goes with it, to be checked
        asked = job.model_dump(mode="json", exclude={"id", "created"})  # the same launch, whatever its kind
        if (job.estimate_s or 0) > CONFIRM_ABOVE_S and st.session_state.get(state.LAUNCH_TO_CONFIRM) != asked:
            st.session_state[state.LAUNCH_TO_CONFIRM] = asked  # the same launch pressed again starts it
            st.warning(f"This launch is estimated at about {duration(job.estimate_s)} here: press again to start it.")
            return
        st.session_state.pop(state.LAUNCH_TO_CONFIRM, None)
        jobs.start(job, workspace())
    except (PolyKVError, ValueError) as exc:
        st.error(f"{refused}: {first_line(exc)}")
        return
    if flash_key is not None:
        runs = len(job.runs)
        flash(flash_key, f"Started {job.id}" + (f" ({runs} run{'s' * (runs > 1)})." if runs else f": {job.title}."))
    st.rerun()


def show_estimate(work: Callable[[], Any], key: str):
    """Beside a launch button: what the work `work()` counts (`polykv.costs.Work`) would take here, before it
    starts; until the model's speed on this device is measured, a button that measures it (seconds, once).
    Nothing when the launch cannot be described: launching says why. Returns the estimate (None where none)."""
    from polykv import costs

    name, device, model, _ = current_model()
    if costs.stored_rates(name, device) is None:
        cols = st.columns([3, 1])
        cols[0].caption(f"Estimates need {name}'s speed on {device}: measured once, in seconds, then kept.")
        if cols[1].button("Measure speed", key=key):
            try:
                with st.spinner(f"Timing {name}'s prompt passes and decode steps ..."):
                    costs.measure_rates(model, name, device)
            except (PolyKVError, OSError, ValueError, RuntimeError) as exc:
                st.error(f"Not measured: {first_line(exc)}")
                return
            st.rerun()
        return None
    try:
        found = costs.estimate(work(), costs.stored_rates(name, device))
    except (PolyKVError, ValueError, OSError):
        return None  # launching says what is wrong
    st.caption(found.line().replace("estimate:", "Estimated here:", 1))
    return found


def launch_estimate(build: Callable[[], Any], key: str) -> None:
    """`show_estimate` for the job `build()` describes (`polykv.jobs.costs`)."""
    from polykv.jobs.costs import job_work

    _, _, model, tokenizer = current_model()
    show_estimate(lambda: job_work(build(), model, tokenizer, workspace()), key)


def failed_before_any_sample(job, progress) -> bool:
    """An evaluation job that failed before any of its runs scored a sample: its settings, not its luck, are
    wrong, so resuming it would fail again."""
    return job.kind == "eval" and progress.status == "failed" and not any(run.done for run in progress.runs)


def edit_settings(job) -> None:
    """Put a job's suite and settings back into the Runs page's form (an on_click callback: it runs before the
    page's widgets are made)."""
    unit = job.runs[0].unit
    st.session_state[state.RUN_SUITE] = unit.suite
    st.session_state[state.settings_text(unit.suite)] = unit.settings_json


def job_controls(job, progress, where: Path) -> None:
    """Cancel (a running job: waits until its worker has exited), Resume (a stopped, cancelled or failed
    one: finished runs are found in the store, not recomputed), Edit settings instead of Resume for an
    evaluation that failed before its first sample, and the job's log tail."""
    if progress.status == "running" and st.button("Cancel", key=state.cancel_button(job.id)):
        try:
            jobs.cancel(job, where)
        except PolyKVError as exc:
            st.error(f"Not cancelled: {first_line(exc)}")
        else:
            st.rerun()
    if failed_before_any_sample(job, progress):
        st.caption("It failed before its first sample: its settings cannot run as they are.")
        st.button("Edit settings", key=state.edit_button(job.id), on_click=edit_settings, args=(job,))
    elif progress.status in RESUMABLE and st.button("Resume", key=state.resume_button(job.id)):
        try:
            jobs.start(job, where)
        except PolyKVError as exc:  # e.g. its worker still runs
            st.error(f"Not resumed: {first_line(exc)}")
        else:
            st.rerun()
    with st.expander("Log"):
        st.code(jobs.log_tail(job, where) or "(empty)", language=None)

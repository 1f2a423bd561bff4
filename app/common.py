"""What the pages decide alike: the profiles of a model, the starting settings of runs and profiles, which
jobs and runs to show, starting and controlling a job, and figure display. UI glue only; the work is done
by `polykv`. The session and its model are `app.session`, the plan being designed `app.plan_draft`, the
designer's edits `app.designer_controls`; session-state keys come from `app.state`."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import streamlit as st

from app import charts, state
from app.designer_controls import flash
from app.session import current_model, is_demo, num_layers, workspace
from polykv import jobs
from polykv.errors import PolyKVError, first_line
from polykv.plan import Plan

DESIGNER_PLAN = "(designer)"  # the Runs page's plan picker: the plan on the designer, not a saved file


def index_of(options: Sequence[Any], value: Any, default: int = 0) -> int:
    """The index of `value` among `options` (a widget's initial choice), `default` when it is not there."""
    return list(options).index(value) if value in options else default


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
    demo = is_demo(model_name)
    return {"sequences": 4 if demo else 20, "max_tokens": 512 if demo else 2048}


RESUMABLE = ("stopped", "cancelled", "failed")  # the job states that Resume restarts


# Small defaults on the demo model so a first run takes seconds on a laptop CPU.
DEMO_SETTINGS = {"fidelity": {"samples_per_task": 2, "prompt_tokens": 256}}


@st.cache_data(show_spinner="Finding the RULER settings that fit the model ...", max_entries=8)
def _fitting_ruler(model_name: str, device: str) -> dict:
    from polykv.eval.fit import fitting_ruler_settings

    _, _, model, tokenizer = current_model()
    return fitting_ruler_settings(model, tokenizer, first_run=device == "cpu").to_dict()


def default_settings(suite: str, model_name: str) -> str:
    """The Runs page's starting settings (JSON) of `suite` for `model_name`: the suite's defaults, the
    fidelity suite on the model's own default tasks, smaller on the demo model, RULER at the largest standard
    length within the loaded model's context on the tasks that fit there (on a CPU: a first run of a minute or
    two, `polykv.eval.fit.FIRST_RUN_TASKS`)."""
    from polykv.eval.runner import SUITES
    from polykv.eval.suites.fidelity import default_tasks

    if suite == "ruler":
        return json.dumps(_fitting_ruler(model_name, current_model()[1]))
    settings = SUITES[suite].Settings().to_dict()
    if suite == "fidelity":  # the model's own default tasks (for the demo: text it models well)
        settings["tasks"] = list(default_tasks(model_name))
    if is_demo(model_name):
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
    loaded: tuple[Any, Any] | None = None,
):
    """The evaluation job the Runs page's form describes (not started): the plan at each budget, the
    baselines and the random placements. PolyKVError or ValueError with one line when the form is wrong, or
    when `loaded` (the model and tokenizer) cannot run it (`polykv.eval.fit`: a length past the context, a
    task whose shortest prompt does not fit, a capacity past the context)."""
    from polykv.eval.experiments import launch_plans
    from polykv.eval.fit import check_fits
    from polykv.eval.settings import parse_budgets, suite_settings
    from polykv.eval.unit import Unit

    budgets = parse_budgets(budgets_text)
    settings = suite_settings(suite, settings_text)
    labelled = launch_plans(plan, budgets, list(baselines), int(placements), int(seed))
    if loaded is not None:
        check_fits(suite, settings, *loaded, [p for _, p in labelled], int(seed))
    units = [(label, Unit.of(model_name, p, suite, settings, int(seed), device)) for label, p in labelled]
    more = f" + {len(units) - 1} more" if len(units) > 1 else ""
    return jobs.eval_job(units, f"{plan.name} on {suite}{more}")


def first_run(model_name: str, device: str, plan: Plan, minutes: float):
    """The Runs page's proposed first run for `plan` (`polykv.eval.first_run`): from this workspace's runs, the
    model's profiles and its measured speed (the decisive run's samples fit `minutes` here)."""
    from polykv.eval import first_run as proposal
    from polykv.eval.store import Store

    _, _, model, tokenizer = current_model()
    store = Store(workspace() / "results.sqlite", readonly=True)
    length = min(proposal.LENGTH, _fitting_ruler(model_name, device)["length"])
    scoped = [p for p in profiles(model_name)[0] if p.num_layers == plan.num_layers]
    tasks = proposal.competent(model_name, store, length)[0]
    per_sample = proposal.cost_per_sample(model_name, device, model, tokenizer, tasks, length)
    return proposal.propose(
        model_name,
        plan,
        store,
        length,
        profile=scoped[0] if scoped else None,
        seconds_per_sample=per_sample,
        allowance_s=60.0 * minutes,
    )


def first_run_job(model_name: str, device: str, proposed):
    """The evaluation job of a proposed first run (its pilot or its decisive run)."""
    from polykv.eval.unit import Unit

    units = [
        (label, Unit.of(model_name, plan, "ruler", proposed.settings, proposed.seed, device))
        for label, plan in proposed.plans
    ]
    step = "pilot" if proposed.pilot else "decisive run"
    return jobs.eval_job(units, f"first run ({step}): {proposed.plans[0][1].name} vs {proposed.baseline}, answer_nll")


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
    from polykv.jobs.costs import with_estimate

    try:
        job = build()
        _, _, model, tokenizer = current_model()
        jobs.start(
            with_estimate(job, model, tokenizer, workspace()), workspace()
        )  # the estimate goes with it, to be checked
    except (PolyKVError, ValueError) as exc:
        st.error(f"{refused}: {first_line(exc)}")
        return
    if flash_key is not None:
        runs = len(job.runs)
        flash(flash_key, f"Started {job.id}" + (f" ({runs} run{'s' * (runs > 1)})." if runs else f": {job.title}."))
    st.rerun()


def show_estimate(work: Callable[[], Any], key: str) -> None:
    """Beside a launch button: what the work `work()` counts (`polykv.costs.Work`) would take here, before it
    starts; until the model's speed on this device is measured, a button that measures it (seconds, once).
    Nothing when the launch cannot be described: launching says why."""
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
        return
    try:
        found = costs.estimate(work(), costs.stored_rates(name, device))
    except (PolyKVError, ValueError, OSError):
        return  # launching says what is wrong
    st.caption(found.line().replace("estimate:", "Estimated here:", 1))


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


def label_text(label: dict[str, Any]) -> str:
    """A job run's label as the Runs page prints it: "series route, budget 64" (fields without a value left out)."""
    return ", ".join(f"{key} {value}" for key, value in label.items() if value is not None)


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


def clicked_task(chart, tasks: list[str]) -> str | None:
    """The task of the bar a plotly chart's selection points at (its x), if it is one of `tasks`."""
    selection = getattr(chart, "selection", None) or (chart.get("selection") if isinstance(chart, dict) else None)
    points = (selection or {}).get("points") or []
    for point in points:
        if point.get("x") in tasks:
            return point["x"]
    return None


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$])")


def literal(text: str) -> str:
    """Text that a markdown cell shows as it is (st.table renders markdown: "8094927." would start a list)."""
    return _MARKDOWN.sub(r"\\\1", text)


def samples_frame(rows: list[dict]):
    """A task's samples side by side as the page shows them: gold, A, B (with their metrics) and FullKV, each
    answer on one line (control characters escaped) and shown literally."""
    import pandas as pd

    from polykv.eval.sample_view import metrics_text, one_line

    with_full = any(row["FullKV"] is not None for row in rows)
    return pd.DataFrame(
        [
            {
                "sample": row["sample"],
                "gold": literal(one_line(row["gold"], 200)),
                "A": literal(one_line(row["A"], 400)),
                "A metrics": metrics_text(row["A metrics"]),
                "B": literal(one_line(row["B"], 400)),
                "B metrics": metrics_text(row["B metrics"]),
                **({"FullKV": literal(one_line(row["FullKV"], 400))} if with_full else {}),
            }
            for row in rows
        ]
    )


def show(fig, name: str, **kwargs):
    """A plotly figure whose camera button downloads it as PNG or SVG (the sidebar's choice)."""
    fmt = st.session_state.get(state.FIGURE_FORMAT, "png")
    return st.plotly_chart(fig, config=charts.download_config(fmt, name), theme=None, **kwargs)


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

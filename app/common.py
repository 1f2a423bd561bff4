"""What the pages decide alike: the profiles of a model, which runs to show and how they are labelled, a chart's
clicked task, text shown literally, and figure display. UI glue only; the work is done by `polykv`. The session
and its model are `app.session`, the plan being designed `app.plan_draft`, the designer's edits
`app.designer_controls`, the launch forms' jobs `app.job_forms`, starting and controlling jobs
`app.job_controls`; session-state keys come from `app.state`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import streamlit as st

from app import charts, state
from app.session import current_model, num_layers, workspace
from polykv.eval.results.rows import RunRow

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


def finished_run_rows(store) -> list[dict[str, Any]]:
    """The finished runs in `store`, newest first (what the Compare page offers)."""
    return [r for r in reversed(store.runs()) if r.status == "finished"]


def label_text(label: dict[str, Any]) -> str:
    """A job run's label as the Runs page prints it: "series route, budget 64" (fields without a value left out)."""
    return ", ".join(f"{key} {value}" for key, value in label.items() if value is not None)


def run_label(run: RunRow) -> str:
    """A run as the Compare page lists it."""
    return f"{run.plan_name} · {run.suite} · {run.model} · {run.id[:8]}"


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
    """A task's samples side by side as the page shows them: gold, A, B (with their metrics) and FullKV (its answer,
    its metrics), each answer on one line (control characters escaped) and shown literally."""
    import pandas as pd

    from polykv.eval.comparing.answers import metrics_text, one_line

    with_full = any(row["FullKV"] is not None for row in rows)
    full_metrics = any(row.get("FullKV metrics") for row in rows)  # score mode: FullKV's answer_nll, say
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
                **({"FullKV metrics": metrics_text(row.get("FullKV metrics") or {})} if full_metrics else {}),
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
    inputs built, the inputs' length, that input's index, the seconds the measurement took)."""
    import time

    from polykv.profile.heterogeneity import measure_heterogeneity

    started = time.perf_counter()
    model = current_model()[2]
    sequences = _inputs(model_key, inputs, max_tokens, sources)
    result = measure_heterogeneity(model, sequences, coverage=coverage)
    index = min(density_input, len(sequences) - 1)
    if index:  # the map of another input than the first: measure that one alone
        density = measure_heterogeneity(model, [sequences[index]], coverage=coverage, bootstrap=1).density
    else:
        density = result.density
    return result.to_frame("layers"), density, len(sequences[0]), index, time.perf_counter() - started

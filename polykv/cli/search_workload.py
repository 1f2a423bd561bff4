"""`polykv search --objective answer_nll --sources ruler:...`: a plan searched on a workload's calibration
samples, judged on its held-out samples against the envelope (`polykv.search.workload.run`).

Everything given is checked before the weights load, and the suite's first sample of every task is built
and checked against the model before any profile or search; the command says what it will compute first.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import typer

from polykv.cli.common import _load_model, _profile_arg, _table, announce_cost
from polykv.cli.progress import Progress
from polykv.errors import SettingsError
from polykv.eval.running.settings import COMPETENCE_THRESHOLD
from polykv.plan import Scope
from polykv.question_protocol import QuestionProtocol
from polykv.workspace import results_path


def _workload(sources: str | None, transfer: str | None, max_tokens: int, question=QuestionProtocol.IN_PROMPT):
    """(workload, transfer task names), refused in one line before any weights load."""
    from polykv.eval.workloads.workload import parse_source, parse_workload
    from polykv.eval.workloads.workload import split_sources as _split

    if not _split(sources):
        raise SettingsError("--objective answer_nll needs --sources: the workload, e.g. ruler:niah_single_2@2048")
    try:
        workload = parse_workload(_split(sources), max_tokens, question=question)
        others = [parse_source(s) for s in _split(transfer)]
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    length = getattr(workload.settings, "length", None)
    for source, parsed in zip(_split(transfer), others):
        if parsed.suite != workload.suite or (parsed.length not in (None, length)):
            raise SettingsError(f"--transfer {source}: transfer tasks share the workload's suite and length")
    return workload, tuple(p.task for p in others)


def search_workload(
    out: Path,
    budget: list[int],
    model: str,
    scope: Scope,
    profile: str,
    evaluations: int,
    seed: int,
    search_sequences: int,
    held_out: int,
    max_tokens: int,
    candidates: int,
    sources: str | None,
    transfer: str | None,
    text_profile: str | None,
    statistic: str,
    b_cal: int | None,
    workers: int,
    report: Path | None,
    device: str,
    workspace: Path,
    accuracy_samples: int | None = None,
    question: QuestionProtocol = QuestionProtocol.IN_PROMPT,
    competence: float = COMPETENCE_THRESHOLD,
    dry_run: bool = False,
) -> None:
    import dataclasses

    from polykv.eval.launch.work import sample_shapes, workload_search_work
    from polykv.eval.running.fit import check_fits
    from polykv.models import config_dimensions, num_layers
    from polykv.search.hooks import SearchHooks
    from polykv.search.workload.run import WorkloadSearchSettings, run_workload_search
    from polykv.search.workload.samples import verdict_settings
    from polykv.search.workload.verdict_text import VERDICT_HEADER, verdict_rows

    workload, transfer_tasks = _workload(sources, transfer, max_tokens, question)
    dims = config_dimensions(model)
    too_big = [b for b in budget if dims.context_length and b >= dims.context_length]
    if too_big:
        raise SettingsError(f"--budget {too_big[0]} is not below the model's context ({dims.context_length} tokens)")
    if len(set(budget)) < len(budget):
        raise SettingsError(f"--budget lists a budget twice ({', '.join(map(str, budget))})")
    if out.exists() and not out.is_dir():
        raise SettingsError(f"--out {out} exists and is not a folder")
    text = None if text_profile is None else _profile_arg(text_profile, workspace, model)
    if text is not None and not set(p.value for p in scope.phases) <= set(text.meta.scopes):
        raise SettingsError(f"--text-profile {text_profile} does not measure the {scope.value} scope")
    loaded = profile if profile == "auto" else _profile_arg(profile, workspace, model)
    if profile != "auto" and not loaded.is_workload:
        raise SettingsError(f"--profile {profile}: a workload search needs a workload profile (it has no danswer)")

    started = time.perf_counter()
    hf_model, tokenizer = _load_model(model, device)
    loaded_in = time.perf_counter() - started
    tasks = len(workload.tasks) + len(transfer_tasks)
    with Progress() as bars:
        held: list = []
        for suite_settings in verdict_settings(workload, held_out, transfer_tasks, accuracy_samples).values():
            check_fits(workload.suite, suite_settings, hf_model, tokenizer, seed=seed)
            held += sample_shapes(workload.suite, suite_settings, hf_model, tokenizer, seed)
        layers = num_layers(hf_model)
        searched = [dataclasses.replace(s, count=search_sequences) for s in held if s.task in workload.tasks]
        work = workload_search_work(searched or held, held, evaluations, len(budget), layers, profile == "auto")
        announce_cost(work.loaded(0), model, device, hf_model, dry_run)
        bars.note(
            f"workload search on {', '.join(workload.tasks)} ({workload.suite}"
            f"{f' at {workload.settings.length} tokens' if workload.suite == 'ruler' else ''}), "
            f"{search_sequences} search samples per task (calibration split), {held_out} held-out per task"
            f"{f' on {tasks} tasks with the transfer tasks' if transfer_tasks else ''}. It computes, in order: "
            + (
                "the workload profile (" + scope.value + f" scope, {layers} layers x every method, one pass per "
                "search sample); "
                if profile == "auto"
                else ""
            )
            + f"per budget ({', '.join(map(str, budget))}): the homogeneous plans and the nine baselines on the "
            f"search samples, the search (at most {evaluations} plan executions of one sample each), then the "
            "verdict: every contender and FullKV scoring every held-out sample"
            + (f" and generating on {accuracy_samples} per task" if accuracy_samples else " and generating")
            + ". Progress bars give the measured rate of each step."
        )

        def say(message: str) -> None:
            bars.note(message)
            if message.startswith("budget") and "search" in message:
                bars.start(message.split(":")[0] + " search", unit="execution")
            elif "verdict" in message and "runs together" not in message:
                bars.start(message.split(":")[0] + " verdict")

        args = sys.argv[1:]
        command = "polykv " + " ".join(shlex.quote(a) for a in args) if "search" in args else ""
        settings = WorkloadSearchSettings(
            scope=scope,
            budgets=tuple(budget),
            evaluations=evaluations,
            candidates=candidates,
            seed=seed,
            search_per_task=search_sequences,
            held_out=held_out,
            transfer=transfer_tasks,
            accuracy=accuracy_samples,
            b_cal=b_cal,
            text_statistic=statistic,
            workers=workers,
            competence=competence,
        )
        found, plans = run_workload_search(
            hf_model,
            tokenizer,
            model,
            workload,
            loaded,
            settings,
            text_profile=text,
            profiles=workspace / "profiles",
            out=out,
            markdown_file=report,
            command=command,
            load_seconds=loaded_in,
            time_one=True,
            hooks=SearchHooks(
                stage=lambda stage: bars.start("workload profile") if stage == "profile" else None,
                profile=bars.fraction,
                say=say,
                step=bars.sample,
                sample=bars.sample,
            ),
        )
    for entry in found.budgets:
        typer.echo(f"\nbudget {entry.budget}:")
        _table(VERDICT_HEADER, verdict_rows(entry))
    markdown_path = report or out / "report.md"
    typer.echo(f"\nwrote {markdown_path}, {out / 'report.json'}, {results_path(out)} and {len(plans)} plan(s)")

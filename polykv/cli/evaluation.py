"""Evaluation commands: `eval` (a plan on a suite, into the results database), `runs` and `compare`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polykv.cli.common import (
    DEFAULT_WORKSPACE,
    DryRunOption,
    ModelOption,
    SamplesOption,
    SuiteOption,
    TasksOption,
    WorkspaceOption,
    _checked_plan,
    _load_model,
    _suite_settings,
    _table,
    announce_cost,
    default_plan,
)
from polykv.cli.progress import Progress
from polykv.text import printable
from polykv.workspace import results_path


def evaluate(
    plan: Annotated[
        Path | None,
        typer.Option("--plan", help="Plan file (JSON). Default: an embedded model's plans/<model>/mixed.json."),
    ] = None,
    suite: SuiteOption = "fidelity",
    model: ModelOption = "demo",
    samples: SamplesOption = 4,
    tasks: TasksOption = None,
    prompt_tokens: Annotated[int, typer.Option(min=8, help="Prompt length (clipped to the context).")] = 1024,
    settings_json: Annotated[
        str | None, typer.Option("--settings", help="The suite's settings as JSON (overrides the options above).")
    ] = None,
    seed: int = 0,
    device: str = "cpu",
    workspace: WorkspaceOption = DEFAULT_WORKSPACE,
    backend: Annotated[str, typer.Option(help="local, subprocess (detached, returns at once) or ray.")] = "local",
    dry_run: DryRunOption = False,
) -> None:
    """Evaluate a plan on a suite; results go to <workspace>/results.sqlite as they finish (resumable)."""
    import polykv.jobs  # noqa: F401  registers the "subprocess" backend (jobs sit above eval)
    from polykv.eval.results.store import Store
    from polykv.eval.running.backends import backend as backend_named
    from polykv.eval.running.fit import check_fits
    from polykv.eval.running.unit import Unit

    models: dict[tuple[str, str], tuple] = {}

    def load(name: str, on: str):  # once: the fit check's model is the one the local backend runs
        if (name, on) not in models:
            models[(name, on)] = _load_model(name, on)
        return models[(name, on)]

    bars = Progress()  # the local backend reports every sample here; the others report in the store
    runs_on = backend_named(backend, load=load, progress=bars.sample)  # an unknown name fails first
    # bad input fails before anything is written; the settings first: checking them loads nothing, where the plan's
    # check against the model's memory on the device loads transformers (seconds)
    settings = _suite_settings(suite, samples, tasks, prompt_tokens, settings_json, model)
    loaded = _checked_plan(plan or default_plan(model), model, device)
    check_fits(suite, settings, *load(model, device), [loaded], seed)  # what cannot run is not started
    from polykv.eval.launch.work import eval_work

    announce_cost(
        eval_work(suite, settings, *load(model, device), [loaded], seed).loaded(0),
        model,
        device,
        load(model, device)[0],
        dry_run,
    )
    store = Store(results_path(workspace))
    unit = Unit.of(model, loaded, suite, settings, seed, device)
    if runs_on.detached:  # this command returns at once; `polykv runs` shows progress
        process = runs_on.start(unit, workspace)
        typer.echo(f"started in the background (pid {process.pid}); follow it with `polykv runs -w {workspace}`")
        return
    bars.start(f"{loaded.name} on {suite}")
    with bars:
        (run_id,) = runs_on.run([unit], store.path)
    typer.echo(f"run {run_id}: {loaded.name} on {suite} ({model}), {store.run(run_id).status}")
    scores = store.task_scores(run_id)
    metrics = sorted({m for values in scores.values() for m in values})
    _table(
        ("task", *metrics), [(task, *(f"{values[m]:.4f}" for m in metrics)) for task, values in sorted(scores.items())]
    )


def runs(ctx: typer.Context, workspace: WorkspaceOption = DEFAULT_WORKSPACE) -> None:
    """List the runs in the workspace's results database with their progress (`runs show RUN`: its samples)."""
    from polykv.eval.results.store import Store

    if ctx.invoked_subcommand is not None:
        return
    from polykv.eval.comparing.answers import suite_text

    store = Store(results_path(workspace), readonly=True)
    rows = [
        (
            r.id,
            r.plan_name,
            suite_text(r),
            r.model,
            r.status,
            f"{r.done_samples}/{r.total_samples}",
            r.created[:19],
        )
        for r in store.runs()
    ]
    _table(("run", "plan", "suite", "model", "status", "samples", "created"), rows)


def runs_show(
    run: Annotated[str, typer.Argument(help="Run id (or a unique prefix).")],
    task: Annotated[str | None, typer.Option(help="Only this task's samples.")] = None,
    failed: Annotated[
        bool, typer.Option("--failed", help="Only the samples it got wrong (score under 100; else agreement 0).")
    ] = False,
    width: Annotated[int, typer.Option(min=10, help="Characters shown of each answer.")] = 60,
    workspace: WorkspaceOption = DEFAULT_WORKSPACE,
) -> None:
    """A run's samples: task, sample, metrics, the gold answer(s) and what the model answered."""
    from polykv.eval.comparing import answers as sample_view
    from polykv.eval.results.store import Store

    store = Store(results_path(workspace), readonly=True)
    run_id = sample_view.resolve_run(store, run, str(workspace))
    rows = sample_view.samples(store, run_id, task, failed)
    info = store.run(run_id)
    typer.echo(
        f"run {run_id} ({sample_view.one_line(info.plan_name, 60)} on {sample_view.suite_text(info)}, "
        f"{sample_view.one_line(info.model, 60)}): {len(rows)} samples shown"
    )
    kept = sample_view.kv_kept_line(info)
    if kept is not None:
        typer.echo(kept)
    for line in sample_view.measured_lines(store, info):
        typer.echo(line)
    full = sample_view.fullkv_predictions(store, info)
    _table(
        ("task", "sample", "metrics", "gold", "answer", *(["fullkv"] if full else [])),
        [
            (
                row.task,
                row.sample,
                sample_view.metrics_text(row.metrics),
                sample_view.one_line(row.gold, width // 2),
                sample_view.one_line(row.prediction, width),
                *([sample_view.one_line(sample_view.fullkv_answer(full, row), width)] if full else []),
            )
            for row in rows
        ],
    )
    if full:
        typer.echo(
            f"fullkv: run {sample_view.fullkv_twin(store, info)}'s answer to the same prompt; {sample_view.AGREEMENT}"
        )


def compare(
    run_a: Annotated[str, typer.Argument(help="Run id (or a unique prefix).")],
    run_b: Annotated[str, typer.Argument(help="Run id (or a unique prefix).")],
    metric: Annotated[
        str,
        typer.Option(
            help="Task metric to compare (fidelity: top1, rougeL, kl, ppl; ruler and longbench: score, agreement, "
            "answer_nll)."
        ),
    ] = "top1",
    workspace: WorkspaceOption = DEFAULT_WORKSPACE,
    seed: int = 0,
    samples: Annotated[
        bool, typer.Option("--samples", help="Also show, per task, the samples where the two runs' answers differ.")
    ] = False,
    width: Annotated[int, typer.Option(min=10, help="--samples: characters shown of each answer.")] = 40,
) -> None:
    """Paired comparison of two runs: over tasks (bootstrap CI, wins/ties/losses, leave-one-task-out) and over
    samples (sign-flip test, minimal detectable difference); `--samples` lists where their answers differ."""
    from polykv.eval.comparing import answers as sample_view
    from polykv.eval.comparing.compare import compare_runs
    from polykv.eval.results.store import Store

    store = Store(results_path(workspace), readonly=True)
    a_id = sample_view.resolve_run(store, run_a, str(workspace))
    b_id = sample_view.resolve_run(store, run_b, str(workspace))
    result = compare_runs(store, a_id, b_id, metric, seed)
    name = {r.id: printable(r.plan_name) for r in store.runs()}
    typer.echo(
        f"A = {a_id} ({name[a_id]}), B = {b_id} ({name[b_id]}); metric {metric} "
        f"({'higher' if result.sign > 0 else 'lower'} is better)"
    )
    for caveat in (sample_view.other_models, sample_view.like_with_like):
        line = caveat(store.run(a_id), store.run(b_id))
        if line is not None:
            typer.echo(line)
    for line in sample_view.kv_contrast_lines(store, store.run(a_id), store.run(b_id)):
        typer.echo(line)
    _table(
        ("task", "A", "B", "A - B"),
        [(task, f"{a:.4f}", f"{b:.4f}", f"{d:+.4f}") for task, a, b, d in result.table.itertuples(index=False)],
    )
    for line in result.lines():
        typer.echo(printable(line))
    if samples:
        _differing_samples(store, a_id, b_id, width)


def _differing_samples(store, a_id: str, b_id: str, width: int) -> None:
    from polykv.eval.comparing import answers as sample_view

    for task, rows in sample_view.differing(store, a_id, b_id).items():
        typer.echo(f"\n{task}: {len(rows)} samples differ")
        if not rows:
            continue
        with_full = any(row["FullKV"] is not None for row in rows)
        header = ("sample", "gold", "A", "B") + (("FullKV",) if with_full else ())
        _table(
            header,
            [
                (
                    row["sample"],
                    sample_view.one_line(row["gold"], width),
                    sample_view.one_line(row["A"], width) + f" [{sample_view.metrics_text(row['A metrics'])}]",
                    sample_view.one_line(row["B"], width) + f" [{sample_view.metrics_text(row['B metrics'])}]",
                )
                + ((sample_view.one_line(row["FullKV"], width),) if with_full else ())
                for row in rows
            ],
        )

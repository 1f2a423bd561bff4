"""Evaluation commands: `eval` (a plan on a suite, into the results database), `runs` and `compare`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polykv.cli.common import (
    DEFAULT_PLAN,
    DEFAULT_WORKSPACE,
    ModelOption,
    SamplesOption,
    SuiteOption,
    TasksOption,
    WorkspaceOption,
    _checked_plan,
    _load_model,
    _suite_settings,
    _table,
)
from polykv.cli.progress import Progress
from polykv.text import printable


def evaluate(
    plan: Annotated[Path, typer.Option("--plan", help="Plan file (JSON).")] = DEFAULT_PLAN,
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
) -> None:
    """Evaluate a plan on a suite; results go to <workspace>/results.sqlite as they finish (resumable)."""
    import polykv.jobs  # noqa: F401  registers the "subprocess" backend (jobs sit above eval)
    from polykv.eval.backends import backend as backend_named
    from polykv.eval.store import Store
    from polykv.eval.unit import Unit

    bars = Progress()  # the local backend reports every sample here; the others report in the store
    runs_on = backend_named(backend, load=_load_model, progress=bars.sample)  # an unknown name fails first
    loaded = _checked_plan(plan, model, device)  # bad input fails before anything is written
    settings = _suite_settings(suite, samples, tasks, prompt_tokens, settings_json, model)
    store = Store(workspace / "results.sqlite")
    unit = Unit.of(model, loaded, suite, settings, seed, device)
    if runs_on.detached:  # this command returns at once; `polykv runs` shows progress
        process = runs_on.start(unit, workspace)
        typer.echo(f"started in the background (pid {process.pid}); follow it with `polykv runs -w {workspace}`")
        return
    bars.start(f"{loaded.name} on {suite}")
    with bars:
        (run_id,) = runs_on.run([unit], store.path)
    typer.echo(f"run {run_id}: {loaded.name} on {suite} ({model}), {store.run(run_id)['status']}")
    scores = store.task_scores(run_id)
    metrics = sorted({m for values in scores.values() for m in values})
    _table(
        ("task", *metrics), [(task, *(f"{values[m]:.4f}" for m in metrics)) for task, values in sorted(scores.items())]
    )


def runs(workspace: WorkspaceOption = DEFAULT_WORKSPACE) -> None:
    """List the runs in the workspace's results database with their progress."""
    from polykv.eval.store import Store

    store = Store(workspace / "results.sqlite", readonly=True)
    rows = [
        (
            r["id"],
            r["plan_name"],
            r["suite"],
            r["model"],
            r["status"],
            f"{r['done_samples']}/{r['total_samples']}",
            r["created"][:19],
        )
        for r in store.runs()
    ]
    _table(("run", "plan", "suite", "model", "status", "samples", "created"), rows)


def compare(
    run_a: Annotated[str, typer.Argument(help="Run id (or a unique prefix).")],
    run_b: Annotated[str, typer.Argument(help="Run id (or a unique prefix).")],
    metric: Annotated[str, typer.Option(help="Task metric to compare (fidelity: top1, rougeL, kl, ppl).")] = "top1",
    workspace: WorkspaceOption = DEFAULT_WORKSPACE,
    seed: int = 0,
) -> None:
    """Paired comparison of two runs over their tasks: bootstrap CI, wins/ties/losses, leave-one-task-out."""
    from polykv.eval.compare import compare_runs
    from polykv.eval.store import Store

    store = Store(workspace / "results.sqlite", readonly=True)
    ids = [r["id"] for r in store.runs()]

    def resolve(prefix: str) -> str:
        found = [i for i in ids if i.startswith(prefix)]
        if len(found) != 1:
            raise ValueError(f"run {prefix!r}: {'no run' if not found else 'several runs'} with that id in {workspace}")
        return found[0]

    a_id, b_id = resolve(run_a), resolve(run_b)
    result = compare_runs(store, a_id, b_id, metric, seed)
    name = {r["id"]: printable(r["plan_name"]) for r in store.runs()}
    typer.echo(
        f"A = {a_id} ({name[a_id]}), B = {b_id} ({name[b_id]}); metric {metric} "
        f"({'higher' if result.sign > 0 else 'lower'} is better)"
    )
    _table(
        ("task", "A", "B", "A - B"),
        [(task, f"{a:.4f}", f"{b:.4f}", f"{d:+.4f}") for task, a, b, d in result.table.itertuples(index=False)],
    )
    for line in result.lines():
        typer.echo(printable(line))

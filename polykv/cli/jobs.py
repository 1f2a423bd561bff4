"""Job commands: `jobs list`, `jobs cancel` and `jobs resume` (the background jobs the web app starts)."""

from __future__ import annotations

from typing import Annotated

import typer

from polykv.cli.common import DEFAULT_WORKSPACE, WorkspaceOption, _table
from polykv.text import duration, printable


def jobs_list(workspace: WorkspaceOption = DEFAULT_WORKSPACE) -> None:
    """Every job in the workspace, newest first, with its status and progress."""
    from polykv import jobs

    found, damaged = jobs.scan_jobs(workspace)
    rows = []
    for job in found:
        state = jobs.state(job, workspace)
        cost = state.cost_line() or (f"estimated {duration(job.estimate_s)}" if job.estimate_s is not None else "-")
        rows.append((job.id, job.kind, job.title, state.status, f"{state.fraction:.0%}", job.created[:19], cost))
    _table(("job", "kind", "title", "status", "done", "created", "time"), rows)
    for bad in damaged:  # one line each; the valid jobs above are listed all the same
        typer.echo(printable(f"damaged: {bad.path}: {bad.reason}"))


def jobs_cancel(
    job_id: Annotated[str, typer.Argument(help="Job id.")], workspace: WorkspaceOption = DEFAULT_WORKSPACE
) -> None:
    """Stop a running job (finished samples stay in the results database)."""
    from polykv import jobs

    job = jobs.load_job(workspace, job_id)
    signalled = jobs.cancel(job, workspace)  # signals only the job's own worker, and waits until it has exited
    note = "" if signalled else " (no running worker of this job: nothing was signalled)"
    typer.echo(f"{job_id}: {jobs.state(jobs.load_job(workspace, job_id), workspace).status}{note}")


def jobs_resume(
    job_id: Annotated[str, typer.Argument(help="Job id.")], workspace: WorkspaceOption = DEFAULT_WORKSPACE
) -> None:
    """Start a stopped, cancelled or failed job again; finished samples are not recomputed."""
    from polykv import jobs
    from polykv.errors import JobError

    job = jobs.load_job(workspace, job_id)
    if jobs.state(job, workspace).status == "finished":
        raise JobError(f"job {job_id} is finished: nothing to resume")
    process = jobs.start(job, workspace)  # JobError "still running ... cancel it first" while its worker runs
    typer.echo(f"{job_id}: started again in the background (pid {process.pid})")

"""The `polykv` command line. Every command is a thin call into the library.

User errors (a bad plan, a missing file, an unknown model) print one line and exit with code 2;
set POLYKV_DEBUG=1 to see the traceback instead.

This package holds the typer app, its sub-apps and `main()`; the commands live by topic in `plans`,
`profiles`, `evaluation`, `experiments` and `jobs` (plain functions, registered here), their shared
helpers and option types in `common`.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from polykv.cli import evaluation, experiments, jobs, plans, profiles, progress, search

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Per-layer KV-cache eviction plans.",
)
plan_app = typer.Typer(no_args_is_help=True, help="Inspect, check and build plan files.")
experiment_app = typer.Typer(no_args_is_help=True, help="Controlled experiments: factorial, placement, sweep.")
jobs_app = typer.Typer(no_args_is_help=True, help="Background jobs (what the web app starts): list, cancel, resume.")
runs_app = typer.Typer(
    invoke_without_command=True, help="Runs in the results database: list them, or `show` one's samples."
)

COMMANDS = (  # (app, name, function), in the order `--help` lists them
    (app, "methods", plans.methods),
    (app, "generate", plans.generate),
    (app, "profile", profiles.profile),
    (app, "heterogeneity", profiles.heterogeneity),
    (app, "route", profiles.route),
    (app, "eval", evaluation.evaluate),
    (app, "compare", evaluation.compare),
    (app, "search", search.search),
    (app, "import-llama2c", plans.import_llama2c_command),
    (plan_app, "show", plans.plan_show),
    (plan_app, "validate", plans.plan_validate),
    (plan_app, "homogeneous", plans.plan_homogeneous),
    (runs_app, "show", evaluation.runs_show),
    (experiment_app, "factorial", experiments.experiment_factorial),
    (experiment_app, "placement", experiments.experiment_placement),
    (experiment_app, "sweep", experiments.experiment_sweep),
    (experiment_app, "study", experiments.experiment_study),
    (jobs_app, "list", jobs.jobs_list),
    (jobs_app, "cancel", jobs.jobs_cancel),
    (jobs_app, "resume", jobs.jobs_resume),
)
for group, name, command in COMMANDS:
    group.command(name)(command)


@app.callback()
def _global_options(
    no_progress: Annotated[
        bool, typer.Option("--no-progress", help="No progress bars (they are drawn only when stderr is a terminal).")
    ] = False,
) -> None:
    progress.ENABLED = not no_progress  # set on every invocation, so an in-process caller never inherits it


runs_app.callback()(evaluation.runs)
app.add_typer(runs_app, name="runs")
app.add_typer(plan_app, name="plan")
app.add_typer(experiment_app, name="experiment")
app.add_typer(jobs_app, name="jobs")


def main() -> None:
    """Run the CLI: a user error prints `error: <one line>` and exits 2; a bug prints one line too and
    exits 1, with the traceback only under POLYKV_DEBUG=1."""
    import sqlite3

    from polykv.errors import PolyKVError, debug, first_line

    try:
        app()  # typer handles --help, usage errors (exit 2) and exits itself
    except (PolyKVError, OSError, sqlite3.Error, ValueError) as exc:
        if debug():
            raise
        typer.echo(f"error: {first_line(exc)}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        if debug():
            raise
        typer.echo(
            f"internal error (a bug in PolyKV): {exc.__class__.__name__}: {first_line(exc)}; "
            "run again with POLYKV_DEBUG=1 for the traceback",
            err=True,
        )
        sys.exit(1)

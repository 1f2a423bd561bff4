"""The `polykv` command line. Every command is a thin call into the library.

User errors (a bad plan, a missing file, an unknown model) print one line and exit with code 2;
set POLYKV_DEBUG=1 to see the traceback instead.

This package holds the typer app, its sub-apps and `main()`; the commands live by topic in `plans`,
`profiles`, `evaluation`, `experiments` (the paper's study in `study`) and `jobs` (plain functions, registered
here), their shared helpers and option types in `common`.
"""

from __future__ import annotations

import sys
import warnings
from typing import Annotated

import typer

from polykv.cli import evaluation, experiments, jobs, plans, profiles, progress, search, study

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
    (plan_app, "export", plans.plan_export),
    (runs_app, "show", evaluation.runs_show),
    (experiment_app, "factorial", experiments.experiment_factorial),
    (experiment_app, "placement", experiments.experiment_placement),
    (experiment_app, "sweep", experiments.experiment_sweep),
    (experiment_app, "leaderboard", experiments.experiment_leaderboard),
    (experiment_app, "allocation", experiments.experiment_allocation),
    (experiment_app, "study", study.experiment_study),
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


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line, `warning: ...`, not Python's two (the source file and the line of code)."""
    from polykv.errors import first_line

    print(f"warning: {first_line(message) if isinstance(message, BaseException) else str(message)}", file=sys.stderr)


def main() -> None:
    """Run the CLI: a user error prints `error: <one line>` and exits 2; a bug prints one line too and
    exits 1, with the traceback only under POLYKV_DEBUG=1."""
    import sqlite3

    try:  # typer 0.2x carries its own copy of click: its exceptions are the ones raised
        from typer._click import exceptions as click
    except ImportError:  # an older typer runs on click itself
        from click import exceptions as click

    from polykv.errors import PolyKVError, debug, first_line

    warnings.showwarning = _one_line_warning
    try:
        # --help prints and returns 0; a command's typer.Exit returns its code
        code = app(standalone_mode=False, prog_name="polykv")
    except click.NoArgsIsHelpError as exc:
        exc.show()  # a group called bare: its help
        sys.exit(exc.exit_code)
    except click.UsageError as exc:  # a bad option or value: one line, not typer's box
        where = f" (`{exc.ctx.command_path} --help` lists the options)" if exc.ctx is not None else ""
        typer.echo(f"error: {first_line(exc.format_message())}{where}", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        typer.echo(f"error: {first_line(exc.format_message())}", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("interrupted", err=True)
        sys.exit(130)
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
    sys.exit(code if isinstance(code, int) else 0)

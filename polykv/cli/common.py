"""What the command modules share: paths and defaults, option types, and the helpers that check input
before any weights load, load a model, resolve the workspace and print tables.

Nothing here imports torch or transformers at module level: the commands that touch no tensor stay fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from polykv import limits
from polykv.errors import FileError
from polykv.files import parse_json
from polykv.plan import Plan
from polykv.text import printable

REPO_ROOT = Path(__file__).resolve().parents[2]
PLANS_DIR = REPO_ROOT / "plans"
DEFAULT_PLAN = PLANS_DIR / "demo" / "mixed.json"


def default_plan(model: str) -> Path:
    """The plan a command runs when given none: an embedded model's mixed plan (plans/<model>/mixed.json), else
    the demo's (which a model of another depth refuses in one line)."""
    own = PLANS_DIR / model / "mixed.json"
    return own if model.isidentifier() and own.is_file() else DEFAULT_PLAN


BUDGET_HELP = "Budget b: the plan's average capacity per layer (tokens per KV head)."


def _workspace(value: Path | None) -> Path:
    from polykv.workspace import default_workspace

    return value if value is not None else default_workspace()


ModelOption = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="'demo', 'smollm2', 'gemma3', a local model directory or .gguf file, or a Hugging Face id.",
    ),
]
WorkspaceOption = Annotated[
    Path | None,
    typer.Option(
        "--workspace",
        "-w",
        callback=_workspace,
        show_default=False,
        help="Where profiles, runs and jobs are kept (default: $POLYKV_WORKSPACE, else .polykv/ in the repository).",
    ),
]
DEFAULT_WORKSPACE = None  # resolved by `_workspace` when the command runs
SuiteOption = Annotated[str, typer.Option(help="Evaluation suite.")]
SamplesOption = Annotated[int, typer.Option(min=1, max=limits.SAMPLES_PER_TASK, help="Samples per task.")]
TasksOption = Annotated[
    str | None, typer.Option(help="Comma-separated fidelity tasks (default: the model's default tasks).")
]
MetricOption = Annotated[
    str,
    typer.Option(
        help="Task metric that scores a run (fidelity: top1, rougeL, kl, ppl; ruler and longbench: score, agreement "
        "and answer_nll, as their mode setting reports them)."
    ),
]
BackendOption = Annotated[str, typer.Option(help="local (in this process) or ray (a Ray task per run).")]
SettingsOption = Annotated[
    str | None,
    typer.Option("--settings", help="The suite's settings as JSON (ruler, longbench; overrides --samples/--tasks)."),
]


def _num_layers(model: str) -> int:
    """Layer count from the model's config alone (no weights loaded)."""
    from polykv.models import config_dimensions

    return config_dimensions(model).num_layers


def echo_budget_lines(plan: Plan, model: str) -> None:
    """On a hybrid model, what the plan's budget counts there (`polykv.kv_memory.budget_lines`)."""
    from polykv.kv_memory import budget_lines
    from polykv.models import config_dimensions

    windows = config_dimensions(model).windows
    for line in budget_lines(plan, windows) if windows else []:
        typer.echo(line)


def _checked_plan(path: Path, model: str, device: str | None = None) -> Plan:
    """A plan file checked against the model's config (layers, context; with `device`, the memory the
    model needs there) before any weights load."""
    from polykv.methods import validate_plan
    from polykv.models import config_dimensions

    dims = config_dimensions(model)
    plan = validate_plan(Plan.load(path), dims.num_layers, dims.context_length, within_context=True)
    if device is not None:  # after the plan: the memory check loads transformers (seconds)
        config_dimensions(model, device)
    return plan


def _profile_for(profile_dir: Path, model: str):
    """A profile, refused (one line) when it was measured on another model; checked before loading weights."""
    from polykv.profile.store import load_profile

    loaded = load_profile(profile_dir)
    loaded.check_model(model, _num_layers(model))
    return loaded


_LOAD_SECONDS: dict[tuple[str, str], float] = {}  # how long this process took to load each model (the rates')


def _load_model(model: str, device: str):
    """(model, tokenizer), saying on a terminal what is being loaded (it can take a while); quiet when
    stderr is not a terminal, so scripts see only results and one-line errors."""
    import time

    from polykv.models import check_device, load_model

    check_device(device)  # a device this machine lacks: one line, before anything loads
    if sys.stderr.isatty():
        typer.echo(f"loading model {model} on {device} ...", err=True)
    start = time.perf_counter()
    loaded = load_model(model, device=device)  # quiet: no progress bars
    _LOAD_SECONDS[(model, device)] = time.perf_counter() - start
    return loaded


DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Say what the command would run and its cost here, then stop.")
]


def announce_cost(work, model: str, device: str, hf_model, dry_run: bool = False):
    """The launch's estimated time and memory on this machine (`polykv.costs`), said before it starts: on a
    terminal's stderr, or on stdout with `dry_run`, which then stops the command (exit 0). The model's speed here is
    measured once (seconds) and kept in $POLYKV_HOME/rates.json, a dry run's included. An estimate that cannot be
    made says so in one line and stops nothing but a dry run."""
    from polykv import costs
    from polykv.errors import PolyKVError, first_line

    said = dry_run or sys.stderr.isatty()  # scripts see only results and one-line errors, as for the loading
    try:
        if costs.stored_rates(model, device) is None and said:
            typer.echo(f"measuring {model}'s speed on {device} (once; a few seconds) ...", err=True)
        rates = costs.rates_for(hf_model, model, device, _LOAD_SECONDS.get((model, device)))
        found = costs.estimate(work, rates)
    except (PolyKVError, OSError, ValueError, RuntimeError) as exc:
        if dry_run:
            raise
        if said:
            typer.echo(f"no estimate: {first_line(exc)}", err=True)
        return None
    if said:
        typer.echo(found.line(), err=not dry_run)
    if dry_run:
        raise typer.Exit(0)
    return found


def _suite_settings(
    suite: str,
    samples: int,
    tasks: str | None,
    prompt_tokens: int,
    settings_json: str | None,
    model: str | None = None,
    metric: str | None = None,
):
    """A suite's settings on the model (`polykv.eval.running.defaults.settings_on_model`): from --settings JSON,
    else, for the fidelity suite, its options (no --tasks: the model's default tasks), else the suite's defaults.
    A question suite scored by `metric` (an experiment's) runs in the mode that reports it when --settings names
    none (answer_nll: score, no generation)."""
    from polykv.eval.running.defaults import settings_on_model

    options = {}
    if settings_json is None and suite == "fidelity":  # --settings overrides --samples/--tasks/--prompt-tokens
        options = {"samples_per_task": samples, "prompt_tokens": prompt_tokens}
        if tasks:
            options["tasks"] = [t.strip() for t in tasks.split(",") if t.strip()]
    return settings_on_model(suite, model, settings_json, options=options, metric=metric)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Rows under a header, in aligned columns; every cell escaped (it may come from a database or a file)."""
    rows = [tuple(printable(str(cell)) for cell in row) for row in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def _parse_params(items: list[str]) -> dict:
    params = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--param {item!r}: expected NAME=VALUE, e.g. --param window=16")
        try:
            params[name] = parse_json(value)
        except FileError:
            params[name] = value  # a bare string such as pooling=avg
    return params


def _profile_arg(value: str, workspace: Path, model: str):
    """A profile key in <workspace>/profiles, else a directory; it must be this model's (checked before any
    weights load)."""
    from polykv.profile.store import profile_named

    profile = profile_named(value, workspace)
    profile.check_model(model, _num_layers(model))
    return profile

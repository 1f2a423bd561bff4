"""Experiment commands: `experiment factorial`, `placement`, `sweep` and `study`.

The ten options that factorial, placement and sweep share (the model, the suite and how it is scored,
where the runs go) are declared once, as the fields of `ExperimentOptions`; `@experiment_options` appends
them to a command's own parameters, so they are given after the subcommand name like its own options
(`polykv experiment sweep --plan P --budgets 16,32 --model demo`), and hands the command one
`ExperimentOptions`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import typing
from pathlib import Path
from typing import Annotated

import typer

from polykv import limits
from polykv.cli.common import (
    BUDGET_HELP,
    DEFAULT_WORKSPACE,
    BackendOption,
    DryRunOption,
    MetricOption,
    ModelOption,
    SamplesOption,
    SettingsOption,
    SuiteOption,
    TasksOption,
    WorkspaceOption,
    _load_model,
    _profile_for,
    _suite_settings,
    announce_cost,
)
from polykv.cli.progress import Progress
from polykv.plan import Plan, Scope


@dataclasses.dataclass(frozen=True)
class ExperimentOptions:
    """The options of every experiment that runs plans on a suite; each field is a command-line option
    (its annotation says how, its default is the option's)."""

    model: ModelOption = "demo"
    suite: SuiteOption = "fidelity"
    samples: SamplesOption = 4
    tasks: TasksOption = None
    prompt_tokens: int = 1024
    metric: MetricOption = "top1"
    seed: int = 0
    device: str = "cpu"
    workspace: WorkspaceOption = DEFAULT_WORKSPACE
    backend: BackendOption = "local"
    settings_json: SettingsOption = None
    batch: Annotated[
        bool,
        typer.Option(
            help="Local backend: run the plans together, sample by sample, as one batch (one prompt pass for all; "
            "equal to one at a time up to float rounding, several times faster)."
        ),
    ] = False
    dry_run: DryRunOption = False

    def runner(self, bars: Progress, name: str, plans: int):
        """An `ExperimentRunner` for these options, reporting its runs and samples to `bars`: the backend and
        the suite's settings are checked before the model loads, and the cost of the experiment `name` (its
        `plans` on the suite's samples) is said before it starts (`--dry-run`: then it stops)."""
        from polykv.eval.backends import backend as backend_named
        from polykv.eval.experiments import ExperimentRunner
        from polykv.eval.experiments.runner import check_metric
        from polykv.eval.store import Store

        backend_named(
            self.backend, waiting=True
        )  # an experiment reads its runs' scores: local or ray; checked before loading
        check_metric(self.suite, self.metric)
        settings = _suite_settings(
            self.suite, self.samples, self.tasks, self.prompt_tokens, self.settings_json, self.model, self.metric
        )
        hf_model, tokenizer = _load_model(self.model, self.device)
        from polykv.eval.fit import check_fits

        check_fits(self.suite, settings, hf_model, tokenizer, seed=self.seed)  # what cannot run is not started
        from polykv.eval.launch_work import experiment_work, sample_shapes, samples_work

        shapes = sample_shapes(self.suite, settings, hf_model, tokenizer, self.seed)
        work = experiment_work(shapes, name, plans, batched=self.batch).loaded(0)
        work = work + dataclasses.replace(samples_work(self.suite, settings, hf_model), kind="experiment", loads=0)
        announce_cost(work, self.model, self.device, hf_model, self.dry_run)
        return ExperimentRunner(
            Store(self.workspace / "results.sqlite"),
            self.model,
            hf_model,
            tokenizer,
            self.suite,
            settings,
            self.seed,
            self.metric,
            progress=bars.run,
            on_sample=bars.sample,  # the local backend's samples; ray runs report in the store only
            backend=self.backend,
            device=self.device,
            batched=self.batch,
        )


def experiment_options(command):
    """Give `command(options: ExperimentOptions, **own)` the options of `ExperimentOptions` after its own ones:
    typer sees one signature with both, and the command gets the shared ones as one `ExperimentOptions`."""
    hints = typing.get_type_hints(ExperimentOptions, include_extras=True)
    shared = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
        for f in dataclasses.fields(ExperimentOptions)
    ]
    first, *own = inspect.signature(command, eval_str=True).parameters.values()
    assert first.name == "options", f"{command.__name__}: the first parameter takes the ExperimentOptions"
    assert not {p.name for p in own} & {p.name for p in shared}, f"{command.__name__} redeclares a shared option"

    @functools.wraps(command)
    def with_options(**given):
        options = ExperimentOptions(**{p.name: given.pop(p.name) for p in shared})
        return command(options, **given)

    parameters = [*own, *shared]
    with_options.__signature__ = inspect.Signature(parameters, return_annotation=None)
    with_options.__annotations__ = {p.name: p.annotation for p in parameters}
    return with_options


def _print_report(report) -> None:
    import pandas as pd

    typer.echo(report.title)
    typer.echo(pd.DataFrame(report.rows).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    for line in report.lines:
        typer.echo(line)


def _samples(text: str) -> int:
    from polykv.text import whole_number

    value = whole_number(text)
    if value is None or value < 1:
        raise typer.BadParameter(f"a positive number or auto, got {text!r}", param_hint="--samples")
    return value


def _parse_budgets(budgets: str) -> list[int]:
    from polykv.eval.settings import parse_budgets

    levels = parse_budgets(budgets, "--budgets")
    if not levels:
        raise typer.BadParameter("give at least one budget, e.g. 64,128", param_hint="--budgets")
    return levels


@experiment_options
def experiment_factorial(
    options: ExperimentOptions,
    profile_dir: Annotated[Path, typer.Option("--profile", help="Profile directory.")],
    budget: Annotated[int, typer.Option(min=1, help=BUDGET_HELP)],
    baseline: Annotated[str, typer.Option(help="The homogeneous method.")],
    scope: Scope = Scope.DECODE,
    statistic: str = "cosine",
    allocation: Annotated[str, typer.Option(help="entropy or ppl.")] = "entropy",
) -> None:
    """Routing x allocation at the same budget: four runs, effects, paired bootstrap."""
    loaded = _profile_for(profile_dir, options.model)
    from polykv.eval.experiments import factorial  # torch and transformers: after the cheap checks

    with Progress() as bars:  # closed (the last bar finished) before the report prints
        report = factorial(options.runner(bars, "factorial", 4), loaded, scope, budget, baseline, statistic, allocation)
    _print_report(report)


@experiment_options
def experiment_placement(
    options: ExperimentOptions,
    profile_dir: Annotated[Path, typer.Option("--profile", help="Profile directory.")],
    plan: Annotated[Path, typer.Option("--plan", help="The guided single-phase plan (e.g. from `polykv route`).")],
    k: Annotated[int, typer.Option("--k", min=1, max=limits.PLACEMENTS, help="Random count-matched placements.")] = 99,
    statistic: str = "cosine",
) -> None:
    """The guided route vs K random placements with the same method counts: rank, p, Spearman."""
    loaded = _profile_for(profile_dir, options.model)
    guided = Plan.load(plan)
    from polykv.eval.experiments import placement  # torch and transformers: after the cheap checks

    with Progress() as bars:
        report = placement(options.runner(bars, "placement", k + 1), loaded, guided, k, statistic)
    _print_report(report)


@experiment_options
def experiment_sweep(
    options: ExperimentOptions,
    plan: Annotated[Path, typer.Option("--plan", help="The fixed route plan (any scope).")],
    budgets: Annotated[
        str, typer.Option(help="Comma-separated budgets (average capacities per layer), e.g. 128,256,512,1024.")
    ],
    baselines: Annotated[
        str | None,
        typer.Option(help="Comma-separated methods (default: every method, each under its own protocol)."),
    ] = None,
    profile_dir: Annotated[
        Path | None,
        typer.Option("--profile", help="Profile directory: adds the route with PPL-allocated capacities (route-ppl)."),
    ] = None,
    protocol: Annotated[
        list[str] | None,
        typer.Option("--protocol", help="Override a baseline's phases, METHOD=SCOPE, e.g. tova=decode (repeatable)."),
    ] = None,
) -> None:
    """A fixed route across budgets vs every standalone baseline under its protocol, FullKV, the envelope, 2b."""
    from polykv.eval.protocols import parse_overrides

    levels = _parse_budgets(budgets)
    overrides = parse_overrides(protocol)
    names = [b.strip() for b in baselines.split(",")] if baselines else None
    route = Plan.load(plan)
    loaded = _profile_for(profile_dir, options.model) if profile_dir is not None else None
    from polykv.eval.experiments import sweep, sweep_plans  # torch and transformers: after the cheap checks

    plans = sweep_plans(route, levels, names, loaded, overrides)  # bad input fails before the model loads
    with Progress() as bars:
        report = sweep(options.runner(bars, "sweep", len(plans)), route, levels, names, loaded, overrides)
    _print_report(report)


def experiment_study(
    out: Annotated[Path, typer.Option("--out", "-o", help="The Markdown report (figures go beside it).")] = Path(
        "docs/demo-study.md"
    ),
    workspace: Annotated[
        Path, typer.Option("--workspace", "-w", help="Profiles and results database of the study.")
    ] = Path("docs/demo-study"),
    model: ModelOption = "demo",
    scope: Annotated[str, typer.Option(help="The routed phase: prefill or decode.")] = "decode",
    budget: Annotated[
        int, typer.Option(min=1, help="Budget (average capacity per layer) of the route, factorial and placement.")
    ] = 64,
    budgets: Annotated[
        str, typer.Option(help="The sweep's budgets (average capacities per layer), comma-separated.")
    ] = "16,32,64,128,256",
    k: Annotated[int, typer.Option("--k", min=1, max=limits.PLACEMENTS, help="Random count-matched placements.")] = 99,
    statistic: str = "dppl",
    allocation: Annotated[str, typer.Option(help="The factorial's allocated arm: entropy or ppl.")] = "ppl",
    baseline: Annotated[
        str,
        typer.Option(
            help="The factorial's homogeneous anchor: paper (TOVA for a decode route, the route's majority method for "
            "a prefill route), strongest (the best method alone at the budget on calibration samples of the suite) or "
            "a method."
        ),
    ] = "paper",
    metric: MetricOption = "kl",
    samples: Annotated[
        str | None,
        typer.Option(
            help="Samples per task of the primary suite: a number, or auto (a ruler/longbench pilot picks them to "
            "reach --mde within --time-limit). Default: the suite settings' (fidelity: 3)."
        ),
    ] = None,
    mde: Annotated[
        float | None, typer.Option(help="--samples auto: the minimal detectable difference to reach (metric units).")
    ] = None,
    time_limit: Annotated[
        float | None, typer.Option(help="--samples auto: minutes the primary runs may take (measured per sample).")
    ] = None,
    min_samples: Annotated[
        int, typer.Option(min=2, max=limits.SAMPLES_PER_TASK, help="--samples auto: at least this many per task.")
    ] = 2,
    pilot_samples: Annotated[
        int,
        typer.Option(
            min=2,
            max=limits.SAMPLES_PER_TASK,
            help="ruler/longbench: pilot samples per task (competence, the anchor's spread).",
        ),
    ] = 10,
    competence: Annotated[
        float, typer.Option(help="ruler/longbench: FullKV accuracy (%) under which a task leaves the macro-average.")
    ] = 20.0,
    accuracy_samples: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=limits.SAMPLES_PER_TASK,
            help="With --metric answer_nll: also generate on this many samples per task (accuracy).",
        ),
    ] = None,
    placement_samples: Annotated[
        int | None,
        typer.Option(
            min=1, max=limits.SAMPLES_PER_TASK, help="Placement control on the primary suite: its samples per task."
        ),
    ] = None,
    seed: int = 0,
    device: str = "cpu",
    backend: BackendOption = "local",
    suite: Annotated[
        str, typer.Option(help="The primary workload (factorial, sweeps): fidelity or ruler.")
    ] = "fidelity",
    settings_json: SettingsOption = None,
    placement_suite: Annotated[
        str | None, typer.Option(help="The suite scoring the placement control (default: the primary suite).")
    ] = None,
    placement_settings: Annotated[str | None, typer.Option(help="The placement suite's settings as JSON.")] = None,
    placement_metric: Annotated[
        str | None, typer.Option(help="The placement suite's metric (default: --metric).")
    ] = None,
    sweep_scopes: Annotated[
        str | None, typer.Option(help="Also sweep the TopRank routes of these phases, e.g. prefill (comma-separated).")
    ] = None,
    calibration_sequences: Annotated[
        int, typer.Option(min=1, max=limits.SEQUENCES, help="Calibration sequences of the profile.")
    ] = 20,
    calibration_tokens: Annotated[int, typer.Option(min=16, help="Tokens per calibration sequence.")] = 2048,
    sources: Annotated[
        str | None, typer.Option(help="Calibration sources, comma-separated (default: the model's own).")
    ] = None,
    b_cal: Annotated[int | None, typer.Option(min=1, help="Calibration capacity (default: 256, scaled down).")] = None,
    batch: Annotated[
        bool, typer.Option(help="Run a suite's plans together, sample by sample, as one batch (local backend).")
    ] = True,
    baselines: Annotated[
        str | None, typer.Option(help="The sweep's baselines, comma-separated (default: every method's protocol).")
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            min=1, max=limits.WORKERS, help="With --batch: share each suite's samples out over this many processes."
        ),
    ] = 1,
    sweep_ppl: Annotated[
        bool, typer.Option(help="The sweep's route-ppl row (the route with the profile's PPL capacities).")
    ] = True,
    sample_seconds: Annotated[
        float | None,
        typer.Option(
            help="With --samples auto: one sample with every plan takes this many seconds, given instead of "
            "timed (the time an earlier run measured: the study rendered again from its database)."
        ),
    ] = None,
    replay: Annotated[
        bool,
        typer.Option(
            "--replay",
            help="Run nothing: read the profile and every run from the workspace, whatever code revisions made "
            "them (the study rendered again from its database; with --samples auto, give --sample-seconds).",
        ),
    ] = False,
    sweep_matched: Annotated[
        bool,
        typer.Option(
            help="The sweep's like-with-like comparator: every method alone in the route's scope at each budget "
            "(--no-sweep-matched: only the baselines under their own protocols, as studies made before it)."
        ),
    ] = True,
    dry_run: DryRunOption = False,
) -> None:
    """The paper's study: profile, TopRank routes, factorial, placement (K), sweeps; writes a report."""
    import shlex

    from polykv.eval.settings import parse_settings_object
    from polykv.eval.study import StudySettings, run_study, write_report

    settings = StudySettings(
        model=model,
        scope=scope,
        budget=budget,
        budgets=tuple(_parse_budgets(budgets)),
        placements=k,
        statistic=statistic,
        allocation=allocation,
        baseline=baseline,
        metric=metric,
        samples_per_task=None if samples in (None, "auto") else _samples(samples),
        auto_samples=samples == "auto",
        mde=mde,
        time_limit=time_limit,
        min_samples=min_samples,
        pilot_samples=pilot_samples,
        competence_threshold=competence,
        accuracy_samples=accuracy_samples,
        placement_samples=placement_samples,
        seed=seed,
        backend=backend,
        device=device,
        suite=suite,
        suite_settings=parse_settings_object(settings_json, "--settings"),
        placement_suite=placement_suite,
        placement_settings=parse_settings_object(placement_settings, "--placement-settings"),
        placement_metric=placement_metric,
        sweep_scopes=tuple(x.strip() for x in sweep_scopes.split(",") if x.strip()) if sweep_scopes else None,
        calibration_sequences=calibration_sequences,
        calibration_tokens=calibration_tokens,
        calibration_sources=tuple(x.strip() for x in sources.split(",") if x.strip()) if sources else None,
        b_cal=b_cal,
        batched=batch,
        baselines=tuple(x.strip() for x in baselines.split(",") if x.strip()) if baselines else None,
        workers=workers,
        sweep_ppl=sweep_ppl,
        sweep_matched=sweep_matched,
        sample_seconds=sample_seconds,
        replay=replay,
    )

    def say_cost(hf_model, tokenizer, primary) -> None:
        from polykv.eval.launch_work import sample_shapes, study_work
        from polykv.models import context_length, num_layers

        if replay:  # nothing runs: no cost to state
            if dry_run:
                raise typer.Exit(0)
            return
        shapes = sample_shapes(suite, primary, hf_model, tokenizer, seed)
        work = study_work(settings, shapes, num_layers(hf_model), context_length(hf_model)).loaded(0)
        announce_cost(work, model, device, hf_model, dry_run)

    with Progress() as bars:

        def step(name: str) -> None:  # a line per step, on a terminal too; the profile's bar is named after it
            bars.start(name)
            bars.note(f"study: {name}")

        result = run_study(
            settings,
            workspace,
            progress=step,
            on_run=bars.run,
            on_sample=bars.sample,
            on_profile=bars.fraction,
            on_model=say_cost,
        )
    argv = [a for a in sys.argv[1:] if a != "--no-progress"]  # the global flag changes no number in the report
    given = argv[2:] if argv[:2] == ["experiment", "study"] else []
    command = "polykv experiment study " + shlex.join(given)
    typer.echo(f"wrote {write_report(result, out, command.strip())}")

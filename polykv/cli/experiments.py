"""Experiment commands: `experiment factorial`, `placement` and `sweep` (`experiment study` is `polykv.cli.study`).

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
    _num_layers,
    _profile_for,
    _suite_settings,
    announce_cost,
)
from polykv.cli.progress import Progress
from polykv.plan import Plan, Scope
from polykv.workspace import results_path


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

    def run(self, experiment):
        """Run `experiment` (`polykv.eval.experiments.run.Experiment`) with these options through the library's one
        entry point (`run_experiment`, as experiment jobs run it), its runs and samples drawn as bars; the cost of
        its plans on the suite's samples is said before it starts (`--dry-run`: then it stops)."""
        from polykv.eval.experiments.run import ExperimentSetup, run_experiment

        settings = _suite_settings(
            self.suite, self.samples, self.tasks, self.prompt_tokens, self.settings_json, self.model, self.metric
        )
        setup = ExperimentSetup(
            self.model, self.suite, settings, self.seed, self.metric, self.device, self.backend, self.batch
        )

        def say_cost(hf_model, tokenizer, settings) -> None:
            from polykv.eval.launch.work import experiment_work, sample_shapes, samples_work

            shapes = sample_shapes(self.suite, settings, hf_model, tokenizer, self.seed)
            work = experiment_work(shapes, experiment.name, len(experiment.plans), batched=self.batch).loaded(0)
            work = work + dataclasses.replace(samples_work(self.suite, settings, hf_model), kind="experiment", loads=0)
            announce_cost(work, self.model, self.device, hf_model, self.dry_run)

        with Progress() as bars:  # closed (the last bar finished) before the report prints
            return run_experiment(
                experiment,
                setup,
                results_path(self.workspace),
                load=_load_model,
                on_model=say_cost,
                on_run=bars.run,
                on_sample=bars.sample,  # the local backend's samples; ray runs report in the store only
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


def _parse_budgets(budgets: str) -> list[int]:
    from polykv.eval.running.settings import parse_budgets

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
    from polykv.eval.experiments.run import factorial_experiment  # torch and transformers: after the cheap checks

    _print_report(options.run(factorial_experiment(loaded, scope, budget, baseline, statistic, allocation)))


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
    from polykv.eval.experiments.run import placement_experiment  # torch and transformers: after the cheap checks

    _print_report(options.run(placement_experiment(loaded, guided, k, statistic, options.seed)))


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
    from polykv.eval.method_protocols import parse_overrides

    levels = _parse_budgets(budgets)
    overrides = parse_overrides(protocol)
    names = [b.strip() for b in baselines.split(",")] if baselines else None
    route = Plan.load(plan)
    loaded = _profile_for(profile_dir, options.model) if profile_dir is not None else None
    from polykv.eval.experiments.run import sweep_experiment  # torch and transformers: after the cheap checks

    experiment = sweep_experiment(route, levels, names, loaded, overrides)  # bad input fails before the model loads
    _print_report(options.run(experiment))


@experiment_options
def experiment_leaderboard(
    options: ExperimentOptions,
    budgets: Annotated[str, typer.Option(help="Comma-separated budgets (tokens per layer), e.g. 64,128,256.")],
    methods: Annotated[
        str | None, typer.Option(help="Comma-separated methods (default: every method that runs in the scope).")
    ] = None,
    references: Annotated[str, typer.Option(help="Comma-separated methods every other is compared with.")] = (
        "tova,random"
    ),
    scope: Scope = Scope.PREFILL,
    question_budget: Annotated[
        int | None,
        typer.Option(help="Also run the plans at this budget with the other question protocol, and compare."),
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="Also write the leaderboard as a Markdown page here.")
    ] = None,
    save: Annotated[Path | None, typer.Option("--save", help="Also write the report's numbers as JSON here.")] = None,
) -> None:
    """Every method alone at each budget against reference methods, sample by sample, Holm over each family."""
    from polykv.eval.experiments.leaderboard import board_methods

    levels = _parse_budgets(budgets)
    chosen = [m.strip() for m in methods.split(",")] if methods else board_methods(scope)
    against = [r.strip() for r in references.split(",") if r.strip()]
    from polykv.eval.experiments.run import leaderboard_experiment  # torch and transformers: after the cheap checks

    try:
        experiment = leaderboard_experiment(_num_layers(options.model), chosen, levels, against, scope, question_budget)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--methods") from None
    from polykv.eval.experiments.leaderboard_page import leaderboard_markdown

    _write_report(options, options.run(experiment), leaderboard_markdown, markdown, save)


def _write_report(options: ExperimentOptions, report, page, markdown: Path | None, save: Path | None) -> None:
    """Print the report; write its page (`page(data, database)`) to `markdown` and its numbers to `save` if given."""
    from polykv.files import atomic_write_json, atomic_write_text

    _print_report(report)
    if markdown is not None:
        atomic_write_text(markdown, page(report.data, results_path(options.workspace)))
        typer.echo(f"wrote {markdown}")
    if save is not None:
        atomic_write_json(save, report.to_dict())
        typer.echo(f"wrote {save}")


@experiment_options
def experiment_allocation(
    options: ExperimentOptions,
    budgets: Annotated[str, typer.Option(help="Comma-separated budgets (tokens per layer), e.g. 64,128,256.")],
    scorers: Annotated[str, typer.Option(help="Comma-separated methods whose scores every split keeps the top of.")] = (
        "tova,snapkv"
    ),
    contenders: Annotated[
        str | None,
        typer.Option(help="Comma-separated splits (default: all: uniform, pyramid, squeeze, ppl, cake, adakv, ...)."),
    ] = None,
    search: Annotated[
        str | None, typer.Option(help="Comma-separated scorers that get a capacity-only search (default: the first).")
    ] = None,
    profile_dir: Annotated[
        Path | None,
        typer.Option("--profile", help="A prefill profile: the ppl rule's statistic; it ranks the search's moves."),
    ] = None,
    calibration_per_task: Annotated[
        int, typer.Option(min=1, help="Calibration samples per task (best rule, search); never an evaluated one.")
    ] = 4,
    evaluations: Annotated[int, typer.Option(min=1, help="Plan executions each search may run past its starts.")] = 300,
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="Also write the study as a Markdown page.")
    ] = None,
    save: Annotated[Path | None, typer.Option("--save", help="Also write the report's numbers as JSON here.")] = None,
) -> None:
    """Layer and head splits of one budget for each scorer: every rule against uniform, a searched split against the
    best rule, sample by sample at measured KV, Holm over each family."""
    from polykv.eval.experiments.allocation import CONTENDERS, StudyChoices

    listed = lambda text: [x.strip() for x in text.split(",") if x.strip()]  # noqa: E731
    try:
        choices = StudyChoices(
            scorers=tuple(listed(scorers)),
            budgets=tuple(_parse_budgets(budgets)),
            contenders=tuple(listed(contenders)) if contenders else CONTENDERS,
            searched=tuple(listed(search or "")),
            calibration_per_task=calibration_per_task,
            evaluations=evaluations,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if options.suite not in ("ruler", "longbench") or options.metric != "answer_nll":
        raise typer.BadParameter("the study scores answers: give --suite ruler or longbench and --metric answer_nll")
    if "ppl" in choices.contenders and profile_dir is None:
        raise typer.BadParameter("the ppl rule splits by a profile's PPL sensitivity: give --profile DIR")
    profile = None if profile_dir is None else _profile_for(profile_dir, options.model)
    if profile is not None and "prefill" not in profile.meta.scopes:
        raise typer.BadParameter(f"--profile {profile_dir}: it profiles {', '.join(profile.meta.scopes)}, not prefill")
    from polykv.eval.experiments.allocation_page import allocation_markdown
    from polykv.search.workload.allocation import allocation_experiment  # torch: after the cheap checks

    report = options.run(allocation_experiment(_num_layers(options.model), choices, profile))
    _write_report(options, report, allocation_markdown, markdown, save)

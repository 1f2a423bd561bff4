"""The `experiment study` command: the paper's study (profile, TopRank routes, factorial, placement, sweeps) run,
or read again from its database, and written as a Markdown report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from polykv import limits
from polykv.cli.common import BackendOption, DryRunOption, MetricOption, ModelOption, SettingsOption, announce_cost
from polykv.cli.experiments import _parse_budgets
from polykv.cli.progress import Progress


def _samples(text: str) -> int:
    from polykv.text import whole_number

    value = whole_number(text)
    if value is None or value < 1:
        raise typer.BadParameter(f"a positive number or auto, got {text!r}", param_hint="--samples")
    return value


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

    from polykv.eval.running.settings import parse_settings_object
    from polykv.eval.study.run import run_study, write_report
    from polykv.eval.study.settings import StudySettings

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
        from polykv.eval.launch.work import sample_shapes, study_work
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

"""Profile commands: `profile` (every layer x method x scope against FullKV), `heterogeneity`, and `route`
(a plan from a profile)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polykv import limits
from polykv.cli.common import (
    BUDGET_HELP,
    DEFAULT_WORKSPACE,
    DryRunOption,
    ModelOption,
    WorkspaceOption,
    _load_model,
    _profile_for,
    _table,
    announce_cost,
    echo_budget_lines,
)
from polykv.cli.progress import Progress
from polykv.plan import Scope

SOURCES_HELP = (
    "Comma-separated corpus sources: kjv, jargon, stdlib, model, model@T, model:OPENING (no commas), "
    "file:PATH (default: the model's own; for the demo its samples, else kjv,jargon,stdlib,model); or a "
    "workload, ruler:TASK[@LENGTH] or longbench:PATH/<task>.jsonl, whose calibration prompts score their gold "
    "answers (danswer)."
)


def _corpus_sources(sources: str | None, model: str) -> tuple[str, ...]:
    """--sources split at commas, or the model's default calibration sources when not given."""
    from polykv.profile.corpus import default_sources

    if sources is None:
        return default_sources(model)
    return tuple(s.strip() for s in sources.split(",") if s.strip())


def profile(
    model: ModelOption = "demo",
    sequences: Annotated[int, typer.Option(min=1, max=limits.SEQUENCES, help="Calibration sequences.")] = 20,
    max_tokens: Annotated[int, typer.Option(min=16, help="Tokens per sequence (clipped to the context).")] = 2048,
    b_cal: Annotated[
        int | None,
        typer.Option("--b-cal", min=1, help="Calibration capacity (default: 256, scaled down for short contexts)."),
    ] = None,
    sources: Annotated[str | None, typer.Option(help=SOURCES_HELP)] = None,
    scope: Scope = Scope.BOTH,
    seed: int = 0,
    batch_size: Annotated[int, typer.Option(min=1, help="Sequences profiled together (memory grows with it).")] = 4,
    device: str = "cpu",
    workspace: WorkspaceOption = DEFAULT_WORKSPACE,
    fresh: Annotated[bool, typer.Option(help="Recompute even if this profile exists.")] = False,
    dry_run: DryRunOption = False,
) -> None:
    """Profile every layer x method x scope against FullKV (cosine, dPPL) and each layer's entropy."""
    from polykv.profile.corpus import CorpusSpec

    spec = CorpusSpec(
        sources=_corpus_sources(sources, model), num_sequences=sequences, max_tokens=max_tokens, seed=seed
    )
    if spec.is_workload:
        from polykv.eval.workloads.workload import parse_workload

        parse_workload(spec.sources, max_tokens)  # a bad task or length: one line before the weights load
    from polykv.models import config_dimensions

    config_dimensions(model)  # a model PolyKV cannot run: one line before torch loads
    from polykv.profile.build import build_profile  # torch and transformers: after the cheap checks

    hf_model, tokenizer = _load_model(model, device)
    from polykv.eval.launch.work import profile_work
    from polykv.models import context_length, num_layers

    tokens = min(max_tokens, context_length(hf_model) or max_tokens)
    work = profile_work(spec.sources, sequences, tokens, scope.phases, num_layers(hf_model))
    announce_cost(work.loaded(0), model, device, hf_model, dry_run)
    workload = None
    if spec.is_workload:
        from polykv.eval.workloads.workload import workload_corpus

        workload = workload_corpus(tokenizer, hf_model, spec)
    with Progress() as bars:  # a found profile draws no bar
        bars.start("profile")
        result = build_profile(
            model,
            hf_model,
            tokenizer,
            workspace / "profiles",
            spec,
            b_cal,
            scope.phases,
            batch_size=batch_size,
            reuse=not fresh,
            progress=bars.fraction,
            workload=workload,
        )
    table = result.table
    typer.echo(f"profile {result.key} ({result.metadata['seconds']:.1f} s to compute): {result.path}")
    typer.echo(_fullkv_line(result.meta.fullkv_ppl))
    count = result.meta.corpus.num_sequences
    for phase in scope.phases:
        rows = table[table.scope == phase.value]
        pivot = rows.pivot_table(index="layer", columns="method", values="dppl")
        typer.echo(f"\n{phase.value}: dPPL by layer (rows) and method (columns), b_cal {result.meta.b_cal}")
        typer.echo(pivot.round(4).to_string())
        evicting = rows[rows.method != "full"]
        typer.echo(
            f"95% bootstrap intervals over the {count} calibration sequences are in methods.csv (dppl_low, "
            f"dppl_high, cosine_low, cosine_high); median width: dPPL "
            f"{(evicting.dppl_high - evicting.dppl_low).median():.4g}, cosine "
            f"{(evicting.cosine_high - evicting.cosine_low).median():.4g}"
        )
    if result.is_workload:
        for phase in scope.phases:
            rows = table[(table.scope == phase.value) & (table.method != "full")]
            pivot = rows.pivot_table(index="layer", columns="method", values="danswer")
            typer.echo(f"\n{phase.value}: danswer (the gold answer's NLL per token minus FullKV's) by layer and method")
            typer.echo(pivot.round(4).to_string())
    typer.echo(
        "\nentropy by layer (mean over all prompt queries, heads and sequences, nats): "
        + ", ".join(f"{h:.3f}" for h in result.entropy)
    )


def _fullkv_line(ppl: dict) -> str:
    """{source: FullKV perplexity} of a profile (`Profile.meta.fullkv_ppl`) as one line."""
    return "FullKV perplexity of the calibration continuations: " + ", ".join(f"{s} {v:.2f}" for s, v in ppl.items())


def heterogeneity(
    model: ModelOption = "demo",
    inputs: Annotated[int, typer.Option(min=1, max=limits.SEQUENCES, help="Calibration inputs to measure.")] = 8,
    max_tokens: Annotated[int, typer.Option(min=16)] = 2048,
    coverage: Annotated[float, typer.Option(min=0.01, max=1.0, help="Attention mass the support set covers.")] = 0.9,
    bins: Annotated[int, typer.Option(min=1)] = 32,
    sources: Annotated[str | None, typer.Option(help=SOURCES_HELP)] = None,
    seed: int = 0,
    device: str = "cpu",
    dry_run: DryRunOption = False,
) -> None:
    """Per layer: how many positions hold `coverage` of the first decoding query's attention."""
    from polykv.eval.launch.work import heterogeneity_work
    from polykv.models import context_length
    from polykv.profile.corpus import CorpusSpec, build_corpus
    from polykv.profile.heterogeneity import measure_heterogeneity

    spec = CorpusSpec(sources=_corpus_sources(sources, model), num_sequences=inputs, max_tokens=max_tokens, seed=seed)
    hf_model, tokenizer = _load_model(model, device)
    tokens = min(max_tokens, context_length(hf_model) or max_tokens)
    announce_cost(heterogeneity_work(spec.sources, inputs, tokens).loaded(0), model, device, hf_model, dry_run)
    corpus = build_corpus(tokenizer, spec, model=hf_model)
    with Progress() as bars:
        bars.start("heterogeneity", unit="input")
        result = measure_heterogeneity(
            hf_model,
            corpus.sequences,
            coverage=coverage,
            bins=bins,
            seed=seed,
            progress=bars.sample,
        )
    typer.echo(
        f"{int(coverage * 100)}% attention support per layer, {inputs} input{'s' * (inputs != 1)} of "
        f"{corpus.sequence_length} tokens "
        + ("(median and bootstrap 95% interval):" if inputs > 1 else "(one measurement per layer: no interval):")
    )
    typer.echo(result.to_frame("layers").round(2).to_string(index=False))


def route(
    profile_dir: Annotated[Path, typer.Argument(help="A profile directory written by `polykv profile`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the plan.")],
    budget: Annotated[int, typer.Option(min=1, help=BUDGET_HELP)],
    scope: Scope = Scope.BOTH,
    statistic: Annotated[str, typer.Option(help="cosine (higher is better) or dppl (lower is better).")] = "cosine",
    allocation: Annotated[str, typer.Option(help="uniform, entropy or ppl.")] = "uniform",
    model: ModelOption = "demo",
) -> None:
    """Build a plan from a profile: TopRank route per phase, capacities by the chosen allocation."""
    from polykv.methods import validate_plan
    from polykv.routing import plan_from_profile
    from polykv.routing.confidence import (
        NOISE_WARNING,
        NOISY_ROUTE,
        REPLICATES,
        few_sequences_warning,
        route_confidence,
    )

    loaded = _profile_for(profile_dir, model)
    plan = validate_plan(plan_from_profile(loaded, scope, budget, statistic, allocation), loaded.num_layers)
    plan.save(out)
    for line in plan.summary().lines():
        typer.echo(line)
    typer.echo(_fullkv_line(loaded.meta.fullkv_ppl))
    count = loaded.meta.corpus.num_sequences
    for phase in plan.scope.phases:
        confidence = route_confidence(loaded, phase, statistic)
        typer.echo(
            f"\n{phase.value} route by {statistic}: how often each pick stays the best over {REPLICATES} "
            f"bootstrap replicates of the {count} calibration sequences"
        )
        _table(
            ("layer", "winner", "runner-up", "margin", "win freq"),
            [
                (str(r.layer), r.winner, r.runner_up or "-", f"{r.margin:.4g}", f"{r.win_frequency:.2f}")
                for r in confidence.itertuples()
            ],
        )
        median = confidence.win_frequency.median()
        if median < NOISY_ROUTE:
            typer.echo(f"warning: {phase.value} median win frequency {median:.2f} < {NOISY_ROUTE}: {NOISE_WARNING}")
    few = few_sequences_warning(count)
    if few is not None:
        typer.echo(f"warning: {few}")
    echo_budget_lines(plan, model)
    typer.echo(f"wrote {out}")

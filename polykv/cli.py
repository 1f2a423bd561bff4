"""The `polykv` command line. Every command is a thin call into the library.

User errors (a bad plan, a missing file, an unknown model) print one line and exit with code 2;
set POLYKV_DEBUG=1 to see the traceback instead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from polykv.plan import Phase, Plan, Scope

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help="Per-layer KV-cache eviction plans.")
plan_app = typer.Typer(no_args_is_help=True, help="Inspect, check and build plan files.")
app.add_typer(plan_app, name="plan")

REPO_ROOT = Path(__file__).resolve().parents[1]
PLANS_DIR = REPO_ROOT / "plans"
DEFAULT_PLAN = PLANS_DIR / "demo" / "mixed.json"

# Long enough (~90 tokens on the demo model) that every capacity in the demo plans evicts at prefill.
DEMO_PROMPT = (
    "Once upon a time, there was a little girl named Lily. She had a red ball and a small dog named Max. "
    "Every day Lily and Max went to the park to play. One day the ball rolled into the pond, and Max "
    "jumped in to get it. Lily laughed and"
)

ModelOption = Annotated[str, typer.Option("--model", "-m", help="'demo', a local path or a Hugging Face id.")]


def _num_layers(model: str) -> int:
    """Layer count from the model's config alone (no weights loaded)."""
    from polykv.models import config_dimensions

    return config_dimensions(model).num_layers


def _checked_plan(path: Path, model: str) -> Plan:
    """A plan file checked against the model's config (layers, context) before any weights load."""
    from polykv.methods import validate_plan
    from polykv.models import config_dimensions

    dims = config_dimensions(model)
    return validate_plan(Plan.load(path), dims.num_layers, dims.context_length)


def _load_model(model: str, device: str):
    """(model, tokenizer), saying on a terminal what is being loaded (it can take a while); quiet when
    stderr is not a terminal, so scripts see only results and one-line errors."""
    if sys.stderr.isatty():
        typer.echo(f"loading model {model} on {device} ...", err=True)
    from polykv.models import load_model

    return load_model(model, device=device)  # quiet: no progress bars


@app.command()
def methods() -> None:
    """List the eviction methods with their phases, parameters and defaults."""
    from polykv.methods import REGISTRY

    for name, cls in REGISTRY.items():
        phases = ", ".join(p.value for p in Phase if p in cls.phases)
        params = ", ".join(f"{k}={v}" for k, v in cls.defaults().items()) or "-"
        summary = (cls.__doc__ or "").strip().splitlines()[0]
        typer.echo(f"{name:<13} phases: {phases:<16} params: {params}")
        typer.echo(f"{'':<13} {summary}")


@app.command()
def generate(
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="Text to continue.")] = DEMO_PROMPT,
    plan: Annotated[Path, typer.Option("--plan", help="Plan file (JSON).")] = DEFAULT_PLAN,
    model: ModelOption = "demo",
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 96,
    device: str = "cpu",
    sample: Annotated[bool, typer.Option(help="Sample instead of greedy decoding.")] = False,
    temperature: Annotated[float, typer.Option(min=0.0)] = 1.0,
    seed: int = 0,
) -> None:
    """Generate text with a plan and print the retained cache per layer."""
    import torch

    from polykv.models import num_layers
    from polykv.runtime import routed

    routed_plan = _checked_plan(plan, model)  # bad input fails before the weights load
    hf_model, tokenizer = _load_model(model, device)
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
    torch.manual_seed(seed)
    sampling = {"do_sample": True, "temperature": temperature} if sample else {"do_sample": False}
    with torch.no_grad(), routed(hf_model, routed_plan) as session:
        out = hf_model.generate(ids, max_new_tokens=max_new_tokens, **sampling)
    new = out[0, ids.shape[1] :]
    typer.echo(f"model: {model} ({num_layers(hf_model)} layers)   plan: {routed_plan.name} (scope {routed_plan.scope.value})")
    typer.echo(f"prompt: {ids.shape[1]} tokens   generated: {len(new)} tokens\n")
    typer.echo(tokenizer.decode(out[0], skip_special_tokens=True))  # whole text: joins at the right space
    typer.echo("\nretained KV slots per KV head (after prefill -> at the end):")
    rows = [
        (str(idx), str(lp.prefill), str(lp.decode), str(layer.retained_after_prefill), str(layer.retained))
        for idx, (lp, layer) in enumerate(zip(routed_plan.layers, session.cache.layers))
    ]
    _table(("layer", "prefill", "decode", "after prefill", "end"), rows)
    typer.echo(f"true sequence length: {session.cache.get_seq_length()}")


@plan_app.command("show")
def plan_show(path: Path) -> None:
    """Summarize a plan: totals, averages and method counts per phase, then every layer."""
    loaded = Plan.load(path)
    for line in loaded.summary().lines():
        typer.echo(line)
    if loaded.description:
        typer.echo(f"  {loaded.description}")
    typer.echo("")
    _table(("layer", "prefill", "decode"), [(str(i), str(lp.prefill), str(lp.decode)) for i, lp in enumerate(loaded.layers)])


@plan_app.command("validate")
def plan_validate(
    path: Path,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Check the layer count of this model.")] = None,
    layers: Annotated[Optional[int], typer.Option(help="Check against this layer count instead of a model.")] = None,
) -> None:
    """Check a plan: methods known and phase-compatible, capacities, parameters, layer count."""
    from polykv.methods import validate_plan

    from polykv.models import config_dimensions

    loaded = Plan.load(path)
    dims = config_dimensions(model) if model and layers is None else None
    num_layers = layers if layers is not None else (dims.num_layers if dims else None)
    validate_plan(loaded, num_layers, dims.context_length if dims else None)
    against = f" for a {num_layers}-layer model" if num_layers is not None else ""
    typer.echo(f"ok: {path} is a valid plan{against} ({loaded.num_layers} layers, scope {loaded.scope.value})")


@plan_app.command("homogeneous")
def plan_homogeneous(
    method: str,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the plan.")],
    capacity: Annotated[Optional[int], typer.Option(help="Capacity of every layer: retained tokens per KV head.")] = None,
    layers: Annotated[Optional[int], typer.Option(help="Number of layers (default: the model's).")] = None,
    model: ModelOption = "demo",
    scope: Scope = Scope.BOTH,
    param: Annotated[
        Optional[list[str]], typer.Option("--param", "-P", help="Method parameter NAME=VALUE (repeatable).")
    ] = None,
    allocation: Annotated[
        str, typer.Option(help="'fixed' (same capacity everywhere) or 'native' (the method's own per-layer capacities).")
    ] = "fixed",
) -> None:
    """Write a plan with one method in every layer: uniform capacity, or the method's native per-layer capacities."""
    from polykv.methods import validate_plan

    num_layers = layers if layers is not None else _num_layers(model)
    plan = Plan.homogeneous(method, capacity, num_layers, scope, _parse_params(param or []), allocation=allocation)
    built = validate_plan(plan, num_layers)
    built.save(out)
    typer.echo(f"wrote {out}")


def _suite_settings(suite: str, samples: int, tasks: Optional[str], prompt_tokens: int, settings_json: Optional[str],
                    model: Optional[str] = None):
    """A suite's settings: from --settings JSON, from the fidelity options (no --tasks: the model's default
    tasks), or the suite's defaults."""
    from polykv.eval.settings import suite_settings
    from polykv.eval.suites.fidelity import default_tasks

    if settings_json is not None or suite != "fidelity":
        return suite_settings(suite, settings_json)
    chosen = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else list(default_tasks(model))
    return suite_settings(suite, {"tasks": chosen, "samples_per_task": samples, "prompt_tokens": prompt_tokens})


def _corpus_sources(sources: Optional[str], model: str) -> tuple[str, ...]:
    """--sources split at commas, or the model's default calibration sources when not given."""
    from polykv.profile.corpus import default_sources

    if sources is None:
        return default_sources(model)
    return tuple(s.strip() for s in sources.split(",") if s.strip())


BUDGET_HELP = "Budget b: the plan's average capacity per layer (tokens per KV head)."
SOURCES_HELP = ("Comma-separated corpus sources: kjv, jargon, stdlib, model, model@T, model:OPENING (no commas), "
                "file:PATH (default: the model's own; for the demo its samples, else kjv,jargon,stdlib,model).")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
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
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value  # a bare string such as pooling=avg
    return params


def _workspace(value: Optional[Path]) -> Path:
    from polykv.workspace import default_workspace

    return value if value is not None else default_workspace()


WorkspaceOption = Annotated[Optional[Path], typer.Option(
    "--workspace", "-w", callback=_workspace, show_default=False,
    help="Where profiles, runs and jobs are kept (default: $POLYKV_WORKSPACE, else .polykv/ in the repository).")]
DEFAULT_WORKSPACE = None  # resolved by `_workspace` when the command runs


@app.command()
def profile(
    model: ModelOption = "demo",
    sequences: Annotated[int, typer.Option(min=1, help="Calibration sequences.")] = 20,
    max_tokens: Annotated[int, typer.Option(min=16, help="Tokens per sequence (clipped to the context).")] = 2048,
    b_cal: Annotated[Optional[int], typer.Option("--b-cal", min=1, help="Calibration capacity (default: 256, scaled down for short contexts).")] = None,
    sources: Annotated[Optional[str], typer.Option(help=SOURCES_HELP)] = None,
    scope: Scope = Scope.BOTH,
    seed: int = 0,
    batch_size: Annotated[int, typer.Option(min=1)] = 20,
    device: str = "cpu",
    workspace: WorkspaceOption = DEFAULT_WORKSPACE,
    fresh: Annotated[bool, typer.Option(help="Recompute even if this profile exists.")] = False,
) -> None:
    """Profile every layer x method x scope against FullKV (cosine, dPPL) and each layer's entropy."""
    from polykv.profile.build import build_profile
    from polykv.profile.corpus import CorpusSpec

    spec = CorpusSpec(sources=_corpus_sources(sources, model), num_sequences=sequences, max_tokens=max_tokens, seed=seed)
    hf_model, tokenizer = _load_model(model, device)
    result = build_profile(model, hf_model, tokenizer, workspace / "profiles", spec, b_cal, scope.phases,
                           batch_size=batch_size, reuse=not fresh)
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
        typer.echo(f"95% bootstrap intervals over the {count} calibration sequences are in methods.csv (dppl_low, "
                   f"dppl_high, cosine_low, cosine_high); median width: dPPL "
                   f"{(evicting.dppl_high - evicting.dppl_low).median():.4g}, cosine "
                   f"{(evicting.cosine_high - evicting.cosine_low).median():.4g}")
    typer.echo("\nentropy by layer (mean over all prompt queries, heads and sequences, nats): "
               + ", ".join(f"{h:.3f}" for h in result.entropy))


def _fullkv_line(ppl: dict) -> str:
    """{source: FullKV perplexity} of a profile (`Profile.meta.fullkv_ppl`) as one line."""
    return "FullKV perplexity of the calibration continuations: " + ", ".join(f"{s} {v:.2f}" for s, v in ppl.items())


@app.command()
def heterogeneity(
    model: ModelOption = "demo",
    inputs: Annotated[int, typer.Option(min=1, help="Calibration inputs to measure.")] = 8,
    max_tokens: Annotated[int, typer.Option(min=16)] = 2048,
    coverage: Annotated[float, typer.Option(min=0.01, max=1.0, help="Attention mass the support set covers.")] = 0.9,
    bins: Annotated[int, typer.Option(min=1)] = 32,
    sources: Annotated[Optional[str], typer.Option(help=SOURCES_HELP)] = None,
    seed: int = 0,
    device: str = "cpu",
) -> None:
    """Per layer: how many positions hold `coverage` of the first decoding query's attention."""
    from polykv.profile.corpus import CorpusSpec, build_corpus
    from polykv.profile.heterogeneity import measure_heterogeneity

    hf_model, tokenizer = _load_model(model, device)
    spec = CorpusSpec(sources=_corpus_sources(sources, model), num_sequences=inputs, max_tokens=max_tokens, seed=seed)
    corpus = build_corpus(tokenizer, spec, model=hf_model)
    result = measure_heterogeneity(hf_model, corpus.sequences, coverage=coverage, bins=bins, seed=seed)
    typer.echo(f"{int(coverage * 100)}% attention support per layer, {inputs} inputs of {corpus.sequence_length} tokens "
               f"(median and bootstrap 95% interval):")
    typer.echo(result.to_frame("layers").round(2).to_string(index=False))


@app.command()
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
    from polykv.routing.confidence import NOISE_WARNING, NOISY_ROUTE, REPLICATES, route_confidence

    loaded = _profile_for(profile_dir, model)
    plan = validate_plan(plan_from_profile(loaded, scope, budget, statistic, allocation), loaded.num_layers)
    plan.save(out)
    for line in plan.summary().lines():
        typer.echo(line)
    typer.echo(_fullkv_line(loaded.meta.fullkv_ppl))
    count = loaded.meta.corpus.num_sequences
    for phase in plan.scope.phases:
        confidence = route_confidence(loaded, phase, statistic)
        typer.echo(f"\n{phase.value} route by {statistic}: how often each pick stays the best over {REPLICATES} "
                   f"bootstrap replicates of the {count} calibration sequences")
        _table(("layer", "winner", "runner-up", "margin", "win freq"),
               [(str(r.layer), r.winner, r.runner_up or "-", f"{r.margin:.4g}", f"{r.win_frequency:.2f}")
                for r in confidence.itertuples()])
        median = confidence.win_frequency.median()
        if median < NOISY_ROUTE:
            typer.echo(f"warning: {phase.value} median win frequency {median:.2f} < {NOISY_ROUTE}: {NOISE_WARNING}")
    typer.echo(f"wrote {out}")


@app.command("eval")
def evaluate(
    plan: Annotated[Path, typer.Option("--plan", help="Plan file (JSON).")] = DEFAULT_PLAN,
    suite: Annotated[str, typer.Option(help="Evaluation suite.")] = "fidelity",
    model: ModelOption = "demo",
    samples: Annotated[int, typer.Option(min=1, help="Samples per task.")] = 4,
    tasks: Annotated[Optional[str], typer.Option(help="Comma-separated fidelity tasks (default: the model's default tasks).")] = None,
    prompt_tokens: Annotated[int, typer.Option(min=8, help="Prompt length (clipped to the context).")] = 1024,
    settings_json: Annotated[Optional[str], typer.Option("--settings", help="The suite's settings as JSON (overrides the options above).")] = None,
    seed: int = 0,
    device: str = "cpu",
    workspace: WorkspaceOption = DEFAULT_WORKSPACE,
    backend: Annotated[str, typer.Option(help="local, subprocess (detached, returns at once) or ray.")] = "local",
) -> None:
    """Evaluate a plan on a suite; results go to <workspace>/results.sqlite as they finish (resumable)."""
    from polykv.eval.backends import backend as backend_named
    from polykv.eval.store import Store
    from polykv.eval.unit import Unit

    shown = []  # whether a progress line is on stderr (in this process: the local backend)

    def show(done: int, total: int, where: str) -> None:
        shown.append(True)
        typer.echo(f"\r[{done}/{total}] {where}   ", nl=False, err=True)

    runs_on = backend_named(backend, load=_load_model, progress=show)  # an unknown name fails first
    loaded = _checked_plan(plan, model)  # bad input fails before anything is written
    settings = _suite_settings(suite, samples, tasks, prompt_tokens, settings_json, model)
    store = Store(workspace / "results.sqlite")
    unit = Unit.of(model, loaded, suite, settings, seed, device)
    if runs_on.detached:  # this command returns at once; `polykv runs` shows progress
        process = runs_on.start(unit, workspace)
        typer.echo(f"started in the background (pid {process.pid}); follow it with `polykv runs -w {workspace}`")
        return
    (run_id,) = runs_on.run([unit], store.path)
    if shown:
        typer.echo("", err=True)
    typer.echo(f"run {run_id}: {loaded.name} on {suite} ({model}), {store.run(run_id)['status']}")
    scores = store.task_scores(run_id)
    metrics = sorted({m for values in scores.values() for m in values})
    _table(("task", *metrics), [(task, *(f"{values[m]:.4f}" for m in metrics)) for task, values in sorted(scores.items())])


@app.command()
def runs(workspace: WorkspaceOption = DEFAULT_WORKSPACE) -> None:
    """List the runs in the workspace's results database with their progress."""
    from polykv.eval.store import Store

    store = Store(workspace / "results.sqlite", readonly=True)
    rows = [
        (r["id"], r["plan_name"], r["suite"], r["model"], r["status"], f"{r['done_samples']}/{r['total_samples']}", r["created"][:19])
        for r in store.runs()
    ]
    _table(("run", "plan", "suite", "model", "status", "samples", "created"), rows)


@app.command()
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
    name = {r["id"]: r["plan_name"] for r in store.runs()}
    typer.echo(f"A = {a_id} ({name[a_id]}), B = {b_id} ({name[b_id]}); metric {metric} "
               f"({'higher' if result.sign > 0 else 'lower'} is better)")
    _table(("task", "A", "B", "A - B"),
           [(task, f"{a:.4f}", f"{b:.4f}", f"{d:+.4f}") for task, a, b, d in result.table.itertuples(index=False)])
    for line in result.lines():
        typer.echo(line)


experiment_app = typer.Typer(no_args_is_help=True, help="Controlled experiments: factorial, placement, sweep.")
app.add_typer(experiment_app, name="experiment")


def _experiment_runner(model: str, suite: str, samples: int, tasks: Optional[str], prompt_tokens: int, metric: str,
                       seed: int, device: str, workspace: Path, backend: str = "local", settings_json: Optional[str] = None):
    from polykv.eval.backends import backend as backend_named
    from polykv.eval.experiments import ExperimentRunner
    from polykv.eval.store import Store

    backend_named(backend, waiting=True)  # an experiment reads its runs' scores: local or ray; checked before loading
    settings = _suite_settings(suite, samples, tasks, prompt_tokens, settings_json, model)
    hf_model, tokenizer = _load_model(model, device)
    return ExperimentRunner(Store(workspace / "results.sqlite"), model, hf_model, tokenizer, suite, settings, seed, metric,
                  progress=lambda name: typer.echo(f"run: {name}", err=True), backend=backend, device=device)


def _profile_for(profile_dir: Path, model: str):
    """A profile, refused (one line) when it was measured on another model; checked before loading weights."""
    from polykv.profile.store import load_profile

    loaded = load_profile(profile_dir)
    loaded.check_model(model, _num_layers(model))
    return loaded


def _print_report(report) -> None:
    import pandas as pd

    typer.echo(report.title)
    typer.echo(pd.DataFrame(report.rows).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    for line in report.lines:
        typer.echo(line)


SuiteOption = Annotated[str, typer.Option(help="Evaluation suite.")]
SamplesOption = Annotated[int, typer.Option(min=1, help="Samples per task.")]
TasksOption = Annotated[Optional[str], typer.Option(help="Comma-separated fidelity tasks (default: the model's default tasks).")]
MetricOption = Annotated[str, typer.Option(help="Task metric that scores a run (fidelity: top1, rougeL, kl, ppl; ruler and longbench: score).")]
BackendOption = Annotated[str, typer.Option(help="local (in this process) or ray (a Ray task per run).")]
SettingsOption = Annotated[Optional[str], typer.Option("--settings", help="The suite's settings as JSON (ruler, longbench; overrides --samples/--tasks).")]


@experiment_app.command("factorial")
def experiment_factorial(
    profile_dir: Annotated[Path, typer.Option("--profile", help="Profile directory.")],
    budget: Annotated[int, typer.Option(min=1, help=BUDGET_HELP)],
    baseline: Annotated[str, typer.Option(help="The homogeneous method.")],
    scope: Scope = Scope.DECODE,
    statistic: str = "cosine",
    allocation: Annotated[str, typer.Option(help="entropy or ppl.")] = "entropy",
    model: ModelOption = "demo", suite: SuiteOption = "fidelity", samples: SamplesOption = 4,
    tasks: TasksOption = None, prompt_tokens: int = 1024, metric: MetricOption = "top1", seed: int = 0,
    device: str = "cpu", workspace: WorkspaceOption = DEFAULT_WORKSPACE, backend: BackendOption = "local",
    settings_json: SettingsOption = None,
) -> None:
    """Routing x allocation at the same budget: four runs, effects, paired bootstrap."""
    from polykv.eval.experiments import factorial

    loaded = _profile_for(profile_dir, model)
    runner = _experiment_runner(model, suite, samples, tasks, prompt_tokens, metric, seed, device, workspace, backend,
                                settings_json)
    _print_report(factorial(runner, loaded, scope, budget, baseline, statistic, allocation))


@experiment_app.command("placement")
def experiment_placement(
    profile_dir: Annotated[Path, typer.Option("--profile", help="Profile directory.")],
    plan: Annotated[Path, typer.Option("--plan", help="The guided single-phase plan (e.g. from `polykv route`).")],
    k: Annotated[int, typer.Option("--k", min=1, help="Random count-matched placements.")] = 99,
    statistic: str = "cosine",
    model: ModelOption = "demo", suite: SuiteOption = "fidelity", samples: SamplesOption = 4,
    tasks: TasksOption = None, prompt_tokens: int = 1024, metric: MetricOption = "top1", seed: int = 0,
    device: str = "cpu", workspace: WorkspaceOption = DEFAULT_WORKSPACE, backend: BackendOption = "local",
    settings_json: SettingsOption = None,
) -> None:
    """The guided route vs K random placements with the same method counts: rank, p, Spearman."""
    from polykv.eval.experiments import placement

    loaded = _profile_for(profile_dir, model)
    runner = _experiment_runner(model, suite, samples, tasks, prompt_tokens, metric, seed, device, workspace, backend,
                                settings_json)
    _print_report(placement(runner, loaded, Plan.load(plan), k, statistic))


@experiment_app.command("sweep")
def experiment_sweep(
    plan: Annotated[Path, typer.Option("--plan", help="The fixed route plan (any scope).")],
    budgets: Annotated[str, typer.Option(help="Comma-separated budgets (average capacities per layer), e.g. 128,256,512,1024.")],
    baselines: Annotated[Optional[str], typer.Option(help="Comma-separated methods (default: every method, each under its own protocol).")] = None,
    profile_dir: Annotated[Optional[Path], typer.Option("--profile", help="Profile directory: adds the route with PPL-allocated capacities (route-ppl).")] = None,
    protocol: Annotated[Optional[list[str]], typer.Option("--protocol", help="Override a baseline's phases, METHOD=SCOPE, e.g. tova=decode (repeatable).")] = None,
    model: ModelOption = "demo", suite: SuiteOption = "fidelity", samples: SamplesOption = 4,
    tasks: TasksOption = None, prompt_tokens: int = 1024, metric: MetricOption = "top1", seed: int = 0,
    device: str = "cpu", workspace: WorkspaceOption = DEFAULT_WORKSPACE, backend: BackendOption = "local",
    settings_json: SettingsOption = None,
) -> None:
    """A fixed route across budgets vs every standalone baseline under its protocol, FullKV, the envelope, 2b."""
    from polykv.eval.experiments import sweep, sweep_plans
    from polykv.eval.protocols import parse_overrides

    levels = _parse_budgets(budgets)
    overrides = parse_overrides(protocol)
    names = [b.strip() for b in baselines.split(",")] if baselines else None
    route = Plan.load(plan)
    loaded = _profile_for(profile_dir, model) if profile_dir is not None else None
    sweep_plans(route, levels, names, loaded, overrides)  # bad input fails before the model loads
    runner = _experiment_runner(model, suite, samples, tasks, prompt_tokens, metric, seed, device, workspace, backend,
                                settings_json)
    _print_report(sweep(runner, route, levels, names, loaded, overrides))


def _parse_budgets(budgets: str) -> list[int]:
    from polykv.eval.settings import parse_budgets

    levels = parse_budgets(budgets, "--budgets")
    if not levels:
        raise typer.BadParameter("give at least one budget, e.g. 64,128", param_hint="--budgets")
    return levels


@experiment_app.command("study")
def experiment_study(
    out: Annotated[Path, typer.Option("--out", "-o", help="The Markdown report (figures go beside it).")] = Path("docs/demo-study.md"),
    workspace: Annotated[Path, typer.Option("--workspace", "-w", help="Profiles and results database of the study.")] = Path("docs/demo-study"),
    model: ModelOption = "demo",
    scope: Annotated[str, typer.Option(help="The routed phase: prefill or decode.")] = "decode",
    budget: Annotated[int, typer.Option(min=1, help="Budget (average capacity per layer) of the route, factorial and placement.")] = 64,
    budgets: Annotated[str, typer.Option(help="The sweep's budgets (average capacities per layer), comma-separated.")] = "16,32,64,128,256",
    k: Annotated[int, typer.Option("--k", min=1, help="Random count-matched placements.")] = 99,
    statistic: str = "dppl",
    allocation: Annotated[str, typer.Option(help="The factorial's allocated arm: entropy or ppl.")] = "ppl",
    baseline: Annotated[Optional[str], typer.Option(help="The factorial's homogeneous method (default: best mean profile score).")] = None,
    metric: MetricOption = "kl",
    samples: SamplesOption = 3,
    seed: int = 0,
    device: str = "cpu",
    backend: BackendOption = "local",
) -> None:
    """The paper's study at demo scale: profile, TopRank route, factorial, placement (K), sweep; writes a report."""
    import shlex

    from polykv.eval.study import StudySettings, run_study, write_report

    settings = StudySettings(model=model, scope=scope, budget=budget, budgets=tuple(_parse_budgets(budgets)),
                             placements=k, statistic=statistic, allocation=allocation, baseline=baseline,
                             metric=metric, samples_per_task=samples, seed=seed, backend=backend, device=device)
    result = run_study(settings, workspace, progress=lambda step: typer.echo(f"study: {step}", err=True))
    given = sys.argv[3:] if sys.argv[1:3] == ["experiment", "study"] else []
    command = "polykv experiment study " + shlex.join(given)
    typer.echo(f"wrote {write_report(result, out, command.strip())}")


@app.command("import-llama2c")
def import_llama2c_command(
    checkpoint: Path, tokenizer: Path, out: Annotated[Path, typer.Option("--out", "-o")]
) -> None:
    """Convert a llama2.c checkpoint (+ tok*.bin tokenizer) into a Hugging Face model directory."""
    from polykv.models import import_llama2c

    typer.echo(f"wrote {import_llama2c(checkpoint, tokenizer, out)}")


jobs_app = typer.Typer(no_args_is_help=True, help="Background jobs (what the web app starts): list, cancel, resume.")
app.add_typer(jobs_app, name="jobs")


@jobs_app.command("list")
def jobs_list(workspace: WorkspaceOption = DEFAULT_WORKSPACE) -> None:
    """Every job in the workspace, newest first, with its status and progress."""
    from polykv import jobs

    found, damaged = jobs.scan_jobs(workspace)
    rows = []
    for job in found:
        state = jobs.state(job, workspace)
        rows.append((job.id, job.kind, job.title, state.status, f"{state.fraction:.0%}", job.created[:19]))
    _table(("job", "kind", "title", "status", "done", "created"), rows)
    for bad in damaged:  # one line each; the valid jobs above are listed all the same
        typer.echo(f"damaged: {bad.path}: {bad.reason}")


@jobs_app.command("cancel")
def jobs_cancel(job_id: Annotated[str, typer.Argument(help="Job id.")], workspace: WorkspaceOption = DEFAULT_WORKSPACE) -> None:
    """Stop a running job (finished samples stay in the results database)."""
    from polykv import jobs

    job = jobs.load_job(workspace, job_id)
    signalled = jobs.cancel(job, workspace)  # signals only the job's own worker, and waits until it has exited
    note = "" if signalled else " (no running worker of this job: nothing was signalled)"
    typer.echo(f"{job_id}: {jobs.state(jobs.load_job(workspace, job_id), workspace).status}{note}")


@jobs_app.command("resume")
def jobs_resume(job_id: Annotated[str, typer.Argument(help="Job id.")], workspace: WorkspaceOption = DEFAULT_WORKSPACE) -> None:
    """Start a stopped, cancelled or failed job again; finished samples are not recomputed."""
    from polykv import jobs
    from polykv.errors import JobError

    job = jobs.load_job(workspace, job_id)
    if jobs.state(job, workspace).status == "finished":
        raise JobError(f"job {job_id} is finished: nothing to resume")
    process = jobs.start(job, workspace)  # JobError "still running ... cancel it first" while its worker runs
    typer.echo(f"{job_id}: started again in the background (pid {process.pid})")


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
        typer.echo(f"internal error (a bug in PolyKV): {exc.__class__.__name__}: {first_line(exc)}; "
                   "run again with POLYKV_DEBUG=1 for the traceback", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()

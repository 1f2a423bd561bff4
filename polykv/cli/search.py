"""`polykv search`: local search for a plan closer to FullKV than TopRank, with a held-out verdict.

Everything the command is given is checked before the weights load; the search itself is
`polykv.search` (the objective, the moves, the search and the report).
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from polykv import limits, question_protocol
from polykv.cli.common import (
    DEFAULT_WORKSPACE,
    DryRunOption,
    ModelOption,
    WorkspaceOption,
    _load_model,
    _profile_arg,
    _table,
    announce_cost,
)
from polykv.cli.progress import Progress
from polykv.eval.running.settings import COMPETENCE_THRESHOLD
from polykv.plan import Scope
from polykv.question_protocol import QuestionProtocol

PROFILE_HELP = (
    "The profile that ranks the moves and gives TopRank: a key in <workspace>/profiles, a profile directory, or "
    "'auto' (the searched scope on 8 text sequences of --max-tokens; with --sources, the workload's own "
    "calibration samples), computed once and reused."
)
SOURCES_HELP = (
    "With --objective answer_nll: the workload, comma-separated ruler:TASK[@LENGTH] (one length) or "
    "longbench:PATH/<task>.jsonl; the search scores its calibration samples and the verdict its held-out ones."
)


def search(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for report.json, report.md and the plans.")],
    budget: Annotated[
        list[int], typer.Option("--budget", "-b", min=2, help="Average capacity per layer; repeat for several.")
    ],
    model: ModelOption = "demo",
    scope: Scope = Scope.DECODE,
    profile: Annotated[str, typer.Option(help=PROFILE_HELP)] = "auto",
    evaluations: Annotated[
        int,
        typer.Option(
            min=1,
            max=limits.EVALUATIONS,
            help="Plan executions (one plan on one sequence) the search may run per budget.",
        ),
    ] = 800,
    seed: int = 0,
    search_sequences: Annotated[
        int, typer.Option(min=1, max=limits.SEQUENCES, help="Calibration sequences the search scores on.")
    ] = 16,
    held_out: Annotated[int, typer.Option(min=2, max=limits.SEQUENCES, help="Held-out sequences of the verdict.")] = 48,
    max_tokens: Annotated[int, typer.Option(min=16, help="Tokens per sequence (clipped to the context).")] = 512,
    candidates: Annotated[int, typer.Option(min=1, max=limits.CANDIDATES, help="Neighbours tried per round.")] = 8,
    metric: Annotated[
        str | None,
        typer.Option(
            "--objective",
            "--metric",
            help="What the search minimises: kl (KL(FullKV || plan)) or dppl on text, or answer_nll on a workload "
            "(--sources). Default: kl, answer_nll with --sources.",
        ),
    ] = None,
    sources: Annotated[str | None, typer.Option(help=SOURCES_HELP)] = None,
    transfer: Annotated[
        str | None,
        typer.Option(
            help="Workload tasks judged but never searched on (same suite and length), e.g. ruler:vt,ruler:fwe."
        ),
    ] = None,
    text_profile: Annotated[
        str | None,
        typer.Option(help="With a workload: a text profile (key or directory) whose TopRank plan joins the verdict."),
    ] = None,
    b_cal: Annotated[
        int | None, typer.Option("--b-cal", min=1, help="The workload profile's calibration capacity.")
    ] = (None),
    question: Annotated[
        QuestionProtocol, typer.Option(help=f"With a workload, where the question goes: {question_protocol.HELP}")
    ] = (QuestionProtocol.IN_PROMPT),
    competence: Annotated[
        float,
        typer.Option(
            min=0,
            max=100,
            help="With a workload: FullKV's accuracy (%) on a pilot of the held-out samples under which a task "
            "leaves the verdict.",
        ),
    ] = COMPETENCE_THRESHOLD,
    workers: Annotated[
        int, typer.Option(min=1, max=limits.WORKERS, help="Processes sharing the verdict's samples.")
    ] = 1,
    accuracy_samples: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=limits.SAMPLES_PER_TASK,
            help="With a workload: held-out samples per task that also generate (default: all).",
        ),
    ] = None,
    report: Annotated[Path | None, typer.Option(help="Where the Markdown report goes (default: <out>/report.md).")] = (
        None
    ),
    statistic: Annotated[str, typer.Option(help="Profile statistic that ranks moves and TopRank: dppl or cosine.")] = (
        "dppl"
    ),
    device: str = "cpu",
    backend: Annotated[
        str,
        typer.Option(
            help="Where candidates execute: local (one after another, in this process) or ray (each rung's "
            "executions as parallel Ray tasks; a local cluster starts unless Ray is initialised)."
        ),
    ] = "local",
    workspace: WorkspaceOption = DEFAULT_WORKSPACE,
    dry_run: DryRunOption = False,
) -> None:
    """Search plans at a fixed total capacity for the lowest divergence from FullKV, starting from TopRank
    and the best homogeneous plan; compare on held-out text with paired bootstrap intervals."""
    from polykv.errors import SettingsError

    report_path = report
    from polykv.models import config_dimensions
    from polykv.profile.store import STATISTICS
    from polykv.search.objective import METRICS
    from polykv.search.parallel import BACKENDS

    if backend not in BACKENDS:
        raise SettingsError(f"--backend must be one of {', '.join(BACKENDS)} (got {backend!r})")
    if backend == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise SettingsError("--backend ray needs Ray: pip install 'polykv[ray]'")
    if statistic not in ("cosine", "dppl"):  # what ranks a text profile's moves (a workload's: danswer, always)
        raise SettingsError(f"--statistic must be cosine or dppl (got {statistic!r})")
    if metric is None:
        metric = "answer_nll" if sources is not None else "kl"
    if sources is not None and metric != "answer_nll":
        raise SettingsError(f"a workload search (--sources) minimises answer_nll, not --objective {metric}")
    if metric == "answer_nll":
        import inspect

        from polykv.cli.search_workload import search_workload

        given = locals()
        return search_workload(**{name: given[name] for name in inspect.signature(search_workload).parameters})
    if metric not in METRICS:
        raise SettingsError(
            f"--objective (--metric) must be one of {', '.join(METRICS)} or answer_nll (got {metric!r})"
        )
    workload_only = (
        ("--transfer", transfer),
        ("--text-profile", text_profile),
        ("--b-cal", b_cal),
        ("--accuracy-samples", accuracy_samples),
    )
    if question != QuestionProtocol.IN_PROMPT:
        workload_only += (("--question", question),)
    if competence != COMPETENCE_THRESHOLD:
        workload_only += (("--competence", competence),)
    for name, value in workload_only:
        if value is not None:
            raise SettingsError(f"{name} belongs to a workload search (--objective answer_nll --sources ...)")
    if statistic not in STATISTICS:
        raise SettingsError(f"--statistic must be one of {', '.join(STATISTICS)} (got {statistic!r})")
    if len(set(budget)) < len(budget):
        raise SettingsError(f"--budget lists a budget twice ({', '.join(map(str, budget))})")
    dims = config_dimensions(model)
    too_big = [b for b in budget if dims.context_length and b >= dims.context_length]
    if too_big:
        raise SettingsError(f"--budget {too_big[0]} is not below the model's context ({dims.context_length} tokens)")
    if out.exists() and not out.is_dir():
        raise SettingsError(f"--out {out} exists and is not a folder")
    loaded = profile if profile == "auto" else _profile_arg(profile, workspace, model)  # refused before the load

    from polykv.eval.launch.work import profile_work, text_search_work
    from polykv.models import context_length, num_layers
    from polykv.profile.corpus import default_sources
    from polykv.search.hooks import SearchHooks
    from polykv.search.text.report import difference_text
    from polykv.search.text.run import AUTO_PROFILE_SEQUENCES, TextSearchSettings, run_text_search

    started = time.perf_counter()
    hf_model, tokenizer = _load_model(model, device)
    tokens = min(max_tokens, context_length(hf_model) or max_tokens)
    work = text_search_work(
        search_sequences, held_out, tokens, evaluations, len(budget), scope.value, default_sources(model)
    )
    if profile == "auto":
        work = work + profile_work(
            default_sources(model), AUTO_PROFILE_SEQUENCES, tokens, scope.phases, num_layers(hf_model)
        )
    announce_cost(work.loaded(0), model, device, hf_model, dry_run)
    settings = TextSearchSettings(
        scope=scope,
        budgets=tuple(budget),
        evaluations=evaluations,
        seed=seed,
        search_sequences=search_sequences,
        held_out=held_out,
        max_tokens=max_tokens,
        candidates=candidates,
        metric=metric,
        statistic=statistic,
    )
    args = sys.argv[1:]
    command = "polykv " + " ".join(shlex.quote(a) for a in args) if "search" in args else ""
    with Progress() as bars:
        bars.note(
            f"search: {'the searched scope profiled first, then ' if profile == 'auto' else ''}TopRank and "
            f"the homogeneous plans on {search_sequences} search sequences, then up to {evaluations} executions "
            f"per budget, then the verdict on {held_out} held-out sequences"
        )

        def starting(b: int) -> None:
            bars.start(f"search b{b}", unit="execution")
            if not bars.enabled:
                bars.note(f"search: budget {b}")

        found, plans = run_text_search(
            hf_model,
            tokenizer,
            model,
            loaded,
            settings,
            profiles=workspace / "profiles",
            out=out,
            markdown_file=report_path,
            command=command,
            backend=backend,
            device=device,
            started=started,
            hooks=SearchHooks(
                stage=lambda stage: bars.start("profile") if stage == "profile" else None,
                profile=bars.fraction,
                budget=starting,
                step=bars.sample,
            ),
        )
    for entry in found.budgets:
        verdict = entry.verdict
        typer.echo(
            f"\nbudget {entry.budget}: held-out, {verdict.sequences} sequences "
            f"(FullKV perplexity {verdict.fullkv_ppl:.3f}); search {entry.search.evaluations} executions, "
            f"{len(entry.search.moves)} moves, {entry.seconds:.0f} s"
        )
        _table(
            ("role", "plan", "kl", "top1", "ppl"),
            [(role, p.name, f"{p.kl:.5f}", f"{p.top1:.4f}", f"{p.ppl:.4f}") for role, p in verdict.plans.items()],
        )
        typer.echo("")
        _table(
            ("A - B", "metric", "difference [95% CI]", "A is"),
            [
                (f"{c.a} - {c.b}", c.metric, difference_text(c), c.verdict)
                for c in verdict.contrasts
                if c.a == "searched"
            ],
        )
    if found.first_candidate_seconds is not None:
        typer.echo(
            f"\nfirst candidate scored {found.first_candidate_seconds:.1f} s after the command started "
            "(model load included)"
        )
    typer.echo(f"\nwrote {out / 'report.json'}, {out / 'report.md'} and {len(plans)} plan(s)")

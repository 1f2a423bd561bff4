"""The study's Markdown report (`polykv.eval.study.run.run_study` makes what it renders; figures in
`polykv.eval.study.figures`).

Every number is read from the study's result (the experiments' reports and the task scores of the runs
they cite); the report prints each run id beside its number, what ran (tasks, samples, modes, the anchor and
the rules that chose them), the timing of each step, and what the numbers say in sentences whichever way
they come out. Each verdict names the test it rests on (the sample-level sign-flip test) and the smallest
difference that test could detect; the paper's interval over tasks is printed beside it. The paper's
Tables 2, 4 and 5 (`polykv.eval.study.paper`) stand beside ours in the same shape.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

from polykv.eval.statistics.render import number
from polykv.eval.statistics.samples import detectable
from polykv.eval.study.figures import figures, niah_curves
from polykv.eval.study.sections import (
    accuracy_section,
    accuracy_words,
    across,
    beside_the_paper,
    direction_word,
    evidence,
    factorial_section,
    gap_recovery,
    md_table,
    placement_section,
    sample_p_text,
    sweep_section,
    workload_section,
)
from polykv.files import atomic_write_text
from polykv.plan import Phase
from polykv.question_protocol import QuestionProtocol


# ---- sentences ----------------------------------------------------------------------------------------
def findings(result) -> list[str]:
    """What the numbers say, in sentences, whichever way they come out."""
    f = result.factorial.data
    metric, primary = f.metric, f.routing_uniform
    protocol = (
        "in the prompt" if QuestionProtocol.of(result.suite_settings).compresses_question else "after compression"
    )
    lines = [
        f"Routing under uniform allocation (the TopRank route vs {result.baseline} in every {f.scope} layer, both "
        f"at {f.budget} tokens per layer: like with like, one scope, the question {protocol}): {metric} difference "
        f"{number(primary.difference, '+.4f')} "
        f"({direction_word(f)} is better): {evidence(primary)}; the route wins {primary.wins}, ties {primary.ties} "
        f"and loses {primary.losses} of {primary.tasks} tasks, and {primary.loto_better} of "
        f"{len(primary.leave_one_out)} leave-one-task-out values favour it.",
        f"Allocation ({f.allocation} vs uniform) under TopRank routing: "
        f"{number(f.allocation_routed.difference, '+.4f')}, {evidence(f.allocation_routed)}; interaction "
        f"{number(f.interaction.difference, '+.4f')}, {evidence(f.interaction)}.",
    ]
    p = result.placement.data
    versus = p.guided_minus_mean_sample
    test = (
        f" (sample level {number(versus.difference, '+.4f')}, sign-flip p = {number(versus.p)} over "
        f"{versus.samples} samples, detects {detectable(versus.mde)})"
        if versus is not None
        else ""
    )
    lines.append(
        f"Placement control ({p.metric}): over {p.k} random count-matched placements the profile score "
        f"S(rho) and the suite score correlate with Spearman {number(p.spearman, '+.3f')} (one-sided "
        f"permutation p = {number(p.spearman_p)}); the guided route ranks {p.guided_rank} of {p.k + 1} (p = "
        f"{number(p.guided_p, '.3f')}), {number(p.guided_minus_mean, '+.4f')} {p.metric} from the random "
        f"mean{test}."
    )
    for phase, report in result.sweeps.items():
        s = report.data
        if s.matched:
            verdicts = [
                f"{b}: vs {versus.baseline} {number(versus.difference, '+.4f')}, {versus.verdict} "
                f"({sample_p_text(versus)})"
                for b, versus in s.versus_matched.items()
            ]
            lines.append(
                f"Sweep of the {phase} route, route-uniform against the best method alone in the {phase} scope at each "
                f"budget (like with like, the question {protocol}; verdicts by the sample-level sign-flip test): "
                + "; ".join(verdicts)
                + "."
            )
        verdicts = [
            f"{b}: vs {versus.baseline}{across(s, versus.baseline)} {number(versus.difference, '+.4f')}, "
            f"{versus.verdict} ({sample_p_text(versus)})"
            for b, versus in s.versus_envelope.items()
        ]
        lines.append(
            f"Sweep of the {phase} route, route-uniform against the best standalone baseline under its own protocol "
            "(the paper's envelope"
            + ("" if s.matched else f"; no method alone in the {phase} scope ran beside it in this study")
            + "): "
            + "; ".join(verdicts)
            + "."
        )
        recovered = gap_recovery(s)
        shown = [f"{b}: {v:+.1%}" for b, v in recovered.items() if v is not None]
        if shown:
            lines.append(
                f"Share of the best baseline's gap to FullKV the {phase} route closes (against the envelope, "
                "each baseline under its own protocol): " + "; ".join(shown) + "."
            )
        for what, table in (("the best method alone in its scope", s.double_matched), ("the envelope", s.double)):
            if table:
                lines.append(
                    f"{phase} route at b vs {what} at 2b: "
                    + "; ".join(
                        f"{b}: {d.match}{across(s, d.baseline)} ({number(d.difference, '+.4f')}, {sample_p_text(d)})"
                        for b, d in table.items()
                    )
                    + "."
                )
    for name, report in result.accuracy.items():
        if name == "factorial":
            contrast = report.data.routing_uniform
            lines.append(
                f"Accuracy beside it ({result.accuracy_settings.get('samples_per_task')} samples per task, "
                "generating): "
                f"routing under uniform allocation {number(contrast.difference, '+.2f')} points, "
                f"{evidence(contrast)}."
            )
    return lines


# ---- what ran -------------------------------------------------------------------------------------------
def what_ran(result) -> list[str]:
    """The settings as they ran (not as asked): the tasks kept, the samples chosen, the modes and the anchor."""
    s, suite = result.settings, result.suite_settings
    tasks = suite.get("tasks") or []
    lines = [
        f"Model `{s.model}`; primary workload `{s.suite}` ({', '.join(tasks)}"
        + (f" at {suite['length']} tokens" if "length" in suite else "")
        + f"), {suite.get('samples_per_task')} samples per task"
        + (f", mode {suite['mode']}" if "mode" in suite else "")
        + f"; metric **{result.factorial.data.metric}**; seed {s.seed}.",
        f"Routed phase {s.scope} at {s.budget} tokens per layer; TopRank by {s.statistic}; the factorial's allocated "
        f"arm {s.allocation}; sweep budgets {', '.join(map(str, s.budgets))}; swept routes: {', '.join(s.swept)}.",
        f"Anchor of the factorial: {result.anchor_rule}.",
    ]
    if result.competence is not None:
        c = result.competence
        lines.append(f"Competence rule: {c.rule()}. Left out: {c.excluded_text()}.")
    if result.sample_plan is not None:
        plan = result.sample_plan
        target = f"target {plan.target_mde:g}" if plan.target_mde is not None else "no target"
        timed = (
            "as given (--sample-seconds: the time an earlier run of this study measured)"
            if result.settings.sample_seconds is not None
            else "here"
        )
        lines.append(
            f"Samples per task chosen from the pilot: {plan.samples_per_task} ({plan.reason}; {target}; one sample "
            f"with every plan that runs at this count takes {plan.seconds_per_sample:.1f} s {timed}, counting "
            f"{result.settings.workers} worker process(es) in parallel); expected minimal detectable macro difference "
            f"{plan.expected_mde:.4g}."
        )
    placing = result.placement_settings
    lines.append(
        f"Placement control: K = {result.placement.data.k} on `{s.placement_suite or s.suite}` "
        f"({placing.get('samples_per_task')} samples per task"
        + (f", mode {placing['mode']}" if "mode" in placing else "")
        + f"), metric {result.placement.data.metric}."
    )
    if result.accuracy_settings:
        acc = result.accuracy_settings
        lines.append(
            f"Accuracy beside the primary metric: the factorial's plans, the routes, FullKV and the envelope's "
            f"baselines generating on {acc['samples_per_task']} samples of each task ({accuracy_words(s.suite)})."
        )
    if not s.sweep_ppl:
        lines.append(
            "The sweep has no route-ppl row (--no-sweep-ppl): its PPL allocation is measured in the factorial."
        )
    return lines


# ---- the report ---------------------------------------------------------------------------------------
def _reused(result) -> str:
    """What the wall time covers when the database already held runs this study cites."""
    from polykv.eval.running.suite_runner import SUITES

    reused, cited = result.runs_reused
    if result.settings.replay:
        made = ", ".join(str(r["suite"]) for r in result.revisions) or "unknown"
        now = SUITES[result.settings.suite].REVISION
        return (
            f" Rendered again from its database (--replay): nothing was run; every run it cites was read from the "
            "database (the newest finished run of each plan and settings, whatever code revision made it: here the "
            f"{result.settings.suite} suite at revision {made}; this version's is {now}), so the wall time is this "
            "rendering's, and the statistics and sentences are this version's."
        )
    if not reused:
        return ""
    every = "every run" if reused == cited else f"{reused} of the {cited} runs"
    return (
        f" The database already held {every} of the factorial and the sweeps this report cites (found by their ids, "
        "not run again): the wall time is this rendering's, not that of the runs."
    )


def _describe(result) -> str:
    s = result.settings
    if s.suite == "fidelity":
        return "the fidelity suite (next-token agreement with FullKV on held-out text)"
    settings = result.suite_settings
    chat = {True: "in the model's chat template", False: "without a chat template", None: ""}[result.chat_template]
    length = f" at {settings['length']} tokens" if "length" in settings else ""
    return (
        f"{s.suite} ({', '.join(settings.get('tasks') or [])}{length}, {settings.get('samples_per_task')} samples per "
        f"task, prompts {chat})"
    )


def write_report(result, path: Path, command: str = "") -> Path:
    """Write the Markdown report at `path` and its figures in `<path without .md>/` (written, then renamed)."""
    from polykv.routing import route_confidence

    path = Path(path)
    drawn = figures(result, path.with_suffix(""))
    folder = path.with_suffix("").name
    s, profile = result.settings, result.profile
    meta, extra = profile.meta, profile.metadata  # typed fields; the rest (sequence_length, seconds, spec)
    store = result.store_path
    title = "PolyKV demo study" if s.model == "demo" else f"PolyKV study on {s.model}"
    lines = [
        f"# {title}: should every layer use the same KV eviction method?",
        "",
        f"The paper's protocol (profile, TopRank route, routing x allocation factorial, placement control with "
        f"K = {result.placement.data.k}, budget sweep) on the {meta.num_layers}-layer model `{s.model}` and "
        f"{_describe(result)}. Generated by a real run of",
        "",
        f"```bash\n{command or 'polykv experiment study'}\n```",
        "",
        f"on {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}, {platform.machine()}, "
        f"{os.cpu_count()} CPU cores, backend `{s.backend}`{', runs of a suite batched together' if s.batched else ''}."
        " Wall time: "
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in result.seconds.items())
        + f"; total {sum(result.seconds.values()) / 60:.1f} min."
        + _reused(result),
        "",
        f"Every number below is a run in the results database `{store}` (SQLite; `polykv runs --workspace "
        f"{store.parent}` lists them, `polykv runs show RUN --workspace {store.parent}` lists a run's samples with "
        f"what the model answered, `polykv compare RUN_A RUN_B --samples --workspace {store.parent}` recomputes any "
        "contrast and shows where two runs' answers differ); run ids are printed beside the numbers. Verdicts rest on "
        "a sign-flip permutation test over the paired samples (tasks fixed), with the smallest difference it could "
        "detect at 80% power; the paper's 95% paired bootstrap interval over tasks is printed beside it.",
        "",
        "## What ran",
        "",
        *[f"- {line}" for line in what_ran(result)],
        "",
        "## What it shows",
        "",
        *[f"- {line}" for line in findings(result)],
        "",
        *workload_section(result),
        "## Profile",
        "",
        f"Profile `{profile.key}` (`{profile.path}`): {meta.corpus.num_sequences} calibration "
        f"sequences of {extra.get('sequence_length')} tokens from "
        f"{', '.join(extra['corpus'].get('spec', {}).get('sources', []))}, "
        f"b_cal = {meta.b_cal}, scopes {', '.join(meta.scopes)}, computed in {extra.get('seconds')} s. FullKV "
        f"perplexity of the calibration text per source: "
        + ", ".join(f"{k} {v:.2f}" for k, v in meta.fullkv_ppl.items())
        + ".",
        "",
        f"![profile]({folder}/{drawn['profile']})",
        "",
    ]
    for phase in (Phase(p) for p in meta.scopes):
        lines += [
            f"TopRank by {s.statistic} in {phase.value}, with the winner's margin over the runner-up and how often "
            f"it still wins when the calibration sequences are resampled (1,000 bootstrap replicates):",
            "",
            md_table(route_confidence(profile, phase, s.statistic)),
            "",
        ]
    lines += ["## The TopRank routes", ""]
    for phase, route in result.routes.items():
        methods = [layer[Phase(phase)].method for layer in route.layers]
        lines += [
            f"`{route.name}`: "
            + ", ".join(f"L{i} {m}" for i, m in enumerate(methods))
            + f" ({phase} phase; the other phase keeps everything).",
            "",
        ]
    lines += factorial_section(result)
    lines += placement_section(result, folder, drawn)
    for index, (phase, report) in enumerate(result.sweeps.items(), start=1):
        lines += sweep_section(index, phase, report, folder, drawn[f"sweep {phase}"], index == 1)
    lines += accuracy_section(result)
    curves = niah_curves(result)
    if curves is not None:
        lines += [
            "## Needles by method and budget",
            "",
            f"Mean {result.sweep.data.metric} over the niah tasks of each series of the {s.scope} route's sweep "
            "(baselines under their own protocols), from the same runs:",
            "",
            md_table(curves, "{:.3f}"),
            "",
            f"![niah]({folder}/{drawn['niah']})",
            "",
        ]
    lines += beside_the_paper(result)
    lines += [
        "<details><summary>The study's settings as given</summary>",
        "",
        json.dumps(s.to_dict()),
        "",
        "</details>",
    ]
    return atomic_write_text(path, "\n".join(lines) + "\n")

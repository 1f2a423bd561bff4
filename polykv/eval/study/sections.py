"""The study report's tables, section by section: the workload check, the factorial beside the paper's Table 2,
the placement control beside its Table 4, each sweep beside its Table 5, accuracy beside the primary metric,
and a summary beside the paper. `polykv.eval.study.report` assembles them with the sentences."""

from __future__ import annotations

import pandas as pd

from polykv.eval.experiments.report import Contrast, FactorialData, PlacementData, SweepData
from polykv.eval.statistics.render import NOT_ESTIMABLE, format_p, interval, markdown_table, number
from polykv.eval.statistics.samples import detectable
from polykv.eval.study import paper


def md_table(frame: pd.DataFrame, floats: str = "{:.4f}") -> str:
    """A data frame as a Markdown table (pandas' to_markdown needs the `tabulate` package)."""
    return "\n".join(markdown_table(list(frame.columns), list(frame.itertuples(index=False)), floats))


def ci_text(contrast: Contrast, digits: int = 4) -> str:
    spec = f"+.{digits}f"
    return f"{number(contrast.difference, spec)} {interval(contrast.low, contrast.high, spec, bounded=True)}"


def evidence(contrast: Contrast) -> str:
    """A contrast's verdict with its test and power, then the paper's interval over tasks."""
    tasks = f"the paper's bootstrap over {contrast.tasks} tasks {ci_text(contrast)}"
    if contrast.task_mde is not None:
        tasks += f" (detects {contrast.task_mde:.3g})"
    return f"{contrast.verdict_text}; {tasks}"


def gap_recovery(sweep: SweepData, label: str = "route-uniform") -> dict[int, float | None]:
    """Per budget, (route - envelope) / (FullKV - envelope): the share of the best baseline's gap to FullKV the
    route closes (None where FullKV is not better than the envelope, so there is no gap to close, or a score is
    undefined)."""
    full, sign = sweep.full.score, sweep.direction
    out: dict[int, float | None] = {}
    for b in sweep.budgets:
        best, route = sweep.envelope[b].score, sweep.scores[label][b]
        defined = None not in (full, best, route)
        out[b] = (route - best) / (full - best) if defined and sign * (full - best) > 0 else None
    return out


def across(sweep: SweepData, baseline: str) -> str:
    """ " (... across protocols)" when a sweep's baseline ran in other phases than the route, else ""."""
    protocol = sweep.protocols.get(baseline)
    if protocol is None or protocol.scope == sweep.scope:
        return ""
    return f" ({baseline} acts in {protocol.scope.replace('both', 'prefill and decode')}: across protocols)"


def direction_word(data: FactorialData | PlacementData | SweepData) -> str:
    return "higher" if data.direction > 0 else "lower"


def sample_p_text(contrast: Contrast) -> str:
    sample = contrast.sample
    if sample is None:
        return f"task bootstrap {ci_text(contrast)}"
    p = format_p(sample.p)
    return f"p = {p} over {sample.samples} paired samples, detects {detectable(sample.mde)}"


def accuracy_words(suite: str) -> str:
    """What a question suite's generated answers are scored by, and which samples a smaller count takes."""
    if suite == "longbench":
        return "LongBench's metric per task; a smaller count is another random subset"
    return "RULER's string-match score; a smaller count is the first samples"


def workload_section(result) -> list[str]:
    c = result.competence
    if c is None:
        return []
    rows = pd.DataFrame(
        [{"task": t, "FullKV accuracy (pilot)": v, "in the macro": t in c.kept} for t, v in c.fullkv.items()]
    )
    lines = ["## The workload, checked before any plan ran", "", f"Rule: {c.rule()}.", "", md_table(rows, "{:.1f}"), ""]
    plan = result.sample_plan
    if plan is not None:
        sds = pd.DataFrame([{"task": t, "SD of anchor - FullKV": v} for t, v in plan.pilot_sd.items()])
        lines += [
            f"Samples per task: {plan.samples_per_task}, because {plan.reason}. From the pilot's paired differences "
            f"(anchor - FullKV, {result.factorial.data.metric}): the target needs "
            f"{plan.for_target if plan.for_target is not None else 'no particular number'}, the time allowance affords "
            f"{plan.for_time if plan.for_time is not None else 'any number'}; expected minimal detectable macro "
            f"difference at 80% power {plan.expected_mde:.4g}.",
            "",
            md_table(sds),
            "",
        ]
    return lines


def _cells_table(data: FactorialData, anchor: str, scope: str, statistic: str) -> pd.DataFrame:
    cells = data.cells
    return pd.DataFrame(
        [
            {
                "routing policy": f"Homogeneous {anchor} ({scope}-only)",
                "uniform allocation": cells["homogeneous-uniform"].score,
                f"{data.allocation} allocation": cells["homogeneous-allocated"].score,
            },
            {
                "routing policy": f"Guided {statistic} route",
                "uniform allocation": cells["routed-uniform"].score,
                f"{data.allocation} allocation": cells["routed-allocated"].score,
            },
        ]
    )


def factorial_section(result) -> list[str]:
    f = result.factorial.data
    t2 = paper.TABLE_2
    ours = _cells_table(f, result.baseline, f.scope, f.statistic)
    theirs = pd.DataFrame(
        [
            {
                "routing policy": f"Homogeneous {t2['anchor']}" if routing == "homogeneous" else "Guided cosine route",
                "uniform allocation": t2["cells"][(routing, "uniform")],
                "PPL allocation": t2["cells"][(routing, "allocated")],
            }
            for routing in ("homogeneous", "routed")
        ]
    )
    routing = t2["routing"]
    lines = [
        "## Routing x allocation factorial (Table 2)",
        "",
        f"Ours: {f.metric} ({direction_word(f)} is better) at {f.budget} tokens per layer, run ids below.",
        "",
        md_table(ours),
        "",
        f"The paper's Table 2 ({paper.CITATION}), at {t2['budget']} tokens:",
        "",
        md_table(theirs),
        "",
        f"The paper's primary contrast: {routing['difference']:+.4f} {interval(routing['low'], routing['high'])} "
        f"(10,000 paired bootstrap replicates over 21 tasks), W/T/L {routing['wins']}/{routing['ties']}/"
        f"{routing['losses']}, every leave-one-task-out value positive ({t2['leave_one_out'][0]:+.4f} to "
        f"{t2['leave_one_out'][1]:+.4f}).",
        "",
        md_table(pd.DataFrame(result.factorial.rows)),
        "",
        *[f"- {line}" for line in result.factorial.lines],
        "",
    ]
    rank = anchor_rank(result)
    if rank:
        lines += [rank, ""]
    return lines


def anchor_rank(result) -> str:
    """Where the anchor stands among the standalone baselines of the primary sweep at the factorial's budget."""
    s, budget = result.sweep.data, result.factorial.data.budget
    if budget not in s.budgets or result.baseline not in s.baselines:
        return ""
    at_budget = {name: s.scores[name][budget] for name in s.baselines}
    if None in at_budget.values():
        return ""
    ranked = sorted(s.baselines, key=lambda name: -s.direction * at_budget[name])
    shown = ", ".join(f"{name} {at_budget[name]:.4f}" for name in ranked)
    return (
        f"The anchor {result.baseline} ranks {ranked.index(result.baseline) + 1} of {len(ranked)} among the standalone "
        f"baselines at {budget} under their own protocols (the sweep): {shown}."
    )


def placement_section(result, folder: str, drawn: dict) -> list[str]:
    p, t4 = result.placement.data, paper.TABLE_4
    scores = [r.score for r in p.random if r.score is not None]
    guided, sign = p.guided.score, p.direction
    at_least = NOT_ESTIMABLE if guided is None else str(sum(1 for v in scores if sign * v >= sign * guided))
    sd = float(pd.Series(scores).std(ddof=1)) if len(scores) > 1 else float("nan")
    table = pd.DataFrame(
        [
            ("Random controls", str(p.k), str(t4["random_controls"])),
            ("Guided score", number(guided), f"{t4['guided_score']:.4f}"),
            ("Random mean (sample SD)", f"{number(p.random_mean)} ({sd:.4f})",
             f"{t4['random_mean']:.4f} ({t4['random_sd']:.4f})"),
            ("Random range", interval(min(scores), max(scores), ".4f") if scores else NOT_ESTIMABLE,
             interval(*t4["random_range"], ".4f")),
            ("Guided minus random mean", number(p.guided_minus_mean, "+.4f"), f"{t4['guided_minus_mean']:+.4f}"),
            ("Random at least as good as guided", at_least, str(t4["random_at_least_guided"])),
            ("Guided rank", f"{p.guided_rank}/{p.k + 1}", t4["guided_rank"]),
            ("Spearman of S(rho) and score (one-sided p)",
             f"{number(p.spearman, '+.3f')} ({number(p.spearman_p)})",
             f"{t4['spearman']:+.3f} ({t4['spearman_p']:.4f})"),
        ],
        columns=["statistic", f"ours ({p.metric}, {direction_word(p)} is better)", "the paper (LongBench score)"],
    )  # fmt: skip
    return [
        "## Placement control (Table 4, Figure 4)",
        "",
        md_table(table),
        "",
        *[f"- {line}" for line in result.placement.lines],
        "",
        f"![placement]({folder}/{drawn['placement']})",
        "",
        "<details><summary>All placements (plan, run, score, S(rho))</summary>",
        "",
        md_table(pd.DataFrame(result.placement.rows)),
        "",
        "</details>",
        "",
    ]


def sweep_section(index: int, phase: str, report, folder: str, figure: str, first: bool) -> list[str]:
    data, notes = report.data, report.lines
    budgets = data.budgets
    series = data.baselines + data.matched + data.routes
    label = lambda name: name + across(data, name)  # noqa: E731 - a baseline acting in other phases says so
    matched = (
        [
            {
                "method / configuration": f"best alone in the {data.scope} scope",
                **{str(b): data.matched_envelope[b].baseline for b in budgets},
            },
            {
                "method / configuration": "route-uniform - best alone in scope",
                **{str(b): ci_text(data.versus_matched[b]) for b in budgets},
            },
        ]
        if data.matched
        else []
    )
    grid = pd.DataFrame(
        [{"method / configuration": "FullKV", **{str(b): data.full.score for b in budgets}}]
        + [{"method / configuration": label(n), **{str(b): data.scores[n][b] for b in budgets}} for n in series]
        + matched
        + [
            {"method / configuration": "best baseline (own protocols)",
             **{str(b): data.envelope[b].baseline for b in budgets}},
            {"method / configuration": "route-uniform - envelope",
             **{str(b): ci_text(data.versus_envelope[b]) for b in budgets}},
        ]
    )  # fmt: skip
    runs = pd.DataFrame([{"series": name, **{str(b): data.runs[name][b] for b in budgets}} for name in series])
    lines = [
        f"## {index}. Budget sweep of the {phase} route (Table 5)",
        "",
        f"`{data.route}`: {data.metric} ({direction_word(data)} is better) per average capacity; FullKV is "
        f"budget-independent (run `{data.full.run}`). The route acts in {data.scope} only; "
        + (
            f"each method alone in the {data.scope} scope is its like-with-like comparator, the baselines under "
            "their own protocols the paper's envelope."
            if data.matched
            else "the baselines run under their own protocols (the paper's envelope), so a baseline acting in other "
            "phases is compared across protocols (marked); no method alone in its scope ran beside them here."
        )
        + " The difference rows are the paper's bootstrap over tasks; the verdicts below rest on the sample-level "
        "test.",
        "",
        md_table(grid),
        "",
        *[f"- {line}" for line in notes],
        "",
        f"![sweep]({folder}/{figure})",
        "",
        "<details><summary>Run ids of the sweep</summary>",
        "",
        md_table(runs),
        "",
        "</details>",
        "",
    ]
    if first:
        theirs = pd.DataFrame(
            [{"method / configuration": "FullKV", **{str(b): paper.TABLE_5_FULLKV for b in paper.TABLE_5_BUDGETS}}]
            + [
                {"method / configuration": name, **dict(zip(map(str, paper.TABLE_5_BUDGETS), values))}
                for name, values in paper.TABLE_5.items()
            ]
        )
        lines += [f"The paper's Table 5 ({paper.CITATION}):", "", md_table(theirs), ""]
    return lines


def accuracy_section(result) -> list[str]:
    if not result.accuracy:
        return []
    acc = result.accuracy_settings
    lines = [
        "## Accuracy beside it",
        "",
        f"The factorial's plans, the route at every budget, FullKV and the baselines that make the primary metric's "
        f"envelope at some budget, generating ({accuracy_words(result.settings.suite)}, 0-100, higher is better) on "
        f"{acc['samples_per_task']} samples of each task kept: fewer plans and samples than the primary metric "
        "(generation costs far more than scoring the gold answer), so the minimal detectable differences are larger.",
        "",
    ]
    factorial = result.accuracy.get("factorial")
    if factorial is not None:
        lines += [md_table(pd.DataFrame(factorial.rows), "{:.2f}"), "", *[f"- {line}" for line in factorial.lines], ""]
    for name, report in result.accuracy.items():
        if name.startswith("sweep"):
            data = report.data
            grid = pd.DataFrame(
                [{"series": "FullKV", **{str(b): data.full.score for b in data.budgets}}]
                + [
                    {"series": s, **{str(b): data.scores[s][b] for b in data.budgets}}
                    for s in data.baselines + data.routes
                ]
                + [{"series": "route-uniform - envelope",
                    **{str(b): ci_text(data.versus_envelope[b], 2) for b in data.budgets}}]
            )  # fmt: skip
            lines += [f"Accuracy, {name}:", "", md_table(grid, "{:.2f}"), ""]
            lines += [f"- {line}" for line in report.lines if line.startswith(("budget", "2b:"))] + [""]
    return lines


def beside_the_paper(result) -> list[str]:
    """Our results beside the paper's, direction by direction (the units differ: its LongBench score, our metric)."""
    f, placed, t2, t4 = result.factorial.data, result.placement.data, paper.TABLE_2, paper.TABLE_4
    envelope = paper.table_5_envelope()
    margins = [paper.TABLE_5["Route-only"][i] - envelope[b][1] for i, b in enumerate(paper.TABLE_5_BUDGETS)]
    lines = [
        "## Beside the paper",
        "",
        f"The paper ({paper.CITATION}) measures a LongBench score; ours is {f.metric} on "
        f"{result.settings.suite}, so "
        "magnitudes do not compare, directions and decisions do.",
        "",
        f"- Routing under uniform allocation: the paper {t2['routing']['difference']:+.4f} "
        f"{interval(t2['routing']['low'], t2['routing']['high'])} over 21 tasks (excludes 0, narrowly); ours "
        f"{number(f.routing_uniform.difference, '+.4f')} {f.metric}: {f.routing_uniform.verdict_text}.",
        f"- Placement: the paper's guided route ranks {t4['guided_rank']} (p_MC = {t4['monte_carlo_p']:.3f}) and the "
        f"profile score correlates with the score (Spearman {t4['spearman']:+.3f}, p = {t4['spearman_p']:.4f}); ours "
        f"ranks {placed.guided_rank}/{placed.k + 1} with Spearman {number(placed.spearman, '+.3f')} (p = "
        f"{number(placed.spearman_p)}).",
        "- Sweep: the paper's route-only beats the best of the nine at every budget ("
        + ", ".join(f"{b}: {m:+.2f} vs {envelope[b][0]}" for b, m in zip(paper.TABLE_5_BUDGETS, margins))
        + "); ours: "
        + "; ".join(
            f"{b}: vs {versus.baseline}{across(result.sweep.data, versus.baseline)}, {versus.verdict} "
            f"({sample_p_text(versus)})"
            for b, versus in result.sweep.data.versus_envelope.items()
        )
        + ". (The paper's envelope is across protocols too: its TOVA is active in both prefill and decode, its route "
        "decode-only.)",
    ]
    for phase, report in result.sweeps.items():
        recovered = gap_recovery(report.data)
        lines.append(
            f"- Share of the best baseline's gap to FullKV the {phase} route closes: "
            + "; ".join(f"b = {b}: {'no gap' if v is None else f'{v:+.1%}'}" for b, v in recovered.items())
        )
    return lines + [""]

"""The verdict of a workload search (`polykv.search.workload.run`): its contrasts on held-out samples, the competence
rule on its tasks, and the KV memory its plans keep.

Each contrast is sample by sample (`polykv.eval.statistics.samples`: the sign-flip test, exact when few samples differ,
the interval that agrees with it, the minimal detectable difference) with per-sample wins, ties and losses; its
`matched` field says whether the two plans act in the same phases (like with like) or not (across protocols).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from polykv.eval.workloads.competence import COMPETENCE_THRESHOLD
from polykv.plan import Plan
from polykv.search.workload.report import FamilyVerdict, RoleMeans, SampleContrast, WorkloadReport

ROLES = ("searched", "toprank-workload", "toprank-text", "homogeneous", "envelope", "anchor", "tova")
# anchor: the homogeneous plan (same scope, uniform) of toprank-workload's majority method; tova: TOVA under its
# standalone protocol. The paper's Section 4.4 sets its RULER route against both (its matched SnapKV anchor and
# "standalone TOVA ... the strongest homogeneous performance reference").
VERDICT_METRICS = ("answer_nll", "score")  # score: the suite's accuracy (0-100)
FAMILIES = ("searched tasks", "transfer tasks")


def majority_method(plan: Plan, windows: Sequence[int | None] | None = None) -> str:
    """The method in most of the plan's active layer entries (ties: the first such method in layer order). On a
    hybrid model (`windows`) only the entries where the method acts count: a local layer whose capacity keeps
    its window evicts nothing, whatever method it names (TopRank's pick there is a tie among all of them)."""
    from polykv.kv_memory import window_bound

    bounds = [window_bound(w) for w in (windows or [None] * plan.num_layers)]
    entries = [(layer[phase], bound) for layer, bound in zip(plan.layers, bounds) for phase in plan.scope.phases]
    acting = [a.method for a, bound in entries if a.capacity is None or a.capacity < bound]
    methods = acting or [a.method for a, _ in entries]
    return max(dict.fromkeys(methods), key=methods.count)


def _family_scores(scores: Mapping[str, Mapping[str, float]], tasks: Sequence[str]) -> dict[str, dict[str, float]]:
    return {task: dict(scores[task]) for task in tasks if task in scores}


def contrast(a, b, metric: str, seed: int = 0) -> dict[str, Any]:
    """a vs b on paired samples: the sample-level test, its interval and MDE, and W/T/L (`SampleContrast`'s
    fields)."""
    from polykv.eval.statistics.contrast import sample_wins, verdict
    from polykv.eval.statistics.samples import sample_test

    test = sample_test(a, b, seed=seed)
    wins, ties, losses = sample_wins(a, b, metric)
    finite = lambda x: None if x != x or x in (math.inf, -math.inf) else x  # noqa: E731 - JSON: no NaN, no inf
    return {
        "metric": metric,
        "difference": finite(test.difference),
        "low": finite(test.low),
        "high": finite(test.high),
        "p": test.p_value,
        "exact": test.exact,
        "agrees": test.agrees,
        "mde": finite(test.mde),
        "samples": test.samples,
        "differing": test.differing,
        "tasks": test.tasks,
        "wins": wins,
        "ties": ties,
        "losses": losses,
        "verdict": verdict(test.difference, metric, test.significant()),
    }


# The contrasts of the verdict, (A, B, kind), A - B. "primary": the searched plan against the best homogeneous plan
# of its own scope and question protocol (like with like); "secondary": the other constructions of the same scope;
# "section 4.4": the paper's RULER shape, the workload route against its majority method's homogeneous anchor and
# against standalone TOVA; "envelope": against the best of the nine baselines, each under its own protocol. Whether
# a contrast compares plans of the same scope is said by its `matched` field, from the plans themselves.
CONTRASTS = (
    ("searched", "homogeneous", "primary"),
    ("toprank-workload", "homogeneous", "secondary"),
    ("toprank-text", "homogeneous", "secondary"),
    ("searched", "toprank-workload", "secondary"),
    ("searched", "toprank-text", "secondary"),
    ("toprank-workload", "anchor", "section 4.4"),
    ("toprank-workload", "tova", "section 4.4"),
    ("searched", "envelope", "envelope"),
    ("toprank-workload", "envelope", "envelope"),
    ("toprank-text", "envelope", "envelope"),
    ("homogeneous", "envelope", "envelope"),
)


def verdict(
    store,
    run_ids: Mapping[str, Mapping[str, str]],
    families: Mapping[str, Sequence[str]],
    seed: int = 0,
    scopes: Mapping[str, str] | None = None,
) -> dict[str, FamilyVerdict]:
    """Per family of tasks: each role's mean (macro over tasks) in each metric, and the contrasts of `CONTRASTS`
    whose two roles ran (two roles of one plan give no contrast). `run_ids`: {metric: {role: run}};
    `scopes`: {role: the plan's scope}, which says whether a contrast is matched."""
    from polykv.eval.comparing.compare import macro_average, sample_scores

    out = {}
    roles = [r for r in (*ROLES, "fullkv") if r in run_ids["answer_nll"]]
    pairs = [
        (a, b, kind)
        for a, b, kind in CONTRASTS
        if a in roles and b in roles and run_ids["answer_nll"][a] != run_ids["answer_nll"][b]
    ]
    for family, tasks in families.items():
        if not tasks:
            continue
        scores = {
            metric: {role: _family_scores(sample_scores(store, run_ids[metric][role], metric), tasks) for role in roles}
            for metric in VERDICT_METRICS
        }
        means = {
            role: RoleMeans(
                **{
                    metric: macro_average({t: sum(v.values()) / len(v) for t, v in scores[metric][role].items() if v})
                    for metric in VERDICT_METRICS
                }
            )
            for role in roles
        }
        out[family] = FamilyVerdict(
            tasks=list(tasks),
            means=means,
            contrasts=[
                SampleContrast(
                    a=a,
                    b=b,
                    kind=kind,
                    matched=scopes is None or scopes.get(a) == scopes.get(b),
                    **contrast(scores[m][a], scores[m][b], m, seed),
                )
                for a, b, kind in pairs
                for m in VERDICT_METRICS
            ],
        )
    return out


def competent_families(
    searched: Sequence[str],
    transfer: Sequence[str],
    fullkv_accuracy: Mapping[str, float],
    threshold: float = COMPETENCE_THRESHOLD,
) -> dict[str, list[str]]:
    """The verdict's families of tasks under the competence rule: a task (searched or transfer) on which FullKV's
    held-out accuracy is under `threshold` is at the floor, where no plan can be told from another by accuracy
    and answer_nll measures an answer the model cannot give: it leaves the verdict (the report says so)."""
    keep = lambda tasks: [t for t in tasks if fullkv_accuracy.get(t, 100.0) >= threshold]  # noqa: E731
    return {FAMILIES[0]: keep(searched), FAMILIES[1]: keep(transfer)}


def rejudge(report: WorkloadReport, store) -> WorkloadReport:
    """The report (a copy) with every budget's verdict computed again from its runs in `store` (the current
    statistics and the competence rule), for a report saved by an earlier version; the runs are not run again."""
    samples = report.samples
    threshold = report.competence.threshold
    families = competent_families(samples.tasks, samples.transfer, report.fullkv_accuracy, threshold)
    budgets = []
    for entry in report.budgets:
        scopes = {role: plan.scope.value for role, plan in entry.plans.items()}
        again = verdict(store, entry.runs, families, report.seed, scopes)
        budgets.append(entry.model_copy(update={"verdict": again}))
    return report.model_copy(update={"budgets": budgets, "rejudged": True})


__all__ = [
    "CONTRASTS",
    "FAMILIES",
    "ROLES",
    "VERDICT_METRICS",
    "competent_families",
    "contrast",
    "majority_method",
    "rejudge",
    "verdict",
]

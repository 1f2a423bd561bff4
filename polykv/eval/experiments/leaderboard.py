"""The methods leaderboard: every method alone in one scope (the same method and capacity in every layer of the
scope's phases) at several budgets, on one suite and question protocol, each against reference methods at the same
budget (TOVA and the random control by default), sample by sample.

Per method and budget: the macro-average over tasks of each metric (answer_nll first: the gold answer's mean NLL
per token; answer_match, its teacher-forced greedy match; RULER's string-match `score` when the runs generated).
Per contrast: the sign-flip test over the paired samples (exact up to 20 differing samples, else `PERMUTATIONS`
random flips, enough that a p near 0.05 is not a coin toss of the draw), its 95% interval and the smallest
difference it detects at 80% power, per-sample wins, ties and losses, and Holm's correction over the contrast's
family: every method at every budget against one reference in one metric (the intervals are the test's at 95%, not
adjusted). A method with its own layer-budget rule (PyramidKV, CAKE) splits each budget by it (native allocation),
since that rule is part of the method; the others hold the budget in every layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from polykv.eval.comparing.compare import macro_average, metrics_of
from polykv.eval.experiments.experiment_runner import ExperimentRunner
from polykv.eval.experiments.report import (
    BoardContrast,
    BoardEntry,
    LeaderboardData,
    QuestionContrast,
    Report,
    SampleLevel,
)
from polykv.eval.results.kv_measured import equal_kv
from polykv.eval.statistics.contrast import direction, sample_wins, verdict
from polykv.eval.statistics.samples import paired_differences, sample_test, sign_flip_p
from polykv.eval.statistics.tasks import holm
from polykv.methods import REGISTRY, for_phase, params_that_fit
from polykv.plan import FULL, Plan, Scope
from polykv.question_protocol import QuestionProtocol

# what a leaderboard reports when its runs have it, the primary first: the gold answer's NLL, its teacher-forced greedy
# match (with the whole gold answer, a lower bound of RULER's string match) and the generated string match
METRICS = ("answer_nll", "answer_match", "score")
REFERENCES = ("tova", "random")
PERMUTATIONS = 200_000
ALPHA = 0.05


def board_methods(scope: Scope | str) -> list[str]:
    """Every method that runs in all of the scope's phases, in registry order."""
    phases = Scope(scope).phases
    return [m for m in REGISTRY if m != FULL and all(m in for_phase(p) for p in phases)]


def _key(method: str, budget: int) -> str:
    return f"{method}@{budget}"


def leaderboard_plans(
    num_layers: int, methods: Sequence[str], budgets: Sequence[int], scope: Scope | str = Scope.PREFILL
) -> dict[str, Plan]:
    """{"full": FullKV, "<method>@<budget>": the method alone at that budget}: what a leaderboard runs."""
    scope = Scope(scope)
    usable = board_methods(scope)
    unknown = [m for m in methods if m not in usable]
    if unknown:
        raise ValueError(
            f"{', '.join(unknown)}: not a method that runs in every phase of the {scope.value} scope "
            f"(those are: {', '.join(usable)})"
        )
    if not budgets or any(b < 1 for b in budgets):
        raise ValueError(f"budgets must be positive whole numbers, got {list(budgets)}")
    plans = {FULL: Plan.homogeneous(FULL, None, num_layers)}
    for method in methods:
        native = REGISTRY[method].native_allocation  # its own layer-budget rule is part of the method
        for budget in budgets:
            plans[_key(method, budget)] = Plan.homogeneous(
                method,
                budget,
                num_layers,
                scope.value,
                params=params_that_fit(method, budget),
                allocation="native" if native else "fixed",
            )
    return plans


def check_choices(
    methods: Sequence[str], budgets: Sequence[int], references: Sequence[str], question_budget: int | None
) -> None:
    """One line (ValueError) for references outside the methods or a question budget outside the budgets."""
    missing = [r for r in references if r not in methods]
    if missing:
        raise ValueError(f"the references {', '.join(missing)} must be among the methods")
    if question_budget is not None and question_budget not in budgets:
        raise ValueError(f"the question protocol's budget {question_budget} must be one of the budgets")


def other_question(settings) -> QuestionProtocol:
    """The question protocol a suite's settings do not use (there are two)."""
    (other,) = set(QuestionProtocol) - {QuestionProtocol.of(settings)}
    return other


def leaderboard(
    runner: ExperimentRunner,
    methods: Sequence[str],
    budgets: Sequence[int],
    references: Sequence[str] = REFERENCES,
    scope: Scope | str = Scope.PREFILL,
    question_budget: int | None = None,
) -> Report:
    """Run (or find) every plan of `leaderboard_plans` together and compare each method with each reference.
    `question_budget` (one of `budgets`): also run the plans at that budget with the question protocol the settings
    do not use, and compare each with itself across the two on the same samples (`QuestionContrast`). Not only the
    question's place differs: after compression the question is kept in full beside the budget, while in the
    prompt it is compressed with the context. FullKV is the control (no difference but rounding)."""
    scope = Scope(scope)
    check_choices(methods, budgets, references, question_budget)
    if question_budget is not None and not hasattr(runner.settings, "question"):
        raise ValueError(f"the {runner.suite} suite has no question protocol to compare")
    plans = leaderboard_plans(runner.model.config.num_hidden_layers, methods, budgets, scope)
    runs = dict(zip(plans, runner.run_all(list(plans.values()))))
    metrics = [m for m in METRICS if m in metrics_of(runner.store, list(runs.values()))]
    if not metrics:
        raise ValueError(f"the runs report none of {', '.join(METRICS)}: score the suite in score or both mode")
    scores = {key: {m: runner.sample_scores(run, m) for m in metrics} for key, run in runs.items()}
    held = {key: runner.measured_kv(run) for key, run in runs.items()}

    def entry(key: str, method: str, budget: int | None) -> BoardEntry:
        means = {m: macro_mean(scores[key][m]) for m in metrics}
        kv = held[key]
        return BoardEntry(
            method=method,
            budget=budget,
            run=runs[key],
            plan=plans[key].name,
            allocation=plans[key].allocation,
            means=means,
            kv_entering=None if kv is None else kv.total_entering,
            kv_share=None if kv is None or not kv.fullkv_entering else kv.total_entering / kv.fullkv_entering,
        )

    entries = {(m, b): entry(_key(m, b), m, b) for m in methods for b in budgets}
    for reference in references:
        for metric in metrics:
            family = [(m, b) for m in methods for b in budgets if m != reference]
            pairs = [(_key(m, b), _key(reference, b), reference) for m, b in family]
            for (m, b), contrast in zip(family, family_contrasts(pairs, scores, held, metric, runner.seed)):
                entries[m, b].versus.append(contrast)
    dependence = []
    if question_budget is not None:
        keys = [FULL, *(_key(m, question_budget) for m in methods)]
        dependence = _question_dependence(runner, {k: plans[k] for k in keys}, runs, metrics[0])
    first = scores[FULL][metrics[0]]
    data = LeaderboardData(
        metric=metrics[0],
        direction=direction(metrics[0]),
        scope=scope.value,
        question=QuestionProtocol.of(runner.settings),
        budgets=list(budgets),
        methods=list(methods),
        references=list(references),
        metrics=metrics,
        samples={task: len(values) for task, values in first.items()},
        full=entry(FULL, FULL, None),
        entries=list(entries.values()),
        question_dependence=dependence,
    )
    return Report(_title(data), _rows(data), _lines(data), data)


def family_contrasts(pairs, scores, held, metric: str, seed: int) -> list[BoardContrast]:
    """One family of contrasts, Holm's correction over it: for each (a, b, reference name) in `pairs`, run a minus run
    b over their paired samples (`scores[key][metric]`: task -> sample -> value), with the KV each held (`held[key]`,
    measured) compared."""
    of = lambda key: scores[key][metric]  # noqa: E731
    tests = [contrast_test(of(a), of(b), seed) for a, b, _ in pairs]
    out = []
    for (a, b, reference), (test, p), p_holm in zip(pairs, tests, holm([p for _, p in tests])):
        wins, ties, losses = sample_wins(of(a), of(b), metric)
        out.append(
            BoardContrast(
                reference=reference,
                metric=metric,
                sample=sample_level(test, p),
                p_holm=p_holm,
                family=len(pairs),
                wins=wins,
                ties=ties,
                losses=losses,
                verdict=verdict(test.difference, metric, p_holm < ALPHA),
                equal_kv=equal_kv(held[a], held[b]),
            )
        )
    return out


def _question_dependence(runner: ExperimentRunner, plans: dict, runs: dict, metric: str) -> list[QuestionContrast]:
    """Each plan under the runner's question protocol against itself under the other, on the same samples."""
    other = other_question(runner.settings)
    twin = dataclasses.replace(runner, settings=dataclasses.replace(runner.settings, question=other))
    there = dict(zip(plans, twin.run_all(list(plans.values()))))
    pairs = {key: (runner.sample_scores(runs[key], metric), twin.sample_scores(there[key], metric)) for key in plans}
    tests = {key: contrast_test(a, b, runner.seed) for key, (a, b) in pairs.items()}
    family = [key for key in tests if key != FULL]  # FullKV evicts nothing: the control, outside the family
    adjusted = dict(zip(family, holm([tests[key][1] for key in family])))
    out = []
    for key, (a, b) in pairs.items():
        test, p = tests[key]
        wins, ties, losses = sample_wins(a, b, metric)
        method, _, budget = key.partition("@")
        out.append(
            QuestionContrast(
                method=method,
                budget=int(budget) if budget else None,
                metric=metric,
                here=macro_mean(a),
                other=macro_mean(b),
                sample=sample_level(test, p),
                p_holm=adjusted.get(key, p),
                family=len(family),
                wins=wins,
                ties=ties,
                losses=losses,
                verdict=verdict(test.difference, metric, adjusted.get(key, p) < ALPHA),
                run=there[key],
                other_question=other,
            )
        )
    return out


def macro_mean(samples: dict[str, dict[str, float]]) -> float:
    """The macro-average over tasks of each task's mean over its samples."""
    return macro_average({t: sum(v.values()) / len(v) for t, v in samples.items() if v})


def sample_level(test, p: float) -> SampleLevel:
    """The test as a report holds it, with the p it rests on (and the flips behind that p)."""
    level = SampleLevel.of(test)
    return level if test.exact else level.model_copy(update={"p": p, "permutations": PERMUTATIONS})


def contrast_test(a, b, seed: int):
    """The sample-level test of a - b, its p from `PERMUTATIONS` flips when not exact."""
    test = sample_test(a, b, seed=seed)
    p = test.p_value if test.exact else sign_flip_p(paired_differences(a, b), PERMUTATIONS, seed)
    return test, p


def _title(data: LeaderboardData) -> str:
    return (
        f"Methods leaderboard: {len(data.methods)} methods alone in the {data.scope} scope at budgets "
        f"{', '.join(map(str, data.budgets))}, question {data.question}"
    )


def _rows(data: LeaderboardData) -> list[dict]:
    rows = [{"method": FULL, "budget": None, **data.full.means}]
    for e in sorted(data.entries, key=lambda e: (e.budget, e.means[data.metric] * -data.direction)):
        row = {"method": e.method, "budget": e.budget, **e.means}
        for c in e.versus:
            if c.metric == data.metric:
                row[f"vs {c.reference}"] = c.sample.difference
                row[f"p Holm vs {c.reference}"] = c.p_holm
        rows.append(row)
    return rows


def _lines(data: LeaderboardData) -> list[str]:
    out = [f"samples per task: {', '.join(f'{t} {n}' for t, n in data.samples.items())}"]
    for reference in data.references:
        for metric in data.metrics:
            counts = {"better": 0, "worse": 0}
            family = 0
            for e in data.entries:
                for c in e.versus:
                    if c.reference == reference and c.metric == metric:
                        family = c.family
                        counts[c.verdict] = counts.get(c.verdict, 0) + 1
            out.append(
                f"against {reference} ({metric}, Holm over {family}): better {counts['better']}, "
                f"worse {counts['worse']}, no significant difference {family - counts['better'] - counts['worse']}"
            )
    return out

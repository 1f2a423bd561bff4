"""The allocation study: with one scorer fixed, does a published rule for splitting the budget beat the uniform
split, does a searched split beat every published rule, and does a head-level split add to a layer-level one?

Per scorer s (a method that keeps the top of a score: TOVA, SnapKV, KeyDiff, ...) and budget b (tokens per layer on
average, the prefill scope), the contenders hold the same total L x b and differ only in how it is split:
  uniform     b in every layer (`polykv.routing.rules`; on a hybrid model a local layer at most its window less one,
              the rest to the global layers: every rule here keeps that bound);
  pyramid     PyramidKV's layer rule;  squeeze  SqueezeAttention's, its similarity measured on calibration text;
  ppl         proportional to a profile's per-layer PPL sensitivity (the paper's allocation);
  cake        CAKE's preference, decided at prefill from the prompt (`allocation: cake`);
  adakv       uniform layers, each layer's budget split over its KV heads by Ada-KV's rule (safeguard 0.2);
  adakv+best  the layer rule that did best on the calibration samples, with Ada-KV's head split;
  searched    a capacity-only search (`polykv.search.local_search` with transfer moves alone, the method fixed) on
              the calibration samples, from uniform and from that best rule.
The calibration samples come from the workload's calibration split, never an evaluated one
(`polykv.search.workload.samples.draw_samples`, checked by prompt). Every contender and FullKV then run on the
evaluated samples together, sample by sample, and each contrast is the sign-flip test over the paired samples
with its MDE and wins/ties/losses; Holm's correction over two families: the primary (every layer or head rule
against uniform, same scorer and budget) and the secondary (adakv+best against its best rule; searched against
uniform and against the best rule). Each contender's KV entering the answer is measured from its cache, and a
contrast whose two sides held more than 1% apart says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from pydantic import Field

from polykv.eval.experiments.experiment_runner import ExperimentRunner
from polykv.eval.experiments.leaderboard import family_contrasts, macro_mean
from polykv.eval.experiments.report import BoardEntry, Count, Report, ReportData, Statistic, _Experiment
from polykv.eval.statistics.contrast import direction
from polykv.methods import REGISTRY, fit_params, params_that_fit
from polykv.plan import FULL, Plan
from polykv.question_protocol import QuestionProtocol

LAYER_RULES = ("uniform", "pyramid", "squeeze", "ppl", "cake")
CONTENDERS = (*LAYER_RULES, "adakv", "adakv+best", "searched")
PRIMARY = ("pyramid", "squeeze", "ppl", "cake", "adakv")  # each against uniform
METRIC = "answer_nll"


class SearchSummary(ReportData):
    """How a capacity-only search went on the calibration samples."""

    scorer: str
    budget: Count
    start: str  # the start it kept going from
    moves: list[str]
    evaluations: Count
    calibration: Statistic  # the searched plan's answer_nll on the calibration samples


class AllocationEntry(BoardEntry):
    """One contender: a scorer at a budget under one split (`contender`, one of CONTENDERS)."""

    contender: str
    description: str = ""
    shrunk_params: str = ""  # the scorer's parameters where the split made it shrink them in every layer


class AllocationData(_Experiment):
    """The allocation study's numbers (module docstring)."""

    experiment: Literal["allocation"] = "allocation"
    scope: str = "prefill"
    question: str
    budgets: list[Count]
    scorers: list[str]
    contenders: list[str]
    metrics: list[str]
    samples: dict[str, Count]  # task -> evaluated samples
    calibration_samples: Count
    best_rule: dict[str, str]  # "scorer@budget" -> the layer rule best on the calibration samples
    calibration: dict[str, dict[str, Statistic]]  # "scorer@budget" -> layer rule -> its calibration answer_nll
    searches: list[SearchSummary] = Field(default_factory=list)
    full: BoardEntry
    entries: list[AllocationEntry]


@dataclasses.dataclass(frozen=True)
class StudyChoices:
    """What the study runs: scorers, budgets, the contenders, the scorers searched, and the search's size."""

    scorers: tuple[str, ...]
    budgets: tuple[int, ...]
    contenders: tuple[str, ...] = CONTENDERS
    searched: tuple[str, ...] = ()  # the scorers that get a capacity-only search (default: the first)
    calibration_per_task: int = 4
    evaluations: int = 300

    def __post_init__(self):
        from polykv.methods import for_phase

        unknown = [c for c in self.contenders if c not in CONTENDERS]
        if unknown:
            raise ValueError(f"unknown contender {unknown[0]!r} (the contenders: {', '.join(CONTENDERS)})")
        if "uniform" not in self.contenders:
            raise ValueError("the study compares every split with uniform: keep uniform among the contenders")
        scorers = [m for m in for_phase("prefill") if m != FULL]
        if not self.scorers or any(s not in scorers for s in self.scorers):
            wrong = next((s for s in self.scorers if s not in scorers), "none")
            raise ValueError(f"scorer {wrong!r}: give prefill methods ({', '.join(scorers)})")
        for name, given in (("scorer", self.scorers), ("budget", self.budgets), ("contender", self.contenders)):
            if len(set(given)) < len(given):
                raise ValueError(f"a {name} is given twice ({', '.join(map(str, given))}): each contrast counts once")
        missing = [s for s in self.searched if s not in self.scorers]
        if missing:
            raise ValueError(f"searched scorer {missing[0]!r} is not among the scorers")
        if self.searched and "searched" not in self.contenders:
            raise ValueError("a search is asked for, but searched is not among the contenders")
        if not self.budgets or any(b < 2 for b in self.budgets):
            raise ValueError(f"budgets must be whole numbers of at least 2, got {list(self.budgets)}")
        if self.calibration_per_task < 1 or self.evaluations < 1:
            raise ValueError("calibration samples per task and the search's evaluations must be at least 1")

    @property
    def searching(self) -> tuple[str, ...]:
        return (self.searched or self.scorers[:1]) if "searched" in self.contenders else ()

    @property
    def calibrating(self) -> bool:
        return "adakv+best" in self.contenders or "searched" in self.contenders


def key(scorer: str, contender: str, budget: int) -> str:
    return f"{scorer}/{contender}@{budget}"


def rule_plan(
    scorer: str,
    rule: str,
    budget: int,
    num_layers: int,
    windows: Sequence[int | None] | None = None,
    statistics: Mapping[str, Sequence[float]] | None = None,
    heads: str = "uniform",
) -> Plan:
    """`scorer` in every prefill layer, L x `budget` tokens split by the layer rule `rule`, over its KV heads by
    `heads`: the plan a contender runs (its name says all three)."""
    from polykv.routing.rules import apply_rule

    base = Plan.homogeneous(scorer, budget, num_layers, "prefill", params=params_that_fit(scorer, budget))
    if rule == "cake":  # decided at prefill from the prompt; the runtime keeps local layers within their windows
        fitted = params_that_fit("cake", budget)  # CAKE's window shrinks under a small budget, as its preset's does
        least = fitted.get("window", REGISTRY["cake"].defaults()["window"])  # the fewest tokens CAKE gives a layer
        params = fit_params(scorer, base.layers[0].prefill.params, least)
        if params != base.layers[0].prefill.params:  # e.g. SnapKV's window of 32: the scorer runs with a smaller one
            shrunk = ", ".join(f"{k} {v}" for k, v in params.items() if v != base.layers[0].prefill.params.get(k))
            base = Plan.homogeneous(scorer, budget, num_layers, "prefill", params=params)
            base = base.model_copy(
                update={
                    "description": f"{base.description} Under CAKE's rule a layer may get as few as {least} tokens, "
                    f"so {scorer} runs with {shrunk} in every layer.",
                    "provenance": {**base.provenance, "shrunk_params": shrunk},
                }
            )
        update = {"allocation": "cake", "allocation_params": fitted, "name": f"{base.name}-cake"}
        plan = base.model_copy(update=update)
    else:
        plan = apply_rule(base, rule, windows=windows, statistics=(statistics or {}).get(rule))
    if heads != "uniform":
        plan = plan.model_copy(
            update={"name": f"{plan.name}-{heads}", "head_allocation": heads, "head_allocation_params": {}}
        )
    return plan


def placeholder_plans(choices: StudyChoices, num_layers: int) -> tuple[Plan, ...]:
    """One plan per contender run (what the cost counts before the model loads); the statistics-dependent rules
    are counted as uniform. Not counted: the calibration (each layer rule on the calibration samples) and the
    searches (at most `evaluations` executions each), which come on top."""
    plans = [Plan.homogeneous(FULL, None, num_layers)]
    for scorer in choices.scorers:
        for budget in choices.budgets:
            for contender in choices.contenders:
                if contender != "searched" or scorer in choices.searching:
                    plans.append(rule_plan(scorer, "uniform", budget, num_layers))
    return tuple(plans)


def squeeze_statistics(runner: ExperimentRunner) -> list[float]:
    """SqueezeAttention's per-layer similarity on 4 sequences of calibration text as long as the suite's prompts,
    kept beside the results database (with the calibration's choices)."""
    from polykv.profile.squeeze import calibration_similarity

    tokens = int(getattr(runner.settings, "length", None) or 1024)
    folder = runner.store.path.parent / "allocation-calibration"
    return calibration_similarity(runner.model_name, runner.model, runner.tokenizer, tokens, folder)


@dataclasses.dataclass
class Calibrated:
    """What the calibration samples chose: per "scorer@budget", the layer rule that did best (`best`) among the
    rules' values (`values`); the searched plans by contender key (`searched`) and how each search went."""

    best: dict[str, str] = dataclasses.field(default_factory=dict)
    values: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    searched: dict[str, Plan] = dataclasses.field(default_factory=dict)
    searches: list[SearchSummary] = dataclasses.field(default_factory=list)
    samples: int = 0


# (runner, choices, plans by contender key, the layer rules, their statistics, the profile) -> what it chose
Calibrate = Callable[..., Calibrated]


def allocation(runner: ExperimentRunner, choices: StudyChoices, profile=None, calibrate: Calibrate | None = None):
    """The study (module docstring) on the runner's model, suite and settings; its `Report`. `profile` (of the
    prefill scope): its per-layer PPL sensitivity is the ppl rule's statistic (needed when ppl is a contender), and
    it ranks the search's transfers. `calibrate`: the calibration step (best rule, searches), which the search's
    floor provides (`polykv.search.workload.allocation.calibrate`)."""
    from polykv.models import layer_windows
    from polykv.routing.allocation import ppl_sensitivity

    if not hasattr(runner.settings, "question") or isinstance(getattr(runner.settings, "length", 0), tuple):
        raise ValueError("the study scores answers at one length: ruler (one length) or longbench settings")
    model = runner.model
    layers = model.config.num_hidden_layers
    windows = layer_windows(model)
    local = windows if any(w is not None for w in windows) else None
    rules = [r for r in LAYER_RULES if r in choices.contenders]
    if "ppl" in rules and profile is None:
        raise ValueError("the ppl rule splits by a profile's PPL sensitivity: give a profile")
    statistics = {"ppl": ppl_sensitivity(profile.table, "prefill")} if "ppl" in rules else {}
    if "squeeze" in rules:
        statistics["squeeze"] = squeeze_statistics(runner)
    plans: dict[str, Plan] = {FULL: Plan.homogeneous(FULL, None, layers)}
    for scorer in choices.scorers:
        for budget in choices.budgets:
            for rule in rules:
                plans[key(scorer, rule, budget)] = rule_plan(scorer, rule, budget, layers, local, statistics)
            if "adakv" in choices.contenders:
                plans[key(scorer, "adakv", budget)] = rule_plan(scorer, "uniform", budget, layers, local, None, "adakv")
    chosen = Calibrated()
    if choices.calibrating:
        if calibrate is None:
            raise ValueError("adakv+best and searched need the calibration step (polykv.search.workload.allocation)")
        chosen = calibrate(runner, choices, plans, rules, statistics, profile)
        for scorer in choices.scorers:
            for budget in choices.budgets:
                rule = chosen.best[f"{scorer}@{budget}"]
                if "adakv+best" in choices.contenders:
                    plans[key(scorer, "adakv+best", budget)] = rule_plan(
                        scorer, rule, budget, layers, local, statistics, "adakv"
                    )
    plans.update(chosen.searched)
    runs = dict(zip(plans, runner.run_all(list(plans.values()))))
    data = _compare(runner, plans, runs, choices, chosen)
    return Report(_title(data), _rows(data), _lines(data), data)


def _compare(runner, plans, runs, choices, chosen: Calibrated) -> AllocationData:
    scores = {k: {METRIC: runner.sample_scores(run, METRIC)} for k, run in runs.items()}
    held = {k: runner.measured_kv(run) for k, run in runs.items()}

    def entry(k: str, scorer: str, budget: int | None, contender: str | None) -> dict:
        kv = held[k]
        return dict(
            method=scorer,
            budget=budget,
            run=runs[k],
            plan=plans[k].name,
            allocation=plans[k].allocation,
            means={METRIC: macro_mean(scores[k][METRIC])},
            kv_entering=None if kv is None else kv.total_entering,
            kv_share=None if kv is None or not kv.fullkv_entering else kv.total_entering / kv.fullkv_entering,
            **({} if contender is None else {"contender": contender, "description": plans[k].description}),
            shrunk_params=plans[k].provenance.get("shrunk_params", ""),
        )

    entries = {k: AllocationEntry(**entry(k, *_parts(k))) for k in plans if k != FULL}
    primary, secondary = [], []
    for scorer in choices.scorers:
        for budget in choices.budgets:
            here = {c: key(scorer, c, budget) for c in CONTENDERS}.get
            primary += [(here(c), here("uniform"), "uniform") for c in PRIMARY if here(c) in plans]
            rule = chosen.best.get(f"{scorer}@{budget}")
            if here("adakv+best") in plans:
                secondary.append((here("adakv+best"), here(rule), "best rule"))
            if here("searched") in plans:
                secondary.append((here("searched"), here("uniform"), "uniform"))
                if rule != "uniform":
                    secondary.append((here("searched"), here(rule), "best rule"))
    for family in (primary, secondary):
        for (a, _, _), contrast in zip(family, family_contrasts(family, scores, held, METRIC, runner.seed)):
            entries[a].versus.append(contrast)
    return AllocationData(
        metric=METRIC,
        direction=direction(METRIC),
        question=QuestionProtocol.of(runner.settings),
        budgets=list(choices.budgets),
        scorers=list(choices.scorers),
        contenders=list(choices.contenders),
        metrics=[METRIC],
        samples={task: len(values) for task, values in scores[FULL][METRIC].items()},
        calibration_samples=chosen.samples,
        best_rule=chosen.best,
        calibration=chosen.values,
        searches=chosen.searches,
        full=BoardEntry(**entry(FULL, FULL, None, None)),
        entries=list(entries.values()),
    )


def _parts(k: str) -> tuple[str, int, str]:
    scorer, _, rest = k.partition("/")
    contender, _, budget = rest.partition("@")
    return scorer, int(budget), contender


def _title(data: AllocationData) -> str:
    return (
        f"Allocation study: {', '.join(data.scorers)} under {len(data.contenders)} splits at budgets "
        f"{', '.join(map(str, data.budgets))} (prefill, question {data.question})"
    )


def _rows(data: AllocationData) -> list[dict]:
    rows = [{"scorer": FULL, "split": "", "budget": None, METRIC: data.full.means[METRIC]}]
    for e in sorted(data.entries, key=lambda e: (e.budget, e.method, CONTENDERS.index(e.contender))):
        row = {"scorer": e.method, "split": e.contender, "budget": e.budget, METRIC: e.means[METRIC]}
        row["kv share"] = e.kv_share
        for c in e.versus:
            row[f"vs {c.reference}"] = c.sample.difference
            row[f"p Holm vs {c.reference}"] = c.p_holm
        rows.append(row)
    return rows


def _lines(data: AllocationData) -> list[str]:
    out = [
        f"samples per task: {', '.join(f'{t} {n}' for t, n in data.samples.items())}",
        f"calibration samples: {data.calibration_samples}",
    ]
    for name, members in (("rules against uniform", PRIMARY), ("adakv+best and searched", ("adakv+best", "searched"))):
        found = [c for e in data.entries if e.contender in members for c in e.versus]
        if found:
            counts = {v: sum(c.verdict == v for c in found) for v in ("better", "worse")}
            out.append(
                f"{name} (Holm over {found[0].family}): better {counts['better']}, worse {counts['worse']}, "
                f"no significant difference {len(found) - counts['better'] - counts['worse']}"
            )
    return out


__all__ = [
    "CONTENDERS",
    "Calibrated",
    "LAYER_RULES",
    "AllocationData",
    "AllocationEntry",
    "StudyChoices",
    "allocation",
    "placeholder_plans",
    "rule_plan",
]

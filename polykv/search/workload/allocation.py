"""The allocation study's calibration (`polykv.eval.experiments.allocation`, which holds the study's plans,
contrasts and report): the calibration samples from the workload's calibration split, the layer rules' values on
them, the capacity-only search (transfers alone, the scorer fixed), and the cache that keeps what they chose beside
the results database. It lives on the workload search's floor since it searches; `allocation_experiment` is the
study as an experiment, with this step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from polykv.eval.experiments.allocation import (
    LAYER_RULES,
    Calibrated,
    SearchSummary,
    StudyChoices,
    allocation,
    key,
    placeholder_plans,
)
from polykv.eval.experiments.run import Experiment
from polykv.plan import Plan


def allocation_experiment(num_layers: int, choices: StudyChoices, profile=None) -> Experiment:
    """The allocation study with its calibration: `profile` gives the ppl rule's statistic and ranks the search's
    transfers."""
    run = lambda runner: allocation(runner, choices, profile, calibrate)  # noqa: E731
    return Experiment("allocation", placeholder_plans(choices, num_layers), run)


def calibrate(runner, choices: StudyChoices, plans: dict[str, Plan], rules, statistics, profile=None) -> Calibrated:
    """Each scorer and budget's layer rules on the calibration samples, the best of them, and the searches
    (`choices.searching`), each read from the cache where it holds them."""
    chosen, cached, objective = Calibrated(), CalibrationCache(runner, choices, rules, statistics, profile), None
    cells = [(scorer, budget) for scorer in choices.scorers for budget in choices.budgets]
    missing = [(s, b) for s, b in cells if cached.get(f"{s}@{b}") is None]
    if missing:  # every cell's rules in one call: the plans that meet on a sample share its prompt pass
        objective = calibration_objective(runner, choices)
        values = iter(objective.values([plans[key(s, r, b)] for s, b in missing for r in rules]))
        for s, b in missing:  # kept at once: a study stopped in a search resumes with its rules' values
            cached.put(f"{s}@{b}", {"samples": len(objective), "values": {r: next(values) for r in rules}})
    for scorer, budget in cells:
        name, searching = f"{scorer}@{budget}", scorer in choices.searching
        found = cached.get(name)
        if searching and "search" not in found:
            objective = objective or calibration_objective(runner, choices)
            best = _best(found["values"], rules)
            starts = [plans[key(scorer, r, budget)] for r in dict.fromkeys(["uniform", best]) if r != "cake"]
            plan, summary = capacity_search(objective, starts, scorer, budget, choices, profile)
            found["search"] = {"plan": plan.to_dict(), "summary": summary.model_dump(mode="json")}
            cached.put(name, found)
        chosen.values[name], chosen.samples = found["values"], found["samples"]
        chosen.best[name] = _best(found["values"], rules)
        if searching:
            chosen.searched[key(scorer, "searched", budget)] = Plan.from_dict(found["search"]["plan"])
            chosen.searches.append(SearchSummary.model_validate(found["search"]["summary"]))
    return chosen


def _best(values: Mapping[str, float], rules: Sequence[str]) -> str:
    """The rule with the lowest calibration answer_nll (the earlier in LAYER_RULES' order on a tie)."""
    return min(rules, key=lambda r: (values[r], LAYER_RULES.index(r)))


class CalibrationCache:
    """What the calibration chose for each scorer and budget (its rules' values, the search's plan), kept beside the
    results database under a key of everything it depends on, so that a study run again (a page rendered from its
    database, a budget added) finds it instead of searching again."""

    def __init__(
        self,
        runner,
        choices,
        rules: Sequence[str],
        statistics: Mapping[str, Sequence[float]],
        profile=None,
    ):
        import hashlib
        import json

        from polykv.eval.running.suite_runner import code_revisions
        from polykv.methods import REGISTRY
        from polykv.plan import FULL

        given = {
            "model": runner.model_name,
            "suite": runner.suite,
            "settings": runner.settings.to_dict(),
            "seed": runner.seed,
            "rules": list(rules),
            "calibration_per_task": choices.calibration_per_task,
            "evaluations": choices.evaluations,
            "statistics": {k: [round(float(v), 6) for v in values] for k, values in sorted(statistics.items())},
            "profile": None if profile is None else profile.key,
            # the code that drew the samples and scores them: a new revision draws (and checks) them again
            "revisions": code_revisions(Plan.homogeneous(FULL, None, 1), runner.suite)["suite"],
            "methods": {m: REGISTRY[m].revision for m in choices.scorers},
            "version": 1,
        }
        digest = hashlib.sha256(json.dumps(given, sort_keys=True).encode()).hexdigest()[:16]
        self.path = runner.store.path.parent / "allocation-calibration" / f"{digest}.json"

    def _read(self) -> dict:
        import json

        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def get(self, name: str) -> dict | None:
        return self._read().get(name)

    def put(self, name: str, chosen: dict) -> None:
        from polykv.files import atomic_write_json

        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, {**self._read(), name: chosen})


def calibration_objective(runner, choices):
    """answer_nll on `calibration_per_task` samples per task of the calibration split, none an evaluated one."""
    from polykv.eval.workloads.workload import Workload
    from polykv.search.workload.samples import draw_samples

    settings = runner.settings
    if not hasattr(settings, "question"):
        raise ValueError(f"the {runner.suite} suite has no calibration split: the study runs on ruler or longbench")
    workload = Workload(runner.suite, settings, tuple(f"{runner.suite}:{t}" for t in settings.tasks))
    held = settings.samples_per_task
    drawn = draw_samples(workload, runner.tokenizer, runner.model, choices.calibration_per_task, held, runner.seed)
    return drawn.objective(runner.model)


def capacity_search(objective, starts: Sequence[Plan], scorer: str, budget: int, choices, profile=None):
    """(the searched plan, its `SearchSummary`): the capacity-only search (transfer moves alone) from `starts`, on the
    calibration samples, `choices.evaluations` executions past what the starts cost; `profile` ranks the transfers
    (the receiver's method suffers more there than the donor's), else they come in a seeded order."""
    from polykv.search.local_search import SearchSettings, search, with_provenance

    costs = sum(objective.cost(p, range(len(objective))) for p in starts)
    settings = SearchSettings(budget, evaluations=choices.evaluations + costs, moves=("transfer",))
    found = search(objective, starts, settings, profile)
    plan = with_provenance(found, f"{scorer}-prefill-{budget}-searched", {"moves_allowed": ["transfer"]})
    summary = SearchSummary(
        scorer=scorer,
        budget=budget,
        start=found.start,
        moves=[m.describe() for m in found.moves],
        evaluations=found.evaluations,
        calibration=found.objective,
    )
    return plan, summary

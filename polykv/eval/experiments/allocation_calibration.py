"""The allocation study's calibration (`polykv.eval.experiments.allocation`): the calibration samples, the
rules' values on them, the capacity-only search, SqueezeAttention's statistic, and the cache that keeps what they
chose beside the results database."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from polykv.eval.experiments.experiment_runner import ExperimentRunner
from polykv.eval.experiments.report import Count, Statistic, _Data
from polykv.plan import Plan

if TYPE_CHECKING:
    from polykv.eval.experiments.allocation import StudyChoices


class SearchSummary(_Data):
    """How a capacity-only search went on the calibration samples."""

    scorer: str
    budget: Count
    start: str  # the start it kept going from
    moves: list[str]
    evaluations: Count
    calibration: Statistic  # the searched plan's answer_nll on the calibration samples


def squeeze_statistics(runner: ExperimentRunner) -> list[float]:
    """SqueezeAttention's per-layer similarity on 4 sequences of calibration text as long as the suite's prompts."""
    from polykv.profile.sources import calibration_text
    from polykv.profile.squeeze import attention_similarity

    tokens = int(getattr(runner.settings, "length", None) or 1024)
    text = calibration_text(runner.model_name, runner.model, runner.tokenizer, 4, tokens)
    return attention_similarity(runner.model, text)


class CalibrationCache:
    """What the calibration chose for each scorer and budget (its rules' values, the search's plan), kept beside the
    results database under a key of everything it depends on, so that a study run again (a page rendered from its
    database, a budget added) finds it instead of searching again."""

    def __init__(
        self,
        runner: ExperimentRunner,
        choices: StudyChoices,
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


def calibration_objective(runner: ExperimentRunner, choices: StudyChoices):
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


def capacity_search(objective, starts: Sequence[Plan], scorer: str, budget: int, choices: StudyChoices, profile=None):
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

"""What an experiment returns: a `Report` (a title, a table, sentences) whose numbers are one typed model per
experiment (`FactorialData`, `PlacementData`, `SweepData`, `LeaderboardData`), built by keyword and read as attributes.

The models are also the saved report's schema: `Report.to_dict` is strict JSON (a sweep's budgets become the
keys "16", "32"; an undefined statistic is null) and `Report.from_dict` gives back the same models (budgets as
ints again). A statistic that is undefined (NaN: Spearman over one placement, a p-value without samples) is
None in memory too, so a report reads the same before and after a save.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from polykv.eval.comparing.compare import Paired
from polykv.eval.statistics.samples import SampleTest
from polykv.question_protocol import QuestionProtocol

FACTORIAL_CELLS = ("homogeneous-uniform", "homogeneous-allocated", "routed-uniform", "routed-allocated")
GUIDED_INDEX = -1  # the guided route's index among a placement control's placements (the random ones: 0, 1, ...)


def _python_scalar(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        return value.item()  # a numpy scalar
    return value


def _finite_or_none(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


# A statistic or a score: None when undefined (NaN or infinite as computed, null as saved, "nan" as edited)
Statistic = Annotated[float | None, BeforeValidator(_python_scalar), AfterValidator(_finite_or_none)]
Count = Annotated[int, BeforeValidator(_python_scalar)]


class ReportData(BaseModel):  # every typed report's data, the searches' too
    # a saved report from another version may carry fields this one does not read: they are ignored
    model_config = ConfigDict(extra="ignore", populate_by_name=True)  # populate_by_name: pydantic 2.7 to 2.10 too


class SampleLevel(ReportData):
    """The sample-level test of a contrast (`polykv.eval.statistics.samples.sample_test`): macro difference, its 95%
    interval, the sign-flip p and the smallest difference it detects at 80% power."""

    difference: Statistic
    low: Statistic
    high: Statistic
    p: Statistic
    mde: Statistic
    samples: Count
    differing: Count | None = None
    permutations: Count | None = None

    @classmethod
    def of(cls, test: SampleTest) -> SampleLevel:
        return cls(
            difference=test.difference,
            low=test.low,
            high=test.high,
            p=test.p_value,
            mde=test.mde,
            samples=test.samples,
            differing=test.differing,
            permutations=test.permutations,
        )


class Contrast(ReportData):
    """A paired comparison A - B: the paper's bootstrap over tasks (difference, 95% CI, wins/ties/losses,
    leave-one-task-out), the sample-level test (`sample`, None without per-sample scores) and the verdict.
    `loto_better` counts leave-one-task-out values in the better direction. Reports made before samples were
    paired have no `sample`, `verdict` or `task_mde`."""

    difference: Statistic
    low: Statistic
    high: Statistic
    replicates: Count
    tasks: Count
    clusters: Count
    wins: Count
    ties: Count
    losses: Count
    leave_one_out: dict[str, Statistic]
    loto_better: Count
    task_mde: Statistic = None
    sample: SampleLevel | None = None
    verdict: str = ""
    verdict_text: str = ""

    @classmethod
    def fields_of(cls, result: Paired) -> dict[str, Any]:
        sample = None if result.samples is None else SampleLevel.of(result.samples)
        return dict(
            difference=result.difference,
            low=result.low,
            high=result.high,
            replicates=result.replicates,
            tasks=len(result.table),
            clusters=result.clusters,
            wins=result.wins,
            ties=result.ties,
            losses=result.losses,
            leave_one_out=dict(result.leave_one_out),
            loto_better=sum(1 for v in result.leave_one_out.values() if result.sign * v > 0),
            task_mde=result.task_mde,
            sample=sample,
            verdict=result.verdict(),
            verdict_text=result.verdict_text(),
        )

    @classmethod
    def of(cls, result: Paired) -> Contrast:
        return cls(**cls.fields_of(result))


class VersusBaseline(Contrast):
    """A route against the best standalone baseline (`baseline`) at one budget."""

    baseline: str

    @classmethod
    def of(cls, result: Paired, baseline: str) -> VersusBaseline:
        return cls(baseline=baseline, **Contrast.fields_of(result))


class AtDoubleBudget(VersusBaseline):
    """The route at b against the best baseline at 2b, as the sample-level test says: "falls short"
    (significantly worse), "exceeds" (significantly better) or "no significant difference" (which says nothing
    of a match: the minimal detectable difference says how large a gap could go unseen). Reports saved before
    this wording said "matches" when the route was not significantly worse."""

    match: Literal["falls short", "no significant difference", "exceeds", "matches"]

    @model_validator(mode="before")
    @classmethod
    def _match_was_the_verdict(cls, saved: Any) -> Any:
        # reports saved before the sample-level test kept "matches" / "falls short" under "verdict"
        if isinstance(saved, dict) and "match" not in saved and saved.get("verdict") in ("matches", "falls short"):
            return {**saved, "match": saved["verdict"], "verdict": ""}
        return saved


class RunScore(ReportData):
    """One run of an experiment and its suite score (the macro-average over tasks of the metric)."""

    run: str
    score: Statistic
    plan: str = ""


class PlacedRun(RunScore):
    """One placement of the placement control: its profile score S(rho), its plan as JSON (so a page can open
    it) and its index among the random ones (the guided route: `GUIDED_INDEX`)."""

    profile_score: Statistic = Field(alias="S")
    plan_json: str
    index: Count = GUIDED_INDEX  # reports saved before the guided route had an index


class BestBaseline(ReportData):
    """The envelope at one budget: the standalone baseline that scores best there, and its score."""

    baseline: str
    score: Statistic


class BaselineProtocol(ReportData):
    """How a standalone baseline ran in a sweep (`polykv.eval.method_protocols`)."""

    scope: str
    allocation: str
    params: dict[str, Any] = Field(default_factory=dict)
    source: str = ""


class _Experiment(ReportData):
    metric: str
    direction: Literal[1, -1]  # +1: higher is better


class FactorialData(_Experiment):
    """Routing x allocation at one average capacity (Table 2): the four cells and each contrast; the primary is
    `routing_uniform` (routed-uniform - homogeneous-uniform)."""

    experiment: Literal["factorial"] = "factorial"
    scope: str
    budget: Count
    baseline: str
    statistic: str
    allocation: str
    cells: dict[str, RunScore]  # homogeneous-uniform, homogeneous-allocated, routed-uniform, routed-allocated
    routing_uniform: Contrast
    allocation_homogeneous: Contrast
    allocation_routed: Contrast
    interaction: Contrast

    @model_validator(mode="after")
    def _every_cell(self) -> FactorialData:
        missing = sorted(set(FACTORIAL_CELLS) - set(self.cells))
        if missing:
            raise ValueError(f"the factorial has no cell {missing[0]}")
        return self


class PlacementData(_Experiment):
    """The guided route against K random count-matched placements (Table 4): Spearman of S(rho) and the score
    over the random ones (the primary), the guided route's rank and its gap to the random mean."""

    experiment: Literal["placement"] = "placement"
    phase: str
    statistic: str
    majority: str = ""  # reports saved before S(rho) named its reference method have none
    k: Count
    permutations: Count
    guided: PlacedRun
    random: list[PlacedRun]
    spearman: Statistic
    spearman_p: Statistic
    guided_rank: Count
    guided_p: Statistic
    random_mean: Statistic
    guided_minus_mean: Statistic
    guided_minus_mean_sample: SampleLevel | None = None


class SweepData(_Experiment):
    """A route at several budgets against every standalone baseline (Table 5): scores and run ids per series
    and budget, FullKV once, the envelope (best baseline per budget) and the route's contrasts with it."""

    experiment: Literal["sweep"] = "sweep"
    route: str
    scope: str
    budgets: list[Count]
    baselines: list[str]
    routes: list[str]  # route-uniform and, with a profile, route-ppl
    protocols: dict[str, BaselineProtocol] = Field(default_factory=dict)
    scores: dict[str, dict[int, Statistic]]  # series -> budget -> score
    runs: dict[str, dict[int, str]]  # series -> budget -> run id
    full: RunScore
    envelope: dict[int, BestBaseline]
    versus_envelope: dict[int, VersusBaseline]  # route-uniform - the best baseline, per budget
    ppl_versus_envelope: dict[int, VersusBaseline] = Field(default_factory=dict)
    double: dict[int, AtDoubleBudget] = Field(default_factory=dict)  # b -> route at b vs the best at 2b
    # Like with like (sweeps made since protocol-matched verdicts; empty before): every method alone in the route's
    # own scope at b, the best of them per budget, and the route against it (the primary contrast); `double_matched`
    # the route at b against the best of them at 2b
    matched: list[str] = Field(default_factory=list)
    matched_envelope: dict[int, BestBaseline] = Field(default_factory=dict)
    versus_matched: dict[int, VersusBaseline] = Field(default_factory=dict)
    double_matched: dict[int, AtDoubleBudget] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _every_budget(self) -> SweepData:
        """Every series, the envelope and the route's contrasts at every budget: what the tables and charts read."""
        tables = {"envelope": self.envelope, "versus_envelope": self.versus_envelope}
        if self.matched:
            tables |= {"matched envelope": self.matched_envelope, "versus matched": self.versus_matched}
        for series in self.routes + self.baselines + self.matched:
            if series not in self.scores or series not in self.runs:
                raise ValueError(f"the sweep has no scores or runs of {series}")
            tables |= {f"scores of {series}": self.scores[series], f"runs of {series}": self.runs[series]}
        for what, per_budget in tables.items():
            missing = [b for b in self.budgets if b not in per_budget]
            if missing:
                raise ValueError(f"the sweep's {what} has no budget {missing[0]}")
        return self


class BoardContrast(ReportData):
    """A method at a budget against a reference method at the same budget, in one metric, sample by sample; its
    verdict after Holm's correction over its family (every method and budget against one reference in one metric)."""

    reference: str
    metric: str
    sample: SampleLevel
    p_holm: Statistic
    family: Count  # the tests in its family
    wins: Count
    ties: Count
    losses: Count
    verdict: str  # "better", "worse" or "no significant difference", at family-wise 5%
    equal_kv: bool | None = None  # the same KV entering the answer, measured, within 1%? None: not measured


class BoardEntry(ReportData):
    """One method alone (the same method and capacity in every layer of the scope's phases) at one budget."""

    method: str
    budget: Count | None  # None: FullKV
    run: str
    plan: str
    allocation: str = "fixed"  # "native": the method split the budget over the layers by its own rule
    means: dict[str, Statistic]  # metric -> its macro-average over the tasks
    versus: list[BoardContrast] = Field(default_factory=list)
    # the KV the plan held entering the answer, measured from its cache (token-layers per KV head, the mean over its
    # samples) and as a share of what FullKV held on them; None where the runs predate the measurement
    kv_entering: Statistic = None
    kv_share: Statistic = None


class QuestionContrast(ReportData):
    """A method at one budget under the leaderboard's question protocol against the same plan under the other, on
    the same samples (this protocol minus the other), Holm over the methods."""

    method: str
    budget: Count | None  # None: FullKV
    metric: str
    here: Statistic  # the macro-average under the leaderboard's protocol
    other: Statistic  # ... under the other one
    sample: SampleLevel
    p_holm: Statistic
    family: Count
    wins: Count
    ties: Count
    losses: Count
    verdict: str
    run: str  # the other protocol's run
    other_question: QuestionProtocol


class LeaderboardData(_Experiment):
    """Every method alone in one scope at several budgets, on one suite and question protocol, each against the
    reference methods at the same budget (`polykv.eval.experiments.leaderboard`)."""

    experiment: Literal["leaderboard"] = "leaderboard"
    scope: str
    question: QuestionProtocol
    budgets: list[Count]
    methods: list[str]
    references: list[str]
    metrics: list[str]  # the primary metric (`metric`) first
    samples: dict[str, Count]  # task -> samples FullKV scored
    full: BoardEntry
    entries: list[BoardEntry]
    question_dependence: list[QuestionContrast] = Field(default_factory=list)  # the other protocol's, if asked


def _experiment_data() -> TypeAdapter:
    """Every experiment's data by its `experiment`: `_Experiment`'s subclasses (the package imports every module)."""
    kinds, todo = [], [_Experiment]
    while todo:
        todo += (found := todo.pop().__subclasses__())
        kinds += [k for k in found if "experiment" in k.model_fields]
    return TypeAdapter(Annotated[Union[tuple(kinds)], Field(discriminator="experiment")])  # noqa: UP007


@dataclass
class Report:
    """What an experiment prints (`rows` as a table, then `lines`) and its numbers (`data`, typed per experiment)."""

    title: str
    rows: list[dict] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    data: _Experiment | None = None  # FactorialData, PlacementData, ...; None only while it is being written

    def to_dict(self) -> dict[str, Any]:
        """The report as strict JSON data (see the module's docstring)."""
        data = {} if self.data is None else self.data.model_dump(mode="json", by_alias=True)
        return _strict_json({"title": self.title, "rows": self.rows, "lines": self.lines, "data": data})

    @classmethod
    def from_dict(cls, saved: Any) -> Report:
        """A report saved with `to_dict` (ValueError, one line, when it is not one)."""
        if not isinstance(saved, Mapping) or not isinstance(saved.get("title"), str):
            raise ValueError("not an experiment report (no title)")
        rows, lines, numbers = saved.get("rows", []), saved.get("lines", []), saved.get("data", {})
        if not isinstance(rows, list) or not isinstance(lines, list) or not isinstance(numbers, dict):
            raise ValueError("not an experiment report (rows, lines and data are a list, a list and an object)")
        try:
            data = _experiment_data().validate_python(numbers) if numbers else None  # {}: saved while being written
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "data"
            raise ValueError(f"not an experiment report this version reads ({where}: {first['msg']})") from None
        return cls(saved["title"], list(rows), [str(line) for line in lines], data)


def _strict_json(value: Any) -> Any:
    """`value` as strict JSON: Python scalars (not numpy's), lists for tuples, string keys, None for NaN and inf."""
    if isinstance(value, Mapping):
        return {str(k): _strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(v) for v in value]
    value = _python_scalar(value)
    return None if isinstance(value, float) and not math.isfinite(value) else value

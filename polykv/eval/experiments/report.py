"""What an experiment returns: a `Report` (a title, a table, sentences) whose numbers are one typed model per
experiment (`FactorialData`, `PlacementData`, `SweepData`), built by keyword and read as attributes.

The models are also the saved report's schema: `Report.to_dict` is strict JSON (a sweep's budgets become the
keys "16", "32"; an undefined statistic is null) and `Report.from_dict` gives back the same models (budgets as
ints again). A statistic that is undefined (NaN: Spearman over one placement, a p-value without samples) is
None in memory too, so a report reads the same before and after a save.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from polykv.eval.compare import Paired
from polykv.eval.paired_samples import SampleTest


def _defined(value: Any) -> Any:
    """NaN and infinities (an undefined statistic) become None; numpy scalars become Python ones."""
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        value = value.item()  # a numpy scalar
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def stat_text(value: float | None, spec: str = ".4f") -> str:
    """`value` formatted, or "undefined" (a statistic that has no value, e.g. Spearman over one placement)."""
    return "undefined" if value is None else format(value, spec)


Number = Annotated[float | None, BeforeValidator(_defined)]  # None: undefined (NaN before it was saved)
Count = Annotated[int, BeforeValidator(_defined)]


class _Data(BaseModel):
    # a saved report from another version may carry fields this one does not read: they are ignored
    model_config = ConfigDict(extra="ignore", validate_by_name=True, validate_by_alias=True)


class SampleLevel(_Data):
    """The sample-level test of a contrast (`paired_samples.sample_test`): macro difference, its 95% interval,
    the sign-flip p and the smallest difference it detects at 80% power."""

    difference: Number
    low: Number
    high: Number
    p: Number
    mde: Number
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


class Contrast(_Data):
    """A paired comparison A - B: the paper's bootstrap over tasks (difference, 95% CI, wins/ties/losses,
    leave-one-task-out), the sample-level test (`sample`, None without per-sample scores) and the verdict.
    `loto_better` counts leave-one-task-out values in the better direction. Reports made before samples were
    paired have no `sample`, `verdict` or `task_mde`."""

    difference: Number
    low: Number
    high: Number
    replicates: Count = 0
    tasks: Count
    clusters: Count = 0
    wins: Count
    ties: Count
    losses: Count
    leave_one_out: dict[str, Number] = Field(default_factory=dict)
    loto_better: Count = 0
    task_mde: Number = None
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
    def of(cls, result: Paired, baseline: str = "") -> VersusBaseline:
        return cls(baseline=baseline, **Contrast.fields_of(result))


class AtDoubleBudget(VersusBaseline):
    """The route at b against the best baseline at 2b: "matches" unless significantly worse, else "falls short"."""

    match: Literal["matches", "falls short"]


class RunScore(_Data):
    """One run of an experiment and its suite score (the macro-average over tasks of the metric)."""

    run: str
    score: Number
    plan: str = ""


class Placement(RunScore):
    """One placement of the placement control: its profile score S(rho), its plan as JSON (so a page can open
    it) and its index among the random ones (the guided route: -1)."""

    profile_score: Number = Field(alias="S")
    plan_json: str
    index: Count = -1


class BestBaseline(_Data):
    baseline: str
    score: Number


class BaselineProtocol(_Data):
    """How a standalone baseline ran in a sweep (`polykv.eval.protocols`)."""

    scope: str
    allocation: str
    params: dict[str, Any] = Field(default_factory=dict)
    source: str = ""


class _Experiment(_Data):
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


class PlacementData(_Experiment):
    """The guided route against K random count-matched placements (Table 4): Spearman of S(rho) and the score
    over the random ones (the primary), the guided route's rank and its gap to the random mean."""

    experiment: Literal["placement"] = "placement"
    phase: str
    statistic: str
    majority: str
    k: Count
    permutations: Count
    guided: Placement
    random: list[Placement]
    spearman: Number
    spearman_p: Number
    guided_rank: Count
    guided_p: Number
    random_mean: Number
    guided_minus_mean: Number
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
    scores: dict[str, dict[int, Number]]  # series -> budget -> score
    runs: dict[str, dict[int, str]]  # series -> budget -> run id
    full: RunScore
    envelope: dict[int, BestBaseline]
    versus_envelope: dict[int, VersusBaseline]  # route-uniform - the best baseline, per budget
    ppl_versus_envelope: dict[int, VersusBaseline] = Field(default_factory=dict)
    double: dict[int, AtDoubleBudget] = Field(default_factory=dict)  # b -> route at b vs the best at 2b


ExperimentData = Annotated[FactorialData | PlacementData | SweepData, Field(discriminator="experiment")]
_EXPERIMENT_DATA: TypeAdapter = TypeAdapter(ExperimentData)


@dataclass
class Report:
    """What an experiment prints (`rows` as a table, then `lines`) and its numbers (`data`, typed per
    experiment; None only while the experiment is writing it)."""

    title: str
    rows: list[dict] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    data: FactorialData | PlacementData | SweepData | None = None

    def to_dict(self) -> dict[str, Any]:
        """The report as strict JSON data (see the module's docstring)."""
        data = {} if self.data is None else self.data.model_dump(mode="json", by_alias=True)
        return plain({"title": self.title, "rows": self.rows, "lines": self.lines, "data": data}, json_ready=True)

    @classmethod
    def from_dict(cls, saved: Any) -> Report:
        """A report saved with `to_dict` (ValueError, one line, when it is not one)."""
        if not isinstance(saved, Mapping) or not isinstance(saved.get("title"), str):
            raise ValueError("not an experiment report (no title)")
        rows, lines, numbers = saved.get("rows", []), saved.get("lines", []), saved.get("data", {})
        if not isinstance(rows, list) or not isinstance(lines, list) or not isinstance(numbers, dict):
            raise ValueError("not an experiment report (rows, lines and data are a list, a list and an object)")
        try:
            data = _EXPERIMENT_DATA.validate_python(numbers)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "data"
            raise ValueError(f"not an experiment report this version reads ({where}: {first['msg']})") from None
        return cls(saved["title"], list(rows), [str(line) for line in lines], data)


def plain(value: Any, json_ready: bool = False) -> Any:
    """`value` with numpy scalars and tuples turned into Python ones (so `json.dumps` takes it); with
    `json_ready`, also string keys and None for NaN and infinities (strict JSON)."""
    if isinstance(value, Mapping):
        return {(str(k) if json_ready else k): plain(v, json_ready) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, json_ready) for v in value]
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        value = value.item()  # a numpy scalar (bool, int or float)
    if json_ready and isinstance(value, float) and not math.isfinite(value):
        return None
    return value

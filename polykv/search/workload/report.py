"""The workload search's report (`polykv.search.workload.run` makes it) as typed models.

`WorkloadReport` is what `report.json` holds: the workload and its samples (`SamplesRecord`), the profiles, FullKV's
accuracy on the competence pilot, and per budget (`WorkloadBudget`) the contenders' plans, their runs, what chose
them on the search samples, the search's record and the verdict per family of tasks (`FamilyVerdict`: each role's
held-out means and the sample-level contrasts, `SampleContrast`). A saved report reads back into the same models
(`WorkloadReport.load`), a report saved before a field existed included.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from polykv.eval.workloads.competence import COMPETENCE_THRESHOLD
from polykv.question_protocol import QuestionProtocol
from polykv.search.report_parts import (
    Count,
    Machine,
    ProfileRef,
    ReportData,
    SavedPlan,
    SavedReport,
    SearchRecord,
    Statistic,
)

FORMAT = "polykv.workload-report"
VERSION = 1


class SampleContrast(ReportData):
    """A - B on paired held-out samples (`polykv.search.workload.verdict.contrast`): the sample-level sign-flip test
    (its p, exact or not, and whether its interval agrees), the interval, the minimal detectable difference,
    wins/ties/losses and the verdict; `kind` and `matched` (the same scope) say which contrast it is. Reports made
    before some of these fields have none (the defaults)."""

    a: str
    b: str
    kind: str = ""
    matched: bool = True
    metric: str
    difference: Statistic
    low: Statistic
    high: Statistic
    p: Statistic
    exact: bool = False
    agrees: bool = True
    mde: Statistic
    samples: Count
    differing: Count | None = None  # reports saved before it was counted have none (rejudge counts it)
    tasks: Count
    wins: Count
    ties: Count
    losses: Count
    verdict: str


class RoleMeans(ReportData):
    """A role's held-out means on a family of tasks (macro over its tasks)."""

    answer_nll: Statistic
    score: Statistic  # the suite's accuracy (0-100)


class FamilyVerdict(ReportData):
    """The verdict on one family of tasks (searched or transfer): its tasks, each role's means, the contrasts."""

    tasks: list[str]
    means: dict[str, RoleMeans]
    contrasts: list[SampleContrast]


class BudgetSeconds(ReportData):
    contenders: float  # the contenders and the search
    verdict: float


class WorkloadBudget(ReportData):
    """One budget: the contenders (role -> plan), their verdict runs (metric -> role -> run id, FullKV's as
    "fullkv"), what chose them on the search samples, the search's record and the verdict per family of tasks."""

    budget: Count
    plans: dict[str, SavedPlan]
    runs: dict[str, dict[str, str]]
    homogeneous_scores: dict[str, float]
    envelope_scores: dict[str, float]
    search: SearchRecord
    search_values: dict[str, float]  # every role's answer_nll on the search samples
    verdict: dict[str, FamilyVerdict]
    seconds: BudgetSeconds

    def name_of(self, role: str) -> str:
        """The role's plan name ("fullkv" for FullKV)."""
        plan = self.plans.get(role)
        return "fullkv" if plan is None else plan.name

    def scope_of(self, role: str) -> str:
        """The phases the role's plan acts in ("both" for FullKV)."""
        plan = self.plans.get(role)
        return "both" if plan is None else plan.scope.value

    def find(self, family: str, a: str, b: str, metric: str) -> SampleContrast | None:
        """The contrast a - b in `metric` on `family`, if the verdict has it."""
        data = self.verdict.get(family)
        if data is None:
            return None
        return next((c for c in data.contrasts if (c.a, c.b, c.metric) == (a, b, metric)), None)


class KVDimensions(ReportData):
    """What one retained token costs in the model's KV cache (`polykv.kv_memory.kv_dimensions`); reports made
    before hybrid models have no `windows` (every layer global)."""

    layers: Count
    kv_heads: Count
    head_dim: Count
    bytes: Count
    windows: list[Count | None] | None = None

    def as_dict(self) -> dict[str, Any]:
        """As `polykv.kv_memory` takes it."""
        return self.model_dump()


class SamplesRecord(ReportData):
    """The workload and its samples: the suite's settings (`settings`, its own schema), how many search samples
    (calibration split) and held-out samples per task, the transfer tasks, the question protocol, and per task
    the held-out samples' mean token counts (`lengths`: prompt, question, answer)."""

    suite: str
    sources: list[str]
    settings: dict[str, Any]
    search_samples: Count
    search_per_task: Count
    held_out_per_task: Count
    transfer: list[str]
    accuracy_per_task: Count
    seed: Count
    question: QuestionProtocol = QuestionProtocol.IN_PROMPT
    lengths: dict[str, dict[str, float]] = Field(default_factory=dict)

    @property
    def tasks(self) -> list[str]:
        """The searched tasks."""
        return list(self.settings["tasks"])


class TextProfileRef(ProfileRef):
    statistic: str


class Competence(ReportData):
    """The competence rule as it ran: the threshold, FullKV's pilot run and its samples per task."""

    threshold: float = COMPETENCE_THRESHOLD
    pilot: str | None = None
    samples: Count | None = None


class WorkloadReport(SavedReport):
    """The workload search at every budget (`polykv.search.workload.run.workload_report`). `seconds_steps`: what
    the steps before it took (the model's load, the workload profile) when the caller measured them; `rejudged`: the
    verdicts computed again from the runs (`polykv.search.workload.verdict.rejudge`)."""

    FORMAT = FORMAT
    VERSION = VERSION
    WHAT = "workload report"

    format: Literal["polykv.workload-report"]
    version: Count
    model: str
    kv: KVDimensions | None = None
    scope: str
    objective: str
    seed: Count
    evaluations: Count
    candidates: Count
    samples: SamplesRecord
    workload_profile: ProfileRef
    text_profile: TextProfileRef | None = None
    budgets: list[WorkloadBudget]
    fullkv_accuracy: dict[str, float] = Field(default_factory=dict)
    competence: Competence = Field(default_factory=Competence)
    command: str = ""
    created: str
    machine: Machine
    seconds: float
    seconds_steps: dict[str, float] = Field(default_factory=dict)
    rejudged: bool = False


__all__ = [
    "FORMAT",
    "VERSION",
    "BudgetSeconds",
    "Competence",
    "FamilyVerdict",
    "KVDimensions",
    "RoleMeans",
    "SampleContrast",
    "SamplesRecord",
    "TextProfileRef",
    "WorkloadBudget",
    "WorkloadReport",
]

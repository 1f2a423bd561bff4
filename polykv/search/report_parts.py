"""What the text search's report and the workload search's report hold alike, as typed models: the local search's
record (`SearchRecord`: its result, moves, trace and settings), a plan as saved (`SavedPlan`), the profile that
ranked the moves (`ProfileRef`) and the machine (`Machine`); and how a report model is written and read back
(`SavedReport`).

The models follow the experiment reports' way (`polykv.eval.experiments.report`): built by keyword, read as
attributes, a field this version does not know ignored. A saved report is the `to_dict` of its model: the fields
it was built or read with, so that a report saved before a field existed reads and saves back the same JSON.
"""

from __future__ import annotations

import datetime
import os
import platform
from typing import Annotated, Any, ClassVar, Self

from pydantic import PlainSerializer, ValidationError

from polykv.eval.experiments.report import Count, ReportData, Statistic
from polykv.plan import Plan

# A plan as a report keeps it: `Plan.to_dict` (read back into a `Plan`)
SavedPlan = Annotated[Plan, PlainSerializer(lambda plan: plan.to_dict(), return_type=dict)]


class SavedReport(ReportData):
    """A report saved as JSON: `to_dict` writes the fields it was built or read with (none of the defaults it was
    not given: a report from an earlier version saves back as it was), `from_dict` reads one back."""

    FORMAT: ClassVar[str] = ""  # the "format" the report's file says (set by each report)
    WHAT: ClassVar[str] = "report"  # what it is called in a message
    VERSION: ClassVar[int] = 1  # the newest "version" this PolyKV reads (set by each report)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)

    @classmethod
    def from_dict(cls, saved: Any) -> Self:
        """The report saved with `to_dict` (ValueError, one line, when it is not one this version reads)."""
        version = saved.get("version") if isinstance(saved, dict) else None
        if isinstance(version, int) and not isinstance(version, bool) and version > cls.VERSION:
            raise ValueError(f"a {cls.WHAT} of version {version:,}: this PolyKV reads version {cls.VERSION} at most")
        try:
            return cls.model_validate(saved)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "the report"
            raise ValueError(f"not a {cls.WHAT} this version reads ({where}: {first['msg']})") from None

    @classmethod
    def load(cls, path) -> Self:
        """The report saved at `path` (FileError, one line, when it is not one)."""
        from polykv.errors import FileError
        from polykv.files import read_report

        data = read_report(path, cls.FORMAT, cls.WHAT)
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            raise FileError(f"{path}: {exc}") from None

    def save(self, path) -> None:
        from polykv.files import atomic_write_json

        atomic_write_json(path, self.to_dict())


class MoveRecord(ReportData):
    """An accepted move of the search (`polykv.search.moves.Move`) and its words."""

    kind: str  # "method" | "transfer" | "rule" | "heads"
    phase: str
    layer: Count
    method: str | None = None
    donor: Count | None = None
    amount: Count = 0
    prior: float = 0.0
    capacities: list[Count] = []  # rule moves: the capacities the rule gave the phase
    text: str = ""


class TraceRecord(ReportData):
    """One point of the search's trace (`polykv.search.local_search.TracePoint`)."""

    evaluations: Count
    objective: float
    round: Count
    event: str  # "start", "accepted", "rejected", "budget", "converged"
    move: str = ""
    candidate: float | None = None
    plan: str = ""


class SettingsRecord(ReportData):
    """The search's settings (`polykv.search.local_search.SearchSettings`)."""

    budget: Count
    evaluations: Count
    candidates: Count
    first_rung: Count
    seed: Count
    statistic: str
    min_capacity: Count
    steps: list[float]


class SearchRecord(ReportData):
    """The local search at one budget: the plan it ended on, its objective on the search sequences (or samples),
    where it started, every start's objective, the moves it took, its trace and what it spent."""

    plan: SavedPlan
    objective: float
    metric: str
    start: str
    starts: dict[str, float]
    moves: list[MoveRecord]
    trace: list[TraceRecord]
    evaluations: Count
    settings: SettingsRecord
    stopped: str  # "budget" or "converged"
    rounds: Count = 0
    sequences: Count = 0

    @classmethod
    def of(cls, result) -> SearchRecord:
        """The record of a `polykv.search.local_search.SearchResult`."""
        return cls(
            plan=result.plan,
            objective=result.objective,
            metric=result.metric,
            start=result.start,
            starts=dict(result.starts),
            moves=[MoveRecord(**move.to_dict()) for move in result.moves],
            trace=[TraceRecord(**point.to_dict()) for point in result.trace],
            evaluations=result.evaluations,
            settings=SettingsRecord(**result.settings.to_dict()),
            stopped=result.stopped,
            rounds=result.rounds,
            sequences=result.sequences,
        )


class ProfileRef(ReportData):
    """The profile a search used: its key and calibration capacity."""

    key: str
    b_cal: Count | None = None


class Machine(ReportData):
    """Where a report was made."""

    platform: str
    cpus: Count | None = None
    python: str = ""

    @classmethod
    def here(cls) -> Machine:
        return cls(platform=platform.machine(), cpus=os.cpu_count(), python=platform.python_version())


def created_now() -> str:
    """When a report is made, as the reports write it (UTC, to the second)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


__all__ = [
    "Count",
    "Machine",
    "MoveRecord",
    "ProfileRef",
    "SavedPlan",
    "SavedReport",
    "SearchRecord",
    "SettingsRecord",
    "Statistic",
    "TraceRecord",
    "created_now",
]

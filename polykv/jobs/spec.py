"""What a job is and where it lives: job ids, the job and state files' schemas, the builders of each
job kind (eval, profile, experiment, search), and saving, loading and listing the job files of a
workspace's `jobs/` folder."""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import typing
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_serializer,
    field_validator,
    model_validator,
)

from polykv import limits
from polykv.errors import JobError, PolyKVError, validation_line
from polykv.eval.running.settings import COMPETENCE_THRESHOLD
from polykv.eval.running.unit import Unit
from polykv.files import atomic_write_json, read_json
from polykv.plan import Phase, Plan
from polykv.profile.statistics import STATISTICS
from polykv.question_protocol import QuestionProtocol

FINAL = ("finished", "failed", "cancelled")
MAX_JOB_BYTES = 16 * 1024 * 1024  # a job with thousands of runs is still far smaller; this bounds memory only
MAX_STATE_BYTES = 1024 * 1024
MAX_REPORT_BYTES = 64 * 1024 * 1024  # a placement report holds K plans: K = 999 of 80 layers is ~20 MB
EXPERIMENTS = ("factorial", "placement", "sweep")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def check_id(job_id: object) -> str:
    """`job_id` when it is a valid job id (it names files, so no path segments); JobError otherwise."""
    if isinstance(job_id, str) and _ID.fullmatch(job_id) and ".." not in job_id:
        if not job_id.endswith((".state", ".report")):  # <id>.state.json, <id>.report.json are not jobs
            return job_id
    shown = repr(job_id) if len(repr(job_id)) <= 60 else repr(job_id)[:57] + "..."
    raise JobError(
        f"not a job id: {shown} (1 to 128 letters, digits, '.', '_' or '-', starting with a letter or "
        "digit; no '..', not ending in '.state' or '.report')"
    )


@dataclass(frozen=True)
class DamagedJob:
    """A file in the jobs folder that is not a readable job, and why (one line)."""

    path: Path
    reason: str


# ---- what a job file and a state file may hold ------------------------------------------------------
def _unit_model() -> type[BaseModel]:
    """The fields of `Unit` (taken from the dataclass, so the two cannot drift apart), strictly typed."""
    hints = typing.get_type_hints(Unit)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Unit):
        fields[f.name] = (hints[f.name], ... if f.default is dataclasses.MISSING else f.default)
    return create_model("UnitFields", __config__=ConfigDict(extra="forbid", strict=True), **fields)


_UnitFields = _unit_model()


class ProfileSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    corpus: dict[str, Any]
    capacity: int | None = None
    scopes: list[Literal[tuple(p.value for p in Phase)]] = Field(min_length=1)  # type: ignore[misc]


class ExperimentSpec(BaseModel):
    """An experiment job's arguments: the route (guided plan) is TopRank by `statistic` from `profile`
    in `scope` at `budget` with `allocation` capacities; the factorial's allocated arm is `allocation`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: Literal[EXPERIMENTS]  # type: ignore[valid-type]
    profile: str = Field(min_length=1, max_length=4096)  # a profile key in <workspace>/profiles, or a path
    scope: Literal["prefill", "decode", "both"]
    budget: int = Field(ge=1)
    budgets: list[int] = Field(default_factory=list)  # the sweep's
    baseline: str | None = None  # the factorial's homogeneous method
    baselines: list[str] | None = None  # the sweep's (None: every method with a protocol)
    statistic: Literal[tuple(STATISTICS)] = "cosine"  # type: ignore[valid-type]  # the profile statistics' registry
    allocation: Literal["uniform", "entropy", "ppl"] = "uniform"
    k: int = Field(default=0, ge=0, le=limits.PLACEMENTS)  # the placement control's random placements
    suite: Literal["fidelity", "longbench", "ruler"] = "fidelity"
    settings: dict[str, Any] = Field(default_factory=dict)
    metric: str = "top1"
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _fits(self) -> ExperimentSpec:
        if self.name == "factorial" and not self.baseline:
            raise ValueError("a factorial needs a baseline (its homogeneous method)")
        if self.name == "factorial" and self.allocation == "uniform":
            raise ValueError("the factorial's allocated arm must differ from uniform (entropy or ppl)")
        if self.name == "placement" and self.k < 1:
            raise ValueError("a placement control needs at least one random placement (k)")
        if self.name == "sweep" and (not self.budgets or min(self.budgets) < 1):
            raise ValueError("a sweep needs budgets, positive whole numbers")
        return self


class SearchSpec(BaseModel):
    """A plan search's arguments (`polykv.search`): from `start` (a plan's JSON, the designer's) when it is
    in the search space, TopRank by `statistic` from `profile` and the best homogeneous plan, at `budget`.
    With `sources` (metric answer_nll), a workload search (`polykv.search.workload.run`): `profile` is a workload
    profile or "auto" (computed on the workload's calibration split)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    profile: str = Field(min_length=1, max_length=4096)  # a profile key in <workspace>/profiles, or a path
    scope: Literal["prefill", "decode", "both"]
    budget: int = Field(ge=2)
    evaluations: int = Field(ge=1, le=limits.EVALUATIONS)
    seed: int = Field(default=0, ge=0)
    search_sequences: int = Field(ge=1, le=limits.SEQUENCES)
    held_out: int = Field(ge=2, le=limits.SEQUENCES)
    max_tokens: int = Field(ge=16, le=1_048_576)
    candidates: int = Field(default=8, ge=1, le=limits.CANDIDATES)
    metric: Literal["kl", "dppl", "answer_nll"] = "kl"
    statistic: Literal["cosine", "dppl", "danswer"] = "dppl"
    start: str | None = Field(default=None, max_length=4 * 1024 * 1024)
    # a workload search (metric answer_nll): its sources, transfer tasks, and the text profile whose TopRank joins
    sources: str | None = Field(default=None, max_length=4096)
    transfer: str | None = Field(default=None, max_length=4096)
    text_profile: str | None = Field(default=None, max_length=4096)
    accuracy_samples: int | None = Field(default=None, ge=1, le=limits.SAMPLES_PER_TASK)
    question: QuestionProtocol = Field(default=QuestionProtocol.IN_PROMPT, strict=False)  # read from a value
    competence: float = Field(default=COMPETENCE_THRESHOLD, ge=0.0, le=100.0)  # FullKV accuracy (%) a judged task needs


class RunUnit(BaseModel):
    """One run of an evaluation job and what it stands for (`label`, e.g. {"series": "tova", "budget": 64})."""

    model_config = ConfigDict(extra="forbid", strict=True)

    run_id: str = Field(min_length=1)
    plan_name: str
    label: dict[str, Any]
    unit: _UnitFields  # type: ignore[valid-type]  # the fields of `Unit`: `Unit(**run.unit.model_dump())`


class Job(BaseModel):
    """A background job, as its file holds it (one schema: the job in memory is the job file). Built by the
    builders below, checked whenever it is made or read (`from_dict`); the worker's fields (`pid`, ...) and
    `cancelled` change as it runs."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str
    kind: Literal["eval", "profile", "experiment", "search"]
    title: str
    model: str
    device: str
    created: str
    runs: list[RunUnit] = Field(default_factory=list)
    # each kind's own settings
    profile: ProfileSpec | None = None
    experiment: ExperimentSpec | None = None
    search: SearchSpec | None = None
    # the worker: its pid, start time (Linux clock ticks since boot) and host
    pid: int | None = Field(default=None, gt=1)
    pid_start: int | None = Field(default=None, ge=0)
    host: str | None = None
    cancelled: bool = False
    # what the launch said it would take here (`polykv.costs`), and the cost model's own figure before the
    # correction learned from earlier jobs; the worker records the time it took beside them
    estimate_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    estimate_model_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)

    @classmethod
    def from_dict(cls, data: Any) -> Job:
        """A job from its file's data, validated; JobError (one line) when it is not a job."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise JobError(validation_line(exc)) from None

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        try:
            return check_id(value)
        except JobError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _kind_fits(self) -> Job:
        if self.kind == "eval" and not self.runs:
            raise ValueError("an evaluation job needs at least one run")
        settings = {"profile": self.profile, "experiment": self.experiment, "search": self.search}
        own = None if self.kind == "eval" else self.kind
        article = "an" if self.kind[0] in "aeiou" else "a"
        if own is not None and (settings[own] is None or self.runs):
            raise ValueError(f"{article} {own} job has {own} settings and no runs")
        others = [name for name, value in settings.items() if name != own and value is not None]
        if others:
            raise ValueError(f"{article} {self.kind} job has no {others[0]} settings")
        return self


class JobResult(BaseModel):
    """What a job's worker made (its state file's): each kind sets its own fields; others are ignored."""

    model_config = ConfigDict(extra="ignore")

    report: str | None = None  # an experiment or a search: the report's path
    title: str | None = None  # an experiment: its report's title
    profile: str | None = None  # a profile: its folder
    key: str | None = None  # a profile: its key
    trace: list[dict[str, Any]] = Field(default_factory=list)  # a search: its last points (`search.LIVE_TRACE`)
    best: str | None = None  # a search: the best plan so far, as JSON


class StateFile(BaseModel):
    """A job's `<id>.state.json`: the worker (`polykv.jobs.worker`) writes the fields it set on every change,
    `_read_state` reads it back (files of earlier versions too); times in UTC to the second, as always."""

    model_config = ConfigDict(extra="ignore")  # a file from a later version may hold more

    status: Literal["running", "finished", "failed", "cancelled"]
    fraction: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    start_fraction: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    message: str = ""
    error: str | None = None
    result: JobResult = Field(default_factory=JobResult)
    started: datetime.datetime | None = None
    updated: datetime.datetime | None = None
    # the pace of real work (`polykv.jobs.worker`): when its first piece was done, at which fraction, and how many
    # pieces followed (loading the model and building samples come before)
    pace_from: datetime.datetime | None = None
    pace_fraction: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    pace_steps: int = Field(default=0, ge=0)
    measured_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)  # a finished job's wall time

    @field_validator("started", "updated", "pace_from")
    @classmethod
    def _aware(cls, value: datetime.datetime | None) -> datetime.datetime | None:
        return value.replace(tzinfo=datetime.UTC) if value is not None and value.tzinfo is None else value

    @field_serializer("started", "updated", "pace_from")
    def _to_the_second(self, value: datetime.datetime | None) -> str | None:
        return None if value is None else value.isoformat(timespec="seconds")


# ---- building and starting jobs ----------------------------------------------------------------------
def _new_id(kind: str) -> str:
    return f"{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}-{kind}-{uuid.uuid4().hex[:6]}"


def eval_job(units: list[tuple[dict[str, Any], Unit]], title: str) -> Job:
    """A job that runs `units` (each with its label) in order; they must share model and device."""
    from polykv.eval.running.suite_runner import run_id_for
    from polykv.methods import validate_plan

    if not units:
        raise ValueError("an evaluation job needs at least one run")
    models = {(u.model, u.device) for _, u in units}
    if len(models) != 1:
        raise ValueError("the runs of one job must use one model on one device")
    model, device = models.pop()
    runs = []
    for label, unit in units:
        plan = validate_plan(Plan.from_json(unit.plan_json))  # refuse a bad plan here, not in the background
        run_id = run_id_for(unit.model, plan, unit.suite, unit.settings().to_dict(), unit.seed)
        runs.append(RunUnit(run_id=run_id, plan_name=plan.name, label=dict(label), unit=asdict(unit)))
    return Job(id=_new_id("eval"), kind="eval", title=title, model=model, device=device, created=_now(), runs=runs)


def profile_job(
    model: str, device: str, corpus: dict[str, Any], capacity: int | None, scopes: list[str], title: str
) -> Job:
    spec, kind = ProfileSpec(corpus=corpus, capacity=capacity, scopes=list(scopes)), "profile"
    return Job(id=_new_id(kind), kind=kind, title=title, model=model, device=device, created=_now(), profile=spec)


def experiment_job(model: str, device: str, experiment: dict[str, Any], title: str) -> Job:
    """A job that runs the library's experiment `experiment` describes (see `ExperimentSpec`); JobError (one
    line) when it is not a valid description. `polykv.jobs.experiment.launch_job` builds one and checks,
    before anything runs in the background, that the profile, the settings and every plan are good."""
    try:
        spec = ExperimentSpec.model_validate(experiment)
    except ValidationError as exc:
        raise JobError(validation_line(exc)) from None
    kind = "experiment"
    return Job(id=_new_id(kind), kind=kind, title=title, model=model, device=device, created=_now(), experiment=spec)


def search_job(model: str, device: str, search: dict[str, Any], title: str) -> Job:
    """A job that runs a plan search (`SearchSpec`); JobError (one line) when it is not a valid description.
    `polykv.jobs.search.launch_search` builds one and checks the profile and the start plan first."""
    try:
        spec = SearchSpec.model_validate(search)
    except ValidationError as exc:
        raise JobError(validation_line(exc)) from None
    kind = "search"
    return Job(id=_new_id(kind), kind=kind, title=title, model=model, device=device, created=_now(), search=spec)


def report_path(workspace: Path, job_id: str) -> Path:
    """Where an experiment job's report goes: <workspace>/jobs/<id>.report.json."""
    return jobs_dir(workspace) / f"{check_id(job_id)}.report.json"


def jobs_dir(workspace: Path) -> Path:
    return Path(workspace) / "jobs"


def _spec_path(workspace: Path, job_id: str) -> Path:
    return jobs_dir(workspace) / f"{check_id(job_id)}.json"


def save_job(job: Job, workspace: Path) -> Path:
    path = _spec_path(workspace, job.id)
    atomic_write_json(path, job.model_dump())
    return path


# ---- reading jobs ------------------------------------------------------------------------------------
def _job_from_file(path: Path) -> Job:
    """The job in `path`; JobError whose one line says what is wrong (without the path)."""
    prefix = f"{path}: "
    try:
        data = read_json(path, "job file", max_bytes=MAX_JOB_BYTES, error=JobError)
    except JobError as exc:
        raise JobError(str(exc).removeprefix(prefix)) from None
    job = Job.from_dict(data)
    if path.name != f"{job.id}.json":
        raise JobError(f"its id {job.id!r} is not its file name")
    return job


def load_job(workspace: Path, job_id: str) -> Job:
    """The job `job_id` of `workspace`; JobError (one line) for a bad id, a missing or a damaged job."""
    path = _spec_path(workspace, job_id)
    if not os.path.lexists(path):
        raise JobError(f"no job {job_id!r} in {workspace}")
    try:
        return _job_from_file(path)
    except JobError as exc:
        raise JobError(f"job {job_id}: damaged job file {path}: {exc}") from None


def scan_jobs(workspace: Path) -> tuple[list[Job], list[DamagedJob]]:
    """The jobs of the workspace, newest first, and the files in its jobs folder that are not jobs."""
    folder = jobs_dir(workspace)
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [DamagedJob(folder, f"cannot read the jobs folder ({exc.strerror or exc.__class__.__name__})")]
    found, damaged = [], []
    for name in names:
        if not name.endswith(".json") or name.endswith((".state.json", ".report.json")) or name.startswith("."):
            continue
        path = folder / name
        try:
            check_id(name[: -len(".json")])
            found.append(_job_from_file(path))
        except JobError as exc:
            damaged.append(DamagedJob(path, str(exc)))
    return sorted(found, key=lambda j: j.created + j.id, reverse=True), damaged


def list_jobs(workspace: Path) -> list[Job]:
    """Every valid job in the workspace, newest first (damaged files: `scan_jobs`)."""
    return scan_jobs(workspace)[0]


def _read_state(workspace: Path, job_id: str) -> StateFile | None:
    """The worker's state file, validated; None when there is none or it is damaged (never raises)."""
    path = _spec_path(workspace, job_id).with_suffix(".state.json")
    if not os.path.lexists(path):
        return None
    try:
        return StateFile.model_validate(read_json(path, "job state file", max_bytes=MAX_STATE_BYTES, error=JobError))
    except (PolyKVError, ValidationError, OSError):
        return None

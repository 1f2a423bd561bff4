"""A plan search as a background job (kind "search"): what the app's Search page starts.

`launch_search` builds the job (not started) after checking what it names: the profile (this model's),
the start plan (the designer's, when it is in the search space or rescaled into it: `search_start`) and the
settings. The worker (`python -m polykv.jobs.search run <job file> --workspace W`, started by
`polykv.jobs.start`) calls the search's one entry point at the job's one budget, as `polykv search` does
(`polykv.search.text.run.run_text_search`, `polykv.search.workload.run.run_workload_search`); while it searches,
the job's state holds the trace so far and the best plan so far (`live`), and at the end the report is saved next
to the job (`polykv.jobs.report_path`) and read back, typed, by `read_search`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from polykv.errors import JobError
from polykv.eval.running.settings import COMPETENCE_THRESHOLD
from polykv.files import read_json
from polykv.jobs import worker
from polykv.jobs.experiment import profile_for_job
from polykv.jobs.progress import JobState
from polykv.jobs.spec import MAX_REPORT_BYTES, Job, JobResult, report_path, search_job
from polykv.plan import Plan, PlanError, Scope
from polykv.question_protocol import QuestionProtocol
from polykv.routing import scale_budget
from polykv.search.hooks import SearchHooks
from polykv.search.moves import check_space
from polykv.search.text.report import SearchReport
from polykv.search.workload.report import WorkloadReport
from polykv.workspace import results_path

LIVE_TRACE = 400  # trace points kept in the job's state file (the report keeps them all)


def start_problem(plan: Plan, scope: Scope | str, budget: int) -> str | None:
    """Why `plan` cannot be a start of a search in `scope` at `budget` (None: it can)."""
    if plan.scope is not Scope(scope):
        return f"its scope is {plan.scope.value}, not {Scope(scope).value}"
    try:
        check_space(plan, budget)
    except ValueError as exc:
        return str(exc)
    return None


def search_start(plan: Plan, scope: Scope | str, budget: int) -> tuple[Plan | None, str]:
    """The start a search at `budget` takes from `plan`, and a sentence saying so: the plan itself; or, when only
    its total differs (e.g. 5 layers averaging 51.2 tokens: 256, not 5 x 51 = 255), its route rescaled to the
    budget (`scale_budget`: the capacity shape kept); or None and why it cannot start."""
    problem = start_problem(plan, scope, budget)
    if problem is None:
        return plan, f"Starts from the designer's plan {plan.name!r}"
    if plan.scope is Scope(scope):
        try:
            rescaled = scale_budget(plan, budget, name=plan.name, description=plan.description)
        except PlanError:
            rescaled = None
        if rescaled is not None and start_problem(rescaled, scope, budget) is None:
            return rescaled, f"Starts from the designer's plan {plan.name!r} rescaled to budget {budget} ({problem})"
    return None, f"The designer's plan is not a start ({problem})"


def launch_search(
    workspace: Path,
    model: str,
    device: str,
    *,
    profile: str,
    scope: str,
    budget: int,
    start: Plan | None = None,
    evaluations: int = 200,
    seed: int = 0,
    search_sequences: int = 4,
    held_out: int = 8,
    max_tokens: int = 256,
    candidates: int = 8,
    metric: str = "kl",
    statistic: str = "dppl",
    sources: str | None = None,
    transfer: str | None = None,
    text_profile: str | None = None,
    accuracy_samples: int | None = None,
    loaded: tuple[Any, Any] | None = None,
    question: QuestionProtocol = QuestionProtocol.IN_PROMPT,
    competence: float = COMPETENCE_THRESHOLD,
) -> Job:
    """The search job these arguments describe, checked (JobError or ValueError, one line); `start` is used
    when it is in the search space, or rescaled to the budget when only its total is off (`search_start`).
    With `sources`, a workload search (answer_nll): `profile` is a workload profile or "auto", `text_profile`
    (optional) a text profile for toprank-text."""
    if sources is not None:
        from polykv.eval.workloads.workload import parse_workload
        from polykv.eval.workloads.workload import split_sources as split

        workload = parse_workload(split(sources), max_tokens, question=question)  # one line when bad
        others = tuple(parse_workload(split(transfer), max_tokens).tasks) if transfer else ()
        if loaded is not None:  # the model at hand: each task's first sample must fit it (`polykv.eval.running.fit`)
            from polykv.eval.running.fit import check_fits
            from polykv.search.workload.samples import verdict_settings

            for suite_settings in verdict_settings(workload, held_out, others, accuracy_samples).values():
                check_fits(workload.suite, suite_settings, *loaded, seed=seed)
        metric, statistic, start = "answer_nll", "danswer", None
        if text_profile:
            profile_for_job(text_profile, Path(workspace), model)
        layers = None
        if profile != "auto":
            loaded = profile_for_job(profile, Path(workspace), model)
            if not loaded.is_workload:
                raise JobError(f"profile {loaded.key} has no danswer: a workload search needs a workload profile")
    else:
        loaded = profile_for_job(profile, Path(workspace), model)
        layers = loaded.num_layers
    if start is not None and start.num_layers != layers:
        raise JobError(f"the start plan has {start.num_layers} layers, the profile's model {layers}")
    if start is not None:
        start = search_start(start, scope, budget)[0]
    spec = {
        "profile": profile,
        "scope": scope,
        "budget": budget,
        "evaluations": evaluations,
        "seed": seed,
        "search_sequences": search_sequences,
        "held_out": held_out,
        "max_tokens": max_tokens,
        "candidates": candidates,
        "metric": metric,
        "statistic": statistic,
        "start": start.to_json() if start is not None else None,
        "sources": sources,
        "transfer": transfer,
        "text_profile": text_profile,
        "accuracy_samples": accuracy_samples,
        "question": question,
        "competence": float(competence),
    }
    origin = f"from {start.name}, " if start is not None else ""
    what = f"workload {sources}" if sources else (loaded.key if profile != "auto" else "auto")
    asked = f" · question {question}" if sources else ""
    title = f"search · {what}{asked} · {scope} b{budget} · {origin}{evaluations} executions"
    return search_job(model, device, spec, title)


def live(state: JobState) -> tuple[list[dict[str, Any]], Plan | None]:
    """(the trace so far, the best plan so far) of a search job, from its state."""
    best = state.result.best
    try:
        plan = Plan.from_json(best) if best is not None else None
    except ValueError:
        plan = None
    return state.result.trace, plan


def run_job(job, workspace: Path, store, report: Callable[..., dict], activate: Callable[[str | None], None]):
    """The work of a search job's worker (`polykv.jobs` keeps its state, log and cancel): the text search
    (`polykv.search.text.run.run_text_search`), its report saved next to the job."""
    from polykv.models import load_model
    from polykv.search.text.run import TextSearchSettings, run_text_search

    spec = job.search
    if spec.sources:
        return run_workload_job(job, workspace, report)
    profile = profile_for_job(spec.profile, Path(workspace), job.model)
    start = Plan.from_json(spec.start) if spec.start else None
    model, tokenizer = load_model(job.model, device=job.device)  # quiet: no progress bars in the log

    def on_step(used: int, total: int, where: str) -> None:
        # the held-out verdict comes after the search: the search is 90% of the work shown
        report(fraction=min(0.9, 0.9 * used / total), message=f"{used}/{total} executions · {where}")

    settings = TextSearchSettings(
        scope=spec.scope,
        budgets=(spec.budget,),
        evaluations=spec.evaluations,
        seed=spec.seed,
        search_sequences=spec.search_sequences,
        held_out=spec.held_out,
        max_tokens=spec.max_tokens,
        candidates=spec.candidates,
        metric=spec.metric,
        statistic=spec.statistic,
    )
    stages = {"sequences": "building the search and held-out sequences"}
    trace = _LiveTrace(report)
    path = report_path(workspace, job.id)
    found, plans = run_text_search(
        model,
        tokenizer,
        job.model,
        profile,
        settings,
        start=start,
        report_file=path,
        command=f"app search job {job.id}",
        hooks=SearchHooks(stage=lambda stage: _say(report, stages.get(stage)), step=on_step, trace=trace),
    )
    report(result=trace.result(plans[0]).model_copy(update={"report": str(path)}), message="done")


def run_workload_job(job, workspace: Path, report: Callable[..., dict]) -> None:
    """A workload search's worker (`polykv.search.workload.run.run_workload_search`): its held-out runs go to the
    workspace's store, so the Runs and Compare pages show them beside every other run."""
    from polykv.eval.results.store import Store
    from polykv.eval.workloads.workload import parse_workload
    from polykv.eval.workloads.workload import split_sources as split
    from polykv.models import load_model
    from polykv.search.workload.run import WorkloadSearchSettings, run_workload_search

    spec, workspace = job.search, Path(workspace)
    workload = parse_workload(split(spec.sources), spec.max_tokens, question=spec.question)
    transfer = tuple(parse_workload(split(spec.transfer), spec.max_tokens).tasks) if spec.transfer else ()
    model, tokenizer = load_model(job.model, device=job.device)
    profile = "auto" if spec.profile == "auto" else profile_for_job(spec.profile, workspace, job.model)
    text = profile_for_job(spec.text_profile, workspace, job.model) if spec.text_profile else None

    def on_step(used: int, total: int, where: str) -> None:
        report(fraction=0.3 + min(0.4, 0.4 * used / total), message=f"{used}/{total} executions · {where}")

    def on_sample(done: int, total: int, where: str) -> None:
        report(fraction=0.7 + 0.3 * done / max(total, 1), message=f"verdict · {done}/{total} samples")

    settings = WorkloadSearchSettings(
        scope=spec.scope,
        budgets=(spec.budget,),
        evaluations=spec.evaluations,
        candidates=spec.candidates,
        seed=spec.seed,
        search_per_task=spec.search_sequences,
        held_out=spec.held_out,
        transfer=transfer,
        accuracy=spec.accuracy_samples,
        competence=spec.competence,
    )
    stages = {"samples": "drawing the search and held-out samples", "profile": "profiling the workload"}
    trace = _LiveTrace(report)
    path = report_path(workspace, job.id)
    found, plans = run_workload_search(
        model,
        tokenizer,
        job.model,
        workload,
        profile,
        settings,
        text_profile=text,
        store=Store(results_path(workspace)),
        profiles=workspace / "profiles",
        report_file=path,
        command=f"app search job {job.id}",
        hooks=SearchHooks(
            stage=lambda stage: _say(report, stages.get(stage)),
            profile=lambda fraction, message: report(fraction=0.3 * fraction, message=f"workload profile · {message}"),
            say=lambda message: report(message=message),
            step=on_step,
            trace=trace,
            sample=on_sample,
        ),
    )
    report(result=trace.result(plans[0]).model_copy(update={"report": str(path)}), message="done")


class _LiveTrace:
    """The trace so far and the best plan so far, in the job's state (`live` reads them back)."""

    def __init__(self, report: Callable[..., dict]):
        self.report, self.points = report, []

    def __call__(self, point, best: Plan) -> None:
        self.points.append(point.to_dict())
        self.report(result=self.result(best))

    def result(self, best: Plan) -> JobResult:
        return JobResult(trace=self.points[-LIVE_TRACE:], best=best.to_json())


def _say(report: Callable[..., dict], message: str | None) -> None:
    if message is not None:
        report(message=message)


def read_search(job, workspace: Path) -> SearchReport | WorkloadReport:
    """The report a finished search job saved, typed (a text search's or a workload search's); JobError (one line)
    when it has none or it cannot be read."""
    path = report_path(workspace, job.id)
    if not path.exists():
        raise JobError(f"job {job.id} has no report yet")
    data = read_json(path, "search report", max_bytes=MAX_REPORT_BYTES, error=JobError)
    kind = WorkloadReport if isinstance(data, dict) and data.get("format") == WorkloadReport.FORMAT else SearchReport
    try:
        found = kind.from_dict(data)
    except ValueError as exc:
        raise JobError(f"{path}: {exc}") from None
    if not found.budgets:
        raise JobError(f"{path}: not a search report (no budget)")
    return found


def main(argv: list[str] | None = None) -> int:
    return worker.main(argv, experiment=run_job, prog="polykv.jobs.search")


if __name__ == "__main__":
    sys.exit(main())

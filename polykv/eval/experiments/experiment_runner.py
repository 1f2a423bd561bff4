"""What every experiment shares: the `ExperimentRunner` that makes (or finds) the runs an experiment needs
and reads their scores, and how a paired contrast is written down (its report: `experiments.report`)."""

from __future__ import annotations

from dataclasses import dataclass

from polykv.eval.comparing.compare import Paired, macro_average, paired, sample_scores
from polykv.eval.results.store import Store
from polykv.eval.running.backends import backend
from polykv.eval.running.shards import run_sharded
from polykv.eval.running.suite_runner import SUITES, plan_hash, run_suite
from polykv.eval.running.unit import Unit
from polykv.eval.statistics.contrast import direction
from polykv.eval.statistics.render import format_p, interval
from polykv.eval.statistics.samples import detectable
from polykv.plan import FULL, Plan
from polykv.progress import Progress, Step

ROUTE_UNIFORM, ROUTE_PPL, FULLKV = "route-uniform", "route-ppl", FULL
ROUTES = (ROUTE_UNIFORM, ROUTE_PPL)
PERMUTATIONS = 10_000  # shuffles of the placement control's permutation test


def suite_metrics(suite: str) -> tuple[str, ...]:
    """The task metrics the runs of `suite` report, any of which can score an experiment (fidelity names its
    own; the other suites report one `score`)."""
    from polykv.eval.running.settings import suite_module

    return tuple(getattr(suite_module(suite), "METRICS", ("score",)))


def check_metric(suite: str, metric: str) -> None:
    """One line (SettingsError) when `suite`'s runs do not report `metric`: checked before a model loads."""
    from polykv.errors import SettingsError

    reported = suite_metrics(suite)
    if metric not in reported:
        raise SettingsError(f"the {suite} suite does not report {metric} (it reports {', '.join(reported)})")


@dataclass
class ExperimentRunner:
    """Everything an experiment needs to execute its runs: the model, the store, the suite and its settings.
    (Executing one run is `polykv.eval.running.suite_runner.run_suite`; where runs execute,
    `polykv.eval.running.backends`.)"""

    store: Store
    model_name: str
    model: object
    tokenizer: object
    suite: str = "fidelity"
    settings: object = None
    seed: int = 0
    metric: str = "top1"
    progress: Step | None = None  # told each plan's name before its run starts
    # told (done, total, where) as samples finish within a run (local backend; the callback of `run_suite`)
    on_sample: Progress | None = None
    backend: str = "local"  # "ray": the runs of an experiment execute in parallel as Ray tasks (`backends.backend`)
    device: str = "cpu"
    # local backend: the runs of one call execute together, sample by sample, in one batch (`run_suites`;
    # equal to one at a time up to float rounding); `progress` is then told once, with the runs' count
    batched: bool = False
    # batched, local: share the samples out over this many processes (`polykv.eval.running.shards`; 1: this process)
    workers: int = 1
    # run nothing: every plan's run is read from the store, the newest finished one of the same model, plan, suite,
    # settings and seed whatever code revisions made it (a report rendered again from its database)
    replay: bool = False

    def run(self, plan: Plan) -> str:
        return self.run_all([plan])[0]

    def _replayed(self, plan: Plan) -> str:
        """The newest finished run of the plan with these settings, or failing that one whose settings differ only
        in holding more tasks (each task's samples do not depend on the others: `_asked` reads only these)."""
        settings = (self.settings or SUITES[self.suite].Settings()).to_dict()
        stored = self.store.finished_runs(self.model_name, plan_hash(plan), self.suite, self.seed)
        rest = lambda given: {k: v for k, v in given.items() if k != "tasks"}  # noqa: E731
        more = lambda given: set(settings.get("tasks") or ()) <= set(given.get("tasks") or ())  # noqa: E731
        found = next((run for run, given in stored if given == settings), None)
        if found is None and "tasks" in settings:
            found = next((run for run, given in stored if rest(given) == rest(settings) and more(given)), None)
        if found is None:
            raise ValueError(
                f"replay: the database holds no finished run of {plan.name} on {self.suite} with these settings"
            )
        return found

    def run_all(self, plans: list[Plan]) -> list[str]:
        if self.replay:
            return [self._replayed(plan) for plan in plans]
        chosen = backend(self.backend, waiting=True)  # the scores are read next: a backend that waits for them
        if chosen.name == "local" and self.batched and (len(plans) > 1 or self.workers > 1):
            if self.progress is not None:
                self.progress(
                    f"{len(plans)} runs together" + (f", {self.workers} processes" if self.workers > 1 else "")
                )
            return run_sharded(  # one worker: run_suites in this process
                self.store,
                self.model_name,
                self.model,
                self.tokenizer,
                plans,
                self.suite,
                self.settings,
                self.seed,
                workers=self.workers,
                device=self.device,
                progress=self.on_sample,
            )
        if chosen.name == "local":  # this process: the model already loaded, the settings as they are
            ids = []
            for plan in plans:  # one at a time, so that `progress` names the run that `on_sample` reports on
                if self.progress is not None:
                    self.progress(plan.name)
                ids.append(
                    run_suite(
                        self.store,
                        self.model_name,
                        self.model,
                        self.tokenizer,
                        plan,
                        self.suite,
                        self.settings,
                        self.seed,
                        progress=self.on_sample,
                    )
                )
            return ids
        if self.progress is not None:
            for plan in plans:
                self.progress(plan.name)
        units = [Unit.of(self.model_name, plan, self.suite, self.settings, self.seed, self.device) for plan in plans]
        return chosen.run(units, self.store.path)

    def task_scores(self, run_id: str) -> dict[str, float]:
        return {
            task: values[self.metric] for task, values in self.store.task_scores(run_id).items() if self._asked(task)
        }

    def sample_scores(self, run_id: str, metric: str | None = None) -> dict[str, dict[str, float]]:
        """{task: {sample id: the metric}} (the runner's metric unless told): what the sample-level tests pair."""
        scores = sample_scores(self.store, run_id, metric or self.metric)
        return {task: v for task, v in scores.items() if self._asked(task)}

    def measured_kv(self, run_id: str):
        """The KV the run's plan held, measured (`polykv.eval.results.kv_measured.MeasuredKV`, FullKV's beside it),
        over the samples of the settings' tasks; None where no sample carries a measurement."""
        from polykv.eval.results.kv_measured import measured_kv
        from polykv.models import layer_windows

        rows = [row for row in self.store.samples(run_id) if self._asked(row.task)]
        return measured_kv(rows, layer_windows(self.model))

    def _asked(self, task: str) -> bool:
        """Is `task` one of the settings' tasks? (A replayed run may hold more: `Store.finished_run`.)"""
        tasks = getattr(self.settings, "tasks", None)
        return not self.replay or tasks is None or task.split("@")[0] in tasks  # RULER's task@length

    def scores(self, run_id: str) -> Scores:
        return Scores(self.task_scores(run_id), self.sample_scores(run_id))

    def score(self, run_id: str) -> float:
        return macro_average(self.task_scores(run_id))

    @property
    def sign(self) -> int:
        return direction(self.metric)


@dataclass(frozen=True)
class Scores:
    """A run's scores in one metric: per task, and per task and sample."""

    tasks: dict[str, float]
    samples: dict[str, dict[str, float]]

    def minus(self, other: Scores) -> Scores:
        """Per task and per sample, self - other (on what both have): the per-task contrast of an interaction."""
        shared = sorted(set(self.tasks) & set(other.tasks))
        return Scores(
            {t: self.tasks[t] - other.tasks[t] for t in shared},
            {
                t: {
                    s: v - other.samples[t][s]
                    for s, v in self.samples.get(t, {}).items()
                    if s in other.samples.get(t, {})
                }
                for t in shared
            },
        )


def contrast(a: Scores, b: Scores, metric: str, seed: int) -> Paired:
    """a vs b: the paper's paired bootstrap over tasks and, when both runs kept per-sample scores of the same
    samples, the sample-level test (`compare.paired`)."""
    shared = any(set(a.samples.get(t, {})) & set(b.samples.get(t, {})) for t in a.samples)
    return paired(a.tasks, b.tasks, metric, seed, samples=(a.samples, b.samples) if shared else None)


def _ci(result: Paired) -> str:
    text = (
        f"{result.difference:+.4f} {result.metric}, 95% paired bootstrap CI {interval(result.low, result.high)} "
        f"{result.resampling()}"
    )
    if result.samples is not None:
        test = result.samples
        text += (
            f"; sample level 95% CI {interval(test.low, test.high)}, sign-flip p = {format_p(test.p_value)} over "
            f"{test.samples} paired samples ({test.differing} differ), "
            f"minimal detectable difference {detectable(test.mde, '.4g')}"
        )
    return text + f"; {result.verdict()}"

"""One experiment from start to end, the one entry point that both the CLI (`polykv experiment factorial`,
`placement`, `sweep`, `leaderboard`) and the experiment jobs (`polykv.jobs.experiment`) call: `run_experiment`.

An `Experiment` is what runs: its name, the plans it runs (built before anything loads, so that a bad argument
fails first; its cost and its progress count them) and the call that runs it on an `ExperimentRunner`; one
builder per experiment (`factorial_experiment`, `placement_experiment`, `sweep_experiment`, `leaderboard_experiment`:
the CLI's only). `ExperimentSetup`
is where it runs: the model, the suite and its settings, the seed, the metric that scores a run, the device and
the backend. `run_experiment` checks what can be checked before the model loads (the backend, the metric),
loads the model, refuses a suite whose first samples cannot run on it (`polykv.eval.running.fit`), hands the
loaded model to `on_model` (the CLI says the cost there) and runs the experiment, its runs and samples told to
`on_run` and `on_sample`; what it returns, the `Report`, the CLI prints and a job saves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polykv.eval.experiments.experiment_runner import ExperimentRunner, check_metric
from polykv.eval.experiments.factorial import factorial, factorial_plans
from polykv.eval.experiments.leaderboard import REFERENCES, check_choices, leaderboard, leaderboard_plans
from polykv.eval.experiments.placement import placement, placement_plans
from polykv.eval.experiments.report import Report
from polykv.eval.experiments.sweep import sweep, sweep_plans
from polykv.eval.running.backends import Load
from polykv.plan import Plan, Scope
from polykv.progress import Progress, Step

if TYPE_CHECKING:
    from polykv.eval.results.store import Store
    from polykv.profile.store import Profile

OnModel = Callable[[Any, Any, Any], None]  # (model, tokenizer, the suite's settings), once loaded and checked


@dataclass(frozen=True)
class Experiment:
    """An experiment ready to run: `name` (factorial, placement or sweep), the plans it runs and the call that
    runs them on an `ExperimentRunner` and returns its report."""

    name: str
    plans: tuple[Plan, ...]
    call: Callable[[ExperimentRunner], Report]


def factorial_experiment(
    profile: Profile,
    scope: Scope | str,
    budget: int,
    baseline: str,
    statistic: str = "cosine",
    allocation: str = "entropy",
) -> Experiment:
    """Routing x allocation at `budget` (`polykv.eval.experiments.factorial`)."""
    args = (profile, scope, budget, baseline, statistic, allocation)
    plans = tuple(factorial_plans(*args).values())
    return Experiment("factorial", plans, lambda runner: factorial(runner, *args))


def placement_experiment(
    profile: Profile, guided: Plan, k: int, statistic: str = "cosine", seed: int = 0
) -> Experiment:
    """The guided route against `k` random count-matched placements drawn with `seed` (the runner's seed)."""
    plans = tuple(placement_plans(guided, k, seed))
    return Experiment("placement", plans, lambda runner: placement(runner, profile, guided, k, statistic))


def sweep_experiment(
    route: Plan,
    budgets: Sequence[int],
    baselines: Sequence[str] | None = None,
    profile: Profile | None = None,
    overrides: Mapping[str, Scope | str] | None = None,
) -> Experiment:
    """A fixed route across `budgets` against the baselines (`polykv.eval.experiments.sweep`)."""
    plans = tuple(sweep_plans(route, budgets, baselines, profile, overrides).values())
    return Experiment("sweep", plans, lambda runner: sweep(runner, route, budgets, baselines, profile, overrides))


def leaderboard_experiment(
    num_layers: int,
    methods: Sequence[str],
    budgets: Sequence[int],
    references: Sequence[str] = REFERENCES,
    scope: Scope | str = Scope.PREFILL,
    question_budget: int | None = None,
) -> Experiment:
    """Every method in `methods` alone at `budgets`, against `references`, and at `question_budget` under the other
    question protocol too (`polykv.eval.experiments.leaderboard`)."""
    board = leaderboard_plans(num_layers, methods, budgets, scope)
    check_choices(methods, budgets, references, question_budget)
    twice = [] if question_budget is None else [p for k, p in board.items() if k.endswith(f"@{question_budget}")]
    plans = tuple(board.values()) + tuple(twice) + ((board["full"],) if twice else ())  # what the cost counts

    def call(runner: ExperimentRunner) -> Report:
        return leaderboard(runner, methods, budgets, references, scope, question_budget)

    return Experiment("leaderboard", plans, call)


@dataclass(frozen=True)
class ExperimentSetup:
    """Where an experiment runs: `model` on `device`, the runs on `suite` with `settings` (its `Settings`) and
    `seed`, scored by `metric`; `backend` local or ray; `batched`: the local runs together, sample by sample."""

    model: str
    suite: str
    settings: Any
    seed: int = 0
    metric: str = "top1"
    device: str = "cpu"
    backend: str = "local"
    batched: bool = False


def run_experiment(
    experiment: Experiment,
    setup: ExperimentSetup,
    store: Store | Path,
    *,
    load: Load | None = None,
    on_model: OnModel | None = None,
    on_run: Step | None = None,
    on_sample: Progress | None = None,
) -> Report:
    """Run `experiment` as `setup` says, its runs in `store` (a `Store`, or the path of the results database,
    opened once the checks passed), and return its report. Before the model loads: the backend (one that waits
    for its runs' scores) and the metric (one the suite reports); `load` (default `polykv.models.load_model`)
    loads it; then the suite's first sample of each task must build on it. `on_model(model, tokenizer,
    settings)` is told once it is loaded and checked, before any run (it may stop the experiment by raising);
    `on_run` each run's plan before it starts, `on_sample` its samples as they finish."""
    from polykv.eval.running.backends import backend
    from polykv.eval.running.fit import check_fits

    backend(setup.backend, waiting=True)  # an experiment reads its runs' scores: local or ray
    check_metric(setup.suite, setup.metric)
    if load is None:
        from polykv.models import load_model

        load = lambda name, device: load_model(name, device=device)  # noqa: E731  quiet: no progress bars
    model, tokenizer = load(setup.model, setup.device)
    check_fits(setup.suite, setup.settings, model, tokenizer, seed=setup.seed)  # what cannot run is not started
    if on_model is not None:
        on_model(model, tokenizer, setup.settings)
    if isinstance(store, Path):
        from polykv.eval.results.store import Store

        store = Store(store)
    runner = ExperimentRunner(
        store,
        setup.model,
        model,
        tokenizer,
        setup.suite,
        setup.settings,
        setup.seed,
        setup.metric,
        progress=on_run,
        on_sample=on_sample,  # the local backend's samples; ray runs report in the store only
        backend=setup.backend,
        device=setup.device,
        batched=setup.batched,
    )
    return experiment.call(runner)


__all__ = [
    "Experiment",
    "ExperimentSetup",
    "factorial_experiment",
    "leaderboard_experiment",
    "placement_experiment",
    "run_experiment",
    "sweep_experiment",
]

"""Controlled experiments, as in the paper. Each creates the runs it needs (through `run_suite`, so
finished runs are reused) and reports from their scores; none scores anything by itself.

  factorial  routing (homogeneous baseline vs TopRank route) x allocation (uniform vs profile-derived)
             at the same total capacity (Table 2). Primary: routing under uniform allocation
             (routed-uniform - homogeneous-uniform) with a paired bootstrap CI over tasks,
             wins/ties/losses and every leave-one-task-out value; secondary: the allocation effect under
             each routing and the interaction.
  placement  the guided route vs K unique random count-matched placements (Table 4 / Figure 4).
             Primary: tie-aware Spearman between the profile score S(rho) and the suite score over the K
             random placements only, one-sided permutation p; secondary (descriptive): the guided
             route's rank among K + 1 and its Monte Carlo p, and its gap to the random mean.
  sweep      a fixed route at several budgets (Table 5): route-uniform, route-ppl (with a
             profile), every standalone baseline under its own protocol (`polykv.eval.method_protocols`),
             FullKV once, the per-budget best-baseline envelope, route - envelope with a paired CI, and
             whether the route at b matches the best baseline at 2b.
  leaderboard every method alone at several budgets in one scope and question protocol, each against reference
             methods (TOVA, the random control) sample by sample, Holm over each family; optionally each plan
             against itself under the other question protocol (`leaderboard`, its page `leaderboard_page`).

`launch_plans` builds the labelled plans of one launch from the web app (the route at its budgets,
baselines, placements), which a background job (`polykv.jobs`) then runs; an experiment as a background
job (kind "experiment") is `polykv.jobs.experiment`.

A run's suite score is the macro-average over tasks of one metric (`polykv.eval.statistics.contrast` says
which way is better; the reports are in the metric's own units, differences are A - B as named). Every report prints
its metric and direction and the protocol it ran, and keeps its numbers in `Report.data`, one typed model per
experiment (`FactorialData`, `PlacementData`, `SweepData`) read as attributes; `Report.to_dict` is its
strict-JSON form and `Report.from_dict` reads it back into the same models.

The package: `experiment_runner` (ExperimentRunner), `report` (Report and its data models), `factorial`,
`placement`, `sweep`, `leaderboard` (one experiment each; `leaderboard_page` its Markdown), `launch` (the web
app's launches) and `run` (an experiment from start to end: `run_experiment`, the one entry point of
`polykv experiment factorial|placement|sweep|leaderboard` and of the experiment jobs, imported from its module);
the rest is importable from here.
"""

from polykv.eval.experiments.allocation import AllocationData  # its report data reads back with the others
from polykv.eval.experiments.experiment_runner import (
    FULLKV,
    PERMUTATIONS,
    ROUTE_PPL,
    ROUTE_UNIFORM,
    ExperimentRunner,
    suite_metrics,
)
from polykv.eval.experiments.factorial import FACTORIAL_CELLS, factorial, factorial_plans
from polykv.eval.experiments.launch import launch_plans, plan_budget
from polykv.eval.experiments.placement import placement, placement_plans
from polykv.eval.experiments.report import FactorialData, PlacementData, Report, SweepData
from polykv.eval.experiments.sweep import route_ppl, route_uniform, sweep, sweep_plans
from polykv.eval.method_protocols import baseline_methods

__all__ = [
    "FACTORIAL_CELLS",
    "FULLKV",
    "PERMUTATIONS",
    "ROUTE_PPL",
    "ROUTE_UNIFORM",
    "AllocationData",
    "ExperimentRunner",
    "FactorialData",
    "PlacementData",
    "Report",
    "SweepData",
    "baseline_methods",
    "factorial",
    "factorial_plans",
    "launch_plans",
    "placement",
    "placement_plans",
    "plan_budget",
    "route_ppl",
    "route_uniform",
    "suite_metrics",
    "sweep",
    "sweep_plans",
]

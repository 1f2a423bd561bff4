"""The experiment charts (app/charts/experiments.py) on reports the library makes from injected scores, read
back as saved (`Report.to_dict`, then `Report.from_dict`): the sweep's log budget axis, FullKV line and
route-minus-envelope panel, the placement scatter and its selection, the factorial's 2x2 table."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pytest

from app import charts
from polykv.eval.experiments import FACTORIAL_CELLS, ExperimentRunner, Report, plan_budget, sweep
from polykv.eval.experiments.report import FactorialData, PlacedRun
from polykv.eval.results.store import Store
from polykv.plan import FULL, Plan
from tests.helpers import fake_run


@dataclass
class ScoredRunner(ExperimentRunner):
    """Runs nothing: each plan becomes a finished run whose kl per task is made up from its budget and
    first method (FullKV: 0), so that the library's report has real numbers to draw."""

    def run_all(self, plans: list[Plan]) -> list[str]:
        ids = []
        for plan in plans:
            run_id = f"fake-{plan.name}"
            method = plan.layers[0].decode.method
            budget = plan_budget(plan)
            base = 0.0 if method == FULL else 4.0 / budget + (0.02 if method == "h2o" else 0.0)
            scores = {f"t{i}": {"kl": base + 0.01 * i * (method == "tova")} for i in range(4)}
            fake_run(
                self.store, run_id, scores, model="fake", plan_name=plan.name, samples=False, plan_json=plan.to_json()
            )
            ids.append(run_id)
        return ids


def sweep_data(tmp_path, budgets):
    runner = ScoredRunner(Store(tmp_path / "results.sqlite"), "fake", None, None, metric="kl")
    route = Plan.homogeneous("tova", 16, 4, "decode", name="route")
    return Report.from_dict(sweep(runner, route, budgets, ["tova", "h2o"]).to_dict()).data


def test_the_sweep_figure_has_a_log_budget_axis_a_fullkv_line_and_a_route_minus_envelope_panel(tmp_path):
    data = sweep_data(tmp_path, [8, 16, 64])
    frame, versus, full = charts.sweep_frames(data)
    assert frame["budget"].tolist() == [8, 16, 64] and full == data.full.score == 0.0
    fig = charts.sweep_figure(frame, "kl", full, versus)
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type == "log"  # 8 .. 64 spans a factor 8
    traces = {t.name: t for t in fig.data}
    assert list(traces)[:5] == [
        "tova",
        "h2o",
        "best baseline (envelope)",
        "best alone in the route's scope",
        "route-uniform",
    ]
    assert list(traces["route-uniform"].y) == [data.scores["route-uniform"][b] for b in (8, 16, 64)]
    fullkv = traces["FullKV"]  # horizontal, across the budgets
    assert list(fullkv.x) == [8, 64] and list(fullkv.y) == [0.0, 0.0] and fullkv.yaxis == "y"
    alone = traces["route-uniform - best alone in its scope (95% CI)"]  # like with like, drawn first
    assert alone.yaxis == "y2" and list(alone.y) == [data.versus_matched[b].difference for b in (8, 16, 64)]
    panel = traces["route-uniform - envelope (across protocols) (95% CI)"]
    assert panel.yaxis == "y2" and list(panel.x) == [8, 16, 64]
    contrasts = [data.versus_envelope[b] for b in (8, 16, 64)]
    assert list(panel.y) == [c.difference for c in contrasts]
    assert list(panel.error_y.array) == pytest.approx([c.high - c.difference for c in contrasts])
    assert list(panel.error_y.arrayminus) == pytest.approx([c.difference - c.low for c in contrasts])
    assert any(shape.y0 == 0 and shape.yref == "y2" for shape in fig.layout.shapes)  # the zero line
    assert "route - best (kl)" == fig.layout.yaxis2.title.text


def test_the_sweep_budget_axis_is_linear_within_a_factor_two_and_the_eval_job_table_still_draws(tmp_path):
    data = sweep_data(tmp_path, [16, 32])
    fig = charts.sweep_figure(*charts.sweep_frames(data)[:1], "kl")
    assert fig.layout.xaxis.type == "linear" and "FullKV" not in [t.name for t in fig.data]
    # the Runs page's sweep table (columns route, baselines, best baseline, envelope): one panel
    table = pd.DataFrame(
        {
            "budget": [16, 64],
            "route": [0.3, 0.2],
            "tova": [0.4, 0.25],
            "best baseline": ["tova"] * 2,
            "envelope": [0.4, 0.25],
        }
    )
    fig = charts.sweep_figure(table, "kl")
    assert [t.name for t in fig.data] == ["tova", "best baseline (envelope)", "route"]
    assert fig.layout.xaxis.type == "log" and all(t.yaxis in (None, "y") for t in fig.data)  # 16 .. 64: log


GUIDED = PlacedRun(plan="guided", run="g", S=0.9, score=0.1, plan_json="{}")
RANDOM = [
    PlacedRun(index=0, plan="p0", run="r0", S=0.2, score=0.5, plan_json="{}"),
    PlacedRun(index=1, plan="p1", run="r1", S=0.6, score=0.3, plan_json="{}"),
]


def test_the_placement_scatter_carries_each_placements_index_and_states_spearman_and_p():
    fig = charts.placement_scatter(GUIDED, RANDOM, "kl", 0.5, 0.25)
    points, guided = fig.data
    assert (list(points.x), list(points.y)) == ([0.2, 0.6], [0.5, 0.3])
    assert [list(c) for c in points.customdata] == [[0], [1]]
    assert (list(guided.x), list(guided.y), guided.marker.symbol) == ([0.9], [0.1], "star")
    assert "Spearman rho = +0.500, one-sided permutation p = 0.2500" in fig.layout.title.text
    assert fig.layout.xaxis.title.text == "profile score S(rho)" and fig.layout.yaxis.title.text == "kl"
    assert "Spearman not estimable" in charts.placement_scatter(GUIDED, RANDOM[:1], "kl", None, None).layout.title.text


def test_a_selected_point_names_its_placement():
    assert charts.selected_placement([{"customdata": [1]}], GUIDED, RANDOM) is RANDOM[1]
    assert charts.selected_placement([{"customdata": [-1]}], GUIDED, RANDOM) is GUIDED
    assert charts.selected_placement([{"customdata": 0}], GUIDED, RANDOM) is RANDOM[0]
    assert charts.selected_placement([], GUIDED, RANDOM) is None
    assert charts.selected_placement([{"x": 1.0}, {"customdata": [7]}], GUIDED, RANDOM) is None


# a contrast as reports saved it before the sample-level test (no sample, verdict or task_mde)
CONTRAST = {"difference": 0.1, "low": 0.0, "high": 0.2, "replicates": 100, "tasks": 3, "clusters": 0}
CONTRAST |= {"wins": 2, "ties": 0, "losses": 1, "leave_one_out": {"t1": 0.1, "t2": 0.1, "t3": 0.1}, "loto_better": 3}


def factorial_data(numbers: dict) -> FactorialData:
    """A factorial report's data as a saved report gives it (the fields the charts do not read filled in)."""
    meta = {"experiment": "factorial", "metric": "kl", "direction": -1, "scope": "decode", "budget": 24}
    meta |= {"baseline": "h2o", "statistic": "cosine", "allocation": "ppl"}
    return Report.from_dict({"title": "t", "data": {**meta, **numbers}}).data


def test_the_factorial_table_is_routing_by_allocation_and_the_primary_contrast_comes_first():
    contrast = dict(CONTRAST)
    data = factorial_data(
        {
            "allocation": "ppl",
            "cells": {
                "homogeneous-uniform": {"run": "a", "score": 1.0},
                "homogeneous-allocated": {"run": "b", "score": 2.0},
                "routed-uniform": {"run": "c", "score": 3.0},
                "routed-allocated": {"run": "d", "score": 4.0},
            },
            "routing_uniform": contrast,
            "allocation_homogeneous": {**contrast, "difference": 0.3},
            "allocation_routed": contrast,
            "interaction": contrast,
        }
    )
    table = charts.factorial_table(data)
    assert table.values.tolist() == [["homogeneous", 1.0, 2.0], ["routed", 3.0, 4.0]]
    assert list(table.columns) == ["routing", "uniform", "ppl"]
    contrasts = charts.factorial_contrasts(data)
    assert contrasts["contrast"][0].startswith("primary: routing under uniform allocation")
    assert contrasts["difference"].tolist() == [0.1, 0.3, 0.1, 0.1]
    assert contrasts["wins / ties / losses"][0] == "2 / 0 / 1"


def test_the_factorial_contrasts_carry_the_sample_level_test_and_what_it_could_detect():
    tested = dict(CONTRAST)
    sample = {"difference": 0.1, "low": 0.05, "high": 0.15, "p": 0.004, "mde": 0.05, "samples": 30}
    tested |= {"sample": sample, "task_mde": 0.3, "verdict": "better"}
    old = dict(CONTRAST)
    cells = {cell: {"run": cell, "score": 0.0} for cell in FACTORIAL_CELLS}
    data = factorial_data(
        {
            "cells": cells,
            "routing_uniform": tested,
            "allocation_homogeneous": old,
            "allocation_routed": old,
            "interaction": old,
        }
    )
    contrasts = charts.factorial_contrasts(data)
    first = contrasts.iloc[0]
    assert (first["sign-flip p (samples)"], first["detectable (80% power)"]) == (0.004, 0.05)
    assert first["verdict"] == "better"
    assert contrasts["verdict"].tolist()[1:] == ["", "", ""]  # a report from before samples were paired
    assert contrasts["sign-flip p (samples)"].isna().tolist() == [False, True, True, True]

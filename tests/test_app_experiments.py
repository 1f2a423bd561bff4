"""The Experiments page through Streamlit's AppTest: experiments launched from its form run as background
jobs, and their reports are drawn: the factorial's 2x2 table and contrasts, the placement control's
histogram and S(rho) scatter (a selected placement opens in the designer), the sweep's figure.

AppTest cannot click a plotly chart: a click is set as the chart's selection in the session state, as a
browser leaves it."""

from __future__ import annotations

import json

import pytest

from polykv import jobs
from polykv.jobs.experiment import launch_job, read_report
from polykv.plan import Plan
from tests.helpers import TINY_FIDELITY, button, open_app, texts, wait_for_job, with_profile

TINY_SETTINGS = json.dumps({**TINY_FIDELITY.to_dict(), "samples_per_task": 1})


@pytest.fixture
def app_ws(app_env, small_profile):
    """The app's workspace with the demo profile in it."""
    return with_profile(app_env / "ws", small_profile)


def launch(at, kind: str, baselines: list[str] | None = None, **fields) -> None:
    """Choose `kind`, fill the form (labels -> values) with the tiny settings, start, rerun."""
    at.selectbox(key="experiment_kind").select(kind)
    at.run()
    at.text_area(key="experiment_settings_fidelity").set_value(TINY_SETTINGS)
    if baselines is not None:
        [m for m in at.multiselect if m.label == "Baselines"][0].set_value(baselines)
    for label, value in fields.items():
        widget = [w for w in [*at.selectbox, *at.number_input, *at.text_input] if w.label == label][0]
        widget.set_value(value)
    button(at, "Start experiment").click()
    at.run()
    assert not at.exception and not at.error, texts(at.error)


def test_without_a_profile_the_page_says_where_to_make_one(app_env):
    at = open_app("experiments")
    assert texts(at.title) == ["Experiments"]
    assert any("compute one on the Profiles page" in i for i in texts(at.info))
    assert any("No experiment yet" in i for i in texts(at.info))
    assert len(at.get("plotly_chart")) == 0


def test_a_bad_launch_is_an_inline_one_line_error_and_starts_nothing(app_ws):
    at = open_app("experiments")
    at.selectbox(key="experiment_kind").select("sweep")
    at.run()
    [t for t in at.text_input if t.label == "Budgets"][0].set_value("16, x")
    button(at, "Start experiment").click()
    at.run()
    assert not at.exception
    assert any(e.startswith("Not started: budgets are positive whole numbers") for e in texts(at.error))
    at.text_area(key="experiment_settings_fidelity").set_value('{"samples_per_task": 0}')
    [t for t in at.text_input if t.label == "Budgets"][0].set_value("16")
    button(at, "Start experiment").click()
    at.run()
    assert any(e.startswith("Not started: fidelity settings") for e in texts(at.error))
    assert all("\n" not in e for e in texts(at.error))
    assert jobs.list_jobs(app_ws) == []


@pytest.mark.slow  # a four-run factorial job on the demo model
def test_the_factorial_page_shows_the_2x2_table_after_a_small_run(app_ws):
    at = open_app("experiments")
    launch(at, "factorial", Baseline="tova", Budget=24, Metric="kl")
    assert any(s.startswith("Started ") and "(kl, 4 runs)" in s for s in texts(at.success))
    (job,) = jobs.list_jobs(app_ws)
    assert job.kind == "experiment" and job.experiment.baseline == "tova"
    assert wait_for_job(job, app_ws).status == "finished", jobs.log_tail(job, app_ws)
    at.run()
    assert not at.exception and not at.error
    assert any(" · finished" in m for m in texts(at.markdown))
    assert any(p.proto.text.startswith("100% · ") for p in at.get("progress"))
    data = read_report(job, app_ws).data
    cells = data.cells
    table = at.dataframe[0].value
    assert list(table.columns) == ["routing", "uniform", "entropy"]
    assert table.values.tolist() == [
        ["homogeneous", cells["homogeneous-uniform"].score, cells["homogeneous-allocated"].score],
        ["routed", cells["routed-uniform"].score, cells["routed-allocated"].score],
    ]
    primary = data.routing_uniform
    shown = {m.label: m.value for m in at.metric}
    assert shown["Primary: routed-uniform - homogeneous-uniform"] == f"{primary.difference:+.4f}"
    assert shown["95% paired bootstrap CI"] == f"[{primary.low:+.4f}, {primary.high:+.4f}]"
    assert shown["Wins / ties / losses"] == f"{primary.wins} / {primary.ties} / {primary.losses}"
    contrasts = at.dataframe[1].value
    assert contrasts["contrast"].tolist()[0].startswith("primary: routing under uniform allocation")
    assert len(contrasts) == 4 and contrasts["difference"].tolist()[0] == primary.difference
    [lines] = [e for e in at.expander if e.label == "Report lines and data"]
    assert any("secondary: interaction" in t for t in texts(lines.text))


@pytest.mark.slow  # a four-run placement job on the demo model, then the designer
def test_the_placement_scatter_is_drawn_and_a_clicked_placement_opens_in_the_designer(app_ws):
    at = open_app("experiments")
    launch(at, "placement", **{"Random placements (K)": 3, "Budget": 24, "Metric": "kl"})
    (job,) = jobs.list_jobs(app_ws)
    assert wait_for_job(job, app_ws).status == "finished", jobs.log_tail(job, app_ws)
    at.run()
    assert not at.exception and not at.error
    data = read_report(job, app_ws).data
    histogram, scatter = (json.loads(chart.proto.spec) for chart in at.get("plotly_chart"))
    assert histogram["data"][0]["type"] == "histogram"
    points, guided = scatter["data"]
    assert points["x"] == [r.profile_score for r in data.random] and points["y"] == [r.score for r in data.random]
    assert points["customdata"] == [[0], [1], [2]]
    assert (guided["x"], guided["y"]) == ([data.guided.profile_score], [data.guided.score])
    title = scatter["layout"]["title"]["text"]
    assert f"Spearman rho = {data.spearman:+.3f}" in title and f"p = {data.spearman_p:.4f}" in title
    assert any(f"= {data.spearman:+.4f}; one-sided permutation p = " in c for c in texts(at.caption))
    assert "Open in the designer" not in [b.label for b in at.button]  # nothing selected yet

    at.session_state["placement_scatter"] = {"selection": {"points": [{"customdata": [1]}], "point_indices": [1]}}
    at.run()
    assert any(data.random[1].plan in m for m in texts(at.markdown))
    button(at, "Open in the designer").click()
    at.run()
    assert not at.exception
    assert texts(at.title) == ["Plan designer"]
    assert Plan.from_json(at.session_state["plan_json"]) == Plan.from_json(data.random[1].plan_json)


@pytest.mark.slow  # a sweep job (two budgets, one baseline: six runs) on the demo model
def test_the_sweep_report_draws_the_route_baselines_fullkv_and_route_minus_envelope(app_ws):
    at = open_app("experiments")
    launch(at, "sweep", ["tova"], Budgets="8,32", Metric="kl")
    (job,) = jobs.list_jobs(app_ws)
    assert wait_for_job(job, app_ws).status == "finished", jobs.log_tail(job, app_ws)
    at.run()
    assert not at.exception and not at.error
    (figure,) = (json.loads(chart.proto.spec) for chart in at.get("plotly_chart"))
    names = [t.get("name") for t in figure["data"]]
    assert names[:3] == ["tova", "best baseline (envelope)", "best alone in the route's scope"]
    assert names[3:5] == ["route-uniform", "route-ppl"] and "FullKV" in names
    assert "route-uniform - best alone in its scope (95% CI)" in names  # like with like, beside the envelope's
    assert figure["layout"]["xaxis"]["type"] == "log"
    assert "route - best" in figure["layout"]["yaxis2"]["title"]["text"]


@pytest.mark.slow  # resumes a cancelled experiment job (a worker, four tiny runs)
def test_a_cancelled_experiment_shows_its_progress_and_resume_runs_it_to_its_report(app_ws, small_profile):
    job = launch_job(
        app_ws, "demo", "cpu", "factorial", profile=small_profile.key, scope="decode", budget=24, baseline="tova",
        allocation="entropy", settings=json.loads(TINY_SETTINGS), metric="kl",
    )  # fmt: skip
    job.cancelled = True
    jobs.save_job(job, app_ws)
    at = open_app("experiments")
    assert any(m.endswith(" · cancelled") for m in texts(at.markdown))
    (bar,) = [p for p in at.get("progress") if p.proto.text.startswith("0%")]
    button(at, "Resume").click()
    at.run()
    assert not at.exception and not at.error
    assert wait_for_job(job, app_ws).status == "finished", jobs.log_tail(job, app_ws)
    at.run()
    assert at.dataframe[0].value["routing"].tolist() == ["homogeneous", "routed"]  # its report is drawn


def test_another_models_sweep_job_is_not_drawn_for_the_loaded_model(app_ws):
    from app.job_forms import eval_job
    from polykv.jobs.spec import save_job

    route = Plan.homogeneous("tova", 229, 30, "decode", name="smollm2-route")
    job = eval_job("smollm2", "cpu", route, "fidelity", "{}", "229,230,231", ["h2o"], 0, 0)
    save_job(job, app_ws)
    at = open_app("experiments")
    assert not at.exception
    assert any("Launch the plan with baselines" in c for c in texts(at.caption))  # demo is loaded: no smollm2 sweep

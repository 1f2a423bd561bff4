"""Runs that cannot start on the model are refused before anything starts: a RULER length past the context,
a task whose shortest prompt does not fit the length, a capacity past the context (`polykv.eval.running.fit`), in the
library, the CLI (no workspace written, no background job) and the app's Runs page (inline, no job)."""

from __future__ import annotations

import json

import pytest

from polykv import jobs
from polykv.errors import SettingsError
from polykv.eval.running.fit import check_fits
from polykv.eval.running.settings import suite_settings
from polykv.plan import Plan
from tests.helpers import assert_one_line_error, button, open_app, texts


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"length": 4096}, "ruler length 4096 exceeds the model's context (512 tokens); pass a length of at most 512"),
        ({"length": 512}, "ruler length 512 is too small for task niah_multiquery: its shortest prompt is"),
    ],
)
def test_ruler_settings_that_cannot_run_on_the_model_are_refused(demo_model, settings, expected):
    model, tokenizer = demo_model
    with pytest.raises(SettingsError) as refused:
        check_fits("ruler", suite_settings("ruler", settings), model, tokenizer)
    assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)


def test_a_capacity_past_the_context_is_refused_and_what_fits_passes(demo_model):
    model, tokenizer = demo_model
    settings = suite_settings("ruler", {"length": 512, "tasks": ["niah_single_1"]})
    check_fits("ruler", settings, model, tokenizer, [Plan.homogeneous("tova", 64, 5)])  # nothing to say
    with pytest.raises(SettingsError, match="plan tova-both-100000: layer 0, prefill, capacity: 100000 is more than"):
        check_fits("ruler", settings, model, tokenizer, [Plan.homogeneous("tova", 100_000, 5)])


@pytest.mark.parametrize("backend", ["local", "subprocess"])  # subprocess: the path the app's jobs take
@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"length": 4096}, "ruler length 4096 exceeds the model's context (512 tokens)"),
        ({"length": 512, "tasks": ["vt"]}, "ruler length 512 is too small for task vt: its shortest prompt is"),
    ],
)
def test_eval_refuses_what_cannot_run_before_creating_a_job_or_a_run(polykv, tmp_path, backend, settings, expected):
    plan = tmp_path / "full.json"
    plan.write_text(Plan.homogeneous("full", None, 5).to_json())
    workspace = tmp_path / "ws"
    result = polykv(
        "eval", "--model", "demo", "--plan", str(plan), "--suite", "ruler", "--settings", json.dumps(settings),
        "--backend", backend, "-w", str(workspace),
    )  # fmt: skip
    assert_one_line_error(result, expected)
    assert not workspace.exists()  # no job file, no results database, no run


def test_the_runs_page_refuses_what_cannot_run_inline_and_starts_no_job(app_env):
    at = open_app("runs")
    at.selectbox(key="run_suite").select("ruler")
    at.run()
    at.text_area(key="settings_ruler").set_value(json.dumps({"length": 4096}))
    button(at, "Launch").click()
    at.run()
    assert not at.exception
    refusal = "Not launched: ruler length 4096 exceeds the model's context (512 tokens); pass a length of at most 512"
    assert refusal in texts(at.error)
    assert jobs.list_jobs(app_env / "ws") == []


def test_an_experiment_refuses_what_cannot_run_before_any_run(polykv, tmp_path):
    workspace, plan = tmp_path / "ws", tmp_path / "route.json"
    plan.write_text(Plan.homogeneous("tova", 16, 5, "decode").to_json())
    result = polykv(
        "experiment", "sweep", "--model", "demo", "--plan", str(plan), "--budgets", "16", "--metric", "score",
        "--suite", "ruler", "--settings", json.dumps({"length": 4096}), "-w", str(workspace),
    )  # fmt: skip
    assert_one_line_error(result, "ruler length 4096 exceeds the model's context (512 tokens)")
    assert not (workspace / "results.sqlite").exists()  # no store, so no run


def test_the_experiments_page_refuses_what_cannot_run_inline_and_starts_no_job(app_env, small_profile):
    from tests.helpers import with_profile

    with_profile(app_env / "ws", small_profile)
    at = open_app("experiments")
    at.selectbox(key="experiment_suite").select("ruler")
    at.run()
    at.text_area(key="experiment_settings_ruler").set_value(json.dumps({"length": 4096}))
    button(at, "Start experiment").click()
    at.run()
    assert not at.exception
    assert "Not started: ruler length 4096 exceeds the model's context (512 tokens); pass a length of at most 512" in (
        texts(at.error)
    )
    assert jobs.list_jobs(app_env / "ws") == []


def test_a_workload_search_refuses_a_task_that_cannot_fit_before_any_job(app_env, demo_model):
    from polykv.jobs.search import launch_search

    with pytest.raises(SettingsError, match="too small for task vt"):
        launch_search(
            app_env / "ws", "demo", "cpu", profile="auto", scope="decode", budget=32, sources="ruler:vt@512",
            loaded=demo_model,
        )  # fmt: skip


def test_a_job_that_failed_before_its_first_sample_offers_edit_settings_not_resume(app_env, demo_model):
    from polykv.eval.running.unit import Unit
    from tests.helpers import wait_for_job

    workspace = app_env / "ws"
    settings = suite_settings("ruler", {"length": 4096, "tasks": ["niah_single_1"]})  # past the demo's context
    unit = Unit.of("demo", Plan.homogeneous("full", None, 5), "ruler", settings)
    job = jobs.eval_job([({"series": "full"}, unit)], "cannot run")  # made directly: the page would refuse it
    jobs.start(job, workspace)
    assert wait_for_job(job, workspace).status == "failed"
    at = open_app("runs")
    assert not at.exception
    labels = [b.label for b in at.button]
    assert "Edit settings" in labels and "Resume" not in labels
    assert any("failed before its first sample" in c for c in texts(at.caption))
    button(at, "Edit settings").click()
    at.run()
    assert at.selectbox(key="run_suite").value == "ruler"
    assert json.loads(at.text_area(key="settings_ruler").value)["length"] == 4096


def test_rulers_defaults_fit_the_loaded_model_and_the_runs_page_proposes_them(app_env, demo_model):
    from polykv.eval.running.fit import FIRST_RUN_TASKS, fitting_ruler_settings

    model, tokenizer = demo_model
    fitting = fitting_ruler_settings(model, tokenizer)
    assert fitting.length == 512  # the largest standard length within the demo's 512-token context
    assert "niah_single_1" in fitting.tasks and "niah_multiquery" not in fitting.tasks  # its prompts are longer
    check_fits("ruler", fitting, model, tokenizer)  # the whole default runs
    first = fitting_ruler_settings(model, tokenizer, first_run=True)  # what the app proposes on a CPU
    assert first.length == 512 and first.samples_per_task == 1
    assert first.tasks and set(first.tasks) <= set(FIRST_RUN_TASKS)
    check_fits("ruler", first, model, tokenizer)
    at = open_app("runs")
    at.selectbox(key="run_suite").select("ruler")
    at.run()
    proposed = json.loads(at.text_area(key="settings_ruler").value)
    assert proposed["length"] == 512 and proposed["tasks"] == list(first.tasks) and proposed["samples_per_task"] == 1
    assert any(c.startswith("These settings start small on a CPU") for c in texts(at.caption))


RUNS_SETTINGS = {"length": 256, "tasks": ["niah_single_1"]}


def enter_runs_settings(at) -> None:
    """On the Runs page: RULER, its settings, budgets 16,32 and the tova baseline (beside FullKV, pre-selected), as a
    user types them."""
    at.selectbox(key="run_suite").select("ruler")
    at.run()
    at.text_area(key="settings_ruler").set_value(json.dumps(RUNS_SETTINGS))
    at.text_input(key="run_budgets").set_value("16,32")
    at.multiselect(key="run_baselines").select("tova")
    at.run()


def assert_runs_settings(at) -> None:
    """The Runs page shows what `enter_runs_settings` typed."""
    assert at.selectbox(key="run_suite").value == "ruler"
    assert json.loads(at.text_area(key="settings_ruler").value) == RUNS_SETTINGS
    assert at.text_input(key="run_budgets").value == "16,32"
    assert at.multiselect(key="run_baselines").value == ["full", "tova"]


def test_the_pages_remember_what_was_entered_across_page_changes(app_env):
    at = open_app("runs")
    enter_runs_settings(at)
    at.switch_page("views/designer.py")
    at.run()
    at.multiselect(key="designer_layers").set_value([1, 2])
    at.run()
    at.switch_page("views/compare.py")
    at.run()
    at.switch_page("views/runs.py")
    at.run()
    assert not at.exception
    assert_runs_settings(at)
    at.switch_page("views/designer.py")
    at.run()
    assert at.multiselect(key="designer_layers").value == [1, 2]  # the designer keeps its selection too


def test_the_runs_settings_survive_a_reload_and_pages_only_looked_at_write_nothing(app_env):
    from streamlit.testing.v1 import AppTest

    from tests.helpers import APP

    at = open_app("runs")
    session = at.query_params["session"]
    assert not (app_env / "ws" / "drafts").exists()  # defaults only: nothing written
    enter_runs_settings(at)
    assert (app_env / "ws" / "drafts" / str(session) / "pages.json").is_file()
    fresh = AppTest.from_file(APP, default_timeout=180)  # a reload: a new Streamlit session, the same URL
    fresh.query_params["session"] = session
    fresh.run()
    fresh.switch_page("views/runs.py")
    fresh.run()
    assert not fresh.exception
    assert_runs_settings(fresh)

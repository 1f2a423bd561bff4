"""The Plan search page and its background job: a search started from the page runs in its own process,
its trace and best plan show while it runs and after, the held-out verdict is drawn, and the searched plan
opens in the designer. The job file is validated like every other."""

from __future__ import annotations

import json

import pytest

from polykv import jobs
from polykv.errors import JobError
from polykv.jobs.search import launch_search, live, read_search, search_start, start_problem
from polykv.plan import Plan
from tests.helpers import button, open_app, texts, wait_for_job, with_profile

SMALL = {"evaluations": 40, "search_sequences": 2, "held_out": 2, "max_tokens": 96}


@pytest.fixture
def app_ws(app_env, small_profile):
    return with_profile(app_env / "ws", small_profile)


def test_without_a_profile_the_page_says_where_to_make_one(app_env):
    at = open_app("search")
    assert texts(at.title) == ["Plan search"]
    assert any("No profile of this model yet" in i for i in texts(at.info))


def test_a_plan_outside_the_search_space_is_not_a_start_and_says_why():
    decode = Plan.homogeneous("tova", 24, 5, "decode")
    assert start_problem(decode, "decode", 24) is None
    assert start_problem(decode, "both", 24) == "its scope is decode, not both"
    assert "add up to 120, not 5 x 32 = 160" in start_problem(decode, "decode", 32)


def test_a_plan_whose_total_is_off_starts_the_search_rescaled_to_the_budget():
    """5 layers averaging 51.2 (256 in all) at budget 51 (255): the route, rescaled, is the start."""
    plan = Plan.homogeneous("tova", 51, 5, "decode").with_layers(
        [*Plan.homogeneous("tova", 51, 4, "decode").layers, Plan.homogeneous("h2o", 52, 1, "decode").layers[0]]
    )
    start, note = search_start(plan, "decode", 51)
    assert start is not None and start_problem(start, "decode", 51) is None
    assert [layer.decode.method for layer in start.layers] == ["tova"] * 4 + ["h2o"]  # the route kept
    assert sum(layer.decode.capacity for layer in start.layers) == 255
    assert note.startswith(f"Starts from the designer's plan {plan.name!r} rescaled to budget 51 (")
    assert "add up to 256, not 5 x 51 = 255" in note
    assert search_start(plan, "both", 51) == (
        None,
        "The designer's plan is not a start (its scope is decode, not both)",
    )
    fits = Plan.homogeneous("tova", 24, 5, "decode")
    assert search_start(fits, "decode", 24) == (fits, f"Starts from the designer's plan {fits.name!r}")


def test_a_search_job_file_is_validated_and_a_damaged_one_is_listed_not_fatal(app_ws, small_profile):
    with pytest.raises(JobError, match="budget: Input should be greater than or equal to 2"):
        jobs.search_job("demo", "cpu", {"profile": "p", "scope": "decode", "budget": 1, **SMALL}, "bad")
    with pytest.raises(JobError, match="shell: unknown field"):
        jobs.search_job("demo", "cpu", {"profile": "p", "scope": "decode", "budget": 8, "shell": 1, **SMALL}, "x")
    with pytest.raises(JobError, match="was measured on 'demo', not on 'other'"):
        launch_search(app_ws, "other", "cpu", profile=small_profile.key, scope="decode", budget=24, **SMALL)
    good = launch_search(app_ws, "demo", "cpu", profile=small_profile.key, scope="decode", budget=24, **SMALL)
    jobs.save_job(good, app_ws)
    data = json.loads((app_ws / "jobs" / f"{good.id}.json").read_text())
    (app_ws / "jobs" / "nosearch.json").write_text(json.dumps({**data, "id": "nosearch", "search": None}))
    found, damaged = jobs.scan_jobs(app_ws)
    assert [j.id for j in found] == [good.id]
    assert [d.reason for d in damaged] == ["a search job has search settings and no runs"]
    assert jobs.load_job(app_ws, good.id).search == good.search


@pytest.mark.slow  # a real search on the demo model in a worker process
def test_a_search_started_on_the_page_shows_its_trace_best_plan_and_verdict_and_opens_in_the_designer(app_ws):
    start = Plan.homogeneous("tova", 24, 5, "decode", name="designer-tova")
    at = open_app("search")
    at.session_state["plan_json"] = start.to_json()
    at.run()
    assert any(c.startswith("Starts from the designer's plan 'designer-tova'") for c in texts(at.caption))
    numbers = {n.label: n for n in at.number_input}
    numbers["Budget"].set_value(24)
    numbers["Evaluations"].set_value(SMALL["evaluations"])
    numbers["Search sequences"].set_value(SMALL["search_sequences"])
    numbers["Held-out sequences"].set_value(SMALL["held_out"])
    numbers["Tokens per sequence"].set_value(SMALL["max_tokens"])
    button(at, "Start search").click()
    at.run()
    assert not at.exception and not at.error, texts(at.error)
    (job,) = jobs.list_jobs(app_ws)
    assert job.kind == "search" and Plan.from_json(job.search.start) == start
    state = wait_for_job(job, app_ws)
    assert state.status == "finished", jobs.log_tail(job, app_ws)
    trace, best = live(state)
    report = read_search(job, app_ws).budgets[0]
    assert trace == [point.model_dump() for point in report.search.trace] and best == report.plan
    assert trace[-1]["objective"] <= trace[0]["objective"]  # never worse than the best start
    at.run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == 2  # the trace and the best plan
    assert any(s.startswith("Held-out verdict: 2 sequences") for s in texts(at.subheader))
    roles = [r for r in at.dataframe[0].value["role"]]
    assert roles == ["searched", "toprank", "homogeneous"]
    assert set(at.dataframe[1].value["A - B"]) == {"searched - toprank", "searched - homogeneous"}
    button(at, "Open the searched plan in the designer").click()
    at.run()
    assert Plan.from_json(at.session_state["plan_json"]) == best


@pytest.mark.slow  # a real workload search on the demo model in a worker process
def test_a_workload_search_on_the_page_shows_the_envelope_and_the_transfer_rows(app_ws):
    at = open_app("search")
    at.radio(key="search_objective").set_value("answer_nll")
    at.run()
    assert not at.exception, at.exception
    texts_in = {t.label: t for t in at.text_input}
    assert texts_in["Workload"].value == "ruler:niah_single_1@512"  # the demo model's whole context
    texts_in["Transfer tasks"].set_value("ruler:niah_single_2@512")
    numbers = {n.label: n for n in at.number_input}
    numbers["Budget"].set_value(32)
    numbers["Evaluations"].set_value(12)
    numbers["Search samples per task"].set_value(1)
    numbers["Held-out samples per task"].set_value(2)
    numbers["FullKV competence (%)"].set_value(0.0)  # the demo model finds no needle: judge it anyway
    button(at, "Start search").click()
    at.run()
    assert not at.exception and not at.error, texts(at.error)
    (job,) = jobs.list_jobs(app_ws)
    assert job.search.metric == "answer_nll" and job.search.profile == "auto"
    state = wait_for_job(job, app_ws)
    assert state.status == "finished", jobs.log_tail(job, app_ws)
    at.run()
    assert not at.exception
    heads = texts(at.subheader)
    assert heads, (texts(at.error), texts(at.markdown), texts(at.caption))
    assert any(h.startswith("Held-out, searched tasks: niah_single_1") for h in heads)
    assert any(h.startswith("Held-out, transfer tasks: niah_single_2") for h in heads)
    roles = list(at.dataframe[0].value["role"])
    assert "envelope" in roles and "searched" in roles and "fullkv" in roles
    contrasts = at.dataframe[-1].value
    assert "searched - envelope" in set(contrasts["A - B"]) and "transfer tasks" in set(contrasts["family"])
    assert "searched - homogeneous" in set(contrasts["A - B"]) and "primary" in set(contrasts["kind"])
    button(at, "Open the searched plan in the designer").click()
    at.run()
    assert Plan.from_json(at.session_state["plan_json"]).name.startswith("search-answer_nll")

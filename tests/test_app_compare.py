"""The Compare page through Streamlit's AppTest: the pair it starts on, better / worse colours, the
log-perplexity toggle, inline refusals and the sortable runs table with the jobs' tags."""

from __future__ import annotations

import json

import pytest
from streamlit.proto.Metric_pb2 import Metric as MetricProto

from app import charts
from polykv import jobs
from polykv.eval.comparing.compare import compare_runs
from polykv.eval.experiments import launch_plans
from polykv.eval.results.store import Store
from polykv.eval.running.suite_runner import run_suite
from polykv.eval.running.unit import Unit
from polykv.eval.statistics.render import format_p
from polykv.plan import Plan
from polykv.plan_edits.painting import paint
from tests.helpers import TINY_FIDELITY, fake_run, open_app, texts

COLOR = {
    "green": MetricProto.MetricColor.GREEN,
    "red": MetricProto.MetricColor.RED,
    "gray": MetricProto.MetricColor.GRAY,
}


def metric(at, starts: str):
    found = [m for m in at.metric if m.label.startswith(starts)]
    assert found, [m.label for m in at.metric]
    return found[0]


def bar_colours(at) -> list[str]:
    (chart,) = at.get("plotly_chart")
    return json.loads(chart.proto.spec)["data"][0]["marker"]["color"]


def scores(kl: float, ppl: float) -> dict:
    return {t: {"kl": kl, "ppl": ppl, "top1": 0.5, "rougeL": 0.5} for t in TINY_FIDELITY.tasks}


@pytest.mark.slow  # a page over a workspace of many runs
def test_compare_starts_on_the_route_and_its_best_baseline_and_colours_by_direction(app_env, demo_model):
    model, tokenizer = demo_model
    ws = app_env / "ws"
    ws.mkdir()
    store = Store(ws / "results.sqlite")
    plan = paint(Plan.homogeneous("tova", 24, 5, "decode", name="guided"), [2, 3, 4], "decode", "h2o")
    labelled = launch_plans(plan, [16], ["tova"])  # the route at budget 16 and the tova baseline at 16
    sweep = jobs.eval_job([(lab, Unit.of("demo", p, "fidelity", TINY_FIDELITY)) for lab, p in labelled], "sweep")
    for (_, p), r in zip(labelled, sweep.runs):
        assert run_suite(store, "demo", model, tokenizer, p, "fidelity", TINY_FIDELITY) == r.run_id
    real = [r for r in store.runs() if r.id in {u.run_id for u in sweep.runs}]
    assert [(r.status, r.done_samples) for r in real] == [("finished", 4), ("finished", 4)]
    sweep.created = "2024-01-01T00:00:00+00:00"
    jobs.save_job(sweep, ws)
    # a later job's two random placements are the newest finished runs (their scores made up)
    placed = launch_plans(plan, placements=2)[1:]
    controls = jobs.eval_job([(lab, Unit.of("demo", p, "fidelity", TINY_FIDELITY)) for lab, p in placed], "controls")
    for i, r in enumerate(controls.runs):
        fake_run(store, r.run_id, scores(0.5 + i, 50.0 + i), plan_name=r.plan_name)
    controls.created = "2024-01-02T00:00:00+00:00"
    jobs.save_job(controls, ws)
    route, tova = (r.run_id for r in sweep.runs)

    at = open_app("compare")
    assert (at.selectbox(key="compare_a").value, at.selectbox(key="compare_b").value) == (route, tova)
    assert any(
        c.startswith("Starting pair: the route vs its best baseline at budget 16 (tova by kl)")
        for c in texts(at.caption)
    )
    assert at.selectbox(key="compare_metric").value == "kl"
    expected = compare_runs(store, route, tova, "kl")
    delta = metric(at, "A - B in kl (lower is better)")
    assert delta.proto.delta == expected.badge()  # the verdict's, never a winner beside "no significant difference"
    assert delta.proto.color == COLOR[charts.OUTCOME_DELTA_COLORS[expected.badge()]]
    assert bar_colours(at) == [charts.OUTCOME_COLORS[o] for o in expected.outcomes()]
    assert "A wins / ties / losses" in [m.label for m in at.metric]

    # perplexity is compared as log(ppl) by default: a log-ratio, also said as a ratio
    at.selectbox(key="compare_metric").select("ppl").run()
    assert not at.exception and at.toggle(key="compare_log").value is True
    log = compare_runs(store, route, tova, "ppl", log=True)
    shown = metric(at, "A - B in log ppl (lower is better)")
    assert "×" in shown.value and shown.proto.delta == log.badge()
    assert metric(at, "Sign-flip test").value == f"p = {format_p(log.samples.p_value)}"  # the headline's test
    assert bar_colours(at) == [charts.OUTCOME_COLORS[o] for o in log.outcomes()]
    at.toggle(key="compare_log").set_value(False).run()
    assert "×" not in metric(at, "A - B in ppl (lower is better)").value
    assert not [m for m in at.metric if "log ppl" in m.label]

    # every run, with the tags of the job it came from
    table = at.dataframe[-1].value
    assert list(table["run"]) == [r.id for r in reversed(store.runs())]
    rows = {r["run"]: r for r in table.to_dict("records")}
    assert (rows[route]["series"], rows[route]["budget"], rows[route]["job"]) == ("route", 16, f"sweep · {sweep.id}")
    assert (rows[tova]["series"], rows[tova]["plan"]) == ("tova", sweep.runs[1].plan_name)
    assert {rows[r.run_id]["series"] for r in controls.runs} == {"placement"}

    # the user can still pick another pair; the starting pair's caption then goes
    at.selectbox(key="compare_a").select(controls.runs[0].run_id).run()
    assert not at.exception
    assert not any(c.startswith("Starting pair") for c in texts(at.caption))


def test_compare_without_jobs_starts_on_the_two_newest_and_refuses_a_log_of_zero_inline(app_env):
    ws = app_env / "ws"
    ws.mkdir()
    store = Store(ws / "results.sqlite")
    fake_run(store, "older", scores(0.2, 0.0))  # a perplexity of 0: no log
    fake_run(store, "newer", scores(0.1, 9.0))
    fake_run(store, "waiting", scores(0.1, 9.0), status="running")
    at = open_app("compare")
    assert (at.selectbox(key="compare_a").value, at.selectbox(key="compare_b").value) == ("newer", "older")
    # A's KL is lower on both tasks (each bar green), but two samples cannot make a significant test: the badge
    # says so rather than name a winner
    shown = metric(at, "A - B in kl (lower is better)")
    assert (shown.proto.delta, shown.proto.color) == ("no significant difference", MetricProto.MetricColor.GRAY)
    assert bar_colours(at) == [charts.OUTCOME_COLORS["A better"]] * 2
    at.selectbox(key="compare_metric").select("ppl").run()
    assert not at.exception
    assert any("log ppl needs positive scores" in w for w in texts(at.warning))
    at.toggle(key="compare_log").set_value(False).run()
    shown = metric(at, "A - B in ppl (lower is better)")  # A's perplexity is higher, not significantly
    assert (shown.proto.delta, shown.proto.color) == ("no significant difference", MetricProto.MetricColor.GRAY)
    assert bar_colours(at) == [charts.OUTCOME_COLORS["B better"]] * 2  # each task's bar: B better, in red
    assert set(at.dataframe[-1].value["status"]) == {"finished", "running"}  # the runs table lists every run


def test_compare_with_only_unfinished_runs_still_lists_them(app_env):
    ws = app_env / "ws"
    ws.mkdir()
    fake_run(Store(ws / "results.sqlite"), "waiting", scores(0.1, 9.0), status="running")
    at = open_app("compare")
    assert any("No finished run yet" in i for i in texts(at.info))
    assert list(at.dataframe[0].value["run"]) == ["waiting"]


def _answered_runs(store) -> None:
    """Three RULER-like runs (tova, h2o, FullKV) of the same settings whose samples keep their answers."""
    from polykv.eval.results.store import SampleRecord

    answers = {
        "tova-run": {"000": (" 8094927.", 100.0), "001": (" 1234567.", 0.0)},
        "h2o-run": {"000": (" 8094927.", 100.0), "001": (" 8530575.", 100.0)},
        "full-run": {"000": (" 8094927.", 100.0), "001": (" 8530575.", 100.0)},
    }
    plans = {"tova-run": Plan.homogeneous("tova", 8, 5), "h2o-run": Plan.homogeneous("h2o", 8, 5)}
    plans["full-run"] = Plan.homogeneous("full", None, 5)
    gold = {"000": ["8094927"], "001": ["8530575"]}
    for run_id, samples in answers.items():
        store.create_run(
            run_id, model="demo", plan_name=plans[run_id].name, plan_hash="h", plan_json=plans[run_id].to_json(),
            suite="ruler", settings={"tasks": ["niah_single_1", "vt"], "mode": "generate"}, seed=0,
            total_samples=3, versions={},
        )  # fmt: skip
        for sample, (prediction, score) in samples.items():
            record = SampleRecord(prediction, gold[sample], {"task": "niah_single_1", "sample": sample})
            store.add_sample(run_id, "niah_single_1", sample, {"score": score}, 0.1, record)
        store.add_sample(run_id, "vt", "000", {"score": 0.0}, 0.1, SampleRecord("no idea", ["AB"], None))
        mean = sum(score for _, score in samples.values()) / 2
        store.set_task_scores(
            run_id, {"niah_single_1": {"score": mean}, "vt": {"score": 0.0}}, {"niah_single_1": 2, "vt": 1}
        )
        store.set_status(run_id, "finished")


def test_a_tasks_samples_open_side_by_side_with_gold_and_fullkvs_answer(app_env):
    ws = app_env / "ws"
    ws.mkdir()
    _answered_runs(Store(ws / "results.sqlite"))
    at = open_app("compare")
    at.selectbox(key="compare_a").select("tova-run").run()
    at.selectbox(key="compare_b").select("h2o-run").run()
    at.selectbox(key="compare_task").select("niah_single_1").run()
    assert not at.exception
    (samples,) = at.table
    table = samples.value.reset_index().replace(r"\\(.)", r"\1", regex=True)  # shown literally: markdown escaped
    assert list(table.columns) == ["sample", "gold", "A", "A metrics", "B", "B metrics", "FullKV", "FullKV metrics"]
    assert table["gold"].tolist() == ["8094927", "8530575"]
    assert table["A"].tolist() == [" 8094927.", " 1234567."] and table["B"].tolist() == [" 8094927.", " 8530575."]
    assert table["FullKV"].tolist() == [" 8094927.", " 8530575."]
    at.toggle(key="compare_differing").set_value(True).run()
    assert at.table[0].value.index.tolist() == ["001"]  # only where A and B differ


@pytest.mark.parametrize("with_fullkv", [True, False])
def test_in_score_mode_fullkvs_answer_nll_stands_beside_each_sample_or_the_page_says_how(app_env, with_fullkv):
    from polykv.eval.comparing.answers import metrics_text
    from polykv.eval.results.store import SampleRecord

    ws = app_env / "ws"
    ws.mkdir()
    store = Store(ws / "results.sqlite")
    nll = {"tova-run": (2.5, 3.0), "h2o-run": (2.0, 2.75), "full-run": (0.5, 0.25)}
    for run_id, values in nll.items():
        if run_id == "full-run" and not with_fullkv:
            continue
        plan = Plan.homogeneous(run_id.split("-")[0], None if run_id == "full-run" else 8, 5)
        store.create_run(
            run_id, model="demo", plan_name=plan.name, plan_hash="h", plan_json=plan.to_json(), suite="ruler",
            settings={"tasks": ["niah_single_1"], "mode": "score"}, seed=0, total_samples=2, versions={},
        )  # fmt: skip
        for sample, value in zip(("000", "001"), values):
            record = SampleRecord(None, ["8094927"], {"task": "niah_single_1", "sample": sample})
            store.add_sample(run_id, "niah_single_1", sample, {"answer_nll": value}, 0.1, record)
        store.set_task_scores(run_id, {"niah_single_1": {"answer_nll": sum(values) / 2}}, {"niah_single_1": 2})
        store.set_status(run_id, "finished")
    at = open_app("compare")
    at.selectbox(key="compare_a").select("tova-run").run()
    at.selectbox(key="compare_b").select("h2o-run").run()
    assert not at.exception
    table = at.table[0].value
    hint = [c for c in texts(at.caption) if "add `full` to the baselines on Runs" in c]
    if with_fullkv:
        assert [v for v in table["FullKV metrics"]] == [metrics_text({"answer_nll": v}) for v in nll["full-run"]]
        assert not hint
    else:
        assert "FullKV metrics" not in table.columns and hint


def test_the_runs_page_warns_when_fullkv_is_at_the_floor_of_a_task(app_env):
    ws = app_env / "ws"
    ws.mkdir()
    _answered_runs(Store(ws / "results.sqlite"))
    at = open_app("runs")
    warnings = [w for w in texts(at.warning) if "FullKV run full-run scores under 20% on vt (0%)" in w]
    assert warnings and "3 runs share these settings" in warnings[0]


def test_the_runs_page_reads_a_runs_answers_beside_gold_and_fullkvs(app_env):
    ws = app_env / "ws"
    ws.mkdir()
    _answered_runs(Store(ws / "results.sqlite"))
    at = open_app("runs")
    at.selectbox(key="runs_read").select("tova-run").run()
    assert not at.exception
    table = at.table[-1].value
    assert list(table.columns) == ["task", "sample", "metrics", "gold", "answer", "FullKV"]
    wrong = table[(table["task"] == "niah_single_1") & (table["sample"] == "001")].iloc[0]
    # the plan answered wrong where FullKV answered right: the plan's failure, not the model's
    assert (wrong["gold"], wrong["answer"], wrong["FullKV"]) == ("8530575", " 1234567.", " 8530575.")
    assert any(c.startswith("agreement: 1 when the plan's greedy answer is FullKV's") for c in texts(at.caption))
    assert "full" in at.multiselect(key="run_baselines").options  # FullKV is a baseline like the others
    at.selectbox(key="runs_read_task").select("niah_single_1").run()  # one task's samples
    assert set(at.table[-1].value["task"]) == {"niah_single_1"}


def _top_to_bottom(node) -> list:
    """The page's elements in the order they render (a block's children by their index)."""
    children = getattr(node, "children", None)
    if children is None:
        return [node]
    return [n for i in sorted(children) for n in _top_to_bottom(children[i])]


def test_a_clicked_bars_samples_open_right_under_the_chart(app_env, monkeypatch):
    """Below the tables, a clicked task's samples rendered out of sight: they open under the chart instead.
    AppTest cannot click a chart: the click is the task `common.clicked_task` reads from its selection."""
    from app import common

    ws = app_env / "ws"
    ws.mkdir()
    _answered_runs(Store(ws / "results.sqlite"))
    at = open_app("compare")
    at.selectbox(key="compare_a").select("tova-run").run()
    at.selectbox(key="compare_b").select("h2o-run").run()

    def where() -> tuple[int, int, int]:
        page = _top_to_bottom(at.main)
        kinds = [n.type for n in page]
        samples = next(i for i, n in enumerate(page) if n.type == "subheader" and n.value.startswith("Samples"))
        return kinds.index("plotly_chart"), samples, kinds.index("dataframe")  # the first table: A - B per task

    chart, samples, report = where()
    assert chart < report < samples  # no bar clicked: the samples come after the tables
    monkeypatch.setattr(common, "clicked_task", lambda chart, tasks: "vt")
    at.run()
    assert not at.exception
    assert at.selectbox(key="compare_task").value == "vt"
    chart, samples, report = where()
    assert chart < samples < report and samples == chart + 1  # right under the chart: in view
    at.toggle(key="compare_differing").set_value(True).run()  # the selection outlives reruns: they stay there
    assert where()[1] == where()[0] + 1 and not at.exception

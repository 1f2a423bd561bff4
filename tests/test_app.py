"""The web app through Streamlit's AppTest: every page opens on the demo model with its main content;
painting, table edits, saving, loading, bad input and launching a run behave as the page says.

AppTest cannot click charts or edit data editors: the chart's selection is set through the layer list's
session state and table edits through the editor's edit state, as a browser would leave them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app import charts, common, job_controls, job_forms
from polykv import jobs
from polykv.eval.comparing.compare import macro_average
from polykv.eval.results.store import Store
from polykv.methods import REGISTRY
from polykv.plan import Plan
from polykv.plan_edits import whole_plan
from tests.helpers import (
    BERT_CONFIG,
    HUGE_CONFIG,
    MIXED,
    REPO,
    button,
    fake_run,
    open_app,
    run_row,
    texts,
    wait_for_job,
)

TINY_SETTINGS = {
    "tasks": ["prose", "stories"],
    "samples_per_task": 1,
    "prompt_tokens": 96,
    "continuation": 8,
    "generate": 8,
}


def current_plan(at: AppTest) -> Plan:
    return Plan.from_json(at.session_state["plan_json"])


def table_key(at: AppTest) -> str:
    return f"plan_table_{at.session_state['plan_version'] if 'plan_version' in at.session_state else 0}"


def paint_selection(at: AppTest, layers: list[int], phase: str, method: str, capacity: int | None = None) -> None:
    """Select `layers` (as a box selection on the chart leaves them), choose phase, method and capacity, paint."""
    at.session_state["designer_layers"] = layers
    at.radio(key="designer_phase").set_value(phase)
    at.button(key=f"palette_{method}").click()
    at.run()
    if capacity is not None:
        at.number_input(key="paint_capacity").set_value(capacity)
    button(at, "Paint selection").click()
    at.run()


def test_designer_opens_with_the_demo_plan_chart_table_and_summary(app_env):
    at = open_app()
    assert texts(at.title) == ["Plan designer"]
    assert current_plan(at).name == "mixed-demo" and current_plan(at).num_layers == 5
    assert any("total capacity B=" in t for t in texts(at.text))
    assert len(at.get("plotly_chart")) == 1 and len(at.dataframe) >= 1  # the plan (a KV chart on hybrid models only)
    assert "Model: **demo** on cpu, 5 layers" in texts(at.sidebar.caption)
    # 5 layers of the demo's mixed plan after a 512-token prompt (its context), against FullKV's 5 x 512
    assert any(
        t.startswith("Kept entering the answer: ") and "of FullKV's 2,560 token-layers" in t for t in texts(at.caption)
    )


def test_painting_a_selection_changes_only_those_cells_and_undo_restores(app_env):
    at = open_app()
    before = current_plan(at)
    paint_selection(at, [1, 2, 3], "decode", "h2o", 40)
    assert not at.exception and not at.error
    assert "Painted h2o @40 onto layers 1, 2, 3 (decode)." in texts(at.success)
    after = current_plan(at)
    for i in range(5):
        assert after.layers[i].prefill == before.layers[i].prefill
        expected = ("h2o", 40) if i in (1, 2, 3) else (before.layers[i].decode.method, before.layers[i].decode.capacity)
        assert (after.layers[i].decode.method, after.layers[i].decode.capacity) == expected
    button(at, "Undo").click()
    at.run()
    assert current_plan(at) == before


def test_two_paints_are_both_in_the_plans_provenance_and_shown_under_provenance(app_env):
    at = open_app()
    paint_selection(at, [1, 2, 3], "decode", "h2o", 40)
    paint_selection(at, [0], "both", "tova", 24)
    assert not at.exception and not at.error
    plan = current_plan(at)
    edits = ["painted h2o@40 onto layers 1, 2, 3 (decode)", "painted tova@24 onto layers 0 (both)"]
    assert plan.provenance["edits"] == edits and plan.provenance["edited"] is True
    assert plan.provenance["built_by"] == "hand" and plan.name == "mixed-demo"
    [shown] = [e for e in at.expander if e.label.startswith("Provenance")]
    assert shown.label == "Provenance (2 edits)"
    assert texts(shown.text) == ["1. " + edits[0] + "\n2. " + edits[1]]
    assert "Built by: hand" in texts(shown.caption)


def test_a_negative_capacity_in_the_paint_box_is_refused_with_its_reason(app_env):
    at = open_app()
    before = current_plan(at)
    paint_selection(at, [1], "decode", "h2o", -5)
    assert "paint: capacity must be a positive integer (got -5)" in texts(at.error)
    assert current_plan(at) == before


def test_the_palette_offers_only_the_methods_that_run_in_the_chosen_phase(app_env):
    at = open_app()
    at.radio(key="designer_phase").set_value("decode")
    at.run()
    snapkv, d2o = at.button(key="palette_snapkv"), at.button(key="palette_d2o")
    assert snapkv.disabled and snapkv.help == "snapkv runs only in the prefill phase" and not d2o.disabled
    assert any(c.startswith("Not offered here: snapkv runs only in the prefill phase") for c in texts(at.caption))
    at.radio(key="designer_phase").set_value("prefill")
    at.run()
    assert at.button(key="palette_d2o").disabled and not at.button(key="palette_snapkv").disabled
    at.button(key="palette_snapkv").click()
    at.run()
    assert at.button(key="palette_snapkv").proto.type == "primary"  # the chosen one is highlighted
    at.radio(key="designer_phase").set_value("decode")  # snapkv cannot run there: the choice is dropped
    at.run()
    assert at.session_state["paint_method"] == "(keep)" and at.button(key="palette_(keep)").proto.type == "primary"


def test_the_paint_phase_starts_at_the_plans_scope_and_a_scope_change_is_announced(app_env):
    at = open_app()
    at.session_state["plan_json"] = Plan.homogeneous("tova", 24, 5, "decode", name="decode-plan").to_json()
    at.run()
    assert at.radio(key="designer_phase").value == "decode"
    paint_selection(at, [1], "both", "h2o", 16)  # paints prefill too: the plan now compresses both phases
    assert current_plan(at).scope.value == "both"
    assert "The plan's scope changed from decode to both." in texts(at.warning)
    assert at.radio(key="designer_phase").value == "both"  # the phase follows the new scope


def _walk(node):
    """Every element under an AppTest node, in page order."""
    for child in getattr(node, "children", {}).values():
        yield child
        yield from _walk(child)


def test_a_capacity_of_zero_typed_into_the_table_is_refused_with_a_message(app_env):
    at = open_app()
    before = current_plan(at)
    at.session_state[table_key(at)] = {"edited_rows": {2: {"decode_capacity": 0}}, "added_rows": [], "deleted_rows": []}
    at.run()
    assert not at.exception
    assert any(
        "layer 2, decode, capacity: must be a positive whole number of tokens (got 0)" in e for e in texts(at.error)
    )
    order = [node.type for node in _walk(at.main)]  # the page top to bottom
    table = order.index("dataframe")
    assert "error" in order[:table]  # said above the table, where the eye is, not below its ten rows
    assert current_plan(at) == before
    # a valid edit in the same table applies
    at.session_state[table_key(at)] = {
        "edited_rows": {2: {"decode_capacity": 20}},
        "added_rows": [],
        "deleted_rows": [],
    }
    at.run()
    assert current_plan(at).layers[2].decode.capacity == 20 and not at.error


def test_match_total_capacity_rescales_and_keeps_the_route(app_env):
    at = open_app()
    before = current_plan(at)
    [n for n in at.number_input if n.label == "Budget (average capacity per layer)"][0].set_value(24.0)
    button(at, "Rescale (keep the route)").click()
    at.run()
    after = current_plan(at)
    assert [(lay.prefill.method, lay.decode.method) for lay in after.layers] == [
        (lay.prefill.method, lay.decode.method) for lay in before.layers
    ]
    assert after.summary().phases["prefill"].total_capacity == 24 * 5
    assert after.summary().phases["decode"].total_capacity == 24 * 5


def test_save_sanitizes_the_name_and_load_and_diff_read_it_back(app_env):
    at = open_app()
    [t for t in at.text_input if t.label == "Plan name"][0].set_value("../My plan!")
    button(at, "Save to plans/").click()
    at.run()
    saved = app_env / "plans" / "demo" / "My-plan.json"  # beside the model's shipped plans
    assert saved.is_file() and any("Saved" in s for s in texts(at.success))
    assert Plan.load(saved).name == "../My plan!"  # the name inside is kept; only the file name is made safe
    assert Plan.load(saved).description == "edited from mixed-demo"  # not the shipped plan's description
    # refuse to overwrite without the tick
    button(at, "Save to plans/").click()
    at.run()
    assert any("tick 'Overwrite'" in w for w in texts(at.warning))
    # change the plan, then diff against and load the saved file
    at.session_state["designer_layers"] = [4]
    at.button(key="palette_tova").click()
    at.run()
    button(at, "Paint selection").click()
    at.run()
    at.selectbox(key="diff_with").select(Path("demo/My-plan.json"))
    at.run()
    assert any("difference" in c for c in texts(at.caption))
    [s for s in at.selectbox if s.label == "Saved plans"][0].select(Path("demo/My-plan.json"))
    at.run()
    button(at, "Load").click()
    at.run()
    assert current_plan(at) == Plan.load(saved)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("this is not json", "not-a-plan.json: malformed JSON"),
        (json.dumps({"hello": 1}), "not-a-plan.json: "),
        (
            Plan.homogeneous("tova", 32, 3).to_json(),
            "does not fit 'demo': layers: the plan has 3 layers but the model has 5",
        ),
    ],
)
def test_loading_a_file_that_is_not_a_plan_for_this_model_says_why(app_env, content, message):
    (app_env / "plans" / "not-a-plan.json").write_text(content)
    at = open_app()
    before = current_plan(at)
    [s for s in at.selectbox if s.label == "Saved plans"][0].select(Path("not-a-plan.json"))
    at.run()
    button(at, "Load").click()
    at.run()
    assert not at.exception
    assert any(message in e for e in texts(at.error)), texts(at.error)
    assert current_plan(at) == before
    assert texts(at.title) == ["Plan designer"]  # still usable


def test_a_model_path_that_does_not_exist_is_reported_and_the_demo_model_stays(app_env):
    at = open_app()
    before = current_plan(at)
    at.sidebar.text_input[0].set_value("/no/such/model")
    at.sidebar.button[0].click()
    at.run()
    assert not at.exception
    (error,) = texts(at.sidebar.error)  # reported once, in the sidebar, naming the model and the reason
    assert error.startswith("Could not load model '/no/such/model' on cpu: ")
    assert "model path does not exist: /no/such/model" in error
    # the demo model stays the current one, and the plan designed for it stays as it was
    assert at.session_state["model"] == ("demo", "cpu")
    assert "Model: **demo** on cpu, 5 layers" in texts(at.sidebar.caption)
    assert current_plan(at) == before
    assert texts(at.title) == ["Plan designer"]


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (BERT_CONFIG, "model_type 'bert'; PolyKV runs Llama, Mistral, Qwen2, Qwen3 and Gemma 3 models"),
        (HUGE_CONFIG, "GiB, the device (cpu) has"),
    ],
)
def test_the_model_field_refuses_a_model_polykv_cannot_run_and_the_demo_model_stays(app_env, config, reason):
    (app_env / "m").mkdir()
    (app_env / "m" / "config.json").write_text(json.dumps(config))
    at = open_app()
    before = current_plan(at)
    load_in_sidebar(at, str(app_env / "m"))
    assert not at.exception
    (error,) = texts(at.sidebar.error)
    assert error.startswith(f"Could not load model '{app_env / 'm'}' on cpu: ") and reason in error, error
    assert at.session_state["model"] == ("demo", "cpu") and current_plan(at) == before


def test_a_capacity_past_the_models_context_is_refused_in_the_designer(app_env):
    at = open_app()
    before = current_plan(at)
    paint_selection(at, [1], "decode", "h2o", 1_048_576)
    assert any("capacity: 1048576 is more than the model's context (512 tokens)" in e for e in texts(at.error))
    assert current_plan(at) == before


def test_heterogeneity_page_draws_support_sizes_and_density(app_env):
    at = open_app("heterogeneity")
    assert texts(at.title) == ["Attention heterogeneity"]
    assert not at.get("plotly_chart")  # opening the page measures nothing
    assert any(i.startswith("Nothing is measured until you press Measure") for i in texts(at.info))
    button(at, "Measure").click()
    at.run()
    support, density = (json.loads(chart.proto.spec) for chart in at.get("plotly_chart"))  # these two, in order
    assert [(t["type"], t.get("name")) for t in support["data"]] == [("scatter", "median")]
    assert support["layout"]["title"]["text"].startswith("90% attention support per layer")
    assert [t["type"] for t in density["data"]] == ["heatmap"]
    assert density["layout"]["title"]["text"].startswith("support density over the input")
    assert any("8 inputs of" in c for c in texts(at.caption))
    assert any(c.startswith("Measured in ") for c in texts(at.caption))  # the actual time, beside any estimate


@pytest.mark.slow  # builds a profile of the demo model, then two pages
def test_profiles_page_shows_heatmaps_of_a_saved_profile(app_env, demo_model):
    from polykv.profile.build import build_profile
    from polykv.profile.corpus import CorpusSpec

    model, tokenizer = demo_model
    spec = CorpusSpec(num_sequences=2, max_tokens=128)
    profile = build_profile("demo", model, tokenizer, app_env / "ws" / "profiles", spec)
    at = open_app("profiles")
    assert texts(at.title) == ["Method profiles"]
    assert [s.value for s in at.subheader] == list(profile.metadata["scopes"])
    assert len(at.get("plotly_chart")) == len(profile.metadata["scopes"]) + 1  # a decision chart per scope, entropy
    for chart in at.get("plotly_chart")[:-1]:  # every method of the registry, the new knorm included, has a column
        assert "knorm" in json.loads(chart.proto.spec)["data"][0]["x"]

    # the designer builds a plan from it (TopRank + allocation), as `polykv route` does
    from polykv.routing import plan_from_profile

    at.switch_page("views/designer.py")
    at.run()
    at.selectbox(key="build_scope").select("decode")
    at.number_input(key="build_budget").set_value(24)
    at.radio(key="build_allocation").set_value("entropy")
    button(at, "Build plan").click()
    at.run()
    assert not at.exception and not at.error
    assert current_plan(at) == plan_from_profile(profile, "decode", 24, "cosine", "entropy")


@pytest.mark.slow  # launches a profile job and waits for its worker
def test_profiles_page_starts_a_background_profile(app_env):
    at = open_app("profiles")
    [n for n in at.number_input if n.label == "Sequences"][0].set_value(1)
    [n for n in at.number_input if n.label == "Tokens per sequence"][0].set_value(96)
    [s for s in at.multiselect if s.label == "Sources"][0].set_value(["kjv"])
    button(at, "Start profiling").click()
    at.run()
    (job,) = jobs.list_jobs(app_env / "ws")
    assert job.kind == "profile" and job.profile.corpus["num_sequences"] == 1
    state = wait_for_job(job, app_env / "ws")
    assert state.status == "finished", (state, jobs.log_tail(job, app_env / "ws"))
    at.run()
    assert len(at.get("plotly_chart")) >= 3  # the new profile opens


@pytest.mark.slow  # launches an eval job and waits for its worker
def test_runs_page_launches_a_background_run_and_compare_shows_its_scores(app_env):
    at = open_app("runs")
    assert texts(at.title) == ["Runs"]
    at.text_area(key="settings_fidelity").set_value(json.dumps(TINY_SETTINGS))
    [t for t in at.text_input if t.label == "Budgets"][0].set_value("16")
    [m for m in at.multiselect if m.label == "Baselines"][0].set_value(["tova"])
    button(at, "Launch").click()
    at.run()
    assert not at.exception and not at.error
    assert any("Started" in s and "(2 runs)" in s for s in texts(at.success))
    (job,) = jobs.list_jobs(app_env / "ws")
    assert [r.label for r in job.runs] == [{"series": "route", "budget": 16}, {"series": "tova", "budget": 16}]
    assert wait_for_job(job, app_env / "ws").status == "finished", jobs.log_tail(job, app_env / "ws")
    at.run()
    assert any("finished" in m for m in texts(at.markdown))
    runs = Store(app_env / "ws" / "results.sqlite").runs()
    assert sorted(r.status for r in runs) == ["finished", "finished"]

    at.switch_page("views/compare.py")
    at.run()
    assert not at.exception
    labels = [m.label for m in at.metric]
    assert "A wins / ties / losses" in labels and "Sign-flip test" in labels  # the sample-level test, the headline
    assert len(at.get("plotly_chart")) == 1  # task differences
    at.switch_page("views/experiments.py")
    at.run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == 1  # the budget sweep


def test_runs_page_refuses_bad_settings_and_budgets_inline(app_env):
    at = open_app("runs")
    at.text_area(key="settings_fidelity").set_value('{"samples_per_task": 0}')
    button(at, "Launch").click()
    at.run()
    assert not at.exception
    assert any(e.startswith("Not launched: fidelity settings") for e in texts(at.error))
    at.text_area(key="settings_fidelity").set_value('{"samples_per_task": 1000000000}')  # launched, before
    button(at, "Launch").click()
    at.run()
    assert any("samples_per_task 1,000,000,000 is more than PolyKV takes (at most 10,000" in e for e in texts(at.error))
    at.text_area(key="settings_fidelity").set_value('{"samples_per_task": 1}')
    [t for t in at.text_input if t.label == "Budgets"][0].set_value("16, x")
    button(at, "Launch").click()
    at.run()
    assert "Not launched: budgets are positive whole numbers separated by commas, e.g. 64,128 (got 'x')" in texts(
        at.error
    )
    assert jobs.list_jobs(app_env / "ws") == []


def test_runs_page_refuses_a_longbench_data_dir_without_the_task_files_inline(app_env):
    at = open_app("runs")
    at.selectbox(key="run_suite").select("longbench")
    at.run()
    empty = app_env / "longbench-data"
    empty.mkdir()
    at.text_area(key="settings_longbench").set_value(json.dumps({"data_dir": str(empty), "tasks": ["trec"]}))
    button(at, "Launch").click()
    at.run()
    assert not at.exception
    refusal = f"Not launched: longbench settings: data_dir {empty} lacks trec.jsonl (one <task>.jsonl per chosen task)"
    assert refusal in texts(at.error)
    assert not list((app_env / "ws" / "jobs").glob("*.json")) if (app_env / "ws" / "jobs").is_dir() else True


def test_compare_page_without_runs_says_what_to_do(app_env):
    at = open_app("compare")
    assert texts(at.title) == ["Compare"]
    assert any("No finished run yet" in i for i in texts(at.info))


def _tiny_local_model(where: Path, tokenizer) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    LlamaForCausalLM(config).save_pretrained(where)
    tokenizer.save_pretrained(where)
    return where


def load_in_sidebar(at: AppTest, name: str) -> None:
    at.sidebar.text_input[0].set_value(name)
    [b for b in at.sidebar.button if b.label == "Load model"][0].click()
    at.run()


def test_a_model_switch_asks_before_it_replaces_the_plan_and_keeps_the_old_one_as_a_draft(app_env, demo_model):
    local = str(_tiny_local_model(app_env / "tiny-llama", demo_model[1]))
    at = open_app()
    paint_selection(at, [1], "decode", "h2o", 40)
    edited = current_plan(at)
    load_in_sidebar(at, local)
    assert not at.exception and not at.sidebar.error
    (question,) = texts(at.main.warning)  # at the top of the page, its buttons beside it: not below the sidebar's fold
    assert question.startswith("The plan on the designer, 'mixed-demo', does not fit") and "Switch anyway?" in question
    assert "Model: **demo** on cpu, 5 layers" in texts(at.sidebar.caption)  # nothing changed yet
    button(at, "Stay").click()
    at.run()
    assert (
        not at.main.warning
        and current_plan(at) == edited
        and "Model: **demo** on cpu, 5 layers" in texts(at.sidebar.caption)
    )
    load_in_sidebar(at, local)
    button(at, "Switch").click()
    at.run()
    assert not at.exception and f"Model: **{local}** on cpu, 3 layers" in texts(at.sidebar.caption)
    assert current_plan(at).num_layers == 3  # a fresh plan for this model
    assert [t.value for t in at.text_input if t.label == "Plan name"] == [current_plan(at).name]  # not the old name
    load_in_sidebar(at, "demo")  # the fresh plan does not fit the demo model either
    button(at, "Switch").click()
    at.run()
    assert current_plan(at) == edited  # the demo model's draft came back, edits and all


@pytest.mark.slow  # a designer session saved, then reloaded in a new AppTest
def test_the_edited_plan_survives_a_reload_through_the_session_in_the_url(app_env):
    at = open_app()
    paint_selection(at, [1, 2], "decode", "h2o", 40)
    edited = current_plan(at)
    session = at.query_params["session"]
    assert session and list((app_env / "ws" / "drafts" / str(session)).glob("*.json"))  # saved as a draft
    fresh = AppTest.from_file(str(REPO / "app" / "app.py"), default_timeout=180)  # a reload: a new session
    fresh.query_params["session"] = session
    fresh.run()
    assert not fresh.exception and current_plan(fresh) == edited
    button(fresh, "Undo").click()  # the history came back too
    fresh.run()
    assert current_plan(fresh).layers[1].decode.method != "h2o"
    other = AppTest.from_file(str(REPO / "app" / "app.py"), default_timeout=180)  # another browser session
    other.run()
    assert other.query_params["session"] != session and current_plan(other).name == "mixed-demo"
    assert current_plan(other) != edited


def test_undo_and_redo_say_what_they_undid_and_redid(app_env):
    at = open_app()
    paint_selection(at, [1, 2], "decode", "h2o", 40)
    button(at, "Undo").click()
    at.run()
    undid = [t for t in texts(at.info) if t.startswith(("Undid", "Redid"))]  # (the popovers' infos aside)
    assert undid == ["Undid: painted h2o@40 onto layers 1, 2 (decode)."]
    button(at, "Redo").click()
    at.run()
    assert [t for t in texts(at.info) if t.startswith(("Undid", "Redid"))] == [
        "Redid: painted h2o@40 onto layers 1, 2 (decode)."
    ]
    button(at, "Reset to full").click()
    at.run()
    assert "Reset every layer to full (no eviction)." in texts(at.success)
    button(at, "Undo").click()
    at.run()
    undid = [t for t in texts(at.info) if t.startswith(("Undid", "Redid"))]
    assert undid == ["Undid: 10 cells changed."]  # a reset records no edit: its cells are counted


@pytest.mark.slow  # a designer session saved, then reloaded in a new AppTest
def test_the_designers_selection_survives_a_reload(app_env):
    at = open_app()
    at.session_state["designer_layers"] = [0, 3]
    at.radio(key="designer_phase").set_value("prefill")
    at.run()
    fresh = AppTest.from_file(str(REPO / "app" / "app.py"), default_timeout=180)  # a reload: a new session
    fresh.query_params["session"] = at.query_params["session"]
    fresh.run()
    assert not fresh.exception
    assert fresh.multiselect(key="designer_layers").value == [0, 3]
    assert fresh.radio(key="designer_phase").value == "prefill"  # not reset to the plan's scope


def test_the_designer_lists_the_workspaces_drafts_to_reopen_or_delete(app_env):
    other = open_app()  # another tab: its own session, a draft of its own
    paint_selection(other, [1], "decode", "h2o", 40)
    at = open_app()
    paint_selection(at, [2], "decode", "tova", 20)
    table = at.dataframe[-1].value
    assert len(table) == 2 and set(table["model"]) == {"demo"} and set(table["plan"]) == {"mixed-demo"}
    mine = at.query_params["session"]
    assert sorted(table["open"]) == sorted([f"?session={mine}", f"?session={other.query_params['session']}"])
    assert any(s.endswith("(this one)") for s in table["session"])
    delete = at.selectbox(key="draft_delete")
    assert len(delete.options) == 1  # the other tab's; the plan being designed here is not offered
    delete.select_index(0).run()
    button(at, "Delete").click()
    at.run()
    assert not at.exception and list(at.dataframe[-1].value["open"]) == [f"?session={mine}"]


def test_undo_and_redo_walk_the_history_and_a_new_edit_drops_the_redo(app_env):
    at = open_app()
    start = current_plan(at)
    paint_selection(at, [1], "decode", "h2o", 40)
    painted = current_plan(at)
    button(at, "Undo").click()
    at.run()
    assert current_plan(at) == start and not button(at, "Redo").disabled
    button(at, "Redo").click()
    at.run()
    assert current_plan(at) == painted and button(at, "Redo").disabled
    button(at, "Undo").click()
    at.run()
    paint_selection(at, [2], "decode", "tova", 20)
    assert button(at, "Redo").disabled  # a new edit: what was undone is gone


def test_runs_launches_the_plan_it_shows_and_offers_saved_plans(app_env):
    saved = Plan.homogeneous("h2o", 24, 5, "decode", name="saved-h2o")
    (app_env / "plans").mkdir(exist_ok=True)
    saved.save(app_env / "plans" / "saved-h2o.json")
    Plan.homogeneous("h2o", 24, 30, "decode", name="smollm2-h2o").save(app_env / "plans" / "smollm2-h2o.json")
    at = open_app("runs")
    picker = at.selectbox(key="run_plan")  # the 30-layer plan is not offered for the 5-layer demo model
    assert picker.value == "(designer)" and picker.options == [
        "the designer's plan (this session's draft)",
        "saved-h2o.json",
    ]
    assert any(s.value == "Evaluate the current plan: mixed-demo" for s in at.subheader)
    picker.select(Path("saved-h2o.json"))
    at.run()
    assert any(s.value == "Evaluate the saved plan: saved-h2o" for s in at.subheader)
    at.text_area(key="settings_fidelity").set_value(json.dumps(TINY_SETTINGS))
    with mock.patch("polykv.jobs.start") as start:  # what would be launched, without running it
        button(at, "Launch").click()
        at.run()
    (job,) = [call.args[0] for call in start.call_args_list]
    assert [r.plan_name for r in job.runs] == ["saved-h2o", "full-both"]  # FullKV, the reference, pre-selected


@pytest.mark.slow  # launches a four-run eval job and waits for its worker
def test_a_placement_control_launched_from_runs_is_drawn_on_experiments(app_env):
    from polykv.plan_edits.painting import paint

    guided = paint(Plan.homogeneous("tova", 24, 5, "decode", name="guided"), [2, 3, 4], "decode", "h2o")
    at = open_app("runs")
    at.session_state["plan_json"] = guided.to_json()
    at.run()
    at.text_area(key="settings_fidelity").set_value(json.dumps(TINY_SETTINGS))
    [n for n in at.number_input if n.label == "Random placements"][0].set_value(3)
    at.multiselect(key="run_baselines").set_value([])  # without FullKV's reference run
    button(at, "Launch").click()
    at.run()
    assert any("(4 runs)" in s for s in texts(at.success)), (texts(at.success), texts(at.error))
    (job,) = jobs.list_jobs(app_env / "ws")
    assert [r.label.get("series") for r in job.runs] == ["route", "placement", "placement", "placement"]
    assert wait_for_job(job, app_env / "ws").status == "finished", jobs.log_tail(job, app_env / "ws")
    at.switch_page("views/experiments.py")
    at.run()
    assert not at.exception
    assert any(
        c.startswith("Guided route rank ") and "of 4; one-sided Monte Carlo p = " in c for c in texts(at.caption)
    )
    assert len(at.get("plotly_chart")) == 1  # the placement histogram


@pytest.mark.slow  # launches an eval job (worker) and cancels it
def test_a_running_job_shows_progress_and_cancel_stops_it(app_env):
    slow = {**TINY_SETTINGS, "samples_per_task": 20, "prompt_tokens": 200}
    at = open_app("runs")
    at.text_area(key="settings_fidelity").set_value(json.dumps(slow))
    at.multiselect(key="run_baselines").set_value([])  # the plan's run alone
    button(at, "Launch").click()
    at.run()
    (job,) = jobs.list_jobs(app_env / "ws")
    wait_for_job(job, app_env / "ws", lambda s: s.runs[0].done >= 1)
    at.run()  # a reload while it runs: the job is read back from its files
    assert any(" · running" in m for m in texts(at.markdown))
    progress = [p for p in at.get("progress") if "samples" in p.proto.text]
    assert progress and "/40 samples · running" in progress[0].proto.text
    button(at, "Cancel").click()
    at.run()
    assert jobs.state(job, app_env / "ws").status == "cancelled"
    assert any(" · cancelled" in m for m in texts(at.markdown))
    assert "Resume" in [b.label for b in at.button]


def test_knorm_is_in_the_palette_the_table_and_the_chart_in_its_own_colour(app_env):
    at = open_app()
    assert not at.button(key="palette_knorm").disabled
    (editor,) = [d for d in at.dataframe if d.proto.id.endswith(table_key(at))]
    columns = json.loads(editor.proto.columns)
    assert all("knorm" in columns[f"{phase}_method"]["type_config"]["options"] for phase in ("prefill", "decode"))
    paint_selection(at, [0, 1], "both", "knorm", 24)
    assert not at.exception and not at.error
    assert "Painted knorm @24 onto layers 0, 1 (both)." in texts(at.success)
    assert [(lay.prefill.method, lay.decode.method) for lay in current_plan(at).layers[:2]] == [("knorm", "knorm")] * 2
    traces = json.loads(at.get("plotly_chart")[0].proto.spec)["data"]
    (cells,) = [t for t in traces if t.get("name") == "knorm"]
    assert cells["marker"]["color"] == REGISTRY["knorm"].colour and len(cells["x"]) == 4


# ---- what the pages decide, in app/common.py, app/job_forms.py, app/job_controls.py and app/charts.py (no page run)
def test_no_chart_breaks_on_a_method_without_a_colour_and_no_file_spells_a_method_colour():
    retired = Plan.homogeneous("retired", 16, 3, "decode")  # e.g. a method an old plan or run still names
    figure = charts.plan_figure(retired)
    cells = {t.name: t.marker.color for t in figure.data if t.type == "scatter" and t.mode == "markers"}
    assert cells == {"full": REGISTRY["full"].colour, "retired": charts.OTHER_METHOD_COLOR}
    sweep = pd.DataFrame(
        {"budget": [16], "route": [0.3], "retired": [0.4], "best baseline": ["retired"], "envelope": [0.4]}
    )
    assert charts.sweep_figure(sweep, "kl").data[0].line.color == charts.OTHER_METHOD_COLOR
    assert charts.METHOD_COLORS == {name: cls.colour for name, cls in REGISTRY.items()}
    colours = {c.lower() for c in charts.METHOD_COLORS.values()} | {charts.OTHER_METHOD_COLOR.lower()}
    for path in (REPO / "app").rglob("*.py"):  # the colours come from the method classes only
        assert not colours & set(re.findall(r"#[0-9a-f]{6}\b", path.read_text().lower())), path


def test_the_runs_table_averages_each_metric_over_the_tasks_that_report_it(tmp_path):
    from polykv.eval.comparing.run_table import empty_runs, runs_table

    store = Store(tmp_path / "results.sqlite")
    fake_run(store, "r1", {"prose": {"kl": 0.2, "top1": 0.5}, "stories": {"kl": 0.4}})
    fake_run(store, "r2", {"prose": {"kl": 0.1}}, status="running")
    fake_run(store, "r3", {"prose": {}}, status="cancelled", samples=False)  # cancelled before its first sample
    fake_run(store, "r4", {"prose": {"kl": 0.3}}, status="cancelled")  # cancelled with a sample: still listed
    rows = runs_table(store).to_dict("records")
    assert empty_runs(store) == 1 and [r["run"] for r in rows] == ["r4", "r2", "r1"]
    rows = rows[1:]
    assert [r["run"] for r in rows] == ["r2", "r1"]  # newest first
    assert rows[1]["kl"] == macro_average({"prose": 0.2, "stories": 0.4}) and rows[1]["top1"] == 0.5
    assert (rows[1]["samples"], rows[1]["status"], rows[0]["status"]) == ("2/2", "finished", "running")


def test_run_settings_and_profile_forms_start_small_on_the_demo_model():
    from polykv.eval.running.defaults import SMALL_SETTINGS
    from polykv.eval.running.fit import FIRST_RUN_TASKS
    from polykv.eval.running.suite_runner import SUITES
    from polykv.eval.suites.fidelity import default_tasks
    from polykv.profile.corpus import KNOWN_SOURCES, default_sources

    demo = json.loads(job_forms.default_settings("fidelity", "demo"))
    assert demo == {
        **SUITES["fidelity"].Settings().to_dict(),
        "tasks": list(default_tasks("demo")),
        **SMALL_SETTINGS["fidelity"],
    }
    other = json.loads(job_forms.default_settings("fidelity", "org/model"))
    assert other == {**SUITES["fidelity"].Settings().to_dict(), "tasks": list(default_tasks("org/model"))}
    ruler = json.loads(job_forms.default_settings("ruler", "demo"))  # fitted to the demo's 512-token context, on CPU
    expected = {**SUITES["ruler"].Settings().to_dict(), "length": 512, "tasks": ruler["tasks"], "samples_per_task": 1}
    assert ruler == expected | {"question": "in-prompt"} and set(ruler["tasks"]) <= set(FIRST_RUN_TASKS)
    assert list(ruler)[list(ruler).index("mode") + 1] == "question"  # the protocol is written out, after the mode
    assert job_forms.profile_defaults("demo") == {"sequences": 4, "max_tokens": 512}
    assert job_forms.profile_defaults("org/model") == {"sequences": 20, "max_tokens": 2048}
    choices = common.source_choices("demo")
    assert choices[: len(default_sources("demo"))] == list(default_sources("demo"))
    assert set(KNOWN_SOURCES) <= set(choices)
    assert len(choices) == len(set(choices))
    assert common.index_of(["cpu", "cuda"], "cuda") == 1 and common.index_of(["cpu"], "cuda") == 0
    assert common.default_metric(["acc", "kl", "top1"]) == 1 and common.default_metric(["acc"]) == 0


def test_the_launch_form_becomes_one_job_or_a_one_line_refusal():
    plan = Plan.load(MIXED)
    job = job_forms.eval_job("demo", "cpu", plan, "fidelity", json.dumps(TINY_SETTINGS), "16", ["tova"], 0, 0)
    assert [r.label for r in job.runs] == [{"series": "route", "budget": 16}, {"series": "tova", "budget": 16}]
    assert job.title == "mixed-demo on fidelity + 1 more" and (job.model, job.device) == ("demo", "cpu")
    assert job_forms.eval_job("demo", "cpu", plan, "fidelity", "{}", "", [], 0, 0).title == "mixed-demo on fidelity"
    with pytest.raises(ValueError, match=r"budgets are positive whole numbers .* \(got 'x'\)"):
        job_forms.eval_job("demo", "cpu", plan, "fidelity", "{}", "16, x", [], 0, 0)
    with pytest.raises(ValueError, match="fidelity settings"):
        job_forms.eval_job("demo", "cpu", plan, "fidelity", '{"samples_per_task": 0}', "", [], 0, 0)


def test_the_profile_form_becomes_one_job_or_a_one_line_refusal():
    job = job_forms.profile_job("demo", "cpu", ["kjv"], 1, 96, 0, "both")
    assert (job.kind, job.model, job.device, job.title) == ("profile", "demo", "cpu", "profile demo")
    assert job.profile.capacity is None and job.profile.scopes == ["prefill", "decode"]  # b_cal 0: automatic
    assert (job.profile.corpus["sources"], job.profile.corpus["num_sequences"]) == (["kjv"], 1)
    assert job_forms.profile_job("demo", "cpu", ["kjv"], 1, 96, 24, "decode").profile.capacity == 24
    with pytest.raises(ValueError, match="sources is empty"):
        job_forms.profile_job("demo", "cpu", [], 1, 96, 0, "decode")


def test_compare_finds_sweeps_and_placements_in_the_jobs_that_launched_them():
    def run(run_id, **label):
        return SimpleNamespace(run_id=run_id, label=label)

    route_only = SimpleNamespace(kind="eval", model="demo", runs=[run("a", series="route", budget=16)])
    sweep = SimpleNamespace(
        kind="eval", model="demo", runs=[run("b", series="route", budget=16), run("c", series="tova", budget=16)]
    )
    placed = SimpleNamespace(
        kind="eval",
        model="demo",
        runs=[run("d", series="route", role="guided"), run("e", series="placement"), run("f", series="placement")],
    )
    profile = SimpleNamespace(kind="profile", model="demo", runs=[])
    every = [route_only, sweep, placed, profile]
    assert job_controls.jobs_of(every, "eval") == [route_only, sweep, placed]
    assert job_controls.jobs_of(every, "eval", limit=1) == [route_only]
    assert (
        job_controls.jobs_of(every, "profile", "demo") == [profile]
        and job_controls.jobs_of(every, "profile", "other") == []
    )
    assert common.sweep_jobs(every[:3]) == [sweep] and common.placement_jobs(every[:3]) == [placed]
    assert common.sweep_runs(sweep) == [
        ({"series": "route", "budget": 16}, "b"),
        ({"series": "tova", "budget": 16}, "c"),
    ]
    assert common.sweep_runs(placed) == [({"series": "route", "role": "guided"}, "d")]
    progress = {"d": (2, 2, "finished"), "e": (1, 2, "running"), "f": (2, 2, "finished")}
    store = SimpleNamespace(progress=lambda ids: {i: progress[i] for i in ids if i in progress})
    assert common.finished_runs(store, placed) == {"d", "f"}
    guided, controls = common.placement_runs(placed, {"d", "f"})
    assert guided.run_id == "d" and [r.run_id for r in controls] == ["f"]
    assert common.placement_runs(sweep, {"b", "c"}) == (None, [])
    assert set(job_controls.RESUMABLE) == {"stopped", "cancelled", "failed"}
    finished = run_row("r2", plan_name="p")
    older = [run_row("r1"), run_row("r0", "running")]
    runs = SimpleNamespace(runs=lambda: [*older, finished])
    assert [r.id for r in common.finished_run_rows(runs)] == ["r2", "r1"]  # newest first
    assert common.run_label(run_row("0123456789", plan_name="p")) == "p · fidelity · demo · 01234567"


def test_a_job_runs_label_leaves_out_fields_without_a_value():
    assert common.label_text({"series": "route", "budget": 64, "role": None}) == "series route, budget 64"
    assert common.label_text({}) == ""


def test_after_a_failed_load_the_model_box_shows_the_loaded_model_again(app_env):
    at = open_app()
    load_in_sidebar(at, "/no/such/model")
    assert not at.exception and texts(at.sidebar.error)
    assert at.sidebar.text_input[0].value == "demo"  # not the name that failed: the box says what is loaded


def test_split_by_a_rule_draws_the_capacities_then_applies_them_to_the_plans_methods(app_env):
    at = open_app()
    before = current_plan(at)
    [r for r in at.radio if r.label == "Rule"][0].set_value("pyramid")
    [n for n in at.number_input if n.label == "Budget of the split (average capacity per layer)"][0].set_value(40.0)
    at.run()
    assert not at.error
    button(at, "Apply the rule").click()
    at.run()
    after = current_plan(at)
    assert [(lay.prefill.method, lay.decode.method) for lay in after.layers] == [
        (lay.prefill.method, lay.decode.method) for lay in before.layers
    ]  # the route kept, the split the pyramid's
    prefill = [lay.prefill.capacity for lay in after.layers]
    assert sum(prefill) == 40 * 5 and prefill == sorted(prefill, reverse=True) and prefill[0] > prefill[-1]
    assert any("Split by the pyramid rule at a budget of 40" in s for s in texts(at.success) + texts(at.info))
    # CAKE's rule is decided at run time: the plan says so, and its split on calibration text is drawn on request
    [r for r in at.radio if r.label == "Rule"][0].set_value("cake")
    at.run()
    assert not at.error, texts(at.error)
    button(at, "Predict on calibration text").click()
    at.run()
    assert not at.exception and any("CAKE's rule gave on 2 calibration sequences" in c for c in texts(at.caption))
    button(at, "Apply the rule").click()
    at.run()
    assert current_plan(at).allocation == "cake" and not at.error
    # a rule the plan cannot take is said before anything is applied
    [n for n in at.number_input if n.label == "Budget of the split (average capacity per layer)"][0].set_value(2.0)
    at.run()
    assert any("split by the cake rule at budget 2" in e for e in texts(at.error))


def test_a_rule_over_the_selected_layers_splits_their_budget_and_leaves_the_others(app_env):
    at = open_app()
    before = current_plan(at)
    at.multiselect(key="designer_layers").set_value([1, 2, 3])
    at.run()
    at.radio(key="split_rule").set_value("pyramid")
    at.radio(key="split_over").set_value("the 3 selected layers")
    at.run()
    assert at.number_input(key="split_budget").value == round(whole_plan.selection_budget(before, [1, 2, 3]))
    at.number_input(key="split_budget").set_value(30.0)
    at.run()
    button(at, "Apply the rule").click()
    at.run()
    after = current_plan(at)
    capacities = [lay.prefill.capacity for lay in after.layers]
    assert capacities[0] == before.layers[0].prefill.capacity and capacities[4] == before.layers[4].prefill.capacity
    assert sum(capacities[1:4]) == 90 and capacities[1] > capacities[3]  # the pyramid over layers 1-3 alone
    assert any("Split by the pyramid rule over layers 1, 2, 3 at a budget of 30" in s for s in texts(at.success))
    # CAKE's rule is decided over every layer at run time: refused over a selection, in one line
    at.radio(key="split_rule").set_value("cake")
    at.run()
    assert any("select all layers" in e for e in texts(at.error))


def test_ada_kv_head_budgets_are_one_click_and_refused_in_one_line_where_a_method_merges(app_env):
    at = open_app()
    at.radio(key="split_heads").set_value("adakv")
    at.run()
    button(at, "Apply to the KV heads").click()
    at.run()
    assert current_plan(at).head_allocation == "adakv" and not at.error  # the mixed plan: every decode method ranks
    assert any("heads adakv" in t for t in texts(at.text))  # the summary says so
    at.radio(key="split_heads").set_value("uniform")
    at.run()
    button(at, "Apply to the KV heads").click()
    at.run()
    at.radio(key="designer_phase").set_value("decode").run()  # cam runs in decode only: offered once that is chosen
    paint_selection(at, [0], "decode", "cam")  # a merging method has no scores to split over the heads
    assert current_plan(at).layers[0].decode.method == "cam"
    at.radio(key="split_heads").set_value("adakv")
    at.run()
    button(at, "Apply to the KV heads").click()
    at.run()
    assert any("cannot split a merging method's decode eviction" in e for e in texts(at.error))
    assert current_plan(at).head_allocation == "uniform"


def test_the_designer_exports_a_one_method_prefill_plan_to_kvpress_and_says_why_not_for_others(app_env):
    at = open_app()
    assert any("Not expressible in kvpress" in i and "evicts in the decode phase" in i for i in texts(at.info))
    at.session_state["plan_json"] = Plan.homogeneous("tova", 32, 5, "prefill").to_json()
    at.run()
    (download,) = [b for b in at.get("download_button") if b.proto.label == "Download kvpress press (.py)"]
    assert not any("Not expressible in kvpress" in i for i in texts(at.info))


def test_the_designer_draws_a_runs_measured_kv_beside_the_plans_capacities(app_env, demo_model):
    from polykv.eval.results.store import Store
    from polykv.eval.running.suite_runner import run_suite
    from polykv.eval.suites.ruler import RulerSettings

    at = open_app()
    assert any("No run of this plan has measured the KV it held yet" in c for c in texts(at.caption))
    plan = current_plan(at)
    model, tokenizer = demo_model
    store = Store(app_env / "ws" / "results.sqlite")
    settings = RulerSettings(tasks=("niah_single_1",), length=400, samples_per_task=1, mode="score")
    run_id = run_suite(store, "demo", model, tokenizer, plan, "ruler", settings)
    at.run()
    (chosen,) = [s for s in at.selectbox if s.label == "Measured in a run of this plan"]
    assert chosen.value.id == run_id
    assert any("held entering the answer, measured (mean of 1 sample)" in c for c in texts(at.caption))


def test_an_empty_or_nameless_settings_box_launches_nothing_and_offers_the_suggested_settings(app_env):
    at = open_app("runs")
    suggested = at.text_area(key="settings_fidelity").value
    for text, why in (("  ", "The suite settings are empty"), ("{ }", "The suite settings name nothing")):
        at.text_area(key="settings_fidelity").set_value(text)
        at.run()
        assert any(e.startswith(why) for e in texts(at.error)), texts(at.error)
        assert button(at, "Launch").disabled
    button(at, "Reset to the suggested settings").click()
    at.run()
    assert at.text_area(key="settings_fidelity").value == suggested and not button(at, "Launch").disabled
    assert jobs.list_jobs(app_env / "ws") == []


def test_a_launch_estimated_over_fifteen_minutes_starts_on_the_second_press_that_restates_it(app_env, monkeypatch):
    from polykv.jobs import costs

    started = []
    monkeypatch.setattr(costs, "with_estimate", lambda job, *a: job.model_copy(update={"estimate_s": 3600.0}))
    monkeypatch.setattr(jobs, "start", lambda job, workspace: started.append(job))
    at = open_app("runs")
    at.text_area(key="settings_fidelity").set_value(json.dumps(TINY_SETTINGS))
    button(at, "Launch").click()
    at.run()
    assert started == [] and any("estimated at about 1 h" in w and "press again" in w for w in texts(at.warning))
    button(at, "Launch").click()
    at.run()
    assert len(started) == 1 and started[0].estimate_s == 3600.0


def test_an_empty_object_however_written_names_nothing():
    from app.job_forms import settings_missing

    for text in ("{}", "{\n}", " { } "):
        assert settings_missing(text, "ruler").startswith("The suite settings name nothing")
    assert settings_missing("", "ruler").startswith("The suite settings are empty")
    assert settings_missing('{"tasks": ["vt"]}', "ruler") is None and settings_missing("{oops", "ruler") is None


def test_the_designer_saves_plans_in_the_workspace_when_one_is_set(monkeypatch, tmp_path):
    from app import designer_controls

    monkeypatch.delenv("POLYKV_PLANS", raising=False)
    monkeypatch.setenv("POLYKV_WORKSPACE", str(tmp_path / "ws"))
    assert designer_controls.plans_dir() == tmp_path / "ws" / "plans"
    monkeypatch.setenv("POLYKV_PLANS", str(tmp_path / "mine"))
    assert designer_controls.plans_dir() == tmp_path / "mine"


def test_the_sidebar_offers_each_gpu_by_index(monkeypatch):
    import torch

    from app import session

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert session.devices() == ["cpu", "cuda", "cuda:0", "cuda:1"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert session.devices() == ["cpu"]

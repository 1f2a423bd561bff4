"""The app on its default model, the 30-layer smollm2, through Streamlit's AppTest: it opens on smollm2, the
designer starts on the shipped 30-layer plan and paints all 30 layers; Profiles draws the study's profile with
a row per layer and a winner per layer; Compare and Runs open on the study's runs. The workspace is a copy of
the committed smollm2 study (docs/smollm2-study). Slow: the model loads once per app process (a few seconds)."""

from __future__ import annotations

import json
import shutil

import pytest

from app import state
from app.session import APP_MODEL_ENV
from polykv.plan import Plan
from tests.helpers import REPO, button, texts

pytestmark = pytest.mark.slow

STUDY = REPO / "docs" / "smollm2-study"


@pytest.fixture
def smollm2_app(app_env, smollm2_home, monkeypatch):
    """The app's environment with the study's workspace, opening on its own default model (smollm2)."""
    shutil.copytree(STUDY, app_env / "ws")
    monkeypatch.setenv("POLYKV_HOME", str(smollm2_home))
    monkeypatch.delenv(APP_MODEL_ENV)  # the other app tests open on the demo model
    return app_env


def open_with_smollm2(page: str | None = None):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(REPO / "app" / "app.py"), default_timeout=300)
    at.run()  # no model chosen: the app's default
    if page:
        at.switch_page(f"views/{page}.py")
        at.run()
    assert not at.exception, [(e.value, e.stack_trace) for e in at.exception]
    return at


def test_the_app_opens_on_smollm2_with_its_shipped_plan_and_paints_30_layers(smollm2_app):
    at = open_with_smollm2()
    assert "Model: **smollm2** on cpu, 30 layers" in texts(at.caption)
    plan = Plan.from_json(at.session_state[state.PLAN_JSON])
    assert plan.name == "mixed-smollm2" and plan.num_layers == 30
    (figure,) = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    cells = [trace for trace in figure["data"] if trace.get("customdata")]
    assert {layer for trace in cells for layer, *_ in trace["customdata"]} == set(range(30))
    at.session_state[state.DESIGNER_LAYERS] = list(range(30))
    at.radio(key=state.DESIGNER_PHASE).set_value("decode")
    at.button(key="palette_tova").click()
    at.run()
    at.number_input(key=state.PAINT_CAPACITY).set_value(128)
    button(at, "Paint selection").click()
    at.run()
    assert not at.exception and not at.error
    painted = Plan.from_json(at.session_state[state.PLAN_JSON])
    assert [(layer.decode.method, layer.decode.capacity) for layer in painted.layers] == [("tova", 128)] * 30


def test_profiles_compare_and_runs_open_on_the_study(smollm2_app):
    at = open_with_smollm2("profiles")
    assert texts(at.title) == ["Method profiles"] and not at.error
    scopes = {len(json.loads(f.read_text())["scopes"]) for f in STUDY.glob("profiles/*/profile.json")}
    (scopes,) = scopes  # the study profiles the phases it routes (its report's profile and a current one alike)
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(specs) >= scopes
    for spec in specs[:scopes]:  # one decision chart per scope: a row per layer, a winner per layer
        grid, stars = spec["data"][:2]
        assert sorted(set(grid["y"])) == list(range(30)) and len(stars["x"]) == 30
        assert spec["layout"]["height"] >= 30 * 20  # a readable row per layer
    tables = at.dataframe[:scopes]
    assert len(tables) == scopes and all(len(table.value) == 30 for table in tables)
    at.switch_page("views/compare.py")
    at.run()
    assert not at.exception and not at.error and at.get("plotly_chart")
    at.switch_page("views/runs.py")
    at.run()
    assert not at.exception and not at.error

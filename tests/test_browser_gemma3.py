"""The designer on a hybrid model, in a real browser: the app on gemma3 (Gemma 3 270M: 15 local layers with a
512-token window, 3 global) says so in the sidebar, opens on the model's shipped plan, and its plan chart marks
every layer local (L) or global (G) and draws a local layer's window over its bar, and the KV memory chart shows
where the memory is. A screenshot goes to tests/artifacts/designer-gemma3.png."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser import MODEL_WAIT, served_app, settle, shoot, tab

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def app(tmp_path_factory, gemma3_home):
    root = tmp_path_factory.mktemp("browser-gemma3")
    with served_app(root, POLYKV_HOME=str(gemma3_home), POLYKV_APP_MODEL="gemma3") as url:
        yield url


def test_the_designer_marks_each_gemma3_layer_local_or_global(app, browser):
    with tab(browser, {"width": 1280, "height": 800}) as page:
        page.goto(app)
        expect(page.get_by_role("heading", name="Plan designer", level=1)).to_be_visible(timeout=MODEL_WAIT)
        expect(page.locator(".js-plotly-plot")).to_have_count(2, timeout=MODEL_WAIT)  # the plan, its KV memory
        settle(page)
        sidebar = page.get_by_test_id("stSidebar")
        expect(sidebar.get_by_text("18 layers, 15 local (window 512) and 3 global")).to_be_visible()
        chart = page.locator(".js-plotly-plot").first
        expect(chart.get_by_text("mixed-gemma3")).to_be_visible()  # the model's shipped plan
        ticks = chart.locator("g.x2tick text").all_text_contents()  # the capacity panel's layer axis (xaxis2)
        assert [t for t in ticks if t.endswith("G")] == ["5 G", "11 G", "17 G"], ticks
        assert len([t for t in ticks if t.endswith("L")]) == 15, ticks
        expect(chart.get_by_text("local layer: its window (L = local, G = global)")).to_be_visible()
        memory = page.locator(".js-plotly-plot").nth(1)
        expect(memory.get_by_text("KV memory per layer")).to_be_visible()
        # gemma3's KV: 1 KV head of 256 float32 numbers, key and value; FullKV holds 511 tokens in a local layer
        fullkv = (15 * 511 + 3 * 4096) * (2 * 1 * 256 * 4) / 2**20
        expect(memory.get_by_text(f"FullKV: {fullkv:,.1f} MiB")).to_be_visible()
        shoot(page, "designer-gemma3")

"""The Runs page keeps what was entered whatever runs, in a real browser: leave it while a job runs (its progress
polled every 2 s by a fragment) and come back, then reload. A fragment's run counts only the fragment's widgets
as seen, so a page switch right after one used to drop every other entry of the page (seed 9 -> 0, budgets
emptied, the edited settings gone), and `pages.json` then saved the defaults."""

from __future__ import annotations

import json
import re
import time

import pytest
from playwright.sync_api import expect

from tests.browser import MODEL_WAIT, WAIT, go_to, job_header, served_app, settle, tab

pytestmark = pytest.mark.slow

# a fidelity job on the demo model that runs for minutes: still running when we come back (cancelled at the end)
SLOW = {"tasks": ["stories"], "samples_per_task": 400, "prompt_tokens": 200, "continuation": 8, "generate": 8}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser-runs")
    with served_app(root, POLYKV_HOME=str(root / "home"), POLYKV_APP_MODEL="demo") as url:
        yield url


def shows(page, seed: str, budgets: str, settings: dict) -> None:
    """The Runs page shows these entries (waiting for them: a page's first render after a reload draws its
    widgets' defaults for a moment before the session's values arrive)."""
    expect(page.get_by_role("spinbutton", name="Seed")).to_have_value(seed, timeout=WAIT)
    expect(page.get_by_role("textbox", name="Budgets")).to_have_value(budgets, timeout=WAIT)
    expect(page.get_by_role("textbox", name="Suite settings")).to_have_value(json.dumps(settings), timeout=WAIT)


def entries(page) -> tuple[str, str, dict]:
    """(seed, budgets, settings) as the Runs page shows them."""
    seed = page.get_by_role("spinbutton", name="Seed").input_value()
    budgets = page.get_by_role("textbox", name="Budgets").input_value()
    settings = json.loads(page.get_by_role("textbox", name="Suite settings").input_value())
    return seed, budgets, settings


def test_the_runs_page_keeps_its_entries_when_left_during_a_job_and_after_a_reload(app, browser):
    with tab(browser, {"width": 1280, "height": 800}) as page:
        page.goto(app + "/runs")
        expect(page.get_by_role("heading", name="Runs", level=1)).to_be_visible(timeout=MODEL_WAIT)
        settle(page)
        for role, name, value in [
            ("spinbutton", "Seed", "9"),
            ("textbox", "Budgets", "60"),
            ("textbox", "Suite settings", json.dumps(SLOW)),
        ]:
            field = page.get_by_role(role, name=name)
            field.fill(value)
            field.press("Control+Enter" if name == "Suite settings" else "Enter")
            settle(page)
        want = ("9", "60", SLOW)
        assert entries(page) == want
        page.get_by_role("button", name="Launch", exact=True).click()
        expect(page.get_by_text("· running").first).to_be_visible(timeout=WAIT)
        time.sleep(5)  # the job list polls: at least one fragment run before we leave
        go_to(page, "Plan designer")
        expect(page.get_by_role("heading", name="Plan designer", level=1)).to_be_visible(timeout=WAIT)
        time.sleep(3)
        go_to(page, "Runs")
        expect(page.get_by_role("heading", name="Runs", level=1)).to_be_visible(timeout=WAIT)
        settle(page)
        # the job was still running all along (waited for: under load the job list may draw after the heading)
        expect(page.get_by_text("· running").first).to_be_visible(timeout=WAIT)
        shows(page, *want)
        page.reload()  # a new Streamlit session, the same ?session= URL: pages.json brings them back
        expect(page.get_by_role("heading", name="Runs", level=1)).to_be_visible(timeout=WAIT)
        shows(page, *want)
        settle(page)
        assert entries(page) == want  # and they stay
        page.get_by_role("button", name="Cancel").first.click()  # the other tests of this app get the cores back
        expect(page.get_by_text("· cancelled").first).to_be_visible(timeout=WAIT)


TINY_RULER = {"tasks": ["niah_single_1"], "length": 512, "samples_per_task": 2}


def test_heterogeneity_computes_only_when_asked_and_every_launch_says_its_cost_first(app, browser):
    """Issue 41, point 3: opening Heterogeneity computes nothing (no figure, a line saying so) and it states its
    estimate before Measure; the Runs page states the launch's time and memory here before Launch, once the
    model's speed is measured (a button, seconds, once); the finished job shows its estimate beside its time."""
    with tab(browser, {"width": 1280, "height": 800}) as page:
        page.goto(app + "/heterogeneity")
        expect(page.get_by_role("heading", name="Attention heterogeneity", level=1)).to_be_visible(timeout=MODEL_WAIT)
        settle(page)
        expect(page.get_by_text("Nothing is measured until you press Measure")).to_be_visible()
        assert page.locator(".js-plotly-plot").count() == 0
        measure = page.get_by_role("button", name="Measure speed")  # a fresh home: the speed is not measured yet
        expect(measure).to_be_visible(timeout=WAIT)
        measure.click()
        expect(page.get_by_text(re.compile(r"^Estimated here: about .+ on cpu; 8 inputs of 512 tokens"))).to_be_visible(
            timeout=MODEL_WAIT
        )
        assert page.locator(".js-plotly-plot").count() == 0  # measuring the speed measured no heterogeneity

        go_to(page, "Runs")
        expect(page.get_by_role("heading", name="Runs", level=1)).to_be_visible(timeout=WAIT)
        settle(page)
        expect(page.get_by_text(re.compile(r"^Step 1 of 2, the pilot:"))).to_be_visible(timeout=WAIT)
        suite = page.get_by_role("combobox", name="Suite")
        suite.click()
        page.keyboard.type("ruler")
        page.keyboard.press("Enter")
        expect(suite).to_have_value("ruler", timeout=WAIT)
        settle(page)
        settings = page.get_by_role("textbox", name="Suite settings")
        settings.fill(json.dumps(TINY_RULER))
        settings.press("Control+Enter")
        settle(page)
        baselines = page.get_by_test_id("stMultiSelect").filter(has_text="Baselines")
        expect(baselines.locator("[data-tag]").filter(has_text=re.compile(r"^full$"))).to_be_visible()  # pre-selected
        before = page.get_by_text(
            re.compile(r"^Estimated here: about .+ on cpu; 2 samples x 2 plans at up to \d+ tokens")
        )
        expect(before).to_be_visible(timeout=WAIT)
        page.get_by_role("button", name="Launch", exact=True).click()
        expect(page.get_by_text(re.compile(r"^Started \S+-eval-\S+ \(2 runs\)\.$"))).to_be_visible(timeout=WAIT)
        header = page.get_by_test_id("stMarkdownContainer").filter(has_text=job_header("on ruler"))
        expect(header.first).to_have_text(re.compile(r"· finished$"), timeout=MODEL_WAIT)
        settle(page)
        expect(page.get_by_test_id("stProgress").first).to_contain_text(re.compile(r"estimated about .+, took .+"))

        # ---- point 5: the run's answers, beside the gold answer and FullKV's, with agreement explained -----------
        page.get_by_text("A run's answers, beside the gold answer and FullKV's").click()
        settle(page)
        run = page.get_by_role("combobox", name="Run")  # the module's workspace holds the first test's run too
        run.click()
        page.keyboard.type("mixed-demo · ruler")
        page.keyboard.press("Enter")
        settle(page)
        expect(page.get_by_text(re.compile(r"^agreement: 1 when the plan's greedy answer is FullKV's"))).to_be_visible()
        table = page.get_by_test_id("stTable").last
        for column in ("gold", "answer", "FullKV"):
            expect(table.locator("th").filter(has_text=column).first).to_be_visible(timeout=WAIT)
        expect(table.locator("tbody tr")).to_have_count(2)  # the run's 2 samples
        expect(table).to_contain_text("niah_single_1")

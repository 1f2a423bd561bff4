"""The app as a newcomer first meets it, in a real browser: it opens on smollm2 (30 layers); the plan chart and
every paint control fit one 1280x800 window (bounding boxes measured); a paint, an undo and a redo each say
what they did beside the controls, and nothing above the chart moves; a reload keeps the designer's selection
and the Runs page's settings; an impossible RULER setting is refused inline with no job created; and a RULER
run with the settings the Runs page proposes finishes, with its progress, on this CPU.

The server uses the machine's model cache (where `.ci/setup` converted smollm2), a private workspace and plans
folder. The measured boxes go to tests/artifacts/designer_boxes.json, a screenshot to designer-1280x800.png.
"""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from polykv.eval.results.store import Store
from polykv.eval.running.fit import FIRST_RUN_LENGTH, FIRST_RUN_TASKS
from polykv.methods import REGISTRY
from tests.browser import (
    ARTIFACTS,
    MODEL_WAIT,
    WAIT,
    job_header,
    paint_decode_cells,
    selected_layer_tags,
    served_app,
    settle,
    shoot,
    tab,
)
from tests.helpers import fake_run

pytestmark = pytest.mark.slow

WINDOW = {"width": 1280, "height": 800}  # a laptop's browser window
RULER_RUN_WAIT = 480_000  # ms: three RULER samples of smollm2 on two shared cores, with the model's load


@pytest.fixture(scope="module")
def app(tmp_path_factory, smollm2_home):
    """The app on its default model (no POLYKV_APP_MODEL): yields (base URL, tmp root)."""
    root = tmp_path_factory.mktemp("browser-smollm2")
    with served_app(root, POLYKV_HOME=str(smollm2_home), POLYKV_APP_MODEL="") as url:
        yield url, root


@pytest.fixture
def page(browser):
    with tab(browser, WINDOW) as opened:
        yield opened


def in_window(box: dict | None) -> bool:
    return (
        box is not None
        and box["x"] >= 0
        and box["y"] >= 0
        and box["x"] + box["width"] <= WINDOW["width"]
        and (box["y"] + box["height"] <= WINDOW["height"])
    )


def paint_controls(page) -> dict:
    """The chart and each paint control, as the locator a user would aim at."""
    controls = {
        "chart": page.locator(".js-plotly-plot").first,
        "selected layers": page.locator(".st-key-designer_layers"),
        "phase": page.get_by_role("radiogroup", name="Phase"),
        "capacity": page.get_by_label("Capacity (tokens per KV head)"),
        "paint": page.get_by_role("button", name="Paint selection"),
        "undo": page.get_by_role("button", name="Undo"),
        "redo": page.get_by_role("button", name="Redo"),
    }
    for key in page.locator("[class*='st-key-palette_']").evaluate_all(
        "els => els.map(e => [...e.classList].find(c => c.startsWith('st-key-palette_')))"
    ):
        controls[key.removeprefix("st-key-")] = page.locator(f".{key} button").first
    return controls


def test_the_app_opens_on_smollm2_and_paints_in_one_1280x800_view(app, page):
    url, root = app
    page.goto(url)
    expect(page.get_by_role("heading", name="Plan designer", level=1)).to_be_visible(timeout=MODEL_WAIT)
    expect(page.locator(".js-plotly-plot")).to_have_count(1, timeout=MODEL_WAIT)
    settle(page)
    expect(page.get_by_test_id("stSidebar").get_by_text("on cpu, 30 layers")).to_be_visible()
    expect(page.get_by_test_id("stSidebar").get_by_text("smollm2", exact=True)).to_be_visible()

    controls = paint_controls(page)
    # (keep), full and every method of the registry
    assert len([k for k in controls if k.startswith("palette_")]) == 1 + len(REGISTRY)
    boxes = {name: locator.bounding_box() for name, locator in controls.items()}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "designer_boxes.json").write_text(json.dumps({"window": WINDOW, "boxes": boxes}, indent=1))
    outside = {name: box for name, box in boxes.items() if not in_window(box)}
    assert not outside, f"not within the {WINDOW['width']}x{WINDOW['height']} window without scrolling: {outside}"
    chart_top = boxes["chart"]["y"]

    # ---- select on the chart, paint: the message stands beside Paint, in view; the chart does not move --------
    paint_decode_cells(page, 3, 5, "tova", 128)
    message = page.get_by_test_id("stAlertContentSuccess").filter(has_text="Painted tova @128 onto layers 3, 4, 5")
    expect(message).to_be_visible(timeout=WAIT)
    settle(page)
    paint_box, said = page.get_by_role("button", name="Paint selection").bounding_box(), message.bounding_box()
    assert in_window(said), said
    assert 0 <= said["y"] - (paint_box["y"] + paint_box["height"]) <= 40, (paint_box, said)  # right under it
    assert page.locator(".js-plotly-plot").first.bounding_box()["y"] == chart_top
    shoot(page, "designer-1280x800")

    for action, said in [("Undo", "Undid: painted tova@128"), ("Redo", "Redid: painted tova@128")]:
        page.get_by_role("button", name=action).click()
        told = page.get_by_test_id("stAlertContentInfo").filter(has_text=said)
        expect(told).to_be_visible(timeout=WAIT)
        settle(page)
        assert in_window(told.bounding_box())
        assert page.locator(".js-plotly-plot").first.bounding_box()["y"] == chart_top

    # ---- a reload keeps the selection (and its phase) ------------------------------------------------------------
    session_url = page.url
    page.reload()
    expect(page.locator(".js-plotly-plot")).to_have_count(1, timeout=MODEL_WAIT)
    settle(page)
    assert page.url == session_url
    expect(selected_layer_tags(page)).to_have_text(["3", "4", "5"])
    expect(page.get_by_role("radio", name="decode", exact=True)).to_be_checked()


def test_a_ruler_run_with_the_proposed_settings_finishes_and_an_impossible_one_is_refused(app, page):
    url, root = app
    jobs_dir, results = root / "ws" / "jobs", root / "ws" / "results.sqlite"
    page.goto(url + "/runs")
    expect(page.get_by_role("heading", name="Runs", level=1)).to_be_visible(timeout=MODEL_WAIT)
    settle(page)
    suite = page.get_by_role("combobox", name="Suite")  # typed: the page is long, a list of options may not open
    suite.click()
    page.keyboard.type("ruler")
    page.keyboard.press("Enter")
    expect(suite).to_have_value("ruler", timeout=WAIT)
    settle(page)
    settings = page.locator(".st-key-settings_ruler textarea")  # the fidelity one may linger while the page reruns
    expect(settings).to_have_value(re.compile(r'"length": \d+'), timeout=WAIT)  # the proposal, drawn
    proposed = json.loads(settings.input_value())
    assert proposed["length"] == FIRST_RUN_LENGTH and proposed["samples_per_task"] == 1
    assert proposed["tasks"] == list(FIRST_RUN_TASKS)  # each fits smollm2's context at 1,024 tokens
    expect(page.get_by_text(re.compile(r"^These settings start small on a CPU"))).to_be_visible()

    # ---- an impossible length: refused beside the button, no job and no run -----------------------------------
    settings.fill(json.dumps({**proposed, "length": 100000}))
    settings.blur()
    settle(page)
    page.get_by_role("button", name="Launch", exact=True).click()
    refusal = page.get_by_test_id("stAlertContentError").filter(has_text="exceeds the model's context")
    expect(refusal).to_be_visible(timeout=WAIT)
    expect(refusal).to_contain_text("Not launched")
    settle(page)
    assert not (jobs_dir.exists() and list(jobs_dir.glob("*.json"))), "a refused launch created a job"
    assert not results.exists() or Store(results).runs() == []

    # ---- a reload keeps the Runs page's settings, as typed --------------------------------------------------------
    page.reload()
    expect(page.get_by_role("heading", name="Runs", level=1)).to_be_visible(timeout=MODEL_WAIT)
    settle(page)
    expect(page.get_by_role("combobox", name="Suite")).to_have_value("ruler")
    expect(page.get_by_label("Suite settings (JSON)")).to_have_value(re.compile(r'"length": 100000\b'))

    # ---- the proposed settings run to the end, with progress ------------------------------------------------------
    page.get_by_label("Suite settings (JSON)").fill(json.dumps(proposed))
    page.get_by_label("Suite settings (JSON)").blur()
    settle(page)
    page.get_by_role("button", name="Launch", exact=True).click()
    expect(page.get_by_text(re.compile(r"^Started \S+-eval-\S+ \(2 runs\)\.$"))).to_be_visible(
        timeout=WAIT
    )  # and FullKV
    progress = page.get_by_test_id("stProgress").first
    expect(progress).to_contain_text(re.compile(r"\d+% · (\d+ min )?\d+ s elapsed"), timeout=MODEL_WAIT)
    header = page.get_by_test_id("stMarkdownContainer").filter(has_text=job_header("on ruler"))
    expect(header).to_have_text([re.compile(r"· finished$")], timeout=RULER_RUN_WAIT)
    settle(page)
    expect(page.get_by_test_id("stProgress").first).to_contain_text(
        re.compile(r"^100% · (\d+ min )?\d+ s elapsed( · estimated about .+, took .+)? · finished")
    )
    runs = Store(results).runs()
    assert [r.plan_name == "full-both" for r in runs] == [False, True]  # the plan, then FullKV (pre-selected)
    assert all(
        (run.suite, run.status, run.done_samples, run.total_samples)
        == ("ruler", "finished", len(FIRST_RUN_TASKS), len(FIRST_RUN_TASKS))
        for run in runs
    )
    shoot(page, "runs-smollm2-ruler")


FIRST_RUN_WAIT = 600_000  # ms: the pilot (8 prompt passes of 1,024 tokens) or the decisive run, on shared cores


def record_fullkv_ruler(results, scores: dict[str, float]) -> str:
    """A finished FullKV run of RULER at 1,024 tokens (generating) with these task scores, as `polykv eval` leaves
    one in the workspace's results database (fwe at 10%: under the competence rule); returns its id."""
    from polykv.plan import Plan

    plan, scores = Plan.homogeneous("full", None, 30), {**scores, "fwe": 10.0}
    results.parent.mkdir(parents=True, exist_ok=True)
    settings = {"tasks": list(scores), "length": 1024, "samples_per_task": 10, "mode": "generate"}
    fake_run(
        Store(results), "fullkv0ruler1024", {task: {"score": value} for task, value in scores.items()},
        model="smollm2", plan_name=plan.name, plan_json=plan.to_json(), suite="ruler", settings=settings,
    )  # fmt: skip
    return "fullkv0ruler1024"


def test_the_proposed_first_run_states_its_cost_and_what_it_detects_and_compare_gives_the_verdict(app, page):
    """Point 2 of issue 41: the Runs page proposes a pilot (the plan against the best homogeneous plan of its
    scope and budget, answer_nll, tasks where FullKV succeeds), says what it costs here before it starts, then a
    decisive run sized from the pilot with the difference it will detect; Compare states the verdict with its
    test and MDE, and its badge agrees with it."""
    url, root = app
    # FullKV's own RULER run in this workspace says where it succeeds: the first run takes those two tasks (its
    # reasons say so) instead of the five on record, which keeps this test's two runs to minutes on two cores
    fullkv = record_fullkv_ruler(root / "ws" / "results.sqlite", {"niah_single_1": 100.0, "niah_multikey_1": 90.0})
    page.goto(url + "/runs")
    expect(page.get_by_role("heading", name="Runs", level=1)).to_be_visible(timeout=MODEL_WAIT)
    settle(page)
    expect(page.get_by_text(re.compile(r"^Step 1 of 2, the pilot:"))).to_be_visible(timeout=WAIT)
    expect(page.get_by_text(f"at least 20% in run {fullkv}", exact=False).first).to_be_visible()
    expect(page.get_by_text(re.compile(r"on 4 samples of 2 RULER tasks at 1024 tokens")).first).to_be_visible()
    # the pilot's estimate comes first; the Runs form's below it counts 2 plans too (its plan and FullKV, pre-selected)
    estimate = page.get_by_text(re.compile(r"^Estimated here: about .+ on cpu; \d+ samples x 2 plans")).first
    measure = page.get_by_role("button", name="Measure speed").first
    # the estimate, or (a machine whose model cache has no measured speed yet) the button that measures it: wait
    # for either, since the page may still be drawing the launch's block
    expect(estimate.or_(measure).first).to_be_visible(timeout=MODEL_WAIT)
    if not estimate.count():
        measure.click()  # measured once, in seconds
    expect(estimate).to_be_visible(timeout=2 * MODEL_WAIT)
    minutes = page.get_by_label("Time it may take here (minutes)")
    minutes.fill("1")
    minutes.press("Enter")
    settle(page)
    page.get_by_role("button", name="Launch the pilot").click()
    expect(page.get_by_text(re.compile(r"^Started \S+-eval-\S+ \(2 runs\)\.$"))).to_be_visible(timeout=WAIT)
    pilot = page.get_by_test_id("stMarkdownContainer").filter(has_text=job_header("first run (pilot)"))
    expect(pilot.first).to_have_text(re.compile(r"· finished$"), timeout=FIRST_RUN_WAIT)
    settle(page)

    decisive = page.get_by_test_id("stMarkdownContainer").filter(has_text="Step 2 of 2, the decisive run:").first
    expect(decisive).to_be_visible(timeout=WAIT)
    expect(decisive).to_contain_text(re.compile(r"It is expected to detect a difference of \d+\.\d+ nats"))
    expect(page.get_by_text(re.compile(r"^Estimated here: about .+; \d+ samples x 3 plans"))).to_be_visible()
    page.get_by_role("button", name="Launch the decisive run").click()
    expect(page.get_by_text(re.compile(r"^Started \S+-eval-\S+ \(3 runs\)\.$"))).to_be_visible(timeout=WAIT)
    header = page.get_by_test_id("stMarkdownContainer").filter(has_text=job_header("first run (decisive run)"))
    expect(header.first).to_have_text(re.compile(r"· finished$"), timeout=FIRST_RUN_WAIT)
    settle(page)
    expect(page.get_by_test_id("stProgress").first).to_contain_text(re.compile(r"estimated about .+, took "))

    page.goto(url + "/compare")
    expect(page.get_by_role("heading", name="Compare", level=1)).to_be_visible(timeout=MODEL_WAIT)
    settle(page)
    lines = page.get_by_text(
        re.compile(r"minimal detectable difference \(80% power, two-sided 5%\): [\d.]+ over samples")
    )
    expect(lines.first).to_be_visible(timeout=WAIT)  # Compare's caption: the test, its MDE, then the verdict
    expect(lines.first).to_contain_text(
        re.compile(r"verdict: (A better|A worse|no significant difference) \((exact )?sign-flip")
    )
    verdict = re.search(r"verdict: (A better|A worse|no significant difference)", lines.first.inner_text()).group(1)
    badge = {"A better": "A better", "A worse": "B better"}.get(verdict, "no significant difference")
    expect(page.get_by_test_id("stMetricDelta").filter(has_text=badge).first).to_be_visible()
    shoot(page, "first-run-compare-smollm2")  # (makes the artifacts folder)
    (ARTIFACTS / "first_run_verdict.txt").write_text(lines.first.inner_text())  # for the note

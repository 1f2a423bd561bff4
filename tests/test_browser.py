"""The web app in a real browser: design a plan on the chart, save it, evaluate it in the background,
compare the run; and every page renders once the model is loaded (each page's time is recorded, not asserted).

Streamlit serves `app/app.py` in a subprocess (private workspace, plans folder and model cache) and
Playwright drives the system chromium. A screenshot of every page goes to `tests/artifacts/`.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse

import pytest
from playwright.sync_api import expect

from polykv.eval.results.store import Store
from polykv.plan import Phase, Plan
from polykv.plan_edits import choices, painting
from tests.browser import (
    ARTIFACTS,
    JOB_WAIT,
    MODEL_WAIT,
    WAIT,
    alive,
    box_select_decode_cells,
    choose_option,
    click_on,
    go_to,
    job_header,
    job_pids,
    paint_decode_cells,
    palette,
    selected_layer_tags,
    served_app,
    settle,
    shoot,
    tab,
)
from tests.helpers import MIXED, wait_until

# The page tests build on the flow test's finished run and job: one worker runs the module, in order (pytest's
# addopts: --dist loadscope).
# Streamlit scrolls an inner container, so a screenshot holds only the viewport: make it tall.
VIEWPORT = {"width": 1400, "height": 2600}
PAGE_TARGET_S = 5.0  # reported, not asserted
LOCAL = ("127.0.0.1", "localhost")  # the only hosts a page may reach
TINY_SETTINGS = {
    "tasks": ["prose", "stories"],
    "samples_per_task": 1,
    "prompt_tokens": 128,
    "continuation": 8,
    "generate": 8,
}

# (name, URL path, h1 title, plotly charts once drawn, a text the page draws last)
PAGES = [
    ("designer", "/", "Plan designer", 1, "Save, load, compare"),
    ("designer by URL", "/designer", "Plan designer", 1, "Save, load, compare"),
    ("heterogeneity", "/heterogeneity", "Attention heterogeneity", 0, "Nothing is measured until you press Measure"),
    ("profiles", "/profiles", "Method profiles", 0, "No profile of 'demo'"),
    ("runs", "/runs", "Runs", 0, "Runs in the results database"),
    ("compare", "/compare", "Compare", 1, "Two runs, task by task"),
    ("experiments", "/experiments", "Experiments", 1, "Placement control"),
    ("search", "/search", "Plan search", 0, "No profile of this model yet"),
]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """The app on the demo model (a private model cache too): yields (base URL, tmp root)."""
    root = tmp_path_factory.mktemp("browser")
    with served_app(root, POLYKV_HOME=str(root / "home"), POLYKV_APP_MODEL="demo") as url:
        yield url, root


@pytest.fixture
def page(browser):
    with tab(browser, VIEWPORT) as opened:
        yield opened


@pytest.mark.slow
def test_design_save_evaluate_and_compare_a_plan(app, page):
    """In one session: box-select three decode cells on the plan chart (the layer list and the phase
    follow), paint h2o@40 onto them, save the plan to plans/, launch a small fidelity evaluation of it
    on the Runs page and follow it to the end, then compare the finished run on the Compare page."""
    url, root = app
    page.goto(url)
    expect(page.get_by_role("heading", name="Plan designer", level=1)).to_be_visible(timeout=MODEL_WAIT)
    expect(page.locator(".js-plotly-plot")).to_have_count(1, timeout=MODEL_WAIT)
    settle(page)

    # ---- select on the chart (the layer list and the phase follow), paint ------------------------------------
    paint_decode_cells(page, 1, 3, "h2o", 40)
    expect(page.get_by_text("Painted h2o @40 onto layers 1, 2, 3 (decode).")).to_be_visible(timeout=WAIT)
    settle(page)
    painted = painting.paint(Plan.load(MIXED), [1, 2, 3], "decode", "h2o", 40)
    decode_line = painted.summary().lines()[2].strip()
    assert "h2o x4" in decode_line  # h2o was already in layers 2 and 4
    expect(page.get_by_test_id("stText").first).to_contain_text(decode_line)
    shoot(page, "designer")

    # ---- save ---------------------------------------------------------------------------------------------
    name = page.get_by_label("Plan name")
    name.fill("browser-plan")
    name.press("Enter")
    settle(page)
    page.get_by_role("button", name="Save to plans/").click()
    saved = root / "plans" / "demo" / "browser-plan.json"  # beside the model's shipped plans
    expect(page.get_by_text(f"Saved {saved}")).to_be_visible(timeout=WAIT)
    plan = Plan.load(saved)
    assert plan.name == "browser-plan"
    assert [(layer["decode"].method, layer["decode"].capacity) for layer in plan.layers[1:4]] == [("h2o", 40)] * 3
    assert plan.layers == painted.layers  # and nothing else changed
    settle(page)

    # ---- bad uploads are refused on the page and the plan stays ------------------------------------------
    upload = page.get_by_test_id("stFileUploaderDropzoneInput")
    for filename, content, message in [
        ("notes.json", b"these are not the droids", "notes.json: malformed JSON"),
        ("notes.txt", b"not a plan either", "notes.txt: malformed JSON"),  # any file type: said in one line
        (
            "other-model.json",
            Plan.homogeneous("tova", 32, 3).to_json().encode(),
            "other-model.json: this plan does not fit 'demo': layers: the plan has 3 layers but the model has 5",
        ),
    ]:
        upload.set_input_files(files=[{"name": filename, "mimeType": "application/json", "buffer": content}])
        expect(page.get_by_test_id("stAlertContentError").filter(has_text=message)).to_be_visible(timeout=WAIT)
        settle(page)
        expect(page.get_by_test_id("stText").first).to_contain_text(decode_line)  # still the painted plan

    # ---- evaluate it in the background ------------------------------------------------------------------
    go_to(page, "Runs")
    expect(page.get_by_role("heading", name="Evaluate the current plan: browser-plan")).to_be_visible(timeout=WAIT)
    settle(page)
    settings = page.get_by_label("Suite settings (JSON)")
    settings.fill(json.dumps(TINY_SETTINGS))
    settings.press("Control+Enter")
    choose_option(page, "Baselines", "tova")  # beside FullKV, pre-selected as the reference
    page.get_by_role("button", name="Launch", exact=True).click()
    expect(page.get_by_text(re.compile(r"^Started \S+-eval-\S+ \(3 runs\)\.$"))).to_be_visible(timeout=WAIT)
    header = page.get_by_test_id("stMarkdownContainer").filter(has_text=job_header("browser-plan on fidelity"))
    # While the page switches from polling to a full redraw, the old "running" box can briefly stand
    # next to the new one: wait for exactly one, finished.
    expect(header).to_have_text([re.compile(r"· finished$")], timeout=JOB_WAIT)
    settle(page)
    expect(page.get_by_test_id("stProgress").first).to_contain_text(
        re.compile(r"^100% · (\d+ min )?\d+ s elapsed( · estimated about .+, took .+)? · finished")
    )
    expect(page.get_by_role("heading", name="Runs in the results database")).to_have_count(1)
    # Dataframes are drawn on a canvas, over an accessible grid of the same cells.
    cells = page.get_by_test_id("stDataFrame").locator("[role=gridcell]")
    expect(cells).to_have_count(33)  # three runs: 7 columns and 4 fidelity metrics each
    texts = cells.all_inner_texts()
    # the baseline keeps the painted plan's own budget in each phase (37 in prefill, 43 in decode), not one average
    assert [texts[1:6], texts[12:17], texts[23:28]] == [
        ["full-both", "fidelity", "demo", "finished", "2/2"],
        ["tova-both37/43", "fidelity", "demo", "finished", "2/2"],
        ["browser-plan", "fidelity", "demo", "finished", "2/2"],
    ]  # newest first
    runs = Store(root / "ws" / "results.sqlite").runs()
    assert [(r.plan_name, r.suite, r.status) for r in runs] == [
        ("browser-plan", "fidelity", "finished"),
        ("tova-both37/43", "fidelity", "finished"),
        ("full-both", "fidelity", "finished"),
    ]
    baseline = Plan.from_json(runs[1].plan_json).summary().phases
    painted = Plan.from_json(runs[0].plan_json).summary().phases
    assert [round(baseline[p].average_capacity) for p in Phase] == [round(painted[p].average_capacity) for p in Phase]
    assert all(r.done_samples == r.total_samples == 2 for r in runs)
    shoot(page, "runs")

    # ---- compare the plan with its baseline, and the (one-budget) sweep ----------------------------------
    go_to(page, "Compare")
    expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible(timeout=WAIT)  # the page's end
    settle(page)
    expect(page.get_by_text("A wins / ties / losses", exact=True)).to_be_visible()
    expect(page.get_by_text("Sign-flip test", exact=True)).to_be_visible()  # the headline: the sample-level test
    expect(page.get_by_text(re.compile(r"^sample level \(headline\): A - B [+-]\d"))).to_be_visible()  # in full
    expect(page.get_by_text("Interval over tasks")).to_have_count(0)  # with samples, no task interval is offered
    expect(page.get_by_text(re.compile(r"^Starting pair: "))).to_be_visible()  # the route vs its baseline
    charts = page.locator(".js-plotly-plot")
    expect(charts).to_have_count(1)  # per-task differences
    expect(charts.first.locator(".xtick text")).to_have_text(["prose", "stories"])  # SVG text, unlike the tables
    tables = page.get_by_test_id("stDataFrame")
    expect(tables).to_have_count(3)  # per task, leave one task out, every run with its tags
    tasks = tables.first.locator("[role=gridcell]").filter(has_text=re.compile(r"^(prose|stories)$"))
    expect(tasks).to_have_text(["prose", "stories"])
    shoot(page, "compare")

    # ---- the (one-budget) sweep of that job, on the Experiments page ---------------------------------------
    go_to(page, "Experiments")
    expect(page.get_by_role("heading", name="Placement control")).to_be_visible(timeout=WAIT)  # the page's end
    settle(page)
    charts = page.locator(".js-plotly-plot")
    expect(charts).to_have_count(1)  # the budget sweep
    legend = charts.first.locator(".legendtext")
    expect(legend.filter(has_text=re.compile(r"^(tova|route)$"))).to_have_count(2)


@pytest.mark.slow
def test_painting_feels_direct_and_a_reload_keeps_the_edited_plan(app, page):
    """A drag selects a box (no toolbar click) and a shift-drag adds another; decode greys the prefill-only
    methods; a key picks a method; the painted plan, kept as the session's draft, survives a reload of
    the page's URL (which carries the session), and another session starts from the demo plan."""
    url, _ = app
    page.goto(url + "/designer")
    expect(page.locator(".js-plotly-plot")).to_have_count(1, timeout=MODEL_WAIT)
    settle(page)
    assert "session=" in page.url
    tags = selected_layer_tags(page)
    box_select_decode_cells(page, 0, 1)
    expect(tags).to_have_text(["0", "1"], timeout=WAIT)
    settle(page)
    assert page.locator(".js-plotly-plot").first.evaluate("el => el._fullLayout.dragmode") == "select"
    box_select_decode_cells(page, 3, 3, add=True)
    expect(tags).to_have_text(["0", "1", "3"], timeout=WAIT)
    settle(page)
    box_select_decode_cells(page, 4, 4)  # without shift: a new selection
    expect(tags).to_have_text(["4"], timeout=WAIT)
    settle(page)
    box_select_decode_cells(page, 0, 1, add=True)
    expect(tags).to_have_text(["0", "1", "4"], timeout=WAIT)
    settle(page)
    expect(page.get_by_role("radio", name="decode", exact=True)).to_be_checked()
    expect(palette(page, "snapkv")).to_be_disabled()  # prefill only
    expect(palette(page, "d2o")).to_be_enabled()
    page.evaluate("document.activeElement && document.activeElement.blur()")  # shortcuts skip focused inputs
    page.keyboard.press(choices.shortcuts([name for name, _ in choices.palette("decode")])["tova"])
    expect(palette(page, "tova")).to_have_attribute("kind", "primary", timeout=WAIT)
    settle(page)
    capacity = page.get_by_label("Capacity (tokens per KV head)")
    capacity.fill("20")
    capacity.press("Enter")
    settle(page)
    page.get_by_role("button", name="Paint selection").click()
    expect(page.get_by_text("Painted tova @20 onto layers 0, 1, 4 (decode).")).to_be_visible(timeout=WAIT)
    settle(page)
    summary = page.get_by_test_id("stText").first.inner_text()
    assert "tova x4" in summary  # tova was already in layer 3
    session_url = page.url
    page.reload()
    expect(page.locator(".js-plotly-plot")).to_have_count(1, timeout=MODEL_WAIT)
    settle(page)
    assert page.url == session_url
    expect(page.get_by_test_id("stText").first).to_have_text(summary)
    expect(page.get_by_text("Provenance (1 edit)")).to_be_visible()
    page.goto(url + "/designer")  # no session in the URL: a new session, the demo plan
    expect(page.locator(".js-plotly-plot")).to_have_count(1, timeout=MODEL_WAIT)
    settle(page)
    assert page.url != session_url
    expect(page.get_by_test_id("stText").first).to_have_text("\n".join(Plan.load(MIXED).summary().lines()))


@pytest.mark.slow
def test_every_page_renders_by_url_once_the_model_is_loaded(app, page):
    """After one load of `/` (the model loads once per server), each page opened by URL shows its title,
    its last element and its charts, with no script run left. The time each takes is recorded in
    tests/artifacts/page_timings.json (target: under 5 s; a benchmark figure for the notes, never an
    assertion: these machines are shared). Heterogeneity measures on this first visit (cold cache). Runs
    after the test above, so that Compare has a finished run (and a chart) to draw and no job worker takes
    the CPU."""
    url, root = app
    assert any(r.status == "finished" for r in Store(root / "ws" / "results.sqlite").runs()), (
        "no finished run: test_design_save_evaluate_and_compare_a_plan must run first (same module)"
    )
    for pid in job_pids(root / "ws"):
        wait_until(lambda pid=pid: not alive(pid), 300, lambda pid=pid: f"job worker {pid} still running")

    page.goto(url)
    expect(page.get_by_role("heading", name="Plan designer", level=1)).to_be_visible(timeout=MODEL_WAIT)
    expect(page.locator(".js-plotly-plot")).to_have_count(1, timeout=MODEL_WAIT)
    settle(page)

    timings = {}
    for name, path, title, charts, last in PAGES:
        start = time.monotonic()
        page.goto(url + path)
        expect(page.get_by_role("heading", name=title, level=1)).to_be_visible(timeout=WAIT)
        expect(page.get_by_text(last).first).to_be_visible(timeout=WAIT)
        expect(page.locator(".js-plotly-plot")).to_have_count(charts, timeout=WAIT)
        settle(page)
        timings[name] = round(time.monotonic() - start, 2)
        if name == "heterogeneity":  # it measures when asked, not when opened
            page.get_by_role("button", name="Measure", exact=True).click()
            expect(page.get_by_text("Density map: input 0.")).to_be_visible(timeout=WAIT)
            expect(page.locator(".js-plotly-plot")).to_have_count(2, timeout=WAIT)
            settle(page)
        if name in ("heterogeneity", "profiles"):  # the flow test shot the others in their final state
            shoot(page, name)
    print(f"page render times (s): {timings}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "page_timings.json").write_text(json.dumps(timings, indent=1))
    assert list(timings) == [name for name, *_ in PAGES]
    assert urllib.parse.urlsplit(page.url).path == "/" + PAGES[-1][1].strip("/")
    over = {name: seconds for name, seconds in timings.items() if seconds >= PAGE_TARGET_S}
    if over:
        print(f"over the {PAGE_TARGET_S} s target (report it; not a failure): {over}")


@pytest.mark.slow
def test_designer_opens_by_its_own_url_and_the_root_url_leads_to_it(app, page):
    """`/designer` is the designer (not "Page not found"), and `/` opens it under that URL."""
    url, _ = app
    page.goto(url + "/designer")
    expect(page.get_by_role("heading", name="Plan designer", level=1)).to_be_visible(timeout=MODEL_WAIT)
    expect(page.get_by_text("Save, load, compare")).to_be_visible(timeout=WAIT)
    settle(page)
    expect(page.get_by_text("Page not found")).to_have_count(0)
    assert urllib.parse.urlsplit(page.url).path == "/designer"
    page.goto(url)
    expect(page.get_by_role("heading", name="Plan designer", level=1)).to_be_visible(timeout=WAIT)
    expect(page).to_have_url(re.compile(re.escape(url + "/designer") + r"\?session=[0-9a-f]{16}$"), timeout=WAIT)
    settle(page)
    expect(page.get_by_text("Page not found")).to_have_count(0)


@pytest.mark.slow
def test_no_page_makes_a_request_beyond_this_machine(app, page):
    """Every request and websocket of every page (fonts, icons, favicon, scripts) goes to the local server:
    nothing leaves 127.0.0.1, and none is answered with an error (the console's 404s). Inline data: and blob:
    URLs (the emoji favicon) name no host."""
    url, _ = app
    seen: list[str] = []
    errors: list[tuple[int, str]] = []
    page.context.on("request", lambda request: seen.append(request.url))
    page.context.on(
        "response", lambda response: errors.append((response.status, response.url)) if response.status >= 400 else None
    )
    page.on("websocket", lambda socket: seen.append(socket.url))
    for _name, path, title, charts, last in PAGES:
        page.goto(url + path)
        expect(page.get_by_role("heading", name=title, level=1)).to_be_visible(timeout=MODEL_WAIT)
        expect(page.get_by_text(last).first).to_be_visible(timeout=WAIT)
        expect(page.locator(".js-plotly-plot")).to_have_count(charts, timeout=WAIT)
        settle(page)
    page.wait_for_timeout(1000)  # late fetches (the favicon, fonts of the last page)
    assert any(urllib.parse.urlsplit(u).path.startswith("/_stcore/stream") for u in seen)  # the recorder works
    hosts = {u: urllib.parse.urlsplit(u) for u in seen}
    outside = [u for u, parts in hosts.items() if parts.scheme not in ("data", "blob") and parts.hostname not in LOCAL]
    assert not outside, f"requests beyond this machine: {outside}"
    # Opened by a page's URL, Streamlit's client first asks <page>/_stcore/health and host-config (as if the page
    # were a base path), gets 404 and asks /_stcore/... next: the console's 404s (streamlit/streamlit#7074, open),
    # Streamlit's own and harmless. Any other error answer is ours.
    probes = re.compile(r"/[\w-]+/_stcore/(health|host-config)$")
    ours = [(status, u) for status, u in errors if not (status == 404 and probes.search(urllib.parse.urlsplit(u).path))]
    assert not ours, f"requests answered with an error: {ours}"
    assert page.evaluate("document.querySelector(\"link[rel='shortcut icon']\").href").startswith("data:")


def _seed_answered_runs(store: Store) -> dict[str, str]:
    """Two RULER-like runs and FullKV's, of the same settings, whose samples keep what the model answered;
    returns each run's label as the Compare page lists it."""
    from polykv.eval.results.store import SampleRecord

    answers = {  # run -> task -> (prediction, score) of sample 000
        "answers-tova": {"niah_single_1": (" 8094927.", 100.0), "fwe": (" sxttmk, vppicw", 66.67)},
        "answers-h2o": {"niah_single_1": (" 1111111.", 0.0), "fwe": (" sxttmk, axffnj", 66.67)},
        "answers-full": {"niah_single_1": (" 8094927.", 100.0), "fwe": (" sxttmk, vppicw, axffnj", 100.0)},
    }
    gold = {"niah_single_1": ["8094927"], "fwe": ["sxttmk", "vppicw", "axffnj"]}
    labels = {}
    for run_id, by_task in answers.items():
        plan = Plan.homogeneous("full", None, 5) if run_id == "answers-full" else Plan.homogeneous("tova", 8, 5)
        plan = plan.model_copy(update={"name": run_id})
        store.create_run(
            run_id, model="demo", plan_name=run_id, plan_hash="h", plan_json=plan.to_json(), suite="ruler",
            settings={"tasks": ["niah_single_1", "fwe"], "mode": "generate"}, seed=0, total_samples=2, versions={},
        )  # fmt: skip
        for task, (prediction, score) in by_task.items():
            prompt = {"task": task, "sample": "000", "seed": 0, "sha256": "0"}
            store.add_sample(run_id, task, "000", {"score": score}, 0.1, SampleRecord(prediction, gold[task], prompt))
        store.set_task_scores(run_id, {t: {"score": s} for t, (_, s) in by_task.items()}, {t: 1 for t in by_task})
        store.set_status(run_id, "finished")
        labels[run_id] = f"{run_id} · ruler · demo · {run_id[:8]}"
    return labels


@pytest.mark.slow
def test_clicking_a_tasks_bar_on_compare_opens_its_samples_with_the_answers(app, page):
    """On the Compare page, a click on a task's bar in the per-task chart shows that task's samples side by side:
    the gold answer, what run A and run B answered, and FullKV's answer (a FullKV run of the same settings)."""
    url, root = app
    labels = _seed_answered_runs(Store(root / "ws" / "results.sqlite"))
    page.goto(url + "/compare")
    expect(page.get_by_role("heading", name="Compare", level=1)).to_be_visible(timeout=MODEL_WAIT)
    settle(page)
    for box, run_id in (("A", "answers-tova"), ("B", "answers-h2o")):
        # The module's other tests leave runs in this workspace, and a long list of options is virtualized (an
        # option far down is not in the page until scrolled to): type to filter it, as a user would.
        selectbox = page.get_by_test_id("stSelectbox").filter(has=page.get_by_text(box, exact=True)).first
        selectbox.click()
        page.keyboard.type(run_id)
        page.get_by_role("option", name=labels[run_id], exact=True).click()
        settle(page)
    chart = page.locator(".js-plotly-plot").first
    expect(chart.locator(".xtick text")).to_have_text(["fwe", "niah_single_1"], timeout=WAIT)
    bars = chart.locator(".barlayer .trace").first.locator(".point path")  # the per-task bars (not the legend's)
    expect(bars).to_have_count(2)
    click_on(page, bars.nth(1))  # niah_single_1: A found the needle, B did not
    settle(page)
    table = page.get_by_test_id("stTable")
    shoot(page, "compare-samples")
    expect(table).to_contain_text("8094927", timeout=WAIT)  # the gold
    expect(table).to_contain_text("1111111.")  # B's wrong answer
    expect(table.locator("th").filter(has_text=re.compile(r"^FullKV$"))).to_have_count(1)  # its answer
    expect(table.locator("th").filter(has_text="FullKV metrics")).to_have_count(1)  # and its metrics beside it
    shoot(page, "compare-samples")
    fwe = chart.locator(".xtick text").first.bounding_box()  # a tie: its bar has no height; click its column
    area = chart.locator(".nsewdrag").first.bounding_box()
    page.mouse.click(fwe["x"] + fwe["width"] / 2, area["y"] + area["height"] / 2)
    settle(page)
    expect(page.get_by_test_id("stTable")).to_contain_text("sxttmk | vppicw | axffnj", timeout=WAIT)


def test_the_allocation_picker_draws_a_rules_capacities_before_applying_them(app, page):
    """'Split by a rule' on the designer: the pyramid's capacities are drawn in the popover before anything changes,
    Apply gives the plan's methods that split, and the summary says the new totals."""
    url, _ = app
    page.goto(url + "/designer")
    expect(page.locator(".js-plotly-plot")).to_have_count(1, timeout=MODEL_WAIT)
    settle(page)
    before = page.get_by_test_id("stText").first.inner_text()
    page.get_by_role("button", name="Split by a rule").click()
    page.get_by_text("pyramid", exact=True).click()
    settle(page)
    budget = page.get_by_label("Budget of the split (average capacity per layer)")
    budget.fill("40")
    budget.press("Enter")  # no form here: Enter applies nothing, it only redraws the preview
    settle(page)
    expect(page.get_by_text("Capacity per layer (layer 0 first) that the rule gives")).to_be_visible(timeout=WAIT)
    expect(page.locator("[data-testid='stVegaLiteChart']")).to_have_count(1, timeout=WAIT)
    assert page.get_by_test_id("stText").first.inner_text() == before  # drawn, not applied
    page.get_by_role("button", name="Apply the rule").click()
    expect(page.get_by_text("Split by the pyramid rule at a budget of 40")).to_be_visible(timeout=WAIT)
    settle(page)
    summary = page.get_by_test_id("stText").first.inner_text()
    assert "prefill total capacity B=200, average b=40" in summary and summary != before
    shoot(page, "designer-split-by-rule")
    # the head rule beside it: Ada-KV's split of each layer's budget over its KV heads, applied in one click
    if not page.get_by_text("KV heads").is_visible():
        page.get_by_role("button", name="Split by a rule").click()
    page.get_by_text("adakv", exact=True).click()
    settle(page)  # the last apply's message leaves as the page reruns, and the popover with it
    if not page.get_by_role("button", name="Apply to the KV heads").is_visible():
        page.get_by_role("button", name="Split by a rule").click()
    page.get_by_role("button", name="Apply to the KV heads").click()
    expect(page.get_by_text("KV heads: adakv.")).to_be_visible(timeout=WAIT)
    settle(page)
    assert "heads adakv" in page.get_by_test_id("stText").first.inner_text()


def test_enter_in_a_number_field_launches_nothing_on_profiles_and_heterogeneity(app, page):
    """The launch forms take Enter as typing, not as a press of their first button (issue 56: Enter started two
    profile jobs and a measurement)."""
    url, root = app
    before = sorted(p.name for p in (root / "ws" / "jobs").glob("*.json"))

    def enter_in(path: str, label: str) -> None:
        page.goto(url + path)
        field = page.get_by_label(label)
        expect(field).to_be_visible(timeout=MODEL_WAIT)
        settle(page)
        field.fill("2")
        field.press("Enter")
        settle(page)

    enter_in("/profiles", "Sequences")
    time.sleep(2)
    assert sorted(p.name for p in (root / "ws" / "jobs").glob("*.json")) == before  # no profile job
    expect(page.get_by_text("Started")).to_have_count(0)
    enter_in("/heterogeneity", "Inputs")
    expect(page.get_by_text("Nothing is measured until you press Measure")).to_be_visible(timeout=WAIT)

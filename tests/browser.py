"""What the browser tests share: the app served in a subprocess on a free local port, and the moves a user
makes on its pages (settle after a rerun, drag a box on the plan chart, pick a palette method, switch page)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from tests.helpers import REPO, wait_until

ARTIFACTS = REPO / "tests" / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")
WAIT = 60_000  # ms for one rerun; CI machines have two slow cores
MODEL_WAIT = 120_000  # the first page load imports and loads the model
OPEN_WAIT = 15_000  # ms for an opened dropdown's options to show
JOB_WAIT = 180_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has finished
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def job_pids(workspace: Path) -> list[int]:
    """The worker processes of the jobs the app started in `workspace`."""
    pids = []
    for spec in (workspace / "jobs").glob("*.json"):
        if not spec.name.endswith(".state.json") and not spec.name.startswith("."):
            pid = json.loads(spec.read_text()).get("pid")
            if pid:
                pids.append(int(pid))
    return pids


@contextmanager
def tab(browser, viewport: dict) -> Iterator:
    """A fresh browser context (no cookies, no session) and its page, of `viewport` size."""
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    page.set_default_timeout(WAIT)
    try:
        yield page
    finally:
        context.close()


@contextmanager
def served_app(root: Path, **env: str) -> Iterator[str]:
    """The app served on a free local port with a private workspace and plans folder under `root` (and `env`
    added to the environment): yields its base URL. Afterwards stops the server and any job worker still
    running (workers run in their own sessions, so they outlive the server)."""
    env = {
        **os.environ,
        "POLYKV_WORKSPACE": str(root / "ws"),
        "POLYKV_PLANS": str(root / "plans"),
        "HF_HUB_OFFLINE": "1",
        **env,
    }
    port = _free_port()
    log_path = root / "server.log"
    log = open(log_path, "wb")  # noqa: SIM115 - the server writes to it until the end
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app/app.py", "--server.headless", "true",
         "--server.address", "127.0.0.1", "--server.port", str(port), "--browser.gatherUsageStats", "false"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        # Streamlit exits if the port got taken meanwhile: never test someone else's server.
        assert server.poll() is None, f"streamlit exited:\n{log_path.read_text()}"
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as answer:
                return answer.read() == b"ok"
        except OSError:
            return False

    try:
        wait_until(healthy, 300, lambda: f"streamlit did not come up:\n{log_path.read_text()}")
        yield url
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        log.close()
        for pid in job_pids(root / "ws"):
            if alive(pid):
                try:
                    os.killpg(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass


def job_header(title_part: str) -> re.Pattern:
    """A job list's header line (`<title> · <job id> · <status>`) of a job whose title holds `title_part`, not the
    progress bar under a launch button, whose text holds the title too."""
    return re.compile(re.escape(title_part) + r".* · \d{8}-\d{6}-eval-\w+ · ")


def settle(page, quiet_ms: int = 300) -> None:
    """Wait until no script run is in progress, and none has started for `quiet_ms`. The status widget shows
    only while a run is in progress, after a short delay, and the old run's elements stay, marked stale, until
    the new run has replaced them; a rerun an action asked for may not have begun when this is called, so the
    page counts as settled only once it has looked idle twice, `quiet_ms` apart (a duplicate widget of a
    half-done rerun otherwise trips Playwright's strict mode)."""
    idle_before = False
    while True:
        expect(page.get_by_test_id("stStatusWidget")).to_have_count(0, timeout=WAIT)
        expect(page.locator("[data-stale=true]")).to_have_count(0, timeout=WAIT)
        if idle_before:
            return
        page.wait_for_timeout(quiet_ms)
        idle_before = (
            page.get_by_test_id("stStatusWidget").count() == 0 and page.locator("[data-stale=true]").count() == 0
        )


def shoot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def box_select_decode_cells(page, first: int, last: int, add: bool = False) -> None:
    """Drag a box over the decode cells of layers first..last in the plan chart's strip (top subplot),
    holding shift when `add`. No toolbar click: box select is the chart's drag mode."""
    chart = page.locator(".js-plotly-plot").first
    # Pixels from the axes plotly actually drew, not from ranges assumed here.
    area = page.locator(".js-plotly-plot .nsewdrag").first.bounding_box()
    xr = chart.evaluate("el => el._fullLayout.xaxis.range")
    yr = chart.evaluate("el => el._fullLayout.yaxis.range")
    row = chart.evaluate("el => el._fullLayout.yaxis.categoryarray").index("decode")

    def px(x):
        return area["x"] + (x - xr[0]) / (xr[1] - xr[0]) * area["width"]

    def py(y):
        return area["y"] + (yr[1] - y) / (yr[1] - yr[0]) * area["height"]

    top, bottom = py(row + 0.3), py(row - 0.3)  # the decode row only, not the prefill one
    if add:
        page.keyboard.down("Shift")
    page.mouse.move(px(first - 0.5), top)
    page.mouse.down()
    page.mouse.move(px((first + last) / 2), (top + bottom) / 2, steps=5)
    page.mouse.move(px(last + 0.5), bottom, steps=5)
    page.mouse.up()
    if add:
        page.keyboard.up("Shift")


def selected_layer_tags(page):
    """The tags of the designer's layer list (one per selected layer)."""
    return page.locator(".st-key-designer_layers [data-testid=stMultiSelectTagsContainer] [data-tag]")


def paint_decode_cells(page, first: int, last: int, method: str, capacity: int) -> None:
    """Drag over the decode cells of layers first..last (the layer list and the phase follow), choose `method`
    in the palette and `capacity`, and press Paint selection."""
    box_select_decode_cells(page, first, last)
    expect(selected_layer_tags(page)).to_have_text([str(i) for i in range(first, last + 1)], timeout=WAIT)
    expect(page.get_by_role("radio", name="decode", exact=True)).to_be_checked()
    settle(page)
    palette(page, method).click()
    settle(page)
    field = page.get_by_label("Capacity (tokens per KV head)")
    field.fill(str(capacity))
    field.press("Enter")
    settle(page)
    page.get_by_role("button", name="Paint selection").click()


def choose_option(page, label: str, option: str) -> None:
    """Add `option` to the multiselect labelled `label` and wait until its tag shows. A click that lands while
    the page reruns (a text field's blur starts one) can be lost with the dropdown, so a dropdown whose option
    does not show, or a missing tag, is tried again (three tries)."""
    select = page.get_by_test_id("stMultiSelect").filter(has_text=label)
    tag = select.locator("[data-tag]").filter(has_text=re.compile(f"^{re.escape(option)}$"))
    for _ in range(3):
        settle(page)
        select.click()
        choice = page.get_by_role("option", name=option, exact=True)
        try:
            choice.click(timeout=OPEN_WAIT)
        except PlaywrightTimeout:  # the dropdown closed under a rerun before the option showed: open it again
            page.keyboard.press("Escape")
            continue
        page.keyboard.press("Escape")
        settle(page)
        if tag.count():
            return
    expect(tag).to_have_count(1, timeout=WAIT)


def palette(page, method: str):
    """The paint palette's button for `method`."""
    return page.locator(f".st-key-palette_{method} button").first  # a disabled one with help has two


def go_to(page, title: str) -> None:
    """Switch page in the sidebar, which keeps the session (and the plan being designed)."""
    page.get_by_test_id("stSidebarNav").get_by_role("link", name=title).click()


def click_on(page, element) -> None:
    """A click where the element is drawn (plotly takes clicks through its drag layer, above the bars)."""
    box = element.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)

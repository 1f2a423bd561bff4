"""The README's screenshots, from a real run: a demo-model profile, a factorial experiment launched as a
background job, then the designer, Profiles and Experiments pages in the system chromium.

    .venv/bin/python benchmarks/screenshots.py [--out app/assets]

Everything happens in a temporary workspace (a few minutes on a laptop CPU); nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# Debian's chromium, headless, offline and sandbox-free (as tests/test_browser.py launches it too).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SETTINGS = {"tasks": ["prose", "stories"], "samples_per_task": 2, "prompt_tokens": 128, "continuation": 8}


def prepare(workspace: Path) -> None:
    """A profile of the demo model and a finished factorial on it, in `workspace`."""
    from polykv import jobs
    from polykv.jobs.experiment import launch_job
    from polykv.models import load_model
    from polykv.profile.build import build_profile
    from polykv.profile.corpus import CorpusSpec

    model, tokenizer = load_model("demo")
    profile = build_profile(
        "demo", model, tokenizer, workspace / "profiles", CorpusSpec(num_sequences=4, max_tokens=256)
    )
    job = launch_job(
        workspace, "demo", "cpu", "factorial", profile=profile.key, scope="decode", budget=profile.meta.b_cal,
        baseline="tova", allocation="entropy", settings=SETTINGS, metric="kl",
    )  # fmt: skip
    jobs.start(job, workspace).wait(timeout=1800)
    status = jobs.state(job, workspace).status
    if status != "finished":
        raise SystemExit(f"the factorial did not finish ({status}):\n{jobs.log_tail(job, workspace)}")


def serve(workspace: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "POLYKV_WORKSPACE": str(workspace), "POLYKV_PLANS": str(workspace / "plans")}
    env["POLYKV_APP_MODEL"] = "demo"  # the demo profile and factorial made above
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app/app.py", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    for _ in range(240):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as answer:
                if answer.read() == b"ok":
                    return server
        except OSError:
            time.sleep(0.5)
    raise SystemExit("streamlit did not come up")


def shoot(port: int, out: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1500})
        page.set_default_timeout(180_000)
        expect.set_options(timeout=180_000)  # the model loads on the first page

        def settle() -> None:
            expect(page.get_by_test_id("stStatusWidget")).to_have_count(0)
            expect(page.locator("[data-stale=true]")).to_have_count(0)
            page.wait_for_timeout(800)  # plotly's transitions

        url = f"http://127.0.0.1:{port}"
        page.goto(url + "/designer")
        expect(page.locator(".js-plotly-plot")).to_have_count(1)
        settle()
        page.screenshot(path=str(out / "plan-designer.png"))
        session = page.url.split("?", 1)[1]
        for name, path, last, top in [
            ("profiles", "/profiles", "attention entropy per layer", "Method profiles"),
            ("experiments", "/experiments", "Primary: routed-uniform", "Experiment report"),
        ]:
            page.goto(f"{url}{path}?{session}")
            expect(page.get_by_text(last).first).to_be_attached()
            settle()
            page.get_by_text(top, exact=True).first.evaluate("el => el.scrollIntoView()")  # the part worth seeing
            page.wait_for_timeout(500)
            page.screenshot(path=str(out / f"{name}.png"))
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "app" / "assets")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp) / "ws"
        prepare(workspace)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = serve(workspace, port)
        try:
            shoot(port, args.out)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    print(f"screenshots in {args.out}")


if __name__ == "__main__":
    main()

"""Shared fixtures: tiny random-weight models of every supported family (mechanics tests), the demo
model, the CLI run in-process, the app's environment, a job workspace, and the stopping of every
process a test leaves running. Plain helpers are in tests/helpers.py."""

from __future__ import annotations

import os

# One intra-op thread, in this process and (through the environment, set before torch loads) in every
# process a test starts: the CLI, job workers, the app server. The models here are tiny, and on a small
# machine that other work shares, two spinning OpenMP threads per process cost ten times over: measured,
# tests/test_profile.py alone took 77 s with two threads and 7 s with one, beside another test run.
# Set OMP_NUM_THREADS to choose otherwise.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The app opens on smollm2; its tests (AppTest, the served app) run on the 5-layer demo model, which loads
# at once. The tests of the app's own default model (tests/test_app_smollm2.py) take this away.
os.environ["POLYKV_APP_MODEL"] = "demo"

import sys  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.helpers import (  # noqa: E402
    FAMILIES,
    CliResult,
    LeftoverProcessWarning,
    descendants,
    started_since,
    stop_processes,
    tiny_model,
)

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]) if os.environ["OMP_NUM_THREADS"].isdigit() else 1)


# The modules that take longest (seconds of test time in a CI run on this 2-core machine, --durations=0), run first.
# `--dist loadscope` gives each module to the next free worker in collection order (pyproject.toml turns off
# xdist's own order, by number of tests), so a long module collected late is the whole run's tail: the browser's
# smollm2 module (316 s) went last and the run took 904 s for 1,593 s of tests.
LONGEST_FIRST = (
    "test_browser_smollm2",  # 316 s
    "test_smollm2",  # 150
    "test_gemma3",  # 149
    "test_browser",  # 136
    "test_hostile_inputs",  # 107
    "test_app",  # 69
    "test_app_experiments",  # 59
    "test_eval",  # 44
    "test_backends",  # 44
    "test_browser_runs",  # 40
    "test_jobs",  # 39
    "test_search_parallel",  # 36
)


def pytest_collection_modifyitems(items):
    """The modules of `LONGEST_FIRST` first, in its order; each module's tests keep theirs (a stable sort)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


@pytest.fixture(params=sorted(FAMILIES))
def family_model(request):
    return tiny_model(request.param)


@pytest.fixture(scope="session")
def small_profile(tmp_path_factory, demo_model):
    """A small profile of the demo model (both phases; 2 sequences of 128 tokens), built once per session;
    a test copies it into its own workspace (`tests.helpers.with_profile`)."""
    from polykv.profile.build import build_profile
    from polykv.profile.corpus import CorpusSpec

    model, tokenizer = demo_model
    root = tmp_path_factory.mktemp("small-profile") / "profiles"
    return build_profile("demo", model, tokenizer, root, CorpusSpec(num_sequences=2, max_tokens=128))


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory):
    """The embedded demo model (stories260K), imported into a private POLYKV_HOME."""
    from polykv.models import load_model

    patch = pytest.MonkeyPatch()
    patch.setenv("POLYKV_HOME", str(tmp_path_factory.mktemp("polykv-home")))
    yield load_model("demo")
    patch.undo()


# Where the user's models are cached, read before any test points POLYKV_HOME elsewhere: the converted
# smollm2 (538 MB, about 40 s to convert) is made once per machine, not once per test session.
from polykv.models import polykv_home  # noqa: E402

USER_HOME = polykv_home()


@pytest.fixture(scope="session")
def smollm2_home():
    """The POLYKV_HOME holding the converted smollm2 (converted first if it is not there)."""
    from polykv.models.gguf import gguf_model_dir, smollm2_gguf_path

    gguf_model_dir(smollm2_gguf_path(), USER_HOME)
    return USER_HOME


@pytest.fixture(scope="session")
def smollm2(smollm2_home):
    """SmolLM2-135M-Instruct (the embedded `smollm2`), loaded once per test session."""
    from polykv.models import load_model
    from polykv.models.gguf import gguf_model_dir, smollm2_gguf_path

    return load_model(str(gguf_model_dir(smollm2_gguf_path(), smollm2_home)))


@pytest.fixture
def two_threads():
    """Both cores for a real model's test when it runs alone. Under pytest-xdist (`-n auto`: one worker per core)
    it keeps one thread: a second thread there competes with the other worker for its core, and on this 2-core
    machine smollm2's every-method test took 73 s with two threads against 39 s with one while the other core was
    busy (37 s and 33 s on an idle machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def gemma3_home():
    """The POLYKV_HOME holding the assembled and converted gemma3 (made first if it is not there)."""
    from polykv.models.gemma3 import check_sha256, gemma3_gguf_path
    from polykv.models.gguf import gguf_model_dir

    gguf_model_dir(gemma3_gguf_path(USER_HOME), USER_HOME, verify=check_sha256)
    return USER_HOME


@pytest.fixture(scope="session")
def gemma3(gemma3_home):
    """Gemma 3 270M (the embedded `gemma3`: 18 layers, 15 of them local with a 512-token window), loaded once
    per test session."""
    from polykv.models import load_model
    from polykv.models.gemma3 import check_sha256, gemma3_gguf_path
    from polykv.models.gguf import gguf_model_dir

    return load_model(str(gguf_model_dir(gemma3_gguf_path(gemma3_home), gemma3_home, verify=check_sha256)))


@pytest.fixture
def llama():
    return tiny_model("llama")


@pytest.fixture
def polykv(tmp_path, monkeypatch, capsys):
    """Run the CLI's entry point in-process (same code path as the console script) and capture it:
    `polykv("plan", "show", path)` -> CliResult. POLYKV_HOME is private to the test."""
    from polykv.cli import main

    monkeypatch.setenv("POLYKV_HOME", str(tmp_path / "home"))

    def run(*args: str) -> CliResult:
        monkeypatch.setattr(sys, "argv", ["polykv", *args])
        with pytest.raises(SystemExit) as exit_info:
            main()
        out, err = capsys.readouterr()
        code = exit_info.value.code
        return CliResult(code if isinstance(code, int) else (0 if code is None else 1), out, err)

    return run


@pytest.fixture
def app_env(tmp_path, monkeypatch, demo_model):  # demo_model: the demo checkpoint is imported once per session
    """A private workspace (tmp_path/ws, not created) and plans folder (tmp_path/plans) for the app."""
    monkeypatch.setenv("POLYKV_WORKSPACE", str(tmp_path / "ws"))
    monkeypatch.setenv("POLYKV_PLANS", str(tmp_path / "plans"))
    monkeypatch.delenv("POLYKV_DEBUG", raising=False)
    (tmp_path / "plans").mkdir()
    return tmp_path


@pytest.fixture
def workspace(tmp_path, demo_model):  # demo_model: the session's POLYKV_HOME holds the imported demo model
    """A job workspace (not created yet)."""
    return tmp_path / "ws"


# ---- no test leaves a process running ---------------------------------------------------------------
_PROC = Path("/proc/self/stat").is_file()


@pytest.fixture(autouse=True)
def _stop_leftover_processes(request):
    """Stop whatever the test started and left running, and say so.

    On Linux: every live process the test started, directly or through processes it started (parent
    chains in /proc; detached workers, in their own session, are still children of the process that
    started them). Processes of module- and session-scoped fixtures (a server, a browser) are set up
    before this fixture, so neither they nor what they start count. Elsewhere: the job workers
    `polykv.jobs` started. Each leftover gets a moment to end by itself, then SIGTERM, then SIGKILL
    (see `helpers.stop_processes`), and the test gets a LeftoverProcessWarning naming them.
    """
    before = descendants() if _PROC else {}
    yield
    if _PROC:
        stopped = stop_processes(started_since(before))
    else:
        jobs = sys.modules.get("polykv.jobs")
        children = [p for p in (jobs._children.values() if jobs else []) if p.poll() is None]
        stopped = {p.pid: " ".join(map(str, p.args)) for p in children}
        for process in children:
            process.terminate()
            try:
                process.wait(timeout=5)
            except Exception:  # noqa: BLE001 - whatever it is, it must go
                process.kill()
    if stopped:
        listed = "; ".join(f"pid {pid}: {cmd}" for pid, cmd in stopped.items())
        warnings.warn(
            LeftoverProcessWarning(f"{request.node.nodeid} left {len(stopped)} process(es) running, stopped: {listed}"),
            stacklevel=1,
        )


@pytest.fixture(scope="module")
def browser():
    """The system chromium for the browser tests (never a downloaded one); a missing browser fails the test,
    it does not skip."""
    from playwright.sync_api import sync_playwright

    from benchmarks.screenshots import CHROMIUM_ARGS  # one list of the flags this machine's chromium needs
    from tests.browser import CHROMIUM

    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} not found: the browser tests need the Debian 'chromium' package")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()

"""The results database is safe to read: a read-only store changes nothing and creates nothing in a
read-only workspace (for the CLI and the app; in a writable one only SQLite's empty sidecars, which the
next writer removes), a damaged, foreign or newer database is one line of error, a FIFO or a device in
its place is refused before SQLite opens it (by readers and writers alike), a run whose worker was killed
reads as "stopped" and resumes, and a version-1 database is read as it is and migrated when opened for
writing.

A read-only workspace must be read-only for real. As root, file permissions do not bind, so the CLI and
the app run in a child process without root's power over files: as user 65534 where that user can run
this checkout's Python, else as root with every capability dropped (then the owner's permission bits
bind even for root). Where neither works, they run as they are, and the test checks that every
connection is a `mode=ro` URI and that the workspace is byte for byte unchanged (SQLite's shared-memory
sidecars aside, which must then hold no data).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import shutil
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from polykv import jobs
from polykv.errors import StoreError
from polykv.eval.results.run_workers import Worker, process_start_time
from polykv.eval.results.store import SCHEMA_VERSION, SampleRecord, Store
from polykv.eval.running.suite_runner import run_suite
from polykv.eval.running.unit import Unit
from polykv.eval.suites.fidelity import FidelitySettings
from polykv.plan import Plan
from tests.helpers import APP, assert_one_line_error, fake_run, open_app, slow_after

TINY = FidelitySettings(tasks=("prose",), samples_per_task=3, prompt_tokens=48, continuation=2, generate=2)
SIDECARS = ("results.sqlite-wal", "results.sqlite-shm")

# The schema written before versions were recorded (user_version 0): "version 1".
V1_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, model TEXT NOT NULL, plan_name TEXT NOT NULL, plan_hash TEXT NOT NULL,
    plan_json TEXT NOT NULL, suite TEXT NOT NULL, settings TEXT NOT NULL, seed INTEGER NOT NULL,
    status TEXT NOT NULL, total_samples INTEGER NOT NULL, versions TEXT NOT NULL, created TEXT NOT NULL,
    finished TEXT, error TEXT
);
CREATE TABLE IF NOT EXISTS samples (
    run_id TEXT NOT NULL REFERENCES runs(id), task TEXT NOT NULL, sample TEXT NOT NULL, metrics TEXT NOT NULL,
    seconds REAL NOT NULL, created TEXT NOT NULL, PRIMARY KEY (run_id, task, sample)
);
CREATE TABLE IF NOT EXISTS task_scores (
    run_id TEXT NOT NULL REFERENCES runs(id), task TEXT NOT NULL, metric TEXT NOT NULL, value REAL NOT NULL,
    samples INTEGER NOT NULL, PRIMARY KEY (run_id, task, metric)
);
"""


# ---- snapshots of a folder ------------------------------------------------------------------------------
def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root` (itself included): kind, mode, size, mtime and, for files, a digest."""
    out = {}
    for path in [root, *sorted(root.rglob("*"))]:
        info = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(info.st_mode) else None
        out[str(path.relative_to(root))] = (
            stat.S_IFMT(info.st_mode),
            stat.S_IMODE(info.st_mode),
            info.st_size,
            info.st_mtime_ns,
            digest,
        )
    return out


def assert_unchanged(before: dict[str, tuple], root: Path, strict: bool = True) -> None:
    """`root` as it was. Not strict (the reader could write, so SQLite may have made its shared-memory
    sidecars): those may appear, with an empty write-ahead log, but nothing else may differ."""
    after = snapshot(root)
    if not strict:
        for name in list(after):
            if Path(name).name in SIDECARS and name not in before:
                if name.endswith("-wal"):
                    assert after[name][2] == 0, "a read-only reader wrote to the write-ahead log"
                del after[name]
        if "." in after and "." in before and set(after) == set(before):  # the folder's mtime moved with them
            after["."] = before["."]
    assert after == before


def make_readonly(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):
        path.chmod(0o444 if path.is_file() else 0o555)
    root.chmod(0o555)


def make_writable(root: Path) -> None:
    root.chmod(0o755)
    for path in root.rglob("*"):
        path.chmod(0o644 if path.is_file() else 0o755)


# ---- running without root's power over files ----------------------------------------------------------------
# Drop every capability from the bounding set, then exec: a root process exec'd after that has none, so
# the permission bits of files bind for it (as for their owner).
_DROP_CAPABILITIES = (
    "import ctypes, os, sys\n"
    "prctl = ctypes.CDLL(None, use_errno=True).prctl\n"
    "for cap in range(64):\n"
    "    prctl(24, cap, 0, 0, 0)\n"  # PR_CAPBSET_DROP
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)
_PROBE = (
    "import sys, polykv.cli\n"
    "try:\n"
    "    open(sys.argv[1] + '/probe', 'w')\n"
    "except PermissionError:\n"
    "    print('read-only')\n"
)


@dataclass
class Sandbox:
    """How to run a child process for which a chmod'ed workspace is read-only for real."""

    kind: str  # "user" (not root), "nobody" (as user 65534), "nocaps" (root without capabilities), "none"
    prefix: list[str] = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)

    @property
    def real(self) -> bool:
        return self.kind != "none"

    def run(self, args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.prefix, *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **self.kwargs,
        )

    def own(self, path: Path) -> None:
        """Make `path` (a folder the child writes in: its home) the child's."""
        if self.kind == "nobody":
            os.chown(path, 65534, 65534)


@functools.cache
def sandbox() -> Sandbox:
    if os.geteuid() != 0:
        return Sandbox("user")
    candidates = [
        Sandbox("nobody", kwargs={"user": 65534, "group": 65534, "extra_groups": []}),
        Sandbox("nocaps", prefix=[sys.executable, "-c", _DROP_CAPABILITIES]),
    ]
    probe_root = Path(tempfile.mkdtemp(prefix="polykv-probe-"))
    try:
        probe_root.chmod(0o755)
        locked = probe_root / "locked"
        locked.mkdir(mode=0o555)
        locked.chmod(0o555)
        env = {**os.environ, "HOME": str(probe_root), "PYTHONDONTWRITEBYTECODE": "1"}
        for candidate in candidates:
            try:
                result = candidate.run([sys.executable, "-c", _PROBE, str(locked)], probe_root, env, timeout=120)
            except (OSError, subprocess.SubprocessError):
                continue
            if result.returncode == 0 and result.stdout.strip() == "read-only":
                return candidate
        return Sandbox("none")
    finally:
        make_writable(probe_root)
        shutil.rmtree(probe_root, ignore_errors=True)


# ---- a workspace with runs and a job -----------------------------------------------------------------------
@dataclass
class Workspace:
    root: Path  # a folder the sandboxed child can traverse
    path: Path  # the workspace (read-only once built)
    home: Path  # the child's HOME and POLYKV_HOME (writable)
    job: jobs.Job
    run_a: str
    run_b: str

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HOME": str(self.home),
            "POLYKV_HOME": str(self.home / "polykv"),
            "PYTHONDONTWRITEBYTECODE": "1",
            "HF_HUB_OFFLINE": "1",
            "POLYKV_WORKSPACE": str(self.path),
            "POLYKV_PLANS": str(self.home / "plans"),
        }


@pytest.fixture
def readonly_workspace():
    box = sandbox()
    root = Path(tempfile.mkdtemp(prefix="polykv-readonly-"))
    root.chmod(0o755)
    path, home = root / "ws", root / "home"
    home.mkdir()
    (home / "plans").mkdir()
    for folder in (home, home / "plans"):
        box.own(folder)
    units = [
        ({"series": "route", "budget": 24}, Unit.of("demo", Plan.homogeneous("tova", 24, 5), "fidelity", TINY)),
        ({"series": "h2o", "budget": 24}, Unit.of("demo", Plan.homogeneous("h2o", 24, 5), "fidelity", TINY)),
    ]
    job = jobs.eval_job(units, "two plans")
    jobs.save_job(job, path)
    store = Store(path / "results.sqlite")
    run_a, run_b = (r.run_id for r in job.runs)
    fake_run(store, run_a, {"t1": {"kl": 0.1}, "t2": {"kl": 0.2}, "t3": {"kl": 0.3}}, plan_name="tova-plan")
    fake_run(store, run_b, {"t1": {"kl": 0.2}, "t2": {"kl": 0.1}, "t3": {"kl": 0.5}}, plan_name="h2o-plan")
    assert sorted(p.name for p in path.iterdir()) == ["jobs", "results.sqlite"]  # WAL folded in on close
    make_readonly(path)
    try:
        yield Workspace(root, path, home, job, run_a, run_b)
    finally:
        make_writable(root)
        shutil.rmtree(root, ignore_errors=True)


def cli(ws: Workspace, *args: str) -> subprocess.CompletedProcess:
    return sandbox().run([sys.executable, "-m", "polykv.cli", *args], ws.root, ws.env())


# ---- (a) a missing database ---------------------------------------------------------------------------------
def test_reading_a_missing_database_creates_nothing(tmp_path, polykv):
    db = tmp_path / "nowhere" / "deeper" / "results.sqlite"
    store = Store(db, readonly=True)
    assert store.runs() == [] and store.progress(["a", "b"]) == {} and store.run("a") is None
    assert store.task_scores("a") == {} and store.samples("a") == [] and store.done("a") == set()
    assert Store.reader(db).runs() == []
    assert list(tmp_path.iterdir()) == []  # no file, no folder, no -wal or -shm
    with pytest.raises(StoreError, match="opened read-only"):
        store.create_run("a", model="m")
    for write in (
        lambda: store.set_status("a", "finished"),
        lambda: store.add_sample("a", "t", "s", {}, 0.0),
        lambda: store.set_task_scores("a", {}, {}),
        lambda: store.set_running("a"),
        store.checkpoint,
    ):
        with pytest.raises(StoreError, match=r"results database at .* is opened read-only"):
            write()
    assert list(tmp_path.iterdir()) == []

    listed = polykv("runs", "-w", str(tmp_path / "ws"))
    assert listed.returncode == 0, listed.stderr
    assert_one_line_error(polykv("compare", "a", "b", "-w", str(tmp_path / "ws")), "run 'a': no run")
    assert not (tmp_path / "ws").exists()

    # The database appears later (a job started): the same reader then sees it.
    writer = Store(tmp_path / "ws" / "results.sqlite")
    fake_run(writer, "r1", {"t": {"kl": 0.5}})
    late = Store(tmp_path / "ws" / "results.sqlite", readonly=True)
    assert [r.id for r in late.runs()] == ["r1"]


def test_a_new_database_is_created_whole_and_has_the_current_schema(tmp_path):
    store = Store(tmp_path / "ws" / "results.sqlite")
    assert sorted(p.name for p in (tmp_path / "ws").iterdir()) == ["results.sqlite"]  # no leftover temp file
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        columns = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
        sample_columns = {row[1] for row in db.execute("PRAGMA table_info(samples)")}
    assert {"worker_pid", "worker_host", "worker_started"} <= columns
    assert {"prediction", "gold", "prompt", "kv_held"} <= sample_columns
    fake_run(store, "r", {"t": {"kl": 0.1}})
    assert Store(store.path).task_scores("r") == {"t": {"kl": 0.1}}  # opening again changes nothing


def test_every_connection_of_a_reader_is_a_read_only_uri(tmp_path, monkeypatch):
    folder = tmp_path / "odd ?#% name"
    writer = Store(folder / "results.sqlite")
    fake_run(writer, "r", {"t": {"kl": 0.1}})
    opened = []
    real_connect = sqlite3.connect

    def spy(database, *args, **kwargs):
        opened.append((str(database), kwargs.get("uri", False)))
        return real_connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", spy)
    reader = Store(folder / "results.sqlite", readonly=True)
    assert [r.id for r in reader.runs()] == ["r"] and reader.task_scores("r") == {"t": {"kl": 0.1}}
    assert opened and all(
        uri and database.startswith("file:///") and "?mode=ro" in database for database, uri in opened
    )
    assert all("odd%20%3F%23%25%20name" in database for database, _ in opened)  # the path is quoted
    monkeypatch.undo()
    with real_connect(opened[0][0], uri=True) as db, pytest.raises(sqlite3.OperationalError, match="readonly"):
        db.execute("CREATE TABLE intruder (x)")


# ---- (b) a read-only workspace --------------------------------------------------------------------------------
@pytest.mark.slow  # every read command as a real process
def test_the_cli_reads_a_read_only_workspace_and_changes_nothing(readonly_workspace):
    ws, box = readonly_workspace, sandbox()
    before = snapshot(ws.path)

    listed = cli(ws, "runs", "-w", str(ws.path))
    assert listed.returncode == 0, listed.stderr
    assert ws.run_a in listed.stdout and ws.run_b in listed.stdout and "tova-plan" in listed.stdout
    assert listed.stdout.count("finished") == 2 and "3/3" in listed.stdout

    compared = cli(ws, "compare", ws.run_a[:8], ws.run_b[:8], "--metric", "kl", "-w", str(ws.path))
    assert compared.returncode == 0, compared.stderr
    assert f"A = {ws.run_a} (tova-plan), B = {ws.run_b} (h2o-plan); metric kl (lower is better)" in compared.stdout
    assert "A wins / ties / losses: 2 / 0 / 1" in compared.stdout

    listed_jobs = cli(ws, "jobs", "list", "-w", str(ws.path))
    assert listed_jobs.returncode == 0, listed_jobs.stderr
    assert ws.job.id in listed_jobs.stdout and "two plans" in listed_jobs.stdout and "100%" in listed_jobs.stdout

    assert_unchanged(before, ws.path, strict=box.real)
    if box.real:  # really read-only for that process: the store read the file as immutable
        assert sorted(p.name for p in ws.path.iterdir()) == ["jobs", "results.sqlite"]


_APP_DRIVER = """
import json, sys
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(sys.argv[1], default_timeout=180)
at.run()
out = {}
for page in ("runs", "compare"):
    at.switch_page(f"views/{page}.py")
    at.run()
    out[page] = {"exceptions": [e.value for e in at.exception], "errors": [e.value for e in at.error],
                 "markdown": [m.value for m in at.markdown], "metrics": [m.label for m in at.metric],
                 "frames": [json.loads(d.value.to_json(orient="records")) for d in at.dataframe]}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow  # AppTest pages over a workspace of real runs
def test_the_runs_and_compare_pages_read_a_read_only_workspace(readonly_workspace):
    ws, box = readonly_workspace, sandbox()
    before = snapshot(ws.path)
    result = box.run([sys.executable, "-c", _APP_DRIVER, APP], ws.root, ws.env(), timeout=400)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-3000:] + result.stderr[-3000:]
    pages = json.loads(lines[-1][len("RESULT ") :])
    runs, compare = pages["runs"], pages["compare"]
    assert runs["exceptions"] == [] and runs["errors"] == [], runs
    table = next(frame for frame in runs["frames"] if frame and "run" in frame[0])  # the runs table (answers below)
    assert {row["run"] for row in table} == {ws.run_a, ws.run_b} and {row["status"] for row in table} == {"finished"}
    assert any(ws.job.id in m for m in runs["markdown"])  # the job, with its progress from the store
    assert compare["exceptions"] == [] and compare["errors"] == [], compare
    assert "A wins / ties / losses" in compare["metrics"]
    assert_unchanged(before, ws.path, strict=box.real)


# ---- (c) damaged, foreign, empty and newer databases ------------------------------------------------------------
def _random_bytes(db: Path) -> None:
    db.write_bytes(random.Random(0).randbytes(8192))


def _malformed(db: Path) -> None:
    store = Store(db)
    fake_run(store, "r", {"t": {"kl": 0.1}})
    store.checkpoint()
    data = bytearray(db.read_bytes())
    data[100:4096] = random.Random(1).randbytes(3996)  # page 1 past the header: the schema table
    db.write_bytes(bytes(data))


def _foreign(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        conn.execute("INSERT INTO notes (text) VALUES ('not ours')")
    conn.close()


def _empty(db: Path) -> None:
    db.write_bytes(b"")


def _newer(db: Path) -> None:
    fake_run(Store(db), "r", {"t": {"kl": 0.1}})
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()


BAD = {
    "random bytes": (_random_bytes, "damaged results database at {db}: file is not a database"),
    "malformed": (_malformed, "damaged results database at {db}: database disk image is malformed"),
    "foreign": (_foreign, "{db} is not a PolyKV results database (no runs table)"),
    "empty file": (_empty, "{db} is not a PolyKV results database (no runs table)"),
    "newer schema": (
        _newer,
        (
            "results database at {db} was written by a newer PolyKV "
            f"(schema {SCHEMA_VERSION + 1}; this one reads up to {SCHEMA_VERSION})"
        ),
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_database_is_one_line_of_error_in_the_cli_and_the_store(case, tmp_path, polykv):
    make, message = BAD[case]
    ws = tmp_path / "ws"
    ws.mkdir()
    db = ws / "results.sqlite"
    make(db)
    expected = message.format(db=db)
    with pytest.raises(StoreError) as caught:
        Store(db, readonly=True).runs()
    assert str(caught.value) == expected
    assert_one_line_error(polykv("runs", "-w", str(ws)), expected)
    assert_one_line_error(polykv("compare", "a", "b", "-w", str(ws)), expected)
    if case != "empty file":  # an empty database is initialised; anything else is refused and left alone
        data = db.read_bytes()
        with pytest.raises(StoreError) as caught:
            Store(db)
        assert str(caught.value) == expected
        assert db.read_bytes() == data


def test_a_foreign_or_empty_database_is_never_turned_into_a_results_database(tmp_path):
    foreign = tmp_path / "foreign.sqlite"
    _foreign(foreign)
    with pytest.raises(StoreError, match="is not a PolyKV results database"):
        Store(foreign)
    with sqlite3.connect(foreign) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["notes"]
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    conn.close()
    empty = tmp_path / "empty.sqlite"
    _empty(empty)
    fake_run(Store(empty), "r", {"t": {"kl": 0.1}})  # an empty file is an empty database: initialised
    assert [r.id for r in Store(empty, readonly=True).runs()] == ["r"]


def _pages(at: AppTest) -> dict[str, dict[str, list[str]]]:
    out = {}
    for page in ("runs", "compare"):
        at.switch_page(f"views/{page}.py")
        at.run()
        out[page] = {
            "exceptions": [e.value for e in at.exception],
            "errors": [e.value for e in at.error],
            "info": [i.value for i in at.info],
        }
    return out


@pytest.mark.parametrize("case", slow_after(["foreign", "random bytes", "empty file", "newer schema"]))
def test_a_bad_database_is_an_inline_error_on_the_runs_and_compare_pages(case, app_env):
    make, message = BAD[case]
    (app_env / "ws").mkdir()
    db = app_env / "ws" / "results.sqlite"
    make(db)
    for page, shown in _pages(open_app()).items():
        assert shown["exceptions"] == [], (page, shown)
        assert message.format(db=db) in shown["errors"], (page, shown)


def test_the_pages_on_a_missing_workspace_create_nothing(app_env):
    pages = _pages(open_app())
    assert pages["runs"]["exceptions"] == [] and pages["runs"]["errors"] == []
    assert any("No runs in" in i for i in pages["runs"]["info"])
    assert pages["compare"]["exceptions"] == [] and any("No finished run yet" in i for i in pages["compare"]["info"])
    assert not (app_env / "ws").exists()


# ---- FIFOs and devices: SQLite would block on opening a FIFO, so each runs in a child process under a timeout --
_OPEN_EACH_WAY = """
import sys
from polykv.eval.results.store import Store
from polykv.errors import StoreError
for readonly in (True, False):
    try:
        Store(sys.argv[1], readonly=readonly).runs()
        print("opened")
    except StoreError as exc:
        print("StoreError:", exc)
"""


@pytest.mark.parametrize("special", ["results.sqlite", "results.sqlite-wal", "results.sqlite-shm", "device"])
def test_a_fifo_or_device_is_refused_before_sqlite_opens_it_by_readers_and_writers(tmp_path, special):
    ws = tmp_path / "ws"
    ws.mkdir()
    if special == "device":
        os.symlink("/dev/zero", ws / "results.sqlite")
    else:
        if special != "results.sqlite":
            fake_run(Store(ws / "results.sqlite"), "r", {"t": {"kl": 0.1}})  # a real database beside it
        os.mkfifo(ws / special)
    before = sorted(p.name for p in ws.iterdir())
    result = subprocess.run(
        [sys.executable, "-c", _OPEN_EACH_WAY, str(ws / "results.sqlite")],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    kind = "a device" if special == "device" else "a FIFO"
    where = ws / ("results.sqlite" if special == "device" else special)
    assert result.stdout.splitlines() == [f"StoreError: {where}: {kind}, not a results database file"] * 2, result
    assert sorted(p.name for p in ws.iterdir()) == before


@pytest.mark.slow  # the app's pages in a child process (under a timeout: a hang fails the test)
def test_the_runs_and_compare_pages_refuse_a_fifo_database_inline(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    os.mkfifo(ws / "results.sqlite")
    env = {**os.environ, "POLYKV_WORKSPACE": str(ws), "POLYKV_PLANS": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", _APP_DRIVER, APP], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-3000:] + result.stderr[-3000:]
    for page, shown in json.loads(lines[-1][len("RESULT ") :]).items():
        assert shown["exceptions"] == [], (page, shown)
        assert f"{ws / 'results.sqlite'}: a FIFO, not a results database file" in shown["errors"], (page, shown)


# ---- what a reader leaves in a writable workspace (README: Files, workspace and errors) ------------------------
def test_a_reader_in_a_writable_workspace_leaves_only_sqlites_empty_sidecars_which_the_next_writer_removes(
    tmp_path, polykv
):
    ws = tmp_path / "ws"
    fake_run(Store(ws / "results.sqlite"), "r", {"t": {"kl": 0.1}})
    assert sorted(p.name for p in ws.iterdir()) == ["results.sqlite"]  # the writer folded its log in
    data = (ws / "results.sqlite").read_bytes()
    assert polykv("runs", "-w", str(ws)).returncode == 0
    # SQLite's read-only reader of a WAL database needs the log's index; it cannot remove it after itself
    assert sorted(p.name for p in ws.iterdir()) == sorted(["results.sqlite", *SIDECARS])
    assert (ws / "results.sqlite").read_bytes() == data and (ws / "results.sqlite-wal").stat().st_size == 0
    fake_run(Store(ws / "results.sqlite"), "r2", {"t": {"kl": 0.2}})
    assert sorted(p.name for p in ws.iterdir()) == ["results.sqlite"]


# ---- (d) workers ---------------------------------------------------------------------------------------------
def _killed_worker() -> Worker:
    """A worker that was alive when it started the run and has been killed since."""
    process = subprocess.Popen(["sleep", "60"])
    worker = Worker(process.pid, socket.gethostname(), process_start_time(process.pid))
    process.kill()
    process.wait()
    return worker


def test_process_start_time_reads_past_a_command_name_with_spaces_and_parentheses(tmp_path):
    if not Path("/proc/self/stat").is_file():  # not Linux: there is no start time to read
        assert process_start_time(os.getpid()) is None
        return
    odd = tmp_path / "my (odd) sleep) x"
    odd.symlink_to(shutil.which("sleep"))
    process = subprocess.Popen([str(odd), "30"])
    try:
        stat_line = Path(f"/proc/{process.pid}/stat").read_text()
        assert " (my (odd) sleep)) " in stat_line  # the command name (15 characters) keeps its parentheses
        expected = stat_line[stat_line.rindex(")") + 2 :].split()[19]
        assert process_start_time(process.pid) == expected and expected.isdigit()
        assert Worker(process.pid, socket.gethostname(), expected).alive() is True
    finally:
        process.kill()
        process.wait()
    assert process_start_time(process.pid) is None


def test_a_run_whose_worker_died_is_reported_stopped(tmp_path):
    store = Store(tmp_path / "results.sqlite")
    for run_id in ("killed", "reused", "alive", "elsewhere", "legacy", "done"):
        fake_run(store, run_id, {"t": {"kl": 0.1}}, status="running")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        here = socket.gethostname()
        assert store.set_running("alive", Worker(sleeper.pid, here, process_start_time(sleeper.pid)))
        assert store.set_running("killed", _killed_worker())
        assert store.set_running("reused", Worker(os.getpid(), here, "-1"))  # the pid now names another process
        assert store.set_running("elsewhere", Worker(999_999, here + "-another-host", "1"))  # cannot tell: as stored
        fake_run(store, "done", {"t": {"kl": 0.1}})
        assert not store.set_running("done", _killed_worker())  # a finished run stays finished
        expected = {
            "killed": "stopped",
            "reused": "stopped",
            "alive": "running",
            "elsewhere": "running",
            "legacy": "running",
            "done": "finished",
        }
        assert {r.id: r.status for r in store.runs()} == expected
        assert {k: v[2] for k, v in store.progress(list(expected)).items()} == expected
        assert {k: store.run(k).status for k in expected} == expected
        reader = Store(store.path, readonly=True)
        assert {r.id: r.status for r in reader.runs()} == expected
        with sqlite3.connect(store.path) as db:  # computed when read, never written
            stored = dict(db.execute("SELECT id, status FROM runs").fetchall())
        db.close()
        assert stored == {**expected, "killed": "running", "reused": "running"}
    finally:
        sleeper.kill()
        sleeper.wait()
    assert store.run("alive").status == "stopped"


def test_a_stopped_run_resumes_where_it_stopped_and_finishes(demo_model, tmp_path):
    model, tokenizer = demo_model
    store = Store(tmp_path / "results.sqlite")
    plan = Plan.homogeneous("tova", 16, 5)

    def stop_after_two(done, total, where):
        if done == 2:
            raise KeyboardInterrupt  # the run stops after two committed samples

    with pytest.raises(KeyboardInterrupt):
        run_suite(store, "demo", model, tokenizer, plan, "fidelity", TINY, progress=stop_after_two)
    (run,) = store.runs()
    assert run.done_samples == 2 and run.worker_pid == os.getpid()
    assert run.worker_host == socket.gethostname() and run.worker_started == process_start_time(os.getpid())
    store.set_running(run.id, _killed_worker())  # as if its worker had been killed -9 mid-run
    assert store.runs()[0].status == "stopped" and store.progress([run.id])[run.id] == (2, 3, "stopped")
    before = {(s.task, s.sample): s.created for s in store.samples(run.id)}

    seen = []
    assert (
        run_suite(
            store,
            "demo",
            model,
            tokenizer,
            plan,
            "fidelity",
            TINY,
            progress=lambda d, t, w: seen.append(store.run(run.id).status),
        )
        == run.id
    )
    assert set(seen) == {"running"}  # resuming made this process its worker
    after = store.run(run.id)
    assert after.status == "finished" and after.worker_pid == os.getpid() and after.error is None
    samples = {(s.task, s.sample): s.created for s in store.samples(run.id)}
    assert len(samples) == 3 and all(samples[key] == created for key, created in before.items())
    assert store.progress([run.id])[run.id] == (3, 3, "finished")


# ---- (e) a version-1 database -----------------------------------------------------------------------------------
def _version_1(db: Path) -> None:
    db.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(V1_SCHEMA)
    with conn:
        conn.execute(
            "INSERT INTO runs VALUES ('old', 'demo', 'old-plan', 'h', '{}', 'fidelity', '{}', 0, 'running', 2, "
            "'{}', '2024-01-01T00:00:00.000+00:00', NULL, NULL)"
        )
        conn.execute(
            "INSERT INTO samples VALUES ('old', 't', '0', '{\"kl\": 0.25}', 0.5, '2024-01-01T00:00:01.000+00:00')"
        )
        conn.execute("INSERT INTO task_scores VALUES ('old', 't', 'kl', 0.25, 1)")
    conn.close()


def test_a_version_1_database_is_read_as_it_is_and_migrated_when_opened_for_writing(tmp_path, polykv):
    db = tmp_path / "ws" / "results.sqlite"
    _version_1(db)
    data = db.read_bytes()
    reader = Store(db, readonly=True)
    (run,) = reader.runs()
    assert run.id == "old" and run.status == "running" and run.done_samples == 1  # no worker: as stored
    assert run.worker_pid is None and run.worker_host is None and run.worker_started is None
    assert reader.task_scores("old") == {"t": {"kl": 0.25}} and reader.progress(["old"]) == {"old": (1, 2, "running")}
    listed = polykv("runs", "-w", str(tmp_path / "ws"))
    assert listed.returncode == 0 and "old-plan" in listed.stdout and "1/2" in listed.stdout
    assert db.read_bytes() == data  # read, not migrated
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    conn.close()

    writer = Store(db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        columns = [row[1] for row in conn.execute("PRAGMA table_info(runs)")]
        samples = [row[1] for row in conn.execute("PRAGMA table_info(samples)")]
    conn.close()
    assert columns[-3:] == ["worker_pid", "worker_host", "worker_started"]
    assert samples[-4:-1] == ["prediction", "gold", "prompt"]  # version 3: what a question suite's model answered
    assert samples[-1] == "kv_held"  # version 4: the KV the plan held, measured
    assert writer.run("old").plan_name == "old-plan" and writer.samples("old")[0].metrics == {"kl": 0.25}
    old = writer.samples("old")[0]
    assert (old.prediction, old.gold, old.prompt, old.kv_held) == (None, None, None, None)  # an older row: none
    held = {"entering": [3, 4], "end": [5, 6], "seen_entering": 9, "seen_end": 11}
    writer.add_sample(
        "old", "t", "1", {"score": 100.0}, 0.1, SampleRecord(" 42.", ["42"], {"task": "t", "sha256": "ab"}, held)
    )
    new = writer.samples("old")[1]
    assert (new.prediction, new.gold, new.prompt) == (" 42.", ["42"], {"task": "t", "sha256": "ab"})
    assert new.kv_held == held
    assert writer.set_running("old") and writer.run("old").worker_pid == os.getpid()
    Store(db)  # opening the migrated database again changes nothing
    assert Store(db, readonly=True).run("old").status == "running"


# ---- (f) what the store reads back ----------------------------------------------------------------------------
def test_runs_and_samples_read_back_as_typed_frozen_rows_with_the_columns_names(tmp_path):
    import dataclasses

    from polykv.eval.results.rows import RunRow, SampleRow, sample_key

    store = Store(tmp_path / "results.sqlite")
    fake_run(store, "r", {"t": {"kl": 0.25}})
    store.add_sample("r", "t", "1", {"kl": 0.5}, 0.2, SampleRecord("42", ["42"], {"task": "t", "sha256": "ab"}))
    run = store.run("r")
    assert isinstance(run, RunRow) and store.runs() == [run] and run.done_samples == 2
    assert (run.id, run.status, run.plan_name, run.seed, json.loads(run.settings)) == ("r", "finished", "r", 0, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.status = "running"
    old, new = store.samples("r")
    assert isinstance(old, SampleRow) and (old.metrics, old.prediction, old.gold, old.prompt) == (
        {"kl": 0.25},
        None,
        None,
        None,
    )
    assert (new.task, new.sample, new.prediction, new.gold, new.prompt["sha256"]) == ("t", "1", "42", ["42"], "ab")
    assert (sample_key(old, 0), sample_key(new, 0)) == ("0#seed0", "1#ab")  # a stored prompt pairs by its hash
    assert store.progress(["r", "missing"]) == {"r": (2, 1, "finished")} and store.run("missing") is None

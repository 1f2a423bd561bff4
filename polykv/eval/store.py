"""The results database: runs, finished samples and task scores in one SQLite file (WAL mode).

Each finished sample is committed as soon as it is scored, so a killed run resumes where it stopped
and a finished run is never recomputed. Other processes (the app) can read progress at any time: WAL
lets readers see committed rows while a run writes.
"""

from __future__ import annotations

import datetime
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    plan_name TEXT NOT NULL,
    plan_hash TEXT NOT NULL,
    plan_json TEXT NOT NULL,
    suite TEXT NOT NULL,
    settings TEXT NOT NULL,
    seed INTEGER NOT NULL,
    status TEXT NOT NULL,
    total_samples INTEGER NOT NULL,
    versions TEXT NOT NULL,
    created TEXT NOT NULL,
    finished TEXT,
    error TEXT
);
CREATE TABLE IF NOT EXISTS samples (
    run_id TEXT NOT NULL REFERENCES runs(id),
    task TEXT NOT NULL,
    sample TEXT NOT NULL,
    metrics TEXT NOT NULL,
    seconds REAL NOT NULL,
    created TEXT NOT NULL,
    PRIMARY KEY (run_id, task, sample)
);
CREATE TABLE IF NOT EXISTS task_scores (
    run_id TEXT NOT NULL REFERENCES runs(id),
    task TEXT NOT NULL,
    metric TEXT NOT NULL,
    value REAL NOT NULL,
    samples INTEGER NOT NULL,
    PRIMARY KEY (run_id, task, metric)
);
"""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


class Store:
    """A thin layer over the SQLite file; every write is its own transaction."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30)
        db.row_factory = sqlite3.Row
        try:
            with db:
                yield db
        finally:
            db.close()

    def checkpoint(self) -> None:
        """Fold the write-ahead log into the database file, so the file alone holds every result (e.g.
        before it is copied or committed)."""
        with self._connect() as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # ---- runs -------------------------------------------------------------------------------------
    def create_run(self, run_id: str, **fields: Any) -> None:
        """Insert the run unless it exists (same id = same model, plan, suite, settings and seed)."""
        row = {k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in fields.items()}
        row.update(id=run_id, status="running", created=_now())
        columns = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with self._connect() as db:
            db.execute(f"INSERT OR IGNORE INTO runs ({columns}) VALUES ({marks})", tuple(row.values()))

    def run(self, run_id: str) -> dict[str, Any] | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else dict(row)

    def runs(self) -> list[dict[str, Any]]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT r.*, (SELECT COUNT(*) FROM samples s WHERE s.run_id = r.id) AS done_samples "
                "FROM runs r ORDER BY created"
            ).fetchall()
        return [dict(r) for r in rows]

    def progress(self, run_ids: list[str]) -> dict[str, tuple[int, int, str]]:
        """(finished samples, total samples, status) of each of `run_ids` that exists."""
        if not run_ids:
            return {}
        marks = ", ".join("?" for _ in run_ids)
        with self._connect() as db:
            rows = db.execute(
                "SELECT r.id, r.total_samples, r.status, (SELECT COUNT(*) FROM samples s WHERE s.run_id = r.id) AS done "
                f"FROM runs r WHERE r.id IN ({marks})", tuple(run_ids)
            ).fetchall()
        return {r["id"]: (r["done"], r["total_samples"], r["status"]) for r in rows}

    def set_status(self, run_id: str, status: str, error: str | None = None) -> None:
        finished = _now() if status in ("finished", "failed", "cancelled") else None
        with self._connect() as db:
            db.execute("UPDATE runs SET status = ?, error = ?, finished = ? WHERE id = ?", (status, error, finished, run_id))

    # ---- samples and scores -----------------------------------------------------------------------
    def done(self, run_id: str) -> set[tuple[str, str]]:
        with self._connect() as db:
            rows = db.execute("SELECT task, sample FROM samples WHERE run_id = ?", (run_id,)).fetchall()
        return {(r["task"], r["sample"]) for r in rows}

    def add_sample(self, run_id: str, task: str, sample: str, metrics: dict[str, float], seconds: float) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT OR IGNORE INTO samples VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, task, sample, json.dumps(metrics), seconds, _now()),
            )

    def samples(self, run_id: str) -> list[dict[str, Any]]:
        with self._connect() as db:
            rows = db.execute("SELECT * FROM samples WHERE run_id = ? ORDER BY task, sample", (run_id,)).fetchall()
        return [{**dict(r), "metrics": json.loads(r["metrics"])} for r in rows]

    def set_task_scores(self, run_id: str, scores: dict[str, dict[str, float]], counts: dict[str, int]) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM task_scores WHERE run_id = ?", (run_id,))
            db.executemany(
                "INSERT INTO task_scores VALUES (?, ?, ?, ?, ?)",
                [(run_id, task, metric, value, counts[task]) for task, values in scores.items() for metric, value in values.items()],
            )

    def task_scores(self, run_id: str) -> dict[str, dict[str, float]]:
        with self._connect() as db:
            rows = db.execute("SELECT task, metric, value FROM task_scores WHERE run_id = ?", (run_id,)).fetchall()
        out: dict[str, dict[str, float]] = {}
        for r in rows:
            out.setdefault(r["task"], {})[r["metric"]] = r["value"]
        return out

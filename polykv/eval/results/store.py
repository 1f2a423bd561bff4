"""The results database: runs, finished samples and task scores in one SQLite file (WAL mode).

Each finished sample is committed as soon as it is scored, so a killed run resumes where it stopped
and a finished run is never recomputed. Other processes (the app) can read progress at any time: WAL
lets readers see committed rows while a run writes.

`Store(path)` opens the file for writing: it creates the file (and its folder) when missing, sets WAL
mode and brings an older schema up to date. `Store(path, readonly=True)` is for whoever only reads
(`polykv runs`, `polykv compare`, the app's pages): it never creates or changes anything, reads a
missing file as an empty database and works in a read-only workspace (where SQLite cannot create the
WAL's `-shm` file it opens the file as immutable).

The schema version is SQLite's `user_version`: 0 with the three tables is a database written before
versions were recorded (version 1, read as it is and migrated when opened for writing). A newer
version, a damaged file, a foreign SQLite database and every SQLite failure become a one-line
`StoreError` naming the file.

A run records the process that executes it (pid, host, the process's start time). A run stored as
"running" whose worker is gone (on this host: no such process, or the pid now belongs to another
process) is reported as "stopped": it was killed and can be resumed.

Runs and samples read back as typed, frozen rows (`RunRow`, `SampleRow`: `polykv.eval.results.rows`); the file,
its opening, schema and migrations are `polykv.eval.results.database`.
"""

from __future__ import annotations

import json
from typing import Any

from polykv.eval.results.database import SCHEMA, SCHEMA_VERSION, ResultsDatabase, now
from polykv.eval.results.rows import RunRow, SampleRecord, SampleRow, sample_key
from polykv.eval.results.run_workers import Worker, reported

# A run's columns and its finished samples, counted (`RunRow.done_samples`).
_RUN_WITH_DONE = "r.*, (SELECT COUNT(*) FROM samples s WHERE s.run_id = r.id) AS done_samples"


# ---- the store --------------------------------------------------------------------------------------
class Store(ResultsDatabase):
    """The runs, their finished samples and their task scores (the file and its opening:
    `polykv.eval.results.database`); rows read back typed (`polykv.eval.results.rows`).

    `readonly=True`: never creates or changes anything (a missing file reads as empty); writes raise
    `StoreError`."""

    # ---- runs -------------------------------------------------------------------------------------
    def create_run(self, run_id: str, **fields: Any) -> None:
        """Insert the run unless it exists (same id = same model, plan, suite, settings and seed)."""
        self._writing("create a run")
        row = {k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in fields.items()}
        row.update(id=run_id, status="running", created=now())
        columns = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with self._connect() as db:
            db.execute(f"INSERT OR IGNORE INTO runs ({columns}) VALUES ({marks})", tuple(row.values()))

    def set_running(self, run_id: str, worker: Worker | None = None) -> bool:
        """Record `worker` (default: this process) as executing the run and mark it running, with no error;
        a finished run is left alone. Returns whether the run was marked."""
        self._writing("mark a run running")
        worker = worker or Worker.current()
        with self._connect() as db:
            cursor = db.execute(
                "UPDATE runs SET status = 'running', error = NULL, finished = NULL, worker_pid = ?, worker_host = ?, "
                "worker_started = ? WHERE id = ? AND status != 'finished'",
                (worker.pid, worker.host, worker.started, run_id),
            )
        return cursor.rowcount > 0

    def run(self, run_id: str) -> RunRow | None:
        """The run `run_id` (None when there is none), its finished samples counted."""
        if not self._check_readable():
            return None
        with self._connect() as db:
            row = db.execute(f"SELECT {_RUN_WITH_DONE} FROM runs r WHERE r.id = ?", (run_id,)).fetchone()
        return None if row is None else RunRow.from_row(reported(dict(row)))

    def finished_runs(self, model: str, plan_hash: str, suite: str, seed: int) -> list[tuple[str, dict]]:
        """(id, settings) of every finished run of this model, plan, suite and seed, newest first, whatever code
        revisions made them (their ids hash those too): what a replay chooses from instead of running."""
        if not self._check_readable():
            return []
        with self._connect() as db:
            rows = db.execute(
                "SELECT id, settings FROM runs WHERE model = ? AND plan_hash = ? AND suite = ? AND seed = ? "
                "AND status = 'finished' ORDER BY created DESC",
                (model, plan_hash, suite, seed),
            ).fetchall()
        return [(row["id"], json.loads(row["settings"])) for row in rows]

    def runs(self) -> list[RunRow]:
        """Every run, oldest first, each with its finished samples counted."""
        if not self._check_readable():
            return []
        with self._connect() as db:
            rows = db.execute(f"SELECT {_RUN_WITH_DONE} FROM runs r ORDER BY created").fetchall()
        return [RunRow.from_row(reported(dict(r))) for r in rows]

    def progress(self, run_ids: list[str]) -> dict[str, tuple[int, int, str]]:
        """(finished samples, total samples, status) of each of `run_ids` that exists."""
        if not run_ids or not self._check_readable():
            return {}
        marks = ", ".join("?" for _ in run_ids)
        with self._connect() as db:
            rows = db.execute(f"SELECT {_RUN_WITH_DONE} FROM runs r WHERE r.id IN ({marks})", tuple(run_ids)).fetchall()
        runs = [RunRow.from_row(reported(dict(row))) for row in rows]
        return {run.id: (run.done_samples, run.total_samples, run.status) for run in runs}

    def set_status(self, run_id: str, status: str, error: str | None = None) -> None:
        self._writing("set a run's status")
        finished = now() if status in ("finished", "failed", "cancelled") else None
        with self._connect() as db:
            db.execute(
                "UPDATE runs SET status = ?, error = ?, finished = ? WHERE id = ?", (status, error, finished, run_id)
            )

    # ---- samples and scores -----------------------------------------------------------------------
    def done(self, run_id: str) -> set[tuple[str, str]]:
        if not self._check_readable():
            return set()
        with self._connect() as db:
            rows = db.execute("SELECT task, sample FROM samples WHERE run_id = ?", (run_id,)).fetchall()
        return {(r["task"], r["sample"]) for r in rows}

    def add_sample(
        self,
        run_id: str,
        task: str,
        sample: str,
        metrics: dict[str, float],
        seconds: float,
        record: SampleRecord | None = None,
    ) -> None:
        """One finished sample: its metrics and, for a question suite, what the model answered (`record`)."""
        self._writing("add a sample")
        record = record or SampleRecord()
        with self._connect() as db:
            db.execute(
                "INSERT OR IGNORE INTO samples (run_id, task, sample, metrics, seconds, created, prediction, gold, "
                "prompt, kv_held) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    task,
                    sample,
                    json.dumps(metrics),
                    seconds,
                    now(),
                    record.prediction,
                    None if record.gold is None else json.dumps(list(record.gold)),
                    None if record.prompt is None else json.dumps(record.prompt, sort_keys=True),
                    None if record.kv_held is None else json.dumps(record.kv_held),
                ),
            )

    def samples(self, run_id: str) -> list[SampleRow]:
        """A run's finished samples in (task, sample) order: task, sample, metrics, seconds, created and the
        record (prediction, gold: a list, prompt: a dict; None where a suite or an older database has none)."""
        if not self._check_readable():
            return []
        with self._connect() as db:
            rows = db.execute("SELECT * FROM samples WHERE run_id = ? ORDER BY task, sample", (run_id,)).fetchall()
        return [SampleRow.from_row(dict(r)) for r in rows]

    def set_task_scores(self, run_id: str, scores: dict[str, dict[str, float]], counts: dict[str, int]) -> None:
        self._writing("write task scores")
        with self._connect() as db:
            db.execute("DELETE FROM task_scores WHERE run_id = ?", (run_id,))
            db.executemany(
                "INSERT INTO task_scores VALUES (?, ?, ?, ?, ?)",
                [
                    (run_id, task, metric, value, counts[task])
                    for task, values in scores.items()
                    for metric, value in values.items()
                ],
            )

    def task_scores(self, run_id: str) -> dict[str, dict[str, float]]:
        if not self._check_readable():
            return {}
        with self._connect() as db:
            rows = db.execute("SELECT task, metric, value FROM task_scores WHERE run_id = ?", (run_id,)).fetchall()
        out: dict[str, dict[str, float]] = {}
        for r in rows:
            out.setdefault(r["task"], {})[r["metric"]] = r["value"]
        return out


__all__ = ["SCHEMA", "SCHEMA_VERSION", "RunRow", "SampleRecord", "SampleRow", "Store", "sample_key"]

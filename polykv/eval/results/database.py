"""The results database as a file: where it is, how it is opened (writing: created atomically, WAL mode, an older
schema migrated; read-only: never created or changed, a missing file read as empty, opened immutable where SQLite
cannot create the WAL's `-shm` file), its schema and its versions, and every SQLite failure as one line
(`StoreError`). `polykv.eval.results.store.Store` adds the runs, samples and scores on top of it."""

from __future__ import annotations

import datetime
import os
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from polykv.errors import StoreError, first_line
from polykv.files import refuse_special_file

SCHEMA_VERSION = 4

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
    error TEXT,
    worker_pid INTEGER,
    worker_host TEXT,
    worker_started TEXT
);
CREATE TABLE IF NOT EXISTS samples (
    run_id TEXT NOT NULL REFERENCES runs(id),
    task TEXT NOT NULL,
    sample TEXT NOT NULL,
    metrics TEXT NOT NULL,
    seconds REAL NOT NULL,
    created TEXT NOT NULL,
    prediction TEXT,
    gold TEXT,
    prompt TEXT,
    kv_held TEXT,
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

TABLES = ("runs", "samples", "task_scores")
# Columns added by each schema version (over the one before): (version, table, column, declaration).
MIGRATIONS = (
    (2, "runs", "worker_pid", "INTEGER"),
    (2, "runs", "worker_host", "TEXT"),
    (2, "runs", "worker_started", "TEXT"),
    # 3: what the model answered, the gold answer(s) (JSON list) and the prompt's id (JSON: task, sample,
    # seed, sha256 of its token ids), for the samples of question suites; NULL in older rows
    (3, "samples", "prediction", "TEXT"),
    (3, "samples", "gold", "TEXT"),
    (3, "samples", "prompt", "TEXT"),
    # 4: the KV the plan held, measured from its cache (JSON: {"entering": [per layer], "end": [per layer]}, slots
    # per KV head); NULL in older rows and for suites that do not measure it
    (4, "samples", "kv_held", "TEXT"),
)
# Columns a runs table must have to be read as PolyKV's (a foreign table of the same name is refused).
_RUN_COLUMNS = ("id", "plan_name", "suite", "model", "status", "total_samples", "created")

_SQLITE_CORRUPT, _SQLITE_NOTADB, _SQLITE_READONLY, _SQLITE_CANTOPEN = 11, 26, 8, 14


def now() -> str:
    """Now, as the database's rows say it (UTC, ISO 8601 to the millisecond)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


class ResultsDatabase:
    """The SQLite file; every write is its own transaction.

    `readonly=True`: never creates or changes anything (a missing file reads as empty); writes raise
    `StoreError`."""

    def __init__(self, path: str | Path, readonly: bool = False):
        self.path = Path(path)
        self.readonly = bool(readonly)
        for file in (self.path, *(self.path.with_name(self.path.name + s) for s in ("-wal", "-shm", "-journal"))):
            refuse_special_file(file, "results database file", StoreError)  # SQLite would hang on a FIFO
        self._immutable = False  # read-only and SQLite could not create the -shm file: opened immutable
        self._ready = False  # the file exists and was checked (and, writable, initialised or migrated)
        if self.readonly:
            self._check_readable()
        else:
            self._open_writable()

    @classmethod
    def reader(cls, path: str | Path):
        """`Store(path, readonly=True)`."""
        return cls(path, readonly=True)

    # ---- opening ----------------------------------------------------------------------------------
    def _error(self, exc: sqlite3.Error) -> StoreError:
        reason = first_line(exc)
        code = getattr(exc, "sqlite_errorcode", None)
        primary = code & 0xFF if isinstance(code, int) else None
        damaged = primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB) or reason in (
            "file is not a database",
            "database disk image is malformed",
        )
        if damaged:
            return StoreError(f"damaged results database at {self.path}: {reason}")
        return StoreError(f"results database at {self.path}: {reason}")

    def _uri(self, immutable: bool) -> str:
        # as_uri() percent-quotes the path ('?', '#', '%' and spaces included), so any file name works.
        return self.path.absolute().as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro")

    def _raw(self) -> sqlite3.Connection:
        if not self.readonly:
            return sqlite3.connect(self.path, timeout=30)
        if self._immutable:
            return sqlite3.connect(self._uri(True), uri=True, timeout=30)
        db = sqlite3.connect(self._uri(False), uri=True, timeout=30)
        try:
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # opens the WAL index (-shm) now
        except sqlite3.Error as exc:
            db.close()
            code = getattr(exc, "sqlite_errorcode", None)
            primary = code & 0xFF if isinstance(code, int) else None
            readonly_dir = isinstance(exc, sqlite3.OperationalError) and (
                primary in (_SQLITE_READONLY, _SQLITE_CANTOPEN) or "readonly" in str(exc)
            )
            if not readonly_dir:
                raise
            # A WAL database in a folder where the -shm file cannot be created: read the file as it is.
            db = sqlite3.connect(self._uri(True), uri=True, timeout=30)
            try:
                db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            except sqlite3.Error:
                db.close()
                raise exc from None
            self._immutable = True
        return db

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection in a transaction (committed on success); SQLite failures become `StoreError`."""
        try:
            db = self._raw()
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        db.row_factory = sqlite3.Row
        try:
            with db:
                yield db
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        finally:
            db.close()

    def _inspect(self, db: sqlite3.Connection) -> tuple[int, set[str], int]:
        """(user_version, table names, number of schema objects)."""
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        rows = db.execute("SELECT type, name FROM sqlite_master").fetchall()
        tables = {row[1] for row in rows if row[0] == "table"}
        return version, tables, len(rows)

    def _check_schema(self, db: sqlite3.Connection, version: int, tables: set[str]) -> None:
        """Refuse a newer or foreign database."""
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"results database at {self.path} was written by a newer PolyKV "
                f"(schema {version}; this one reads up to {SCHEMA_VERSION})"
            )
        for table in TABLES:
            if table not in tables:
                raise StoreError(f"{self.path} is not a PolyKV results database (no {table} table)")
        columns = {row[1] for row in db.execute("PRAGMA table_info(runs)").fetchall()}
        missing = [c for c in _RUN_COLUMNS if c not in columns]
        if missing:
            raise StoreError(
                f"{self.path} is not a PolyKV results database (its runs table has no {missing[0]} column)"
            )

    def _check_readable(self) -> bool:
        """Read-only: whether the file exists (checked once it does); never creates anything."""
        if self._ready:
            return True
        if not self.path.exists():
            return False
        with self._connect() as db:
            version, tables, _ = self._inspect(db)
            self._check_schema(db, version, tables)
        self._ready = True
        return True

    def _open_writable(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the folder of the results database at {self.path}: {exc.strerror or exc}"
            ) from exc
        if not self.path.exists():
            self._create_atomically()
        try:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        try:
            version, tables, objects = self._inspect(db)
            if objects or version > SCHEMA_VERSION:
                self._check_schema(db, version, tables)  # a newer or foreign database is refused before any write
            if objects == 0 or version < SCHEMA_VERSION:
                # Initialise an empty database or migrate an older one under the write lock, looking again
                # inside it (another process may have done it meanwhile). A foreign database is refused
                # (by _check_schema) before anything is written.
                db.execute("BEGIN IMMEDIATE")
                try:
                    version, tables, objects = self._inspect(db)
                    if objects == 0:
                        for statement in filter(str.strip, SCHEMA.split(";")):
                            db.execute(statement)
                        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    elif version < SCHEMA_VERSION:
                        self._check_schema(db, version, tables)
                        self._migrate(db, version)
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
                version, tables, objects = self._inspect(db)
            self._check_schema(db, version, tables)
            db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        finally:
            db.close()
        self._ready = True

    def _create_atomically(self) -> None:
        """Build a new database beside `path` and link it into place, so a reader never finds a file
        without tables (it would be refused as foreign). Where hard links are not supported the database
        is initialised in place instead."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new")
        try:
            db = sqlite3.connect(tmp, isolation_level=None)
            try:
                db.execute("BEGIN")
                for statement in filter(str.strip, SCHEMA.split(";")):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                db.execute("COMMIT")
                db.execute("PRAGMA journal_mode=WAL")
            finally:
                db.close()
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pass  # another process created it first: that one is used
            except OSError:
                pass  # no hard links here: initialised in place by the caller
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        finally:
            for leftover in (
                tmp,
                tmp.with_name(tmp.name + "-wal"),
                tmp.with_name(tmp.name + "-shm"),
                tmp.with_name(tmp.name + "-journal"),
            ):
                leftover.unlink(missing_ok=True)

    def _migrate(self, db: sqlite3.Connection, version: int) -> None:
        """Bring a version-`version` database (0 counts as 1) up to SCHEMA_VERSION, inside the caller's transaction."""
        columns = {table: {row[1] for row in db.execute(f"PRAGMA table_info({table})").fetchall()} for table in TABLES}
        for since, table, column, declaration in MIGRATIONS:
            if max(version, 1) < since and column not in columns[table]:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _writing(self, action: str) -> None:
        if self.readonly:
            raise StoreError(f"cannot {action}: the results database at {self.path} is opened read-only")

    def checkpoint(self) -> None:
        """Fold the write-ahead log into the database file, so the file alone holds every result (e.g.
        before it is copied or committed)."""
        self._writing("checkpoint")
        with self._connect() as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

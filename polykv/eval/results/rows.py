"""What the results database's rows read back as: a run (`RunRow`) and a finished sample (`SampleRow`), typed
and frozen, with the same field names as the database's columns; what a question suite keeps of a sample besides
its metrics (`SampleRecord`) and what pairs the samples of two runs (`sample_key`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from polykv.kv_memory import KVHeld


@dataclass(frozen=True)
class RunRow:
    """A run as the store reads it (`Store.run`, `Store.runs`). `settings` and `versions` are the JSON text the
    run was stored with (`json.loads` them); a run whose worker on this host is gone reads as "stopped"
    (`polykv.eval.results.run_workers.reported`)."""

    id: str
    model: str
    plan_name: str
    plan_hash: str
    plan_json: str
    suite: str
    settings: str  # JSON: the suite's settings
    seed: int
    status: str  # running, finished, failed, cancelled; stopped (its worker is gone)
    total_samples: int
    versions: str  # JSON: the code revisions the run was made with
    created: str
    finished: str | None = None
    error: str | None = None
    worker_pid: int | None = None  # None in a version-1 database
    worker_host: str | None = None
    worker_started: str | None = None
    done_samples: int = 0  # its finished samples

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RunRow:
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls) if f.name in row})


@dataclass(frozen=True)
class SampleRecord:
    """What a question suite keeps of one sample besides its metrics: the model's answer, the gold
    answer(s) and an id of the prompt ({"task", "sample", "seed", "sha256"}: not the prompt itself)."""

    prediction: str | None = None
    gold: tuple[str, ...] | list[str] | None = None
    prompt: dict[str, Any] | None = None
    kv_held: KVHeld | None = None  # slots per KV head per layer, measured: "entering", "end"


@dataclass(frozen=True)
class SampleRow:
    """A finished sample as the store reads it (`Store.samples`): its metrics and, for a question suite, the
    record (None where a suite or an older database has none)."""

    run_id: str
    task: str
    sample: str
    metrics: dict[str, float]
    seconds: float
    created: str
    prediction: str | None = None
    gold: list[str] | None = None
    prompt: dict[str, Any] | None = None
    kv_held: KVHeld | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> SampleRow:
        """A row of the samples table (a version-2 database read as it is has no record columns)."""
        decoded = {"gold": None, "prompt": None, "kv_held": None}
        for name in decoded:
            if row.get(name) is not None:
                decoded[name] = json.loads(row[name])
        return cls(
            run_id=row["run_id"],
            task=row["task"],
            sample=row["sample"],
            metrics=json.loads(row["metrics"]),
            seconds=row["seconds"],
            created=row["created"],
            prediction=row.get("prediction"),
            **decoded,
        )


def sample_key(row: SampleRow, seed: int, by_prompt: bool = True) -> str:
    """What pairs a sample of one run with a sample of another: its id and the prompt it asked (the sha256 of the
    prompt's token ids), or, for a row stored without its prompt (or with `by_prompt` False, when the other side's
    rows have none), its id and the run's seed. Runs of other seeds share ids, not prompts: their samples never
    pair."""
    digest = (row.prompt or {}).get("sha256")
    return f"{row.sample}#{digest}" if by_prompt and digest is not None else f"{row.sample}#seed{seed}"


def has_prompt(row: SampleRow) -> bool:
    """Was the row stored with its prompt's hash (rows of stores made before prompts were recorded were not)?"""
    return (row.prompt or {}).get("sha256") is not None


__all__ = ["RunRow", "SampleRecord", "SampleRow", "has_prompt", "sample_key"]

"""The LongBench tasks' samples: the official ``<task>.jsonl`` files of a directory, or the hub dataset
``THUDM/LongBench`` (``load_task``); a line or row that scoring cannot use is skipped, with one warning per file.
How this differs from the original: the suite's docstring (`polykv.eval.suites.longbench`)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from polykv.errors import FileError, first_line
from polykv.files import parse_json

from .longbench_tasks import CLASSIFICATION_TASKS, TASK_PROMPTS, TASKS

HUB_DATASET = "THUDM/LongBench"


def _check_task(task: str) -> None:
    if task not in TASK_PROMPTS:
        raise ValueError(f"unknown LongBench task {task!r} (tasks: {', '.join(TASKS)})")


def _problem(task: str, record: Any) -> str | None:
    """Why a record cannot be scored (None if it can): a JSON object with string input and context, a
    non-empty list of string answers, and all_classes (a list of strings, or null/absent; required for
    trec and lsht)."""
    if not isinstance(record, dict):
        return f"not a JSON object but {type(record).__name__}"
    missing = [key for key in ("input", "context", "answers") if key not in record]
    if task in CLASSIFICATION_TASKS and record.get("all_classes") is None:
        missing.append("all_classes")
    if missing:
        return f"missing field(s) {', '.join(missing)}"
    for key in ("input", "context"):
        if not isinstance(record[key], str):
            return f"field {key} is not a string"
    answers = record["answers"]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        return "field answers is not a non-empty list of strings"
    classes = record.get("all_classes")
    if classes is not None and (not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)):
        return "field all_classes is neither null nor a list of strings"
    if task in CLASSIFICATION_TASKS and not classes:
        return "field all_classes is empty"
    return None


def _warn_skipped(where: str, unit: str, skipped: list[tuple[int, str]]) -> None:
    """One warning for a file's (or the hub task's) skipped lines or rows, however many: the first few named."""
    if skipped:
        shown = "; ".join(f"{unit} {n}: {why}" for n, why in skipped[:SKIPS_SHOWN])
        more = f"; and {len(skipped) - SKIPS_SHOWN} more" if len(skipped) > SKIPS_SHOWN else ""
        warnings.warn(f"LongBench: skipped {len(skipped)} {unit}(s) of {where}: {shown}{more}", stacklevel=3)


MAX_LINE_BYTES = 64 * 2**20  # a LongBench line (one sample, its context included) is at most a few MB
SKIPS_SHOWN = 5  # skipped lines a file's warning names


def read_task_file(task: str, path: str | Path) -> list[tuple[str, dict]]:
    """(sample id, record) for every usable line of an official ``<task>.jsonl`` file.

    The sample id is the 1-based line number (zero-padded). Blank lines are ignored; a line that is not
    UTF-8 JSON, not an object, or lacks a field scoring needs is skipped, and one warning per file names them
    (``"skipped 2 line(s) of <path>: line 3: ...; line 7: ..."``). A file with no usable line is an error, and
    so is a line longer than MAX_LINE_BYTES (a file with no newline is not read whole)."""
    _check_task(task)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LongBench task file {path} not found")
    samples, skipped = [], []  # skipped: (line number, why)
    with path.open("rb") as handle:
        lineno = 0
        while raw := handle.readline(MAX_LINE_BYTES + 1):
            lineno += 1
            if len(raw) > MAX_LINE_BYTES:  # e.g. a file with no newline: not read whole
                raise FileError(
                    f"{path}, line {lineno}: longer than {MAX_LINE_BYTES // 2**20} MiB: not a LongBench jsonl file"
                )
            try:
                text = raw.decode("utf-8")
                if not text.strip():
                    continue
                record = parse_json(text)
            except (UnicodeDecodeError, FileError) as exc:
                skipped.append((lineno, f"malformed JSON ({first_line(exc)})"))
                continue
            problem = _problem(task, record)
            if problem is None:
                samples.append((f"{lineno:05d}", record))
            else:
                skipped.append((lineno, problem))
    _warn_skipped(str(path), "line", skipped)  # one warning, not one per line of a pretty-printed file
    if not samples:
        raise ValueError(f"LongBench task file {path} holds no usable sample")
    return samples


def _hub_task(task: str) -> list[tuple[str, dict]]:
    hint = "give --data-dir (a directory of the official LongBench <task>.jsonl files, from the hub's data.zip)"
    try:
        import datasets
    except ImportError:
        raise ValueError(f"LongBench: the 'datasets' package is not installed to load {HUB_DATASET}; {hint}") from None
    try:
        rows = list(datasets.load_dataset(HUB_DATASET, task, split="test"))
    except Exception as exc:  # noqa: BLE001 - network, hub, script or format errors: all mean "give the files"
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ValueError(
            f"LongBench: could not load {HUB_DATASET} ({task}) from the Hugging Face hub "
            f"({exc.__class__.__name__}: {reason}); {hint}"
        ) from None
    samples = [(f"{n:05d}", dict(row)) for n, row in enumerate(rows, start=1)]
    problems = [(sid, row, _problem(task, row)) for sid, row in samples]
    _warn_skipped(f"{HUB_DATASET}/{task}", "row", [(int(sid), why) for sid, _, why in problems if why is not None])
    samples = [(sid, row) for sid, row, why in problems if why is None]
    if not samples:
        raise ValueError(f"LongBench: {HUB_DATASET} ({task}) holds no usable sample; {hint}")
    return samples


def load_task(task: str, data_dir: str | Path | None = None) -> list[tuple[str, dict]]:
    """(sample id, record) of one task: ``<data_dir>/<task>.jsonl``, or the hub dataset if data_dir is None."""
    _check_task(task)
    if data_dir is None:
        return _hub_task(task)
    directory = Path(data_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"LongBench data directory {directory} not found")
    path = directory / f"{task}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"LongBench task file {path} not found (expected <task>.jsonl in {directory})")
    return read_task_file(task, path)

"""A run's samples as a reader looks at them: what the model answered beside the gold answer, the samples it
failed, and where two runs' answers differ (with FullKV's answer when the store has a FullKV run of the same
settings). The CLI's `runs show` and `compare --samples` and the app's Compare page read them from here."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from polykv.eval.results.rows import has_prompt
from polykv.eval.results.store import RunRow, SampleRow, Store, sample_key
from polykv.question_protocol import QuestionProtocol

PERFECT = 100.0  # the question suites' score of a fully right answer


def resolve_run(store: Store, prefix: str, where: str = "") -> str:
    """The id of the one run whose id starts with `prefix` (a ValueError, one line, otherwise)."""
    found = [run.id for run in store.runs() if run.id.startswith(prefix)]
    if len(found) != 1:
        place = f" in {where}" if where else ""
        raise ValueError(f"run {prefix!r}: {'no run' if not found else 'several runs'} with that id{place}")
    return found[0]


def failed(row: SampleRow) -> bool:
    """A sample the plan got wrong: its score below full marks (100), or, without a score, an answer that is
    not FullKV's (agreement 0)."""
    metrics = row.metrics
    if "score" in metrics:
        return metrics["score"] < PERFECT
    return metrics.get("agreement", 1.0) < 1.0


def samples(store: Store, run_id: str, task: str | None = None, only_failed: bool = False) -> list[SampleRow]:
    """A run's samples (store rows, in task and sample order), of one task and / or only the failed ones."""
    rows = store.samples(run_id)
    if task is not None:
        tasks = sorted({row.task for row in rows})
        if task not in tasks:
            raise ValueError(f"run {run_id} has no task {task!r} (tasks: {', '.join(tasks) or 'none'})")
        rows = [row for row in rows if row.task == task]
    if only_failed:
        if not any("score" in row.metrics or "agreement" in row.metrics for row in rows):
            raise ValueError(f"run {run_id}'s samples have no score or agreement to tell a failed one by")
        rows = [row for row in rows if failed(row)]
    return rows


AGREEMENT = (
    "agreement: 1 when the plan's greedy answer is FullKV's (the same model keeping every token) on the same "
    "prompt; a sample FullKV fails too is the model's failure, not the plan's"
)


def fullkv_predictions(store: Store, run: RunRow) -> dict[tuple[str, str], str | None]:
    """{(task, sample): FullKV's answer} from the run's FullKV twin (`fullkv_twin`: the same model, suite, settings
    and seed, so the same prompts); {} when there is none or the run is FullKV itself."""
    twin = fullkv_twin(store, run)
    if twin is None or twin == run.id:
        return {}
    return {(row.task, row.sample): row.prediction for row in store.samples(twin)}


def fullkv_metrics(store: Store, run: RunRow) -> dict[tuple[str, str], dict[str, float]]:
    """{(task, sample): FullKV's metrics} from the run's FullKV twin (`fullkv_twin`); {} when there is none or the run
    is FullKV itself. In score mode (no answer generated) these are what FullKV is read by: its answer_nll."""
    twin = fullkv_twin(store, run)
    if twin is None or twin == run.id:
        return {}
    return {(row.task, row.sample): row.metrics for row in store.samples(twin)}


def fullkv_answer(full: Mapping[tuple[str, str], str | None], row: SampleRow) -> str | None:
    """FullKV's answer to the prompt of `row` (a sample of the run `full` was read for), or None."""
    return full.get((row.task, row.sample))


def answers(store: Store, run_id: str) -> list[dict[str, Any]]:
    """A run's samples as rows to read: task, sample, metrics, the gold answer(s), the plan's answer and FullKV's
    (from a finished FullKV run of the same model, suite and settings, when the store has one; else None)."""
    run = store.run(run_id)
    if run is None:
        raise ValueError(f"no run {run_id}")
    full = fullkv_predictions(store, run)
    return [
        {
            "task": row.task,
            "sample": row.sample,
            "metrics": metrics_text(row.metrics),
            "gold": one_line(row.gold, 200),
            "answer": one_line(row.prediction, 200),
            "FullKV": None if (answer := fullkv_answer(full, row)) is None else one_line(answer, 200),
        }
        for row in store.samples(run_id)
    ]


def fullkv_twin(store: Store, run: RunRow) -> str | None:
    """A finished FullKV run of the same model, suite, settings and seed as `run` (a store row: the same prompts),
    or None."""
    settings = settings_of(run)
    for other in store.runs():
        same = (other.model, other.suite, other.seed) == (run.model, run.suite, run.seed)
        if not same or other.status != "finished":
            continue
        if settings_of(other) == settings and is_fullkv(other.plan_json):
            return other.id
    return None


def is_fullkv(plan_json: str) -> bool:
    """Is a stored plan FullKV? (A plan the store holds but this version cannot read is not.)"""
    from polykv.errors import PolyKVError
    from polykv.eval.suites.answers import keeps_everything
    from polykv.plan import Plan

    try:
        return keeps_everything(Plan.from_json(plan_json))
    except (PolyKVError, ValueError):
        return False


def suite_text(run: RunRow) -> str:
    """The run's suite and, for a question suite whose question came after compression, that protocol."""
    question = QuestionProtocol.of(settings_of(run))
    return run.suite if question is QuestionProtocol.IN_PROMPT else f"{run.suite} (question {question})"


def other_models(a: RunRow, b: RunRow) -> str | None:
    """A line when two runs (store rows) ran on different models: their difference is the models' as well as the
    plans'. None when the model is the same."""
    if a.model == b.model:
        return None
    return (
        f"A ran on {one_line(a.model, 60)} and B on {one_line(b.model, 60)}: the difference is the models' "
        "as well as the plans'"
    )


def like_with_like(a: RunRow, b: RunRow) -> str | None:
    """Why two runs (store rows) compare across protocols, or None when their plans act in the same phases under
    the same question protocol: one line for `compare` to print."""
    from polykv.errors import PolyKVError
    from polykv.plan import Plan

    questions = [QuestionProtocol.of(settings_of(run)) for run in (a, b)]
    try:
        scopes = [Plan.from_json(run.plan_json).scope.value for run in (a, b)]
    except (PolyKVError, ValueError, KeyError):
        scopes = ["", ""]
    differ = []
    if questions[0] != questions[1]:
        differ.append(f"A's question is {questions[0]}, B's {questions[1]}")
    if scopes[0] != scopes[1] and not any(is_fullkv(run.plan_json) for run in (a, b)):
        differ.append(f"A acts in {scopes[0]}, B in {scopes[1]}")
    return None if not differ else "across protocols: " + "; ".join(differ)


def settings_of(run: RunRow) -> dict[str, Any]:
    """The suite's settings the run was stored with."""
    return json.loads(run.settings)


def kv_kept_line(run: RunRow) -> str | None:
    """What the run's plan keeps of the KV cache entering the answer, at its suite's prompt length (the longest
    when it runs several), against FullKV: one line, or None when the model's config or the length is unknown."""
    from polykv.errors import PolyKVError
    from polykv.kv_memory import kept_line
    from polykv.models import config_dimensions
    from polykv.plan import Plan

    settings = settings_of(run)
    length = settings.get("length") or settings.get("max_length") or settings.get("prompt_tokens")
    length = max(length) if isinstance(length, list) and length else length
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        return None
    try:
        plan = Plan.from_json(run.plan_json)
        dims = config_dimensions(run.model)
    except (PolyKVError, OSError, ValueError, KeyError):
        return None
    if dims.num_layers != plan.num_layers:
        return None
    windows = dims.windows or (None,) * plan.num_layers
    kept = kept_line(plan, length, windows, dims.kv_token_bytes)
    return f"KV kept entering the answer at the suite's length ({length:,} tokens): {kept}"


def measured(store: Store, run: RunRow):
    """The run's measured KV (`polykv.eval.results.kv_measured.MeasuredKV`) with FullKV's where the model's
    config gives each layer's window; None when no sample carries a measurement. With its one token's bytes in
    one layer (None when unknown)."""
    from polykv.errors import PolyKVError
    from polykv.eval.results.kv_measured import measured_kv
    from polykv.models import config_dimensions

    try:
        dims = config_dimensions(run.model)
        windows, token_bytes = dims.windows or (None,) * dims.num_layers, dims.kv_token_bytes
    except (PolyKVError, OSError, ValueError, KeyError):
        windows = token_bytes = None
    return measured_kv(store.samples(run.id), windows), token_bytes


def measured_lines(store: Store, run: RunRow) -> list[str]:
    """`runs show`'s lines on the KV the run's plan held, measured; [] when it was not measured."""
    from polykv.eval.results.kv_measured import heads_line, layers_line, measured_line

    kv, token_bytes = measured(store, run)
    if kv is None:
        return []
    heads = heads_line(kv)
    return [measured_line(kv, token_bytes), layers_line(kv)] + ([heads] if heads else [])


def kv_contrast_lines(store: Store, run_a: RunRow, run_b: RunRow) -> list[str]:
    """`compare`'s lines on the two runs' measured KV: each one's, and a note when they differ by more than 1%
    (or one was not measured); [] when neither was measured."""
    from polykv.eval.results.kv_measured import measured_line, unequal_kv

    (a, token_bytes), (b, _) = measured(store, run_a), measured(store, run_b)
    lines = [f"{name}: {measured_line(kv, token_bytes)}" for name, kv in (("A", a), ("B", b)) if kv is not None]
    note = unequal_kv(a, b)
    return lines + ([note] if note else [])


def side_by_side(store: Store, run_a: str, run_b: str, task: str, only_differing: bool = False) -> list[dict[str, Any]]:
    """One task's samples of two runs side by side: sample, gold, A's and B's answers and metrics, and FullKV's
    answer and metrics when the store has a FullKV run of A's settings. `only_differing`: the samples whose answers or
    metrics differ."""
    run = store.run(run_a)
    if run is None:
        raise ValueError(f"no run {run_a}")
    other = store.run(run_b)
    if other is None:
        raise ValueError(f"no run {run_b}")
    # paired by `sample_key`: the same prompt, never another seed's sample of the same id (by id and seed when a
    # side was stored before prompts were recorded)
    rows_a = [row for row in store.samples(run_a) if row.task == task]
    rows_b = [row for row in store.samples(run_b) if row.task == task]
    by_prompt = all(has_prompt(row) for row in (*rows_a, *rows_b))
    a = {sample_key(row, run.seed, by_prompt): row for row in rows_a}
    b = {sample_key(row, other.seed, by_prompt): row for row in rows_b}
    full = fullkv_predictions(store, run)
    full_metrics = fullkv_metrics(store, run)
    out = []
    for key in sorted(set(a) & set(b)):
        left, right = a[key], b[key]
        sample = left.sample
        differ = left.prediction != right.prediction or left.metrics != right.metrics
        if only_differing and not differ:
            continue
        out.append(
            {
                "sample": sample,
                "gold": left.gold,
                "A": left.prediction,
                "B": right.prediction,
                "FullKV": fullkv_answer(full, left),
                "A metrics": left.metrics,
                "B metrics": right.metrics,
                "FullKV metrics": full_metrics.get((left.task, left.sample)),
                "differ": differ,
            }
        )
    return out


def differing(store: Store, run_a: str, run_b: str) -> dict[str, list[dict[str, Any]]]:
    """Per task both runs have, the samples where their answers or metrics differ (`side_by_side`)."""
    tasks_a = {row.task for row in store.samples(run_a)}
    tasks_b = {row.task for row in store.samples(run_b)}
    return {task: side_by_side(store, run_a, run_b, task, only_differing=True) for task in sorted(tasks_a & tasks_b)}


def one_line(text: str | Sequence[str] | None, width: int = 80) -> str:
    """Text as one printable line: a list joined by " | ", control characters escaped (a newline reads \\n, an
    escape sequence cannot reach the terminal), cut to `width` characters with an ellipsis."""
    from polykv.text import printable

    if text is None:
        return "-"
    if not isinstance(text, str):
        text = " | ".join(str(item) for item in text)
    shown = printable(text)
    return shown if len(shown) <= width else shown[: max(1, width - 1)] + "…"


def metrics_text(metrics: Mapping[str, float]) -> str:
    return " ".join(f"{name}={value:.4g}" for name, value in sorted(metrics.items()))


__all__ = [
    "AGREEMENT",
    "PERFECT",
    "answers",
    "differing",
    "failed",
    "fullkv_answer",
    "fullkv_predictions",
    "fullkv_twin",
    "is_fullkv",
    "metrics_text",
    "one_line",
    "resolve_run",
    "samples",
    "like_with_like",
    "settings_of",
    "suite_text",
    "side_by_side",
]

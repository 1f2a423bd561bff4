"""RULER's string-match metrics, its prediction post-processing and its task table (task -> family ->
metric), with the task scorer built on them.

Reproduced from NVIDIA/RULER @ c3f5e3b4: ``scripts/eval/synthetic/constants.py`` (``string_match_all``,
``string_match_part``, ``TASKS``), ``scripts/synthetic.yaml`` (task name -> family) and
``scripts/eval/evaluate.py`` (``postprocess_pred``). Read, then re-implemented; no code copied.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from .common import _refuse_string


def _check_ruler_inputs(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    _refuse_string(preds, "preds")
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions but {len(refs)} reference lists")
    if not preds:
        raise ValueError("no predictions to score")
    for ref in refs:
        _refuse_string(ref, "each refs entry")


def ruler_string_match_all(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """RULER ``string_match_all`` (``scripts/eval/synthetic/constants.py``), in [0, 100].

    Per sample: the fraction of its references r with ``r.lower() in pred.lower()`` (case-insensitive
    substring test, both sides lowercased). Score: ``round(sum(fractions) / len(preds) * 100, 2)``,
    with the builtin ``sum`` in the same order as the original.
    """
    _check_ruler_inputs(preds, refs)
    fractions = []
    for pred, ref in zip(preds, refs):
        text = pred.lower()
        fractions.append(sum(1.0 if r.lower() in text else 0.0 for r in ref) / len(ref))
    return round(sum(fractions) / len(preds) * 100, 2)


def ruler_string_match_part(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """RULER ``string_match_part`` (``scripts/eval/synthetic/constants.py``), in [0, 100].

    Per sample: 1.0 if ANY of its references occurs in the prediction (case-insensitive substring),
    else 0.0. Score: ``round(sum(per_sample) / len(preds) * 100, 2)``.
    """
    _check_ruler_inputs(preds, refs)
    hits = []
    for pred, ref in zip(preds, refs):
        text = pred.lower()
        hits.append(max(1.0 if r.lower() in text else 0.0 for r in ref))
    return round(sum(hits) / len(preds) * 100, 2)


_CONTROL_CHARS = re.compile(r"[\x00-\x1f]")


def ruler_postprocess_pred(pred: str) -> str:
    """RULER's ``postprocess_pred`` (``scripts/eval/evaluate.py``), applied to every prediction before
    its metric: strip, replace each control character \\x00-\\x1f (newlines and tabs included) by
    "\\n", strip again."""
    return _CONTROL_CHARS.sub("\n", pred.strip()).strip()


#: ``scripts/eval/synthetic/constants.py: TASKS`` — RULER task family -> metric.
RULER_METRICS: dict[str, Callable[[Sequence[str], Sequence[Sequence[str]]], float]] = {
    "niah": ruler_string_match_all,
    "variable_tracking": ruler_string_match_all,
    "common_words_extraction": ruler_string_match_all,
    "freq_words_extraction": ruler_string_match_all,
    "qa": ruler_string_match_part,
}

#: ``scripts/synthetic.yaml`` — the 13 standard RULER tasks and their family.
RULER_TASKS: dict[str, str] = {
    "niah_single_1": "niah",
    "niah_single_2": "niah",
    "niah_single_3": "niah",
    "niah_multikey_1": "niah",
    "niah_multikey_2": "niah",
    "niah_multikey_3": "niah",
    "niah_multivalue": "niah",
    "niah_multiquery": "niah",
    "vt": "variable_tracking",
    "cwe": "common_words_extraction",
    "fwe": "freq_words_extraction",
    "qa_1": "qa",
    "qa_2": "qa",
}


def ruler_metric(task: str) -> Callable[[Sequence[str], Sequence[Sequence[str]]], float]:
    """The RULER metric of a task: a standard task name (``RULER_TASKS``), a family name
    (``RULER_METRICS``), or any other ``niah_*`` (string_match_all) / ``qa_*`` (string_match_part)."""
    family = RULER_TASKS.get(task, task)
    if family not in RULER_METRICS:
        if task.startswith("niah_"):
            family = "niah"
        elif task.startswith("qa_"):
            family = "qa"
        else:
            raise ValueError(
                f"unknown RULER task {task!r}; known: {sorted(RULER_TASKS)} or families {sorted(RULER_METRICS)}"
            )
    return RULER_METRICS[family]


def ruler_score(
    task: str,
    preds: Sequence[str],
    refs: Sequence[Sequence[str]],
    postprocess: bool = True,
) -> float:
    """A RULER task score in [0, 100] as ``scripts/eval/evaluate.py`` computes it: each prediction
    through ``ruler_postprocess_pred`` (unless ``postprocess=False``), then the task's metric."""
    _refuse_string(preds, "preds")
    metric = ruler_metric(task)
    if postprocess:
        preds = [ruler_postprocess_pred(p) for p in preds]
    return metric(preds, refs)

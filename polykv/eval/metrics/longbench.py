"""LongBench (v1)'s per-prediction metrics and its task scorer: token F1 (English and Chinese), ROUGE-L,
few-shot classification, passage retrieval and counting, code similarity, and ``dataset2metric``.

Reproduced from THUDM/LongBench @ 2e00731f, ``LongBench/metrics.py`` and ``LongBench/eval.py`` (read,
then re-implemented; no code copied); the quirks kept on purpose are listed in the package docstring.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from rapidfuzz import fuzz
from rouge import Rouge

from .common import (
    Metric,
    _jieba_tokens,
    _refuse_string,
    normalize_answer,
    normalize_zh_answer,
)

# --------------------------------------------------------------------------------------------------
# Token F1 (QA)
# --------------------------------------------------------------------------------------------------


def f1_score(prediction: Sequence[str], ground_truth: Sequence[str], **kwargs: Any) -> float:
    """Bag-of-tokens F1 (``LongBench/metrics.py: f1_score``).

    ``common`` is the multiset intersection of the two token lists; 0 when it is empty, else
    P = common / len(prediction), R = common / len(ground_truth), F1 = 2PR / (P + R).
    """
    num_same = sum((Counter(prediction) & Counter(ground_truth)).values())
    if num_same == 0:
        return 0.0
    precision = 1.0 * num_same / len(prediction)
    recall = 1.0 * num_same / len(ground_truth)
    return (2 * precision * recall) / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """English QA F1 (``LongBench/metrics.py: qa_f1_score``): ``f1_score`` on the whitespace tokens of
    ``normalize_answer(prediction)`` and ``normalize_answer(ground_truth)``."""
    return f1_score(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def qa_f1_zh_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """Chinese QA F1 (``LongBench/metrics.py: qa_f1_zh_score``).

    Segment both strings with jieba, normalise EACH token with ``normalize_zh_answer``, drop the
    tokens that became empty (punctuation, spaces), then ``f1_score`` on the token lists.
    """

    def tokens(text: str) -> list[str]:
        normalised = (normalize_zh_answer(tok) for tok in _jieba_tokens(text))
        return [tok for tok in normalised if tok]

    return f1_score(tokens(prediction), tokens(ground_truth))


# --------------------------------------------------------------------------------------------------
# ROUGE-L (summarisation)
# --------------------------------------------------------------------------------------------------


def rouge_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """ROUGE-L F (``LongBench/metrics.py: rouge_score``): ``Rouge().get_scores([prediction],
    [ground_truth], avg=True)["rouge-l"]["f"]`` of the ``rouge`` package (pypi ``rouge`` 1.0.x), and
    0.0 if that raises.

    What the package computes (``rouge/rouge_score.py: rouge_l_summary_level``): each text is split
    into sentences on "." (empty pieces dropped, whitespace collapsed); with the default
    ``exclusive=True`` words are counted as SETS: m = number of distinct reference words, n = number of
    distinct prediction words, and the union over reference sentences of the words of one
    reconstructed LCS against each prediction sentence gives ``llcs``. R = llcs / m, P = llcs / n,
    F = 2PR / (P + R + 1e-8) (so a perfect match scores 0.99999999..., not 1).

    Raises caught here (score 0.0): an empty prediction or reference ("Hypothesis is empty."), one
    made only of "." characters, and ``RecursionError`` from the package's recursive LCS
    reconstruction, whose depth grows with the word counts of a reference sentence and a prediction
    sentence: with the default recursion limit of 1000, two identical "."-free 1000-word texts
    score 0.0 while 700-word ones score 0.99999999. The threshold depends on the recursion limit and
    the current stack depth, exactly as in the original; it matters mostly for dureader and vcsum,
    whose Chinese text has no ASCII "." and so is one long sentence.
    """
    try:
        scores = Rouge().get_scores([prediction], [ground_truth], avg=True)
    except Exception:  # noqa: BLE001 - the original returns 0.0 on any failure
        return 0.0
    return scores["rouge-l"]["f"]


def rouge_zh_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """Chinese ROUGE-L (``LongBench/metrics.py: rouge_zh_score``): ``rouge_score`` on the jieba tokens
    of each string joined by single spaces. No normalisation: punctuation tokens count as words,
    and only the ASCII "." splits sentences ("。" does not, so a whole answer is one sentence)."""
    return rouge_score(" ".join(_jieba_tokens(prediction)), " ".join(_jieba_tokens(ground_truth)))


# --------------------------------------------------------------------------------------------------
# Classification, retrieval, counting
# --------------------------------------------------------------------------------------------------


def classification_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """Few-shot classification (trec, lsht) (``LongBench/metrics.py: classification_score``).

    ``kwargs["all_classes"]`` is required. Rule:
      1. ``matched`` = the classes (in ``all_classes`` order) that occur as SUBSTRINGS of the
         prediction;
      2. a matched class that is a substring of the ground truth without being equal to it is
         dropped (e.g. "Animal" when the answer is "Animal species");
      3. the score is ``1 / len(matched)`` if the ground truth is still in ``matched``, else 0.

    Quirk reproduced: the original removes from the list it is iterating over, so after a drop the
    next class in ``matched`` is skipped and never considered for dropping. With ``all_classes =
    ["a", "b", "abc"]``, prediction "abc", ground truth "abc": "a" is dropped, "b" is skipped (kept,
    though it is in "abc"), so the score is 1/2, not 1.
    """
    all_classes: Iterable[str] = kwargs["all_classes"]
    matched = [name for name in all_classes if name in prediction]
    # Walk by index the way CPython's list iterator does: the index advances after every step,
    # removal included, so the element that slides into the current slot is skipped.
    i = 0
    while i < len(matched):
        term = matched[i]
        if term in ground_truth and term != ground_truth:
            matched.remove(term)  # first equal element, as list.remove does in the original
        i += 1
    if ground_truth in matched:
        return 1.0 / len(matched)
    return 0.0


_NUMBER = re.compile(r"\d+")
_PARAGRAPH_EN = re.compile(r"Paragraph (\d+)")
_PARAGRAPH_ZH = re.compile(r"段落(\d+)")


def _share_equal_to(prediction: str, target: str) -> float:
    """Fraction of the digit runs (``\\d+``) of ``prediction`` equal to ``target``; 0.0 if none."""
    numbers = _NUMBER.findall(prediction)
    if not numbers:
        return 0.0
    return float(sum(1 for number in numbers if number == target) / len(numbers))


def retrieval_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """passage_retrieval_en (``LongBench/metrics.py: retrieval_score``).

    The target id is the first ``Paragraph (\\d+)`` in the ground truth (``IndexError`` if there is
    none, as in the original); the score is the share of ALL digit runs in the prediction equal to
    it: "Paragraph 3, not Paragraph 12" against "Paragraph 3" scores 1/2.
    """
    return _share_equal_to(prediction, _PARAGRAPH_EN.findall(ground_truth)[0])


def retrieval_zh_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """passage_retrieval_zh (``LongBench/metrics.py: retrieval_zh_score``): as ``retrieval_score``
    with the target id taken from the first ``段落(\\d+)`` of the ground truth."""
    return _share_equal_to(prediction, _PARAGRAPH_ZH.findall(ground_truth)[0])


def count_score(prediction: str, ground_truth: str, **kwargs: Any) -> float:
    """passage_count (``LongBench/metrics.py: count_score``): the share of the digit runs in the
    prediction equal to ``str(ground_truth)``; 0.0 if the prediction has no digits."""
    return _share_equal_to(prediction, str(ground_truth))


# --------------------------------------------------------------------------------------------------
# Code similarity
# --------------------------------------------------------------------------------------------------

_CODE_MARKERS = ("`", "#", "//")


def _first_code_line(prediction: str) -> str:
    """LongBench's line pick for code completion: drop leading newlines, split on "\\n", take the
    first line that contains none of "`", "#", "//" (anywhere in the line); "" if there is none.
    Lines are not stripped, and a blank line counts as a code line."""
    for line in prediction.lstrip("\n").split("\n"):
        if not any(marker in line for marker in _CODE_MARKERS):
            return line
    return ""


def _fuzzywuzzy_ratio(s1: str, s2: str, matcher: str = "levenshtein") -> int:
    """fuzzywuzzy 0.18's ``fuzz.ratio``: 100 for equal strings, 0 if either is empty, otherwise
    ``int(round(100 * SequenceMatcher(None, s1, s2).ratio()))`` (round half to even).

    fuzzywuzzy's SequenceMatcher is python-Levenshtein's when that package is installed
    (``matcher="levenshtein"``: the Indel similarity (len1 + len2 - indel distance) / (len1 + len2),
    which is what ``rapidfuzz.fuzz.ratio`` returns, times 100) and otherwise the standard library's
    ``difflib.SequenceMatcher`` (``matcher="difflib"``: 2 * matched characters / (len1 + len2) with
    difflib's greedy longest-block matching and its autojunk heuristic). The two often differ.
    """
    if s1 == s2:
        return 100
    if not s1 or not s2:
        return 0
    if matcher == "levenshtein":
        percent = fuzz.ratio(s1, s2)
    elif matcher == "difflib":
        percent = 100 * difflib.SequenceMatcher(None, s1, s2).ratio()
    else:
        raise ValueError(f"matcher must be 'levenshtein' or 'difflib', not {matcher!r}")
    return round(percent)  # float -> int, half to even, as fuzzywuzzy's int(round(x))


def code_sim_score(prediction: str, ground_truth: str, *, matcher: str = "levenshtein", **kwargs: Any) -> float:
    """lcc / repobench-p (``LongBench/metrics.py: code_sim_score``).

    Take the first line of the prediction that contains no "`", "#" or "//" (leading newlines
    dropped first; "" if none), then ``fuzz.ratio(line, ground_truth) / 100`` with fuzzywuzzy's
    integer ratio, so the score is a multiple of 0.01. Note the line test is "contains", not
    "starts with": ``x = 1  # note`` is skipped, and a blank line before the code is picked (score 0).

    ``matcher`` picks the backend fuzzywuzzy would have used: "levenshtein" (default; fuzzywuzzy with
    python-Levenshtein installed, computed with ``rapidfuzz.fuzz.ratio``) or "difflib" (fuzzywuzzy
    alone, which is all that LongBench's requirements.txt installs).
    """
    line = _first_code_line(prediction)
    return _fuzzywuzzy_ratio(line, ground_truth, matcher) / 100


# --------------------------------------------------------------------------------------------------
# LongBench task table and scorer
# --------------------------------------------------------------------------------------------------

#: ``LongBench/eval.py: dataset2metric`` — the 21 LongBench tasks and their metric.
LONGBENCH_METRICS: dict[str, Metric] = {
    "narrativeqa": qa_f1_score,
    "qasper": qa_f1_score,
    "multifieldqa_en": qa_f1_score,
    "multifieldqa_zh": qa_f1_zh_score,
    "hotpotqa": qa_f1_score,
    "2wikimqa": qa_f1_score,
    "musique": qa_f1_score,
    "dureader": rouge_zh_score,
    "gov_report": rouge_score,
    "qmsum": rouge_score,
    "multi_news": rouge_score,
    "vcsum": rouge_zh_score,
    "trec": classification_score,
    "triviaqa": qa_f1_score,
    "samsum": rouge_score,
    "lsht": classification_score,
    "passage_count": count_score,
    "passage_retrieval_en": retrieval_score,
    "passage_retrieval_zh": retrieval_zh_score,
    "lcc": code_sim_score,
    "repobench-p": code_sim_score,
}

#: Tasks whose prediction ``LongBench/eval.py: scorer`` cuts to ``pred.lstrip("\n").split("\n")[0]``.
LONGBENCH_FIRST_LINE_TASKS: frozenset[str] = frozenset({"trec", "triviaqa", "samsum", "lsht"})


def _longbench_metric(task: str) -> Metric:
    try:
        return LONGBENCH_METRICS[task]
    except KeyError:
        raise ValueError(f"unknown LongBench task {task!r}; known: {sorted(LONGBENCH_METRICS)}") from None


def _as_list(items: Sequence[str] | Iterable[str], what: str) -> list[str]:
    _refuse_string(items, what)
    return list(items)


def longbench_sample_score(
    task: str,
    prediction: str,
    ground_truths: Sequence[str],
    all_classes: Sequence[str] | None = None,
) -> float:
    """One sample's score in [0, 1] under ``LongBench/eval.py: scorer``: cut the prediction at its
    first line for trec/triviaqa/samsum/lsht (after dropping leading newlines), then take the max,
    starting from 0.0, of the task's metric over the ground truths."""
    metric = _longbench_metric(task)
    if task in LONGBENCH_FIRST_LINE_TASKS:
        prediction = prediction.lstrip("\n").split("\n")[0]
    best = 0.0
    for ground_truth in _as_list(ground_truths, "each answers entry"):
        best = max(best, metric(prediction, ground_truth, all_classes=all_classes))
    return best


def longbench_score(
    task: str,
    predictions: Sequence[str],
    answers: Sequence[Sequence[str]],
    all_classes: Sequence[str] | None = None,
) -> float:
    """A LongBench task score in [0, 100] (``LongBench/eval.py: scorer``).

    ``answers[i]`` is the list of ground truths of sample i; ``all_classes`` is the task's class list
    (needed by trec and lsht). Each sample scores ``longbench_sample_score``; the task score is
    ``round(100 * total / len(predictions), 2)`` with ``total`` summed left to right from 0.0, the
    same float operations as the original.
    """
    _longbench_metric(task)
    predictions = _as_list(predictions, "predictions")
    answers = list(answers)
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions but {len(answers)} answer lists")
    if not predictions:
        raise ValueError("no predictions to score")
    total = 0.0
    for prediction, ground_truths in zip(predictions, answers):
        total += longbench_sample_score(task, prediction, ground_truths, all_classes)
    return round(100 * total / len(predictions), 2)

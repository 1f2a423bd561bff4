"""The official LongBench (v1) and RULER scoring rules, reproduced with the same behaviour.

Sources (read, then re-implemented here; no code copied):
  LongBench  THUDM/LongBench @ 2e00731f, ``LongBench/metrics.py`` (the per-prediction metrics) and
             ``LongBench/eval.py`` (``dataset2metric`` and ``scorer``). The repository's top-level
             ``eval.py`` is LongBench v2 (multiple choice) and is NOT what is reproduced here.
  RULER      NVIDIA/RULER @ c3f5e3b4, ``scripts/eval/synthetic/constants.py`` (``string_match_all``,
             ``string_match_part``, ``TASKS``), ``scripts/synthetic.yaml`` (task name -> family) and
             ``scripts/eval/evaluate.py`` (``postprocess_pred``).

Per-prediction LongBench metrics keep LongBench's names and the signature
``metric(prediction, ground_truth, **kwargs) -> float`` (a value in [0, 1]); ``kwargs`` carries
``all_classes`` for ``classification_score`` and is ignored by the others.

Quirks of the originals that are reproduced on purpose (they change scores):
  * ``classification_score`` drops matched classes while iterating over the same list, so the class
    right after a dropped one is never checked for dropping (see its docstring).
  * ``code_sim_score`` skips every line that CONTAINS (not: starts with) a backtick, ``#`` or ``//``,
    and does not skip blank lines in the middle of the prediction.
  * ``code_sim_score`` uses fuzzywuzzy's ``fuzz.ratio``: an int, ``int(round(100 * ratio))`` with
    Python's round-half-to-even, so 62.5 -> 62 and 87.5 -> 88.
  * ``rouge_score`` is the ``rouge`` package's summary-level ROUGE-L (text split into sentences on
    ".", words counted as SETS, F = 2PR / (P + R + 1e-8)); any exception gives 0.0.
  * ``longbench_score`` cuts trec / triviaqa / samsum / lsht predictions at their first line.

Deliberate deviations, for inputs the originals mishandle silently or never see:
  * mismatched or empty prediction/answer lists raise ``ValueError`` (the originals truncate with
    ``zip`` or divide by zero); a bare string where a list of answers is expected raises
    ``TypeError`` (the originals would iterate over its characters);
  * ``rouge_score`` catches ``Exception`` rather than everything (a bare ``except:`` would also
    swallow ``KeyboardInterrupt``);
  * ``f1_score`` returns ``0.0`` rather than the int ``0`` when nothing overlaps (same value).
"""

from __future__ import annotations

import difflib
import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jieba
from rapidfuzz import fuzz
from rouge import Rouge

__all__ = [
    "LONGBENCH_FIRST_LINE_TASKS",
    "LONGBENCH_METRICS",
    "RULER_METRICS",
    "RULER_TASKS",
    "classification_score",
    "code_sim_score",
    "count_score",
    "f1_score",
    "longbench_sample_score",
    "longbench_score",
    "normalize_answer",
    "normalize_zh_answer",
    "qa_f1_score",
    "qa_f1_zh_score",
    "retrieval_score",
    "retrieval_zh_score",
    "rouge_score",
    "rouge_zh_score",
    "ruler_metric",
    "ruler_postprocess_pred",
    "ruler_score",
    "ruler_string_match_all",
    "ruler_string_match_part",
]

Metric = Callable[..., float]

# --------------------------------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------------------------------

_ASCII_PUNCTUATION = frozenset(string.punctuation)
# The Chinese / full-width punctuation that LongBench's normalize_zh_answer removes on top of ASCII
# punctuation (the same 64 characters as its `cn_punctuation`, the ASCII "." included).
_CN_PUNCTUATION = (
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】"
    "〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."
)
_ZH_PUNCTUATION = _ASCII_PUNCTUATION | frozenset(_CN_PUNCTUATION)
_ARTICLE = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """LongBench's English normalisation (``LongBench/metrics.py: normalize_answer``).

    In this order: lowercase; delete every ASCII punctuation character (``string.punctuation``);
    replace the whole words ``a``, ``an``, ``the`` by a space (regex ``\\b(a|an|the)\\b``, so
    "anna" and "then" stay); collapse all whitespace runs to single spaces and strip.
    """
    text = "".join(ch for ch in s.lower() if ch not in _ASCII_PUNCTUATION)
    text = _ARTICLE.sub(" ", text)
    return " ".join(text.split())


def normalize_zh_answer(s: str) -> str:
    """LongBench's Chinese normalisation (``LongBench/metrics.py: normalize_zh_answer``).

    Lowercase; delete ASCII punctuation and the Chinese/full-width punctuation list; delete ALL
    whitespace (the pieces are joined with ``""``, not ``" "``). No article removal.
    """
    text = "".join(ch for ch in s.lower() if ch not in _ZH_PUNCTUATION)
    return "".join(text.split())


def _jieba_tokens(text: str) -> list[str]:
    """``jieba.cut(text, cut_all=False)`` (accurate mode, HMM on) as a list, as LongBench calls it."""
    return list(jieba.cut(text, cut_all=False))


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


def code_sim_score(
    prediction: str, ground_truth: str, *, matcher: str = "levenshtein", **kwargs: Any
) -> float:
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
        raise ValueError(
            f"unknown LongBench task {task!r}; known: {sorted(LONGBENCH_METRICS)}"
        ) from None


def _as_list(items: Sequence[str] | Iterable[str], what: str) -> list[str]:
    if isinstance(items, str):
        raise TypeError(f"{what} must be a list of strings, not a string")
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


# --------------------------------------------------------------------------------------------------
# RULER
# --------------------------------------------------------------------------------------------------


def _check_ruler_inputs(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    if isinstance(preds, str):
        raise TypeError("preds must be a list of strings, not a string")
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions but {len(refs)} reference lists")
    if not preds:
        raise ValueError("no predictions to score")
    for ref in refs:
        if isinstance(ref, str):
            raise TypeError("each refs entry must be a list of strings, not a string")


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
                f"unknown RULER task {task!r}; known: {sorted(RULER_TASKS)} "
                f"or families {sorted(RULER_METRICS)}"
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
    if isinstance(preds, str):
        raise TypeError("preds must be a list of strings, not a string")
    metric = ruler_metric(task)
    if postprocess:
        preds = [ruler_postprocess_pred(p) for p in preds]
    return metric(preds, refs)

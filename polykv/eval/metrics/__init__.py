"""The official LongBench (v1) and RULER scoring rules, reproduced with the same behaviour.

Papers: Yushi Bai et al., "LongBench: A Bilingual, Multitask Benchmark for Long Context
Understanding", ACL 2024; Cheng-Ping Hsieh et al., "RULER: What's the Real Context Size of Your
Long-Context Language Models?", COLM 2024 (arXiv:2404.06654).

Modules: ``longbench`` (LongBench's metrics and scorer), ``ruler`` (RULER's string-match metrics,
post-processing and scorer) and ``common`` (the normalisation and input checks they share). Every
name is re-exported here, so ``from polykv.eval.metrics import ...`` is the way to use them.

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

# Metric (the type of a per-prediction metric) is importable from here but, as before, not in __all__.
from .common import Metric as Metric
from .common import normalize_answer, normalize_zh_answer
from .longbench import (
    LONGBENCH_FIRST_LINE_TASKS,
    LONGBENCH_METRICS,
    classification_score,
    code_sim_score,
    count_score,
    f1_score,
    longbench_sample_score,
    longbench_score,
    qa_f1_score,
    qa_f1_zh_score,
    retrieval_score,
    retrieval_zh_score,
    rouge_score,
    rouge_zh_score,
)
from .ruler import (
    RULER_METRICS,
    RULER_TASKS,
    ruler_metric,
    ruler_postprocess_pred,
    ruler_score,
    ruler_string_match_all,
    ruler_string_match_part,
)

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

"""What the LongBench and RULER metrics share: LongBench's answer normalisation (English and Chinese),
jieba segmentation, the metric type and the check that a list of strings is not a bare string.

Normalisation follows THUDM/LongBench @ 2e00731f, ``LongBench/metrics.py`` (read, then
re-implemented; no code copied).
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from typing import Any

import jieba

#: A per-prediction metric: ``metric(prediction, ground_truth, **kwargs) -> float``.
Metric = Callable[..., float]

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


def _refuse_string(items: Any, what: str) -> None:
    """A bare string where a list of strings belongs is a ``TypeError`` (iterating over it would give
    its characters)."""
    if isinstance(items, str):
        raise TypeError(f"{what} must be a list of strings, not a string")

"""FullKV: keep every token (the reference every method is measured against)."""

from __future__ import annotations

from polykv.methods.base import Method
from polykv.plan import Phase


class Full(Method):
    """Keep every key and value; the cache grows by one slot per token. Takes no capacity."""

    name = "full"
    colour = "#BBBBBB"
    phases = frozenset({Phase.PREFILL, Phase.DECODE})
    passive = True

"""What a method's step returns (`Eviction`: the slots kept, or the one dropped) and how most methods choose it:
keep the highest scores (`keep_top`, `evict_lowest`), with protected slots always kept and a local layer's hidden
padding first to go. A head-level budget rule (`polykv.methods.head_budgets`) reads the ranking a method's cut made
here (`recorded_rankings`): every method that keeps the top of a score goes through these two functions."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from polykv.lazy import torch
from polykv.plan import Phase


@dataclass
class Eviction:
    """Slots to keep per KV head (ascending), or the one slot to drop."""

    keep: torch.Tensor | None = None  # [b, h, k] int64
    dropped: torch.Tensor | None = None  # [b, h, 1] int64: the single slot evicted (the usual decode step)
    # the method left this one-slot eviction's merge to the runtime, as `LayerView.defer_merge` allowed
    # (`Method.merge_together`); the slots and the method's per-slot state then move after that merge
    merge_deferred: bool = False
    # [b, h, k] bool, or None: kept slots that hold no token, only room (heads keep different numbers of tokens under
    # a head-level budget, `polykv.methods.head_budgets`, and storage is rectangular); no query may see them
    padding: torch.Tensor | None = None

    def kept_mask(self, length: int) -> torch.Tensor:
        """Boolean [b, h, n]: which slots stay."""
        index = self.keep if self.keep is not None else self.dropped
        marks = torch.zeros(*index.shape[:2], length, dtype=torch.bool, device=index.device)
        if self.keep is not None:
            return marks.scatter_(-1, self.keep, True)
        return ~marks.scatter_(-1, self.dropped, True)


def keep_top(
    scores: torch.Tensor, k: int, protected: torch.Tensor | None = None, hidden: torch.Tensor | None = None
) -> torch.Tensor:
    """Indices of the k highest scores per row (protected slots always kept, `hidden` ones first to go: a local
    layer's padding, `LayerView.hidden`), ascending."""
    ranked = _ranked(scores, protected, hidden)
    _record(ranked, k)
    return ranked.topk(k, dim=-1).indices.sort(dim=-1).values


def evict_lowest(
    scores: torch.Tensor, k: int, protected: torch.Tensor | None = None, hidden: torch.Tensor | None = None
) -> Eviction:
    """Keep the k highest-scoring slots of each [b, h, n] row; one argmin when a single slot goes."""
    if scores.shape[-1] - k != 1:
        return Eviction(keep=keep_top(scores, k, protected, hidden))
    ranked = _ranked(scores, protected, hidden)
    _record(ranked, k)
    return Eviction(dropped=ranked.argmin(dim=-1, keepdim=True))


def prompt_cut(scores: torch.Tensor, k: int, phase, hidden: torch.Tensor | None = None) -> Eviction:
    """`evict_lowest`, but a prompt's cut always by top-k, also when one slot goes: as kvpress's `ScorerPress`
    chooses, so that tied scores go the same way (argmin and top-k may break a tie differently)."""
    if phase is Phase.PREFILL:
        return Eviction(keep=keep_top(scores, k, hidden=hidden))
    return evict_lowest(scores, k, hidden=hidden)


def _ranked(scores: torch.Tensor, protected: torch.Tensor | None, hidden: torch.Tensor | None) -> torch.Tensor:
    if protected is not None:
        scores = scores.masked_fill(protected, float("inf"))
    if hidden is not None:  # no query can see them: they go before anything the method would keep
        scores = scores.masked_fill(hidden, float("-inf"))
    return scores


# The rankings of the cuts made while a head-level rule listens (`recorded_rankings`), else None: a method's step
# then runs as always, and the rule re-chooses from the very scores the method ranked.
_listening: ContextVar[list | None] = ContextVar("polykv_rankings", default=None)


@contextmanager
def recorded_rankings() -> Iterator[list[tuple[torch.Tensor, int]]]:
    """Inside the block, every cut by `keep_top` / `evict_lowest` appends (ranked scores [b, h or 1, n] with +inf
    for protected slots and -inf for hidden ones, the k it kept) to the yielded list."""
    found: list[tuple[torch.Tensor, int]] = []
    token = _listening.set(found)
    try:
        yield found
    finally:
        _listening.reset(token)


def _record(ranked: torch.Tensor, k: int) -> None:
    found = _listening.get()
    if found is not None:
        found.append((ranked, k))

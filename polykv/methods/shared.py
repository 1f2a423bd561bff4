"""What several methods share beyond the contract: the accumulated-attention score of H2O and D2O
(`AccumulatedAttention`), the integer split of a budget over layers (`split_total`, `within_bounds` on a model with
local layers), recency (`recent_mask`)."""

from __future__ import annotations

from collections.abc import Sequence

from polykv.lazy import torch
from polykv.methods.base import COLUMN_SUMS, LayerView, Method, Needs
from polykv.plan import Phase


class AccumulatedAttention(Method):
    """A method whose per-slot `score` is the attention the slot has received, summed (unnormalized)
    over every query so far, per KV head (the mean of its query heads): H2O's heavy-hitter score, which
    D2O uses too. The prompt's queries count even when the method only runs in decode (they are seen
    through `observe_prefill`); a new slot starts from the attention of its own step."""

    def needs(self, phase: Phase, length: int) -> Needs:
        return COLUMN_SUMS  # scores accumulate every step, evicting or not

    def needs_from_prefill(self, length: int) -> Needs:
        return COLUMN_SUMS

    def observe_prefill(self, view: LayerView) -> None:
        self.per_token["score"] = view.grouped(view.column_sums)

    def accumulate(self, view: LayerView, restart: bool = False) -> torch.Tensor:
        """The scores after this step's attention (stored in `per_token["score"]`); `restart` drops the
        old scores (a new prompt)."""
        added = view.grouped(view.column_sums)
        old = self.per_token.get("score")
        if old is None or restart:
            score = added
        else:
            score = self.grow("score", view.num_new, 0.0).add_(added)  # new slots start from 0
        self.per_token["score"] = score
        return score


def split_total(
    weights: Sequence[float], total: int, minimum: int = 1, maximum: int | Sequence[float] | None = None
) -> list[int]:
    """Integers proportional to `weights` that sum exactly to `total`, each in [minimum, maximum] (`maximum`: one
    bound for every layer, or one per layer).

    Largest-remainder rounding; layers that hit a bound are fixed there and the rest is shared again
    among the others in proportion to their weights.
    """
    n = len(weights)
    if n == 0:
        return []
    highest = [total if maximum is None else maximum] * n if not isinstance(maximum, Sequence) else list(maximum)
    if not minimum * n <= total <= sum(highest):
        shown = highest[0] if len(set(highest)) == 1 else "per-layer bounds"
        raise ValueError(f"cannot split {total} over {n} layers within [{minimum}, {shown}] each")
    weights = [max(0.0, float(w)) for w in weights]
    fixed: dict[int, float] = {}
    share: dict[int, float] = {}
    while len(fixed) < n:
        free = [i for i in range(n) if i not in fixed]
        left = total - sum(fixed.values())
        mass = sum(weights[i] for i in free)
        share = {i: (weights[i] / mass * left if mass > 0 else left / len(free)) for i in free}
        # Water-filling: pin the layers over the maximum first, then those under the minimum, and share
        # what is left among the rest again.
        over = {i: highest[i] for i, v in share.items() if v > highest[i]}
        under = {i: minimum for i, v in share.items() if v < minimum}
        if not over and not under:
            break
        fixed.update(over or under)
    exact = [fixed.get(i, share.get(i, 0.0)) for i in range(n)]
    out = [int(v) for v in exact]  # floor (values are non-negative)
    order = sorted(range(n), key=lambda i: (exact[i] - out[i], -i), reverse=True)
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def within_bounds(capacities: list[int], bounds: list[float]) -> list[int]:
    """A split over layers that can each hold at most `bounds[i]` tokens (a local layer its window less one; inf a
    global layer): a layer given more than its bound keeps its bound, and the surplus goes to the layers under
    theirs, in proportion to what they were given and never past their bounds (largest remainders). The total is
    kept where the layers can hold it; what none can hold is dropped. Unchanged when every bound is infinite."""
    if all(c <= b for c, b in zip(capacities, bounds)):
        return list(capacities)
    return split_total(capacities, int(min(sum(capacities), sum(bounds))), minimum=0, maximum=bounds)


def recent_mask(view: LayerView, window: int, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Slots among the `window` most recent positions of each head (by true position). `positions`: the
    view's positions in another order (e.g. sorted), for a mask in that order."""
    positions = view.positions if positions is None else positions
    if view.newest is not None:  # every head holds the newest token: no reduction needed
        return positions > view.newest - window
    return positions > positions.amax(dim=-1, keepdim=True) - window

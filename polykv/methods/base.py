"""The contract between the routed cache and an eviction method.

A method is a policy for one layer and one phase. The runtime owns the tensors; a method only says
which attention signals it needs (`needs`) and, given them, which cache slots to keep (`step`).
Shapes (b = batch, h = KV heads, g = query heads per KV head, q = new tokens, n = slots):
  keys / values   [b, h, n, d]   after RoPE, the new tokens appended last; older slots are in no
                                 particular order (the runtime reuses freed slots), so rules that
                                 care about recency read `positions`
  positions       [b, h, n]      the true sequence position of every slot
  rows            [b, h*g, w, n] softmax attention of the newest w queries (fp32, causal)
  column_sums     [b, h*g, n]    attention summed over every query of the step (fp32)
Methods keep per-slot state in `self.per_token` ({name: [b, h, n, ...] tensor}); the runtime gathers
it with the cache, so scores and slots never drift apart. Merging methods (CaM, D2O) write merged
contents into kept slots of `view.keys` / `view.values` in place before returning their eviction: the
step's attention output is already computed, and those tensors are the layer's cache.

Native allocation: a method with its own layer-budget rule (PyramidKV, D2O, CAKE) sets
`native_allocation`, reports one number per layer after prefill (`allocation_statistic`) and splits a
phase's total capacity over the layers (`allocate`). In a plan with `"allocation": "native"` the
runtime defers prefill eviction until every layer has seen the prompt, then calls `allocate` and
`settle`; otherwise the plan's per-layer capacities are used as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from polykv.lazy import lazy_import
from polykv.plan import Phase

torch = lazy_import("torch")  # loaded on first use: reading the registry needs no tensor


@dataclass(frozen=True)
class Needs:
    """Attention signals a step needs; the runtime computes only these."""

    rows: int = 0  # attention rows of the newest `rows` queries
    column_sums: bool = False  # attention summed over all queries of the step

    def __or__(self, other: "Needs") -> "Needs":
        return Needs(max(self.rows, other.rows), self.column_sums or other.column_sums)

    def __bool__(self) -> bool:
        return self.rows > 0 or self.column_sums


NOTHING = Needs()


@dataclass
class LayerView:
    """One layer's cache at one step, as a method sees it."""

    phase: Phase
    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    num_new: int
    num_kv_groups: int
    rows: torch.Tensor | None = None
    column_sums: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.keys.shape[-2]

    def grouped(self, attention: torch.Tensor) -> torch.Tensor:
        """Query-head attention [b, h*g, ...] -> mean over each KV head's group [b, h, ...].

        Most papers predate GQA and score per query head; averaging the group is how kvpress and
        KVCache-Factory map those scores onto the shared KV head.
        """
        b, qh = attention.shape[:2]
        return attention.view(b, qh // self.num_kv_groups, self.num_kv_groups, *attention.shape[2:]).mean(2)


@dataclass
class Eviction:
    """Slots to keep per KV head (ascending), or the one slot to drop."""

    keep: torch.Tensor | None = None  # [b, h, k] int64
    dropped: torch.Tensor | None = None  # [b, h, 1] int64: the single slot evicted (the usual decode step)

    def kept_mask(self, length: int) -> torch.Tensor:
        """Boolean [b, h, n]: which slots stay."""
        index = self.keep if self.keep is not None else self.dropped
        marks = torch.zeros(*index.shape[:2], length, dtype=torch.bool, device=index.device)
        if self.keep is not None:
            return marks.scatter_(-1, self.keep, True)
        return ~marks.scatter_(-1, self.dropped, True)


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Method:
    """Base class: subclasses set `name`, `phases`, `Params` and override `needs` / `step`."""

    name: ClassVar[str]
    phases: ClassVar[frozenset[Phase]]
    Params: ClassVar[type[BaseModel]] = NoParams
    merges: ClassVar[bool] = False  # rewrites retained keys/values (CaM, D2O)
    native_allocation: ClassVar[bool] = False  # has its own layer-budget rule (`allocate`)
    below_capacity: ClassVar[tuple[str, ...]] = ()  # parameters that must stay under the capacity (windows)
    passive: ClassVar[bool] = False  # never needs signals nor evicts (`full`): the runtime skips it
    # Bump whenever the rule, a default or the scoring changes: profiles and run ids include it, so
    # results measured with an older rule are never reused as if they were current.
    revision: ClassVar[int] = 1

    def __init__(
        self, capacity: int | None, params: Mapping[str, Any] | BaseModel | None = None, layer_idx: int = 0
    ):
        self.capacity = capacity
        self.params = params if isinstance(params, BaseModel) else self.Params(**dict(params or {}))
        self.layer_idx = layer_idx
        self.per_token: dict[str, torch.Tensor] = {}

    # ---- what the plan validator asks ---------------------------------------------------------
    @classmethod
    def check(cls, params: Mapping[str, Any], capacity: int | None) -> list[str]:
        """Problems with these parameters, one line each, naming method, parameter and allowed range."""
        try:
            parsed = cls.Params(**dict(params))
        except ValidationError as exc:
            return [_describe_param_error(cls.name, cls.Params, e) for e in exc.errors()]
        return [f"params: {cls.name}: {p}" for p in cls.check_capacity(parsed, capacity)]

    @classmethod
    def check_capacity(cls, params: BaseModel, capacity: int | None) -> list[str]:
        """Constraints that tie parameters to the capacity (e.g. a window larger than the budget)."""
        problems = []
        for name in cls.below_capacity if capacity is not None else ():
            value = getattr(params, name)
            if value >= capacity:
                low = next((m.ge for m in cls.Params.model_fields[name].metadata if hasattr(m, "ge")), 0)
                problems.append(
                    f"{name} ({value}) must be smaller than the capacity ({capacity}); allowed range {low} .. {capacity - 1}"
                )
        return problems

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return cls.Params().model_dump()

    # ---- what the runtime calls ---------------------------------------------------------------
    def needs(self, phase: Phase, length: int) -> Needs:
        """Signals for a step that leaves `length` slots in the layer before eviction."""
        return NOTHING

    def needs_from_prefill(self, length: int) -> Needs:
        """Signals a decode-phase method wants to see during prefill (to start its state)."""
        return NOTHING

    def observe_prefill(self, view: LayerView) -> None:
        """A decode-phase method sees the prefill (before any prefill eviction)."""

    def step(self, view: LayerView) -> Eviction | None:
        """Decide what to keep; None keeps everything."""
        return None

    def over_capacity(self, view: LayerView) -> bool:
        return self.capacity is not None and view.length > self.capacity

    def settle(self) -> Eviction | None:
        """Evict to the capacity with the stored per-slot `score` (higher stays; +inf always stays).

        Methods that score once and keep the top (SnapKV, PyramidKV, CAKE) store `score` in `step`
        and return `settle()`; under native allocation the runtime calls it once budgets are known.
        """
        score = self.per_token.get("score")
        if score is None or self.capacity is None or score.shape[-1] <= self.capacity:
            return None
        return evict_lowest(score, self.capacity)

    # ---- native allocation ----------------------------------------------------------------------
    def allocation_statistic(self) -> float | None:
        """After prefill: this layer's input to the method's layer-budget rule."""
        return None

    @classmethod
    def allocate(
        cls, total: int, statistics: list[float | None], params: BaseModel, prompt_length: int | None = None
    ) -> list[int]:
        """Split `total` retained tokens over the layers by the method's own rule; sums exactly to `total`."""
        raise NotImplementedError(f"{cls.name} has no layer-budget rule of its own")


# ---- small helpers shared by methods ----------------------------------------------------------
def keep_top(scores: torch.Tensor, k: int, protected: torch.Tensor | None = None) -> torch.Tensor:
    """Indices of the k highest scores per row (protected slots always kept), ascending."""
    if protected is not None:
        scores = scores.masked_fill(protected, float("inf"))
    return scores.topk(k, dim=-1).indices.sort(dim=-1).values


def evict_lowest(scores: torch.Tensor, k: int, protected: torch.Tensor | None = None) -> Eviction:
    """Keep the k highest-scoring slots of each [b, h, n] row; one argmin when a single slot goes."""
    if scores.shape[-1] - k != 1:
        return Eviction(keep=keep_top(scores, k, protected))
    if protected is not None:
        scores = scores.masked_fill(protected, float("inf"))
    return Eviction(dropped=scores.argmin(dim=-1, keepdim=True))


def split_total(weights: list[float], total: int, minimum: int = 1, maximum: int | None = None) -> list[int]:
    """Integers proportional to `weights` that sum exactly to `total`, each in [minimum, maximum].

    Largest-remainder rounding; layers that hit a bound are fixed there and the rest is shared again
    among the others in proportion to their weights.
    """
    n = len(weights)
    if n == 0:
        return []
    hi = total if maximum is None else maximum
    if not minimum * n <= total <= hi * n:
        raise ValueError(f"cannot split {total} over {n} layers within [{minimum}, {hi}] each")
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
        over = {i: hi for i, v in share.items() if v > hi}
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


def recent_mask(view: LayerView, window: int) -> torch.Tensor:
    """Slots among the `window` most recent positions of each head (by true position)."""
    newest = view.positions.amax(dim=-1, keepdim=True)
    return view.positions > newest - window


def _describe_param_error(method: str, model: type[BaseModel], err: Mapping[str, Any]) -> str:
    loc = ".".join(str(x) for x in err.get("loc", ())) or "params"
    if err.get("type") == "extra_forbidden":
        allowed = ", ".join(model.model_fields) or "none"
        return f"params.{loc}: {method} has no parameter {loc!r} (parameters: {allowed})"
    got = f" (got {err['input']!r})" if "input" in err else ""
    return f"params.{loc}: {method}: {err.get('msg', 'invalid')}{got}"

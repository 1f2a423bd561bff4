"""The contract between the routed cache and an eviction method: the signals a step needs (`Needs`), the layer as a
step sees it (`LayerView`), and the method (`Method`). What a step returns and how most methods choose it is in
`eviction`, what several methods share in `shared`, what only the runtime's speed paths ask in `fast_paths`.

A method is a policy for one layer and one phase. The runtime owns the tensors; a method only says
which attention signals it needs (`needs`) and, given them, which cache slots to keep (`step`).
Shapes (b = batch, h = KV heads, g = query heads per KV head, q = new tokens, n = slots, d = head size):
  keys / values   [b, h, n, d]   after RoPE, the new tokens appended last; older slots are in no
                                 particular order (the runtime reuses freed slots), so rules that
                                 care about recency read `positions`
  positions       [b, h, n]      the true sequence position of every slot
  rows            [b, h*g, w, n] softmax attention of the newest w queries (fp32, causal)
  column_sums     [b, h*g, n]    attention summed over every query of the step (fp32)
  queries         [b, h*g, q, d] the step's queries before RoPE, with the layer's `rotary` embedding
Methods keep per-slot state in `self.per_token` ({name: [b, h, n, ...] tensor}); the runtime gathers
it with the cache, so scores and slots never drift apart. Merging methods (CaM, D2O) write merged
contents into kept slots of `view.keys` / `view.values` in place before returning their eviction: the
step's attention output is already computed, and those tensors are the layer's cache (such a method may
leave a one-slot merge to the runtime: `fast_paths`).

Decode steps (see the runtime): an evicting layer holds its slots in storage of capacity + interval
slots and writes each new token into a slot the last eviction freed, so a step reallocates nothing;
per-slot state grows the same way (`Method.grow`). A step's path avoids host-device synchronisation
(.item(), .tolist(), Python branches on tensor values): decisions stay on the device.
Eviction interval: a plan entry's `interval` k (decode only, default 1 = the exact per-step rule of the
papers) lets a layer grow to capacity + k slots and then evict k tokens at once, every k steps
(`Method.evicts`), as kvpress's DecodingPress does. It is an APPROXIMATION of every method's rule:
the k tokens are chosen together by one step's scores instead of one per step, the layer holds up to
k more tokens than its capacity, and CaM merges only the newest of them (as for any multi-token cut).

Native allocation: a method with its own layer-budget rule (PyramidKV, D2O, CAKE) sets
`native_allocation`, reports one number per layer after prefill (`allocation_statistic`) and splits a
phase's total capacity over the layers (`allocate`). In a plan with `"allocation": "native"` the
runtime defers prefill eviction until every layer has seen the prompt, then calls `allocate` and
`settle`; otherwise the plan's per-layer capacities are used as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError

from polykv.lazy import torch
from polykv.methods.eviction import Eviction, evict_lowest
from polykv.methods.fast_paths import FastPaths
from polykv.methods.params import NoParams, describe_param_error, over_limit, token_params
from polykv.methods.slots import SlotStates
from polykv.plan import Phase


@dataclass(frozen=True)
class Needs:
    """Attention signals a step needs; the runtime computes only these."""

    rows: int = 0  # attention rows of the newest `rows` queries
    column_sums: bool = False  # attention summed over all queries of the step
    queries: bool = False  # the step's queries before RoPE, and the layer's rotary embedding (`LayerView.queries`)

    def __or__(self, other: Needs) -> Needs:
        return Needs(max(self.rows, other.rows), self.column_sums or other.column_sums, self.queries or other.queries)

    def __bool__(self) -> bool:
        return self.rows > 0 or self.column_sums or self.queries


NOTHING = Needs()
# The signals most steps ask for, made once: needs() runs for every layer at every step.
ONE_ROW = Needs(rows=1)
COLUMN_SUMS = Needs(column_sums=True)


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
    # [b, h*g, q, d] the step's queries before RoPE (as the model's projection and norm made them), and the layer's
    # rotary embedding: positions [n] -> (cos, sin) [n, d] (what ExpectedAttention reads; `Needs.queries`)
    queries: torch.Tensor | None = None
    rotary: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    newest: int | None = None  # the newest position (the runtime knows it; None: read it from `positions`)
    # keys and values as one [2, b, h, n, d] tensor when they are the two halves of one block (static-shape
    # decode): a merging method can then gather and write both with one operation each
    kv: torch.Tensor | None = None
    # the runtime may merge this step's one-slot eviction together with other layers' (`merge_together`):
    # a method that `merges_together` may then return it unmerged, marked `merge_deferred`
    defer_merge: bool = False
    # this step's tokens are kept whatever the capacity: the question fed after a compressed context (the
    # question-agnostic protocol, `RoutedCache.keep_until`); the method updates its state and evicts nothing
    holds: bool = False
    # [b, h, n] slots no query can see any more, or None: a local layer's padding where its heads (or rows) keep
    # different numbers of tokens within the window (`RoutedLayer.keep_window`); a method evicts them first
    hidden: torch.Tensor | None = None
    fresh: bool = False  # a whole prompt over an empty cache: slot i holds position i (`attention_step.fresh_prompt`)
    # results made from this step's signals that more than one method may want ({key: result}, `once`): a
    # layer's two phase methods at the prompt, and every plan's layer on a prompt many plans share
    shared: dict = field(default_factory=dict)

    @property
    def length(self) -> int:
        return self.keys.shape[-2]

    def once(self, key: tuple, make):
        """`make()`, made once per step for every method that asks with the same `key` (which names the method
        and every parameter the result depends on): the same numbers whoever asks. Do not change it in place."""
        key = (key, self.phase, self.length, id(self.rows), id(self.column_sums))  # the very signals it is made of
        result = self.shared.get(key)
        if result is None:
            result = self.shared[key] = make()
        return result

    def grouped(self, attention: torch.Tensor) -> torch.Tensor:
        """Query-head attention [b, h*g, ...] -> mean over each KV head's group [b, h, ...].

        Most papers predate GQA and score per query head; averaging the group is how kvpress and
        KVCache-Factory map those scores onto the shared KV head.
        """
        b, qh = attention.shape[:2]
        g = self.num_kv_groups
        if g == 1:  # one query head per KV head: the mean is a copy
            return attention.clone()
        # the sum divided by g: the same numbers as .mean(2), at about half its cost on small decode rows
        return attention.view(b, qh // g, g, *attention.shape[2:]).sum(2).div_(g)


class Method(FastPaths):
    """Base class: subclasses set `name`, `phases`, `Params` and override `needs` / `step`."""

    name: ClassVar[str]
    phases: ClassVar[frozenset[Phase]]
    Params: ClassVar[type[BaseModel]] = NoParams
    merges: ClassVar[bool] = False  # rewrites retained keys/values (CaM, D2O)
    native_allocation: ClassVar[bool] = False  # has its own layer-budget rule (`allocate`)
    below_capacity: ClassVar[tuple[str, ...]] = ()  # parameters that must stay under the capacity (windows)
    passive: ClassVar[bool] = False  # never needs signals nor evicts (`full`): the runtime skips it
    # Bump whenever the rule, a default or the scoring changes: profiles and run ids include it, so results
    # measured with an older rule are never reused as if they were current.
    revision: ClassVar[int] = 1
    colour: ClassVar[str] = "#999999"  # in every chart (hex, unique among the methods): stable pictures
    # As a standalone baseline (its authors' protocol, `polykv.eval.method_protocols`): the phases it is active in
    standalone: ClassVar[frozenset[Phase] | None] = None  # None: every phase it can run in
    standalone_source: ClassVar[str] = ""  # where that rule comes from
    phase_refusal: ClassVar[str] = ""  # why the rule does not extend to the phase it lacks (said when refused)

    def __init__(
        self,
        capacity: int | None,
        params: Mapping[str, Any] | BaseModel | None = None,
        layer_idx: int = 0,
        interval: int = 1,
    ):
        self.capacity = capacity
        self.interval = interval  # decode: evict every `interval` steps, down to the capacity
        self.params = params if isinstance(params, BaseModel) else self.Params(**dict(params or {}))
        self.layer_idx = layer_idx
        self.per_token = SlotStates()  # {name: [b, h, n, ...] tensor}, and the blocks they live in

    # ---- what the plan validator asks ---------------------------------------------------------
    @classmethod
    def check(cls, params: Mapping[str, Any], capacity: int | None, context_length: int | None = None) -> list[str]:
        """Problems with these parameters, one line each, naming method, parameter and allowed range.

        `context_length` (the model's context in tokens, None: unknown) bounds the token counts."""
        try:
            parsed = cls.Params(**dict(params))
        except ValidationError as exc:
            return [describe_param_error(cls.name, cls.Params, e) for e in exc.errors()]
        problems = cls.check_capacity(parsed, capacity)
        if context_length is not None:
            problems += cls.check_context(parsed, context_length)
        return [f"params: {cls.name}: {p}" for p in problems]

    @classmethod
    def token_params(cls) -> tuple[str, ...]:
        """The parameters that count tokens (windows, sinks, histories, kernels)."""
        return token_params(cls.Params)

    @classmethod
    def check_context(cls, params: BaseModel, context_length: int) -> list[str]:
        """Token counts longer than the model's context."""
        return cls._over(
            params, cls.token_params(), context_length, f"at most the model's context ({context_length} tokens)"
        )

    @classmethod
    def check_capacity(cls, params: BaseModel, capacity: int | None) -> list[str]:
        """Constraints that tie parameters to the capacity (e.g. a window larger than the budget)."""
        if capacity is None:
            return []
        return cls._over(params, cls.below_capacity, capacity - 1, f"smaller than the capacity ({capacity})")

    @classmethod
    def least_capacity(cls, params: BaseModel) -> int:
        """The smallest capacity these parameters run at: 1 + the largest `below_capacity` parameter."""
        return 1 + max((getattr(params, name) for name in cls.below_capacity), default=0)

    @classmethod
    def fit(cls, params: Mapping[str, Any], capacity: int) -> dict[str, Any]:
        """`params` with every `below_capacity` parameter that would not fit under `capacity` shrunk to a quarter
        of it (`polykv.methods.params_that_fit`)."""
        out, defaults = dict(params), cls.defaults()
        for name in cls.below_capacity:
            if out.get(name, defaults[name]) >= capacity:
                out[name] = max(1, capacity // 4)
        return out

    @classmethod
    def _over(cls, params: BaseModel, names: tuple[str, ...], highest: int, rule: str) -> list[str]:
        return over_limit(cls.Params, params, names, highest, rule)

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
        """Does this step evict (down to the capacity)? Never on a step the runtime holds (`LayerView.holds`)."""
        return not view.holds and self.evicts(view.phase, view.length)

    def evicts(self, phase: Phase, length: int) -> bool:
        """Does a step that leaves `length` slots before eviction evict? Over the capacity, or in decode
        with an interval k > 1, at capacity + k: k tokens then go at once, every k steps."""
        if self.capacity is None:
            return False
        return length > self.capacity + (self.interval - 1 if phase is Phase.DECODE else 0)

    def grow(self, name: str, q: int, fill: float | bool | None = None) -> torch.Tensor:
        """`per_token[name]` extended by q new (last) slots set to `fill` (None: for the caller to write),
        stored back and returned; in place, in a block of capacity + interval slots (`SlotStates.grow`)."""
        return self.per_token.grow(name, q, fill, None if self.capacity is None else self.capacity + self.interval)

    def forget(self) -> None:
        """Drop every per-slot state and its storage (a new prompt, or the prefill method once done)."""
        self.per_token.clear()

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

"""CAKE: cascading, adaptive budgets from each layer's attention dispersion.

Qin, Cao, Lin, Hu, Fan, Cheng, Lin, Li. "CAKE: Cascading and Adaptive KV Cache Eviction with Layer
Preferences." ICLR 2025 (code: antgroup/cakekv).
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from polykv.methods.base import Eviction, LayerView, Method, Needs, evict_lowest, recent_mask, split_total
from polykv.methods.snapkv import pool_votes
from polykv.plan import Phase


class CAKEParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(default=32, ge=1, description="observation window, always kept")
    gamma: float = Field(default=200.0, ge=0.0, description="weight of the attention variance in the indicator")
    tau1: float = Field(default=1.0, gt=0.0, description="temperature of the spatial dispersion (entropy)")
    tau2: float = Field(default=1.0, gt=0.0, description="temperature of the temporal dispersion (variance)")
    kernel_size: int = Field(default=5, ge=1, description="avg pooling of the indicator along the keys")


class CAKE(Method):
    """Evict by mean + gamma * variance of the window's attention; budgets follow layer preferences.

    Prefill, with the last w queries' softmax attention A over the prompt and W = A restricted to the
    prefix keys: the eviction indicator of prefix token j is I_j = mean_q A[q, j] + gamma * var_q A[q, j]
    (unbiased variance over the w queries), avg-pooled along the keys (kernel 5) and averaged over the
    query heads of each KV head; the window always stays. Decode: when a layer exceeds its capacity,
    the current query's attention (pooled, group-averaged) scores the non-window tokens and the lowest
    goes; the w most recent tokens stay (the authors' decode rule: no variance term, no accumulation).
    Layer rule (native allocation): spatial dispersion H_l = -sum W log W (entropy, summed over heads,
    queries and keys), temporal dispersion V_l = sum of var_q W, preference P_l = H_l^(1/tau1) *
    V_l^(1/tau2); prefix budgets are proportional to P_l, capped at n - w with the excess shared among
    the other layers, and sum exactly to L*(C - w); each layer keeps its budget + w. Prompts of at most
    C + w tokens get uniform budgets. The authors allocate in a cascade during prefill to bound peak
    memory; because budgets only shrink and top-k sets are nested, allocating once after the last layer
    (as we do) keeps the same tokens. Defaults window 32, gamma 200, tau1 = tau2 = 1, kernel 5
    (pred_cake.py; the authors tune tau per model, e.g. 1.6 / 0.4 for Llama-3.1-8B at C = 1024).
    """

    name = "cake"
    phases = frozenset({Phase.PREFILL, Phase.DECODE})
    Params = CAKEParams
    below_capacity = ("window",)
    native_allocation = True

    def __init__(self, capacity, params=None, layer_idx=0):
        super().__init__(capacity, params, layer_idx)
        self.preference: float | None = None

    def needs(self, phase: Phase, length: int) -> Needs:
        over = self.capacity is None or length > self.capacity
        if not over:
            return Needs()
        return Needs(rows=self.params.window if phase is Phase.PREFILL else 1)

    def needs_from_prefill(self, length: int) -> Needs:
        return Needs(rows=self.params.window)  # the layer preference comes from the prompt's window

    def observe_prefill(self, view: LayerView) -> None:
        self.preference = self._preference(view)

    def step(self, view: LayerView) -> Eviction | None:
        if view.rows is None:
            return None
        if view.phase is Phase.PREFILL:
            self.preference = self._preference(view)
            self.per_token["score"] = self._prefill_indicator(view)
            return self.settle()
        if not self.over_capacity(view):
            return None
        # Averaging the group before pooling equals pooling first (both are linear), and lets the
        # pooling follow each KV head's slot positions.
        score = pool_votes(view.grouped(view.rows[:, :, -1, :]), self.params.kernel_size, "avg", view.positions)
        return evict_lowest(score, self.capacity, protected=recent_mask(view, self.params.window))

    def allocation_statistic(self) -> float | None:
        return self.preference

    def _prefill_indicator(self, view: LayerView) -> torch.Tensor:
        n, w = view.length, min(self.params.window, view.length)
        window_rows = view.rows[..., : n - w]  # [b, qh, w, n - w]: the window's attention to the prefix
        indicator = window_rows.mean(dim=2) + self.params.gamma * _variance(window_rows)
        indicator = view.grouped(pool_votes(indicator, self.params.kernel_size, "avg"))
        return torch.cat([indicator, indicator.new_full((*indicator.shape[:2], w), float("inf"))], dim=-1)

    def _preference(self, view: LayerView) -> float:
        w = min(self.params.window, view.length)
        window_rows = view.rows[..., : view.length - w].double()
        entropy = -(window_rows * torch.log(window_rows + 1e-10)).sum().item()
        variance = _variance(window_rows).sum().item()
        return max(entropy, 0.0) ** (1 / self.params.tau1) * max(variance, 0.0) ** (1 / self.params.tau2)

    @classmethod
    def allocate(cls, total, statistics, params, prompt_length=None):
        layers = len(statistics)
        window = params.window
        if prompt_length is not None and prompt_length <= total / layers + window:
            return split_total([1.0] * layers, total)
        prefix_cap = None if prompt_length is None else prompt_length - window
        budgets = split_total(
            [0.0 if p is None else p for p in statistics], total - layers * window, minimum=0, maximum=prefix_cap
        )
        return [b + window for b in budgets]


def _variance(rows: torch.Tensor) -> torch.Tensor:
    """Unbiased variance over the window queries (dim 2); zero for a one-query window."""
    if rows.shape[2] < 2 or rows.numel() == 0:
        return torch.zeros_like(rows[:, :, 0])
    return rows.var(dim=2, unbiased=True)

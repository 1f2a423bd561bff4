"""CAKE: cascading, adaptive budgets from each layer's attention dispersion.

Qin, Cao, Lin, Hu, Fan, Cheng, Lin, Li. "CAKE: Cascading and Adaptive KV Cache Eviction with Layer
Preferences." ICLR 2025 (code: antgroup/cakekv).
"""

from __future__ import annotations

import math

from polykv.lazy import torch
from polykv.methods.attention.snapkv import pool_votes
from polykv.methods.base import NOTHING, ONE_ROW, LayerView, Method, Needs
from polykv.methods.eviction import Eviction, evict_lowest
from polykv.methods.params import MethodParams, Real, real, tokens
from polykv.methods.shared import recent_mask, split_total
from polykv.plan import Phase

# The layer preference is H^(1/tau1) * V^(1/tau2): a temperature under 0.1 (an exponent over 10) lets it
# overflow a float for realistic entropies, and over 100 every layer's preference is about 1 (uniform).
TAU_RANGE = {"ge": 0.1, "le": 100.0}


class CAKEParams(MethodParams):
    window: int = tokens(32, ge=1, description="observation window, always kept; below the capacity")
    gamma: Real = real(
        200.0,
        ge=0.0,
        le=1000.0,
        description="weight of the attention variance in the indicator (the authors' 200; variances are at "
        "most 0.25, so beyond 1000 the mean no longer counts)",
    )
    tau1: Real = real(1.0, **TAU_RANGE, description="temperature of the spatial dispersion (entropy)")
    tau2: Real = real(1.0, **TAU_RANGE, description="temperature of the temporal dispersion (variance)")
    kernel_size: int = tokens(5, ge=1, description="avg pooling of the indicator along the keys")


class CAKE(Method):
    """Evict by mean + gamma * variance of the window's attention; budgets follow layer preferences.

    Prefill, with the last w queries' softmax attention A over the prompt and W = A restricted to the
    prefix keys: the eviction indicator of prefix token j is I_j = mean_q A[q, j] + gamma * var_q A[q, j]
    (unbiased variance over the w queries), avg-pooled along the keys (kernel 5) and averaged over the
    query heads of each KV head; the window always stays. Decode: when a layer exceeds its capacity,
    the current query's attention (pooled along the held tokens in position order, group-averaged)
    scores the non-window tokens and the lowest goes (of equal scores, the oldest); the w most recent
    tokens stay (the authors' decode rule: no variance term, no accumulation).
    Decode-only (the prompt kept whole at prefill, e.g. a `full` prefill): the prompt is cut with the
    prefill rule, not with one query's attention. At prefill `observe_prefill` computes the indicator
    above for the prompt's slots (the prompt's last w tokens at +inf) and stores it; at the first
    decode step, if the layer then holds the whole prompt plus the new token(s) and exceeds its capacity
    C, it keeps the new token(s), the prompt's last w tokens and the C - w - 1 prompt tokens of highest
    indicator (one new token), i.e. exactly the prompt tokens a prefill CAKE at capacity C - 1 keeps on
    the same prompt, plus the new token. A capacity too small for window and new token together
    (C <= w, possible under native allocation) keeps the C most recent tokens. The stored indicator is
    dropped after that first decode step; later steps use the decode rule. A question fed after the
    prompt and kept in full (the question-agnostic protocol: `LayerView.holds`) counts as new tokens at
    that first cut: it stays, with the window, and the prompt's indicator ranks the rest.
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
    colour = "#D55E00"
    standalone_source = "CAKE (Qin et al., ICLR 2025): cascading prompt budgets, eviction continues in decode"
    phases = frozenset({Phase.PREFILL, Phase.DECODE})
    Params = CAKEParams
    params: CAKEParams  # this instance's, parsed
    below_capacity = ("window",)
    native_allocation = True
    revision = 2  # 2: a decode-only plan cuts the prompt with CAKE's prompt rule

    def __init__(self, capacity, params=None, layer_idx=0, interval=1):
        super().__init__(capacity, params, layer_idx, interval)
        self.preference: float | None = None
        self.prompt_length: int | None = None  # slots the layer held when observe_prefill saw the prompt
        self.prompt_newest: int | None = None
        self.held = 0  # tokens kept in full after the prompt (a question), scored +inf at the first cut

    def needs(self, phase: Phase, length: int) -> Needs:
        over = self.capacity is None or self.evicts(phase, length)
        if not over or (phase is Phase.DECODE and self._whole_prompt_score() is not None):
            return NOTHING  # the first decode cut of a whole prompt uses the stored prompt indicator
        return Needs(rows=self.params.window) if phase is Phase.PREFILL else ONE_ROW

    def needs_from_prefill(self, length: int) -> Needs:
        return Needs(rows=self.params.window)  # preference and prompt indicator come from the prompt's window

    def observe_prefill(self, view: LayerView) -> None:
        self.preference, indicator = self._prompt_scores(view)
        self.prompt_length = view.length
        self.prompt_newest = view.newest  # the prompt's last position (None: unknown)
        self.held = 0
        # Per slot, so the runtime gathers it with the cache (a prefill method may still evict).
        self.per_token[PROMPT_SCORE] = indicator.clone()

    def step(self, view: LayerView) -> Eviction | None:
        if view.phase is Phase.PREFILL:
            if view.rows is None:
                return None
            self.preference, indicator = self._prompt_scores(view)
            self.per_token["score"] = indicator.clone()
            return self.settle()
        prompt_score = self._whole_prompt_score()
        if view.holds:  # a question kept in full: it joins the prompt, scored +inf like the window
            if prompt_score is None:
                self.per_token.pop(PROMPT_SCORE, None)
            else:
                self.grow(PROMPT_SCORE, view.num_new, float("inf"))
                self.prompt_length += view.num_new
                self.held += view.num_new
                self.prompt_newest = view.newest
            return None
        # Only the first decode step may use the prompt indicator: drop it whatever happens, since the
        # slots it scores stop matching the cache once new tokens are appended.
        self.per_token.pop(PROMPT_SCORE, None)
        if not self.over_capacity(view):
            return None
        if prompt_score is not None:
            return self._cut_prompt(view, prompt_score)
        if view.rows is None:
            return None
        # The pooling runs along each KV head's tokens in position order (freed slots are reused, so slot
        # order is not position order): sort the slots by position once, pool and choose in that order,
        # and map the choice back to slots. Averaging the group before pooling equals pooling first
        # (both are linear).
        positions, order = view.positions.sort(dim=-1)
        score = pool_votes(view.grouped(view.rows[:, :, -1, :]).gather(-1, order), self.params.kernel_size, "avg")
        n, w = view.length, self.params.window
        if n - self.capacity == 1 and view.hidden is None and self._window_is_last(view):  # one argmin, no mask
            return Eviction(dropped=order.gather(-1, score[..., : n - w].argmin(dim=-1, keepdim=True)))
        eviction = evict_lowest(score, self.capacity, recent_mask(view, w, positions), view.hidden)
        if eviction.dropped is not None:
            return Eviction(dropped=order.gather(-1, eviction.dropped))
        return Eviction(keep=order.gather(-1, eviction.keep).sort(dim=-1).values)

    def allocation_statistic(self) -> float | None:
        return self.preference

    def _window_is_last(self, view: LayerView) -> bool:
        """Are the window's w newest positions all held, hence the last w slots in position order? Yes
        once they are all decode tokens: the decode rule keeps a token while it is in the window (with a
        capacity above w). A prompt token in the window may have gone already (another prefill method)."""
        w = self.params.window
        return (
            self.capacity > w
            and view.newest is not None
            and self.prompt_newest is not None
            and view.newest - w >= self.prompt_newest
        )

    def _whole_prompt_score(self) -> torch.Tensor | None:
        """The stored prompt indicator if the layer still holds every prompt slot (a prefill method
        that evicted gathered it down with the cache), else None."""
        score = self.per_token.get(PROMPT_SCORE)
        return score if score is not None and score.shape[-1] == self.prompt_length else None

    def _cut_prompt(self, view: LayerView, prompt_score: torch.Tensor) -> Eviction:
        """The first decode cut of a whole prompt: new tokens and the prompt's window stay (+inf), the
        rest of the capacity goes to the prompt tokens of highest indicator."""
        new = prompt_score.new_full((*prompt_score.shape[:2], view.num_new), float("inf"))
        score = torch.cat([prompt_score, new], dim=-1)  # slots are in position order until the first cut
        protected = min(self.params.window, self.prompt_length - self.held) + self.held + view.num_new
        if self.capacity < protected:  # no room for window and new tokens: the most recent ones stay
            return evict_lowest(view.positions.to(score.dtype), self.capacity, hidden=view.hidden)
        return evict_lowest(score, self.capacity, hidden=view.hidden)

    def _prompt_scores(self, view: LayerView) -> tuple[float, torch.Tensor]:
        """The layer's preference and the prompt's indicator: the same for every CAKE layer that sees this step
        with the same parameters (the layer's two phase methods, many plans' layers), so made once."""
        p = self.params
        key = ("cake prompt", p.window, p.kernel_size, p.gamma, p.tau1, p.tau2)
        return view.once(key, lambda: (self._preference(view), self._prefill_indicator(view)))

    def _prefill_indicator(self, view: LayerView) -> torch.Tensor:
        n, w = view.length, min(self.params.window, view.length)
        # [b, qh, w, n - w]: the window's attention to the prefix (the view may hold more rows, for the decode method)
        window_rows = view.rows[:, :, -w:, : n - w]
        mean = window_rows.mean(dim=2, keepdim=True)
        indicator = mean.squeeze(2) + self.params.gamma * _variance(window_rows, mean)
        indicator = view.grouped(pool_votes(indicator, self.params.kernel_size, "avg"))
        return torch.cat([indicator, indicator.new_full((*indicator.shape[:2], w), float("inf"))], dim=-1)

    def _preference(self, view: LayerView) -> float:
        w = min(self.params.window, view.length)
        window_rows = view.rows[:, :, -w:, : view.length - w].double()
        entropy = -(window_rows * torch.log(window_rows + 1e-10)).sum().item()
        variance = _variance(window_rows).sum().item()
        return preference(entropy, variance, self.params.tau1, self.params.tau2)

    @classmethod
    def allocate(cls, total, statistics, params, prompt_length=None):
        layers = len(statistics)
        window = params.window
        if prompt_length is not None and prompt_length <= total / layers + window:
            return split_total([1.0] * layers, total)
        prefix_cap = None if prompt_length is None else prompt_length - window
        weights = [0.0 if p is None else p for p in statistics]
        top = max(weights, default=0.0)
        if top > 0 and math.isfinite(top):  # proportions only: scaled so that their sum cannot overflow
            weights = [w / top for w in weights]
        budgets = split_total(weights, total - layers * window, minimum=0, maximum=prefix_cap)
        return [b + window for b in budgets]


PROMPT_SCORE = "prompt_score"  # per_token key: the prompt indicator kept from prefill for the first decode cut
_LOG_LARGEST = 700.0  # exp(700) ~ 1e304: the largest preference returned (a float reaches about 1.8e308)


def preference(entropy: float, variance: float, tau1: float, tau2: float) -> float:
    """P = H^(1/tau1) * V^(1/tau2) (negative H or V count as 0), computed in logs so that it never
    raises OverflowError; a value beyond about 1e304 is returned as exp(700)."""
    entropy, variance = max(entropy, 0.0), max(variance, 0.0)
    if entropy == 0.0 or variance == 0.0 or math.isnan(entropy) or math.isnan(variance):
        return entropy ** (1 / tau1) * variance ** (1 / tau2)  # 0, or NaN as before
    if math.isinf(entropy) or math.isinf(variance):
        return math.exp(_LOG_LARGEST)
    return math.exp(min(math.log(entropy) / tau1 + math.log(variance) / tau2, _LOG_LARGEST))


def _variance(rows: torch.Tensor, mean: torch.Tensor | None = None) -> torch.Tensor:
    """Unbiased variance over the window queries (dim 2); zero for a one-query window. Two passes (the
    mean, then the squared deviations; `mean`: rows.mean(2, keepdim=True) if the caller has it): torch's
    CPU `var` takes about 20x longer on a prompt's window rows, for the same numbers to float rounding."""
    w = rows.shape[2]
    if w < 2 or rows.numel() == 0:
        return torch.zeros_like(rows[:, :, 0])
    mean = rows.mean(dim=2, keepdim=True) if mean is None else mean
    return (rows - mean).square_().sum(dim=2).div_(w - 1)

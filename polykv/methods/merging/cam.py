"""CaM: merge each evicted token's value into the tokens that stay.

Zhang, Du, Luo, Zhong, Zhang, Liu, Ji. "CaM: Cache Merging for Memory-efficient LLMs Inference."
ICML 2024 (code: zyxxmu/cam, generate_task/streaming_llm/kv_cache_cam.py).
"""

from __future__ import annotations

from pydantic import Field

from polykv.lazy import torch
from polykv.methods.base import COLUMN_SUMS, LayerView, Method, Needs
from polykv.methods.eviction import Eviction, evict_lowest
from polykv.methods.params import MethodParams, tokens
from polykv.plan import Phase


class CaMParams(MethodParams):
    sinks: int = tokens(4, ge=0, description="first tokens always kept (attention sinks); below the capacity")
    merge_budget: int = tokens(16, ge=1, description="kept tokens that share an evicted token's value")
    seed: int = Field(
        default=0,
        ge=0,
        le=2**63 - 1,
        description="seed of the Bernoulli merge draws (mixed with the layer index); an integer, 0 .. 2^63 - 1",
    )


class CaM(Method):
    """StreamingLLM eviction (sinks + recent window) whose evicted values are merged, not lost.

    Rule (the authors' real-eviction cache, kv_cache_cam.py): every token accumulates the attention
    it receives, summed over every query (all prompt queries, then each new one). When a layer holds
    more than `capacity` slots, keep positions [0, sinks) and the `capacity - sinks` most recent ones.
    Before an evicted token e goes, its value is merged into its targets: the `merge_budget` kept tokens
    that follow it by position (the oldest tokens of the recent window; K = fewer if fewer exist). Each
    target gets + m * v_e / K, m ~ Bernoulli(p), p = clamp(acc[e] / mean(acc[targets]), 0, 1) (NaN -> 0).
    Keys are never modified. When one step evicts several tokens (the first decode step after a long
    full prefill), only the newest of them, the one just outside the recent window, is merged, as in
    the authors' cache, which merges the single token e = L - recent - 1 per step and slices off the
    rest (merging all of them would pile thousands of values onto K targets).
    Defaults: 4 sinks (StreamingLLM's), merge_budget 16 (the authors' generation code); draws come from
    a generator seeded with `seed` and the layer index, one per batch row, so a run is deterministic for a
    fixed seed and a sequence draws the same alone or in a batch.
    Decode only: the paper evaluates merging at decode-time eviction. The accumulation starts from the
    prompt's attention, as in H2O.
    GQA: the merge acts on the KV head's (shared) value; p uses the accumulated attention averaged over
    the KV head's query heads, with one Bernoulli draw per KV head (the original is MHA: per head).
    Difference from the original: keys keep their TRUE RoPE positions, where the authors re-position
    the cache contiguously as StreamingLLM does; the kept tokens and the merges are the same.
    """

    name = "cam"
    colour = "#8C564B"
    standalone_source = "CaM (Zhang et al., ICML 2024): merges evicted values during generation"
    phases = frozenset({Phase.DECODE})
    Params = CaMParams
    params: CaMParams  # this instance's, parsed
    below_capacity = ("sinks",)
    merges = True
    merges_together = True

    def __init__(self, capacity, params=None, layer_idx=0, interval=1):
        super().__init__(capacity, params, layer_idx, interval)
        self.generator: list[torch.Generator] | None = None  # one per batch row
        self.deferred_targets: torch.Tensor | None = None  # the targets of a merge left to the runtime

    def needs(self, phase: Phase, length: int) -> Needs:
        return COLUMN_SUMS  # the accumulation needs every step, evicting or not

    def needs_from_prefill(self, length: int) -> Needs:
        return COLUMN_SUMS

    def observe_prefill(self, view: LayerView) -> None:
        self.per_token["acc"] = view.grouped(view.column_sums)
        self.generator = None  # a new sequence: the draws start again from the seed

    def step(self, view: LayerView) -> Eviction | None:
        added = view.grouped(view.column_sums)
        old = self.per_token.get("acc")
        acc = added if old is None else self.grow("acc", view.num_new, 0.0).add_(added)  # new slots start from 0
        self.per_token["acc"] = acc
        if not self.over_capacity(view):
            return None
        # Positions are unique per head: the top `capacity` with sinks forced in are sinks + the most recent.
        if view.length - self.capacity == 1:  # one slot goes: the oldest non-sink token
            oldest = view.positions.masked_fill(view.positions < self.params.sinks, _NO_TARGET)
            k = min(self.params.merge_budget, view.length)
            if view.length - 1 - self.params.sinks >= k:
                # more than k non-sinks: the k + 1 oldest of them are the evicted token and, after it, its k
                # targets (positions are unique per head), in one ranking
                ranked = oldest.topk(k + 1, dim=-1, largest=False).indices
                dropped = ranked[..., :1]
                if view.defer_merge:  # the runtime merges it with other layers' (`merge_together`)
                    self.deferred_targets = ranked[..., 1:]
                    return Eviction(dropped=dropped, merge_deferred=True)
                self._merge_one(view, acc, dropped, targets=ranked[..., 1:])
                return Eviction(dropped=dropped)
            eviction = Eviction(dropped=oldest.argmin(dim=-1, keepdim=True))
        else:
            eviction = evict_lowest(
                view.positions.float(), self.capacity, protected=view.positions < self.params.sinks, hidden=view.hidden
            )
        if eviction.dropped is not None:
            self._merge_one(view, acc, eviction.dropped)
            return eviction
        evicted = ~eviction.kept_mask(view.length)
        newest = torch.where(evicted, view.positions, -1).amax(dim=-1, keepdim=True)
        self._merge(view, acc, evicted & (view.positions == newest))
        return eviction

    def _merge_one(
        self, view: LayerView, acc: torch.Tensor, dropped: torch.Tensor, targets: torch.Tensor | None = None
    ) -> None:
        """`_merge` for the usual decode step, one evicted slot per head [b, h, 1], in fewer operations
        (the same numbers and the same draws). `targets`: the `merge_budget` oldest slots after the evicted
        one, ascending by position, when the caller ranked them already (every target exists)."""
        # Draw for every slot, as `_merge` does, so that the generator's stream stays the same. A draw u
        # in [0, 1) is below p = clamp(ratio, 0, 1) (NaN -> 0) exactly when it is below the ratio itself.
        draws = self._draws(acc)
        if targets is not None:
            _merge_into_targets(view.values, acc, draws, dropped, targets)
            return
        # The evicted token is the oldest non-sink one, so every slot after it by position is eligible
        # (sinks come before it); the targets are the `merge_budget` oldest of those.
        eligible = view.positions > view.positions.gather(-1, dropped)
        targets, valid, count = self._targets(view, eligible)
        ratio = acc.gather(-1, dropped) / ((acc.gather(-1, targets) * valid).sum(-1, keepdim=True) / count)
        share = (draws.gather(-1, dropped) < ratio) / count * valid  # m / K for each target that exists
        _add_shares(view.values, dropped, targets, share)

    @classmethod
    def merge_together(
        cls, methods: list[CaM], kv: torch.Tensor, dropped: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> None:
        if lengths is not None:  # its merge reads each layer's own per-slot state, of its own length
            raise ValueError("CaM merges together only layers of one capacity")
        # each layer draws from its own generators, over its state before the slots move
        states = [method.per_token["acc"] for method in methods]
        draws = torch.stack([method._draws(acc) for method, acc in zip(methods, states)])
        targets = torch.stack([method.deferred_targets for method in methods])  # [L, b, h, k]
        _merge_into_targets(kv[1], torch.stack(states), draws, dropped, targets)
        for method in methods:
            method.deferred_targets = None

    def _targets(self, view: LayerView, eligible: torch.Tensor):
        """The `merge_budget` oldest eligible slots [b, h, k], which of them exist, and how many (K)."""
        k = min(self.params.merge_budget, view.length)
        oldest = torch.where(eligible, view.positions, _NO_TARGET).topk(k, dim=-1, largest=False)
        targets, valid = oldest.indices, oldest.values < _NO_TARGET  # [b, h, k]
        return targets, valid, valid.sum(-1, keepdim=True)  # K per head (>= 1: sinks < capacity)

    def _draws(self, acc: torch.Tensor) -> torch.Tensor:
        """Uniform draws [b, h, n]: one seeded stream per batch row, so a sequence gets the same draws
        alone or in a batch (its merges never depend on the other rows)."""
        if self.generator is None or len(self.generator) != acc.shape[0]:
            self.generator = [
                torch.Generator(device=acc.device).manual_seed(self.seed_for_layer()) for _ in range(acc.shape[0])
            ]
        if len(self.generator) == 1:  # the same numbers as stacking one row's draws
            return torch.rand(acc.shape, generator=self.generator[0], device=acc.device, dtype=acc.dtype)
        return torch.stack(
            [torch.rand(acc.shape[1:], generator=g, device=acc.device, dtype=acc.dtype) for g in self.generator]
        )

    def _merge(self, view: LayerView, acc: torch.Tensor, evicted: torch.Tensor) -> None:
        """Add the merged token's value, Bernoulli-gated, to its targets (view.values, in place)."""
        # The merged token is older than every kept non-sink token, so its targets are the
        # `merge_budget` oldest kept tokens at or after position `sinks`.
        eligible = (view.positions >= self.params.sinks) & ~evicted
        eligible &= view.positions > torch.where(evicted, view.positions, -1).amax(dim=-1, keepdim=True)
        targets, valid, count = self._targets(view, eligible)
        target_acc = (acc.gather(-1, targets) * valid).sum(-1, keepdim=True) / count
        p = torch.nan_to_num(acc / target_acc, nan=0.0).clamp(0, 1) * evicted  # [b, h, n]
        draws = self._draws(p)
        m = (draws < p).to(view.values.dtype)  # one draw per KV head and evicted token
        merged = torch.matmul(m.unsqueeze(2), view.values).float() / count.unsqueeze(
            -1
        )  # [b, h, 1, d]: sum_e m_e v_e / K
        add = (merged * valid.unsqueeze(-1)).to(view.values.dtype)  # [b, h, k, d]
        index = targets.unsqueeze(-1).expand(*targets.shape, view.values.shape[-1])
        view.values.scatter_add_(2, index, add)

    def seed_for_layer(self) -> int:
        """The generator's seed: `seed` mixed with the layer index, so layers draw independently."""
        return (self.params.seed * 1_000_003 + self.layer_idx) % (2**63)


def _merge_into_targets(
    values: torch.Tensor, acc: torch.Tensor, draws: torch.Tensor, dropped: torch.Tensor, targets: torch.Tensor
) -> None:
    """The merge when every one of the k targets exists (at least k slots besides the evicted one and the
    sinks), for one layer or many at once: K = k, so the masks of which targets exist (all true) drop out,
    with the same numbers. values [..., b, h, n, d]; acc and draws [..., b, h, n]; dropped [..., b, h, 1];
    targets [..., b, h, k] (the leading dimensions, if any, are layers)."""
    k = targets.shape[-1]
    ratio = acc.gather(-1, dropped) / (acc.gather(-1, targets).sum(-1, keepdim=True) / k)  # [..., b, h, 1]
    share = (draws.gather(-1, dropped) < ratio) / k  # m / K, the same for every target [..., b, h, 1]
    _add_shares(values, dropped, targets, share)


def _add_shares(values: torch.Tensor, dropped: torch.Tensor, targets: torch.Tensor, share: torch.Tensor) -> None:
    """values[target] += share * values[dropped] for each target of each head (in place; the products in
    fp32, added in the cache's dtype); share [..., b, h, 1 or k]."""
    d = values.shape[-1]
    value = values.gather(-2, dropped.unsqueeze(-1).expand(*dropped.shape, d))  # [..., b, h, 1, d]
    if value.dtype != torch.float32:
        value = value.float()
    add = share.unsqueeze(-1) * value  # m v_e / K, [..., b, h, 1 or k, d]
    if add.dtype != values.dtype:
        add = add.to(values.dtype)
    values.scatter_add_(-2, targets.unsqueeze(-1).expand(*targets.shape, d), add.expand(*targets.shape, d))


_NO_TARGET = 2**62  # a position no slot holds: ranks after every eligible slot

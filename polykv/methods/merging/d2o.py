"""D2O: heavy hitters plus a recent window, evicted tokens merged into their nearest kept token.

Wan, Wu, Zhang, Xin, Tao, Zhu, Wang, Luo, Xiong, Zhang. "D2O: Dynamic Discriminative Operations for
Efficient Long-Context Inference of LLMs." ICLR 2025, arXiv:2406.13035 (code: AIoT-MLSys-Lab/D2O,
LLM_merge_new/LMEval_kv_token_merge/modeling_llama3_7b_13b_d2o.py and modeling_llama3_new.py).
"""

from __future__ import annotations

import functools

from polykv.lazy import torch
from polykv.methods.base import LayerView
from polykv.methods.eviction import Eviction, evict_lowest
from polykv.methods.params import MethodParams, Real, real, tokens
from polykv.methods.shared import AccumulatedAttention, recent_mask, split_total
from polykv.methods.slots import gather_slots
from polykv.plan import Phase

# Bound the [b, h, chunk, n] fp32 cosine block of the first (large) cut to about this many elements.
_SIMILARITY_BLOCK = 1 << 26


class D2OParams(MethodParams):
    heavy_ratio: Real = real(0.5, gt=0.0, le=1.0, description="share of the capacity for heavy hitters")
    sinks: int = tokens(
        4, ge=0, description="first tokens always kept (forced into the heavy hitters); below the capacity"
    )
    alpha: Real = real(0.5, ge=0.0, lt=1.0, description="EMA weight of the old merge threshold")


class D2O(AccumulatedAttention):
    """H2O-style eviction in decode; each evicted token similar enough to a kept one is merged into it.

    Token level (decode only; the prompt is never evicted inside prefill). Every slot's score is the
    attention it has received, summed over the prompt's queries (seen through `observe_prefill`) and
    every decode query since, per KV head (mean of its query heads). When a layer holds more than
    `capacity` slots (the first decode step cuts the cache in one go, then one token goes per step),
    keep positions [0, sinks), the `capacity - heavy` most recent positions and the highest-scoring
    others up to `capacity`, heavy = round(heavy_ratio * capacity) (the sinks count among the heavy
    hitters, as the authors force them to +inf among the candidates; if sinks > heavy, the recent window
    shrinks so that the sinks still fit).
    Merge, keys AND values: for every evicted token i of a KV head, s_i = max over that head's kept
    keys j of cos(k_i, k_j), target j*_i the argmax. Threshold tau (per layer and sequence): at the
    sequence's first eviction tau = mean(s) over the evicted tokens of all its heads, after
    that tau <- alpha * tau + (1 - alpha) * mean(s); tau is updated with this step's s BEFORE gating,
    as the code does. Token i is merged iff s_i >= tau, then k_j <- (k_j + sum_{i->j} s_i k_i) / (1 + n_j)
    with n_j the tokens merged into j this step (the code's scatter_reduce "mean" with include_self on
    s_i * k_i: raw cosines as weights, not normalised), and the same for values with the same weights.
    Grouped-query attention: cosines, targets and gates are per KV head and the cache stays at KV-head
    size (the authors repeat K/V per query head before caching and select per query head).
    Layer level (native allocation): from the prompt's attention, s[h, j] = sum over queries of query
    head h's attention to key j; v_h = unbiased variance over j (batch mean); min-max normalised over
    heads, (v - min) / (max - min + 1e-6); sigma_l = mean over heads. Capacities are proportional to
    softmax(-sigma) over layers (lower variance = denser attention = more capacity), rounded to sum
    exactly to the total L*b.
    Defaults: heavy_ratio 0.5 (the README's hh_ratio = recent_ratio = 0.1 splits the budget evenly),
    sinks 4 (hard-coded in the code), alpha 0.5 (the code's alpha = belta = 0.5).
    Differences from the code: (1) the gate is per head and token, where the authors average s over
    heads per evicted slot index (their per-head evicted lists are aligned by slot order, not token);
    (2) tau starts afresh for every sequence (reset at prefill), where the authors' tau carries over
    between prompts; (3) layers 0, 1 and L-1 are compressed too, where the authors never compress them,
    because native allocation must split the same total L*b as a uniform plan; (4) the merge sums are
    accumulated in fp32 and written back in the cache's dtype.
    """

    name = "d2o"
    colour = "#F0E442"
    standalone_source = "D2O (Wan et al., ICLR 2025): dynamic eviction and merging during generation"
    phases = frozenset({Phase.DECODE})
    Params = D2OParams
    params: D2OParams  # this instance's, parsed
    below_capacity = ("sinks",)
    merges = True
    merges_together = True
    merges_across_capacities = True  # native allocation gives every layer its own capacity (many plans' batches)
    native_allocation = True

    def __init__(self, capacity, params=None, layer_idx=0, interval=1):
        super().__init__(capacity, params, layer_idx, interval)
        # EMA merge threshold tau, a float64 0-d tensor kept on the device: reading it back every step
        # would stall the host until the device catches up
        self.tau: torch.Tensor | None = None
        self.sigma: float | None = None  # the layer's normalised attention variance (allocation)
        self._sinks_marked = False  # do the sinks' scores hold +inf yet (see `step`)?

    def observe_prefill(self, view: LayerView) -> None:
        super().observe_prefill(view)  # the prompt's attention starts the scores
        self.tau = None  # a new sequence
        self._sinks_marked = False
        self.sigma = _attention_variance(view.column_sums)

    def forget(self) -> None:
        super().forget()
        self._sinks_marked = False

    @property
    def threshold(self) -> float | None:
        """tau as a Python float (synchronises; for inspection, never read in a step)."""
        if self.tau is None:
            return None
        return self.tau.item() if self.tau.numel() == 1 else self.tau.flatten().tolist()

    def allocation_statistic(self) -> float | None:
        return self.sigma

    @classmethod
    def allocate(cls, total, statistics, params, prompt_length=None):
        sigma = torch.tensor([0.0 if s is None else s for s in statistics], dtype=torch.float64)
        return split_total((-sigma).softmax(0).tolist(), total)

    def step(self, view: LayerView) -> Eviction | None:
        score = self.accumulate(view)
        if not self.over_capacity(view):
            return None
        capacity = self.capacity
        sinks = min(self.params.sinks, capacity)
        heavy = min(capacity, round(self.params.heavy_ratio * capacity))
        recent = max(0, min(capacity - heavy, capacity - sinks))
        if not self._sinks_marked:
            # The sinks score +inf from the first eviction on, as the authors force them among the
            # candidates: they are never evicted, attention added to +inf stays +inf, and every later
            # step is spared the mask. (Every position under `sinks` is held by then: the layer is over
            # a capacity larger than `sinks`.)
            score.masked_fill_(view.positions < sinks, float("inf"))
            self._sinks_marked = True
        eviction = evict_lowest(score, capacity, recent_mask(view, recent), view.hidden)
        if eviction.dropped is not None:
            if view.defer_merge:  # the runtime merges it with other layers' (`merge_together`)
                eviction.merge_deferred = True
            else:
                self._merge_one(view, eviction.dropped)
        else:
            self._merge(view, eviction)
        return eviction

    def _merge_one(self, view: LayerView, dropped: torch.Tensor) -> None:
        """`_merge` for one evicted slot per head, in fewer operations (`_merge_evicted_slot`)."""
        # keys and values in one block [2, b, h, n, d] gather and scatter both at once
        tensors = [view.kv] if view.kv is not None else [view.keys, view.values]
        self.tau = _merge_evicted_slot(view.keys, tensors, dropped, self.tau, self.params.alpha)

    @classmethod
    def merge_together(
        cls, methods: list[D2O], kv: torch.Tensor, dropped: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> None:
        taus = [method.tau for method in methods]
        if any(tau is None for tau in taus) and not all(tau is None for tau in taus):
            for i, method in enumerate(methods):  # some layers' first eviction: each alone
                own = None if lengths is None else lengths[i : i + 1]  # a view: reading the number would sync
                tau = _merge_evicted_slot(kv[0, i], [kv[:, i]], dropped[i], method.tau, method.params.alpha, own)
                method.tau = tau
            return
        tau = None if taus[0] is None else torch.stack(taus)  # [L, b]
        tau = _merge_evicted_slot(kv[0], [kv], dropped, tau, methods[0].params.alpha, lengths)
        for method, layer_tau in zip(methods, tau.unbind(0)):
            method.tau = layer_tau

    def _merge(self, view: LayerView, eviction: Eviction) -> None:
        """Merge the evicted slots into their most similar kept slots of view.keys/values, in place."""
        n = view.length
        kept = eviction.kept_mask(n)
        num_evicted = 1 if eviction.dropped is not None else n - eviction.keep.shape[-1]
        order = kept.to(torch.uint8).argsort(dim=-1, stable=True)  # evicted slots first
        evicted, survivors = order[..., :num_evicted], order[..., num_evicted:]  # [b, h, e], [b, h, c]
        similarity, target = _nearest_kept(view.keys, evicted, survivors)

        self.tau, gate = _threshold_gate(similarity, self.tau, self.params.alpha, rows=1)
        weight = torch.where(gate, similarity, 0.0)

        # Several evicted tokens may share a target: group them under the first one (in evicted
        # order) so the sums are done in fp32 in an [b, h, e, d] buffer instead of a cache-sized one.
        b, h, e = evicted.shape
        entries = torch.arange(e, device=evicted.device).expand(b, h, e)
        first = torch.zeros_like(kept, dtype=torch.long)
        first.scatter_reduce_(-1, target, entries, "amin", include_self=False)
        group = first.gather(-1, target)  # [b, h, e]
        # Tokens below tau weigh 0 and count 0: their targets are written back unchanged.
        merged_count = torch.zeros(b, h, e, device=evicted.device).scatter_add_(-1, group, gate.float())
        scale = 1.0 / (1.0 + merged_count.gather(-1, group))
        # slots are read with `gather_slots` (whole rows of d: several times faster than an expanded gather on a CPU)
        for tensor in (view.keys, view.values):
            d = tensor.shape[-1]
            src = weight[..., None] * gather_slots(tensor, evicted).float()
            sums = torch.zeros_like(src).scatter_add_(2, group[..., None].expand_as(src), src)
            base = gather_slots(tensor, target).float()
            result = (base + gather_slots(sums, group)) * scale[..., None]
            index = target[..., None].expand(b, h, e, d)
            tensor.scatter_(2, index, result.to(tensor.dtype))  # duplicates carry the same value


def _threshold_gate(
    similarity: torch.Tensor, tau: torch.Tensor | None, alpha: float, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """tau updated with this step's similarities (before gating, as the code does), and the merge gate
    s_i >= tau. The first `rows` dimensions of `similarity` (batch rows; layers before them) each have a
    tau [rows...]: one number per layer and sequence, the mean over a sequence's heads and evicted tokens
    (a sequence's merges never depend on the others in its batch), updated in float64 as a Python float
    would be, compared in the similarities' dtype, and kept on the device (no sync)."""
    mean = similarity.mean(dim=tuple(range(rows, similarity.dim())), dtype=torch.float64)
    # tau <- alpha tau + (1 - alpha) mean, as one interpolation
    tau = mean if tau is None else torch.lerp(tau, mean, 1 - alpha)
    threshold = tau.view(*tau.shape, *(1,) * (similarity.dim() - rows))  # each row's tau against its similarities
    return tau, similarity >= (threshold if similarity.dtype == torch.float64 else threshold.to(similarity.dtype))


def _merge_evicted_slot(
    keys: torch.Tensor,
    tensors: list[torch.Tensor],
    dropped: torch.Tensor,
    tau: torch.Tensor | None,
    alpha: float,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """D2O's merge when one slot of each head goes, for one layer or many at once; returns the new tau.

    keys [..., b, h, N, d]; dropped [..., b, h, 1] (the leading dimensions, if any, are layers); tau
    [..., b] or None; `tensors` are merged in place, each with its slots second to last, broadcasting
    against the keys from the left (the keys and the values, or one [2, ..., b, h, N, d] block of both).
    `lengths` [L] (layers first): layer i holds its first lengths[i] slots, the others are no candidates.
    With one token there is no grouping: its target j* becomes (k_j* + s k_i) / 2 if s >= tau. Every
    number of a layer is the same whether it merges alone or with others, over its own n slots or padded to N:
    each cosine is its own sum of d products (a matrix product's rounding would depend on N)."""
    *heads, _ = dropped.shape  # [..., b, h]
    n, d = keys.shape[-2:]
    unit = _unit(keys)
    evicted = dropped.unsqueeze(-1)  # [..., b, h, 1, 1], shaped like every per-head result below
    picked = unit.gather(-2, evicted.expand(*heads, 1, d))
    cosine = (unit * picked).sum(-1).unsqueeze(-2)  # [..., b, h, 1, N]
    cosine.scatter_(-1, evicted, float("-inf"))  # the evicted slot is no candidate
    if lengths is not None:  # nor a layer's padding
        padding = torch.arange(n, device=keys.device) >= lengths.view(-1, *(1,) * (cosine.dim() - 1))
        cosine.masked_fill_(padding, float("-inf"))
    similarity, target = cosine.max(dim=-1, keepdim=True)  # [..., b, h, 1, 1]
    tau, gate = _threshold_gate(similarity, tau, alpha, rows=len(heads) - 1)
    for tensor in tensors:
        shape = (*tensor.shape[:-2], 1, tensor.shape[-1])
        target_index = target.expand(shape)
        src, base = tensor.gather(-2, evicted.expand(shape)), tensor.gather(-2, target_index)
        if tensor.dtype != torch.float32:  # the sums in fp32, written back in the cache's dtype
            src, base = src.float(), base.float()
        # (base + s src) / 2 where merged, base (unchanged) elsewhere
        merged = torch.where(gate, torch.addcmul(base, src, similarity).mul_(_half()), base)
        tensor.scatter_(-2, target_index, merged if merged.dtype == tensor.dtype else merged.to(tensor.dtype))
    return tau


@functools.cache
def _half() -> torch.Tensor:
    """0.5 as a 0-d tensor: multiplying by it is the same as by the number, without wrapping a scalar each call."""
    return torch.tensor(0.5)


def _nearest_kept(keys: torch.Tensor, evicted: torch.Tensor, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per evicted slot: max cosine to the same head's kept keys [b, h, e] and the kept slot attaining it."""
    unit = lambda slots: _unit(gather_slots(keys, slots))  # noqa: E731
    candidates = unit(kept).transpose(-1, -2)  # [b, h, d, c]
    b, h, c = kept.shape
    chunk = max(1, _SIMILARITY_BLOCK // max(1, b * h * c))
    values, slots = [], []
    for start in range(0, evicted.shape[-1], chunk):  # chunks bound memory at the first cut; decode has e = 1
        best = (unit(evicted[..., start : start + chunk]) @ candidates).max(dim=-1)
        values.append(best.values)
        slots.append(kept.gather(-1, best.indices))
    return torch.cat(values, -1), torch.cat(slots, -1)


def _unit(vectors: torch.Tensor) -> torch.Tensor:
    if vectors.dtype != torch.float32:
        vectors = vectors.float()
    # linalg.vector_norm directly: Tensor.norm's dispatch to it costs more than the norm on a decode step
    return vectors / torch.linalg.vector_norm(vectors, dim=-1, keepdim=True).clamp_min_(1e-12)


def _attention_variance(column_sums: torch.Tensor) -> float:
    """sigma_l: per query head, the unbiased variance of the prompt's column sums (batch mean),
    min-max normalised over heads and averaged."""
    if column_sums.shape[-1] < 2:
        return 0.0
    v = column_sums.double().var(dim=-1).mean(dim=0)
    return ((v - v.min()) / (v.max() - v.min() + 1e-6)).mean().item()

"""The routed cache: one `RoutedLayer` per Transformer layer, each running its plan entry.

A `RoutedLayer` is a Hugging Face cache layer (the `DynamicLayer` interface: update, get_seq_length,
get_mask_sizes) that physically holds only the slots its method keeps, with the true position of every
slot (both in its `LayerSlots`). It reports the TRUE number of tokens seen as its sequence length, so a model
that derives RoPE positions from the cache keeps counting from the real length after eviction.

The attention step (`attention_step.py`) calls `finish_step` right after computing the layer's output,
handing over the attention signals the layer's methods asked for; the method then decides what stays.

A local layer (sliding-window attention, as Gemma 3's and Mistral's: its attention tells the layer its window
W at every step) holds only what a later query can see, as transformers' sliding-window cache does: after each
step, slots at positions <= seen - W leave it, so it never holds more than W - 1 tokens between steps. Its
method then chooses among the slots left: a capacity at or above the window keeps the window (`full`'s
vanilla cache), a smaller one evicts within it (`keep_window`).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from polykv.errors import RoutedCacheError
from polykv.kv_memory import KVHeld
from polykv.methods import Method, make_method
from polykv.methods.base import LayerView, Needs
from polykv.methods.eviction import Eviction
from polykv.methods.head_budgets import AdaKV, AdaKVParams
from polykv.plan import Phase, Plan
from polykv.runtime.attention import hand_over
from polykv.runtime.attention_step import attend
from polykv.runtime.layer_budgets import RunTimeSplit
from polykv.runtime.merges import MergeGroups
from polykv.runtime.slots import LayerSlots
from polykv.runtime.windows import room_hidden, window_cut, windowed_view


class RoutedLayer(DynamicLayer):
    """One layer of the routed cache: its slots (keys, values and true positions, in `slots`) and two phase methods."""

    is_croppable = False  # evicted tokens cannot come back: transformers' assisted decoding refuses the cache

    def __init__(self, layer_idx: int, prefill: Method, decode: Method):
        self.slots = LayerSlots()  # first: Hugging Face's layer sets `keys` and `values`, which live there
        super().__init__()
        self.layer_idx = layer_idx
        self.methods = {Phase.PREFILL: prefill, Phase.DECODE: decode}
        self.seen = 0  # tokens processed so far: the true sequence length
        self.phase = Phase.PREFILL
        self.num_new = 0
        self.retained_after_prefill: int | None = None
        self.split = None  # a budget split over the layers at run time (`polykv.runtime.layer_budgets`)
        self._newest_last = False  # does the last slot hold the newest position (seen - 1)?
        self.merge_groups: MergeGroups | None = None  # the cache's groups of layers that merge together
        self.shared_rows = None  # many plans stepping together: the storage this layer shares (`row_storage`)
        self.keep_until = 0  # decode steps whose tokens all lie before this position evict nothing (`holding`)
        self.window: int | None = None  # a local layer's sliding window, as its attention passes it (`keep_window`)
        self.window_clean = True  # every held slot in the next query's window? (one query then needs no mask)
        self.entering: tuple[float, list[float] | None, int] | None = None  # held, per head, seen (`kv_held`)
        self.head_split = None  # a head-level budget rule (`polykv.methods.head_budgets.AdaKV`), or None: uniform

    def attend(self, module, query, key, value, dropout: float, scaling: float, kwargs):
        """This layer's attention step (`polykv.runtime.attention_step.attend`; the `AttendingLayer` interface)."""
        return attend(self, module, query, key, value, dropout, scaling, kwargs)

    @property
    def keys(self) -> torch.Tensor | None:
        """[b, h, n, d] the held keys (`LayerSlots`)."""
        return self.slots.keys

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:  # Hugging Face's layer code assigns them
        self.slots.keys = tensor

    @property
    def values(self) -> torch.Tensor | None:
        """[b, h, n, d] the held values (`LayerSlots`)."""
        return self.slots.values

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self.slots.values = tensor

    # ---- Hugging Face cache-layer interface ---------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        group = self.slots.group
        if group is not None and group.waits_for(self):  # the last forward pass stopped halfway
            group.flush()
        self.phase = Phase.PREFILL if self.seen == 0 else Phase.DECODE
        if self.entering is None and self.seen and self.seen >= self.keep_until:
            self.entering = (self.slots.held(), self.slots.held_per_head(), self.seen)
        slots = self.slots
        if self.seen == 0:
            slots.start(key_states, value_states)
        elif not self.methods[Phase.DECODE].passive or slots.holds_kv(slots.retained + q):
            slots.write(self, key_states, value_states)  # evicting, or keeping everything in reserved room
        else:  # a layer that keeps everything grows as Hugging Face's DynamicLayer does
            slots.append(key_states, value_states, self.seen)
        self.seen, self.num_new = self.seen + q, q
        self._newest_last = True  # tokens are appended last: the last slot holds position seen - 1
        hand_over(self)
        return slots.keys, slots.values

    @property
    def defers_merge(self) -> bool:
        """Will this decode step's one-slot merge run with the merge group's others (`polykv.runtime.merges`)?"""
        slots = self.slots
        return slots.group is not None and self.phase is Phase.DECODE and slots.holds_kv(slots.retained)

    def reserve(self, slots: int) -> None:
        """Room for `slots` more tokens in a layer that keeps everything in decode (an evicting layer has its
        own), so that they are written in place instead of the cache being copied at every step. For many
        plans decoding together (`polykv.runtime.many_plans`); a routed layer alone grows as Hugging Face's does."""
        if not self.methods[Phase.DECODE].passive or self.retained == 0 or self.keys.shape[-1] != self.values.shape[-1]:
            return
        self.slots.reserve(slots)

    def kv_view(self) -> torch.Tensor | None:
        """Keys and values as one [2, b, h, n, d] view when they live in one block, else None."""
        return self.slots.kv_view()

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.retained + query_length, 0

    def reset(self) -> None:
        super().reset()
        self.slots.reset()
        self.seen, self.keep_until, self.window_clean = 0, 0, True
        self.entering = None
        self.shared_rows = None
        if self.merge_groups is not None:
            self.merge_groups.forget()
        for method in self.methods.values():
            method.forget()

    def crop(self, tokens_to_remove: int) -> None:
        raise RoutedCacheError("cropping a routed cache is not supported (evicted tokens cannot be restored)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_batch(lambda t: t[indices, ...])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    # ---- routing ------------------------------------------------------------------------------
    @property
    def retained(self) -> int:
        """Slots physically held per KV head."""
        return self.slots.retained

    @property
    def padded(self) -> bool:
        """Do some slots hold no token (a head-level split's room, at position -1)? Then every query is masked."""
        return self.slots.padded

    @property
    def positions(self) -> torch.Tensor | None:
        """[b, h, n] true position of every slot (-1: padding, `padded`)."""
        return self.slots.positions

    @property
    def idle(self) -> bool:
        """Nothing for the methods to do this step (e.g. `full`): skip scoring and bookkeeping."""
        if self.phase is Phase.DECODE:
            return self.method.passive
        return self.method.passive and self.methods[Phase.DECODE].passive

    @property
    def holding(self) -> bool:
        """Is this a decode step whose tokens are all kept (`RoutedCache.keep_until`)?"""
        return self.phase is Phase.DECODE and self.seen <= self.keep_until

    @property
    def method(self) -> Method:
        return self.methods[self.phase]

    def needs(self) -> Needs:
        length = self.retained
        needs = self.method.needs(self.phase, length)
        if self.phase is Phase.PREFILL:
            needs = needs | self.methods[Phase.DECODE].needs_from_prefill(length)
            if self.split is not None:
                needs = needs | self.split.needs(self, length)
        return needs

    def finish_step(self, view: LayerView) -> None:
        """After attention: let the phase's method evict (and, in prefill, brief the decode method); a local
        layer first drops what left its window."""
        view = self.keep_window(view)
        if self.padded:  # a head-level split's room: no query sees it, every method evicts it first
            view = room_hidden(view, self.positions)
        if self.phase is Phase.DECODE:
            eviction = self.head_cut(lambda: self.method.step(view))
            # the method left a one-slot merge to the runtime: the group does it after its last layer
            deferred = eviction is not None and eviction.merge_deferred
            if deferred and not (view.defer_merge and eviction.dropped is not None):
                raise RoutedCacheError(f"layer {self.layer_idx}: {self.method.name} deferred a merge it could not")
            self._apply(eviction, deferred)
            if self.merge_groups is not None and self.merge_groups.pending:
                self.merge_groups.layer_done(self)
            return
        self.methods[Phase.DECODE].observe_prefill(view)
        if self.split is None:
            self.settle_prefill(self.head_cut(lambda: self.method.step(view)))
        else:  # the cache splits the budget and settles every layer once all have seen the prompt
            self.split.prefilled(self, view)

    def drops_one_by_score(self) -> bool:
        """Is this a plain decode step whose method drops exactly one slot, the lowest of its one-slot scores
        (`Method.one_slot_scores`), and keeps no per-slot state but its `one_slot_state`: one slot over the capacity
        (interval 1), the new token last, no window, not held? Then many plans' rows may drop theirs together
        (`polykv.runtime.row_storage`)."""
        method = self.method
        state = type(method).one_slot_state
        return (
            self.phase is Phase.DECODE
            and type(method).one_slot_scores is not None
            and method.interval == 1
            and method.capacity is not None
            and self.retained == method.capacity + 1
            and self._newest_last
            and self.window is None
            and not self.holding
            and self.head_split is None
            and all(not m.per_token or (m is method and m.per_token.keys() == {state}) for m in self.methods.values())
        )

    def dropped_together(self) -> None:
        """After `drops_one_by_score`: the blocks moved this layer's last slot into the dropped one (with other
        rows' at once); the layer holds the n - 1 slot prefixes, as after `_drop_one`."""
        n, state = self.retained, type(self.method).one_slot_state
        self.slots.dropped_together(n)
        if state is not None:
            self.method.per_token.dropped_together(state, n)
        self._newest_last = False
        if self.merge_groups is not None and self.merge_groups.pending:
            self.merge_groups.layer_done(self)

    def finish_idle_step(self) -> None:
        """After attention, for a layer whose methods have nothing to do (`idle`): the window, and the prefill
        settled with nothing evicted."""
        self.keep_window()
        if self.phase is Phase.PREFILL:
            self.settle_prefill(None)

    def keep_window(self, view: LayerView | None = None) -> LayerView | None:
        """A local layer drops the slots no later query can see (positions <= seen - window), as transformers'
        sliding-window cache does, before its method chooses among the rest; this step's `view` follows
        (`polykv.runtime.windows`: which slots stay, padding included, and the view after the cut)."""
        window = self.window
        if window is None or self.seen < window or self.retained == 0:
            self.window_clean = True
            return view
        keep, visible, self.window_clean = window_cut(self.positions, self.seen, window)
        if keep is not None:
            self._cut(keep)
        return None if view is None else windowed_view(view, self, keep, visible, self.window_clean)

    def head_cut(self, decide) -> Eviction | None:
        """The phase method's eviction `decide()`, its layer budget split over the KV heads by the plan's head rule
        (`head_split`; None: each head keeps the capacity, as the method chose)."""
        if self.head_split is None:
            return decide()
        return self.head_split.cut(decide, self.keys.shape[1])

    def settle_prefill(self, eviction: Eviction | None) -> None:
        self.method.forget()  # the prefill method's scores are never used again
        self._apply(eviction)
        self.retained_after_prefill = self.retained

    def _apply(self, eviction: Eviction | None, deferred: bool = False) -> None:
        """Keep what the eviction keeps. `deferred`: a one-slot eviction whose merge and key/value slot
        move the merge group does later (`polykv.runtime.merges`)."""
        if eviction is None:
            return
        newest_last, self._newest_last = self._newest_last, False  # slots move from here on
        n = self.retained
        if eviction.dropped is None and eviction.keep.shape[-1] == n - 1 and eviction.padding is None:
            # Keeping n - 1 distinct slots of 0..n-1 drops exactly one, per head: the slots sum to n(n-1)/2,
            # so the dropped slot is that sum minus the kept ones' (no search, no mask).
            eviction = Eviction(dropped=n * (n - 1) // 2 - eviction.keep.sum(dim=-1, keepdim=True))
        kept = n - 1 if eviction.dropped is not None else eviction.keep.shape[-1]
        capacity = self.method.capacity
        if eviction.padding is not None and capacity is not None:  # heads keep different counts: the layer's total
            kept = int((~eviction.padding).sum(dim=(1, 2)).max())
            capacity *= eviction.padding.shape[1]
        if capacity is not None and kept > capacity:
            raise RoutedCacheError(
                f"layer {self.layer_idx}: {self.method.name} kept {kept} slots, over its capacity {capacity}"
            )
        if eviction.dropped is not None:
            self._drop_one(eviction.dropped, n, newest_last, deferred)
            return
        self._cut(eviction.keep)
        if eviction.padding is not None:
            self.slots.hide(eviction.padding)

    def _cut(self, keep: torch.Tensor) -> None:
        """The layer keeps slots `keep` [b, h, k] of its keys, values and positions, and every method's per-slot
        state follows."""
        held = self.retained
        self.slots.gather(keep)
        for method in self.methods.values():
            method.per_token.gather(keep, held)

    def _drop_one(self, dropped: torch.Tensor, n: int, newest_last: bool, deferred: bool = False) -> None:
        """The usual decode step drops one slot of each head: the newest (last) slot moves into it instead
        of the whole cache being copied (slots are unordered; positions say where each token was), in the
        layer's blocks (`LayerSlots.drop_one`). `deferred`: the merge group moves the key/value slot and the
        methods' state after the merge."""
        self.slots.drop_one(self, dropped, n, newest_last, deferred)
        if not deferred:
            self.drop_method_states(dropped)

    def drop_method_states(self, dropped: torch.Tensor) -> None:
        """Every method's per-slot state follows a one-slot drop."""
        for method in self.methods.values():
            method.per_token.drop_one(dropped)

    def adopt(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Take over keys/values already computed for a prefix, as if prefilled here (nothing evicted): profiling
        reuses FullKV's prefix this way; only layers that keep everything can adopt one."""
        if not all(method.passive for method in self.methods.values()):
            raise RoutedCacheError(f"layer {self.layer_idx}: only a layer that keeps everything can adopt a prefix")
        self.lazy_initialization(keys, values)
        self.slots.start(keys, values)
        self.seen = keys.shape[-2]
        self.window_clean = False  # a local layer's window drops the prefix's old slots at its next step
        self.retained_after_prefill = self.retained

    def _map_batch(self, fn) -> None:
        if self.retained == 0:
            return
        self.slots.map_batch(fn)
        for method in self.methods.values():
            method.per_token.map_batch(fn)


class RoutedCache(Cache):
    """A Hugging Face `Cache` whose layers follow a plan."""

    layers: list[RoutedLayer]  # every layer is routed (`Cache` types them as any layer kind)

    def __init__(self, plan: Plan):
        layers = [
            RoutedLayer(idx, make_method(layer.prefill, idx), make_method(layer.decode, idx))
            for idx, layer in enumerate(plan.layers)
        ]
        super().__init__(layers=layers)
        self.plan = plan
        self.merge_groups = MergeGroups(layers)
        for layer in layers:
            layer.merge_groups = self.merge_groups
        if plan.allocation != "fixed":  # split at run time: a native rule, or a named rule for any method
            RunTimeSplit(layers, plan)
        if plan.head_allocation == "adakv":
            rule = AdaKV(AdaKVParams(**plan.head_allocation_params))
            for layer in layers:
                layer.head_split = rule

    def keep_until(self, position: int) -> None:
        """Tokens fed after the prompt at positions below `position` are kept whatever the plan: no method evicts
        on their steps, though each updates its per-slot state as on any decode step, and eviction resumes
        with the first token at `position` or later. The question-agnostic protocol: the prompt's pass is the
        context, which the plan compresses, then the question is fed at its true positions and kept in full
        before the answer (as kvpress's pipeline feeds a question after compressing the context)."""
        for layer in self.layers:
            layer.keep_until = position

    def retained_per_layer(self) -> list[int]:
        return [layer.retained for layer in self.layers]

    def kv_held(self) -> KVHeld:
        """Tokens held per KV head in each layer, measured (`LayerSlots.held`): `entering` the answer (as the first
        token at or after `keep_until` came in; until then, now) and at the `end`, with the tokens seen by each
        (`seen_*`); where heads hold different numbers, each head's (`heads_entering`, `heads_end`)."""
        end, first = [layer.slots.held() for layer in self.layers], self.layers[0]
        heads_end = [layer.slots.held_per_head() for layer in self.layers]
        entering = [now if layer.entering is None else layer.entering[0] for now, layer in zip(end, self.layers)]
        heads_entering = [
            now if layer.entering is None else layer.entering[1] for now, layer in zip(heads_end, self.layers)
        ]
        started = first.seen if first.entering is None else first.entering[2]
        held = KVHeld(entering=entering, end=end, seen_entering=started, seen_end=first.seen)
        if any(heads is not None for heads in heads_end):
            held |= KVHeld(heads_entering=heads_entering, heads_end=heads_end)
        return held

    def capacities(self, phase: Phase | str) -> list[int | None]:
        """Each layer's capacity in a phase (after native allocation, the capacities it chose)."""
        return [layer.methods[Phase(phase)].capacity for layer in self.layers]

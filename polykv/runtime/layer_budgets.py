"""A phase's budget split over the layers at run time, once every layer has seen the prompt (`RunTimeSplit`).

Two kinds of plans split at run time:
  native  one method with its own layer rule in every layer (PyramidKV, CAKE): the method's `allocate` splits
          the phase's total from each layer's `allocation_statistic`, then each layer settles its prefill with the
          scores it kept (`Method.settle`);
  cake    CAKE's rule (Qin et al., 2025: layer preference from the spatial and temporal dispersion of the last w
          queries' attention) for any method: each layer also runs a CAKE observer on the prompt's attention
          (`CAKE.observe_prefill`, the rule's parameters), the rule splits the total by those preferences, and
          each layer's method then takes its prefill step with the capacity it got (the step waits, holding the
          prompt's signals, which it asks for as if it had the least the rule gives: CAKE's window).
Either way a local layer never gets more than its window less one: the surplus goes to the layers that can hold
it (`within_bounds`). The cost of waiting: until the last layer has seen the prompt, every layer keeps its prompt
step's signals (CAKE's window rows, [b, query heads, w, n] in fp32, and what its own method asked for): at 32K tokens,
32 query heads and w = 32, about 134 MB a layer.
"""

from __future__ import annotations

from polykv.methods.attention.cake import CAKE, CAKEParams
from polykv.methods.base import LayerView, Needs
from polykv.methods.shared import within_bounds
from polykv.plan import Phase, Plan

RULES = ("cake",)  # the run-time rules a plan of any method can name as its allocation


class RunTimeSplit:
    """The split of each active phase's total (the sum of its capacities as written) over the cache's layers."""

    def __init__(self, layers: list, plan: Plan):
        self.layers = layers
        self.rule = plan.allocation
        self.totals = {phase: sum(layer[phase].capacity for layer in plan.layers) for phase in plan.scope.phases}
        self.observers = []
        if self.rule in RULES:
            params = CAKEParams(**plan.allocation_params)
            self.observers = [CAKE(None, params, i) for i in range(len(layers))]
        self.views: dict[int, LayerView] = {}
        for layer in layers:
            layer.split = self
            for phase in self.totals:  # unknown until every layer has seen the prompt
                layer.methods[phase].capacity = None

    def needs(self, layer, length: int) -> Needs:
        """What a layer's prefill step asks for beyond its methods': the observer's signals, and the method's own
        as it would ask at the least capacity the rule gives (CAKE's window)."""
        if not self.observers:
            return Needs()
        method = layer.methods[Phase.PREFILL]
        method.capacity = self.observers[0].params.window
        try:
            own = method.needs(Phase.PREFILL, length)
        finally:
            method.capacity = None
        return own | self.observers[layer.layer_idx].needs_from_prefill(length)

    def prefilled(self, layer, view: LayerView) -> None:
        """A layer has seen the prompt: keep what the split needs of it; after the last layer, split and settle."""
        if self.observers:
            self.observers[layer.layer_idx].observe_prefill(view)
            self.views[layer.layer_idx] = view
        else:
            layer.method.step(view)  # a native method scores the prompt and keeps the scores until it settles
        if layer.layer_idx != len(self.layers) - 1:
            return
        prompt_length = layer.seen
        bounds = [float("inf") if lay.window is None else lay.window - 1 for lay in self.layers]
        for phase, total in self.totals.items():
            methods = [lay.methods[phase] for lay in self.layers]
            if self.observers:
                statistics, rule, params = [o.preference for o in self.observers], CAKE, self.observers[0].params
            else:
                statistics, rule = [m.allocation_statistic() for m in methods], type(methods[0])
                params = methods[0].params
            split = rule.allocate(total, statistics, params, prompt_length)
            for method, capacity in zip(methods, within_bounds(split, bounds)):
                method.capacity = capacity
        for lay in self.layers:
            lay.settle_prefill(lay.head_cut(self._decision(lay)))

    def _decision(self, layer):
        """What settles a layer's prefill now that its capacity is known: its method's step on the prompt's view it
        waited with, or a native method's stored scores (`Method.settle`)."""
        method = layer.methods[Phase.PREFILL]
        if not self.observers:
            return method.settle
        view = self.views.pop(layer.layer_idx)
        return lambda: method.step(view)


__all__ = ["RULES", "RunTimeSplit"]

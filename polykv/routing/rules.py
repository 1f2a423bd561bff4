"""Allocation rules apart from the methods: how a phase's budget is split over the layers, for any method that scores
tokens, written into a plan as its per-layer capacities.

The field's layer rules are normally welded to one scorer (PyramidKV's pyramid to SnapKV's selection, CAKE's
preference to its own). Here a rule is applied to a plan whatever its methods: `apply_rule(plan, "pyramid")` gives
TOVA (or any method) PyramidKV's split of the same total. The static rules, decided before the run:

  uniform   the same capacity in every layer (layers one token apart when the total does not divide);
  pyramid   PyramidKV's layer rule (Cai et al., 2024, arXiv:2406.02069): with average capacity C, window w and L
            layers, the budgets beyond the window fall linearly with depth from 2(C - w) - k_top to
            k_top = (C - w) / beta, each layer then keeping its budget plus w (`PyramidKV.allocate`, the rule
            the PyramidKV preset applies at run time; with a prompt length the same clipping);
  squeeze   SqueezeAttention's rule (Wang et al., ICLR 2025, arXiv:2404.04793): the layers are split into three
            groups by how little their attention changes the hidden state (`polykv.profile.squeeze`, measured
            on calibration text; exact 1-D k-means, where the authors run scikit-learn's KMeans); the group that
            changes it least keeps `squeezed` x C per layer and the other layers share the rest equally (the
            authors' KV_class3 / ini_size: 0.08 / 0.21 and 0.25 / 0.4 in their examples; default 0.5);
  entropy   capacities proportional to each layer's attention entropy H_l, from a profile (the paper's entropy
            allocation, `polykv.routing.allocation.allocate_entropy`), for any method;
  ppl       capacities proportional to each layer's PPL sensitivity S_l in the phase, from a profile
            (`polykv.routing.allocation.ppl_sensitivity`), for any method.

On a model with local (sliding-window) layers no layer is given more than it can hold: what a rule gives a local
layer beyond its window less one goes to the layers that can hold it (`within_bounds`), and the plan's
description says so. CAKE's preference depends on the prompt, so the runtime decides it at prefill
(`polykv.runtime.layer_budgets`); Ada-KV's split over a layer's KV heads is the plan's `head_allocation`
(`polykv.methods.head_budgets`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from pydantic import ValidationError

from polykv.methods import REGISTRY, fit_params
from polykv.methods.attention.pyramidkv import PyramidKV, PyramidKVParams
from polykv.methods.shared import split_total, within_bounds
from polykv.plan import LayerPlan, Phase, Plan, PlanError

if TYPE_CHECKING:
    from polykv.runtime.cache import RoutedCache

STATIC_RULES = ("uniform", "pyramid", "squeeze", "entropy", "ppl")
PROFILE_RULES = ("entropy", "ppl")  # the rules whose statistics come from a profile


def rule_params(rule: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A rule's parameters with their defaults (pyramid: PyramidKV's window 8 and beta 20); a ValueError, one
    line, for an unknown rule or parameter."""
    given = dict(params or {})
    if rule == "uniform" or rule in PROFILE_RULES:
        if given:
            raise ValueError(f"the {rule} rule takes no parameters (got {', '.join(given)})")
        return {}
    if rule == "pyramid":
        unknown = [k for k in given if k not in ("window", "beta")]
        if unknown:
            raise ValueError(f"the pyramid rule takes window and beta (got {', '.join(unknown)})")
        try:
            checked = PyramidKVParams(**given)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ValueError(f"the pyramid rule's {first['loc'][0]}: {first['msg']}") from None
        return {"window": checked.window, "beta": checked.beta}
    if rule == "squeeze":
        unknown = [k for k in given if k != "squeezed"]
        squeezed = given.get("squeezed", 0.5)
        if unknown or isinstance(squeezed, bool) or not isinstance(squeezed, (int, float)) or not 0 < squeezed <= 1:
            raise ValueError(
                "the squeeze rule takes squeezed, the share of the average budget its least important layers keep, "
                f"in (0, 1] (got {given})"
            )
        return {"squeezed": float(squeezed)}
    raise ValueError(f"unknown allocation rule {rule!r} (the static rules: {', '.join(STATIC_RULES)})")


def three_groups(values: Sequence[float]) -> list[int]:
    """Each value's group, 0 (lowest) to 2 (highest), by the exact 1-D k-means with three clusters: the two cuts of
    the sorted values that minimise the within-group sum of squares (ties: the first such cuts; equal values may
    then fall in different groups, as they may under any k-means)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    xs = [float(values[i]) for i in order]
    n = len(xs)
    if n < 3:
        raise ValueError(f"the squeeze rule groups layers in three: it needs at least 3 layers (got {n})")

    def sse(a: int, b: int) -> float:  # xs[a:b]
        part = xs[a:b]
        mean = sum(part) / len(part)
        return sum((x - mean) ** 2 for x in part)

    pairs = [(i, j) for i in range(1, n - 1) for j in range(i + 1, n)]
    cuts = min(pairs, key=lambda c: sse(0, c[0]) + sse(c[0], c[1]) + sse(c[1], n))
    groups = [0] * n
    for rank, i in enumerate(order):
        groups[i] = 0 if rank < cuts[0] else 1 if rank < cuts[1] else 2
    return groups


def rule_capacities(
    rule: str,
    total: int,
    num_layers: int,
    params: Mapping[str, Any] | None = None,
    prompt_length: int | None = None,
    windows: Sequence[int | None] | None = None,
    statistics: Sequence[float] | None = None,
) -> list[int]:
    """`total` tokens (per KV head) split over `num_layers` layers by `rule`, no layer above what it can hold
    (`windows`: each layer's sliding window, None for a global layer; `statistics`: the squeeze rule's per-layer
    attention similarity, the entropy rule's entropy, the ppl rule's sensitivity)."""
    values = rule_params(rule, params)
    if rule in ("squeeze", *PROFILE_RULES) and (statistics is None or len(statistics) != num_layers):
        what = {"squeeze": "attention similarity", "entropy": "attention entropy", "ppl": "PPL sensitivity"}[rule]
        raise ValueError(f"the {rule} rule needs one {what} per layer ({num_layers})")
    if rule == "uniform":
        capacities = split_total([1.0] * num_layers, total)
    elif rule in PROFILE_RULES:
        capacities = split_total([max(0.0, float(s)) for s in statistics or ()], total)
    elif rule == "squeeze":
        squeezed = [g == 2 for g in three_groups(statistics or ())]
        low = values["squeezed"] * total / num_layers
        high = (total - low * sum(squeezed)) / (num_layers - sum(squeezed))
        capacities = split_total([low if s else high for s in squeezed], total)
    else:
        capacities = PyramidKV.allocate(total, [None] * num_layers, PyramidKVParams(**values), prompt_length)
    bounds = [float("inf") if w is None else w - 1 for w in (windows or [None] * num_layers)]
    return within_bounds(capacities, bounds)


def apply_rule(
    plan: Plan,
    rule: str,
    params: Mapping[str, Any] | None = None,
    prompt_length: int | None = None,
    windows: Sequence[int | None] | None = None,
    statistics: Sequence[float] | Mapping[str, Sequence[float]] | None = None,
) -> Plan:
    """The plan with each active phase's capacities split by `rule`: the same total (the sum of its capacities as
    written), the same methods, fixed allocation; no layer under the fewest tokens its method runs with, and a
    method's parameters shrunk (`fit_params`) only in a layer given too few tokens for them. `statistics`: one list
    for every phase, or one per phase ({"prefill": [...], ...}: the ppl rule's sensitivity is the phase's). A phase
    with a `full` layer, or a native allocation (its method's own rule), is refused in one line (PlanError)."""
    if plan.allocation != "fixed":
        raise PlanError(f"{plan.name}: a rule applies to a plan of fixed allocation (this one is {plan.allocation})")
    values = rule_params(rule, params)
    layers = [{phase: layer[phase] for phase in Phase} for layer in plan.layers]
    refitted: list[str] = []
    floored: list[str] = []
    for phase in plan.scope.phases:
        assigned = [layer[phase] for layer in plan.layers]
        written = [a.capacity for a in assigned if a.capacity is not None]
        if len(written) < len(assigned):
            raise PlanError(f"{plan.name}: the {phase.value} phase has a full layer, so it has no total to split")
        total = sum(written)
        stats = statistics.get(phase.value) if isinstance(statistics, Mapping) else statistics
        capacities = rule_capacities(rule, total, plan.num_layers, values, prompt_length, windows, stats)
        least = max(_least_capacity(a.method, a.params) for a in assigned)
        if min(capacities) < least:  # e.g. the ppl rule gives a layer 1 token, and SnapKV needs 2 at the least
            bounds = [float("inf") if w is None else w - 1 for w in (windows or [None] * plan.num_layers)]
            capacities = split_total(capacities, total, minimum=least, maximum=bounds)
            floored.append(f"{least} tokens in the {phase.value} phase")
        for i, (a, capacity) in enumerate(zip(assigned, capacities)):
            fitted = fit_params(a.method, a.params, capacity)  # a window the layer's share cannot hold shrinks
            if fitted != a.params:
                refitted.append(f"{i} ({phase.value})")
            layers[i][phase] = a.model_copy(update={"capacity": capacity, "params": fitted})
    shown = ", ".join(f"{k} {v}" for k, v in values.items())
    local = windows is not None and any(w is not None for w in windows)
    note = " A local layer gets at most its window less one; what the rule gave it beyond went to the others." * local
    if floored:
        note += (
            f" Every layer gets at least {' and '.join(floored)}, the fewest its method runs with: the rule gave"
            " some less, and what they got came from the others in proportion."
        )
    if refitted:
        note += (
            f" Layers {', '.join(refitted)} got too few tokens for their method's window or sinks, which shrink to a"
            " quarter of the layer's capacity there (`params_that_fit`'s rule)."
        )
    return plan.with_layers(
        [LayerPlan(prefill=layer[Phase.PREFILL], decode=layer[Phase.DECODE]) for layer in layers],
        name=f"{plan.name}-{rule}",
        description=(plan.description + " " if plan.description else "")
        + f"Capacities split by the {rule} rule{f' ({shown})' if shown else ''}"
        + (f" for a {prompt_length}-token prompt" if prompt_length else "")
        + "."
        + note,
        provenance={
            "built_by": "apply_rule",
            "rule": rule,
            "rule_params": values,
            "prompt_length": prompt_length,
            **({"statistics": _rounded(statistics)} if statistics is not None else {}),
            "source": plan.name,
            "source_provenance": dict(plan.provenance),
        },
    )


def _least_capacity(method: str, params: Mapping[str, Any]) -> int:
    """The fewest tokens a layer can run `method` with, its parameters shrunk to fit (`fit_params`)."""
    capacity = 1
    while REGISTRY[method].check(fit_params(method, params, capacity), capacity) and capacity < 4096:
        capacity += 1
    return capacity


def predicted_split(model, plan: Plan, sequences: Sequence[Sequence[int]]) -> dict[str, list[float]]:
    """A run-time rule's split (`allocation: cake`) predicted on `sequences`: per active phase, the capacity each
    layer got at prefill, the mean over the sequences (a prompt of the workload gets its own)."""
    import torch

    from polykv.runtime.routed import routed

    if plan.allocation != "cake":
        raise PlanError(
            f"{plan.name}: only a run-time split is predicted (this plan's allocation is {plan.allocation})"
        )
    got: dict[str, list[list[int]]] = {phase.value: [] for phase in plan.scope.phases}
    device = next(model.parameters()).device
    with routed(model, plan) as session, torch.no_grad():
        for ids in sequences:
            model(torch.tensor([list(ids)], device=device), use_cache=True)
            for phase in plan.scope.phases:
                split = cast("RoutedCache", session.cache).capacities(phase)
                got[phase.value].append(cast(list[int], split))  # the rule gave every layer a capacity
    return {phase: [sum(column) / len(column) for column in zip(*rows)] for phase, rows in got.items()}


def _rounded(statistics):
    if isinstance(statistics, Mapping):
        return {phase: _rounded(values) for phase, values in statistics.items()}
    return [round(float(s), 6) for s in statistics]


__all__ = [
    "PROFILE_RULES",
    "STATIC_RULES",
    "apply_rule",
    "predicted_split",
    "rule_capacities",
    "rule_params",
    "three_groups",
]

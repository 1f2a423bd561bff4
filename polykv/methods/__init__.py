"""The method registry: the one list of eviction methods PolyKV knows."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from polykv.methods.attention.cake import CAKE
from polykv.methods.attention.h2o import H2O
from polykv.methods.attention.pyramidkv import PyramidKV
from polykv.methods.attention.scissorhands import Scissorhands
from polykv.methods.attention.snapkv import SnapKV
from polykv.methods.attention.tova import TOVA
from polykv.methods.attention_free.expected_attention import ExpectedAttention
from polykv.methods.attention_free.keydiff import KeyDiff
from polykv.methods.attention_free.knorm import Knorm
from polykv.methods.attention_free.lagkv import LagKV
from polykv.methods.attention_free.random import Random
from polykv.methods.attention_free.streamingllm import StreamingLLM
from polykv.methods.base import LayerView, Method, Needs
from polykv.methods.eviction import Eviction
from polykv.methods.full import Full
from polykv.methods.head_budgets import AdaKVParams
from polykv.methods.merging.cam import CaM
from polykv.methods.merging.d2o import D2O
from polykv.methods.params import describe_param_error
from polykv.plan import FULL, Phase, PhaseAssignment, Plan, PlanError

# One line per method, in the order `polykv methods` lists them.
_METHODS: list[type[Method]] = [
    Full,
    StreamingLLM,
    H2O,
    TOVA,
    SnapKV,
    PyramidKV,
    CAKE,
    D2O,
    Scissorhands,
    CaM,
    Knorm,
    KeyDiff,
    LagKV,
    ExpectedAttention,
    Random,
]
REGISTRY: dict[str, type[Method]] = {cls.name: cls for cls in _METHODS}


def for_phase(phase: Phase | str) -> list[str]:
    """The eviction methods that run in `phase`, in registry order (`full`, the reference that keeps
    everything, is not one of them)."""
    phase = Phase(phase)
    return [name for name, cls in REGISTRY.items() if name != FULL and phase in cls.phases]


def make_method(assignment: PhaseAssignment, layer_idx: int = 0) -> Method:
    return REGISTRY[assignment.method](
        assignment.capacity, assignment.params, layer_idx=layer_idx, interval=assignment.interval
    )


def validate_plan(
    plan: Plan, num_layers: int | None = None, context_length: int | None = None, *, within_context: bool = False
) -> Plan:
    """Raise `PlanError` (one line per problem) unless the plan fits the model and the methods.

    `num_layers`: the model's layer count; `context_length`: its context in tokens, which bounds every
    token-count parameter (windows, sinks, histories, kernels). None: not checked. `within_context`:
    capacities and intervals must be at most the context too (see `Plan.problems`)."""
    least = None
    if plan.allocation == "cake":  # CAKE's rule for any method: its parameters, and the least it gives a layer
        rule = REGISTRY["cake"]
        problems = rule.check(plan.allocation_params, None)
        if problems:
            raise PlanError([f"allocation_params: {p}" for p in problems])
        least = rule.Params(**plan.allocation_params).window
    if plan.head_allocation == "adakv":
        try:
            AdaKVParams(**plan.head_allocation_params)
        except ValidationError as exc:
            raise PlanError(
                [f"head_allocation_params: {describe_param_error('adakv', AdaKVParams, e)}" for e in exc.errors()]
            ) from None
    return plan.validate_for(num_layers, REGISTRY, context_length, within_context=within_context, least=least)


def params_that_fit(method: str, capacity: int) -> dict:
    """Default parameters, except windows / sinks that would not fit under `capacity`: a quarter of it.

    The values are plain Python ints (parameters are strict), whatever integer type `capacity` has."""
    return fit_params(method, {}, operator.index(capacity))


def fit_params(method: str, params: Mapping[str, Any], capacity: int) -> dict[str, Any]:
    """`params` with every window / sink that would not fit under `capacity` shrunk (to a quarter of it, unless the
    method says otherwise: `Method.fit`): the rule of `params_that_fit`, applied to given parameters."""
    return REGISTRY[method].fit(params, capacity)


__all__ = [
    "REGISTRY",
    "fit_params",
    "Eviction",
    "LayerView",
    "Method",
    "Needs",
    "for_phase",
    "make_method",
    "params_that_fit",
    "validate_plan",
]

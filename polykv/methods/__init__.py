"""The method registry: the one list of eviction methods PolyKV knows."""

from __future__ import annotations

from polykv.methods.base import Eviction, LayerView, Method, Needs
from polykv.methods.full import Full
from polykv.methods.h2o import H2O
from polykv.methods.snapkv import SnapKV
from polykv.methods.streamingllm import StreamingLLM
from polykv.methods.tova import TOVA
from polykv.plan import PhaseAssignment, Plan

REGISTRY: dict[str, type[Method]] = {cls.name: cls for cls in (Full, StreamingLLM, H2O, TOVA, SnapKV)}


def make_method(assignment: PhaseAssignment) -> Method:
    return REGISTRY[assignment.method](assignment.capacity, assignment.params)


def validate_plan(plan: Plan, num_layers: int | None = None) -> Plan:
    """Raise `PlanError` (one line per problem) unless the plan fits the model and the methods."""
    return plan.validate_for(num_layers, REGISTRY)


__all__ = ["REGISTRY", "Eviction", "LayerView", "Method", "Needs", "make_method", "validate_plan"]

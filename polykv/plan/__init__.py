"""Plans: which KV-eviction method runs, with how many retained tokens, in every layer and phase.

A plan is a versioned JSON file (never pickle). For layer l and phase p in {prefill, decode} it names a
method r_{l,p}, its capacity b_{l,p} (retained tokens per KV head) and optional method parameters.
`full` keeps every token and therefore has no capacity. The plan-level `scope` says which phases are
active; the inactive phase runs `full` in every layer.

This package knows nothing about individual methods: validation takes a catalog (name -> phases, params
check) so that the dependency stays `methods -> plan`. `polykv.methods.validate_plan` supplies it.

The plan is `Plan` (`polykv.plan.schema`: its fields, construction and JSON file); what one layer runs in
each phase is `polykv.plan.cells`, the checks `polykv.plan.checks`, the summary `polykv.plan.summary`. Every
name is importable from `polykv.plan`.
"""

from __future__ import annotations

from polykv.plan.cells import FULL, FULL_ASSIGNMENT, MAX_TOKENS, LayerPlan, Phase, PhaseAssignment, Scope
from polykv.plan.checks import MAX_LAYERS, MethodInfo
from polykv.plan.schema import FORMAT, MAX_PLAN_BYTES, VERSION, Plan, PlanError
from polykv.plan.summary import PhaseSummary, PlanSummary

__all__ = [
    "FORMAT", "FULL", "FULL_ASSIGNMENT", "MAX_LAYERS", "MAX_PLAN_BYTES", "MAX_TOKENS", "VERSION", "LayerPlan",
    "MethodInfo", "Phase", "PhaseAssignment", "PhaseSummary", "Plan", "PlanError", "PlanSummary", "Scope",
]  # fmt: skip

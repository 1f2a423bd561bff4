"""A profile cell's plan: one method at one layer in one phase (scope), at the calibration capacity with its
calibration parameters (windows and sinks shrunk to fit, as in plans built from profiles); every other layer and
phase keeps everything."""

from __future__ import annotations

from polykv.methods import params_that_fit as calibration_params  # profiles and plans use one rule
from polykv.plan import FULL, LayerPlan, Phase, PhaseAssignment, Plan, Scope


def single_layer_plan(num_layers: int, layer: int, scope: Phase, method: str, capacity: int) -> Plan:
    """`method` at `layer` in `scope`; everything else full."""
    if method == FULL:
        active = PhaseAssignment(method=FULL)
    else:
        active = PhaseAssignment(method=method, capacity=capacity, params=calibration_params(method, capacity))
    layers = [LayerPlan() for _ in range(num_layers)]
    layers[layer] = LayerPlan(**{scope.value: active})
    return Plan(name=f"profile-{method}-L{layer}-{scope.value}", scope=Scope(scope.value), layers=layers)

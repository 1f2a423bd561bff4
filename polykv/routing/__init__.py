"""Routing: from an offline per-layer profile to a plan (which method where, with how many tokens).

  toprank       `toprank` picks, per layer, the method with the best profile statistic among the methods
                that run in the phase; `route_score` is the profile score S(rho) of a route.
  allocation    how a budget (the average capacity b) is split over the layers for a fixed route:
                uniform, by entropy or by PPL sensitivity; `scale_budget` moves a plan to another budget.
  rules         a named layer rule (uniform, PyramidKV's pyramid, SqueezeAttention's) applied to any plan of
                fixed allocation, whatever its methods; a local layer never given more than its window holds.
  placement     random placements with the same method counts as a route (the control for a routing
                result).
  from_profile  `plan_from_route` writes routes and capacities as a `Plan`; `plan_from_profile` builds
                one from a profile (TopRank in each phase, capacities by an allocation rule).
  confidence    how often TopRank's pick stays the best when the calibration sequences are resampled.

Executing a plan is `polykv.runtime.routed`; this package only decides what the plan says.
"""

from polykv.routing.allocation import (
    allocate_entropy,
    allocate_ppl,
    allocate_uniform,
    ppl_sensitivity,
    scale_budget,
    window_floor,
)
from polykv.routing.confidence import NOISE_WARNING, NOISY_ROUTE, is_noisy, route_confidence
from polykv.routing.from_profile import ALLOCATIONS, plan_from_profile, plan_from_route
from polykv.routing.placement import placement_count, sample_placements
from polykv.routing.toprank import PROFILE_COLUMNS, STATISTICS, route_score, toprank

__all__ = [
    "ALLOCATIONS",
    "NOISE_WARNING",
    "NOISY_ROUTE",
    "PROFILE_COLUMNS",
    "STATISTICS",
    "allocate_entropy",
    "allocate_ppl",
    "allocate_uniform",
    "is_noisy",
    "placement_count",
    "plan_from_profile",
    "plan_from_route",
    "ppl_sensitivity",
    "route_confidence",
    "route_score",
    "sample_placements",
    "scale_budget",
    "toprank",
    "window_floor",
]

"""A plan's summary: per phase, the total and average capacity, the layers with a capacity, how many layers run
each method and each eviction interval (`Plan.summary`), and its lines as `polykv plan show` prints them."""

from __future__ import annotations

from dataclasses import dataclass, field

from polykv.plan.cells import Phase, Scope


@dataclass(frozen=True)
class PhaseSummary:
    total_capacity: int  # B_phi: retained tokens per KV head summed over the layers that have a capacity
    average_capacity: float | None  # b_phi = B_phi / (layers with a capacity); None when every layer is full
    bounded_layers: int
    method_counts: dict[str, int]  # N_r
    # eviction interval -> layers evicting with it, for intervals above 1 (an approximation of the rule)
    interval_counts: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PlanSummary:
    name: str
    scope: Scope
    allocation: str
    num_layers: int
    phases: dict[Phase, PhaseSummary]
    head_allocation: str = "uniform"
    alpha_safeguard: float | None = None

    def lines(self) -> list[str]:
        rule = {
            "native": ", native allocation (the method splits each phase's total over the layers at run time)",
            "cake": ", allocation cake (CAKE's layer rule splits each phase's total over the layers at run time, "
            "from the prompt's attention, whatever the methods)",
        }
        heads = ""
        if self.head_allocation == "adakv":
            heads = (
                f"; heads adakv (Ada-KV splits each layer's capacity x KV heads across its heads at each cut, "
                f"every head keeping at least {self.alpha_safeguard:g} of the capacity)"
            )
        out = [
            f"plan {self.name!r}: {self.num_layers} layers, scope {self.scope.value}"
            f"{rule.get(self.allocation, '')}{heads}"
        ]
        for phase, s in self.phases.items():
            avg = "-" if s.average_capacity is None else f"{s.average_capacity:g}"
            counts = ", ".join(f"{m} x{n}" for m, n in sorted(s.method_counts.items(), key=lambda kv: (-kv[1], kv[0])))
            full = self.num_layers - s.bounded_layers
            out.append(
                f"  {phase.value:<7} total capacity B={s.total_capacity}, average b={avg}"
                f"{f' ({full} full layers unbounded)' if full and s.bounded_layers else ''}; methods: {counts}"
            )
            if s.interval_counts:
                every = ", ".join(f"every {k} steps x{n}" for k, n in sorted(s.interval_counts.items()))
                out.append(
                    f"          eviction interval (approximation: a layer holds up to capacity + interval): {every}"
                )
        return out

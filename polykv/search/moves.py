"""The search's moves: change one cell's method, move capacity between two layers of a phase, split a phase's
total by an allocation rule, or change how each layer's budget splits over its KV heads.

The search space is every fixed-allocation plan of the given scope whose active phases each keep an
exact total T_p = L x b (b: the budget, the average capacity). Two moves, both from one plan to a
neighbour in that space:

  method    (phase p, layer l, method r): layer l runs r in phase p (any method that runs in p, never
            `full`), same capacity. The total does not change.
  transfer  (phase p, donor d, receiver l, amount a): layer d gives a tokens of capacity to layer l in
            phase p. The total does not change; the donor keeps at least `min_capacity`.
  rule      (phase p, rule r): phase p's total split over the layers by the static rule r (`RULE_MOVES`:
            uniform, PyramidKV's pyramid; with a profile of the phase also its entropy and ppl rules;
            `polykv.routing.rules`), the methods kept. The total does not change; on a hybrid model it is proposed
            only while every layer holds its whole capacity (then so is the KV held). SqueezeAttention's rule is not
            proposed: its statistic is measured on calibration text the search does not read.
  heads     (h): each layer's budget split over its KV heads by h ("adakv" or back to "uniform",
            `polykv.methods.head_budgets`); where a plan cannot take it (a merging decode method, an eviction
            interval above 1) it is not proposed.
So a search from TOVA everywhere can answer "is a published rule, or a searched split, better", one step at a time.

On a hybrid model (local layers with a sliding window W, `polykv.kv_memory`) the budget counts capacity as
written, and the moves keep the retained KV exact too: a local layer never holds more than W - 1 tokens, so a
transfer is proposed only when the donor's whole capacity is held (at most W - 1) and the receiver's stays
held (at most W - 1 after it), and a method move only where the capacity is below W - 1 (at or above it the
window decides what the layer keeps, and the method never evicts). Every neighbour then keeps exactly the
KV tokens its plan keeps: at a budget of W or more the local layers keep their windows and the search moves
the global layers' memory among them.

A cell's parameters follow its capacity: the method's base parameters (the start plan's, else the
profile's, else the defaults) with every window or sink that would not fit under the capacity shrunk
to a quarter of it (`polykv.methods.params_that_fit`'s rule). A neighbour that fails validation (a
parameter that still does not fit) is not proposed.

`proposals` lists the neighbours of a plan ranked by the profile, best first: method moves by the gain
in the profile statistic at that layer (TopRank's evidence, sign * (score(l, r) - score(l, current))),
transfers by how much more the receiver's current method suffers than the donor's (profile dPPL, or
1 - cosine). The two lists are interleaved rank by rank, since their scores are not in one unit; the few rule and
heads moves, which the profile cannot rank, come first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from polykv.kv_memory import window_bound
from polykv.methods import REGISTRY, fit_params, for_phase, validate_plan
from polykv.plan import FULL, LayerPlan, Phase, PhaseAssignment, Plan, PlanError

TRANSFER_STEPS = (0.125, 0.25, 0.5)  # transfer amounts, as shares of the budget b
MOVE_KINDS = ("method", "transfer", "rule", "heads")
RULE_MOVES = ("uniform", "pyramid")  # the static rules a move may split a phase's total by (no statistics needed)


@dataclass(frozen=True)
class Move:
    kind: str  # "method" | "transfer" | "rule" | "heads"
    phase: str
    layer: int  # the cell that changes method, or the receiver of a transfer (rule and heads moves: 0)
    method: str | None = None  # method moves; the rule of a rule move, the head rule of a heads move
    donor: int | None = None  # transfers
    amount: int = 0  # transfers
    prior: float = 0.0  # the profile's ranking score (higher: proposed first)
    capacities: tuple[int, ...] = ()  # rule moves: the phase's capacities the rule gives, layer 0 first

    def describe(self) -> str:
        if self.kind == "method":
            return f"{self.phase} L{self.layer} -> {self.method}"
        if self.kind == "rule":
            return f"{self.phase} split by the {self.method} rule"
        if self.kind == "heads":
            return f"KV heads -> {self.method}"
        return f"{self.phase} L{self.donor} -> L{self.layer}: {self.amount} tokens"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": self.describe()}


def totals(plan: Plan) -> dict[str, int]:
    """Per active phase, the sum of the layers' capacities."""
    return {p.value: sum(layer[p].capacity or 0 for layer in plan.layers) for p in plan.scope.phases}


def check_space(plan: Plan, budget: int) -> None:
    """ValueError unless `plan` is in the search space: fixed allocation, no `full` cell in an active
    phase, and every active phase's total exactly num_layers x budget."""
    if plan.allocation != "fixed":
        raise ValueError(f"plan {plan.name!r}: the search starts from fixed-allocation plans only")
    want = plan.num_layers * budget
    for phase in plan.scope.phases:
        if any(layer[phase].method == FULL for layer in plan.layers):
            raise ValueError(f"plan {plan.name!r} keeps every token in a {phase.value} layer: not in the search space")
    bad = {p: t for p, t in totals(plan).items() if t != want}
    if bad:
        phase, total = next(iter(bad.items()))
        raise ValueError(
            f"plan {plan.name!r}: the {phase} capacities add up to {total}, not {plan.num_layers} x {budget} = {want}"
        )


def base_params(plans: Sequence[Plan], profile=None) -> dict[str, dict[str, Any]]:
    """Each method's base parameters: from the first plan cell that runs it, else the profile's, else {}."""
    out: dict[str, dict[str, Any]] = {}
    for plan in plans:
        for layer in plan.layers:
            for phase in plan.scope.phases:
                cell = layer[phase]
                out.setdefault(cell.method, dict(cell.params))
    measured = dict(profile.meta.method_params) if profile is not None else {}
    for method in REGISTRY:
        if method != FULL:
            out.setdefault(method, dict(measured.get(method, {})))
    return out


def apply(plan: Plan, move: Move, params: Mapping[str, Mapping[str, Any]]) -> Plan:
    """The neighbour `move` leads to (validated; PlanError when a cell does not fit). The totals of every
    active phase are unchanged, and this is checked."""
    phase = Phase(move.phase)
    cells = [{p: layer[p] for p in Phase} for layer in plan.layers]

    def cell(method: str, capacity: int) -> PhaseAssignment:
        return PhaseAssignment(method=method, capacity=capacity, params=fit_params(method, params[method], capacity))

    target = cells[move.layer][phase]
    heads = {}
    if move.kind == "method":
        cells[move.layer][phase] = cell(move.method, target.capacity)
    elif move.kind == "transfer":
        donor = cells[move.donor][phase]
        cells[move.donor][phase] = cell(donor.method, donor.capacity - move.amount)
        cells[move.layer][phase] = cell(target.method, target.capacity + move.amount)
    elif move.kind == "rule":
        for c, capacity in zip(cells, move.capacities):
            c[phase] = cell(c[phase].method, capacity)
    elif move.kind == "heads":
        heads = {"head_allocation": move.method, "head_allocation_params": {}}
    else:
        raise ValueError(f"unknown move kind {move.kind!r}")
    out = plan.with_layers([LayerPlan(prefill=c[Phase.PREFILL], decode=c[Phase.DECODE]) for c in cells], **heads)
    if totals(out) != totals(plan):  # a guard: neither move may change what a phase keeps in all
        raise AssertionError(f"move {move.describe()} changed the totals {totals(plan)} -> {totals(out)}")
    return validate_plan(out, plan.num_layers)


def _rule_statistics(profile, phase: Phase) -> dict[str, list[float]]:
    """The profile rules' statistics in `phase` ({"entropy": ..., "ppl": ...}; none without a profile, or where the
    profile did not measure the phase): what makes them rule moves too."""
    if profile is None or phase.value not in profile.meta.scopes:
        return {}
    from polykv.routing.allocation import ppl_sensitivity

    return {"entropy": list(profile.entropy), "ppl": ppl_sensitivity(profile.table, phase)}


def _profile_scores(profile, phase: Phase, statistic: str) -> dict[tuple[int, str], float]:
    """{(layer, method): sign * statistic}: higher is better."""
    from polykv.profile.store import STATISTICS

    rows = profile.table[profile.table["scope"] == phase.value]
    sign = STATISTICS[statistic]
    return {
        (int(layer), str(method)): sign * float(value)
        for layer, method, value in zip(rows["layer"], rows["method"], rows[statistic])
        if not math.isnan(float(value))
    }


def proposals(
    plan: Plan,
    budget: int,
    params: Mapping[str, Mapping[str, Any]],
    profile=None,
    statistic: str = "dppl",
    min_capacity: int = 2,
    steps: Sequence[float] = TRANSFER_STEPS,
    context_length: int | None = None,
    windows: Sequence[int | None] | None = None,
) -> list[tuple[Move, Plan]]:
    """Every valid neighbour of `plan` as (move, plan), ranked by the profile (see the module docstring);
    without a profile, in a fixed order (layer, then registry order; the search shuffles it). `windows`: each
    layer's sliding window (None: global), from `polykv.models.layer_windows`."""
    from polykv.routing.rules import rule_capacities

    bounds = [window_bound(w) for w in (windows or [None] * plan.num_layers)]
    amounts = sorted({max(1, round(f * budget)) for f in steps})
    method_moves: list[Move] = []
    transfer_moves: list[Move] = []
    heads = "uniform" if plan.head_allocation == "adakv" else "adakv"
    whole_plan_moves = [Move("heads", plan.scope.phases[0].value, 0, method=heads)]
    for phase in plan.scope.phases:
        now = tuple(layer[phase].capacity for layer in plan.layers)
        # only where every layer holds its whole capacity: then a rule keeps the KV held (`within_bounds`)
        statistics = _rule_statistics(profile, phase)
        for rule in [*RULE_MOVES, *statistics] if all(c <= bound for c, bound in zip(now, bounds)) else ():
            given = tuple(
                rule_capacities(rule, sum(now), plan.num_layers, windows=windows, statistics=statistics.get(rule))
            )
            if given != now and min(given) >= min_capacity:
                whole_plan_moves.append(Move("rule", phase.value, 0, method=rule, capacities=given))
        scores = _profile_scores(profile, phase, statistic) if profile is not None else {}
        current = [layer[phase] for layer in plan.layers]
        for layer, cell in enumerate(current):
            if cell.capacity >= bounds[layer]:
                continue  # the window keeps what this layer holds: no method changes it
            here = scores.get((layer, cell.method), 0.0)
            for method in for_phase(phase):
                if method != cell.method:
                    gain = scores.get((layer, method), -math.inf) - here if scores else 0.0
                    method_moves.append(Move("method", phase.value, layer, method=method, prior=gain))
        # A layer whose current method loses more in the profile wants capacity more.
        need = [-scores.get((layer, cell.method), 0.0) for layer, cell in enumerate(current)]
        for receiver in range(plan.num_layers):
            for donor in range(plan.num_layers):
                if donor == receiver:
                    continue
                for amount in amounts:
                    if current[donor].capacity - amount < min_capacity:
                        continue
                    if (
                        current[donor].capacity > bounds[donor]
                        or current[receiver].capacity + amount > bounds[receiver]
                    ):
                        continue  # the tokens moved would not be held on both sides: the retained KV would change
                    if context_length is not None and current[receiver].capacity + amount > context_length:
                        continue
                    transfer_moves.append(
                        Move(
                            "transfer",
                            phase.value,
                            receiver,
                            donor=donor,
                            amount=amount,
                            prior=need[receiver] - need[donor],
                        )
                    )
    ranked = []
    for moves in (method_moves, transfer_moves):
        order = sorted(range(len(moves)), key=lambda k: (-moves[k].prior, k))  # stable: ties keep list order
        ranked.append([moves[k] for k in order])
    interleaved = whole_plan_moves + [m for pair in _zip_longest(*ranked) for m in pair if m is not None]
    out = []
    for move in interleaved:
        try:
            out.append((move, apply(plan, move, params)))
        except PlanError:
            continue  # a parameter that cannot fit this capacity: not a neighbour
    return out


def _zip_longest(a: list, b: list) -> list[tuple]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else None, b[i] if i < len(b) else None) for i in range(n)]


__all__ = [
    "RULE_MOVES",
    "TRANSFER_STEPS",
    "Move",
    "apply",
    "base_params",
    "check_space",
    "fit_params",
    "proposals",
    "totals",
]

"""Local search over plans at a fixed total capacity, with successive halving and an evaluation budget.

Problem: minimise the objective J(pi) (`polykv.search.objective`: mean KL(FullKV || pi) over the
search sequences, or dPPL) over the fixed-allocation plans pi whose active phases each keep exactly
L x b tokens (`polykv.search.moves`).

Procedure (`search`):
  1. Every start plan (TopRank, the best homogeneous plan, ...) is evaluated on all N search sequences;
     the best is the incumbent.
  2. A round: from the incumbent's neighbours not yet tried from it (`moves.proposals`, ranked by the
     profile), take `candidates` of them: the better-ranked half in rank order, the rest drawn at random
     (seeded) from the others, so that moves the profile ranks low are tried too. Successive halving
     over a fresh seeded order of the sequences: evaluate the candidates on the first `first_rung`
     sequences, keep the better half, double the sequences, ... until the survivors have all N; the
     best survivor replaces the incumbent when its J over all N is strictly lower.
  3. Stop when the next execution would exceed `evaluations` (plan executions on one sequence each,
     starts included; cached results cost nothing) or when every neighbour of the incumbent was tried.

Each rung (and the starts) is scored with one `objective.values(...)` call: in this process one after
another, or as one parallel batch when the objective has an executor (`polykv.search.parallel`); the
result, the trace and the executions are the same either way.

The returned plan is the final incumbent: its J on the search sequences is never above the best
start's. The same inputs and seed give the same plan.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from polykv.plan import Plan, Scope
from polykv.search.moves import MOVE_KINDS, TRANSFER_STEPS, Move, base_params, check_space, proposals, totals
from polykv.search.objective import BudgetExhausted, Objective

Progress = Callable[[int, int, str], None]  # (executions used, budget, what is happening)


@dataclass(frozen=True)
class SearchSettings:
    budget: int  # b: the average capacity per layer; every active phase keeps L x b
    evaluations: int = 800  # plan executions (one plan on one sequence) the search may run
    candidates: int = 8  # neighbours tried per round
    first_rung: int = 2  # sequences at successive halving's first rung
    seed: int = 0
    statistic: str = "dppl"  # the profile statistic that ranks the moves
    min_capacity: int = 2  # the least capacity a transfer leaves a donor
    steps: tuple[float, ...] = TRANSFER_STEPS
    moves: tuple[str, ...] = MOVE_KINDS  # the kinds of move proposed ("transfer" alone: a capacity-only search)

    def __post_init__(self):
        unknown = [kind for kind in self.moves if kind not in MOVE_KINDS]
        if unknown or not self.moves:
            raise ValueError(f"moves: {unknown or 'none'} (the kinds: {', '.join(MOVE_KINDS)})")
        if self.budget < 1:
            raise ValueError(f"the budget must be a positive number of tokens (got {self.budget})")
        if self.evaluations < 1 or self.candidates < 1 or self.first_rung < 1 or self.min_capacity < 1:
            raise ValueError("evaluations, candidates, first_rung and min_capacity must be at least 1")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "steps": list(self.steps), "moves": list(self.moves)}


@dataclass(frozen=True)
class TracePoint:
    """The state after one step: executions used so far and the incumbent's J on all search sequences."""

    evaluations: int
    objective: float
    round: int
    event: str  # "start", "accepted", "rejected", "budget", "converged"
    move: str = ""
    candidate: float | None = None  # the round's best survivor's J on all sequences
    plan: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SearchResult:
    plan: Plan
    objective: float  # J of `plan` on the search sequences
    metric: str
    start: str  # the start plan the search began from
    starts: dict[str, float]  # every start's J
    moves: list[Move]  # the accepted moves, in order
    trace: list[TracePoint]
    evaluations: int  # executions the search ran
    settings: SearchSettings
    stopped: str  # "budget" or "converged"
    rounds: int = 0
    sequences: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "objective": self.objective,
            "metric": self.metric,
            "start": self.start,
            "starts": dict(self.starts),
            "moves": [m.to_dict() for m in self.moves],
            "trace": [t.to_dict() for t in self.trace],
            "evaluations": self.evaluations,
            "settings": self.settings.to_dict(),
            "stopped": self.stopped,
            "rounds": self.rounds,
            "sequences": self.sequences,
            **self.extra,
        }


def _rungs(first: int, total: int) -> list[int]:
    sizes, size = [], min(first, total)
    while size < total:
        sizes.append(size)
        size *= 2
    return [*sizes, total]


def _pick(ranked: list, count: int, rng: random.Random) -> list:
    """The better-ranked half of `count` in rank order, the rest drawn at random from the others."""
    if len(ranked) <= count:
        return list(ranked)
    top = math.ceil(count / 2)
    rest = ranked[top:]
    drawn = sorted(rng.sample(range(len(rest)), count - top))
    return ranked[:top] + [rest[k] for k in drawn]


def search(
    objective: Objective,
    starts: Sequence[Plan],
    settings: SearchSettings,
    profile=None,
    progress: Progress | None = None,
    on_trace: Callable[[TracePoint, Plan], None] | None = None,
) -> SearchResult:
    """Local search from `starts` (see the module docstring). Raises ValueError when a start is not in
    the search space, or when the budget cannot even evaluate the starts. `on_trace(point, incumbent)` sees
    every trace point as it is made, with the plan that is best so far (a live view)."""
    if not starts:
        raise ValueError("the search needs at least one start plan")
    scope: Scope = starts[0].scope
    for plan in starts:
        check_space(plan, settings.budget)
        if plan.scope is not scope or plan.num_layers != starts[0].num_layers:
            raise ValueError("every start plan must have the same scope and number of layers")
    n = len(objective)
    everything = list(range(n))
    start_cost = sum(objective.cost(p, everything) for p in starts)
    if start_cost > settings.evaluations:
        raise ValueError(
            f"an evaluation budget of {settings.evaluations} cannot even evaluate the {len(starts)} start plan(s) "
            f"on {n} sequences ({start_cost} executions); raise it or use fewer sequences"
        )
    say = progress or (lambda used, budget, message: None)
    rng = random.Random(settings.seed)
    trace: list[TracePoint] = []

    def note(point: TracePoint, best: Plan) -> None:
        trace.append(point)
        if on_trace is not None:
            on_trace(point, best)

    params = base_params(starts, profile)
    want = totals(starts[0])
    first = objective.executions
    objective.limit = first + settings.evaluations

    def used() -> int:
        return objective.executions - first

    try:
        values = {p.name: v for p, v in zip(starts, objective.values(starts, everything))}
        best_index = min(range(len(starts)), key=lambda k: (values[starts[k].name], k))
        incumbent, current = starts[best_index], values[starts[best_index].name]
        note(TracePoint(used(), current, 0, "start", plan=incumbent.name), incumbent)
        say(used(), settings.evaluations, f"start {incumbent.name}: {current:.5f}")
        tried: set[str] = set()  # moves tried from the current incumbent
        moves: list[Move] = []
        rounds, stopped = 0, "converged"
        from polykv.models import context_length, layer_windows

        context = context_length(objective.model)
        windows = layer_windows(objective.model)
        while True:
            neighbours = [
                (m, p)
                for m, p in proposals(
                    incumbent,
                    settings.budget,
                    params,
                    profile,
                    settings.statistic,
                    settings.min_capacity,
                    settings.steps,
                    context,
                    windows,
                )
                if m.describe() not in tried and m.kind in settings.moves
            ]
            if profile is None:  # no evidence to rank by: a seeded order
                rng.shuffle(neighbours)
            if not neighbours:
                note(TracePoint(used(), current, rounds, "converged", plan=incumbent.name), incumbent)
                break
            rounds += 1
            chosen = _pick(neighbours, settings.candidates, rng)
            tried.update(m.describe() for m, _ in chosen)
            order = list(range(n))
            rng.shuffle(order)
            alive = chosen
            try:
                for size in _rungs(settings.first_rung, n):
                    subset = order[:size]
                    scored = objective.values([p for _, p in alive], subset)  # one batch per rung
                    ranked = sorted(
                        ((v, k, m, p) for k, (v, (m, p)) in enumerate(zip(scored, alive))),
                        key=lambda row: (row[0], row[1]),
                    )
                    if size == n:
                        value, _, move, plan = ranked[0]
                        break
                    alive = [(m, p) for _, _, m, p in ranked[: math.ceil(len(ranked) / 2)]]
            except BudgetExhausted:
                stopped = "budget"
                note(TracePoint(used(), current, rounds, "budget", plan=incumbent.name), incumbent)
                break
            if value < current:
                incumbent, current = plan, value
                if totals(incumbent) != want:
                    raise AssertionError(f"the totals changed: {want} -> {totals(incumbent)}")
                moves.append(move)
                tried = set()
                event = "accepted"
            else:
                event = "rejected"
            note(TracePoint(used(), current, rounds, event, move.describe(), value, incumbent.name), incumbent)
            say(used(), settings.evaluations, f"round {rounds}: {event} {move.describe()} ({current:.5f})")
    finally:
        objective.limit = None
    start = starts[best_index]
    return SearchResult(
        plan=incumbent,
        objective=current,
        metric=objective.metric,
        start=start.name,
        starts=values,
        moves=moves,
        trace=trace,
        evaluations=used(),
        settings=settings,
        stopped=stopped,
        rounds=rounds,
        sequences=n,
    )


def with_provenance(result: SearchResult, name: str, extra: dict[str, Any] | None = None) -> Plan:
    """The searched plan, renamed, with how it was found in its provenance."""
    return result.plan.model_copy(
        update={
            "name": name,
            "description": (
                f"Local search from {result.start}: {len(result.moves)} moves, {result.metric} "
                f"{result.objective:.5g} on {result.sequences} search sequences, {result.evaluations} executions."
            ),
            "provenance": {
                "built_by": "search",
                "objective": {"metric": result.metric, "value": result.objective, "sequences": result.sequences},
                "budget": result.settings.budget,
                "seed": result.settings.seed,
                "evaluations": result.evaluations,
                "evaluation_budget": result.settings.evaluations,
                "start": result.start,
                "starts": dict(result.starts),
                "moves": [m.describe() for m in result.moves],
                "stopped": result.stopped,
                **(extra or {}),
            },
        }
    )


__all__ = ["SearchResult", "SearchSettings", "TracePoint", "search", "with_provenance"]

"""Plans: which KV-eviction method runs, with how many retained tokens, in every layer and phase.

A plan is a versioned JSON file (never pickle). For layer l and phase p in {prefill, decode} it names a
method r_{l,p}, its capacity b_{l,p} (retained tokens per KV head) and optional method parameters.
`full` keeps every token and therefore has no capacity. The plan-level `scope` says which phases are
active; the inactive phase runs `full` in every layer.

This module knows nothing about individual methods: validation takes a catalog (name -> phases, params
check) so that the dependency stays `methods -> plan`. `polykv.methods.validate_plan` supplies it.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sized
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator

from polykv.errors import PolyKVError, describe_error
from polykv.files import atomic_write_text, parse_json, read_text
from polykv.text import check_text

FORMAT = "polykv.plan"
VERSION = 1
FULL = "full"
MAX_PLAN_BYTES = 4 * 1024 * 1024  # a 1,000-layer plan with parameters is about 200 KB
# The longest context PolyKV supports, in tokens: the upper bound of every capacity and of every
# token-count method parameter (windows, sinks, histories, kernels), so that no value that passes
# validation asks for absurd memory at run time.
MAX_TOKENS = 1 << 20
# The most layers a plan may have (today's deepest models have well under 1,000); checked before the layers
# are parsed, so an absurd plan is refused at once.
MAX_LAYERS = 4096


class Phase(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"


class Scope(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"

    @property
    def phases(self) -> tuple[Phase, ...]:
        return (Phase.PREFILL, Phase.DECODE) if self is Scope.BOTH else (Phase(self.value),)


class PlanError(PolyKVError):
    """A plan that cannot be read or does not fit; `str()` is one line naming the problem."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        more = len(self.problems) - 1
        super().__init__(self.problems[0] + (f" (and {more} more problem{'s' * (more > 1)})" if more else ""))


class PhaseAssignment(BaseModel):
    """The method that runs in one layer and phase, with its capacity and parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str = Field(min_length=1)
    capacity: StrictInt | None = Field(default=None, gt=0, le=MAX_TOKENS)
    params: dict[str, Any] = Field(default_factory=dict)
    # Decode only: evict every `interval` steps, `interval` tokens at once (the layer then holds up to
    # capacity + interval slots). 1 is the exact per-step rule of the papers; more is an approximation
    # that trades a little extra memory for fewer eviction steps (kvpress's DecodingPress does the same).
    interval: StrictInt = Field(default=1, ge=1, le=MAX_TOKENS)

    def __str__(self) -> str:
        cap = "" if self.capacity is None else f"@{self.capacity}"
        extra = "" if not self.params else "(" + ", ".join(f"{k}={v}" for k, v in self.params.items()) + ")"
        every = "" if self.interval == 1 else f" every {self.interval} steps"
        return f"{self.method}{cap}{extra}{every}"


FULL_ASSIGNMENT = PhaseAssignment(method=FULL)


class LayerPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prefill: PhaseAssignment = FULL_ASSIGNMENT
    decode: PhaseAssignment = FULL_ASSIGNMENT

    def __getitem__(self, phase: Phase | str) -> PhaseAssignment:
        return getattr(self, Phase(phase).value)


class Plan(BaseModel):
    """A per-layer, per-phase assignment of KV-eviction methods and capacities."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str = FORMAT
    version: int = VERSION
    name: str = Field(min_length=1)
    description: str = ""
    scope: Scope
    # "fixed": every layer keeps the capacity written here. "native": the phase's method (one method
    # in every layer, with a layer-budget rule of its own) splits the phase's total capacity over the
    # layers at run time, as the standalone method does (PyramidKV, D2O, CAKE).
    allocation: Literal["fixed", "native"] = "fixed"
    provenance: dict[str, Any] = Field(default_factory=dict)
    layers: list[LayerPlan] = Field(min_length=1)

    # Names and descriptions are printed in tables and on terminals: no escape sequences, no forged lines.
    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        return check_text(value)

    @field_validator("description")
    @classmethod
    def _plain_description(cls, value: str) -> str:
        return check_text(value, allowed="\n\t")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def homogeneous(
        cls,
        method: str,
        capacity: int | None,
        num_layers: int,
        scope: Scope | str = Scope.BOTH,
        params: Mapping[str, Any] | None = None,
        name: str | None = None,
        allocation: str = "fixed",
    ) -> Plan:
        """One method with one uniform capacity in every layer of the active phase(s).

        With allocation="native" the capacity is the average budget b and the method's own rule
        splits the total L*b over the layers at run time (the standalone method)."""
        scope = Scope(scope)
        active = {"method": method, "capacity": capacity, "params": dict(params or {})}
        cap = "" if capacity is None else f"-{capacity}"
        return cls.from_dict(
            {
                "name": name or f"{method}-{scope.value}{cap}{'-native' if allocation == 'native' else ''}",
                "description": f"Homogeneous {method} in every layer ({scope.value} phase"
                f"{'s' if scope is Scope.BOTH else ''}){'' if capacity is None else f', capacity {capacity}'}.",
                "scope": scope.value,
                "allocation": allocation,
                "provenance": {"built_by": "homogeneous", "method": method, "capacity": capacity},
                "layers": [{p.value: active for p in scope.phases}] * num_layers,
            }
        )

    def with_layers(self, layers: list[LayerPlan], **changes: Any) -> Plan:
        return self.model_copy(update={"layers": list(layers), **changes})

    # ---- I/O ----------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        if not isinstance(data, dict):
            raise PlanError(f"a plan must be a JSON object, got {type(data).__name__}")
        if data.get("format", FORMAT) != FORMAT:
            raise PlanError(f"format: expected {FORMAT!r}, got {data.get('format')!r}")
        if data.get("version", VERSION) != VERSION:
            raise PlanError(f"version: this PolyKV reads plan version {VERSION}, got {data.get('version')!r}")
        layers = data.get("layers")
        if isinstance(layers, Sized) and not isinstance(layers, (str, bytes, Mapping)) and len(layers) > MAX_LAYERS:
            raise PlanError(_too_many_layers(len(layers)))  # before parsing any layer
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise PlanError([_describe_pydantic_error(e) for e in exc.errors()]) from None

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        if len(text) > MAX_PLAN_BYTES:
            raise PlanError(f"a plan is at most {MAX_PLAN_BYTES:,} bytes of JSON (got {len(text):,})")
        return cls.from_dict(parse_json(text, error=PlanError))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Plan:
        """Read a plan file: a regular file (never a device or FIFO) of at most MAX_PLAN_BYTES."""
        path = Path(path)
        text = read_text(path, "plan file", MAX_PLAN_BYTES, error=PlanError)
        try:
            return cls.from_json(text)
        except PlanError as exc:
            raise PlanError([f"{path}: {p}" for p in exc.problems]) from None

    def to_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        data["layers"] = [
            {phase: _assignment_dict(layer[phase]) for phase in ("prefill", "decode")} for layer in self.layers
        ]
        return data

    def to_json(self) -> str:
        """Human-readable JSON: header fields indented, one line per layer (diffs read layer by layer)."""
        data = self.to_dict()
        layers = data.pop("layers")
        head = json.dumps(data, indent=2, ensure_ascii=False)[:-2]  # drop the closing "\n}"
        rows = ",\n".join("    " + json.dumps(layer, ensure_ascii=False) for layer in layers)
        return f'{head},\n  "layers": [\n{rows}\n  ]\n}}\n'

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (a reader never sees a half-written plan), only to a regular file or a new
        path, through a symlink to its target, with the umask's mode (see `polykv.files`)."""
        return atomic_write_text(path, self.to_json())

    # ---- validation ---------------------------------------------------------------------------
    def problems(
        self,
        num_layers: int | None,
        catalog: Mapping[str, MethodInfo],
        context_length: int | None = None,
        within_context: bool = False,
    ) -> list[str]:
        """Every way this plan does not fit a model with `num_layers` layers and a context of
        `context_length` tokens (None: not checked), and the known methods.

        `within_context`: capacities and intervals above the context are problems too. That is for a plan
        a user hands PolyKV for a known model; a budget sweep may go past the context on purpose (such a
        layer never evicts: it runs as FullKV), so runs leave it off.

        A plan with the wrong number of layers (or more than MAX_LAYERS) gets that one problem only:
        its layers are not worth checking one by one."""
        if self.num_layers > MAX_LAYERS:
            return [_too_many_layers(self.num_layers)]
        if num_layers is not None and self.num_layers != num_layers:
            return [f"layers: the plan has {self.num_layers} layers but the model has {num_layers}"]
        found: list[str] = []
        active = set(self.scope.phases)
        checked: dict[tuple[str, str, int | None], list[str]] = {}  # identical cells are checked once
        for idx, layer in enumerate(self.layers):
            for phase in Phase:
                a = layer[phase]
                where = f"layer {idx}, {phase.value}"
                info = catalog.get(a.method)
                if info is None:
                    found.append(f"{where}, method: unknown method {a.method!r} (known: {', '.join(sorted(catalog))})")
                    continue
                if phase not in active and a.method != FULL:
                    found.append(
                        f"{where}, method: the plan's scope is {self.scope.value!r}, so the {phase.value} phase "
                        f"must use 'full' (got {a.method!r})"
                    )
                    continue
                if phase not in info.phases:
                    allowed = ", ".join(p.value for p in Phase if p in info.phases)
                    found.append(
                        f"{where}, method: {a.method!r} does not support the {phase.value} phase (supported: {allowed})"
                    )
                    continue
                if a.method == FULL:
                    if a.capacity is not None:
                        found.append(
                            f"{where}, capacity: 'full' keeps every token; leave capacity out (got {a.capacity})"
                        )
                elif a.capacity is None:
                    found.append(f"{where}, capacity: {a.method!r} needs a capacity (a positive integer)")
                if a.interval != 1 and phase is Phase.PREFILL:
                    found.append(
                        f"{where}, interval: an eviction interval applies to the decode phase only (prefill "
                        f"evicts once, at the end of the prompt); leave it out or set 1 (got {a.interval})"
                    )
                if within_context and context_length is not None:
                    found.extend(f"{where}, {p}" for p in _over_context(a, context_length))
                key = (a.method, _params_key(a.params), a.capacity)
                if key not in checked:
                    checked[key] = _check(info, a.params, a.capacity, context_length)
                found.extend(f"{where}, {p}" for p in checked[key])
        if self.allocation == "native":
            found.extend(self._native_problems(catalog))
        return found

    def _native_problems(self, catalog: Mapping[str, MethodInfo]) -> list[str]:
        """Native allocation splits one total (L x the capacity) with one method's rule and one set of
        parameters: every layer of an active phase must run the same method, with the same capacity
        and the same parameters."""
        found = []
        for phase in self.scope.phases:
            used = sorted({layer[phase].method for layer in self.layers})
            if len(used) != 1 or not getattr(catalog.get(used[0]), "native_allocation", False):
                rule = ", ".join(sorted(n for n, m in catalog.items() if getattr(m, "native_allocation", False)))
                found.append(
                    f"allocation: 'native' needs one method with its own layer-budget rule ({rule}) in every "
                    f"layer of the {phase.value} phase (got {', '.join(used)})"
                )
                continue
            # Parameters are compared with the method's defaults filled in ({} is {"window": 8} for PyramidKV).
            defaults = dict(getattr(catalog[used[0]], "defaults", dict)())
            first = self.layers[0][phase]
            for idx, layer in enumerate(self.layers[1:], start=1):
                a = layer[phase]
                if a.capacity != first.capacity:
                    what, mine, theirs = "capacity", a.capacity, first.capacity
                elif a.params != first.params and {**defaults, **a.params} != {**defaults, **first.params}:
                    what, mine, theirs = "params", _params_text(a.params), _params_text(first.params)
                else:
                    continue
                found.append(
                    f"allocation: 'native' splits one total with one rule: layer {idx}, {phase.value} has {what} "
                    f"{mine} but layer 0 has {what} {theirs} (give every layer the same capacity and params, "
                    f"or use allocation 'fixed')"
                )
                break
        return found

    def validate_for(
        self,
        num_layers: int | None,
        catalog: Mapping[str, MethodInfo],
        context_length: int | None = None,
        within_context: bool = False,
    ) -> Plan:
        found = self.problems(num_layers, catalog, context_length, within_context)
        if found:
            raise PlanError(found)
        return self

    # ---- summary ------------------------------------------------------------------------------
    def summary(self) -> PlanSummary:
        phases = {}
        for phase in Phase:
            entries = [layer[phase] for layer in self.layers]
            bounded = [a.capacity for a in entries if a.capacity is not None]
            phases[phase] = PhaseSummary(
                total_capacity=sum(bounded),
                average_capacity=sum(bounded) / len(bounded) if bounded else None,
                bounded_layers=len(bounded),
                method_counts=dict(Counter(a.method for a in entries)),
                interval_counts=dict(Counter(a.interval for a in entries if a.interval != 1 and a.method != FULL)),
            )
        return PlanSummary(
            name=self.name, scope=self.scope, allocation=self.allocation, num_layers=self.num_layers, phases=phases
        )


class MethodInfo(Protocol):
    """What validation needs to know about a method (the registry in `polykv.methods` provides it).

    `check(params, capacity)` lists the problems of a cell's parameters, one line each; it is called
    with a third argument, the model's context in tokens, only when that is known (so a catalog whose
    `check` takes two arguments still works without a context)."""

    phases: frozenset[Phase]

    def check(
        self, params: Mapping[str, Any], capacity: int | None, context_length: int | None = None
    ) -> list[str]: ...


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

    def lines(self) -> list[str]:
        native = ", native allocation (the method splits each phase's total over the layers at run time)"
        out = [
            f"plan {self.name!r}: {self.num_layers} layers, scope {self.scope.value}"
            f"{native if self.allocation == 'native' else ''}"
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


def _too_many_layers(count: int) -> str:
    return f"layers: a plan has at most {MAX_LAYERS:,} layers (got {count:,})"


def _check(info: MethodInfo, params: Mapping[str, Any], capacity: int | None, context_length: int | None) -> list[str]:
    if context_length is None:
        return list(info.check(params, capacity))
    return list(info.check(params, capacity, context_length))


def _over_context(a: PhaseAssignment, context_length: int) -> list[str]:
    """A capacity or an interval longer than the model's context: such a layer never evicts, and its
    slots are memory held for tokens that cannot come."""
    return [
        f"{name}: {value} is more than the model's context ({context_length} tokens)"
        for name, value in (("capacity", a.capacity), ("interval", a.interval))
        if value is not None and value > context_length
    ]


def _params_key(params: Mapping[str, Any]) -> str:
    """A hashable key for a cell's parameters (type-exact: True and 1 differ)."""
    return repr(sorted(((k, type(v).__name__, repr(v)) for k, v in params.items()), key=lambda kv: str(kv[0])))


def _params_text(params: Mapping[str, Any]) -> str:
    return json.dumps(dict(params), sort_keys=True, default=repr)[:120]


def _assignment_dict(a: PhaseAssignment) -> dict[str, Any]:
    out: dict[str, Any] = {"method": a.method}
    if a.capacity is not None:
        out["capacity"] = a.capacity
    if a.params:
        out["params"] = dict(a.params)
    if a.interval != 1:  # left out at its default, so plans without intervals read as before
        out["interval"] = a.interval
    return out


def _describe_pydantic_error(err: Mapping[str, Any]) -> str:
    loc = list(err.get("loc", ()))
    parts: list[str] = []
    if len(loc) >= 2 and loc[0] == "layers" and isinstance(loc[1], int):
        parts.append(f"layer {loc[1]}")
        loc = loc[2:]
    if loc and loc[0] in ("prefill", "decode"):
        parts.append(str(loc[0]))
        loc = loc[1:]
    field = ".".join(str(x) for x in loc) or "plan"
    return ", ".join([*parts, describe_error(err, field)])

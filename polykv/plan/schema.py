"""The whole plan (`Plan`): its fields, how it is built, its JSON file, and the entry points to its checks
(`polykv.plan.checks`) and its summary (`polykv.plan.summary`)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sized
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from polykv.errors import PolyKVError, describe_error
from polykv.files import atomic_write_text, parse_json, read_text
from polykv.plan.cells import FULL, LayerPlan, Phase, PhaseAssignment, Scope
from polykv.plan.checks import MAX_LAYERS, MethodInfo, plan_problems, too_many_layers
from polykv.plan.summary import PhaseSummary, PlanSummary
from polykv.text import check_text

FORMAT = "polykv.plan"
VERSION = 1
MAX_PLAN_BYTES = 4 * 1024 * 1024  # a 1,000-layer plan with parameters is about 200 KB


class PlanError(PolyKVError):
    """A plan that cannot be read or does not fit; `str()` is one line naming the problem."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        more = len(self.problems) - 1
        super().__init__(self.problems[0] + (f" (and {more} more problem{'s' * (more > 1)})" if more else ""))


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
    # layers at run time, as the standalone method does (PyramidKV, D2O, CAKE). "cake": CAKE's layer rule
    # splits each phase's total at run time for any methods (`polykv.runtime.layer_budgets`), with the
    # rule's parameters in `allocation_params` (CAKE's: window, gamma, tau1, tau2, kernel_size).
    allocation: Literal["fixed", "native", "cake"] = "fixed"
    allocation_params: dict[str, Any] = Field(default_factory=dict)
    # How each layer's budget splits over its KV heads (`polykv.methods.head_budgets`): "uniform", every head keeps
    # the layer's capacity; "adakv", Ada-KV's split of capacity x heads by the method's scores across heads, at every
    # cut, with its parameters in `head_allocation_params` (alpha_safeguard).
    head_allocation: Literal["uniform", "adakv"] = "uniform"
    head_allocation_params: dict[str, Any] = Field(default_factory=dict)
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
        if num_layers > MAX_LAYERS:  # before a list of that many layers is built
            raise PlanError(too_many_layers(num_layers))
        scope = Scope(scope)
        active = {"method": method, "capacity": capacity, "params": dict(params or {})}
        cap = "" if capacity is None else f"-{capacity}"
        return cls.from_dict(
            {
                "name": name or f"{method}-{scope.value}{cap}{'' if allocation == 'fixed' else '-' + allocation}",
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
            raise PlanError(too_many_layers(len(layers)))  # before parsing any layer
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
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Read a plan file: a regular file (never a device or FIFO) of at most MAX_PLAN_BYTES."""
        path = Path(path)
        text = read_text(path, "plan file", MAX_PLAN_BYTES, error=PlanError)
        try:
            return cls.from_json(text)
        except PlanError as exc:
            raise PlanError([f"{path}: {p}" for p in exc.problems]) from None

    def to_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        for key, default in (("allocation_params", {}), ("head_allocation", "uniform"), ("head_allocation_params", {})):
            if data[key] == default:
                del data[key]  # plans without a run-time rule or a head rule read as before
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

    def save(self, path: str | os.PathLike[str]) -> Path:
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
        least: int | None = None,
    ) -> list[str]:
        """Every way this plan does not fit a model with `num_layers` layers and a context of
        `context_length` tokens (None: not checked), and the known methods.

        `within_context`: capacities and intervals above the context are problems too. That is for a plan
        a user hands PolyKV for a known model; a budget sweep may go past the context on purpose (such a
        layer never evicts: it runs as FullKV), so runs leave it off.

        A plan with the wrong number of layers (or more than MAX_LAYERS) gets that one problem only:
        its layers are not worth checking one by one."""
        found = plan_problems(
            self.layers, self.scope, self.allocation, num_layers, catalog, context_length, within_context, least
        )
        if self.allocation_params and self.allocation != "cake":
            found.append(f"allocation_params: only a run-time rule takes them (allocation is {self.allocation!r})")
        if self.head_allocation_params and self.head_allocation != "adakv":
            found.append("head_allocation_params: only head_allocation 'adakv' takes them")
        if self.head_allocation == "adakv":  # its decode rule re-chooses every step, over every head at once
            for i, layer in enumerate(self.layers):
                cell = layer.decode
                if cell.method != FULL and getattr(catalog.get(cell.method), "merges", False):
                    found.append(
                        f"head_allocation: 'adakv' cannot split a merging method's decode eviction over the heads "
                        f"(layer {i}: {cell.method} merges what it evicts into the tokens it keeps)"
                    )
                    break
                if cell.method != FULL and cell.interval != 1:
                    found.append(
                        f"head_allocation: 'adakv' evicts a step at a time: layer {i}'s decode interval must be 1"
                    )
                    break
        return found

    def validate_for(
        self,
        num_layers: int | None,
        catalog: Mapping[str, MethodInfo],
        context_length: int | None = None,
        within_context: bool = False,
        least: int | None = None,
    ) -> Plan:
        found = self.problems(num_layers, catalog, context_length, within_context, least)
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
        alpha = self.head_allocation_params.get("alpha_safeguard", 0.2) if self.head_allocation == "adakv" else None
        return PlanSummary(
            name=self.name,
            scope=self.scope,
            allocation=self.allocation,
            num_layers=self.num_layers,
            phases=phases,
            head_allocation=self.head_allocation,
            alpha_safeguard=alpha,
        )


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

"""What one cell of a plan holds: the phases and the scope, the method that runs in one layer and phase
(`PhaseAssignment`: its capacity, parameters and eviction interval) and a layer's two cells (`LayerPlan`)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt

FULL = "full"
# The longest context PolyKV supports, in tokens: the upper bound of every capacity and of every
# token-count method parameter (windows, sinks, histories, kernels), so that no value that passes
# validation asks for absurd memory at run time.
MAX_TOKENS = 1 << 20


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

    def kept(self, tokens: float) -> float:
        """How many of `tokens` this phase holds at most: all of them under `full`, else up to its capacity."""
        return tokens if self.method == FULL or self.capacity is None else min(self.capacity, tokens)

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
        return self.prefill if Phase(phase) is Phase.PREFILL else self.decode

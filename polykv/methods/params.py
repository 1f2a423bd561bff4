"""Method parameters: strict, bounded, immutable, with error lines that name method, parameter and range."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from polykv.plan import MAX_TOKENS

# ---- parameters ----------------------------------------------------------------------------------
# Every method's parameters are strict: integers are JSON integers (not true, "8" or 8.0), numbers are
# finite JSON numbers (an integer such as 1 is accepted for 1.0; "1.0", true, NaN and infinities are
# not), choices are exact strings. Every parameter has explicit bounds, and the token counts (windows,
# sinks, histories, kernels) are at most MAX_TOKENS and, when the model is known, its context. So a
# value that passes validation can neither fail nor ask for absurd memory at run time.
TOKENS = "tokens"  # json_schema_extra marker of a token-count parameter


class MethodParams(BaseModel):
    """Base of every method's parameters: strict types, no unknown names, immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


NoParams = MethodParams


def _json_number(value: Any) -> Any:
    # Strict float validation alone would take a numpy integer, which a plan file cannot hold.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError("float_type", "Input should be a valid number")
    return value


Real = Annotated[float, BeforeValidator(_json_number)]  # a finite JSON number (bounds on the Field)


def tokens(default: int, *, ge: int, description: str) -> Any:
    """A token-count parameter: an integer in [ge, MAX_TOKENS], and at most the model's context."""
    return Field(
        default=default,
        ge=ge,
        le=MAX_TOKENS,
        strict=True,
        description=f"{description}; an integer, {ge} .. {MAX_TOKENS} tokens and at most the model's context",
        json_schema_extra={TOKENS: True},
    )


def real(default: float, *, description: str, **bounds: float) -> Any:
    """A real parameter: a finite number within `bounds` (ge / gt and le / lt)."""
    return Field(default=default, allow_inf_nan=False, description=f"{description}; {_interval(bounds)}", **bounds)


def _interval(bounds: Mapping[str, Any]) -> str:
    lo = "(" + f"{bounds['gt']:g}" if "gt" in bounds else "[" + f"{bounds.get('ge', float('-inf')):g}"
    hi = f"{bounds['lt']:g}" + ")" if "lt" in bounds else f"{bounds.get('le', float('inf')):g}" + "]"
    return f"a finite number in {lo}, {hi}"


def allowed_values(model: type[BaseModel], name: str) -> str:
    """What parameter `name` of `model` accepts, for error messages ('' if it is unknown)."""
    field = model.model_fields.get(name)
    if field is None:
        return ""
    if get_origin(field.annotation) is Literal:
        return "allowed: " + " or ".join(repr(v) for v in get_args(field.annotation))
    bounds = {
        k: getattr(m, k) for m in field.metadata for k in ("ge", "gt", "le", "lt") if getattr(m, k, None) is not None
    }
    if field.annotation is int:
        low = bounds["ge"] if "ge" in bounds else bounds["gt"] + 1 if "gt" in bounds else None
        high = bounds["le"] if "le" in bounds else bounds["lt"] - 1 if "lt" in bounds else None
        return f"allowed range {low} .. {high} (an integer)"
    return f"allowed: {_interval(bounds)}"


def lower_bound(model: type[BaseModel], name: str) -> int:
    return next((m.ge for m in model.model_fields[name].metadata if getattr(m, "ge", None) is not None), 0)


def describe_param_error(method: str, model: type[BaseModel], err: Mapping[str, Any]) -> str:
    """One line: parameter, method, what is wrong, the value got and what is allowed."""
    loc = ".".join(str(x) for x in err.get("loc", ())) or "params"
    if err.get("type") == "extra_forbidden":
        allowed = ", ".join(model.model_fields) or "none"
        return f"params.{loc}: {method} has no parameter {loc!r} (parameters: {allowed})"
    got = f" (got {_short(err['input'])})" if "input" in err else ""
    allowed = allowed_values(model, str(err.get("loc", ("",))[0]))
    return f"params.{loc}: {method}: {err.get('msg', 'invalid')}{got}" + (f"; {allowed}" if allowed else "")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def token_params(model: type[BaseModel]) -> tuple[str, ...]:
    """The parameters of `model` that count tokens (made with `tokens`)."""
    return tuple(
        name
        for name, field in model.model_fields.items()
        if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get(TOKENS)
    )


def over_limit(model: type[BaseModel], params: BaseModel, names: tuple[str, ...], highest: int, rule: str) -> list[str]:
    """One line for each of `names` whose value in `params` is above `highest`: '<name> (v) must be <rule>', then the
    range it may take, or, where none fits (a capacity of 1 leaves a window no room), that no value fits."""
    lines = []
    for name in names:
        if getattr(params, name) > highest:
            low = lower_bound(model, name)
            room = f"allowed range {low} .. {highest}" if low <= highest else "no value fits"
            lines.append(f"{name} ({getattr(params, name)}) must be {rule}; {room}")
    return lines

"""The designer's editable table: one row per layer, a method, capacity and parameters per phase (`to_table`),
and the plan read back from an edited table (`from_table`)."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from polykv.files import parse_json
from polykv.methods import for_phase
from polykv.plan import FULL, Phase, Plan, PlanError
from polykv.plan_edits.edit_history import record_edit
from polykv.plan_edits.painting import _layer_dicts, _rebuild

TABLE_COLUMNS = [
    "layer",
    "prefill_method", "prefill_capacity", "prefill_params",
    "decode_method", "decode_capacity", "decode_params",
]  # fmt: skip


def to_table(plan: Plan) -> pd.DataFrame:
    """One row per layer: method, capacity and parameters (JSON) for each phase."""
    rows = []
    for i, layer in enumerate(plan.layers):
        row: dict[str, Any] = {"layer": i}
        for p in Phase:
            a = layer[p]
            row[f"{p.value}_method"] = a.method
            row[f"{p.value}_capacity"] = a.capacity
            row[f"{p.value}_params"] = json.dumps(a.params) if a.params else ""
        rows.append(row)
    frame = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    for p in Phase:
        frame[f"{p.value}_capacity"] = frame[f"{p.value}_capacity"].astype("Int64")
    return frame


def _cell_capacity(value: Any, where: str) -> int | None:
    if value is None or (not isinstance(value, str) and pd.isna(value)) or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise PlanError(f"{where}, capacity: not a number ({value!r})") from None
    if number != int(number) or number < 1:
        raise PlanError(f"{where}, capacity: must be a positive whole number of tokens (got {value!r})")
    return int(number)


def _cell_params(value: Any, where: str) -> dict[str, Any]:
    if value is None or (not isinstance(value, str) and pd.isna(value)) or not str(value).strip():
        return {}
    try:
        params = parse_json(str(value), error=PlanError)
    except PlanError as exc:
        raise PlanError(f'{where}, params: not JSON (write e.g. {{"window": 16}}): {exc}') from None
    if not isinstance(params, dict):
        raise PlanError(f'{where}, params: expected a JSON object such as {{"window": 16}}')
    return params


def from_table(plan: Plan, table: pd.DataFrame) -> Plan:
    """The plan with its layers read back from an edited `to_table` frame (same layers, same order)."""
    if len(table) != plan.num_layers:
        raise PlanError(f"table: {len(table)} rows but the plan has {plan.num_layers} layers")
    new = []
    for i, row in enumerate(table.to_dict("records")):
        layer = {}
        for p in Phase:
            where = f"layer {i}, {p.value}"
            method = str(row.get(f"{p.value}_method") or "").strip()
            if not method:
                raise PlanError(f"{where}, method: choose a method")
            capacity = _cell_capacity(row.get(f"{p.value}_capacity"), where)
            if method == FULL:
                capacity = None
            layer[p.value] = {
                "method": method,
                "capacity": capacity,
                "params": _cell_params(row.get(f"{p.value}_params"), where),
                "interval": plan.layers[i][p].interval,  # not in the table: the cell keeps its own
            }
        new.append(layer)
    old = _layer_dicts(plan)
    if new == old:
        return _rebuild(plan, new)
    return record_edit(plan, _rebuild(plan, new, allocation="fixed"), _table_summary(old, new))


def _table_summary(old: list[dict[str, dict[str, Any]]], new: list[dict[str, dict[str, Any]]], shown: int = 3) -> str:
    """One line naming the table's changed cells ("table: layer 2 decode capacity 32 -> 40; ..."), the
    first `shown` of them and how many more."""

    def text(field: str, value: Any) -> str:
        return json.dumps(value, sort_keys=True) if field == "params" else str(value)

    changes = [
        f"layer {i} {p.value} {field} {text(field, a[p.value][field])} -> {text(field, b[p.value][field])}"
        for i, (a, b) in enumerate(zip(old, new))
        for p in Phase
        for field in ("method", "capacity", "params")
        if a[p.value][field] != b[p.value][field]
    ]
    more = f" and {len(changes) - shown} more" if len(changes) > shown else ""
    return f"table: {'; '.join(changes[:shown])}{more}"


def table_methods(phase: Phase | str) -> list[str]:
    """The methods a table cell of `phase` may hold: `full` first, then those that run in it."""
    return [FULL, *for_phase(phase)]

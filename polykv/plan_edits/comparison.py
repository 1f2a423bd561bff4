"""Where two plans differ (`diff`), and what turned one into the other in a few words (`change_summary`: what
Undo and Redo say)."""

from __future__ import annotations

import pandas as pd

from polykv.plan import Phase, Plan
from polykv.plan_edits.edit_history import EDITED_SUFFIX, edits


def diff(a: Plan, b: Plan) -> pd.DataFrame:
    """Where two plans differ: plan-level fields first, then each (layer, phase) cell that changed."""
    rows = [
        {
            "where": field,
            "a": str(getattr(a, field).value if field == "scope" else getattr(a, field)),
            "b": str(getattr(b, field).value if field == "scope" else getattr(b, field)),
        }
        for field in ("scope", "allocation", "head_allocation")
        if getattr(a, field) != getattr(b, field)
    ]
    if a.num_layers != b.num_layers:
        rows.append({"where": "layers", "a": str(a.num_layers), "b": str(b.num_layers)})
    for i, (la, lb) in enumerate(zip(a.layers, b.layers)):
        for p in Phase:
            if la[p] != lb[p]:
                rows.append({"where": f"layer {i} {p.value}", "a": str(la[p]), "b": str(lb[p])})
    return pd.DataFrame(rows, columns=["where", "a", "b"])


def change_summary(before: Plan, after: Plan) -> str:
    """What turned `before` into `after`, in a few words (what Undo and Redo say they undid or redid): the edits
    `after` records beyond `before`'s, else the cells that differ and, when the name changed, the two names
    (a plan loaded, built or reset)."""
    old, new = edits(before), edits(after)
    if after.name in (before.name, before.name + EDITED_SUFFIX):  # an edit of `before` records one summary
        for kept in (len(old), len(old) - 1):  # the provenance keeps the newest MAX_EDITS: one may have dropped
            if kept >= 0 and len(new) == kept + 1 and new[:kept] == old[len(old) - kept :]:
                return new[-1]
    changed = diff(before, after)
    cells = int(changed["where"].str.startswith("layer ").sum())
    text = f"{cells} cell{'s' * (cells != 1)} changed" if cells else "no cell changed"
    return text + (f" ({before.name!r} -> {after.name!r})" if before.name != after.name else "")

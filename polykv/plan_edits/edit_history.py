"""What a plan records of its edits: the provenance's list of edit summaries, and the "-edited" name a built
plan gets when it is first edited by hand."""

from __future__ import annotations

from polykv.plan import Plan

EDITED_SUFFIX = "-edited"  # added (once) to the name of a built plan when it is first edited by hand
MAX_EDITS = 200  # the provenance keeps the newest this many edit summaries
_NOT_BUILT = (None, "hand")  # `built_by` values of plans written by hand: their names stay as they are


def _same_content(a: Plan, b: Plan) -> bool:
    """Whether two plans route the same way (layers, scope, layer and head allocation), whatever their names say."""
    same = lambda p: (p.layers, p.scope, p.allocation, p.head_allocation, p.head_allocation_params)  # noqa: E731
    return same(a) == same(b)


def record_edit(before: Plan, after: Plan, summary: str) -> Plan:
    """`after` (an edit of `before`) with `summary` appended to the provenance's "edits" list, the
    provenance of `before` (its `built_by`, ...) kept and marked `edited`. A built plan (from a profile,
    homogeneous, ...) edited for the first time gets the suffix "-edited" on its name (once). An edit
    that changed nothing returns `before` unchanged (nothing to record)."""
    if _same_content(before, after):
        return before
    provenance = dict(before.provenance)
    recorded = [*edits(before), " ".join(summary.split())]  # one line each
    provenance.update(edited=True, edits=recorded[-MAX_EDITS:])
    name = before.name
    if provenance.get("built_by") not in _NOT_BUILT and not name.endswith(EDITED_SUFFIX):
        name += EDITED_SUFFIX
    return after.model_copy(update={"provenance": provenance, "name": name})


def edits(plan: Plan) -> list[str]:
    """The edit summaries recorded in `plan`'s provenance, oldest first (none for an unedited plan)."""
    found = plan.provenance.get("edits")
    return [str(e) for e in found] if isinstance(found, list) else []

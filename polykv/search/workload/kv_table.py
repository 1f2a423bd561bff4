"""The KV memory a workload search's plans keep, as its pages show it: per budget and role, the tokens per layer
and the MB entering the answer and after it, and their share of FullKV's (`kv_rows`, under `KV_HEADER`, with
`kv_note` saying how they are counted); on a hybrid model, what a budget counts (`hybrid_budget_lines`).
"""

from __future__ import annotations

from collections.abc import Sequence

from polykv.kv_memory import kv_kept, token_bytes
from polykv.plan import Plan
from polykv.search.workload.report import WorkloadBudget, WorkloadReport
from polykv.search.workload.verdict import ROLES

KV_HEADER = ("budget", "role", "plan", "scope", "entering the answer", "after the answer")
MEASURED_HEADER = (*KV_HEADER, "entering the answer, measured")


def kv_header(store=None) -> tuple[str, ...]:
    """The KV table's columns: with a results database, the KV each plan's runs held, measured, beside."""
    return KV_HEADER if store is None else MEASURED_HEADER


def kv_rows(
    report: WorkloadReport, budgets: Sequence[WorkloadBudget], roles=(*ROLES, "fullkv"), store=None
) -> list[tuple]:
    """Per budget and role: the KV kept entering the answer and after it, in tokens per layer and MB (mean over
    the searched tasks' held-out samples), and as a share of FullKV's. With `store` (the report's results
    database), one more column: what the role's answer_nll run held entering the answer, measured from its cache
    (`polykv.eval.results.kv_measured`), per layer and as a share of what FullKV held on the same samples."""
    dims = report.kv
    lengths = [report.samples.lengths[t] for t in report.samples.tasks if t in report.samples.lengths]
    if dims is None or not lengths:
        return []
    per_token = token_bytes(dims.as_dict()) / 1e6  # MB per token and layer
    full = Plan.homogeneous("full", None, dims.layers)
    windows = dims.windows  # reports before hybrid models: every layer global
    mean = lambda plan: [sum(v) / len(lengths) for v in zip(*(kv_kept(plan, x, windows) for x in lengths))]  # noqa: E731
    reference = mean(full)
    rows = []
    for entry in budgets:
        for role in roles:
            if role == "fullkv" and entry is not budgets[0] or role not in (*entry.plans, "fullkv"):
                continue
            plan = full if role == "fullkv" else entry.plans[role]
            entering, after = mean(plan)
            row = (
                "" if role == "fullkv" else entry.budget,
                role,
                f"`{plan.name}`",
                plan.scope.value,
                f"{entering / dims.layers:.0f} ({entering * per_token:.1f} MB, {entering / reference[0]:.0%})",
                f"{after / dims.layers:.0f} ({after * per_token:.1f} MB, {after / reference[1]:.0%})",
            )
            if store is not None:
                row += (_measured(report, store, entry.runs.get("answer_nll", {}).get(role), per_token),)
            rows.append(row)
    return rows


def _measured(report: WorkloadReport, store, run: str | None, per_token: float) -> str:
    """What a run held entering the answer on the searched tasks' samples, measured: tokens per layer (MB, % of
    FullKV's), or "not measured" (a run from before PolyKV measured it)."""
    from polykv.eval.results.kv_measured import measured_kv

    rows = [] if run is None else [r for r in store.samples(run) if r.task.split("@")[0] in report.samples.tasks]
    kv = measured_kv(rows, report.kv.windows or [None] * report.kv.layers)
    if kv is None:
        return "not measured"
    share = f", {kv.total_entering / kv.fullkv_entering:.0%}" if kv.fullkv_entering else ""
    layers = len(kv.entering)
    return f"{kv.total_entering / layers:.0f} ({kv.total_entering * per_token:.1f} MB{share})"


def kv_note(report: WorkloadReport) -> str:
    """How `kv_rows` counts (the report must say its model's KV dimensions)."""
    dims = report.kv
    return (
        "KV kept per layer in tokens (one K and one V per KV head; MB for all "
        f"{dims.layers} layers at {dims.kv_heads} KV heads x {dims.head_dim} x {dims.bytes} bytes; % of "
        "FullKV's), the mean over the searched tasks' held-out samples: nominal, each active layer keeps "
        "min(capacity, what it has seen), as the methods do"
        + (", and a local layer at most its sliding window less one" if any(dims.windows or ()) else "")
        + ". Entering the answer is after the prompt's pass (and the "
        "question, when it comes after compression); a decode-only plan holds the whole prompt until then. The "
        "last column, where the runs have it, is what each plan's held-out run held entering the answer, measured "
        "from its cache (mean tokens per layer, MB, % of what FullKV held on the same samples)."
    )


def hybrid_budget_lines(report: WorkloadReport) -> list[str]:
    """On a model with local (sliding-window) layers, what a budget counts and what the search conserves."""
    windows = (report.kv.windows if report.kv is not None else None) or []
    local = [w for w in windows if w is not None]
    if not local:
        return []
    bound = min(local) - 1
    return [
        f"- What a budget counts on this hybrid model ({len(local)} local layers, window "
        f"{'/'.join(map(str, sorted(set(local))))}, and {len(windows) - len(local)} global): b is the capacity per "
        f"layer as plans write it; a local layer never holds more than its window less one ({bound} tokens), so at "
        f"b >= {bound} every local layer keeps its window and the budget cuts the global layers only. The search "
        "conserves the KV actually held: it moves capacity only between layers that hold all of it, and changes a "
        "layer's method only where its capacity is under the window. Plans of other allocations (the envelope's "
        "pyramids) hold less than they write on a local layer: the KV table below gives what each plan keeps."
    ]


__all__ = ["KV_HEADER", "MEASURED_HEADER", "hybrid_budget_lines", "kv_header", "kv_note", "kv_rows"]

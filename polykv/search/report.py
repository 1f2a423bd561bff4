"""The held-out verdict of a search, the whole search report, and its Markdown.

`search_budget` runs one budget end to end: the TopRank plan (from the profile, uniform capacities),
every homogeneous plan of the scope at the same budget (fixed allocation, and native where the method
has its own layer rule), the best of them chosen on the *search* sequences, the local search from
TopRank and from the best fixed homogeneous plan, and then the verdict on the *held-out* sequences.

`held_out_verdict` executes each plan on every held-out sequence and compares them pairwise with a
paired percentile bootstrap over sequences (each sequence is one resampling unit; `polykv.eval.compare.
paired`, 10,000 replicates): KL and top-1 as differences, perplexity as a log-ratio (reported as the
ratio A / B of geometric means).

`build_report` runs several budgets on one pair of sequence sets and returns a JSON-ready dict;
`markdown(report)` renders it, and `python -m polykv.search.report REPORT.json --out docs/search.md`
writes that file from a saved report.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polykv.eval.protocols import homogeneous_plans
from polykv.methods import fit_params
from polykv.plan import Phase, Plan, Scope
from polykv.search.moves import base_params
from polykv.search.objective import Objective, SearchSequences
from polykv.search.search import Progress, SearchResult, SearchSettings, search, with_provenance

FORMAT = "polykv.search-report"
VERSION = 1
ROLES = ("searched", "toprank", "homogeneous")
CONTRASTS = (("searched", "toprank"), ("searched", "homogeneous"), ("toprank", "homogeneous"))
METRICS = ("kl", "top1", "ppl")


# ---- the held-out verdict -------------------------------------------------------------------------------
@dataclass
class Verdict:
    """Plans scored on the held-out sequences and their pairwise contrasts."""

    sequences: int
    plans: dict[str, dict[str, Any]]  # role -> name, means, per-sequence scores
    fullkv_ppl: float
    contrasts: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sequences": self.sequences,
            "plans": self.plans,
            "fullkv_ppl": self.fullkv_ppl,
            "contrasts": self.contrasts,
        }


def _contrast(a: str, b: str, metric: str, scores: Mapping[str, Mapping[str, float]], seed: int) -> dict[str, Any]:
    from polykv.eval.compare import paired

    log = metric == "ppl"
    result = paired(scores[a], scores[b], metric, seed=seed, log=log)
    out = {
        "a": a,
        "b": b,
        "metric": metric,
        "log": log,
        "difference": result.difference,
        "low": result.low,
        "high": result.high,
        "wins": result.wins,
        "ties": result.ties,
        "losses": result.losses,
        "replicates": result.replicates,
    }
    if log:
        out["ratio"], out["ratio_low"], out["ratio_high"] = result.ratio()
    sign = 1 if metric == "top1" else -1  # top1: higher is better; kl, ppl: lower
    low, high = sorted((sign * result.low, sign * result.high))
    out["verdict"] = "better" if low > 0 else "worse" if high < 0 else "no significant difference"
    return out


def held_out_verdict(objective: Objective, plans: Mapping[str, Plan], seed: int = 0) -> Verdict:
    """Every plan on every held-out sequence, then the CONTRASTS among the roles present."""
    indices = range(len(objective))
    scores: dict[str, dict[str, dict[str, float]]] = {m: {} for m in METRICS}
    table = {}
    for role, plan in plans.items():
        per = objective.scores(plan, indices)
        for metric in METRICS:
            scores[metric][role] = {f"{i:03d}": getattr(s, metric) for i, s in zip(indices, per)}
        mean_nll = sum(s.nll for s in per) / len(per)
        table[role] = {
            "name": plan.name,
            "kl": sum(s.kl for s in per) / len(per),
            "top1": sum(s.top1 for s in per) / len(per),
            "ppl": math.exp(mean_nll),  # geometric mean of the per-sequence perplexities
            "per_sequence": [{"kl": s.kl, "top1": s.top1, "nll": s.nll} for s in per],
        }
    reference = [objective.reference(i)[2] for i in indices]
    contrasts = [
        _contrast(a, b, metric, scores[metric], seed)
        for a, b in CONTRASTS
        if a in plans and b in plans
        for metric in METRICS
    ]
    return Verdict(len(objective), table, math.exp(sum(reference) / len(reference)), contrasts)


# ---- one budget, end to end ----------------------------------------------------------------------------
def toprank_plan(profile, scope: Scope | str, budget: int, statistic: str = "dppl") -> Plan:
    """TopRank by `statistic` in each active phase with `budget` tokens in every layer, the profile's
    parameters fitted to the budget (as `plan_from_profile` with uniform capacities, which refuses a budget
    under a window the profile measured with; the sweep's `route_uniform` fits them the same way)."""
    from polykv.routing import plan_from_route, toprank
    from polykv.routing.toprank import route_score

    scope = Scope(scope)
    profile.check_current(scope.phases)
    layers = profile.num_layers
    routes = {p: toprank(profile.table, p, statistic, layers) for p in scope.phases}
    measured = profile.meta.method_params
    methods = {m for route in routes.values() for m in route}
    return plan_from_route(
        routes.get(Phase.PREFILL),
        routes.get(Phase.DECODE),
        [budget] * layers if Phase.PREFILL in routes else None,
        [budget] * layers if Phase.DECODE in routes else None,
        scope,
        params={m: fit_params(m, measured.get(m, {}), budget) for m in methods},
        name=f"toprank-{statistic}-uniform-{scope.value}-b{budget}",
        description=f"TopRank by {statistic} from profile {profile.key}; {budget} tokens in every layer.",
        provenance={
            "built_by": "toprank",
            "profile": profile.key,
            "profile_model": profile.meta.model,
            "b_cal": profile.meta.b_cal,
            "statistic": statistic,
            "allocation": "uniform",
            "budget": budget,
            "route_score": {p.value: route_score(routes[p], profile.table, p, statistic) for p in scope.phases},
        },
    )


@dataclass
class BudgetResult:
    budget: int
    search: SearchResult
    plan: Plan  # the searched plan with its provenance
    toprank: Plan
    homogeneous: Plan  # the best homogeneous plan on the search sequences
    homogeneous_scores: dict[str, float]  # every homogeneous plan's J on the search sequences
    verdict: Verdict
    seconds: float
    selection_evaluations: int  # executions spent choosing the best homogeneous plan

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "seconds": self.seconds,
            "search": self.search.to_dict(),
            "plan": self.plan.to_dict(),
            "toprank": self.toprank.to_dict(),
            "homogeneous": self.homogeneous.to_dict(),
            "homogeneous_scores": dict(self.homogeneous_scores),
            "selection_evaluations": self.selection_evaluations,
            "verdict": self.verdict.to_dict(),
        }


def search_budget(
    search_objective: Objective,
    held_out: Objective,
    profile,
    scope: Scope | str,
    settings: SearchSettings,
    start: Plan | None = None,
    progress: Progress | None = None,
    provenance: Mapping[str, Any] | None = None,
    on_trace=None,
) -> BudgetResult:
    """TopRank, the best homogeneous plan (chosen on the search sequences) and the search from both (and
    from `start`, a plan of the search space, when given) at `settings.budget`; then the held-out verdict."""
    started = time.perf_counter()
    scope = Scope(scope)
    budget = settings.budget
    toprank = toprank_plan(profile, scope, budget, settings.statistic)
    params = base_params([toprank], profile)
    before = search_objective.executions
    candidates = homogeneous_plans(scope, budget, toprank.num_layers, params)
    scores = {plan.name: search_objective.value(plan) for plan in candidates}
    best = min(candidates, key=lambda p: (scores[p.name], p.name))
    best_fixed = min((p for p in candidates if p.allocation == "fixed"), key=lambda p: (scores[p.name], p.name))
    selection = search_objective.executions - before
    starts = [toprank, best_fixed] + ([start] if start is not None else [])
    result = search(search_objective, starts, settings, profile, progress, on_trace)
    plan = with_provenance(
        result,
        f"search-{result.metric}-{scope.value}-b{budget}",
        {
            "profile": profile.key,
            "statistic": settings.statistic,
            "scope": scope.value,
            "toprank": toprank.name,
            "homogeneous": best.name,
            **dict(provenance or {}),
        },
    )
    verdict = held_out_verdict(held_out, {"searched": plan, "toprank": toprank, "homogeneous": best}, settings.seed)
    return BudgetResult(budget, result, plan, toprank, best, scores, verdict, time.perf_counter() - started, selection)


def build_report(
    model,
    model_name: str,
    sequences: SearchSequences,
    profile,
    scope: Scope | str,
    budgets: Sequence[int],
    evaluations: int = 800,
    seed: int = 0,
    metric: str = "kl",
    statistic: str = "dppl",
    candidates: int = 8,
    command: str = "",
    start: Plan | None = None,
    progress: Callable[[int, str], None] | None = None,
    on_step: Progress | None = None,
    on_trace=None,
) -> tuple[dict[str, Any], list[Plan]]:
    """The search at every budget on one pair of sequence sets: (the report as a JSON-ready dict, the
    searched plans). `progress(budget, message)` is told when a budget starts; `on_step` sees the search."""
    started = time.perf_counter()
    scope = Scope(scope)
    search_objective = Objective(model, sequences.search, sequences.continuation, metric)
    held_out = Objective(model, sequences.held_out, sequences.continuation, metric)
    results = []
    for budget in budgets:
        if progress is not None:
            progress(budget, f"budget {budget}")
        settings = SearchSettings(
            budget=budget, evaluations=evaluations, candidates=candidates, seed=seed, statistic=statistic
        )
        results.append(
            search_budget(
                search_objective,
                held_out,
                profile,
                scope,
                settings,
                start,
                on_step,
                {"model": model_name, "search_sequences": sequences.search_corpus["fingerprint"]},
                on_trace,
            )
        )
    report = {
        "format": FORMAT,
        "version": VERSION,
        "model": model_name,
        "scope": scope.value,
        "metric": metric,
        "statistic": statistic,
        "seed": seed,
        "evaluations": evaluations,
        "candidates": candidates,
        "budgets": [r.to_dict() for r in results],
        "profile": {"key": profile.key, "b_cal": profile.meta.b_cal},
        "sequences": _sequences_summary(sequences),
        "command": command,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "seconds": time.perf_counter() - started,
    }
    return report, [r.plan for r in results]


def _sequences_summary(sequences: SearchSequences) -> dict[str, Any]:
    def part(corpus: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "count": corpus["num_sequences"],
            "tokens": corpus["sequence_length"],
            "split": corpus["spec"]["split"],
            "seed": corpus["spec"]["seed"],
            "sources": corpus["spec"]["sources"],
            "fingerprint": corpus["fingerprint"],
        }

    return {
        "continuation": sequences.continuation,
        "search": part(sequences.search_corpus),
        "held_out": part(sequences.held_out_corpus),
    }


# ---- Markdown -----------------------------------------------------------------------------------------
def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows),
    ]


def _cells(plan: Mapping[str, Any]) -> str:
    phases = [p.value for p in Scope(plan["scope"]).phases]
    parts = []
    for i, layer in enumerate(plan["layers"]):
        cells = [f"{layer[p]['method']}@{layer[p].get('capacity', '-')}" for p in phases]
        parts.append(f"L{i} " + " / ".join(cells))
    return ", ".join(parts)


def difference_text(c: Mapping[str, Any]) -> str:
    """A contrast's A - B and its interval (perplexity: the ratio A / B)."""
    if c["log"]:
        return f"x{c['ratio']:.4f} [x{c['ratio_low']:.4f}, x{c['ratio_high']:.4f}]"
    return f"{c['difference']:+.5f} [{c['low']:+.5f}, {c['high']:+.5f}]"


def markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown: held-out means and contrasts per budget, the search and its trace."""
    seq = report["sequences"]
    s, h = seq["search"], seq["held_out"]
    budgets = ", ".join(str(b["budget"]) for b in report["budgets"])
    lines = [
        "# Searching for a better plan, with held-out proof",
        "",
        f"Model `{report['model']}`, scope `{report['scope']}`, budgets {budgets} "
        f"(average capacity per layer; every active phase keeps exactly L x b tokens). Objective: mean "
        f"{report['metric'].upper()}(FullKV || plan) over {seq['continuation']} teacher-forced continuation steps, "
        f"the plan really executed. Moves ranked by profile `{report['profile']['key']}` ({report['statistic']}); "
        f"evaluation budget {report['evaluations']} plan executions (one plan on one sequence) per budget, "
        f"{report['candidates']} candidates per round, seed {report['seed']}.",
        "",
        f"Search sequences: {s['count']} of {s['tokens']} tokens, split `{s['split']}`, seed {s['seed']} "
        f"(fingerprint `{s['fingerprint'][:12]}`). Held-out sequences: {h['count']} of {h['tokens']} tokens, split "
        f"`{h['split']}`, seed {h['seed']} (fingerprint `{h['fingerprint'][:12]}`); no held-out sequence, nor its "
        f"scored tail, appears among the search sequences (checked). Sources: {', '.join(s['sources'])}.",
        "",
        "Generated from a real run by",
        "",
        "```bash",
        report.get("command") or "polykv search ...",
        "```",
        "",
        f"on {report['created']}, {report['machine']['platform']}, {report['machine']['cpus']} CPUs; wall time "
        f"{report['seconds'] / 60:.1f} min in all ("
        + ", ".join(f"b={b['budget']}: {b['seconds'] / 60:.1f} min" for b in report["budgets"])
        + ").",
        "",
        "The best homogeneous plan is chosen on the search sequences (never on the held-out ones) among every "
        "method of the scope in every layer at the same budget (fixed, and native where the method has its own "
        "layer rule). TopRank: the profile's per-layer winner, uniform capacities. Intervals: 95% paired "
        "bootstrap over the held-out sequences (10,000 replicates); perplexity is compared as a ratio of "
        "geometric means.",
        "",
        "## Verdict",
        "",
    ]
    for b in report["budgets"]:
        v = b["verdict"]
        words = []
        for c in v["contrasts"]:
            if c["metric"] == report["metric"] and c["a"] == "searched":
                words.append(f"vs {c['b']} {difference_text(c)}: {c['verdict']}")
        r = b["search"]
        fitted = {  # the same plans' objective on the search sequences: how much of the gain held out
            "searched": r["objective"],
            "toprank": r["starts"].get(b["toprank"]["name"]),
            "homogeneous": b["homogeneous_scores"].get(b["homogeneous"]["name"]),
        }
        held = {role: v["plans"][role][report["metric"]] for role in fitted}
        lines.append(
            f"- b = {b['budget']}, {report['metric']} on {v['sequences']} held-out sequences: "
            + "; ".join(words)
            + ". Objective on the search sequences / held out: "
            + ", ".join(f"{role} {fitted[role]:.5f} / {held[role]:.5f}" for role in fitted if fitted[role] is not None)
            + "."
        )
    for b in report["budgets"]:
        v, r = b["verdict"], b["search"]
        lines += [
            "",
            f"## Budget {b['budget']}",
            "",
            f"Held-out ({v['sequences']} sequences; FullKV perplexity {v['fullkv_ppl']:.3f}):",
            "",
        ]
        lines += _table(
            ("role", "plan", "KL", "top-1", "perplexity"),
            [
                (role, f"`{p['name']}`", f"{p['kl']:.5f}", f"{p['top1']:.4f}", f"{p['ppl']:.4f}")
                for role, p in v["plans"].items()
            ],
        )
        lines += ["", "Differences A - B (perplexity: ratio A / B), 95% paired bootstrap CI over sequences:", ""]
        lines += _table(
            ("A", "B", "metric", "A - B [95% CI]", "wins / ties / losses of A", "A is"),
            [
                (
                    c["a"],
                    c["b"],
                    c["metric"],
                    difference_text(c),
                    f"{c['wins']} / {c['ties']} / {c['losses']}",
                    c["verdict"],
                )
                for c in v["contrasts"]
            ],
        )
        starts = ", ".join(f"`{name}` {value:.5f}" for name, value in r["starts"].items())
        homog = sorted(b["homogeneous_scores"].items(), key=lambda kv: kv[1])
        lines += [
            "",
            f"Search: started from `{r['start']}` (objective on the search sequences: {starts}); {r['rounds']} rounds, "
            f"{r['evaluations']} executions (stopped: {r['stopped']}), plus {b['selection_evaluations']} to choose "
            f"the best homogeneous plan ({', '.join(f'`{n}` {x:.5f}' for n, x in homog[:4])}, ...). "
            f"Final objective {r['objective']:.5f}; moves taken: "
            + ("; ".join(m["text"] for m in r["moves"]) or "none")
            + ".",
            "",
            f"Searched plan `{b['plan']['name']}`: {_cells(b['plan'])}.",
            "",
            f"TopRank `{b['toprank']['name']}`: {_cells(b['toprank'])}.",
            "",
            "Trace (executions used, incumbent objective on the search sequences, event):",
            "",
        ]
        points = [t for t in r["trace"] if t["event"] != "rejected"]
        lines += _table(
            ("executions", "objective", "event", "move"),
            [(t["evaluations"], f"{t['objective']:.5f}", t["event"], t["move"] or "") for t in points],
        )
        rejected = sum(t["event"] == "rejected" for t in r["trace"])
        lines.append(f"\n({rejected} rounds ended with the best candidate rejected; every round is in the JSON.)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a search report's Markdown from its saved JSON.")
    parser.add_argument("report", type=Path, help="report.json written by `polykv search`")
    parser.add_argument("--out", type=Path, default=None, help="Markdown file (default: stdout)")
    args = parser.parse_args(argv)
    from polykv.files import atomic_write_text, read_report

    report = read_report(args.report, FORMAT, "search report")
    text = markdown(report)
    if args.out is None:
        print(text, end="")
    else:
        atomic_write_text(args.out, text)
    return 0


if __name__ == "__main__":
    from polykv.errors import script_exit

    raise SystemExit(script_exit(main))


__all__ = [
    "BudgetResult",
    "Verdict",
    "build_report",
    "difference_text",
    "held_out_verdict",
    "homogeneous_plans",
    "markdown",
    "search_budget",
    "toprank_plan",
]

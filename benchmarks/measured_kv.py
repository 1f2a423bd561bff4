"""The KV a saved workload search's contenders actually hold, measured from their caches (`RoutedCache.kv_held`), for
searches run before PolyKV stored that measurement with every sample.

Runs the report's contenders (searched, homogeneous, envelope, and FullKV) on the first `--samples` held-out samples
of each searched task, in score mode under the report's own settings and question protocol, into a results database,
and prints what each held entering the answer: token-layers per KV head, the share of what FullKV held on the same
samples, and each layer's count. It measures what the current code holds: docs/gemma3-workload/measured-kv was made
at commit 74997cc, before a native allocation gave what a local layer cannot hold to the layers that can.

    python benchmarks/measured_kv.py docs/gemma3-workload/prefill-after-compression/report.json \\
        --out docs/gemma3-workload/measured-kv --samples 1
"""

from __future__ import annotations

import argparse
from pathlib import Path

from polykv.eval.results.kv_measured import measured_kv
from polykv.eval.results.store import Store
from polykv.eval.running.settings import suite_settings
from polykv.eval.running.suite_runner import run_suites
from polykv.models import layer_windows, load_model
from polykv.plan import Plan
from polykv.search.workload.report import WorkloadReport

ROLES = ("searched", "homogeneous", "envelope")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="a workload search's report.json")
    parser.add_argument("--out", type=Path, required=True, help="folder of the results database written")
    parser.add_argument("--samples", type=int, default=1, help="held-out samples per searched task")
    parser.add_argument("--budget", type=int, default=None, help="the report's budget (default: its first)")
    args = parser.parse_args(argv)
    report = WorkloadReport.load(args.report)
    entry = next(e for e in report.budgets if args.budget in (None, e.budget))
    plans = [Plan.model_validate(entry.plans[role].model_dump()) for role in ROLES if role in entry.plans]
    plans.append(Plan.homogeneous("full", None, plans[0].num_layers))
    settings = {**report.samples.settings, "samples_per_task": args.samples, "mode": "score"}
    model, tokenizer = load_model(report.model)
    store = Store(args.out / "results.sqlite")
    suite = report.samples.suite
    runs = run_suites(store, report.model, model, tokenizer, plans, suite, suite_settings(suite, settings))
    print(f"{report.model}, {args.report}, budget {entry.budget}: KV held entering the answer, measured")
    for plan, run in zip(plans, runs):
        kv = measured_kv(store.samples(run), layer_windows(model))
        print(
            f"{plan.name} (run {run}, {kv.samples} samples): {kv.total_entering:,.0f} token-layers, "
            f"{kv.total_entering / kv.fullkv_entering:.1%} of FullKV's {kv.fullkv_entering:,.0f}; per layer "
            + " ".join(f"{v:.0f}" for v in kv.entering)
        )
    store.checkpoint()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

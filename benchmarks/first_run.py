"""The Runs page's proposed first run, end to end, as the page runs it (issue 41): the pilot, then the decisive run
sized from it within the time allowed, each a background job with its estimate stated before it starts; then
Compare's verdict (plan vs the homogeneous baseline) with its test and minimal detectable difference.

    .venv/bin/python benchmarks/first_run.py --model smollm2 --minutes 10 -w /tmp/first-run

Prints each step's estimate and measured time, the difference the decisive run was to detect, and the verdict.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--plan", type=Path, default=None, help="default: plans/<model>/mixed.json")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("-w", "--workspace", type=Path, required=True)
    args = parser.parse_args()

    from polykv import costs, jobs
    from polykv.errors import PolyKVError
    from polykv.eval.comparing.compare import compare_runs
    from polykv.eval.launch import first_run
    from polykv.eval.results.store import Store
    from polykv.eval.running.unit import Unit
    from polykv.jobs.costs import with_estimate
    from polykv.models import load_model
    from polykv.plan import Plan

    name, device, ws = args.model, "cpu", args.workspace
    try:  # before the model loads or the workspace is made: a missing plan is one line
        plan = Plan.load(args.plan or Path("plans") / name / "mixed.json")
    except PolyKVError as exc:
        parser.exit(2, f"error: {exc}\n")
    model, tokenizer = load_model(name, device=device)
    costs.rates_for(model, name, device)  # measured here if they are not yet
    out: dict = {"model": name, "plan": plan.name, "minutes": args.minutes, "steps": []}

    def proposal():
        store = Store(ws / "results.sqlite")
        tasks = first_run.competent(name, store, first_run.LENGTH)[0]
        per_sample = first_run.cost_per_sample(name, device, model, tokenizer, tasks, first_run.LENGTH)
        return first_run.propose(
            name, plan, store, first_run.LENGTH, seconds_per_sample=per_sample, allowance_s=60 * args.minutes
        )

    for _ in range(2):
        proposed = proposal()
        units = [
            (label, Unit.of(name, p, "ruler", proposed.settings, proposed.seed, device)) for label, p in proposed.plans
        ]
        job = with_estimate(jobs.eval_job(units, "pilot" if proposed.pilot else "decisive run"), model, tokenizer, ws)
        step = {
            "step": job.title,
            "tasks": list(proposed.settings.tasks),
            "samples_per_task": proposed.settings.samples_per_task,
            "baseline": proposed.baseline,
            "reasons": list(proposed.reasons),
            "estimate_s": job.estimate_s,
            "expected_mde": None if proposed.samples is None else proposed.samples.expected_mde,
        }
        print(json.dumps(step, indent=1), flush=True)
        jobs.start(job, ws)
        while (state := jobs.state(jobs.load_job(ws, job.id), ws)).status not in jobs.FINAL:
            time.sleep(2)
        assert state.status == "finished", (state.error, jobs.log_tail(job, ws))
        step["measured_s"] = state.measured_s
        step["runs"] = [r.run_id for r in job.runs]
        out["steps"].append(step)
        print(f"{job.title}: {state.cost_line()}", flush=True)
    route, rival = out["steps"][-1]["runs"][:2]
    result = compare_runs(Store(ws / "results.sqlite"), route, rival, "answer_nll")
    out["verdict"] = result.lines()
    print("\n".join(result.lines()))
    (ws / "first_run.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

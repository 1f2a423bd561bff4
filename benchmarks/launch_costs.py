"""Estimates against measured times, for five kinds of launch (issue 41): on a model (smollm2 by default), each
launch's estimate is computed as the app and the CLI state it before it starts (`polykv.jobs.costs`, the
stored rates of the model measured first), then it runs as the app runs it (a background job; heterogeneity
in-process, as its page measures) and its wall time is taken. The rates' corrections from earlier jobs are
cleared first, so each ratio is the plain cost model's (the jobs here then record theirs, as any job does).

    .venv/bin/python benchmarks/launch_costs.py --model smollm2 --out benchmarks/results/launch_costs.json

On an idle machine the rates and the runs see the same load. On a busy one (issue 56: "a quiet machine and a busy
one"), `--keep-rates` prices with the rates stored earlier (measured idle) and each row records the machine's load
when the launch was estimated and the estimate stretched by it (`Estimate.stretch`: up to 1 + load / cores), as
the estimate line says beside a CPU launch:

    .venv/bin/python benchmarks/launch_costs.py --keep-rates --out benchmarks/results/launch_costs_busy.json

`--kinds experiment,search --profile DIR` runs some of the five; without the profile launch, the experiment and the
search use that stored profile (a text profile of both scopes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path

KINDS = ("eval", "profile", "heterogeneity", "experiment", "search")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/launch_costs.json"))
    parser.add_argument("--keep-rates", action="store_true", help="price with the stored rates (corrections cleared)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="the launches to run, comma-separated")
    parser.add_argument("--profile", type=Path, help="a stored profile for the experiment and the search")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    if unknown := sorted(set(kinds) - set(KINDS)):
        parser.error(f"unknown kinds {unknown}; choose from {', '.join(KINDS)}")
    if "profile" not in kinds and {"experiment", "search"} & set(kinds) and args.profile is None:
        parser.error("the experiment and the search need a profile: run the profile launch or give --profile")
    if args.profile is not None and ("profile" in kinds or not (args.profile / "profile.json").is_file()):
        parser.error(f"--profile {args.profile}: give a stored profile's folder, and only without the profile launch")
    if set(kinds) != set(KINDS) and args.out == parser.get_default("out"):
        parser.error("some of the launches: give --out (the default file holds all five)")
    ws = Path(tempfile.mkdtemp(prefix="launch-costs-")) / "ws"
    from polykv import costs, jobs
    from polykv.eval.launch.work import heterogeneity_work
    from polykv.eval.running.settings import suite_settings
    from polykv.eval.running.unit import Unit
    from polykv.jobs.costs import with_estimate
    from polykv.jobs.experiment import launch_job
    from polykv.jobs.search import launch_search
    from polykv.models import context_length, load_model
    from polykv.plan import Plan
    from polykv.profile.corpus import CorpusSpec, build_corpus, default_sources
    from polykv.profile.heterogeneity import measure_heterogeneity

    name, device = args.model, "cpu"
    started = time.perf_counter()
    model, tokenizer = load_model(name, device=device)
    stored = costs.stored_rates(name, device) if args.keep_rates else None
    measured_now = stored or costs.measure_rates(model, name, device, time.perf_counter() - started)
    rates = dataclasses.replace(measured_now, ratios={})
    costs.save_rates(rates)
    print(f"rates: {rates}")
    rows = []

    def stretch() -> tuple[float | None, float]:
        load, cores = costs.machine_load()
        return load, 1.0 if load is None else 1.0 + load / cores

    def run_job(kind: str, job) -> None:
        if kind not in kinds:
            return
        load, factor = stretch()
        job = with_estimate(job, model, tokenizer, ws)
        jobs.start(job, ws)
        while (state := jobs.state(jobs.load_job(ws, job.id), ws)).status not in jobs.FINAL:
            time.sleep(1)
        assert state.status == "finished", (state.error, jobs.log_tail(job, ws))
        rows.append(
            {"kind": kind, "title": job.title, "estimate_s": job.estimate_s, "measured_s": state.measured_s}
            | {"load": load, "stretched_s": job.estimate_s * factor}
        )
        print(rows[-1], flush=True)

    # 1. an evaluation: a plan and TOVA on RULER at 1,024 tokens, answer_nll (the proposed first run's pilot)
    ruler = suite_settings(
        "ruler",
        {"tasks": ["niah_single_1", "niah_single_2"], "length": 1024, "samples_per_task": 3, "mode": "score"},
    )
    if "eval" in kinds:
        layers = len(model.model.layers)
        plans = [Plan.load(Path("plans") / name / "mixed.json"), Plan.homogeneous("tova", 256, layers, "decode")]
        units = [({"series": p.name}, Unit.of(name, p, "ruler", ruler)) for p in plans]
        run_job("eval", jobs.eval_job(units, "eval"))

    # 2. a profile: 4 text sequences of 512 tokens, both scopes
    spec = CorpusSpec(sources=("kjv", "jargon"), num_sequences=4, max_tokens=512)
    run_job("profile", jobs.profile_job(name, device, spec.to_dict(), None, ["prefill", "decode"], "profile"))
    if "profile" not in kinds and args.profile is not None:
        shutil.copytree(args.profile, ws / "profiles" / args.profile.name)
    profile = next(iter((ws / "profiles").iterdir())).name if (ws / "profiles").is_dir() else None

    # 3. heterogeneity, in-process as its page measures it: 4 inputs of 512 tokens
    if "heterogeneity" in kinds:
        sources = default_sources(name)
        tokens = min(512, context_length(model) or 512)
        load, factor = stretch()
        estimate = costs.estimate(heterogeneity_work(sources, 4, tokens).loaded(0), rates)
        start = time.perf_counter()
        corpus = build_corpus(tokenizer, CorpusSpec(sources=sources, num_sequences=4, max_tokens=tokens), model=model)
        measure_heterogeneity(model, corpus.sequences)
        measured = time.perf_counter() - start
        rows.append(
            {"kind": "heterogeneity", "title": "4 x 512", "estimate_s": estimate.seconds, "measured_s": measured}
            | {"load": load, "stretched_s": estimate.seconds * factor}
        )
        print(rows[-1], flush=True)

    # 4. an experiment: the factorial on fidelity, 2 samples of 2 tasks
    if "experiment" in kinds:
        fidelity = {"tasks": ["prose", "jargon"], "samples_per_task": 2, "prompt_tokens": 512}
        experiment = launch_job(
            ws, name, device, "factorial", profile=profile, scope="decode", budget=128, baseline="tova",
            allocation="entropy", settings=fidelity, metric="kl", loaded=(model, tokenizer),
        )  # fmt: skip
        run_job("experiment", experiment)

    # 5. a search: 40 plan executions on 4 text sequences of 256 tokens, 8 held out
    if "search" in kinds:
        search = launch_search(
            ws, name, device, profile=profile, scope="decode", budget=128, evaluations=40, search_sequences=4,
            held_out=8, max_tokens=256,
        )  # fmt: skip
        run_job("search", search)

    for row in rows:
        row["ratio"] = round(row["measured_s"] / row["estimate_s"], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"model": name, "device": device, "rates": dataclasses.asdict(rates), "launches": rows}, indent=1)
    )
    for row in rows:
        estimated, measured = row["estimate_s"], row["measured_s"]
        print(
            f"{row['kind']:<14} estimate {estimated:7.1f} s (load {row['load']}, stretched {row['stretched_s']:7.1f} s)"
            f"   measured {measured:7.1f} s   x{row['ratio']}"
        )


if __name__ == "__main__":
    main()

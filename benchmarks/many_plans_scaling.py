"""How a batched step of many plans scales with the number of plans (`polykv.runtime.many_plans`).

For 1, 8, 27, 54 and 64 plans (the nine baselines under their protocols at capacities 64, 128, ..., in that
order, the first N) it runs one shared prompt pass, then times greedy decode steps of all the plans as one
batch. Sizes are interleaved (each rep measures every size once, in turn) and the figures are medians: of
the steps within a rep, then of the reps. The last column is each size's step over one plan's step.

    python benchmarks/many_plans_scaling.py --model smollm2            # 1,024-token prompt
    python benchmarks/many_plans_scaling.py --model demo --length 200
    python benchmarks/many_plans_scaling.py --profile 54               # where 54 plans' step spends its time
    python benchmarks/many_plans_scaling.py --study-samples 3          # the smollm2 study's unit of work
    python benchmarks/many_plans_scaling.py --study-samples 3 --compare-collector   # ... and without the GC freeze
    python benchmarks/many_plans_scaling.py --floor                    # the model alone at those batch sizes
    python benchmarks/many_plans_scaling.py --study-floor 3            # the study's unit of work, plans doing nothing
    python benchmarks/many_plans_scaling.py --held 64                  # tensors held and GC time over 64 steps of 54
    python benchmarks/many_plans_scaling.py --rows-together            # rows' method steps: together or alone

`--study-samples K` times instead what the smollm2 study (docs/smollm2-study.md) spends its hours on: one RULER
sample at 1,024 tokens (niah_single_1, chat template, answer_nll: the gold answer teacher-forced) scored by the
sweep's plans, the nine baselines at its budgets 32, 64, 128, 256 and 512 under their protocols, and FullKV (46
plans in one batch, as the study runs them) over K samples x reps: the median and the mean sample, and samples
per hour from the mean (a throughput counts every pause, a garbage collection's included).
Set PYTHONPATH to an older copy of the package to measure it with the same script.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch

from polykv.eval.method_protocols import baseline_plan
from polykv.models import cache_argument_name, context_length, load_model, num_layers
from polykv.runtime.many_plans import many

NINE = ("streamingllm", "h2o", "tova", "snapkv", "pyramidkv", "cake", "d2o", "scissorhands", "cam")
CAPACITIES = (64, 128, 192, 256, 320, 384, 448, 512)
STUDY_BUDGETS = (32, 64, 128, 256, 512)


def plans_for(count: int, layers: int, length: int):
    capacities = [c for c in CAPACITIES if c < length] or [max(4, length // 4)]
    plans = [baseline_plan(m, c, layers) for c in capacities for m in NINE]
    while len(plans) < count:  # a short prompt: repeat the list
        plans += plans
    return plans[:count]


def study_plans(layers: int):
    """The smollm2 study's batch: FullKV and the nine baselines at each of its budgets (46 plans)."""
    from polykv.plan import Plan

    return [Plan.homogeneous("full", None, layers)] + [baseline_plan(m, b, layers) for b in STUDY_BUDGETS for m in NINE]


def study_ruler(model, tokenizer, count: int):
    """The study's RULER settings (niah_single_1 at 1,024 tokens, answer_nll) and `count` of its samples."""
    from polykv.eval.running.settings import suite_settings
    from polykv.eval.suites import ruler

    settings = suite_settings(
        "ruler",
        {"length": 1024, "answer_tokens": 16, "tasks": ["niah_single_1"], "samples_per_task": count, "mode": "score"},
    )
    return settings, ruler.build_samples(tokenizer, model, settings, 0)


@torch.inference_mode()
def step_times(model, plans, prompt: list[int], steps: int, profiler=None) -> tuple[float, list[float]]:
    """The shared prompt pass's seconds and each decode step's, for `plans` as one batch (`profiler`: enabled
    around the steps)."""
    with many(model, plans) as session:
        started = time.perf_counter()
        batch, logits = session.prefill(prompt)
        prefill = time.perf_counter() - started
        batch.reserve(steps + 1)
        tokens = [int(logits.argmax())] * len(plans)
        times = []
        for step in range(steps + 1):
            if profiler is not None and step == 1:
                profiler.enable()
            started = time.perf_counter()
            logits = batch.step(tokens)
            times.append(time.perf_counter() - started)
            tokens = logits.argmax(dim=-1).tolist()
        if profiler is not None:
            profiler.disable()
    return prefill, times[1:]  # the first step warms up allocations


@torch.inference_mode()
def floor(model, sizes: list[int], reps: int) -> None:
    """The model's one-token forward without any cache at batch 1, ..., N: the weights' arithmetic alone, what no
    runtime can go below; Hugging Face's own decode step (DynamicCache over 250-255 tokens); and its step over a
    preallocated cache of 256 slots (StaticCache: no eviction and no copy, what an ideal runtime's rows would
    cost), interleaved."""
    from transformers import DynamicCache

    def forward(rows: int, cache_kind: str) -> float:
        ids = torch.randint(3, model.config.vocab_size, (rows, 251))
        if cache_kind == "none":
            return median_steps(model, ids[:, 250:], {"use_cache": False}, 250)
        cache = DynamicCache() if cache_kind == "dynamic" else static_cache(model, 256)
        model(input_ids=ids[:, :250], use_cache=True, logits_to_keep=1, **{cache_argument_name(model): cache})
        return median_steps(model, ids[:, 250:], {cache_argument_name(model): cache, "use_cache": True}, 250)

    kinds = ("none", "dynamic", "static")
    times: dict[tuple[int, str], list[float]] = {(n, kind): [] for n in sizes for kind in kinds}
    for _ in range(reps):
        for n in sizes:
            for kind in kinds:
                times[n, kind].append(forward(n, kind))
    print(
        "| rows | forward, no cache (ms) | x one row | Hugging Face decode step, 250-255 cached (ms) | x one row "
        "| preallocated cache, 256 slots (ms) | x one row |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        cells = []
        for kind in kinds:
            t, one = statistics.median(times[n, kind]), statistics.median(times[sizes[0], kind])
            cells.append(f"{t * 1000:.1f} | {t / one:.2f}")
        print(f"| {n} | " + " | ".join(cells) + " |")


def static_cache(model, slots: int):
    """A preallocated cache of `slots` slots per layer (transformers' StaticCache)."""
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=slots)


def median_steps(model, ids: torch.Tensor, kwargs: dict, first: int, steps: int = 6) -> float:
    """The median seconds of one-token forwards of `ids` [rows, 1] at positions first, first + 1, ... (the first
    step left out)."""
    return statistics.median([one_step(model, ids, first + t, kwargs) for t in range(steps)][1:])


def one_step(model, ids: torch.Tensor, position: int, kwargs: dict) -> float:
    """The seconds of one forward of `ids` [rows, 1] at `position`."""
    positions = torch.full((ids.shape[0], 1), position)
    started = time.perf_counter()
    model(input_ids=ids, position_ids=positions, cache_position=positions[0], logits_to_keep=1, **kwargs)
    return time.perf_counter() - started


@torch.inference_mode()
def held(model, plans, prompt: list[int], steps: int) -> None:
    """What a long batched generation holds: the tensors alive after `steps` steps (a cache that kept every view it
    handed out grew by thousands a step) and the garbage collector's time per step, by generation."""
    import collections
    import gc

    spent: collections.Counter = collections.Counter()
    runs: collections.Counter = collections.Counter()
    started = [0.0]

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[info["generation"]] += time.perf_counter() - started[0]
            runs[info["generation"]] += 1

    with many(model, plans) as session:
        batch, logits = session.prefill(prompt)
        batch.reserve(steps + 1)
        tokens = [int(logits.argmax())] * len(plans)
        gc.callbacks.append(timed)
        try:
            for _ in range(steps):
                tokens = batch.step(tokens).argmax(dim=-1).tolist()
        finally:
            gc.callbacks.remove(timed)
        alive = sum(isinstance(o, torch.Tensor) for o in gc.get_objects())
    per_generation = ", ".join(f"gen {g}: {runs[g]} in {spent[g] * 1000:.0f} ms" for g in sorted(runs))
    print(
        f"{len(plans)} plans, {steps} steps: {alive} tensors alive at the end; garbage collection "
        f"{sum(spent.values()) / steps * 1000:.1f} ms per step ({per_generation})"
    )


def study_samples(model, tokenizer, count: int, reps: int, compare_collector: bool = False) -> None:
    """The study's unit of work; `compare_collector`: each rep also runs the samples with the objects made before
    a batched block left in the garbage collector's walk (as before `polykv.runtime.garbage`), and counts full
    collections and their seconds both ways."""
    import contextlib
    import gc

    import polykv.runtime.swap as swap
    from polykv.eval.suites import ruler

    plans = study_plans(num_layers(model))
    settings, samples = study_ruler(model, tokenizer, count)
    full_collections = [0, 0.0]  # count, seconds
    started_collection = [0.0]

    def count_full(phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started_collection[0] = time.perf_counter()
        else:
            full_collections[0] += 1
            full_collections[1] += time.perf_counter() - started_collection[0]

    own = getattr(swap, "old_objects_frozen", None)  # None: a package from before it (PYTHONPATH)
    ways = {"frozen": own}
    if compare_collector and own is not None:
        ways["walked (as before)"] = contextlib.nullcontext
    times: dict[str, list[float]] = {way: [] for way in ways}
    collections = {way: [0, 0.0] for way in ways}
    if own is not None:
        with own():  # the process's first block collects once and freezes: not in any timed sample
            pass
    gc.callbacks.append(count_full)
    try:
        for rep in range(reps):
            for way, block in ways.items() if rep % 2 == 0 else reversed(ways.items()):  # either first in turn
                if block is not None:
                    swap.old_objects_frozen = block
                walked = block is contextlib.nullcontext
                if walked:  # the first frozen block's freeze lasts (`polykv.runtime.garbage`): undo it for this way
                    gc.unfreeze()
                full_collections[:] = [0, 0.0]
                for _, _, payload in samples:
                    started = time.perf_counter()
                    ruler.score_samples(model, plans, payload, settings)
                    times[way].append(time.perf_counter() - started)
                collections[way] = [a + b for a, b in zip(collections[way], full_collections)]
                if walked:  # freeze again, uncounted
                    gc.collect()
                    gc.freeze()
    finally:
        gc.callbacks.remove(count_full)
        if own is not None:
            swap.old_objects_frozen = own
    for way, seconds_each in times.items():
        label = f" [{way}]" if len(ways) > 1 else ""
        mean = statistics.mean(seconds_each)  # throughput counts every second, a collection's pause included
        print(
            f"{len(plans)} plans, one RULER sample at 1,024 tokens scored (answer_nll){label}: "
            f"{statistics.median(seconds_each):.2f} s median, {mean:.2f} s mean of {len(seconds_each)}, "
            f"{3600 / mean:.0f} samples per hour; {collections[way][0]} full garbage collections in "
            f"{collections[way][1]:.2f} s"
        )


@torch.inference_mode()
def study_floor(model, tokenizer, count: int, reps: int) -> None:
    """The study's unit of work at its floor: what one sample would cost if its plans did no work of their own. The
    prompt's forward at one row (what every plan's prompt pass shares), then the teacher-forced steps of all the
    study's plans as rows of one batch over a preallocated cache of their mean retained length (StaticCache: no
    eviction, no copy), for the same samples as `study_samples`."""
    from transformers import DynamicCache

    _, samples = study_ruler(model, tokenizer, count)
    rows = len(study_plans(num_layers(model)))  # FullKV's and the baselines' (`slots` below: their mean retained)
    name = cache_argument_name(model)
    seconds = []
    for _ in range(reps):
        for _, _, payload in samples:
            prompt = torch.tensor([payload["prompt_ids"]])
            n, steps = prompt.shape[1], len(payload["answer_ids"]) - 1  # `answers.score_many` feeds all but the last
            slots = round((n + steps + len(NINE) * sum(min(b, n) for b in STUDY_BUDGETS)) / rows)
            started = time.perf_counter()
            model(input_ids=prompt, use_cache=True, logits_to_keep=1, **{name: DynamicCache()})
            spent = time.perf_counter() - started
            cache = static_cache(model, slots + steps)
            ids = torch.randint(3, model.config.vocab_size, (rows, slots + steps))
            model(input_ids=ids[:, :slots], use_cache=True, logits_to_keep=1, **{name: cache})  # not timed
            kwargs = {name: cache, "use_cache": True}
            spent += sum(one_step(model, ids[:, slots + t : slots + t + 1], slots + t, kwargs) for t in range(steps))
            seconds.append(spent)
            print(f"  {n}-token prompt, {steps} steps of {rows} rows over {slots} slots: {spent:.2f} s", flush=True)
    mean = statistics.mean(seconds)
    print(
        f"the study's sample at its floor: {statistics.median(seconds):.2f} s median, {mean:.2f} s mean of "
        f"{len(seconds)}, {3600 / mean:.0f} samples per hour"
    )


def one_budget_mix(layers: int, count: int = 24, capacity: int = 128):
    """A factorial's kind of batch: `count` plans at one capacity, SnapKV's prefill, each layer's decode method drawn
    (seeded) from H2O, TOVA, StreamingLLM and Scissorhands."""
    import random

    from polykv.plan import Plan

    draw = random.Random(0)
    methods = ["h2o", "tova", "streamingllm", "scissorhands"]
    plans = []
    for i in range(count):
        rows = [
            {
                "prefill": {"method": "snapkv", "capacity": capacity},
                "decode": {"method": draw.choice(methods), "capacity": capacity},
            }
            for _ in range(layers)
        ]
        plans.append(Plan.from_dict({"name": f"mix-{i}", "scope": "both", "layers": rows}))
    return plans


def rows_together(model, prompt: list[int], steps: int, reps: int) -> None:
    """The seconds a step spends in its rows' method steps (`row_storage.drop_together` and each row's own), with
    rows dropping together as now and as before, interleaved in one process: for the study's 46 plans (five
    budgets: one row of a method per block) and a one-budget mix (several rows of a method per block)."""
    from polykv.methods.attention.h2o import H2O
    from polykv.runtime import row_storage

    layers = num_layers(model)
    batches = {
        "study's 46 plans": study_plans(layers),
        "24 plans at 128, mixed": one_budget_mix(layers),
    }
    own_scores, own_least = H2O.one_slot_scores, row_storage.TOGETHER_AT_LEAST
    ways = {  # (rows of a method a block needs to drop together, does H2O drop together?)
        "every row alone": (10**9, False),
        "TOVA and StreamingLLM together, lone rows too (before)": (1, False),
        "... and H2O, lone rows too": (1, True),
        "... and H2O, lone rows alone (now)": (own_least, True),
    }
    spent = [0.0]
    real = {name: getattr(row_storage, name) for name in ("drop_together", "_finish_alone")}

    def timed(function):
        def run(*args):
            started = time.perf_counter()
            function(*args)
            spent[0] += time.perf_counter() - started

        return run

    print("| batch | rows' method steps | ms per step: median (each rep) |")
    print("|---|---|---:|")
    try:
        for name, function in real.items():
            setattr(row_storage, name, timed(function))
        for label, plans in batches.items():
            results: dict[str, list[float]] = {way: [] for way in ways}
            for _ in range(reps):
                for way, (least, h2o) in ways.items():
                    row_storage.TOGETHER_AT_LEAST, H2O.one_slot_scores = least, own_scores if h2o else None
                    spent[0] = 0.0
                    step_times(model, plans, prompt, steps)
                    results[way].append(spent[0] / (steps + 1) * 1000)
            for way, values in results.items():
                each = ", ".join(f"{v:.1f}" for v in values)
                print(f"| {label} | {way} | {statistics.median(values):.1f} ({each}) |")
    finally:
        for name, function in real.items():
            setattr(row_storage, name, function)
        row_storage.TOGETHER_AT_LEAST, H2O.one_slot_scores = own_least, own_scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--length", type=int, default=1024, help="prompt tokens")
    parser.add_argument("--sizes", default="1,8,27,54,64")
    parser.add_argument("--steps", type=int, default=8, help="decode steps timed per measurement")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", type=int, default=0, help="profile the steps of this many plans and stop")
    parser.add_argument("--sort", default="tottime", help="the profile's order (pstats: tottime, cumtime, ...)")
    parser.add_argument("--lines", type=int, default=25, help="the profile's lines")
    parser.add_argument("--callers", default="", help="also show who calls the functions matching this")
    parser.add_argument("--study-samples", type=int, default=0, help="time the study's unit of work on K samples")
    parser.add_argument(
        "--compare-collector", action="store_true", help="with --study-samples: also as before polykv.runtime.garbage"
    )
    parser.add_argument("--rows-together", action="store_true", help="rows dropping together: now and as before")
    parser.add_argument("--floor", action="store_true", help="time the model alone at the same batch sizes")
    parser.add_argument(
        "--study-floor", type=int, default=0, help="the study's unit of work on K samples, its plans doing no work"
    )
    parser.add_argument("--held", type=int, default=0, help="tensors held and GC time over this many steps of 54")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tokenizer = load_model(args.model)
    if args.floor:
        floor(model, [int(s) for s in args.sizes.split(",")], args.reps)
        return
    if args.study_floor:
        study_floor(model, tokenizer, args.study_floor, args.reps)
        return
    if args.study_samples:
        study_samples(model, tokenizer, args.study_samples, args.reps, args.compare_collector)
        return
    layers = num_layers(model)
    length = min(args.length, context_length(model) - args.steps - 8)
    prompt = torch.randint(3, model.config.vocab_size, (length,)).tolist()
    if args.held:
        held(model, plans_for(54, layers, length), prompt, args.held)
        return
    if args.rows_together:
        rows_together(model, prompt, args.steps, args.reps)
        return
    if args.profile:
        plans = plans_for(args.profile, layers, length)
        step_times(model, plans, prompt, 2)
        profiler = cProfile.Profile()
        step_times(model, plans, prompt, args.steps, profiler)
        stats = pstats.Stats(profiler).sort_stats(args.sort)
        stats.print_stats(args.lines)
        if args.callers:
            stats.print_callers(args.callers)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    plans = {n: plans_for(n, layers, length) for n in sizes}
    step_times(model, plans[sizes[0]], prompt, 1)  # warm up
    steps: dict[int, list[float]] = {n: [] for n in sizes}
    prefills: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(args.reps):
        for n in sizes:
            prefill, times = step_times(model, plans[n], prompt, args.steps)
            prefills[n].append(prefill)
            steps[n].append(statistics.median(times))
    step = {n: statistics.median(v) for n, v in steps.items()}
    print(
        f"{args.model}, {length}-token prompt, {args.threads} threads, {args.steps} steps x {args.reps} reps (medians)"
    )
    print("| plans | prompt pass (s) | step (ms) | step / one plan's |")
    print("|---:|---:|---:|---:|")
    for n in sizes:
        ratio = step[n] / step[sizes[0]]
        print(f"| {n} | {statistics.median(prefills[n]):.2f} | {step[n] * 1000:.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()

"""Many plans on one suite, their samples shared out over several processes of this machine.

`run_suites` scores every plan on one sample per prompt pass. On a CPU a decode step of dozens of plans is
bound as much by Python (each plan's layer steps its own cache) as by arithmetic, so one process with two
threads leaves a core idle much of the time. `run_sharded` starts `workers` processes (`python -m
polykv.eval.running.shards`, one thread each by default), hands process k the samples whose index is k modulo
`workers`, and waits; every process writes its samples to the same results store (SQLite in WAL mode takes
concurrent writers). This process then calls `run_suites` once more: it finds every sample done, scores any
a worker left (it died), and finishes the runs. The numbers are those of `run_suites` in one process (each
sample is scored by one batch either way), up to the rounding of another thread count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from polykv.errors import PolyKVError, first_line
from polykv.eval.results.store import Store
from polykv.plan import Plan
from polykv.progress import Progress

POLL_SECONDS = 2.0


def _shard(arguments: dict) -> None:
    """One worker (`python -m polykv.eval.running.shards`, its arguments as JSON on stdin): its share of the samples
    for every plan."""
    import torch

    from polykv.eval.running.backends import worker_model
    from polykv.eval.running.settings import suite_settings
    from polykv.eval.running.suite_runner import run_suites
    from polykv.processes import die_with_parent

    die_with_parent(arguments["parent"])  # a parent killed by a signal leaves no worker scoring on its own
    torch.set_num_threads(arguments["threads"])
    model, tokenizer = worker_model(arguments["model"], arguments["device"])
    plans = [Plan.from_json(text) for text in arguments["plans"]]
    settings = suite_settings(arguments["suite"], arguments["settings"])
    store = Store(arguments["store"])
    shard = tuple(arguments["shard"])
    run_suites(
        store, arguments["model"], model, tokenizer, plans, arguments["suite"], settings, arguments["seed"], shard=shard
    )


def run_sharded(
    store: Store,
    model_name: str,
    model,
    tokenizer,
    plans: list[Plan],
    suite: str,
    settings,
    seed: int = 0,
    *,
    workers: int = 2,
    threads: int = 1,
    device: str = "cpu",
    progress: Progress | None = None,
) -> list[str]:
    """`run_suites` with the samples shared out over `workers` processes (module docstring). `model` and
    `tokenizer` are this process's: they score what the workers left and build nothing else. `progress` sees
    (samples every run has, samples in all, "workers") while they run."""
    from polykv.eval.running.suite_runner import run_id_for, run_suites

    if workers < 2:
        return run_suites(store, model_name, model, tokenizer, plans, suite, settings, seed, progress)
    ids = [run_id_for(model_name, plan, suite, settings.to_dict(), seed) for plan in plans]
    unfinished = [run_id for run_id in ids if (run := store.run(run_id)) is None or run.status != "finished"]
    if unfinished:
        common = {
            "store": str(store.path),
            "model": model_name,
            "device": device,
            "plans": [plan.to_json() for plan in plans],
            "suite": suite,
            "settings": json.dumps(settings.to_dict()),
            "seed": seed,
            "threads": threads,
            "parent": os.getpid(),
        }
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        processes, logs = [], []
        try:
            for k in range(workers):
                logs.append(tempfile.TemporaryFile("w+"))  # a file, not a pipe: a chatty worker never blocks
                process = subprocess.Popen(
                    [sys.executable, "-m", "polykv.eval.running.shards"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=logs[-1],
                    env=env,
                    text=True,
                )
                process.stdin.write(json.dumps({**common, "shard": [k, workers]}))
                process.stdin.close()
                processes.append(process)
            while any(process.poll() is None for process in processes):
                time.sleep(POLL_SECONDS)
                if progress is not None:
                    counts = store.progress(unfinished)
                    if counts:
                        done = min(done for done, _, _ in counts.values())
                        progress(done, max(total for _, total, _ in counts.values()), "workers")
            errors = []
            for process, log in zip(processes, logs):
                if process.returncode != 0:
                    log.seek(0)
                    errors.append(log.read())
        finally:
            for process in processes:  # interrupted: no worker outlives this call
                if process.poll() is None:
                    process.terminate()
                    process.wait()
            for log in logs:
                log.close()
        if errors:
            lines = [line for line in errors[0].strip().splitlines() if line.strip()]
            raise PolyKVError(f"a worker of the sharded runs failed: {first_line(lines[-1] if lines else 'no output')}")
    return run_suites(store, model_name, model, tokenizer, plans, suite, settings, seed, progress)


if __name__ == "__main__":
    _shard(json.loads(sys.stdin.read()))


__all__ = ["run_sharded"]

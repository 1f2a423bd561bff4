"""Start-up time of the CLI commands that touch no tensor (issue: every call took ~4 s).

Each command runs as the real console script (`.venv/bin/polykv`) in a fresh process, against a small
workspace made here (a results database with one run, one job file); commands are interleaved within
each repetition and the median over repetitions is reported. A second pass reports whether the
command imported torch or transformers at all (it should not).

Run: `.venv/bin/python benchmarks/cli_startup.py --reps 7`
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLAN = REPO / "plans" / "demo" / "mixed.json"
COMMANDS = {
    "polykv --help": ["--help"],
    "plan validate": ["plan", "validate", str(PLAN)],
    "plan validate --model demo": ["plan", "validate", str(PLAN), "--model", "demo"],
    "plan show": ["plan", "show", str(PLAN)],
    "methods": ["methods"],
    "runs": ["runs"],
    "jobs list": ["jobs", "list"],
}
# Runs the CLI in-process and says at exit whether torch (really loaded, not just registered lazily)
# or transformers were imported.
PROBE = """
import atexit, sys
def report():
    torch = sys.modules.get("torch")
    loaded = torch is not None and type(torch).__name__ != "_LazyModule"
    print(f"PROBE torch={loaded} transformers={'transformers' in sys.modules}", file=sys.stderr)
atexit.register(report)
from polykv.cli import main
sys.argv = ["polykv", *sys.argv[1:]]
main()
"""


def workspace(folder: Path) -> Path:
    from polykv import jobs
    from polykv.eval.results.store import Store

    ws = folder / "ws"
    store = Store(ws / "results.sqlite")
    store.create_run(
        "run-1",
        model="demo",
        plan_name="mixed-demo",
        plan_hash="x",
        plan_json="{}",
        suite="fidelity",
        settings={},
        seed=0,
        total_samples=1,
        versions={},
    )
    corpus = {"sources": ["kjv"], "num_sequences": 1, "max_tokens": 64, "seed": 0}
    jobs.save_job(jobs.profile_job("demo", "cpu", corpus, 8, ["decode"], "bench"), ws)  # never started
    return ws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    exe = str(Path(sys.executable).with_name("polykv"))
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "POLYKV_WORKSPACE": str(workspace(Path(tmp))), "HF_HUB_OFFLINE": "1"}
        subprocess.run(
            [exe, *COMMANDS["plan validate --model demo"]], env=env, capture_output=True, check=True
        )  # import the demo once
        times: dict[str, list[float]] = {name: [] for name in COMMANDS}
        for _ in range(args.reps):
            for name, argv in COMMANDS.items():
                start = time.perf_counter()
                done = subprocess.run([exe, *argv], env=env, capture_output=True, text=True)
                times[name].append(time.perf_counter() - start)
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed: {done.stderr}")
        print(f"{'command':<30} {'median s':>9} {'min s':>7} {'max s':>7}  imports")
        for name, argv in COMMANDS.items():
            probe = subprocess.run([sys.executable, "-c", PROBE, *argv], env=env, capture_output=True, text=True)
            line = next((ln for ln in probe.stderr.splitlines() if ln.startswith("PROBE")), "PROBE ?")
            values = times[name]
            print(
                f"{name:<30} {statistics.median(values):9.3f} {min(values):7.3f} {max(values):7.3f}  "
                f"{line.removeprefix('PROBE ')}"
            )
    print(f"\n{args.reps} interleaved repetitions; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()

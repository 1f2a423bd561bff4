"""The profiler's time before and after a change: `polykv profile` at two revisions of PolyKV, interleaved.

    python benchmarks/profile_speed.py --before /tmp/before --model smollm2 \
        --sequences 4 --max-tokens 512 --b-cal 128 --scope decode --reps 2

`--before` is a checkout of the earlier revision (e.g. `git worktree add /tmp/before <rev>`); it runs with
this virtualenv, the same model directory, corpus and settings. Each repetition runs both, in alternating
order, each into its own fresh workspace, and reads the profile's own time (`seconds` in profile.json:
the profiler alone, without loading the model and building the corpus) and the command's wall time.
Prints the medians and the ratio before / after, and the largest difference between the two profiles'
cells (cosine, and dPPL relative to FullKV's perplexity).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def run(checkout: Path, args, workspace: Path) -> tuple[float, float, Path]:
    """(wall seconds, profiler seconds, profile directory) of one `polykv profile` from `checkout`."""
    from polykv.models import resolve_model_path

    model_dir = resolve_model_path(args.model)  # the same converted directory for both revisions
    env = {**os.environ, "PYTHONPATH": str(checkout), "POLYKV_CORPORA": os.environ.get("POLYKV_CORPORA", "")}
    if not env["POLYKV_CORPORA"]:
        from polykv.profile.corpus import corpora_dir

        env["POLYKV_CORPORA"] = str(corpora_dir())
    command = [sys.executable, "-m", "polykv.cli", "--no-progress", "profile", "--model", model_dir]
    command += ["--sequences", str(args.sequences), "--max-tokens", str(args.max_tokens), "--b-cal", str(args.b_cal)]
    command += ["--scope", args.scope, "--sources", args.sources, "-w", str(workspace)]
    started = time.perf_counter()
    # run from the checkout: `python -m` puts the working directory first on the module path
    subprocess.run(command, env=env, cwd=checkout, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    (profile,) = (workspace / "profiles").iterdir()
    return wall, float(json.loads((profile / "profile.json").read_text())["seconds"]), profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the earlier revision")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--b-cal", type=int, default=128)
    parser.add_argument("--scope", default="decode")
    parser.add_argument("--sources", default="kjv,jargon,stdlib,model")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    times: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    profiles: dict[str, Path] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for rep in range(args.reps):
            order = ("before", "after") if rep % 2 == 0 else ("after", "before")
            for side in order:
                checkout = args.before if side == "before" else REPO
                wall, seconds, profiles[side] = run(checkout, args, Path(scratch) / f"{side}-{rep}")
                times[side].append((wall, seconds))
                print(f"rep {rep} {side}: profiler {seconds:.1f} s, command {wall:.1f} s", flush=True)
        tables = {side: pd.read_csv(path / "methods.csv") for side, path in profiles.items()}
        reference = json.loads((profiles["after"] / "profile.json").read_text())
    merged = tables["before"].merge(tables["after"], on=["layer", "scope", "method"], suffixes=("_before", "_after"))
    ppl = max(reference.get("fullkv_ppl", {"": 1.0}).values())
    gap_cos = (merged.cosine_before - merged.cosine_after).abs().max()
    gap_dppl = ((merged.dppl_before - merged.dppl_after).abs() / ppl).max()
    median = {
        side: (statistics.median(t[0] for t in rows), statistics.median(t[1] for t in rows))
        for side, rows in times.items()
    }
    print(
        f"`polykv profile --model {args.model} --sequences {args.sequences} --max-tokens {args.max_tokens} "
        f"--b-cal {args.b_cal} --scope {args.scope} --sources {args.sources}`: {len(merged)} cells, medians of "
        f"{args.reps} interleaved runs"
    )
    print(f"before  profiler {median['before'][1]:8.1f} s   command {median['before'][0]:8.1f} s")
    print(f"after   profiler {median['after'][1]:8.1f} s   command {median['after'][0]:8.1f} s")
    print(
        f"speed-up (before / after): profiler {median['before'][1] / median['after'][1]:.2f}x, "
        f"command {median['before'][0] / median['after'][0]:.2f}x"
    )
    print(f"largest difference: cosine {gap_cos:.2e}, dPPL / FullKV PPL {gap_dppl:.2e}")


if __name__ == "__main__":
    main()

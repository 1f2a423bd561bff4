"""The plan search on the demo model at two budgets, timed; writes docs/search.md from the saved report.

Runs `polykv search` as a real process (wall clock includes start-up, the model import, the profile when
it is not there yet, both searches and the held-out verdicts), then renders the report JSON it wrote to
Markdown with the measured wall time added. Whatever the verdict is, it is written as it came out.

Run: `.venv/bin/python benchmarks/search.py` (defaults: budgets 32 and 64, scope decode, 800 executions
per budget, 16 search and 48 held-out sequences, seed 0; about 10 minutes on this project's 2-core
machine). `--markdown-only` re-renders docs/search.md from docs/search/report.json without running.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="32,64")
    parser.add_argument("--evaluations", type=int, default=800)
    parser.add_argument("--search-sequences", type=int, default=16)
    parser.add_argument("--held-out", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "search")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "search.md")
    parser.add_argument("--markdown-only", action="store_true")
    args = parser.parse_args()

    from polykv.files import atomic_write_text, read_json
    from polykv.search.text.report import markdown

    timing = args.out / "wall-seconds.txt"
    if not args.markdown_only:
        command = ["search", "--model", "demo", "--scope", "decode", "--profile", "auto"]
        for budget in args.budgets.split(","):
            command += ["--budget", budget.strip()]
        command += [
            "--evaluations",
            str(args.evaluations),
            "--search-sequences",
            str(args.search_sequences),
            "--held-out",
            str(args.held_out),
            "--seed",
            str(args.seed),
            "--out",
            os.path.relpath(args.out, REPO),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "polykv.cli", "--no-progress", *command], cwd=REPO, env=env, check=True)
        atomic_write_text(timing, f"{time.perf_counter() - started:.1f}\n")
    report = read_json(args.out / "report.json", "search report")
    text = markdown(report)
    if timing.is_file():
        seconds = float(timing.read_text())
        text += (
            f"\n## Benchmark\n\nThe whole command, as a process (start-up, model, profile, both budgets, verdicts), "
            f"took {seconds / 60:.1f} min wall clock ({seconds:.0f} s) on this project's CPU machine "
            f"({os.cpu_count()} cores, shared with other work; `OMP_NUM_THREADS=1`); the target is 20 minutes. "
            f"Regenerate with `.venv/bin/python benchmarks/search.py`; the report and the searched plans are in "
            f"`{os.path.relpath(args.out, REPO)}/`.\n"
        )
    atomic_write_text(args.doc, text)
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Plan search: look for a plan that executes closer to FullKV than TopRank, and prove it on held-out text.

  objective  `Objective`: mean KL(FullKV || plan) (or dPPL) over teacher-forced continuation steps of
             token sequences, the plan really executed; FullKV cached per sequence. `build_sequences`:
             search (calibration) and held-out (evaluation) sequences, disjoint by token content.
  moves      the move set at a fixed total capacity per active phase: change a cell's method, move
             capacity between two layers; ranked by the profile.
  search     `search`: local search from start plans with successive halving, an evaluation budget
             (plan executions) and a seed; the trace of objective vs executions.
  text       the search on text (`text.run.run_text_search`, its one entry point): TopRank, the best
             homogeneous plan, the search, and the held-out verdict with paired bootstrap intervals over
             sequences; its typed report and Markdown (`text.report`).
  workload   the search on a workload's own prompts (`workload.run.run_workload_search`), judged on its held-out
             samples; its typed report (`workload.report`) and pages.
  hooks      `SearchHooks`: what a search tells whoever started it as it runs (the CLI's bars, a job's state).
  report_parts  what both reports hold alike (`SearchRecord`: the local search's result, moves and trace).

Candidates run one after another in this process, or, with an executor (`parallel.RayExecutor`, `polykv search
--backend ray`), each rung's candidates run as parallel Ray tasks with the same results.
"""

from polykv.search.local_search import SearchResult, SearchSettings, TracePoint, search, with_provenance
from polykv.search.moves import Move, apply, proposals, totals
from polykv.search.objective import Objective, SearchSequences, SequenceScore, build_sequences, check_disjoint

__all__ = [
    "Move",
    "Objective",
    "SearchResult",
    "SearchSequences",
    "SearchSettings",
    "SequenceScore",
    "TracePoint",
    "apply",
    "build_sequences",
    "check_disjoint",
    "proposals",
    "search",
    "totals",
    "with_provenance",
]

"""Plan search: look for a plan that executes closer to FullKV than TopRank, and prove it on held-out text.

  objective  `Objective`: mean KL(FullKV || plan) (or dPPL) over teacher-forced continuation steps of
             token sequences, the plan really executed; FullKV cached per sequence. `build_sequences`:
             search (calibration) and held-out (evaluation) sequences, disjoint by token content.
  moves      the move set at a fixed total capacity per active phase: change a cell's method, move
             capacity between two layers; ranked by the profile.
  search     `search`: local search from start plans with successive halving, an evaluation budget
             (plan executions) and a seed; the trace of objective vs executions.
  report     `search_budget` / `build_report`: TopRank, the best homogeneous plan, the search, and the
             held-out verdict with paired bootstrap intervals over sequences; `markdown`.

Candidates run one after another in this process, or, with an executor (`parallel.RayExecutor`, `polykv search
--backend ray`), each rung's candidates run as parallel Ray tasks with the same results.
"""

from polykv.search.moves import Move, apply, proposals, totals
from polykv.search.objective import Objective, SearchSequences, SequenceScore, build_sequences, check_disjoint
from polykv.search.search import SearchResult, SearchSettings, TracePoint, search, with_provenance

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

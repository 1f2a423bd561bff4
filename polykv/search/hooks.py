"""What a search tells whoever started it while it runs (`SearchHooks`): the CLI draws progress bars from it, a
background job writes its state file. Every hook is optional; a search calls the ones it has.

  stage    a step before the search starts: "sequences" (the text search's search and held-out sequences),
           "samples" (the workload search's), "profile" (the profile computed for it, when asked for "auto")
  profile  that profile's progress: (fraction done, what)
  budget   the text search: the search at this budget starts
  say      the workload search: one sentence on where it stands ("budget 64: the verdict, ...")
  step     the local search's executions: (used, the evaluation budget, what)
  trace    each point of the search's trace as it is made, with the best plan so far
  sample   the workload verdict's held-out samples: (done, total, where)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polykv.plan import Plan
from polykv.search.local_search import Progress, TracePoint


@dataclass(frozen=True)
class SearchHooks:
    stage: Callable[[str], None] | None = None
    profile: Callable[[float, str], None] | None = None
    budget: Callable[[int], None] | None = None
    say: Callable[[str], None] | None = None
    step: Progress | None = None
    trace: Callable[[TracePoint, Plan], None] | None = None
    sample: Callable[[int, int, str], None] | None = None

    def tell_stage(self, name: str) -> None:
        if self.stage is not None:
            self.stage(name)

    def tell(self, message: str) -> None:
        if self.say is not None:
            self.say(message)


__all__ = ["SearchHooks"]

"""The registry of profile statistics: what a profile measures per cell and which way is better (+1: higher,
-1: lower). Everything that names a statistic reads it here: TopRank (`polykv.routing`), the profile store,
the job files' schemas (`polykv.jobs.spec`), the study's checks and the pages' choices. No pandas: a job
file's schema reads it at import."""

from __future__ import annotations

STATISTICS: dict[str, int] = {"cosine": 1, "dppl": -1, "danswer": -1}
# danswer exists in workload profiles only (sources such as ruler:TASK@LENGTH): the change of the gold answer's NLL
ANSWER_STATISTICS: tuple[str, ...] = ("danswer",)
TEXT_STATISTICS: tuple[str, ...] = tuple(s for s in STATISTICS if s not in ANSWER_STATISTICS)  # a text profile's

__all__ = ["ANSWER_STATISTICS", "STATISTICS", "TEXT_STATISTICS"]

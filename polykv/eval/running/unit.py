"""A unit of work: one run (model, plan, suite, settings, seed, device) as plain, serialisable fields.

The backends (`polykv.eval.running.backends`) execute units and background jobs (`polykv.jobs`) store them in
their job files; both import this module, neither imports the other for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from polykv.plan import Plan


@dataclass(frozen=True)
class Unit:
    model: str
    plan_json: str
    suite: str = "fidelity"
    settings_json: str = "{}"  # the suite's Settings as JSON (empty: the suite's defaults)
    seed: int = 0
    device: str = "cpu"

    @classmethod
    def of(cls, model: str, plan: Plan, suite: str = "fidelity", settings=None, seed: int = 0, device: str = "cpu"):
        return cls(model, plan.to_json(), suite, json.dumps(settings.to_dict() if settings else {}), seed, device)

    def settings(self):
        from polykv.eval.running.settings import suite_settings

        return suite_settings(self.suite, self.settings_json)


__all__ = ["Unit"]

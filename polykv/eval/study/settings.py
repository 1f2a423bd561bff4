"""What the study runs (`StudySettings`): the model, the primary route's phase and budget, the sweep, the
workloads and how each is scored, the workload check before any plan runs; every choice checked when the
settings are made, before anything loads (a bad one is one line at once). `polykv.eval.study.run.run_study`
runs them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from polykv.eval.workloads.competence import COMPETENCE_THRESHOLD, QUESTION_SUITES
from polykv.plan import Scope
from polykv.profile.statistics import TEXT_STATISTICS

ANCHOR_RULES = ("paper", "strongest")


@dataclass(frozen=True)
class StudySettings:
    """What the study runs. Defaults: the demo model, a decode-phase route at average capacity 64, fidelity."""

    model: str = "demo"
    scope: str = "decode"  # the phase of the primary route (the factorial and the placement control)
    budget: int = 64  # average capacity of the routes, the factorial and the placement control
    budgets: tuple[int, ...] = (16, 32, 64, 128, 256)  # the sweep's average capacities
    placements: int = 99  # K random count-matched placements
    statistic: str = "dppl"  # TopRank's profile statistic
    allocation: str = "ppl"  # the factorial's allocated arm (and the sweep's route-ppl row)
    # the factorial's homogeneous anchor: "paper" (TOVA for a decode route, the route's majority method for a
    # prefill route, as the paper chose), "strongest" (the best method alone at the budget on calibration
    # samples of the suite) or a method's name
    baseline: str = "paper"
    metric: str = "kl"  # the primary suite's metric that scores a run
    samples_per_task: int | None = None  # the primary suite's samples per task (None: its settings', fidelity 3)
    calibration_sequences: int = 20
    seed: int = 0
    backend: str = "local"  # "ray": runs as Ray tasks on a local cluster (one per core)
    device: str = "cpu"
    suite: str = "fidelity"  # the primary workload: the factorial and the sweeps
    suite_settings: dict | None = None  # its settings (JSON object); None: the suite's defaults for the model
    placement_suite: str | None = None  # the suite scoring the placement control; None: the primary suite
    placement_settings: dict | None = None
    placement_metric: str | None = None  # None: `metric`
    sweep_scopes: tuple[str, ...] | None = None  # the phases whose TopRank routes are swept; None: (scope,)
    calibration_tokens: int = 2048  # tokens per calibration sequence (clipped to the model's context)
    calibration_sources: tuple[str, ...] | None = None  # None: the model's default sources
    b_cal: int | None = None  # None: 256, scaled down for short contexts
    baselines: tuple[str, ...] | None = None  # the sweep's standalone baselines; None: every method with a protocol
    batched: bool = True  # the runs of a suite execute together (local backend)
    workers: int = 1  # batched, local: the samples shared out over this many processes (`polykv.eval.running.shards`)
    sweep_ppl: bool = True  # the sweep's route-ppl row (the route with the profile's PPL capacities at each budget)
    # the sweep's like-with-like comparator: every method alone in the route's scope at each budget (False: only
    # the baselines under their own protocols, as studies made before it; its verdicts are then across protocols)
    sweep_matched: bool = True
    # question suites: the workload check before any plan runs
    competence_threshold: float = COMPETENCE_THRESHOLD  # FullKV accuracy (%) a task needs to stay in the macro
    pilot_samples: int = 10  # samples per task of the pilot (FullKV's competence; the anchor's spread)
    auto_samples: bool = False  # choose samples_per_task from the pilot: `mde` within `time_limit`
    mde: float | None = None  # target minimal detectable difference, in the primary metric's units
    time_limit: float | None = None  # minutes the primary runs may take (auto_samples)
    min_samples: int = 1  # auto_samples: at least this many per task (the time limit wins)
    accuracy_samples: int | None = None  # answer_nll primary: also generate on this many samples per task
    placement_samples: int | None = None  # placement control on the primary suite: its samples per task
    # auto_samples: one sample with every plan takes this many seconds (given instead of timed, e.g. the time an
    # earlier run of the same study measured, so that a study rendered again from its database chooses the same
    # samples per task and finds every run it made)
    sample_seconds: float | None = None
    # run nothing: the profile and every run are read from the workspace, the runs whatever code revisions made
    # them (the study rendered again from its database, e.g. with this version's statistics and sentences)
    replay: bool = False

    def __post_init__(self):
        if Scope(self.scope) is Scope.BOTH:
            raise ValueError("the study routes one phase: scope must be prefill or decode")
        if self.budget < 1 or any(b < 1 for b in self.budgets) or not self.budgets:
            raise ValueError("budgets must be positive integers")
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if self.placements < 1:
            raise ValueError("placements must be at least 1")
        for phase in self.swept:
            if Scope(phase) is Scope.BOTH:
                raise ValueError("each swept route routes one phase: prefill or decode")
        if self.auto_samples and self.mde is None and self.time_limit is None:
            raise ValueError("automatic samples need a target (--mde) or a time limit (--time-limit)")
        if self.auto_samples and self.suite not in QUESTION_SUITES:
            raise ValueError("automatic samples need a question suite (ruler, longbench): its pilot sets them")
        if self.sample_seconds is not None and not self.sample_seconds > 0:
            raise ValueError(f"--sample-seconds must be positive, got {self.sample_seconds}")
        if self.mde is not None and not self.mde > 0:
            raise ValueError(f"--mde must be positive, got {self.mde}")
        if self.time_limit is not None and not self.time_limit > 0:
            raise ValueError(f"--time-limit must be positive minutes, got {self.time_limit}")
        if self.baseline not in ANCHOR_RULES:
            from polykv.methods import REGISTRY

            if self.baseline not in REGISTRY or self.baseline == "full":
                methods = ", ".join(m for m in REGISTRY if m != "full")
                raise ValueError(
                    f"--baseline must be {', '.join(ANCHOR_RULES)} or a method ({methods}), got {self.baseline!r}"
                )
        if not 0 <= self.competence_threshold <= 100:
            raise ValueError(f"the competence threshold is a percentage, got {self.competence_threshold}")
        self._check_choices()

    def _check_choices(self) -> None:
        """Every named choice and count checked before anything loads (a bad one is one line at once)."""
        from polykv import limits
        from polykv.eval.running.backends import BACKENDS
        from polykv.models import check_device
        from polykv.profile.corpus import CorpusSpec, is_workload_source
        from polykv.routing import ALLOCATIONS

        if self.statistic not in TEXT_STATISTICS:  # a text profile's (danswer needs a workload's prompts)
            raise ValueError(f"--statistic must be one of {', '.join(TEXT_STATISTICS)} (got {self.statistic!r})")
        arms = [a for a in ALLOCATIONS if a != "uniform"]
        if self.allocation not in arms:
            raise ValueError(f"--allocation must be one of {', '.join(arms)} (got {self.allocation!r})")
        backends = [b for b in BACKENDS if b != "subprocess"]
        if self.backend not in backends:
            raise ValueError(f"--backend must be one of {', '.join(backends)} (got {self.backend!r})")
        check_device(self.device)
        for name, value in (("--mde", self.mde), ("--time-limit", self.time_limit)):
            limits.check_finite(name, value)
        limits.check_finite("--sample-seconds", self.sample_seconds)
        limits.check_at_most("--k", self.placements, limits.PLACEMENTS)
        limits.check_at_most("--workers", self.workers, limits.WORKERS)
        limits.check_at_most("--samples", self.samples_per_task, limits.SAMPLES_PER_TASK)
        limits.check_at_most("--calibration-sequences", self.calibration_sequences, limits.SEQUENCES)
        if self.calibration_sources:
            workload = [s for s in self.calibration_sources if is_workload_source(s)]
            if workload:
                raise ValueError(
                    f"--sources {workload[0]}: the study profiles text (kjv, jargon, stdlib, model, file:PATH); a "
                    "workload's own prompts rank plans in `polykv search --sources`"
                )
            CorpusSpec(sources=self.calibration_sources, num_sequences=1, max_tokens=16)  # the sources' own checks

    @property
    def swept(self) -> tuple[str, ...]:
        """The phases whose routes the sweep runs, the primary one first."""
        return tuple(dict.fromkeys((self.scope, *(self.sweep_scopes or ()))))

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

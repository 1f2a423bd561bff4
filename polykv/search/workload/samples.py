"""A workload's samples for its search (`polykv.search.workload.run`): the search samples from its calibration split,
never a held-out one (`draw_samples`, checked by prompt), the held-out samples' settings per metric of the verdict
(`verdict_settings`), their mean token counts (`sample_lengths`), and the workload profile computed on the search
samples (`build_workload_profile`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from polykv.plan import Scope
from polykv.question_protocol import QuestionProtocol
from polykv.search.workload.objective import AnswerObjective
from polykv.search.workload.report import SamplesRecord


@dataclasses.dataclass
class WorkloadSamples:
    """The workload, its search samples (calibration split) and how many held-out samples per task."""

    workload: Any  # polykv.eval.workloads.workload.Workload
    search: list[tuple[str, str, dict]]
    held_out: int
    transfer: tuple[str, ...] = ()  # tasks of the same suite judged but never searched on
    seed: int = 0
    accuracy: int | None = None  # held-out samples per task that also generate (None: all of them)
    held_out_prompts: frozenset[str] = frozenset()  # the held-out samples' prompt hashes (never calibration)
    lengths: dict = dataclasses.field(default_factory=dict)  # per task, the held-out samples' mean token counts

    def objective(self, model) -> AnswerObjective:
        from polykv.eval.workloads.workload import answer_sample

        return AnswerObjective(
            model, [answer_sample(self.workload, p) for _, _, p in self.search], [t for t, _, _ in self.search]
        )

    @property
    def question(self) -> QuestionProtocol:
        """Where every sample's question goes (`polykv.eval.suites.answers`)."""
        return self.workload.settings.question

    def verdict_settings(self) -> dict[str, Any]:
        """{metric: the suite's settings whose runs give it} (`verdict_settings`)."""
        return verdict_settings(self.workload, self.held_out, self.transfer, self.accuracy)

    def record(self) -> SamplesRecord:
        """The samples as the report keeps them."""
        return SamplesRecord(
            suite=self.workload.suite,
            sources=list(self.workload.sources),
            settings=self.workload.settings.to_dict(),
            search_samples=len(self.search),
            search_per_task=len(self.search) // len(self.workload.tasks),
            held_out_per_task=self.held_out,
            transfer=list(self.transfer),
            accuracy_per_task=self.held_out if self.accuracy is None else min(self.accuracy, self.held_out),
            seed=self.seed,
            question=self.question,
            lengths=self.lengths,
        )


def verdict_settings(workload, held_out: int, transfer: Sequence[str] = (), accuracy: int | None = None) -> dict:
    """{metric: the suite's settings of the verdict runs that give it}: searched and transfer tasks, `held_out`
    samples per task scored (answer_nll); accuracy generated on the first `accuracy` of them (the same prompts:
    one seed), or on all in one run (mode both) when `accuracy` is None or not below `held_out`."""
    tasks = tuple(workload.tasks) + tuple(transfer)
    if accuracy is None or accuracy >= held_out:
        both = dataclasses.replace(workload.with_samples(held_out, "both"), tasks=tasks)
        return {"answer_nll": both, "score": both}
    return {
        "answer_nll": dataclasses.replace(workload.with_samples(held_out, "score"), tasks=tasks),
        "score": dataclasses.replace(workload.with_samples(accuracy, "generate"), tasks=tasks),
    }


def draw_samples(
    workload,
    tokenizer,
    model,
    search_per_task: int,
    held_out: int,
    seed: int = 0,
    transfer: Sequence[str] = (),
    accuracy: int | None = None,
) -> WorkloadSamples:
    """Search samples from the calibration split, none of them a held-out sample (checked by prompt)."""
    from polykv.eval.workloads.workload import calibration_samples, evaluation_samples, prompt_hash

    overlap = set(transfer) & set(workload.tasks)
    if overlap:
        raise ValueError(f"transfer task {sorted(overlap)[0]} is also searched on: list it once")
    held = evaluation_samples(workload, tokenizer, model, held_out, seed)
    exclude = {prompt_hash(workload, task, sample, seed, payload) for task, sample, payload in held}
    chosen = calibration_samples(workload, tokenizer, model, search_per_task, seed, exclude)
    judged = list(held)
    if transfer:
        others = dataclasses.replace(workload, settings=dataclasses.replace(workload.settings, tasks=tuple(transfer)))
        judged += evaluation_samples(others, tokenizer, model, held_out, seed)
    lengths = sample_lengths(workload, judged)
    return WorkloadSamples(workload, chosen, held_out, tuple(transfer), seed, accuracy, frozenset(exclude), lengths)


def sample_lengths(workload, rows) -> dict[str, dict[str, float]]:
    """Per task, the mean token counts of its samples: the prompt, its question when it comes after compression
    (0 when in the prompt) and the gold answer scored (what the KV memory of a plan depends on)."""
    from polykv.eval.workloads.workload import answer_sample

    out: dict[str, list] = {}
    for task, _, payload in rows:
        q = answer_sample(workload, payload)
        asked = 0 if q.question_start is None else len(q.prompt_ids) - q.question_start
        out.setdefault(task, []).append((len(q.prompt_ids), asked, len(q.answer_ids)))
    return {
        task: dict(zip(("prompt", "question", "answer"), (sum(col) / len(col) for col in zip(*values))))
        for task, values in out.items()
    }


def build_workload_profile(
    model_name: str, model, tokenizer, root, samples: WorkloadSamples, scope, b_cal: int | None = None, progress=None
):
    """The workload profile of the searched scope on the search's calibration split (its search samples per
    task, never a held-out prompt): danswer ranks the moves and gives toprank-workload (computed once, reused)."""
    from polykv.eval.workloads.workload import workload_corpus
    from polykv.profile.build import build_profile
    from polykv.profile.corpus import CorpusSpec

    spec = CorpusSpec(
        sources=samples.workload.sources,
        num_sequences=len(samples.search),
        max_tokens=getattr(samples.workload.settings, "length", 2048),
        seed=samples.seed,
    )
    corpus = workload_corpus(tokenizer, model, spec, set(samples.held_out_prompts), samples.question)
    return build_profile(
        model_name,
        model,
        tokenizer,
        root,
        spec,
        capacity=b_cal,
        scopes=tuple(Scope(scope).phases),
        progress=progress,
        workload=corpus,
    )


__all__ = [
    "WorkloadSamples",
    "build_workload_profile",
    "draw_samples",
    "sample_lengths",
    "verdict_settings",
]

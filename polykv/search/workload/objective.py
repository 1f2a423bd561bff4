"""The workload objective: a plan's answer_nll on a workload's calibration samples.

For a plan pi and a sample (prompt, gold answer a_1..a_n) the plan really executes: the prompt in one pass
(compressed at its end where pi acts in prefill), then the answer fed token by token with pi's decode
eviction active, exactly as the suite's `answer_nll` is scored in an evaluation
(`polykv.eval.suites.answers`):

    answer_nll = mean_t -log p_pi(a_t | prompt, a_<t)            (lower is better)

`AnswerObjective` has the text objective's interface (`polykv.search.objective.Objective`: `value`, `values`,
`cost`, `executions`, `limit`, successive halving's batches), so the search runs on it unchanged. The plans of
one batch that meet on a sample share its prompt pass (`answers.answer_many`: the plans' rows step as one
batch), and later batches replay it (`many_plans.PromptPasses`: a search meets the same samples round after round);
a (plan, sample) score is computed once and kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from polykv.models.support import greedy_needs_generate
from polykv.plan import Plan
from polykv.search.objective import BudgetExhausted, Objective, plan_key

METRIC = "answer_nll"


@dataclass(frozen=True)
class AnswerScore:
    """One plan on one sample: the gold answer's mean NLL per token."""

    nll: float

    def value(self, metric: str) -> float:
        return self.nll


class AnswerObjective(Objective):
    """A plan's mean answer_nll over a fixed list of a workload's samples (module docstring)."""

    def __init__(self, model, samples: Sequence, tasks: Sequence[str] | None = None):
        if not samples:
            raise ValueError("the workload objective needs at least one sample")
        self.model = model
        self.samples = list(samples)  # `AnswerSample`s
        self.tasks = list(tasks) if tasks is not None else [""] * len(self.samples)
        self.sequences = [list(q.prompt_ids) + list(q.answer_ids) for q in self.samples]  # the search sequences
        self.continuation = 0
        self.metric = METRIC
        self.executions = 0
        self.limit: int | None = None
        self.executor = None
        self._reference = {}
        self._scores: dict[tuple[str, int], AnswerScore] = {}
        self.prompt_passes = None  # made at the first batch (torch: when a plan runs)

    def reference(self, i: int):
        raise NotImplementedError("the workload objective compares plans by their own answer_nll")

    def score(self, plan: Plan, i: int) -> AnswerScore:
        self._execute([(plan, i)])
        return self._scores[(plan_key(plan), i)]

    def scores(self, plan: Plan, indices: Iterable[int]) -> list[AnswerScore]:
        chosen = list(indices)
        self._execute((plan, i) for i in chosen)
        return [self._scores[(plan_key(plan), i)] for i in chosen]

    def values(self, plans: Sequence[Plan], indices: Iterable[int] | None = None) -> list[float]:
        chosen = list(range(len(self.samples)) if indices is None else indices)
        self._execute((plan, i) for plan in plans for i in chosen)
        return [self.value(plan, chosen) for plan in plans]

    def _execute(self, pairs: Iterable[tuple[Plan, int]]) -> None:
        """The uncached pairs, cut at `limit` in the order given (then BudgetExhausted); the plans that meet
        on one sample run as one batch."""
        batch, exhausted = self._pending(pairs)
        by_sample: dict[int, list[tuple[tuple[str, int], Plan]]] = {}
        for key, (plan, i) in batch:
            by_sample.setdefault(i, []).append((key, plan))
        for i, rows in by_sample.items():
            if self.prompt_passes is None:
                from polykv.runtime.many_plans import PromptPasses

                self.prompt_passes = PromptPasses()
            found = answer_nlls(self.model, [plan for _, plan in rows], self.samples[i], self.prompt_passes)
            for (key, _), nll in zip(rows, found):
                self._scores[key] = AnswerScore(nll)
            self.executions += len(rows)
        if exhausted:
            raise BudgetExhausted


def answer_nlls(model, plans: Sequence[Plan], sample, kept=None) -> list[float]:
    """Each plan's answer_nll on one sample: one prompt pass for all (`answers.answer_many`; replayed from `kept`
    when it holds it, `PromptPasses`), or plan by plan where the model's generation needs `generate`."""
    from polykv.eval.suites import answers

    if greedy_needs_generate(model):
        return [answers.answer_alone(model, plan, sample, "score").nll for plan in plans]
    return [answer.nll for answer in answers.answer_many(model, plans, sample, "score", kept=kept)]


__all__ = ["METRIC", "AnswerObjective", "AnswerScore", "answer_nlls"]

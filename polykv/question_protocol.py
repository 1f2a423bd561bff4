"""Where a question suite puts its question: the `question` setting of RULER and LongBench, of a workload, a
workload profile and a search, one name end to end. How the answers are computed under each:
`polykv.eval.suites.answers`."""

from __future__ import annotations

from enum import StrEnum


class QuestionProtocol(StrEnum):
    """A str: settings, job files and databases store the value, and compare equal to it."""

    IN_PROMPT = "in-prompt"  # the default: the plan compresses the question with the prompt (the official protocols)
    AFTER_COMPRESSION = "after-compression"  # question-agnostic (kvpress's pipeline): the context first, then it

    @property
    def compresses_question(self) -> bool:
        """Whether the plan's prefill compression sees the question (else the prompt's pass is the context)."""
        return self is QuestionProtocol.IN_PROMPT

    @property
    def words(self) -> str:
        """The protocol as a report says it."""
        return WORDS[self]

    @classmethod
    def of(cls, settings: object) -> QuestionProtocol:
        """The protocol of a suite's settings (an object or a dict); the default where they have none (fidelity's,
        or settings saved before the setting existed)."""
        value = settings.get("question") if isinstance(settings, dict) else getattr(settings, "question", None)
        return cls(value or cls.IN_PROMPT)


WORDS = {
    QuestionProtocol.IN_PROMPT: "in the prompt (the plan compresses context and question together)",
    QuestionProtocol.AFTER_COMPRESSION: "after compression (the plan compresses the context; the question follows, "
    "kept in full)",
}
CHOICES = ", ".join(QuestionProtocol)  # for help texts and refusals
HELP = (  # after "where the question goes: "
    f"{QuestionProtocol.IN_PROMPT} (the default: the plan compresses it with the prompt) or "
    f"{QuestionProtocol.AFTER_COMPRESSION} (the plan compresses the context; the question follows, kept in full)."
)

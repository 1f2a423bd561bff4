"""The question suites' `mode`, `question` and `answer_tokens` settings: the values they take, their checks (one
line each), which metrics each mode reports, and how many gold tokens answer_nll scores. What each mode and
question protocol means, and how the answers are computed under them: `polykv.eval.suites.answers`."""

from __future__ import annotations

from polykv.errors import SettingsError
from polykv.question_protocol import CHOICES, QuestionProtocol

MODES = ("generate", "score", "both")
MODE_METRICS = {
    "generate": ("score", "agreement"),
    "score": ("answer_nll", "answer_match"),
    "both": ("score", "agreement", "answer_nll", "answer_match"),
}


def check_mode(mode: str, suite: str) -> None:
    if mode not in MODES:
        raise ValueError(f"{suite} mode must be one of {', '.join(MODES)}, got {mode!r}")


def mode_for(metric: str, given: str | None = None) -> str:
    """A question suite's mode for an evaluation scored by `metric`: the one `given`, else the cheapest that
    reports it (answer_nll: score, no generation; score and agreement: generate)."""
    mode = given or ("score" if metric == "answer_nll" else "generate")
    check_mode(mode, "the suite's")
    if metric not in MODE_METRICS[mode]:
        reported = ", ".join(MODE_METRICS[mode])
        raise SettingsError(f"metric {metric} is not reported in {mode} mode (it reports {reported})")
    return mode


def check_question(value, suite: str) -> QuestionProtocol:
    """`value` as the protocol it names; a ValueError (one line) when it names none."""
    try:
        return QuestionProtocol(value)
    except ValueError:
        raise ValueError(f"{suite} question must be one of {CHOICES}, got {value!r}") from None


def protocol_dict(settings: dict) -> dict:
    """A question suite's settings as a dict, the protocol as its value and left out when it is the default (run
    ids hash this dict: runs made before the setting existed keep their ids)."""
    question = QuestionProtocol.of(settings)
    settings = {k: v for k, v in settings.items() if k != "question"}
    return settings if question is QuestionProtocol.IN_PROMPT else {**settings, "question": question.value}


def check_answer_tokens(value: int | None, suite: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{suite} answer_tokens must be a positive whole number or null (all), got {value!r}")


def answer_limit(max_new_tokens: int, answer_tokens: int | None) -> int:
    """How many gold tokens answer_nll scores: the generation length, or fewer when `answer_tokens` says."""
    return max_new_tokens if answer_tokens is None else min(max_new_tokens, answer_tokens)


def generates(mode: str) -> bool:
    return mode in ("generate", "both")


def scores_answer(mode: str) -> bool:
    return mode in ("score", "both")

"""The ruler suite's settings (``RulerSettings``) and their checks: task names, lengths, sample count,
and the user's SQuAD / HotpotQA files for the qa tasks."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from polykv.eval.metrics import RULER_TASKS
from polykv.question_protocol import QuestionProtocol

from .. import answers, chat

STANDARD_TASKS: tuple[str, ...] = tuple(RULER_TASKS)
#: the setting naming each QA task's data file, and what the file is
QA_FILES = {"qa_1": ("squad_path", "SQuAD"), "qa_2": ("hotpot_path", "HotpotQA")}


@dataclass(frozen=True)
class RulerSettings:
    """``tasks=None``: the 13 standard tasks, less qa_1 / qa_2 when their file is not given.

    ``length``: tokens of the evaluated model's tokenizer that prompt + generation may use (each prompt
    is made as long as that allows); a list of lengths (e.g. ``[4096, 8192]``) runs every task at each
    of them. With several lengths a task's samples at length L are named ``<task>@<L>`` (e.g.
    ``niah_single_1@4096``), so statistics can resample a task's cluster across lengths. Sample i of a
    task has the same seed at every length (niah needles and vt chains come out the same, in a longer
    haystack; fwe's vocabulary and cwe's repeats depend on the length, as in RULER). A one-element list
    is the same settings as its single length, and the list is kept sorted.
    ``squad_path`` / ``hotpot_path``: the user's SQuAD / HotpotQA json.
    ``use_chat_template``: "auto" (the default: when the tokenizer has one, as for instruct models),
    True (required) or False (RULER's "base" template): the task in one user message of the tokenizer's
    chat template, the answer prefix after the generation prompt (RULER's model templates, hf-chat).
    ``mode``: "generate" (RULER's protocol: the string-match ``score`` and FullKV ``agreement``), "score"
    (``answer_nll``, the gold answer's likelihood, no generation) or "both" (``polykv.eval.suites.answers``).
    ``answer_tokens``: answer_nll over at most this many tokens of the gold answer (None: all of them, up to
    the task's generation length); a cost cut for long answers (uuids, several values), said in the run's
    settings.
    ``question``: a `QuestionProtocol`, IN_PROMPT (the default: the question is part of the prompt the plan
    compresses) or AFTER_COMPRESSION (the question-agnostic protocol: the plan compresses the haystack, the
    question is fed after it and kept in full; `polykv.eval.suites.answers`, where it starts:
    `polykv.eval.suites.questions`). Left out of the settings' dict when it is the default, so runs from before the
    setting keep their ids.
    """

    tasks: tuple[str, ...] | None = None
    length: int | tuple[int, ...] = 4096
    samples_per_task: int = 4
    squad_path: str | None = None
    hotpot_path: str | None = None
    use_chat_template: bool | str = "auto"
    mode: str = "generate"
    answer_tokens: int | None = None
    question: QuestionProtocol = QuestionProtocol.IN_PROMPT

    def __post_init__(self):
        chat.check_choice(self.use_chat_template, "ruler")
        answers.check_mode(self.mode, "ruler")
        object.__setattr__(self, "question", answers.check_question(self.question, "ruler"))
        answers.check_answer_tokens(self.answer_tokens, "ruler")
        for name in ("squad_path", "hotpot_path"):
            value = getattr(self, name)
            if value is not None:
                path = Path(value).expanduser()
                if not path.is_file():
                    raise FileNotFoundError(f"ruler {name}: no such file {path}")
                object.__setattr__(self, name, str(path.resolve()))
        if self.tasks is None:
            tasks = tuple(t for t in STANDARD_TASKS if t not in QA_FILES or getattr(self, QA_FILES[t][0]))
        elif isinstance(self.tasks, str):
            tasks = tuple(t.strip() for t in self.tasks.split(",") if t.strip())
        else:
            tasks = tuple(self.tasks)
        unknown = [t for t in tasks if t not in RULER_TASKS]
        if unknown:
            raise ValueError(
                f"unknown ruler task(s) {', '.join(map(str, unknown))} (tasks: {', '.join(STANDARD_TASKS)})"
            )
        if not tasks or len(set(tasks)) != len(tasks):
            raise ValueError("ruler settings: tasks must be a non-empty list without repeats")
        for task in tasks:
            if task in QA_FILES and not getattr(self, QA_FILES[task][0]):
                name, kind = QA_FILES[task]
                raise ValueError(f"ruler task {task} needs {name}: the path of a {kind} json file (it is not bundled)")
        object.__setattr__(self, "tasks", tasks)
        object.__setattr__(self, "length", _normalized_length(self.length))
        if self.samples_per_task < 1 or min(self.lengths) < 2:
            raise ValueError("ruler settings: samples_per_task must be >= 1 and length >= 2")

    @property
    def lengths(self) -> tuple[int, ...]:
        """Every length the tasks run at, ascending."""
        return self.length if isinstance(self.length, tuple) else (self.length,)

    def task_name(self, task: str, length: int) -> str:
        """The name a task's samples at `length` are stored under: `task`, or `task@length` with several lengths."""
        return task if len(self.lengths) == 1 else f"{task}@{length}"

    def to_dict(self) -> dict:
        length = list(self.length) if isinstance(self.length, tuple) else self.length
        return answers.protocol_dict({**asdict(self), "tasks": list(self.tasks), "length": length})


def _normalized_length(value) -> int | tuple[int, ...]:
    """A length as an int, several as an ascending tuple (one listed length becomes that int)."""

    def whole(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if whole(value):
        return value
    if isinstance(value, (list, tuple)) and value and all(whole(v) for v in value):
        if len(set(value)) != len(value):
            raise ValueError(f"ruler settings: length lists a length twice ({list(value)})")
        return value[0] if len(value) == 1 else tuple(sorted(value))
    raise ValueError(
        f"ruler settings: length must be a whole number of tokens or a non-empty list of them (got {value!r})"
    )

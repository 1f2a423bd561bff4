"""RULER's qa tasks (qa_1: SQuAD, qa_2: HotpotQA): a question answered from its gold documents mixed
with distractors, read from the user's own json file.

Follows NVIDIA/RULER @ c3f5e3b4, ``scripts/data/synthetic/constants.py`` and
``scripts/data/synthetic/qa.py`` (read, then re-implemented; no code copied).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from polykv.files import parse_json

from .common import _Builder, _seed_int
from .settings import QA_FILES

# The template and answer prefix (scripts/data/synthetic/constants.py); the prompt is the two joined.
QA_INSTRUCTION = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other words."
)
QA_TEMPLATE = (
    QA_INSTRUCTION
    + "\n\nThe following are given documents.\n\n{context}\n\n"
    + QA_INSTRUCTION
    + "\n\nQuestion: {query}"
)
QA_PREFIX = " Answer:"
QA_DOCUMENT = "Document {i}:\n{document}"


@dataclass(frozen=True)
class _QAData:
    questions: list[dict]  # query, outputs, context (gold document indices), more_context
    documents: list[str]


def _load_qa(task: str, path: str) -> _QAData:
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"ruler task {task}: no such file {file}")
    stat = file.stat()
    return _read_qa(task, str(file.resolve()), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=4)
def _read_qa(task: str, path: str, mtime_ns: int, size: int) -> _QAData:
    try:
        data = parse_json(Path(path).read_text(encoding="utf-8"))
        data = _read_squad(data) if task == "qa_1" else _read_hotpot(data)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        kind = QA_FILES[task][1]
        raise ValueError(
            f"ruler task {task}: {path} is not a {kind} json file ({exc.__class__.__name__}: {exc})"[:300]
        ) from None
    if not data.questions:
        raise ValueError(f"ruler task {task}: {path} holds no answerable question")
    return data


def _read_squad(data: dict) -> _QAData:
    """SQuAD json: every answerable question, its paragraph, and the other paragraphs of its article."""
    documents = sorted({p["context"] for article in data["data"] for p in article["paragraphs"]})
    number = {d: i for i, d in enumerate(documents)}
    questions = []
    for article in data["data"]:
        paragraphs = [number[p["context"]] for p in article["paragraphs"]]
        for p in article["paragraphs"]:
            own = number[p["context"]]
            for qa in p["qas"]:
                answers = [a["text"] for a in qa.get("answers", [])]
                if qa.get("is_impossible", False) or not answers:
                    continue
                questions.append(
                    {
                        "query": qa["question"],
                        "outputs": answers,
                        "context": [own],
                        "more_context": [i for i in paragraphs if i != own],
                    }
                )
    return _QAData(questions, documents)


def _read_hotpot(data: list) -> _QAData:
    """HotpotQA json: every question with all of its paragraphs ("title\\ntext") as its documents."""

    def document(entry) -> str:
        title, sentences = entry
        return f"{title}\n{''.join(sentences)}"

    documents = sorted({document(entry) for item in data for entry in item["context"]})
    number = {d: i for i, d in enumerate(documents)}
    questions = [
        {
            "query": item["question"],
            "outputs": [item["answer"]],
            "context": [number[document(e)] for e in item["context"]],
            "more_context": [],
        }
        for item in data
    ]
    return _QAData(questions, documents)


class _QA(_Builder):
    def __init__(self, task: str, data: _QAData, seed: int, index: int, sample_seed: int):
        order = random.Random(_seed_int(seed, task, "questions")).sample(
            range(len(data.questions)), len(data.questions)
        )
        if index >= len(order):
            raise ValueError(
                f"ruler task {task}: sample {index} asked for, but the file holds only {len(order)} "
                "answerable questions"
            )
        question = data.questions[order[index]]
        rng = random.Random(sample_seed)
        gold = list(dict.fromkeys(question["context"]))
        more = [i for i in dict.fromkeys(question["more_context"]) if i not in gold]
        taken = set(gold) | set(more)
        rng.shuffle(more)
        others = [i for i in range(len(data.documents)) if i not in taken]
        rng.shuffle(others)
        # Documents in the order they are added (gold, same-article ones, others), each with a random
        # sort key: a longer haystack adds documents among those of a shorter one.
        self.candidates = gold + more + others
        self.keys = [rng.random() for _ in self.candidates]
        self.documents, self.query, self.answers = data.documents, question["query"], list(question["outputs"])
        self.min_size = len(gold)

    def render(self, size: int):
        total = len(self.candidates)
        chosen = sorted(range(min(size, total)), key=lambda i: self.keys[i])
        if size > total:  # more than the file holds: the documents again, as RULER repeats them
            chosen = (chosen * math.ceil(size / total))[:size]
        context = "\n\n".join(
            QA_DOCUMENT.format(i=k + 1, document=self.documents[self.candidates[i]]) for k, i in enumerate(chosen)
        )
        prompt = QA_TEMPLATE.format(context=context, query=self.query) + QA_PREFIX
        return prompt, self.answers, context, {"query": self.query}

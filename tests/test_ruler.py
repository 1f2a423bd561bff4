"""The RULER suite: task generators, fitting to a token length, QA files, scoring, and a run end to end."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest

from polykv.eval.results.store import Store
from polykv.eval.running.suite_runner import run_suite
from polykv.eval.suites import ruler
from polykv.eval.suites.ruler import DEPTHS, RulerLengthError, RulerSettings, build_samples, make_sample
from polykv.plan import Plan

NON_QA = [t for t in ruler.STANDARD_TASKS if not t.startswith("qa_")]
# The demo tokenizer (512 pieces) spends many tokens per word: the shortest length each task fits in.
BUILD_LENGTH = {t: 640 for t in NON_QA} | {"niah_multiquery": 1024, "cwe": 1600}


@pytest.fixture(scope="module")
def tokenizer(demo_model):
    return demo_model[1]


def _fits_tightly(tokenizer, sample, length, **kwargs):
    used = len(sample.prompt_ids) + sample.tokens_to_generate
    assert used <= length
    assert sample.prompt_ids == tokenizer(sample.prompt)["input_ids"] and sample.prompt_ids[0] == tokenizer.bos_token_id
    longer = make_sample(tokenizer, sample.task, length, size=sample.size + 1, **kwargs)
    assert len(longer.prompt_ids) + longer.tokens_to_generate > length  # one more unit would not fit
    return length - used


# ---- generators -------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["niah_single_1", "niah_single_2", "niah_multikey_2"])  # noise, text, needles
def test_the_needle_is_present_once_at_the_requested_depth(tokenizer, task):
    for depth in (0.0, 0.3, 0.5, 0.85, 1.0):
        sample = make_sample(tokenizer, task, 1500, seed=7, depths=[depth])
        (needle,) = sample.info["needles"]
        assert sample.context.count(needle) == 1 and sample.prompt.count(needle) == 1
        where = sample.context.index(needle) / (len(sample.context) - len(needle))
        assert abs(where - depth) < 0.08, (task, depth, where)
    # Seeded depths of the text haystack are RULER's 40 depths
    sample = make_sample(tokenizer, "niah_multikey_1", 1500, seed=3)
    assert len(sample.info["depths"]) == 4 and all(round(d * 100) in DEPTHS for d in sample.info["depths"])


def test_niah_prompt_wording_follows_ruler(tokenizer):
    single = make_sample(tokenizer, "niah_single_3", 640, seed=1)
    key = single.info["query"]
    assert single.prompt.startswith("A special magic uuid is hidden within the following text.")
    assert single.prompt.endswith(
        f"What is the special magic uuid for {key} mentioned in the provided text? "
        f"The special magic uuid for {key} mentioned in the provided text is"
    )
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", single.answers[0])
    multi = make_sample(tokenizer, "niah_multiquery", 1024, seed=1)
    assert multi.prompt.startswith("Some special magic numbers are hidden") and multi.prompt.endswith(
        "mentioned in the provided text are"
    )
    assert (
        ", and " in multi.info["query"]
        and len(multi.answers) == 4
        and all(re.fullmatch(r"\d{7}", a) for a in multi.answers)
    )


@pytest.mark.parametrize(
    "task,length",
    [
        ("niah_single_1", 400),
        ("niah_single_2", 400),
        ("niah_multikey_3", 512),
        ("vt", 700),
        ("fwe", 400),
        ("cwe", 1600),
    ],
)
def test_the_prompt_fills_the_length(tokenizer, task, length):
    sample = make_sample(tokenizer, task, length, seed=0, index=2)
    slack = _fits_tightly(tokenizer, sample, length, seed=0, index=2)
    assert slack < 110  # at most about one haystack unit (a uuid needle line is ~100 demo tokens)


def _resolve_chain(context: str, value: str) -> set[str]:
    assigned = dict(re.findall(r"VAR (\w+) = (VAR \w+|\d+)", context))
    holding = {name for name, rhs in assigned.items() if rhs == value}
    while True:
        more = {name for name, rhs in assigned.items() if rhs.startswith("VAR ") and rhs[4:] in holding} - holding
        if not more:
            return holding
        holding |= more


@pytest.mark.parametrize("task", NON_QA)
def test_every_task_builds_and_its_answers_can_be_read_off_the_context(tokenizer, task):
    length = BUILD_LENGTH[task]
    sample = make_sample(tokenizer, task, length, seed=11, index=1)
    assert sample.answers and all(a in sample.context for a in sample.answers)
    assert len(sample.prompt_ids) + sample.tokens_to_generate <= length
    assert sample.tokens_to_generate == ruler.TOKENS_TO_GENERATE[ruler.RULER_TASKS[task]]
    family = ruler.RULER_TASKS[task]
    if family == "niah":
        keys = [k.strip() for k in re.split(r", and |, ", sample.info["query"])]
        found = [v for k in keys for v in re.findall(rf"for {re.escape(k)} is: (\S+)\.", sample.context)]
        assert sorted(found) == sorted(sample.answers)
    elif family == "variable_tracking":
        value = re.search(r"assigned the value (\d+) in the text above", sample.prompt)[1]
        assert _resolve_chain(sample.context, value) == set(sample.answers) and len(sample.answers) == 5
    elif family == "common_words_extraction":
        counts = Counter(re.findall(r"\d+\. (.+?)(?= \d+\. |$)", sample.context))
        assert min(counts[a] for a in sample.answers) > max(c for w, c in counts.items() if w not in sample.answers)
        assert len(sample.answers) == 10
    else:
        counts = Counter(w for w in sample.context.split() if w != "...")
        ranked = [c for w, c in counts.most_common() if w not in sample.answers]
        assert min(counts[a] for a in sample.answers) > (ranked[0] if ranked else 0) and len(sample.answers) == 3


def test_same_seed_same_samples_other_seed_other_samples(demo_model):
    model, tokenizer = demo_model
    # vt needs ~600 demo tokens (5 noise lines for its 5 chain lines), over the demo model's 512: see below
    settings = RulerSettings(tasks=("niah_single_2", "niah_multikey_2", "fwe"), length=512, samples_per_task=2)

    def view(seed):
        return [
            (task, sid, p["prompt_ids"], p["answers"])
            for task, sid, p in build_samples(tokenizer, model, settings, seed)
        ]

    first = view(0)
    assert view(0) == first
    other = view(1)
    assert [row[:2] for row in other] == [row[:2] for row in first]
    assert all(a[2] != b[2] and a[3] != b[3] for a, b in zip(first, other))
    assert all(first[i][2] != first[i + 1][2] for i in range(0, len(first), 2))  # samples of a task differ
    vt = [make_sample(tokenizer, "vt", 640, seed=s, index=i).prompt_ids for s, i in ((0, 0), (0, 0), (1, 0), (0, 1))]
    assert vt[0] == vt[1] and vt[0] != vt[2] and vt[0] != vt[3]


# ---- QA ---------------------------------------------------------------------------------------------

SQUAD = {
    "version": "v2.0",
    "data": [
        {
            "title": "Rivers",
            "paragraphs": [
                {
                    "context": "The Nile flows north through Egypt. Its delta meets the Mediterranean Sea.",
                    "qas": [
                        {
                            "id": "1",
                            "question": "Which sea does the Nile reach?",
                            "is_impossible": False,
                            "answers": [
                                {"text": "Mediterranean Sea", "answer_start": 44},
                                {"text": "the Mediterranean Sea", "answer_start": 40},
                            ],
                        },
                        {
                            "id": "2",
                            "question": "Who painted the Nile?",
                            "is_impossible": True,
                            "answers": [],
                            "plausible_answers": [{"text": "Egypt", "answer_start": 29}],
                        },
                    ],
                },
                {
                    "context": "The Amazon carries more water than any other river on Earth.",
                    "qas": [
                        {
                            "id": "3",
                            "question": "Which river carries the most water?",
                            "is_impossible": False,
                            "answers": [{"text": "The Amazon", "answer_start": 0}],
                        }
                    ],
                },
            ],
        },
        {
            "title": "Birds",
            "paragraphs": [
                {
                    "context": "Owls hunt at night and can turn their heads very far.",
                    "qas": [
                        {
                            "id": "4",
                            "question": "When do owls hunt?",
                            "answers": [{"text": "at night", "answer_start": 10}],
                        }
                    ],
                },
                {
                    "context": "Penguins cannot fly but they swim well in cold water.",
                    "qas": [
                        {
                            "id": "5",
                            "question": "What can penguins not do?",
                            "is_impossible": False,
                            "answers": [{"text": "fly", "answer_start": 16}],
                        }
                    ],
                },
            ],
        },
    ],
}
HOTPOT = [
    {
        "_id": "a",
        "question": "Which city is home to the tower designed by Gustave Eiffel?",
        "answer": "Paris",
        "context": [
            ["Eiffel Tower", ["The Eiffel Tower stands in Paris. ", "It was finished in 1889."]],
            ["Gustave Eiffel", ["Gustave Eiffel was a French engineer."]],
        ],
    },
    {
        "_id": "b",
        "question": "What river flows through the capital of England?",
        "answer": "Thames",
        "context": [
            ["London", ["London is the capital of England."]],
            ["Thames", ["The Thames flows through London."]],
        ],
    },
    {
        "_id": "c",
        "question": "Which planet has the moon Titan?",
        "answer": "Saturn",
        "context": [["Titan", ["Titan is the largest moon of Saturn."]], ["Saturn", ["Saturn is the sixth planet."]]],
    },
]


@pytest.fixture
def qa_files(tmp_path):
    squad, hotpot = tmp_path / "squad.json", tmp_path / "hotpot.json"
    squad.write_text(json.dumps(SQUAD))
    hotpot.write_text(json.dumps(HOTPOT))
    return str(squad), str(hotpot)


def test_qa_tasks_from_squad_and_hotpotqa_files(demo_model, qa_files):
    model, tokenizer = demo_model
    squad, hotpot = qa_files
    settings = RulerSettings(
        tasks=("qa_1", "qa_2"), length=400, samples_per_task=3, squad_path=squad, hotpot_path=hotpot
    )
    samples = build_samples(tokenizer, model, settings, seed=0)
    assert [(t, s) for t, s, _ in samples] == [
        ("qa_1", "000"),
        ("qa_1", "001"),
        ("qa_1", "002"),
        ("qa_2", "000"),
        ("qa_2", "001"),
        ("qa_2", "002"),
    ]
    questions = {"qa_1": set(), "qa_2": set()}
    for task, _, payload in samples:
        prompt = tokenizer.decode(payload["prompt_ids"], skip_special_tokens=True)
        assert len(payload["prompt_ids"]) + payload["tokens_to_generate"] <= 400 and payload["tokens_to_generate"] == 32
        assert any(a in prompt for a in payload["answers"]) and prompt.endswith(" Answer:")
        assert "Document 1:\n" in prompt
        questions[task].add(re.search(r"Question: (.*) Answer:$", prompt)[1])
    assert "Who painted the Nile?" not in questions["qa_1"] and len(questions["qa_1"]) == 3  # impossible one dropped
    assert len(questions["qa_2"]) == 3
    sample = make_sample(tokenizer, "qa_2", 400, seed=0, index=0, hotpot_path=hotpot)
    gold = next(item for item in HOTPOT if item["question"] == sample.info["query"])
    assert all(f"{title}\n{''.join(sents)}" in sample.context for title, sents in gold["context"])
    _fits_tightly(tokenizer, sample, 400, seed=0, index=0, hotpot_path=hotpot)
    with pytest.raises(ValueError, match="holds only 4 answerable questions"):
        make_sample(tokenizer, "qa_1", 400, seed=0, index=4, squad_path=squad)


def test_settings_defaults_and_errors(qa_files, tmp_path):
    squad, hotpot = qa_files
    assert RulerSettings().tasks == tuple(NON_QA) and RulerSettings().length == 4096
    assert RulerSettings(squad_path=squad).tasks == (*NON_QA, "qa_1")
    assert RulerSettings(squad_path=squad, hotpot_path=hotpot).tasks == ruler.STANDARD_TASKS
    assert json.loads(json.dumps(RulerSettings(hotpot_path=hotpot).to_dict()))["tasks"][-1] == "qa_2"
    for settings in (RulerSettings(), RulerSettings(tasks=["vt", "qa_2"], length=512, hotpot_path=hotpot)):
        assert RulerSettings(**json.loads(json.dumps(settings.to_dict()))) == settings  # the run id round-trips
    with pytest.raises(ValueError, match="ruler task qa_1 needs squad_path"):
        RulerSettings(tasks=("vt", "qa_1"))
    with pytest.raises(ValueError, match="unknown ruler task"):
        RulerSettings(tasks=("niah_single_9",))
    with pytest.raises(FileNotFoundError, match="no such file"):
        RulerSettings(hotpot_path=str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "squad"}))
    with pytest.raises(ValueError, match="is not a SQuAD json file"):
        make_sample(None, "qa_1", 400, squad_path=str(bad))


def test_lengths_too_small_are_refused(demo_model):
    model, tokenizer = demo_model
    with pytest.raises(RulerLengthError, match="ruler length 512 is too small for task cwe: its shortest prompt is"):
        make_sample(tokenizer, "cwe", 512)
    with pytest.raises(RulerLengthError, match="too small for task fwe"):
        make_sample(tokenizer, "fwe", 240)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        build_samples(tokenizer, model, RulerSettings(tasks=("vt",), length=4096), seed=0)


# ---- scoring ----------------------------------------------------------------------------------------


def test_scores_use_ruler_postprocessing_and_metrics():
    cases = [
        ("niah_multivalue", ["1234567", "7654321"], " 1234567 and\n7654321.", 100.0),
        ("niah_multivalue", ["1234567", "7654321"], "1234567", 50.0),
        ("vt", ["AB", "CD", "EF", "GH"], "ab cd", 50.0),
        ("qa_1", ["Mediterranean Sea", "the sea"], "The Mediterranean sea", 100.0),
        ("qa_2", ["Paris"], "London", 0.0),
    ]
    for task, answers, prediction, expected in cases:
        payload = {"task": task, "answers": answers, "prompt_ids": [1], "tokens_to_generate": 4, "tokenizer": None}
        assert ruler._score(payload, prediction) == {"score": expected}


def test_the_suite_runs_end_to_end(demo_model, tmp_path):
    model, tokenizer = demo_model
    store = Store(tmp_path / "results.sqlite")
    settings = RulerSettings(tasks=("niah_single_1", "fwe"), length=400, samples_per_task=1)
    run_id = run_suite(store, "demo", model, tokenizer, Plan.homogeneous("full", None, 5), "ruler", settings)
    scores = store.task_scores(run_id)
    assert set(scores) == {"niah_single_1", "fwe"}
    # generating: RULER's score, and agreement with FullKV's answer (1: this plan is FullKV)
    assert all(set(v) == {"score", "agreement"} and 0.0 <= v["score"] <= 100.0 for v in scores.values())
    assert all(v["agreement"] == 1.0 for v in scores.values())
    rows = store.samples(run_id)
    assert store.run(run_id).status == "finished" and len(rows) == 2
    assert all(isinstance(row.prediction, str) and row.gold and row.prompt["sha256"] for row in rows)


# ---- variable tracking: where the chain lines go ----------------------------------------------------


def _chain_layout(context: str) -> tuple[list[int], int]:
    """Indices of the chain lines among the context's lines, and the index of the last noise line."""
    lines = context.split("\n")
    assert all(line == ruler.NOISE or line.startswith("VAR ") for line in lines)
    chain = [i for i, line in enumerate(lines) if line.startswith("VAR ")]
    return chain, max(i for i, line in enumerate(lines) if line == ruler.NOISE)


def _assert_placed_like_ruler(context: str, chain_lines: list[str]) -> None:
    at, last_noise = _chain_layout(context)
    lines = context.split("\n")
    assert [lines[i] for i in at] == chain_lines  # the chain, in its order
    assert all(b - a > 1 for a, b in zip(at, at[1:]))  # never two chain lines next to each other
    assert at[-1] < last_noise  # always a noise line after the last chain line


def test_vt_chain_lines_are_placed_as_ruler_places_them(tokenizer):
    # Real samples: 1K tokens of the demo tokenizer (about 13 noise lines for 5 chain lines) and others.
    for length in (640, 800, 1024):  # a 5-line chain needs 5 noise lines: ~600 demo tokens
        for seed in range(12):
            sample = make_sample(tokenizer, "vt", length, seed=seed)
            _assert_placed_like_ruler(sample.context, sample.info["chain"])
            value = re.search(r"assigned the value (\d+) in the text above", sample.prompt)[1]
            assert sample.answers == [re.match(r"VAR (\w+) =", line)[1] for line in sample.info["chain"]]
            assert _resolve_chain(sample.context, value) == set(sample.answers)
    # The generator itself, down to the fewest noise lines a 5-line chain can sit among.
    for seed in range(200):
        chains = ruler._Chains(random.Random(seed), 1, 4, letters=5)
        for noise in (5, 6, 7, 9, 13, 40):
            context, _ = chains.text(noise)
            assert context.split("\n").count(ruler.NOISE) == noise
            _assert_placed_like_ruler(context, chains.lines[0])
    with pytest.raises(ValueError, match="at least 5 noise lines"):
        chains.text(4)


def test_vt_chain_placement_is_uniform_over_the_noise_lines():
    # 5 chain lines among 6 noise lines: each goes right before a distinct noise line, so exactly one
    # noise line has no chain line in front of it, and RULER's uniform draw makes each of the 6 equally
    # likely (200 of 1200 expected each; the bounds are about 6 standard deviations wide).
    free = Counter()
    for seed in range(1200):
        context, _ = ruler._Chains(random.Random(seed), 1, 4, letters=5).text(6)
        lines = context.split("\n")
        noise = [i for i, line in enumerate(lines) if line == ruler.NOISE]
        (alone,) = [k for k, i in enumerate(noise) if i == 0 or lines[i - 1] == ruler.NOISE]
        free[alone] += 1
    assert set(free) == set(range(6)) and all(120 <= c <= 280 for c in free.values()), free


# ---- several lengths --------------------------------------------------------------------------------


def test_several_lengths_name_tasks_by_length_and_fit_each_length(demo_model):
    model, tokenizer = demo_model
    settings = RulerSettings(tasks=("niah_single_1", "fwe"), length=[512, 400], samples_per_task=2)
    assert settings.length == (400, 512) and settings.lengths == (400, 512)  # kept sorted
    samples = build_samples(tokenizer, model, settings, seed=0)
    assert [(t, s) for t, s, _ in samples] == [
        (f"{task}@{length}", f"{i:03d}") for task in ("niah_single_1", "fwe") for length in (400, 512) for i in range(2)
    ]
    for name, _, payload in samples:
        task, length = name.split("@")
        assert payload["task"] == task and payload["length"] == int(length)
        used = len(payload["prompt_ids"]) + payload["tokens_to_generate"]
        assert int(length) - 110 < used <= int(length)  # filled to that length, not another
    # Sample i uses one seed at every length: the same needle (or chain), a longer haystack.
    by_name = {(t, s): p for t, s, p in samples}
    short, long = by_name[("niah_single_1@400", "000")], by_name[("niah_single_1@512", "000")]
    assert short["answers"] == long["answers"] and len(short["prompt_ids"]) < len(long["prompt_ids"])
    short, long = (make_sample(tokenizer, "vt", length, seed=0, index=1) for length in (640, 800))
    assert short.info["chain"] == long.info["chain"] and short.size < long.size
    # One length: the task names and the settings dict are those of a plain length.
    single = RulerSettings(tasks=("fwe",), length=[400], samples_per_task=1)
    assert single == RulerSettings(tasks=("fwe",), length=400, samples_per_task=1)
    assert single.to_dict() == {
        "tasks": ["fwe"],
        "length": 400,
        "samples_per_task": 1,
        "mode": "generate",
        "squad_path": None,
        "hotpot_path": None,
        "use_chat_template": "auto",
        "answer_tokens": None,
    }
    assert [t for t, _, _ in build_samples(tokenizer, model, single, seed=0)] == ["fwe"]
    assert json.loads(json.dumps(settings.to_dict()))["length"] == [400, 512]
    assert RulerSettings(**json.loads(json.dumps(settings.to_dict()))) == settings  # the run id round-trips
    with pytest.raises(ValueError, match="exceeds the model's context"):
        build_samples(tokenizer, model, RulerSettings(tasks=("fwe",), length=[400, 4096]), seed=0)


def test_length_lists_are_checked():
    for bad in ([], [512, 512], ["512"], 512.0, True, [1, 512]):
        with pytest.raises(ValueError, match="ruler settings: "):
            RulerSettings(length=bad)


def test_several_lengths_run_end_to_end(demo_model, tmp_path):
    model, tokenizer = demo_model
    store = Store(tmp_path / "results.sqlite")
    settings = RulerSettings(tasks=("niah_single_1",), length=[400, 512], samples_per_task=1)
    run_id = run_suite(store, "demo", model, tokenizer, Plan.homogeneous("full", None, 5), "ruler", settings)
    assert set(store.task_scores(run_id)) == {"niah_single_1@400", "niah_single_1@512"}
    assert json.loads(store.run(run_id).settings)["length"] == [400, 512]

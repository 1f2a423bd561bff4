"""The LongBench suite: official-format jsonl loading, prompts, truncation, chat format, scoring wiring, runs."""

from __future__ import annotations

import copy
import json
import sys
import types
import warnings

import pytest

from polykv.errors import FileError
from polykv.eval.metrics import LONGBENCH_METRICS
from polykv.eval.results.store import Store
from polykv.eval.running import suite_runner as runner
from polykv.eval.running.suite_runner import run_suite
from polykv.eval.suites import answers, longbench_data
from polykv.eval.suites import longbench as lb
from polykv.plan import Plan

TREC_CLASSES = ["Description", "Entity", "Human", "Location", "Manner", "Reason"]
STORY = "Once upon a time there was a little girl named Lily. She liked to play in the park with her dog. "


def record(task: str, i: int, context: str, question: str, answers: list[str], classes=None) -> dict:
    return {
        "input": question,
        "context": context,
        "answers": answers,
        "length": len(context.split()),
        "dataset": task,
        "language": "en",
        "all_classes": classes,
        "_id": f"{task}-{i:04d}",
    }


def samples_for(task: str, n: int = 2, words: int = 60) -> list[dict]:
    body = (STORY * (words // len(STORY.split()) + 1)).split()[:words]
    out = []
    for i in range(n):
        context = f"Passage {i}: " + " ".join(body)
        if task == "hotpotqa":
            out.append(record(task, i, context, "What was the girl called?", ["Lily"]))
        elif task == "trec":
            shots = "Question: How do you bake bread ?\nType: Manner\nQuestion: Who was the king ?\nType: Human\n"
            out.append(record(task, i, shots, "Question: Why is the sky blue ?\nType:", ["Reason"], TREC_CLASSES))
        elif task == "passage_count":
            out.append(record(task, i, context, "", [str(i + 3)]))
        elif task == "lcc":
            out.append(record(task, i, "def add(a, b):\n    total = a + b\n" * 8, "", ["    return total"]))
        elif task == "samsum":
            out.append(
                record(
                    task,
                    i,
                    "Dialogue: Ann: hi\nBob: hello\nSummary: They greet.\n",
                    "Dialogue: A: x\nSummary:",
                    ["A says x."],
                )
            )
        else:
            raise AssertionError(task)
    return out


def write_task(directory, task: str, lines: list) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    text = "\n".join(line if isinstance(line, str) else json.dumps(line, ensure_ascii=False) for line in lines)
    (directory / f"{task}.jsonl").write_text(text + "\n", encoding="utf-8")


@pytest.fixture
def data_dir(tmp_path):
    directory = tmp_path / "longbench"
    for task in ("hotpotqa", "trec", "passage_count", "lcc", "samsum"):
        write_task(directory, task, samples_for(task))
    return directory


# ---- tables ----------------------------------------------------------------------------------------


def test_the_21_tasks_their_generation_lengths_and_chat_exceptions():
    assert len(lb.TASKS) == 21 and set(lb.TASKS) == set(LONGBENCH_METRICS) == set(lb.TASK_MAX_NEW_TOKENS)
    assert lb.LongBenchSettings().tasks == lb.TASKS
    # LongBench/config/dataset2maxlen.json
    expected = {
        "hotpotqa": 32,
        "trec": 64,
        "passage_count": 32,
        "lcc": 64,
        "gov_report": 512,
        "narrativeqa": 128,
        "multifieldqa_en": 64,
        "samsum": 128,
        "vcsum": 512,
        "repobench-p": 64,
        "passage_retrieval_zh": 32,
    }
    assert {task: lb.TASK_MAX_NEW_TOKENS[task] for task in expected} == expected
    assert sum(lb.TASK_MAX_NEW_TOKENS.values()) == 3168  # 4 x 512 + 4 x 128 + 6 x 64 + 7 x 32
    assert lb.NO_CHAT_TASKS == {"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"}
    assert all(set(_fields(t)) <= {"context", "input"} and "context" in _fields(t) for t in lb.TASK_PROMPTS.values())


def _fields(template: str) -> list[str]:
    import string

    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


def test_prompts_use_the_official_templates():
    rec = samples_for("hotpotqa")[0]
    prompt = lb.format_prompt("hotpotqa", rec)
    assert prompt.startswith(
        "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n\nThe following are given passages.\nPassage 0: Once upon"
    )
    assert prompt.endswith("\n\nQuestion: What was the girl called?\nAnswer:")
    assert lb.format_prompt("lcc", {"context": "x = 1\n", "input": ""}) == (
        "Please complete the code given below. \nx = 1\nNext line of code:\n"
    )
    assert "asconcisely as you can" in lb.TASK_PROMPTS["narrativeqa"]  # the official typo is kept
    assert lb.TASK_PROMPTS["passage_count"].endswith("The final answer is: ")


# ---- loading ---------------------------------------------------------------------------------------


def test_loader_reads_the_official_jsonl(data_dir):
    samples = lb.load_task("hotpotqa", data_dir)
    assert [sid for sid, _ in samples] == ["00001", "00002"]
    assert samples[1][1]["answers"] == ["Lily"] and samples[1][1]["_id"] == "hotpotqa-0001"
    trec = lb.load_task("trec", str(data_dir))
    assert trec[0][1]["all_classes"] == TREC_CLASSES


def test_malformed_and_incomplete_lines_are_skipped_with_a_warning_naming_file_and_line(tmp_path):
    good = samples_for("hotpotqa", 3)
    no_answers = {k: v for k, v in good[1].items() if k != "answers"}
    write_task(
        tmp_path,
        "hotpotqa",
        [good[0], '{"input": "broken', no_answers, "", "[1, 2]", {**good[2], "answers": "Lily"}, good[2]],
    )
    path = tmp_path / "hotpotqa.jsonl"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = lb.load_task("hotpotqa", tmp_path)
    assert [sid for sid, _ in samples] == ["00001", "00007"]
    (message,) = [str(w.message) for w in caught]  # one warning for the file, one line
    assert message.startswith(f"LongBench: skipped 4 line(s) of {path}: line 2: malformed JSON")
    assert "\n" not in message  # the blank line 4 is not a sample and is not reported
    assert "; line 3: missing field(s) answers; line 5: not a JSON object" in message
    assert message.endswith("; line 6: field answers is not a non-empty list of strings")

    trec = samples_for("trec", 2)
    write_task(tmp_path, "trec", [{**trec[0], "all_classes": None}, trec[1]])
    with pytest.warns(UserWarning, match=r"trec\.jsonl: line 1: missing field\(s\) all_classes"):
        assert [sid for sid, _ in lb.load_task("trec", tmp_path)] == ["00002"]

    write_task(tmp_path, "lcc", ["not json"])
    with pytest.warns(UserWarning, match="line 1"), pytest.raises(ValueError, match="holds no usable sample"):
        lb.load_task("lcc", tmp_path)


def test_a_file_without_newlines_is_refused_at_the_line_cap_not_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(longbench_data, "MAX_LINE_BYTES", 1000)  # read_task_file reads it there
    (tmp_path / "hotpotqa.jsonl").write_bytes(b"x" * 5000)  # one "line" of 5,000 bytes and no newline
    with pytest.raises(FileError, match=r"hotpotqa\.jsonl, line 1: longer than"):
        lb.load_task("hotpotqa", tmp_path)
    many = [samples_for("hotpotqa", 1)[0]] + ["not json"] * 8
    write_task(tmp_path, "hotpotqa", many)
    with pytest.warns(UserWarning, match=r"skipped 8 line\(s\) .*line 6: malformed JSON .*; and 3 more$"):
        lb.load_task("hotpotqa", tmp_path)


def test_missing_directory_missing_task_file_and_unknown_task_are_one_line_errors(tmp_path, data_dir, demo_model):
    model, tokenizer = demo_model
    with pytest.raises(FileNotFoundError, match=f"LongBench data directory {tmp_path / 'nope'} not found") as exc:
        lb.load_task("hotpotqa", tmp_path / "nope")
    assert "\n" not in str(exc.value)
    with pytest.raises(FileNotFoundError, match=r"LongBench task file .*musique\.jsonl not found") as exc:
        lb.build_samples(tokenizer, model, lb.LongBenchSettings(tasks=("musique",), data_dir=str(data_dir)), 0)
    assert "\n" not in str(exc.value) and str(data_dir / "musique.jsonl") in str(exc.value)
    with pytest.raises(
        ValueError, match=r"unknown LongBench task\(s\) hotpot \(tasks: narrativeqa, qasper, .*repobench-p\)"
    ):
        lb.LongBenchSettings(tasks=("hotpot",))
    with pytest.raises(ValueError, match="unknown LongBench task 'hotpot'"):
        lb.load_task("hotpot", data_dir)
    with pytest.raises(ValueError, match="max_length must be an integer >= 2"):
        lb.LongBenchSettings(max_length=1)
    with pytest.raises(ValueError, match="samples_per_task must be >= 1"):
        lb.LongBenchSettings(samples_per_task=0)
    with pytest.raises(ValueError, match="use_chat_template must be"):
        lb.LongBenchSettings(use_chat_template="yes")


def test_a_data_dir_without_the_chosen_tasks_files_is_refused_when_the_settings_are_parsed(tmp_path, data_dir):
    from polykv.errors import SettingsError
    from polykv.eval.running.settings import suite_settings

    nowhere = tmp_path / "nope"
    with pytest.raises(SettingsError) as exc:
        suite_settings("longbench", {"data_dir": str(nowhere)})
    assert (
        str(exc.value)
        == f"longbench settings: data_dir {nowhere} does not exist (expected a directory of <task>.jsonl files)"
    )
    (tmp_path / "file").write_text("")
    with pytest.raises(SettingsError, match=f"data_dir {tmp_path / 'file'} is not a directory"):
        suite_settings("longbench", json.dumps({"data_dir": str(tmp_path / "file")}))
    with pytest.raises(SettingsError) as exc:
        suite_settings("longbench", {"data_dir": str(data_dir), "tasks": ["hotpotqa", "musique", "qasper"]})
    assert str(exc.value) == (
        f"longbench settings: data_dir {data_dir} lacks musique.jsonl, qasper.jsonl (one <task>.jsonl per chosen task)"
    )
    with pytest.raises(SettingsError) as exc:  # all 21 tasks by default: the list is cut short, one line
        suite_settings("longbench", {"data_dir": str(tmp_path)})
    assert "\n" not in str(exc.value) and str(exc.value).endswith("and 15 more (one <task>.jsonl per chosen task)")
    chosen = suite_settings("longbench", {"data_dir": str(data_dir), "tasks": ["hotpotqa", "trec"]})
    assert chosen.tasks == ("hotpotqa", "trec") and chosen.data_dir == str(data_dir)
    assert suite_settings("longbench", {}).data_dir is None  # the hub: checked only when it is loaded


def test_without_data_dir_the_hub_is_tried_through_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(ValueError, match="'datasets' package is not installed.*give --data-dir") as exc:
        lb.load_task("hotpotqa")
    assert "\n" not in str(exc.value)

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'THUDM/LongBench' on the Hub\n(LocalEntryNotFoundError)")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(
        ValueError, match=r"could not load THUDM/LongBench \(hotpotqa\).*ConnectionError.*give --data-dir"
    ) as exc:
        lb.load_task("hotpotqa")
    assert "\n" not in str(exc.value)

    calls = []

    def online(name, config, split):
        calls.append((name, config, split))
        return samples_for("hotpotqa", 2)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=online))
    assert [sid for sid, _ in lb.load_task("hotpotqa")] == ["00001", "00002"]
    assert calls == [("THUDM/LongBench", "hotpotqa", "test")]


# ---- prompt building -------------------------------------------------------------------------------


def test_middle_truncation_keeps_head_and_tail_tokens_within_max_length(demo_model):
    _, tokenizer = demo_model
    rec = record("hotpotqa", 0, STORY * 10 + "MIDDLEMARKER " + STORY * 10, "What was the girl called?", ["Lily"])
    prompt = lb.format_prompt("hotpotqa", rec)
    ids = tokenizer(prompt).input_ids
    assert len(ids) > 600
    for max_length in (120, 121, 300):
        text = lb.truncate_middle(tokenizer, prompt, max_length)
        half = max_length // 2
        original = tokenizer.decode(ids[:half], skip_special_tokens=True) + tokenizer.decode(
            ids[-half:], skip_special_tokens=True
        )
        if max_length < 300:  # pred.py: the first and last max_length // 2 tokens, decoded and joined
            assert text == original
        else:  # "dog." + "there" (the tail's leading space is lost) re-encodes longer: cut again, a token less a side
            assert len(tokenizer(original).input_ids) > max_length
            assert text == tokenizer.decode(ids[: half - 1], skip_special_tokens=True) + tokenizer.decode(
                ids[-(half - 1) :], skip_special_tokens=True
            )
        assert text.startswith("Answer the question based on the given passages.")
        assert text.endswith("Question: What was the girl called?\nAnswer:")
        assert "MIDDLEMARKER" not in text
        assert max_length - 8 <= len(tokenizer(text).input_ids) <= max_length
        assert len(lb.prompt_ids(tokenizer, "hotpotqa", rec, max_length)) <= max_length
    short = lb.format_prompt("hotpotqa", samples_for("hotpotqa")[0])
    assert lb.truncate_middle(tokenizer, short, 10_000) == short  # a prompt that fits is untouched
    assert lb.prompt_ids(tokenizer, "hotpotqa", samples_for("hotpotqa")[0], 10_000) == tokenizer(short).input_ids


def test_truncation_redoes_the_cut_when_the_joined_text_re_encodes_longer():
    class CharTokenizer:  # the junction "ab" re-encodes as 3 tokens: the rare case the original lets through
        def __call__(self, text, add_special_tokens=True):
            return types.SimpleNamespace(input_ids=[ord(c) for c in text.replace("ab", "a#b")])

        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids).replace("#", "")

    tokenizer = CharTokenizer()
    assert lb.truncate_middle(tokenizer, "xxxxxa" + "-" * 20 + "byyyyy", 12) == "xxxxxyyyyy"
    assert lb.truncate_middle(tokenizer, "xxxxxx" + "-" * 20 + "yyyyyy", 12) == "xxxxxxyyyyyy"


def test_chat_template_is_used_when_present_except_for_the_six_tasks(demo_model, data_dir):
    model, tokenizer = demo_model
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = "{% for m in messages %}[INST]{{ m['content'] }}[/INST]{% endfor %}"

    def first_ids(tok, task, use):
        settings = lb.LongBenchSettings(tasks=(task,), data_dir=str(data_dir), use_chat_template=use)
        return lb.build_samples(tok, model, settings, 0)[0][2]["ids"]

    hotpot = first_ids(chat, "hotpotqa", "auto")
    text = chat.decode(hotpot)
    assert text.startswith("[INST]Answer the question based on") and text.endswith("Answer:[/INST]")
    assert tokenizer.bos_token_id not in hotpot  # the template's text is tokenized without adding special tokens
    assert first_ids(chat, "hotpotqa", True) == hotpot
    plain = first_ids(tokenizer, "hotpotqa", "auto")
    assert first_ids(chat, "hotpotqa", False) == plain and "[INST]" not in tokenizer.decode(plain)
    for task in ("trec", "lcc"):  # never templated
        assert first_ids(chat, task, "auto") == first_ids(tokenizer, task, "auto")
    with pytest.raises(ValueError, match="use_chat_template=True but the tokenizer has no chat template"):
        first_ids(tokenizer, "hotpotqa", True)


# ---- samples and scoring ---------------------------------------------------------------------------


def test_build_samples_payloads_default_max_length_and_subsets(demo_model, tmp_path):
    model, tokenizer = demo_model
    long = tmp_path / "long"
    write_task(long, "hotpotqa", [record("hotpotqa", i, STORY * 40, "Who?", ["Lily"]) for i in range(6)])
    write_task(long, "lcc", samples_for("lcc", 1))
    write_task(long, "samsum", samples_for("samsum", 1))
    settings = lb.LongBenchSettings(tasks=("hotpotqa", "lcc", "samsum"), data_dir=str(long))
    samples = lb.build_samples(tokenizer, model, settings, 0)
    assert [(t, s) for t, s, _ in samples][-2:] == [("lcc", "00001"), ("samsum", "00001")]
    for task, _, payload in samples:
        assert payload["task"] == task and payload["max_new_tokens"] == lb.TASK_MAX_NEW_TOKENS[task]
        assert len(payload["ids"]) <= 512 - lb.TASK_MAX_NEW_TOKENS[task]  # default: context - generation length
    hotpot = samples[0][2]
    assert 512 - 32 - 8 <= len(hotpot["ids"]) and hotpot["answers"] == ["Lily"] and hotpot["all_classes"] is None
    assert hotpot["eos_token_id"] is None
    assert samples[-1][2]["eos_token_id"] == [
        tokenizer.eos_token_id,
        tokenizer.encode("\n", add_special_tokens=False)[-1],
    ]

    subset = lb.LongBenchSettings(tasks=("hotpotqa",), data_dir=str(long), samples_per_task=3)
    ids = [s for _, s, _ in lb.build_samples(tokenizer, model, subset, 7)]
    assert (
        len(ids) == 3 and ids == sorted(ids) and ids == [s for _, s, _ in lb.build_samples(tokenizer, model, subset, 7)]
    )
    assert {tuple(s for _, s, _ in lb.build_samples(tokenizer, model, subset, seed)) for seed in range(8)} != {
        tuple(ids)
    }

    write_task(long, "gov_report", [record("gov_report", 0, STORY, "", ["A summary."])])
    with pytest.raises(ValueError, match=r"context \(512\) is too short for gov_report \(generation length 512\)"):
        lb.build_samples(tokenizer, model, lb.LongBenchSettings(tasks=("gov_report",), data_dir=str(long)), 0)
    with pytest.warns(UserWarning, match="exceeds the model's context"):
        lb.build_samples(
            tokenizer, model, lb.LongBenchSettings(tasks=("gov_report",), data_dir=str(long), max_length=64), 0
        )


def test_score_sample_applies_the_official_scoring(demo_model, data_dir):
    model, tokenizer = demo_model
    settings = lb.LongBenchSettings(tasks=("hotpotqa", "trec", "passage_count"), data_dir=str(data_dir))
    samples = {(t, s): p for t, s, p in lb.build_samples(tokenizer, model, settings, 0)}
    cases = [  # (task, sample, prediction, score)
        ("hotpotqa", "00001", "Lily.", 100.0),
        ("hotpotqa", "00001", "the girl Lily", 100 * 2 * (1 / 2) * 1 / (1 / 2 + 1)),
        ("trec", "00001", "\nReason\nType: Human", 100.0),  # cut at the first line (after leading newlines)
        ("trec", "00001", "Human", 0.0),
        ("passage_count", "00002", "4", 100.0),
        ("passage_count", "00002", "3 or 4", 50.0),
    ]
    for task, sample, prediction, expected in cases:
        assert lb._score(samples[(task, sample)], prediction) == {"score": pytest.approx(expected)}


def test_end_to_end_run_on_the_demo_model_stores_a_score_per_task(demo_model, data_dir, tmp_path):
    model, tokenizer = demo_model
    assert runner.SUITES["longbench"] is lb
    store = Store(tmp_path / "results.sqlite")
    settings = lb.LongBenchSettings(
        tasks=("hotpotqa", "trec", "passage_count", "lcc"), data_dir=str(data_dir), max_length=300
    )
    plan = Plan.homogeneous("full", None, 5)
    run_id = run_suite(store, "demo", model, tokenizer, plan, "longbench", settings)
    assert store.run(run_id).status == "finished" and len(store.samples(run_id)) == 8
    scores = store.task_scores(run_id)
    assert set(scores) == {"hotpotqa", "trec", "passage_count", "lcc"}
    for values in scores.values():
        assert set(values) == {"score", "agreement"} and 0.0 <= values["score"] <= 100.0
        assert values["agreement"] == 1.0  # FullKV agrees with itself
    # the routed full plan predicts exactly what the unmodified model does
    payload = lb.build_samples(tokenizer, model, settings, 0)[0][2]
    question = lb.answer_sample(payload)
    routed = answers.answer_alone(model, plan, question, "generate", lb._pad(tokenizer)).tokens
    answers.clear_reference_cache()
    assert routed == answers.fullkv_answer(model, question, lb._pad(tokenizer))

"""The calibration corpus: deterministic, exact lengths, round-robin sources, clear errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from polykv.profile.corpus import (
    CORPORA_ENV,
    CORPUS_FILES,
    DEFAULT_SOURCES,
    CorpusSpec,
    build_corpus,
    corpora_dir,
    model_source,
    source_files,
)

TEXT_SOURCES = ("kjv", "jargon", "stdlib")


@pytest.fixture(scope="module")
def tokenizer(demo_model):
    return demo_model[1]


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "story.txt"
    lines = [f"Line {i}: the quick brown fox jumps over the lazy dog number {i}." for i in range(400)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert message and "\n" not in message
    return message


def test_the_default_corpora_are_there():
    # Every text source among the default sources (all but the model's own samples) reads files that
    # are there and hold text; the file-backed ones read their file in the corpora folder.
    text_sources = [source for source in DEFAULT_SOURCES if model_source(source) is None]
    assert set(CORPUS_FILES) <= set(text_sources)
    for source in text_sources:
        files = source_files(source)
        assert all(path.is_file() for path in files) and sum(path.stat().st_size for path in files) > 0, source
    folder = corpora_dir()
    for source, name in CORPUS_FILES.items():
        assert source_files(source) == [folder / name]
        assert (folder / name).read_text(encoding="utf-8").strip(), name  # UTF-8 text, not empty


def test_same_spec_gives_identical_ids_and_another_seed_does_not(tokenizer):
    spec = CorpusSpec(sources=TEXT_SOURCES, num_sequences=6, max_tokens=64, seed=3)
    first, second = build_corpus(tokenizer, spec), build_corpus(tokenizer, spec)
    assert first.sequences == second.sequences
    assert first.records == second.records
    assert first.fingerprint() == second.fingerprint()
    other = build_corpus(tokenizer, CorpusSpec(sources=TEXT_SOURCES, num_sequences=6, max_tokens=64, seed=4))
    assert other.sequences != first.sequences
    assert all(a != b for a, b in zip(first.sequences, other.sequences))


def test_lengths_are_exact_and_start_with_bos(tokenizer):
    corpus = build_corpus(tokenizer, CorpusSpec(sources=TEXT_SOURCES, num_sequences=3, max_tokens=100))
    assert corpus.sequence_length == 100
    assert [len(s) for s in corpus.sequences] == [100, 100, 100]
    assert all(s[0] == tokenizer.bos_token_id for s in corpus.sequences)
    assert all(tokenizer.bos_token_id not in s[1:] for s in corpus.sequences)
    assert all(0 <= t < tokenizer.vocab_size for s in corpus.sequences for t in s)


def test_context_length_clips_max_tokens(demo_model):
    model, tokenizer = demo_model
    spec = CorpusSpec(sources=("kjv",), num_sequences=2, max_tokens=2048)
    assert {len(s) for s in build_corpus(tokenizer, spec, context_length=40).sequences} == {40}
    # with a model and no context_length, the model's positions (512 for the demo) clip it
    corpus = build_corpus(tokenizer, spec, model=model)
    assert corpus.sequence_length == model.config.max_position_embeddings == 512
    assert {len(s) for s in corpus.sequences} == {512}
    # a context longer than max_tokens changes nothing
    assert (
        build_corpus(
            tokenizer, CorpusSpec(sources=("kjv",), num_sequences=1, max_tokens=30), context_length=512
        ).sequence_length
        == 30
    )


def test_sources_are_assigned_round_robin_and_recorded(tokenizer, text_file):
    sources = ("jargon", f"file:{text_file}", "kjv")
    corpus = build_corpus(tokenizer, CorpusSpec(sources=sources, num_sequences=7, max_tokens=48))
    assert [r["source"] for r in corpus.records] == [sources[k % 3] for k in range(7)]
    assert [r["index"] for r in corpus.records] == list(range(7))
    for record in corpus.records:
        assert Path(record["file"]).is_file()
        assert record["offset"] >= 0 and record["length"] > 0 and record["tokens"] == 48
    assert corpus.records[1]["file"] == str(text_file.resolve())
    data = corpus.to_dict()
    json.dumps(data)
    assert data["spec"] == {
        "sources": list(sources),
        "num_sequences": 7,
        "max_tokens": 48,
        "seed": 0,
        "split": "calibration",
    }
    assert data["sequence_length"] == 48 and len(data["records"]) == 7 and "sequences" not in data
    assert corpus.to_dict(include_ids=True)["sequences"] == corpus.sequences


def test_records_point_at_the_text_the_tokens_come_from(tokenizer, text_file):
    corpus = build_corpus(tokenizer, CorpusSpec(sources=(f"file:{text_file}",), num_sequences=3, max_tokens=40, seed=1))
    text = text_file.read_text(encoding="utf-8")
    for ids, record in zip(corpus.sequences, corpus.records):
        start, stop = record["offset"], record["offset"] + record["length"]
        assert start == 0 or text[start - 1] == "\n"  # offsets start a line
        assert tokenizer(text[start:stop], add_special_tokens=False)["input_ids"] == ids[1:]


def test_stdlib_source_reads_python_files(tokenizer):
    corpus = build_corpus(tokenizer, CorpusSpec(sources=("stdlib",), num_sequences=2, max_tokens=64, seed=5))
    for record in corpus.records:
        assert record["file"].endswith(".py") and "site-packages" not in record["file"]


def test_model_source_samples_from_the_demo_model(demo_model):
    model, tokenizer = demo_model
    spec = CorpusSpec(sources=("model", "kjv"), num_sequences=3, max_tokens=32, seed=2)
    corpus = build_corpus(tokenizer, spec, model=model)
    assert [r["source"] for r in corpus.records] == ["model", "kjv", "model"]
    assert {len(s) for s in corpus.sequences} == {32}
    sampled = [corpus.sequences[0], corpus.sequences[2]]
    assert all(s[0] == tokenizer.bos_token_id for s in sampled)
    assert sampled[0] != sampled[1]
    assert corpus.records[0]["file"] is None and corpus.records[0]["temperature"] == 1.0
    again = build_corpus(tokenizer, spec, model=model)
    assert again.sequences == corpus.sequences
    assert (
        build_corpus(
            tokenizer, CorpusSpec(sources=("model",), num_sequences=1, max_tokens=32, seed=9), model=model
        ).sequences[0]
        != sampled[0]
    )


def test_model_source_without_a_model_fails_clearly(tokenizer):
    with pytest.raises(ValueError) as excinfo:
        build_corpus(tokenizer, CorpusSpec(sources=("kjv", "model"), num_sequences=2, max_tokens=32))
    message = one_line(excinfo)
    assert "'model'" in message and "model=" in message
    # a spec that lists "model" but never reaches it needs no model
    assert len(build_corpus(tokenizer, CorpusSpec(sources=("kjv", "model"), num_sequences=1, max_tokens=32))) == 1


def test_unknown_source_fails_clearly():
    with pytest.raises(ValueError) as excinfo:
        CorpusSpec(sources=("kjv", "wikipedia"))
    message = one_line(excinfo)
    assert "'wikipedia'" in message and "file:PATH" in message
    with pytest.raises(ValueError, match="names no file"):
        CorpusSpec(sources=("file:",))


def test_bad_spec_values_fail_clearly():
    for kwargs in ({"num_sequences": 0}, {"max_tokens": 1}, {"sources": ()}):
        with pytest.raises(ValueError) as excinfo:
            CorpusSpec(**kwargs)
        one_line(excinfo)
    assert CorpusSpec(sources=["kjv"]).sources == ("kjv",)  # lists become tuples (the spec stays hashable)


def test_missing_file_fails_clearly(tokenizer, tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(ValueError) as excinfo:  # refused when the spec is made, before any model loads
        CorpusSpec(sources=(f"file:{missing}",), num_sequences=1, max_tokens=16)
    message = one_line(excinfo)
    assert f"file:{missing}" in message and "no such file" in message


def test_a_fifo_as_a_file_source_is_refused(tmp_path):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="is not a regular file"):
        CorpusSpec(sources=(f"file:{fifo}",), num_sequences=1, max_tokens=16)


def test_corpora_env_pointing_nowhere_fails_clearly(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv(CORPORA_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError) as excinfo:
        build_corpus(tokenizer, CorpusSpec(sources=("kjv",), num_sequences=1, max_tokens=16))
    message = one_line(excinfo)
    assert CORPORA_ENV in message and "nowhere" in message
    # sources that need no corpus folder still work
    assert len(build_corpus(tokenizer, CorpusSpec(sources=("stdlib",), num_sequences=1, max_tokens=16))) == 1


def test_corpora_folder_without_the_file_fails_clearly(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv(CORPORA_ENV, str(tmp_path))
    (tmp_path / "kjv.txt").write_text("In the beginning.\n" * 200, encoding="utf-8")
    assert len(build_corpus(tokenizer, CorpusSpec(sources=("kjv",), num_sequences=1, max_tokens=16))) == 1
    with pytest.raises(FileNotFoundError) as excinfo:
        build_corpus(tokenizer, CorpusSpec(sources=("kjv", "jargon"), num_sequences=2, max_tokens=16))
    message = one_line(excinfo)
    assert "'jargon'" in message and "jargon.txt" in message and CORPORA_ENV in message


def test_source_too_short_fails_clearly(tokenizer, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Once upon a time.\n", encoding="utf-8")
    with pytest.raises(ValueError) as excinfo:
        build_corpus(tokenizer, CorpusSpec(sources=(f"file:{short}",), num_sequences=1, max_tokens=64))
    message = one_line(excinfo)
    assert "too short" in message and f"file:{short}" in message
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError) as excinfo:
        build_corpus(tokenizer, CorpusSpec(sources=(f"file:{empty}",), num_sequences=1, max_tokens=64))
    assert "empty" in one_line(excinfo)


def test_calibration_and_evaluation_texts_never_overlap(tokenizer, tmp_path):
    path = tmp_path / "long.txt"
    path.write_text(
        "".join(f"Line {i}: the dog ran to the park and back again.\n" for i in range(3000)), encoding="utf-8"
    )
    size = len(path.read_text())
    calibration = build_corpus(tokenizer, CorpusSpec(sources=(f"file:{path}",), num_sequences=6, max_tokens=40))
    evaluation = build_corpus(
        tokenizer, CorpusSpec(sources=(f"file:{path}",), num_sequences=6, max_tokens=40, split="evaluation")
    )
    last_calibration_char = max(r["offset"] + r["length"] for r in calibration.records)
    first_evaluation_char = min(r["offset"] for r in evaluation.records)
    assert last_calibration_char <= 0.8 * size <= first_evaluation_char
    with pytest.raises(ValueError, match="split must be one of"):
        CorpusSpec(split="test")


def test_a_source_too_short_for_its_split_is_refused(tokenizer, tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("Once upon a time there was a dog.\n" * 3, encoding="utf-8")
    with pytest.raises(ValueError, match="too short"):
        build_corpus(tokenizer, CorpusSpec(sources=(f"file:{path}",), num_sequences=2, max_tokens=20))


def test_hub_sources_fail_clearly_when_the_hub_is_out_of_reach(tmp_path, monkeypatch):
    """This machine has no hub: naming one of the paper's datasets gives a one-line error, not a hang."""
    from polykv.profile.corpus import source_files

    monkeypatch.setenv("POLYKV_HOME", str(tmp_path))
    with pytest.raises(
        ValueError,
        match=r"corpus source 'hf:wikitext:wikitext-103-raw-v1' (needs the `datasets` package|could not be loaded)",
    ) as err:
        source_files("hf:wikitext:wikitext-103-raw-v1")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="names no dataset"):
        CorpusSpec(sources=("hf:",))


# ---- model sources: temperature, opening, splits, the demo's defaults ------------------------------------


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_calibration_and_evaluation_model_samples_never_share_a_sequence(demo_model):
    """The same seed once drew the same samples for a profile's calibration and the fidelity suite."""
    from polykv.profile.corpus import DEMO_SOURCES

    model, tokenizer = demo_model
    length = 64
    calibration = build_corpus(
        tokenizer, CorpusSpec(sources=DEMO_SOURCES, num_sequences=14, max_tokens=length), model=model
    )
    # drawn as the fidelity suite draws its story tasks: all families in one evaluation corpus
    evaluation = build_corpus(
        tokenizer,
        CorpusSpec(sources=DEMO_SOURCES, num_sequences=28, max_tokens=length, split="evaluation"),
        model=model,
    )
    for source in DEMO_SOURCES:
        opening = source.partition(":")[2]
        fixed = 1 + (len(tokenizer(opening, add_special_tokens=False)["input_ids"]) if opening else 0)  # BOS + opening
        mine = [s for s, r in zip(calibration.sequences, calibration.records) if r["source"] == source]
        theirs = [s for s, r in zip(evaluation.sequences, evaluation.records) if r["source"] == source]
        assert len(mine) == 2 and len(theirs) == 4
        for a in mine:
            for b in theirs:
                assert a != b
                # independent stories often start alike ("Once upon a time, there was a little girl named
                # Lily..."), but never for most of the sampled part
                assert _common_prefix(a, b) - fixed < (length - fixed) // 2, source


def test_model_sources_take_a_temperature_and_an_opening(demo_model):
    model, tokenizer = demo_model
    spec = CorpusSpec(
        sources=("model", "model@0.5", "model:Tom had a red ball", "model@1.5:The sun was shining"),
        num_sequences=4,
        max_tokens=40,
        seed=1,
    )
    corpus = build_corpus(tokenizer, spec, model=model)
    assert {len(s) for s in corpus.sequences} == {40}
    assert [(r["temperature"], r["opening"]) for r in corpus.records] == [
        (1.0, None),
        (0.5, None),
        (1.0, "Tom had a red ball"),
        (1.5, "The sun was shining"),
    ]
    for ids, record in zip(corpus.sequences, corpus.records):
        assert ids[0] == tokenizer.bos_token_id and record["file"] is None
        if record["opening"]:  # the opening, tokenized, follows BOS
            opening = tokenizer(record["opening"], add_special_tokens=False)["input_ids"]
            assert ids[1 : 1 + len(opening)] == opening
    assert len({tuple(s) for s in corpus.sequences}) == 4
    # "model" is "model@1.0": every spelling of a temperature draws the same samples
    plain = build_corpus(tokenizer, CorpusSpec(sources=("model",), num_sequences=2, max_tokens=40), model=model)
    for spelling in ("model@1", "model@1.0"):
        same = build_corpus(tokenizer, CorpusSpec(sources=(spelling,), num_sequences=2, max_tokens=40), model=model)
        assert same.sequences == plain.sequences


def test_a_model_source_draws_the_same_samples_whatever_is_listed_with_it(demo_model):
    model, tokenizer = demo_model
    alone = build_corpus(tokenizer, CorpusSpec(sources=("model@0.7",), num_sequences=2, max_tokens=48), model=model)
    mixed = build_corpus(
        tokenizer,
        CorpusSpec(sources=("kjv", "model:Tom had a red ball", "model@0.7"), num_sequences=6, max_tokens=48),
        model=model,
    )
    assert [mixed.sequences[2], mixed.sequences[5]] == alone.sequences


def test_bad_model_sources_fail_clearly(demo_model):
    model, tokenizer = demo_model
    cases = {
        "model@warm": "not a number",
        "model@": "not a number",
        "model@0": "above 0",
        "model@-1": "above 0",
        "model@11": "at most 10",
        "model@nan": "above 0",
        "model:": "empty opening",
        "model@0.7:   ": "empty opening",
        "models": "unknown corpus source",
    }
    for source, expected in cases.items():
        with pytest.raises(ValueError) as excinfo:
            CorpusSpec(sources=(source,))
        message = one_line(excinfo)
        assert repr(source) in message and expected in message
    with pytest.raises(ValueError) as excinfo:  # one family twice would draw the very same samples
        CorpusSpec(sources=("model", "kjv", "model@1.0"))
    assert "'model'" in one_line(excinfo) and "'model@1.0'" in str(excinfo.value)
    with pytest.raises(ValueError) as excinfo:  # an opening that leaves nothing to sample
        build_corpus(
            tokenizer,
            CorpusSpec(sources=("model:Once upon a time there was a dog",), num_sequences=1, max_tokens=4),
            model=model,
        )
    assert "shorten the opening" in one_line(excinfo)


def test_default_sources_depend_on_the_model():
    from polykv.profile.corpus import DEFAULT_SOURCES, DEMO_SOURCES, default_sources, model_source

    assert default_sources("demo") == DEMO_SOURCES
    assert (
        default_sources("Qwen/Qwen3-8B")
        == DEFAULT_SOURCES
        == CorpusSpec().sources
        == ("kjv", "jargon", "stdlib", "model")
    )
    assert CorpusSpec(sources=DEMO_SOURCES).sources == DEMO_SOURCES  # valid, each family once
    assert all(model_source(s) is not None for s in DEMO_SOURCES)
    assert all("," not in s for s in DEMO_SOURCES)  # the CLI's --sources splits at commas


def test_the_demo_models_its_default_sources_well(demo_model):
    """FullKV perplexity on the demo's own samples is low; on Bible prose it is far higher."""
    import math

    import torch

    from polykv.profile.corpus import DEMO_SOURCES

    model, tokenizer = demo_model

    def perplexity(sequences):
        ids = torch.tensor(sequences)
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[:, :-1].double(), -1)
        return math.exp(-logp.gather(-1, ids[:, 1:, None]).mean().item())

    corpus = build_corpus(tokenizer, CorpusSpec(sources=DEMO_SOURCES, num_sequences=14, max_tokens=128), model=model)
    for source in DEMO_SOURCES:
        assert perplexity([s for s, r in zip(corpus.sequences, corpus.records) if r["source"] == source]) < 10, source
    prose = build_corpus(tokenizer, CorpusSpec(sources=("kjv",), num_sequences=2, max_tokens=128))
    assert perplexity(prose.sequences) > 30


def test_the_cli_uses_the_models_default_sources_unless_given():
    from polykv.cli.profiles import _corpus_sources
    from polykv.profile.corpus import DEFAULT_SOURCES, DEMO_SOURCES

    assert _corpus_sources(None, "demo") == DEMO_SOURCES
    assert _corpus_sources(None, "Qwen/Qwen3-8B") == DEFAULT_SOURCES
    assert _corpus_sources("kjv, model@0.7,model:Tom had a red ball", "demo") == (
        "kjv",
        "model@0.7",
        "model:Tom had a red ball",
    )

"""The demo model importer: logits, generation and tokenizer against an independent llama2.c reference.

Everything runs on CPU and offline; the import goes to pytest's tmp_path (POLYKV_HOME is redirected), so
the user's ~/.cache is never touched.
"""

from __future__ import annotations

import os

# huggingface_hub reads these when it is first imported: set them before transformers comes in.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import random  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from polykv.models import (  # noqa: E402
    DEMO_MODEL,
    demo_checkpoint_dir,
    demo_model_dir,
    import_llama2c,
    llama2c,
    load_model,
)
from polykv.models.llama2c import interleaved_to_half_rotary, read_source_record  # noqa: E402
from tests import llama2c_reference as ref  # noqa: E402

STORY = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball"
)
LOGIT_TOLERANCE = 1e-4

# The checkpoint lives beside the repository (../shared); CI has it too, so a missing one fails loudly.
CHECKPOINT_DIR = demo_checkpoint_dir()
CHECKPOINT = CHECKPOINT_DIR / "stories260K.bin"
TOKENIZER = CHECKPOINT_DIR / "tok512.bin"


@pytest.fixture(autouse=True)
def _private_home(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYKV_HOME", str(tmp_path / "polykv-home"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return import_llama2c(CHECKPOINT, TOKENIZER, tmp_path_factory.mktemp("import") / "stories260K-hf")


@pytest.fixture(scope="module")
def model_and_tokenizer(model_dir):
    return load_model(str(model_dir))


@pytest.fixture(scope="module")
def reference_checkpoint() -> ref.Checkpoint:
    return ref.read_checkpoint(CHECKPOINT)


@pytest.fixture(scope="module")
def reference_vocab() -> ref.Vocab:
    return ref.read_tokenizer(TOKENIZER)


def _copy_checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for source in (CHECKPOINT, TOKENIZER):
        shutil.copyfile(source, folder / source.name)
    return folder


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name]


# --------------------------------------------------------------------------- (a) logits


def _token_sequences(vocab: ref.Vocab) -> dict[str, list[int]]:
    rng = np.random.default_rng(0)
    return {
        "story": ref.encode(vocab, STORY + ". She ran to it and picked it up.")[:50],
        "random": [1] + rng.integers(0, 512, size=49).tolist(),
        "repeated": [1] + [410] * 49,
    }


@pytest.mark.parametrize("name", ["story", "random", "repeated"])
def test_logits_match_reference(name, model_and_tokenizer, reference_checkpoint, reference_vocab):
    tokens = _token_sequences(reference_vocab)[name]
    assert len(tokens) == 50 and tokens[0] == 1
    model, _ = model_and_tokenizer
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float().numpy()
    expected = ref.forward(reference_checkpoint, tokens)
    diff = float(np.abs(logits - expected).max())
    print(f"max abs logit difference ({name}): {diff:.3g}")
    assert diff <= LOGIT_TOLERANCE


def test_rope_permutation_is_per_head_even_then_odd():
    weight = np.arange(8, dtype=np.float32).reshape(8, 1)  # 2 heads of head_dim 4
    assert interleaved_to_half_rotary(weight, n_heads=2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_config_matches_header(model_and_tokenizer):
    model, _ = model_and_tokenizer
    cfg = model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (64, 172, 5)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (8, 4, 8)
    assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.rms_norm_eps) == (512, 512, 1e-5)
    assert cfg.rope_parameters["rope_theta"] == 10000.0
    assert cfg.tie_word_embeddings and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert not model.training


# --------------------------------------------------------------------------- (b) generation


def test_greedy_generation_reproduces_story(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    assert list(model.generation_config.eos_token_id) == [1, 2]  # run.c stops on BOS
    bos = torch.tensor([[tokenizer.bos_token_id]])
    out = model.generate(bos, attention_mask=torch.ones_like(bos), max_new_tokens=60, do_sample=False)
    text = tokenizer.decode(out[0], skip_special_tokens=True)
    assert text.startswith(STORY), text


# --------------------------------------------------------------------------- (c) tokenizer

TEXTS = [
    STORY,
    "",
    " ",
    "   three leading spaces",
    "trailing spaces   ",
    "multiple   inner    spaces",
    "line one\nline two\n\n\nafter blank lines\n",
    "\ttab and\r\ncarriage return",
    'Punctuation: "quoted", (paren) [bracket]; semi-colon! question? ellipsis... dash - slash /',
    "Digits 0123456789 and 3.14159, 1,000,000",
    "café naïve façade",
    "日本",
    "emoji 🙂 and 👍🏽 and family 👨‍👩‍👧",
    "curly “quotes” and ’apostrophe’ — dash… €",
    "literal ▁ metaspace and <0x41> byte name",
    "<s> special </s> names <unk> as text",
    "\x00 nul byte",
]


@pytest.mark.parametrize("text", TEXTS, ids=[f"text{i}" for i in range(len(TEXTS))])
def test_tokenizer_matches_llama2c_encoder(text, model_and_tokenizer, reference_vocab):
    _, tokenizer = model_and_tokenizer
    ids = tokenizer.encode(text)
    assert ids == ref.encode(reference_vocab, text)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_tokenizer_matches_on_random_text(model_and_tokenizer, reference_vocab):
    _, tokenizer = model_and_tokenizer
    alphabet = list("  \n\tabcdefghijklmnopqrstuvwxyzLTSOH.,!?\"'-0123456789") + ["é", "ñ", "日", "🙂", "’", "\u00a0"]
    rng = random.Random(1234)
    texts = ["".join(rng.choices(alphabet, k=rng.randint(1, 40))) for _ in range(300)]
    batch = tokenizer(texts)["input_ids"]
    for text, ids in zip(texts, batch, strict=True):
        assert ids == ref.encode(reference_vocab, text), repr(text)
        assert tokenizer.decode(ids, skip_special_tokens=True) == text, repr(text)


def test_tokenizer_special_tokens(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    assert (tokenizer.unk_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert (tokenizer.unk_token, tokenizer.bos_token, tokenizer.eos_token) == ("<unk>", "<s>", "</s>")
    assert tokenizer.encode("Lily", add_special_tokens=False)[0] != 1
    assert tokenizer.encode("Lily")[0] == 1


# --------------------------------------------------------------------------- (d) import, cache, errors


def test_demo_model_dir_imports_once_and_reuses(tmp_path):
    first = demo_model_dir()
    assert first == tmp_path / "polykv-home" / "models" / "stories260K-hf"
    record = read_source_record(first)
    assert record["checkpoint"]["sha256"] == llama2c.sha256_file(CHECKPOINT)
    stamps = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    assert demo_model_dir() == first
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == stamps
    assert _leftovers(first.parent) == []


def test_demo_model_dir_reimports_when_checkpoint_changes(tmp_path, monkeypatch):
    source = _copy_checkpoint(tmp_path / "ckpt")
    monkeypatch.setenv("POLYKV_DEMO_CHECKPOINT", str(source))
    model_dir = demo_model_dir()
    old_sha = read_source_record(model_dir)["checkpoint"]["sha256"]
    # Change one weight of rms_final (just before the RoPE tables): same size, different content.
    data = bytearray((source / "stories260K.bin").read_bytes())
    offset = len(data) - 4 * (512 * 4 * 2) - 4
    struct.pack_into("<f", data, offset, struct.unpack_from("<f", data, offset)[0] + 1.0)
    (source / "stories260K.bin").write_bytes(bytes(data))
    assert demo_model_dir() == model_dir
    record = read_source_record(model_dir)
    assert record["checkpoint"]["sha256"] != old_sha
    assert record["checkpoint"]["sha256"] == llama2c.sha256_file(source / "stories260K.bin")
    assert _leftovers(model_dir.parent) == []


def test_env_var_overrides_checkpoint_dir(tmp_path, monkeypatch):
    source = _copy_checkpoint(tmp_path / "elsewhere")
    monkeypatch.setenv("POLYKV_DEMO_CHECKPOINT", str(source))
    assert demo_checkpoint_dir() == source
    record = read_source_record(demo_model_dir())
    assert record["checkpoint"]["path"] == str((source / "stories260K.bin").resolve())


def test_missing_checkpoint_dir_gives_clear_error(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-folder"
    monkeypatch.setenv("POLYKV_DEMO_CHECKPOINT", str(missing))
    with pytest.raises(FileNotFoundError) as info:
        demo_model_dir()
    message = str(info.value)
    assert "\n" not in message and str(missing) in message and "POLYKV_DEMO_CHECKPOINT" in message


def test_truncated_checkpoint_gives_clear_error(tmp_path):
    bad = tmp_path / "stories260K.bin"
    bad.write_bytes(CHECKPOINT.read_bytes()[:-100])
    out = tmp_path / "out"
    with pytest.raises(ValueError) as info:
        import_llama2c(bad, TOKENIZER, out)
    message = str(info.value)
    assert "\n" not in message and str(bad) in message and "truncated" in message
    assert not out.exists() and _leftovers(tmp_path) == []


def test_newer_export_format_is_named(tmp_path):
    bad = tmp_path / "v1.bin"
    bad.write_bytes(struct.pack("<ii", 0x616B3432, 1) + bytes(248))
    with pytest.raises(ValueError, match="version 1/2"):
        import_llama2c(bad, TOKENIZER, tmp_path / "out")


def test_failed_reimport_keeps_previous_import(tmp_path, monkeypatch):
    out = import_llama2c(CHECKPOINT, TOKENIZER, tmp_path / "model")
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}

    def write_half_then_fail(staging: Path, *args) -> None:
        (staging / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(llama2c, "_write_model_dir", write_half_then_fail)
    with pytest.raises(RuntimeError, match="disk full"):
        import_llama2c(CHECKPOINT, TOKENIZER, out)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps
    assert _leftovers(tmp_path) == []


def test_load_model_demo_and_missing_path(tmp_path):
    model, tokenizer = load_model(DEMO_MODEL)
    assert not model.training and tokenizer.bos_token_id == 1
    assert (tmp_path / "polykv-home" / "models" / "stories260K-hf" / "model.safetensors").is_file()
    missing = tmp_path / "no-model-here"
    with pytest.raises(FileNotFoundError, match="does not exist") as info:
        load_model(str(missing))
    assert str(missing) in str(info.value)


def test_import_refuses_to_replace_unrelated_directory(tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        import_llama2c(CHECKPOINT, TOKENIZER, precious)
    assert (precious / "notes.txt").read_text() == "keep me"

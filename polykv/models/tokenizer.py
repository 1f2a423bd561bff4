"""Rebuild a llama2.c ``tokenizer.bin`` (such as ``tok512.bin``) as a Hugging Face fast tokenizer.

The file format and the encoding rule come from Andrej Karpathy's llama2.c
(https://github.com/karpathy/llama2.c, MIT licence): ``tokenizer.py`` there exports a SentencePiece model
as ``int32 max_token_length`` followed, for every token, by ``float32 score, int32 length, bytes``, with
SentencePiece's "▁" already turned into a plain space. ``run.c`` then encodes text by

1. prepending a single " " (SentencePiece's dummy prefix) when the text is not empty,
2. mapping every UTF-8 character to its token, or each of its bytes to the byte token ``byte + 3``,
3. repeatedly merging the adjacent pair whose concatenation is a token with the highest score.

This module rebuilds exactly that as a ``tokenizers`` pipeline:

- normalizer ``Prepend(" ")``: the dummy prefix (``Prepend`` leaves an empty string empty, as run.c does);
  no other normalisation, so whitespace is never collapsed;
- no pre-tokenizer: run.c merges across the whole text, so the whole text is one BPE "word";
- a BPE model with ``byte_fallback`` whose merge list holds every pair ``(a, b)`` with ``a``, ``b`` and
  ``a + b`` in the vocabulary, ranked by the score of ``a + b``. Lowest rank first is then the same
  greedy rule as run.c's "highest score first";
- decoder ``ByteFallback -> Fuse -> Strip(one leading space)`` that undoes the dummy prefix;
- a post-processor that adds ``<s>`` in front, like the Llama tokenizers;
- ``split_special_tokens``: "<s>" written in the text is encoded as characters, as run.c does.

The vocabulary keeps llama2.c's plain spaces rather than SentencePiece's "▁": with a "▁" vocabulary a
literal "▁" in the text would become a space token, while llama2.c encodes it as three bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
# run.c hard-codes these ids (and SentencePiece puts its special pieces there by default).
SPECIAL_IDS = {UNK: 0, BOS: 1, EOS: 2}
FIRST_BYTE_ID = 3  # ids 3..258 are the byte fallbacks <0x00>..<0xFF>


@dataclass(frozen=True)
class Llama2cVocab:
    """The contents of a llama2.c tokenizer file."""

    pieces: list[str]  # token strings, plain spaces; ids 0..2 renamed to <unk>, <s>, </s>
    scores: list[float]
    max_token_length: int

    def __len__(self) -> int:
        return len(self.pieces)


def read_llama2c_tokenizer(path: Path, vocab_size: int | None = None) -> Llama2cVocab:
    """Read a llama2.c tokenizer file; check the token count when ``vocab_size`` is given."""
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 4:
        raise ValueError(f"{path}: too short ({len(data)} bytes) to be a llama2.c tokenizer file")
    (max_token_length,) = struct.unpack_from("<i", data, 0)
    pieces: list[str] = []
    scores: list[float] = []
    offset = 4
    while offset < len(data):
        if offset + 8 > len(data):
            raise ValueError(f"{path}: truncated entry header for token {len(pieces)} at byte {offset}")
        score, length = struct.unpack_from("<fi", data, offset)
        offset += 8
        if length < 0 or offset + length > len(data):
            raise ValueError(f"{path}: token {len(pieces)} claims {length} bytes at byte {offset}; file is truncated")
        raw = data[offset : offset + length]
        offset += length
        try:
            pieces.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: token {len(pieces)} is not valid UTF-8 ({exc.reason})") from None
        scores.append(score)
    if len(pieces) < FIRST_BYTE_ID + 256:
        raise ValueError(f"{path}: {len(pieces)} tokens; expected <unk>, <s>, </s> and 256 byte tokens at least")
    if vocab_size is not None and len(pieces) != vocab_size:
        raise ValueError(f"{path}: {len(pieces)} tokens but the checkpoint's vocab_size is {vocab_size}")
    # run.c's BOS/EOS strings are "\n<s>\n" and "\n</s>\n"; give them their usual names.
    for name, idx in SPECIAL_IDS.items():
        pieces[idx] = name
    return Llama2cVocab(pieces=pieces, scores=scores, max_token_length=max_token_length)


def _vocab_dict(vocab: Llama2cVocab) -> dict[str, int]:
    ids: dict[str, int] = {}
    for idx, piece in enumerate(vocab.pieces):
        if piece in ids:
            # HF needs one id per string, and run.c's binary search would pick either one.
            raise ValueError(f"token {piece!r} appears twice (ids {ids[piece]} and {idx}); cannot rebuild it")
        ids[piece] = idx
    return ids


def _merges(vocab: Llama2cVocab, ids: dict[str, int]) -> list[tuple[str, str]]:
    """Every pair run.c could merge, best score first (ties: lower id first, then shorter left part)."""
    specials = set(SPECIAL_IDS)
    order = sorted(range(len(vocab)), key=lambda i: (-vocab.scores[i], i))
    merges: list[tuple[str, str]] = []
    for idx in order:
        piece = vocab.pieces[idx]
        if piece in specials:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids and left not in specials and right not in specials:
                merges.append((left, right))
    return merges


def build_tokenizer(vocab: Llama2cVocab) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` that encodes exactly like llama2.c's ``encode`` (with BOS)."""
    ids = _vocab_dict(vocab)
    bpe = models.BPE(vocab=ids, merges=_merges(vocab, ids), unk_token=UNK, byte_fallback=True)
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.Prepend(" ")
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence(
        [decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0)]
    )
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0",
        pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1",
        special_tokens=[(BOS, SPECIAL_IDS[BOS])],
    )
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in SPECIAL_IDS])
    return tok


def build_hf_tokenizer(path: Path, vocab_size: int | None = None, model_max_length: int | None = None):
    """Read ``path`` and wrap the rebuilt tokenizer for transformers (``PreTrainedTokenizerFast``)."""
    from transformers import PreTrainedTokenizerFast

    vocab = read_llama2c_tokenizer(path, vocab_size)
    extra = {} if model_max_length is None else {"model_max_length": model_max_length}
    return PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(vocab),
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=UNK,  # Llama has no pad token; <unk> never appears in real encodings (byte fallback)
        # The default clean-up rewrites " ," to "," and would break decode(encode(text)) == text.
        clean_up_tokenization_spaces=False,
        # run.c has no special-token syntax: "<s>" in the text is three characters, not BOS. This also
        # keeps a stray "</s>" in an evaluation prompt from turning into a real end of sequence.
        split_special_tokens=True,
        **extra,
    )


def save_hf_tokenizer(
    path: Path, out_dir: Path, vocab_size: int | None = None, model_max_length: int | None = None
) -> None:
    """Write tokenizer.json and tokenizer_config.json for ``AutoTokenizer.from_pretrained(out_dir)``."""
    build_hf_tokenizer(path, vocab_size, model_max_length).save_pretrained(str(out_dir))

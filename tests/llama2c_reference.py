"""Independent numpy reference for llama2.c checkpoints and tokenizers (test oracle).

Follows ``run.c`` of Andrej Karpathy's llama2.c (https://github.com/karpathy/llama2.c, MIT licence):
``forward`` mirrors its transformer step by step (one position at a time, with a KV cache) and ``encode``
mirrors its BPE encoder. It deliberately imports nothing from ``polykv``, so a bug in the importer
cannot hide behind a shared helper.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEADER = struct.Struct("<7i")


@dataclass
class Checkpoint:
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    w: dict[str, np.ndarray]


def read_checkpoint(path: Path) -> Checkpoint:
    """run.c's ``read_checkpoint`` + ``memory_map_weights`` for the legacy (v0) layout."""
    data = Path(path).read_bytes()
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = HEADER.unpack_from(data, 0)
    shared = vocab > 0
    vocab = abs(vocab)
    head_size = dim // n_heads
    kv_dim = n_kv_heads * head_size
    flat = np.frombuffer(data, dtype="<f4", offset=HEADER.size)
    pos = 0

    def take(*shape: int) -> np.ndarray:
        nonlocal pos
        n = int(np.prod(shape))
        out = flat[pos : pos + n].reshape(shape)
        pos += n
        return out

    w = {
        "token_embedding": take(vocab, dim),
        "rms_att": take(n_layers, dim),
        "wq": take(n_layers, dim, dim),
        "wk": take(n_layers, kv_dim, dim),
        "wv": take(n_layers, kv_dim, dim),
        "wo": take(n_layers, dim, dim),
        "rms_ffn": take(n_layers, dim),
        "w1": take(n_layers, hidden, dim),
        "w2": take(n_layers, dim, hidden),
        "w3": take(n_layers, hidden, dim),
        "rms_final": take(dim),
    }
    take(seq_len * head_size // 2)  # freq_cis_real: run.c skips it and computes RoPE on the fly
    take(seq_len * head_size // 2)  # freq_cis_imag
    w["wcls"] = w["token_embedding"] if shared else take(vocab, dim)
    assert pos == flat.size, f"{pos} floats read, {flat.size} in file"
    return Checkpoint(dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len, w)


def rmsnorm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    ss = np.float32(np.dot(x, x) / x.size + 1e-5)
    return weight * (x / np.sqrt(ss))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def rope(vec: np.ndarray, pos: int, head_size: int) -> np.ndarray:
    """Rotate interleaved pairs (vec[i], vec[i+1]) by pos * 10000^(-(i % head_size) / head_size)."""
    out = vec.copy()
    i = np.arange(0, vec.size, 2)
    freq = 1.0 / np.power(np.float32(10000.0), (i % head_size) / np.float32(head_size))
    val = (pos * freq).astype(np.float32)
    fcr, fci = np.cos(val), np.sin(val)
    v0, v1 = vec[i], vec[i + 1]
    out[i] = v0 * fcr - v1 * fci
    out[i + 1] = v0 * fci + v1 * fcr
    return out


def forward(ckpt: Checkpoint, tokens: list[int]) -> np.ndarray:
    """Logits [len(tokens), vocab] computed the way run.c does, one position at a time."""
    c, w = ckpt, ckpt.w
    head_size = c.dim // c.n_heads
    kv_mul = c.n_heads // c.n_kv_heads
    kv_dim = c.n_kv_heads * head_size
    key_cache = np.zeros((c.n_layers, len(tokens), kv_dim), np.float32)
    value_cache = np.zeros_like(key_cache)
    logits = np.zeros((len(tokens), c.vocab_size), np.float32)
    for pos, token in enumerate(tokens):
        x = w["token_embedding"][token].copy()
        for layer in range(c.n_layers):
            xb = rmsnorm(x, w["rms_att"][layer])
            q = w["wq"][layer] @ xb
            k = w["wk"][layer] @ xb
            v = w["wv"][layer] @ xb
            # run.c rotates q over all of dim and k over kv_dim, pair by pair.
            q = rope(q, pos, head_size)
            k = rope(k, pos, head_size)
            key_cache[layer, pos] = k
            value_cache[layer, pos] = v
            att_out = np.zeros(c.dim, np.float32)
            for h in range(c.n_heads):
                qh = q[h * head_size : (h + 1) * head_size]
                kv = (h // kv_mul) * head_size  # grouped-query attention
                keys = key_cache[layer, : pos + 1, kv : kv + head_size]
                values = value_cache[layer, : pos + 1, kv : kv + head_size]
                att = softmax(keys @ qh / np.sqrt(np.float32(head_size)))
                att_out[h * head_size : (h + 1) * head_size] = att @ values
            x = x + w["wo"][layer] @ att_out
            xb = rmsnorm(x, w["rms_ffn"][layer])
            h1 = w["w1"][layer] @ xb
            h3 = w["w3"][layer] @ xb
            silu = h1 * (1.0 / (1.0 + np.exp(-h1)))  # SwiGLU
            x = x + w["w2"][layer] @ (silu * h3)
        x = rmsnorm(x, w["rms_final"])
        logits[pos] = w["wcls"] @ x
    return logits


# --------------------------------------------------------------------------- tokenizer (run.c's encode)


@dataclass
class Vocab:
    pieces: list[bytes]
    scores: list[float]
    lookup: dict[bytes, int]


def read_tokenizer(path: Path) -> Vocab:
    data = Path(path).read_bytes()
    offset = 4  # int32 max_token_length
    pieces: list[bytes] = []
    scores: list[float] = []
    while offset < len(data):
        score, length = struct.unpack_from("<fi", data, offset)
        offset += 8
        pieces.append(data[offset : offset + length])
        scores.append(score)
        offset += length
    lookup: dict[bytes, int] = {}
    for i, p in enumerate(pieces):
        lookup.setdefault(p, i)
    return Vocab(pieces, scores, lookup)


def encode(vocab: Vocab, text: str, bos: bool = True, eos: bool = False) -> list[int]:
    """run.c's ``encode``: dummy prefix, UTF-8 characters or byte fallback, then best-score merges."""
    raw = text.encode("utf-8")
    tokens: list[int] = [1] if bos else []
    if raw:
        tokens.append(vocab.lookup[b" "])
    i = 0
    while i < len(raw):
        # A character is a lead byte plus its continuation bytes (10xxxxxx), at most 4 bytes.
        j = i + 1
        while j < len(raw) and (raw[j] & 0xC0) == 0x80 and j - i < 4:
            j += 1
        char = raw[i:j]
        if char in vocab.lookup:
            tokens.append(vocab.lookup[char])
        else:
            tokens.extend(b + 3 for b in char)
        i = j
    while True:
        best_score, best_id, best_idx = -1e10, -1, -1
        for k in range(len(tokens) - 1):  # BOS takes part too; "\n<s>\n" + x is never a token
            merged = vocab.pieces[tokens[k]] + vocab.pieces[tokens[k + 1]]
            idx = vocab.lookup.get(merged, -1)
            if idx != -1 and vocab.scores[idx] > best_score:
                best_score, best_id, best_idx = vocab.scores[idx], idx, k
        if best_idx == -1:
            break
        tokens[best_idx : best_idx + 2] = [best_id]
    if eos:
        tokens.append(2)
    return tokens

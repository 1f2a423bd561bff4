"""Import legacy (version 0) llama2.c checkpoints as Hugging Face ``LlamaForCausalLM`` directories.

The checkpoint format comes from Andrej Karpathy's llama2.c (https://github.com/karpathy/llama2.c, MIT
licence). A legacy file is a 28-byte header of seven little-endian int32 values

    dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len

(a negative ``vocab_size`` means the classifier is not shared with the token embedding) followed by
float32 weights in ``run.c``'s order: token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3,
rms_final, freq_cis_real, freq_cis_imag and, when not shared, wcls. Matrices are stored row-major as
(out_features, in_features), the same layout as ``torch.nn.Linear.weight``.

Two things differ from Hugging Face's Llama: run.c rotates interleaved pairs (x[2i], x[2i+1]) while HF
rotates halves (x[i], x[i + head_dim/2]), so the rows of wq and wk are permuted per head; and the
RoPE tables are dropped because HF computes them from ``rope_theta``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polykv.errors import PolyKVError
from polykv.files import read_json

from .staging import staged
from .tokenizer import SPECIAL_IDS, save_hf_tokenizer

HEADER = struct.Struct("<7i")
# llama2.c's later export formats (version 1 and 2) start with this magic number ("ak42").
EXPORT_MAGIC = 0x616B3432
RMS_NORM_EPS = 1e-5  # hard-coded in run.c's rmsnorm
ROPE_THETA = 10000.0  # hard-coded in run.c's RoPE
SOURCE_RECORD = "polykv_source.json"
# Bump when the output of import_llama2c changes, so cached imports are rebuilt.
IMPORTER_VERSION = 1


@dataclass(frozen=True)
class Llama2cConfig:
    """The header of a legacy llama2.c checkpoint."""

    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int  # always positive here; see shared_classifier
    seq_len: int
    shared_classifier: bool

    @property
    def head_size(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_size

    def tensor_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every float32 block of the file, in file order."""
        L, d, h, kv = self.n_layers, self.dim, self.hidden_dim, self.kv_dim
        rope_table = (self.seq_len, self.head_size // 2)
        shapes = [
            ("token_embedding", (self.vocab_size, d)),
            ("rms_att", (L, d)),
            ("wq", (L, d, d)),
            ("wk", (L, kv, d)),
            ("wv", (L, kv, d)),
            ("wo", (L, d, d)),
            ("rms_ffn", (L, d)),
            ("w1", (L, h, d)),
            ("w2", (L, d, h)),
            ("w3", (L, h, d)),
            ("rms_final", (d,)),
            ("freq_cis_real", rope_table),
            ("freq_cis_imag", rope_table),
        ]
        if not self.shared_classifier:
            shapes.append(("wcls", (self.vocab_size, d)))
        return shapes

    def file_size(self) -> int:
        return HEADER.size + 4 * sum(int(np.prod(shape)) for _, shape in self.tensor_shapes())

    def describe(self) -> str:
        return (
            f"dim={self.dim}, hidden_dim={self.hidden_dim}, n_layers={self.n_layers}, n_heads={self.n_heads}, "
            f"n_kv_heads={self.n_kv_heads}, vocab_size={self.vocab_size}, seq_len={self.seq_len}, "
            f"{'shared' if self.shared_classifier else 'separate'} classifier"
        )


def read_llama2c_header(path: Path) -> Llama2cConfig:
    """Read and check the header, including that the file size matches it exactly."""
    path = Path(path)
    size = path.stat().st_size
    if size < HEADER.size:
        raise ValueError(f"{path}: {size} bytes is too short for a llama2.c checkpoint header ({HEADER.size} bytes)")
    with path.open("rb") as f:
        values = HEADER.unpack(f.read(HEADER.size))
    if values[0] == EXPORT_MAGIC:
        raise ValueError(
            f"{path}: llama2.c version 1/2 export format (magic 'ak42'); only legacy (v0) files are supported"
        )
    dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len = values
    config = Llama2cConfig(
        dim, hidden_dim, n_layers, n_heads, n_kv_heads, abs(vocab_size), seq_len, shared_classifier=vocab_size > 0
    )
    problem = _header_problem(config, vocab_size)
    if problem:
        raise ValueError(f"{path}: not a legacy llama2.c checkpoint: {problem} (header: {config.describe()})")
    if size != config.file_size():
        raise ValueError(
            f"{path}: file is {size} bytes but its header ({config.describe()}) implies {config.file_size()} bytes; "
            "it is truncated, padded or not a legacy (v0) llama2.c checkpoint"
        )
    return config


def _header_problem(config: Llama2cConfig, raw_vocab_size: int) -> str | None:
    sizes = {
        "dim": config.dim,
        "hidden_dim": config.hidden_dim,
        "n_layers": config.n_layers,
        "n_heads": config.n_heads,
        "n_kv_heads": config.n_kv_heads,
        "seq_len": config.seq_len,
    }
    bad = [name for name, value in sizes.items() if value <= 0]
    if bad or raw_vocab_size == 0:
        return f"non-positive {', '.join(bad + (['vocab_size'] if raw_vocab_size == 0 else []))}"
    if config.dim % config.n_heads:
        return "dim is not a multiple of n_heads"
    if config.n_heads % config.n_kv_heads:
        return "n_heads is not a multiple of n_kv_heads"
    if config.head_size % 2:
        return "odd head size; RoPE rotates pairs"
    return None


def read_llama2c_checkpoint(path: Path) -> tuple[Llama2cConfig, dict[str, np.ndarray]]:
    """Header and weights (read-only float32 arrays memory-mapped from the file, RoPE tables included)."""
    config = read_llama2c_header(path)
    n_floats = (config.file_size() - HEADER.size) // 4
    flat = np.memmap(path, dtype="<f4", mode="r", offset=HEADER.size, shape=(n_floats,))
    weights: dict[str, np.ndarray] = {}
    offset = 0
    for name, shape in config.tensor_shapes():
        count = int(np.prod(shape))
        weights[name] = flat[offset : offset + count].reshape(shape)
        offset += count
    if config.shared_classifier:
        weights["wcls"] = weights["token_embedding"]
    return config, weights


def interleaved_to_half_rotary(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder the output rows of a q/k projection from pair-wise RoPE to HF's rotate-half RoPE.

    Within each head, llama2.c rotates rows (2i, 2i+1) together; HF rotates rows (i, i + head_dim/2).
    Putting the even rows first and the odd rows second makes HF rotate the same pairs.
    """
    out_features, in_features = weight.shape
    head_dim = out_features // n_heads
    per_head = weight.reshape(n_heads, head_dim // 2, 2, in_features)
    return per_head.transpose(0, 2, 1, 3).reshape(out_features, in_features)


def hf_state_dict(config: Llama2cConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Map llama2.c tensors onto ``LlamaForCausalLM`` parameter names (float32, contiguous)."""
    tensors = {"model.embed_tokens.weight": weights["token_embedding"], "model.norm.weight": weights["rms_final"]}
    for i in range(config.n_layers):
        prefix = f"model.layers.{i}."
        tensors |= {
            prefix + "input_layernorm.weight": weights["rms_att"][i],
            prefix + "self_attn.q_proj.weight": interleaved_to_half_rotary(weights["wq"][i], config.n_heads),
            prefix + "self_attn.k_proj.weight": interleaved_to_half_rotary(weights["wk"][i], config.n_kv_heads),
            prefix + "self_attn.v_proj.weight": weights["wv"][i],
            prefix + "self_attn.o_proj.weight": weights["wo"][i],
            prefix + "post_attention_layernorm.weight": weights["rms_ffn"][i],
            prefix + "mlp.gate_proj.weight": weights["w1"][i],
            prefix + "mlp.up_proj.weight": weights["w3"][i],
            prefix + "mlp.down_proj.weight": weights["w2"][i],
        }
    if not config.shared_classifier:
        # With a shared classifier, tie_word_embeddings makes transformers reuse embed_tokens.
        tensors["lm_head.weight"] = weights["wcls"]
    return {name: np.ascontiguousarray(t, dtype=np.float32) for name, t in tensors.items()}


def hf_config(config: Llama2cConfig):
    """The ``LlamaConfig`` equivalent of a llama2.c header."""
    from transformers import LlamaConfig

    return LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=config.vocab_size,
        hidden_size=config.dim,
        intermediate_size=config.hidden_dim,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads,
        head_dim=config.head_size,
        hidden_act="silu",
        max_position_embeddings=config.seq_len,
        rms_norm_eps=RMS_NORM_EPS,
        # transformers 5 keeps rope_theta inside rope_parameters (a top-level rope_theta is legacy).
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=config.shared_classifier,
        bos_token_id=SPECIAL_IDS["<s>"],
        eos_token_id=SPECIAL_IDS["</s>"],
        dtype="float32",
    )


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def import_llama2c(checkpoint: Path, tokenizer: Path, out_dir: Path) -> Path:
    """Convert a legacy llama2.c checkpoint and its tokenizer into the HF model directory ``out_dir``.

    Writes config.json, model.safetensors, generation_config.json, the tokenizer files and
    ``polykv_source.json`` (sha256 of both inputs). The directory is assembled next to ``out_dir`` and
    renamed into place, so ``out_dir`` is either the old complete import or the new complete one. An
    existing ``out_dir`` must be empty or a previous import (it is replaced), else FileExistsError.
    """
    checkpoint, tokenizer, out_dir = Path(checkpoint), Path(tokenizer), Path(out_dir)
    config, weights = read_llama2c_checkpoint(checkpoint)  # validates before anything is written
    if out_dir.exists() and any(out_dir.iterdir()) and read_source_record(out_dir) is None:
        # The old directory is deleted on success: never do that to something we did not create.
        raise FileExistsError(f"{out_dir}: exists and is not a previous llama2.c import; choose another out_dir")
    with staged(out_dir) as staging:
        _write_model_dir(staging, checkpoint, tokenizer, config, weights)
    return out_dir


def _write_model_dir(
    out: Path, checkpoint: Path, tokenizer: Path, config: Llama2cConfig, weights: dict[str, np.ndarray]
) -> None:
    from safetensors.numpy import save_file
    from transformers import GenerationConfig

    save_hf_tokenizer(tokenizer, out, vocab_size=config.vocab_size, model_max_length=config.seq_len)
    hf_config(config).save_pretrained(str(out))
    save_file(hf_state_dict(config, weights), str(out / "model.safetensors"), metadata={"format": "pt"})
    GenerationConfig(
        bos_token_id=SPECIAL_IDS["<s>"],
        # run.c stops when the model emits BOS (a new story); </s> ends a sequence in HF's convention.
        eos_token_id=[SPECIAL_IDS["<s>"], SPECIAL_IDS["</s>"]],
        pad_token_id=SPECIAL_IDS["<unk>"],
    ).save_pretrained(str(out))
    record = {
        "format": "llama2c-v0",
        "importer_version": IMPORTER_VERSION,
        "checkpoint": {"path": str(checkpoint.resolve()), "sha256": sha256_file(checkpoint)},
        "tokenizer": {"path": str(tokenizer.resolve()), "sha256": sha256_file(tokenizer)},
        "header": config.describe(),
    }
    (out / SOURCE_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    for file in out.iterdir():
        os.chmod(file, 0o644)  # safetensors writes its file owner-only; keep the directory uniform


def read_source_record(model_dir: Path) -> dict | None:
    """The ``polykv_source.json`` of an imported directory, or None if absent or unreadable."""
    try:
        return read_json(Path(model_dir) / SOURCE_RECORD, "source record")
    except PolyKVError:
        return None

"""SqueezeAttention's layer statistic: how little each layer's attention changes the hidden state.

Wang, Cui, Gan. "SqueezeAttention: 2D Management of KV-Cache in LLM Inference via Layer-wise Optimal Budget."
ICLR 2025, arXiv:2404.04793 (code: hetailang/SqueezeAttention). Per layer, the cosine similarity between each
prompt token's hidden state entering the layer and the same token's hidden state after the attention block's
residual add, averaged over the tokens: a layer whose attention barely moves the hidden state (similarity near 1)
matters less to the output, so its KV cache can be squeezed (`polykv.routing.rules`, rule "squeeze").

After the attention block's residual add is what enters the norm before the MLP: `post_attention_layernorm` in
Llama, Mistral and Qwen, `pre_feedforward_layernorm` in Gemma 3 (whose `post_attention_layernorm` normalises the
attention output before the add). Measured with forward hooks on the model's own modules; PolyKV averages over
the given sequences too (the authors measure each prompt as it comes).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch

_AFTER_ATTENTION = ("pre_feedforward_layernorm", "post_attention_layernorm")  # the first a layer has


def _after_attention(layer) -> torch.nn.Module:
    for name in _AFTER_ATTENTION:
        module = getattr(layer, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise ValueError(
        f"{type(layer).__name__}: no norm before the MLP ({' or '.join(_AFTER_ATTENTION)}), so the hidden state "
        "after attention cannot be read: SqueezeAttention's statistic supports Llama-, Mistral-, Qwen- and "
        "Gemma 3-style layers"
    )


@torch.no_grad()
def attention_similarity(model, sequences: Sequence[Sequence[int]]) -> list[float]:
    """Per layer, the mean over `sequences` of the mean over their tokens of cos(hidden entering the layer, hidden
    after its attention block), in float64."""
    layers = model.get_decoder().layers
    entering: dict[int, torch.Tensor] = {}
    totals = [0.0] * len(layers)
    hooks = []

    def before(idx):
        def hook(module, args, kwargs):
            entering[idx] = (args[0] if args else kwargs["hidden_states"]).detach()

        return hook

    def after(idx):
        def hook(module, args):
            cosine = torch.nn.functional.cosine_similarity(entering.pop(idx).double(), args[0].double(), dim=-1)
            totals[idx] += float(cosine.mean())

        return hook

    try:
        for idx, layer in enumerate(layers):
            hooks.append(layer.register_forward_pre_hook(before(idx), with_kwargs=True))
            hooks.append(_after_attention(layer).register_forward_pre_hook(after(idx)))
        device = next(model.parameters()).device
        for ids in sequences:
            model(torch.as_tensor([list(ids)], device=device), use_cache=False)
    finally:
        for handle in hooks:
            handle.remove()
    return [t / len(sequences) for t in totals]


def calibration_similarity(model_name: str, model, tokenizer, tokens: int, folder: Path | None = None) -> list[float]:
    """`attention_similarity` on 4 sequences of the model's calibration text (`calibration_text`, never an evaluated
    prompt) of `tokens` tokens. Kept in `folder` when given (`squeeze-<key>.json`, the key of the model, its device
    and dtype, the length and the text's sources): text a model samples takes minutes at 4K tokens (gemma3's one
    sampled sequence of the four: about 9 minutes on 2 cores)."""
    from polykv.files import atomic_write_json, parse_json
    from polykv.profile.corpus import calibration_text
    from polykv.profile.sources import default_sources

    weights = next(model.parameters())
    given = {
        "model": model_name,
        "device": str(weights.device),
        "dtype": str(weights.dtype),
        "tokens": tokens,
        "sequences": 4,
        "sources": list(default_sources(model_name)),
        "version": 1,  # raised when the text or the statistic changes
    }
    path = None
    if folder is not None:
        digest = hashlib.sha256(json.dumps(given, sort_keys=True).encode()).hexdigest()[:16]
        path = Path(folder) / f"squeeze-{digest}.json"
        try:
            kept = parse_json(path.read_text(encoding="utf-8"))
            if isinstance(kept, dict) and kept.get("given") == given:
                return [float(v) for v in kept["similarity"]]
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not kept yet, or damaged: measured again
    similarity = attention_similarity(model, calibration_text(model_name, model, tokenizer, 4, tokens))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"given": given, "similarity": similarity})
    return similarity


__all__ = ["attention_similarity", "calibration_similarity"]

"""A one-layer Llama whose only skill is retrieval: every query attends to the one "needle" token of its
context and the model answers that needle's partner token. Its answer_nll is near 0 when a plan keeps the
needle's position and near log(vocabulary) when the plan drops it: a workload whose plans must differ.

Weights by hand (hidden = head dim = 64, one head):
  embedding     token t: one-hot at dim t, dim 40 = 1 (every token), dim 41 = 1 for needles (20..29)
  attention     query dim 31 <- dim 40, key dim 31 <- dim 41 (the last RoPE pair, whose frequency a huge
                rope_theta makes ~0: the score ignores positions); value = the one-hot, output x 20
  MLP           zero
  lm head       a needle n (one-hot dim n) gives its partner n - 10 (an answer token, never a needle)
"""

from __future__ import annotations

import random

import torch

VOCAB, HIDDEN = 32, 64
NEEDLES = range(20, 30)
FILLER = range(0, 10)


def needle_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=4,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=HIDDEN,
        max_position_embeddings=1024,
        rope_theta=1e12,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        for norm in (
            model.model.norm,
            model.model.layers[0].input_layernorm,
            model.model.layers[0].post_attention_layernorm,
        ):
            norm.weight.fill_(1.0)
        embed = model.model.embed_tokens.weight
        for t in range(VOCAB):
            embed[t, t] = 1.0
            embed[t, 40] = 1.0
        for n in NEEDLES:
            embed[n, 41] = 1.0
        attention = model.model.layers[0].self_attn
        attention.q_proj.weight[31, 40] = 2.0
        attention.k_proj.weight[31, 41] = 2.0
        for t in range(VOCAB):
            attention.v_proj.weight[t, t] = 1.0
            attention.o_proj.weight[t, t] = 20.0
        for n in NEEDLES:
            model.lm_head.weight[n - 10, n] = 1.0
    return model


def needle_questions(count: int, length: int = 200, answer: int = 4, seed: int = 0, at: int = 8):
    """Prompts of filler with one needle at position `at`; the gold answer is its partner, `answer` times."""
    from polykv.eval.suites.answers import AnswerSample

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        needle = rng.choice(NEEDLES)
        prompt = [0] + [rng.choice(FILLER) for _ in range(length - 1)]
        prompt[at] = needle
        out.append(AnswerSample(prompt, [needle - 10] * answer, answer))
    return out

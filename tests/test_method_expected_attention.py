"""ExpectedAttention (Devoto et al., 2025; kvpress's `ExpectedAttentionPress`): the tokens future queries are
expected to attend to stay, scored from the prompt's query statistics; prefill only."""

from __future__ import annotations

import math

import pytest
import torch

from polykv.methods import REGISTRY, validate_plan
from polykv.methods.attention_free.expected_attention import ExpectedAttention, average_rotation
from polykv.models import cache_argument_name, output_cache
from polykv.plan import Phase, Plan, PlanError
from polykv.runtime import routed
from polykv.runtime.rotary import queries_before_rope, rotaries_known, rotary_of
from tests.helpers import kept, layer_view, prompt, tiny_model


def no_rotation(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(len(positions), 4), torch.zeros(len(positions), 4)


def test_the_prompt_keeps_the_sinks_and_the_highest_expected_attention_times_value_norm():
    # One KV head, one query head, d = 4, no rotation. Every query after the sink is (1, 0, 0, 0): mean
    # (1, 0, 0, 0), no covariance. Key i is (a_i, 0, 0, 0), so its logit is a_i / sqrt(4) = a_i / 2.
    a = [9.0, 0.0, 2.0, 4.0, 2.0]
    keys = torch.zeros(1, 5, 4)
    keys[0, :, 0] = torch.tensor(a)
    values = torch.zeros(1, 5, 4)
    values[0, :, 1] = torch.tensor([1.0, 1.0, 1.0, 1.0, 3.0])  # value norms
    view = layer_view(keys=keys, values=values, phase=Phase.PREFILL)
    view.fresh, view.newest = True, 4
    view.queries = torch.zeros(1, 1, 5, 4)
    view.queries[..., 0] = 1.0
    view.queries[0, 0, 0] = torch.tensor([50.0, -3.0, 7.0, 1.0])  # the sink's query is left out
    view.rotary = no_rotation
    method = ExpectedAttention(3, {"n_sink": 1})
    # by hand: softmax over slots 1..4 of (0, 1, 2, 1), times the value norms (1, 1, 1, 3)
    e = [math.exp(x) for x in (0.0, 1.0, 2.0, 1.0)]
    expected = [x / sum(e) * n for x, n in zip(e, (1, 1, 1, 3))]
    scores = method.scores(view)
    assert scores[0, 0, 1:].tolist() == pytest.approx(expected, rel=1e-6)
    assert scores[0, 0, 0] > max(expected)  # the sink above everything
    assert kept(method.step(view), 5) == [[0, 3, 4]]  # slot 4 (0.590) and 3 (0.534) beat 2 and 1


def test_the_covariance_adds_half_the_quadratic_form_over_d():
    # queries (1, +-1, 0, 0) after the sink: mean (1, 0, 0, 0), covariance diag(0, 1, 0, 0)
    keys = torch.tensor([[[0.0, 0, 0, 0], [2, 0, 0, 0], [0, 4, 0, 0]]])
    view = layer_view(keys=keys, values=torch.ones(1, 3, 4), phase=Phase.PREFILL)
    view.fresh, view.newest, view.rotary = True, 4, no_rotation
    view.queries = torch.tensor([[[[9.0, 9, 9, 9], [1, 1, 0, 0], [1, -1, 0, 0], [1, 1, 0, 0], [1, -1, 0, 0]]]])
    # logits: key 1: 2/2 + 0 = 1; key 2: 0 + 16 * 1 / 4 / 2 = 2 (slot 0 is the sink)
    with_cov = ExpectedAttention(2, {"n_sink": 1, "use_vnorm": False}).scores(view)
    assert with_cov[0, 0, 1:].tolist() == pytest.approx(torch.softmax(torch.tensor([1.0, 2.0]), 0).tolist())
    without = ExpectedAttention(2, {"n_sink": 1, "use_vnorm": False, "use_covariance": False}).scores(view)
    assert without[0, 0, 1:].tolist() == pytest.approx(torch.softmax(torch.tensor([1.0, 0.0]), 0).tolist())


def test_queries_before_rope_undo_the_models_rotation_and_the_average_rotation_is_the_mean_matrix():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = tiny_model("llama")
    attention = model.model.layers[0].self_attn
    queries = torch.randn(1, 4, 6, 16, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(10, 16)
    with rotaries_known(model):
        rotary = rotary_of(attention, queries)
        cos, sin = rotary(positions)
        rotated, _ = apply_rotary_pos_emb(queries, queries, cos[None], sin[None])
        assert torch.allclose(queries_before_rope(rotated, positions, rotary), queries, atol=1e-6)
        average = average_rotation(rotary, 100, 7, 16, "cpu")
        x = torch.randn(16, generator=torch.Generator().manual_seed(1))
        # R x averaged: the mean over the 7 positions of x rotated at each
        each = [
            apply_rotary_pos_emb(x[None, None, None], x[None, None, None], *rotary(torch.tensor([p]))[:][0:2])[0]
            for p in range(100, 107)
        ]
        assert torch.allclose(average @ x, torch.stack(each).mean(0).flatten(), atol=1e-6)
    assert rotary_of(attention, queries) is None  # outside a block nothing is kept


def kvpress_scores(module, rotary_emb, hidden, keys, values, n_sink=4, n_future=512, layer_type=None):
    """kvpress's ExpectedAttentionPress.score, restated: the queries projected again from the hidden states."""
    b, q_len, _ = hidden.shape
    heads, d = module.config.num_attention_heads, module.head_dim
    h = hidden[:, n_sink:]
    q = module.q_proj(h).view(b, h.shape[1], heads, d).transpose(1, 2)
    if hasattr(module, "q_norm"):
        q = module.q_norm(q)
    mu = q.mean(dim=2, keepdim=True)
    centred = q - mu
    cov = torch.einsum("bnsi,bnsj->bnij", centred, centred) / h.shape[1]
    mu = mu.squeeze(2)
    ids = torch.arange(q_len, q_len + n_future).unsqueeze(0)
    cos, sin = rotary_emb(mu, ids) if layer_type is None else rotary_emb(mu, ids, layer_type)
    cos, sin = cos[0], sin[0]
    eye, pairs = torch.eye(d), torch.zeros(d, d)
    pairs[d // 2 :, : d // 2], pairs[: d // 2, d // 2 :] = torch.eye(d // 2), -torch.eye(d // 2)
    r = (cos.unsqueeze(1) * eye + sin.unsqueeze(1) * pairs).mean(dim=0)
    mu, cov = mu @ r.T, r @ (cov @ r.T)
    keys, values = keys[:, :, n_sink:], values[:, :, n_sink:]
    g = heads // keys.shape[1]
    kt = keys.repeat_interleave(g, dim=1).transpose(2, 3)
    s = (mu.unsqueeze(2) @ kt).squeeze(2) / math.sqrt(d) + torch.einsum("bhin,bhij,bhjn->bhn", kt, cov, kt) / d / 2
    s = torch.softmax(s, dim=-1).view(b, keys.shape[1], g, -1).mean(2) * values.norm(dim=-1)
    return torch.nn.functional.pad(s, (n_sink, 0), value=s.max().item() + 1)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_on_a_model_the_prompt_keeps_what_kvpress_keeps_in_every_layer_and_head(family):
    """kvpress's computation, restated: the queries projected again from each layer's input; PolyKV turns the rotated
    queries back. The kept positions agree in every global layer and KV head (Qwen 3's q_norm included; on Gemma 3
    the restatement rotates by the layer's own embedding, as PolyKV does: kvpress itself fails there)."""
    model = tiny_model(family, max_position_embeddings=1024)
    ids = prompt(model, length=40)
    hidden = {}
    hooks = [
        layer.self_attn.register_forward_pre_hook(
            lambda m, a, kw, i=i: hidden.__setitem__(i, kw["hidden_states"]), with_kwargs=True
        )
        for i, layer in enumerate(model.model.layers)
    ]
    with torch.no_grad():
        full = output_cache(model(ids, use_cache=True))
    for hook in hooks:
        hook.remove()
    plan = Plan.homogeneous("expected_attention", 14, model.config.num_hidden_layers, "prefill")
    with torch.no_grad(), routed(model, plan) as session:
        model(ids, use_cache=True, **{cache_argument_name(model): session.new_cache()})
    types = getattr(model.config, "layer_types", None)
    compared = 0
    for i, (layer, full_layer) in enumerate(zip(session.cache.layers, full.layers)):
        if types and types[i] != "full_attention":
            assert layer.positions.shape[-1] <= model.config.sliding_window  # a local layer within its window
            continue
        module = model.model.layers[i].self_attn
        with torch.no_grad():
            scores = kvpress_scores(
                module,
                model.model.rotary_emb,
                hidden[i],
                full_layer.keys,
                full_layer.values,
                layer_type=types[i] if family == "gemma3" else None,
            )
        expected = scores.topk(14, dim=-1).indices.sort(-1).values
        assert torch.equal(layer.positions.sort(-1).values, expected), i
        compared += 1
    assert compared >= 1


def test_looking_past_the_models_positions_leaves_a_dynamic_rope_as_it_was():
    """transformers' dynamic RoPE grows its frequencies in place for positions past its cached length: the 512
    future positions must not change the model, and the compression is the same as on a fresh copy."""
    config = dict(max_position_embeddings=64, rope_parameters={"rope_type": "dynamic", "factor": 2.0})
    model = tiny_model("llama", **config)
    ids = prompt(model, length=40)
    embedding = model.model.rotary_emb
    before = (embedding.inv_freq.clone(), embedding.attention_scaling, embedding.max_seq_len_cached)
    plan = Plan.homogeneous("expected_attention", 12, model.config.num_hidden_layers, "prefill")
    kept = []
    for _ in range(2):  # twice: the second prompt sees what the first left
        with torch.no_grad(), routed(model, plan) as session:
            model(ids, use_cache=True, **{cache_argument_name(model): session.new_cache()})
        assert torch.equal(embedding.inv_freq, before[0]) and embedding.attention_scaling == before[1]
        assert embedding.max_seq_len_cached == before[2]
        kept.append([layer.positions.clone() for layer in session.cache.layers])
    assert all(torch.equal(a, b) for a, b in zip(*kept))


def test_it_is_refused_in_decode_in_one_line():
    assert REGISTRY["expected_attention"] is ExpectedAttention and ExpectedAttention.phases == frozenset(
        {Phase.PREFILL}
    )
    plan = Plan.homogeneous("expected_attention", 64, 2, "decode")
    with pytest.raises(PlanError) as refused:
        validate_plan(plan, 2)
    assert "expected_attention" in str(refused.value) and "decode" in str(refused.value)
    assert len(str(refused.value).splitlines()) == 1

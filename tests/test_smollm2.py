"""The runtime on a real grouped-query model: SmolLM2-135M-Instruct (`smollm2`: 30 layers, 9 query heads over 3
KV heads), loaded once per test session from its converted copy. Slow (CI runs them): a prompt of a few
hundred tokens costs this model about a second, a decode step about 0.1 s."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from polykv.eval.suites import ruler
from polykv.methods import REGISTRY, params_that_fit
from polykv.methods.attention.snapkv import pool_votes
from polykv.methods.base import LayerView
from polykv.models import cache_argument_name
from polykv.plan import Phase, Plan
from polykv.profile.corpus import CorpusSpec, build_corpus
from polykv.runtime import routed
from tests.helpers import REPO, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("two_threads")]

LAYERS = 30


@pytest.fixture(scope="module")
def texts(smollm2):
    """Four prompts of 256 tokens: prose, jargon, Python source, and a chat-templated question."""
    model, tokenizer = smollm2
    spec = CorpusSpec(sources=("kjv", "jargon", "stdlib"), num_sequences=3, max_tokens=256, split="evaluation")
    prompts = build_corpus(tokenizer, spec, model=model).sequences
    question = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Explain in a few sentences why the sky is blue. " * 30}],
        add_generation_prompt=True,
        tokenize=False,
    )
    chat = tokenizer(question, add_special_tokens=False).input_ids
    assert len(chat) >= 256
    return torch.tensor([*(p[:256] for p in prompts), chat[-256:]])


def test_a_fullkv_plan_generates_what_vanilla_generates(smollm2, texts):
    model, _ = smollm2
    kwargs = dict(
        max_new_tokens=64, min_new_tokens=64, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    with torch.no_grad():
        vanilla = model.generate(texts, attention_mask=torch.ones_like(texts), **kwargs)
        prompt_logits = model(texts).logits
        with routed(model, Plan.homogeneous("full", None, LAYERS)):
            under_plan = model.generate(texts, attention_mask=torch.ones_like(texts), **kwargs)
            plan_prompt_logits = model(texts).logits
    assert torch.equal(vanilla.sequences, under_plan.sequences)  # the same 64 greedy tokens, 4 prompts
    assert (prompt_logits - plan_prompt_logits).abs().max() <= 1e-5  # prefill, every position
    steps = [(a - b).abs().max().item() for a, b in zip(vanilla.logits, under_plan.logits)]
    assert len(steps) == 64 and max(steps) <= 1e-5  # decode, every step


def _room_for_everything(length: int) -> list[Plan]:
    plans = []
    for name, cls in REGISTRY.items():
        for phase in sorted(cls.phases, key=str) if name != "full" else ():
            plans.append(Plan.homogeneous(name, length, LAYERS, phase.value, params=params_that_fit(name, length)))
    # PyramidKV and CAKE keep a prompt that fits the average budget whole, as their authors do. D2O splits
    # the total in proportion to softmax(-sigma) over layers with sigma in [0, 1], so its smallest share is
    # at least 1/e of the average: three times the length gives every layer room for everything.
    native = (("pyramidkv", "prefill", length), ("cake", "prefill", length), ("d2o", "decode", 3 * length))
    for name, scope, room in native:
        plans.append(Plan.homogeneous(name, room, LAYERS, scope, allocation="native"))
    return plans


def test_every_method_with_room_for_everything_equals_fullkv(smollm2, texts):
    model, _ = smollm2
    ids = texts[:1, :128]
    steps = 12
    kwargs = dict(max_new_tokens=steps, min_new_tokens=steps, do_sample=False, output_logits=True)
    with torch.no_grad():
        reference = model.generate(ids, return_dict_in_generate=True, **kwargs)
        for plan in _room_for_everything(ids.shape[1] + steps):
            with routed(model, plan) as session:
                out = model.generate(ids, return_dict_in_generate=True, **kwargs)
            assert torch.equal(out.sequences, reference.sequences), plan.name
            worst = max((a - b).abs().max().item() for a, b in zip(out.logits, reference.logits))
            # nothing is evicted and the tokens are the same; a method that scores with attention weights
            # computes its rows with an explicit softmax rather than the fused kernel, so 30 layers of float32
            # rounding reach ~7e-5 on logits of magnitude ~20 (relative ~4e-6)
            assert worst <= 2e-4, (plan.name, worst)
            assert session.cache.retained_per_layer() == [ids.shape[1] + steps - 1] * LAYERS, plan.name


# ---- each method's rule on real layers -----------------------------------------------------------------
def _real_views(model, ids: torch.Tensor, layers: tuple[int, ...]) -> dict[int, LayerView]:
    """The prompt's view of each layer as a method sees it at the end of prefill: keys and values after RoPE,
    and the causal attention of every query (eager attention, fp32) for its rows and column sums."""
    from transformers import DynamicCache

    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            out = model(ids, use_cache=True, output_attentions=True, **{cache_argument_name(model): cache})
    finally:
        model.set_attn_implementation("sdpa")
    views = {}
    n = ids.shape[1]
    for layer in layers:
        attention = out.attentions[layer].float()  # [1, 9, n, n]
        views[layer] = LayerView(
            phase=Phase.PREFILL,
            keys=cache.layers[layer].keys,
            values=cache.layers[layer].values,
            positions=torch.arange(n).expand(1, 3, n),
            num_new=n,
            num_kv_groups=3,
            rows=attention,
            column_sums=attention.sum(dim=2),
        )
    return views


def _group_mean(scores: torch.Tensor) -> torch.Tensor:
    """[1, 9, n] query-head scores -> [1, 3, n], each KV head the mean of its 3 query heads."""
    return scores.view(1, 3, 3, -1).mean(dim=2)


def _top(scores: torch.Tensor, k: int) -> list[set[int]]:
    return [set(row.topk(k).indices.tolist()) for row in scores[0]]


def _is_top(kept: set[int], scores: torch.Tensor, k: int) -> bool:
    """Whether `kept` is a top-k of one row of scores. Max pooling spreads a peak over its neighbours, so
    equal scores at the k-th place are common and either choice follows the rule; a score 1e-6 (relative)
    apart counts as equal, for the float rounding of a grouped sum against a mean."""
    if len(kept) != k:
        return False
    inside = scores[sorted(kept)].min()
    outside = [i for i in range(scores.shape[-1]) if i not in kept]
    if not outside:
        return True
    best_left_out = scores[outside].max()
    return bool(inside >= best_left_out - 1e-6 * best_left_out.abs().clamp(min=1e-30))


def _references(view: LayerView, capacity: int) -> dict[str, list[set[int]]]:
    """Each rule restated from its paper (and docstring), on the real signals: the kept positions per KV head."""
    n = view.length
    recent = lambda count: set(range(n - count, n))  # noqa: E731
    out = {"streamingllm": [set(range(4)) | recent(capacity - 4)] * 3}
    out["knorm"] = _top(-view.keys.float().norm(dim=-1), capacity)
    heavy = round(0.5 * capacity)
    sums = _group_mean(view.column_sums).clone()
    sums[..., n - (capacity - heavy) :] = float("inf")
    out["h2o"] = _top(sums, capacity)
    last = view.rows[:, :, -1, :].mean(dim=1, keepdim=True)  # one index set for every KV head
    out["tova"] = _top(last, capacity) * 3
    return out


def _pooled_window_votes(view: LayerView, window: int) -> torch.Tensor:
    """SnapKV's and PyramidKV's scores restated: the window's summed votes for the prefix, max-pooled
    (kernel 7) along positions, per KV head [3, n - window]."""
    votes = _group_mean(view.rows[:, :, -window:, :].sum(dim=2))[..., : view.length - window]
    return torch.nn.functional.max_pool1d(votes.reshape(3, 1, -1), 7, stride=1, padding=3).reshape(3, -1)


def _as_the_runtime_gives(method, view: LayerView) -> LayerView:
    """The view with only the attention rows the method asks for (the newest queries), as the runtime
    computes them: a window rule given all n rows would sum every query of the prompt."""
    needs = method.needs(Phase.PREFILL, view.length)
    rows = view.rows[:, :, view.length - needs.rows :, :] if needs.rows else None
    return dataclasses.replace(view, rows=rows, column_sums=view.column_sums if needs.column_sums else None)


def test_each_method_keeps_what_its_rule_keeps_on_real_layers(smollm2, texts):
    model, _ = smollm2
    ids = texts[:1, :200]
    capacity = 64
    views = _real_views(model, ids, (0, 14, 29))
    assert torch.equal(pool_votes(torch.ones(1, 1, 5), 3, "max"), torch.ones(1, 1, 5))  # the pooling restated
    for layer, view in views.items():
        expected = _references(view, capacity)
        for name, reference in expected.items():
            method = REGISTRY[name](capacity, params_that_fit(name, capacity))
            eviction = method.step(_as_the_runtime_gives(method, view))
            kept = [set(row.tolist()) for row in eviction.keep[0]]
            assert kept == reference, (name, layer)
        for name, window in (("snapkv", 32), ("pyramidkv", 8)):
            method = REGISTRY[name](capacity, params_that_fit(name, capacity))
            kept = [set(row.tolist()) for row in method.step(_as_the_runtime_gives(method, view)).keep[0]]
            pooled = _pooled_window_votes(view, window)
            window_slots = set(range(view.length - window, view.length))
            for head, keep in enumerate(kept):
                assert window_slots <= keep, (name, layer, head)
                assert _is_top(keep - window_slots, pooled[head], capacity - window), (name, layer, head)
        # the other methods: the capacity, and what their rule always keeps
        for name in ("cake", "scissorhands"):
            method = REGISTRY[name](capacity, params_that_fit(name, capacity))
            kept = [set(row.tolist()) for row in method.step(_as_the_runtime_gives(method, view)).keep[0]]
            always = 32 if name == "cake" else 10  # CAKE's window, Scissorhands' recent tokens
            assert all(len(k) == capacity and set(range(200 - always, 200)) <= k for k in kept), (name, layer)


def test_decode_methods_follow_their_rule_on_real_layers(smollm2, texts):
    # After a full prefill, a decode-phase method cuts the prompt at its first step; D2O and H2O keep the
    # heavy hitters of the prompt's accumulated attention plus the newest tokens, CaM and StreamingLLM the
    # sinks and the newest tokens (what they merge is checked in their own tests).
    model, _ = smollm2
    ids = texts[:1, :200]
    capacity = 64
    with torch.no_grad():
        for name in ("h2o", "d2o", "cam", "streamingllm"):
            plan = Plan.homogeneous(name, capacity, LAYERS, "decode", params=params_that_fit(name, capacity))
            with routed(model, plan) as session:
                model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)
            for layer in session.cache.layers:
                held = [set(row.tolist()) for row in layer.positions[0]]
                assert all(len(h) == capacity and {199, 200} <= h for h in held), (name, layer.layer_idx)
                if name in ("cam", "streamingllm", "d2o"):
                    assert all({0, 1, 2, 3} <= h for h in held), (name, layer.layer_idx)  # the sinks


def test_ruler_niah_single_1_at_1k_with_fullkv_scores_at_least_90(smollm2):
    # A property of FullKV, the suite and the chat template together, not a claim about any method.
    model, tokenizer = smollm2
    settings = ruler.RulerSettings(tasks=("niah_single_1",), length=1024, samples_per_task=10)
    samples = ruler.build_samples(tokenizer, model, settings, seed=0)
    assert ruler.uses_chat_template(tokenizer, settings) and len(samples) == 10
    assert all(payload["prompt_ids"][0] == tokenizer.convert_tokens_to_ids("<|im_start|>") for _, _, payload in samples)
    full = Plan.homogeneous("full", None, LAYERS)
    scores = [ruler.score_sample(model, full, payload, settings).metrics["score"] for _, _, payload in samples]
    assert sum(scores) / len(scores) >= 90, scores


def test_generate_with_a_shipped_30_layer_plan_prints_text_and_the_cache(smollm2_home):
    result = run_cli(
        "generate",
        "--model",
        "smollm2",
        "--plan",
        str(REPO / "plans" / "smollm2" / "mixed.json"),
        "--prompt",
        "Once upon a time, in a quiet village by the sea,",
        cwd=REPO,
        env={**os.environ, "POLYKV_HOME": str(smollm2_home)},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "layer  prefill" in result.stdout and result.stdout.count("\n") > 30  # a row per layer

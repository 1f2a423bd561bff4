"""The runtime on a model whose layers differ by architecture: Gemma 3 270M (`gemma3`: 18 layers, a global layer
after every five local ones with a 512-token sliding window, one KV head of 4 query heads). Slow (CI runs them):
a 4K-token prompt costs this model about 10 s on two cores."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import DynamicCache

from polykv.eval.suites import answers
from polykv.methods import REGISTRY, params_that_fit
from polykv.models import cache_argument_name, layer_windows
from polykv.plan import Plan
from polykv.profile.corpus import CorpusSpec, build_corpus
from polykv.runtime import routed
from polykv.runtime.many_plans import many
from tests.helpers import REPO, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("two_threads")]

LAYERS, WINDOW = 18, 512
# Measured: a `full` plan's logits equal vanilla's bit for bit at 1.5K and 4K tokens (the same kernels on the
# same slots); the bound leaves room for a BLAS that rounds a different shape differently.
FULL_TOLERANCE = 1e-4
# Many plans in one batch against each alone: a batch's products round differently (measured: at most 6.8e-5).
BATCH_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def prose(gemma3):
    """4,096 tokens of public-domain prose (the evaluation split: no calibration text)."""
    _, tokenizer = gemma3
    spec = CorpusSpec(sources=("kjv",), num_sequences=1, max_tokens=4096, split="evaluation")
    return torch.tensor(build_corpus(tokenizer, spec).sequences[0][:4096])


def test_the_model_is_hybrid_as_its_config_says(gemma3):
    model, tokenizer = gemma3
    windows = layer_windows(model)
    assert len(windows) == LAYERS and [i for i, w in enumerate(windows) if w is None] == [5, 11, 17]
    assert {w for w in windows if w is not None} == {WINDOW}
    assert not tokenizer.chat_template  # a base model: RULER's base template


@pytest.mark.parametrize("length", [1536, 4096])
def test_a_fullkv_plan_generates_what_vanilla_generates_past_the_window(gemma3, prose, length):
    model, _ = gemma3
    ids = prose[None, :length]
    kwargs = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        vanilla = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        with routed(model, Plan.homogeneous("full", None, LAYERS)) as session:
            under_plan = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    assert torch.equal(vanilla.sequences, under_plan.sequences)
    worst = max((a - b).abs().max().item() for a, b in zip(vanilla.logits, under_plan.logits))
    assert worst <= FULL_TOLERANCE
    # the local layers hold what transformers' sliding-window cache holds: the window less the coming token
    for layer, window in zip(session.cache.layers, layer_windows(model)):
        assert layer.retained == (length + 3 if window is None else window - 1)


def every_method_plan(capacity: int) -> list[Plan]:
    plans = []
    for name, cls in REGISTRY.items():
        for phase in sorted(cls.phases, key=str) if name != "full" else ():
            plans.append(Plan.homogeneous(name, capacity, LAYERS, phase.value, params=params_that_fit(name, capacity)))
    return plans


def test_every_method_runs_alone_and_batched_and_no_local_layer_outgrows_its_window(gemma3, prose):
    # capacity 384: below the window (a local layer evicts within it) and the prompt (so do the global layers)
    model, _ = gemma3
    plans, prompt, steps = every_method_plan(384), 560, 4
    tokens = prose[: prompt + steps]
    windows = layer_windows(model)
    name = cache_argument_name(model)
    with torch.no_grad(), many(model, plans) as session:
        batch, first = session.prefill(tokens[:prompt])
        together = [[first] * len(plans)]
        for t in range(prompt, len(tokens)):
            together.append(list(batch.step([int(tokens[t])] * len(plans))))
    for i, plan in enumerate(plans):
        with torch.no_grad(), routed(model, plan) as alone:
            logits = [model(tokens[None, :prompt], use_cache=True, logits_to_keep=1).logits[0, -1]]  # 262K vocab
            held = [alone.cache.retained_per_layer()]
            for t in range(prompt, len(tokens)):
                logits.append(model(tokens[None, t : t + 1], use_cache=True, **{name: alone.cache}).logits[0, -1])
                held.append(alone.cache.retained_per_layer())
        worst = max((together[s][i] - logits[s]).abs().max().item() for s in range(len(logits)))
        assert worst <= BATCH_TOLERANCE, f"{plan.name}: batched differs from alone by {worst}"
        for step in held:
            local = [n for n, w in zip(step, windows) if w is not None]
            assert max(local) <= WINDOW - 1, f"{plan.name}: a local layer holds {max(local)} slots"


def test_answer_nll_of_fullkv_is_the_vanilla_teacher_forced_nll(gemma3, prose):
    model, _ = gemma3
    ids = prose[:1024].tolist()
    question = answers.AnswerSample(ids[:1000], ids[1000:1016], max_new_tokens=16)
    full = Plan.homogeneous("full", None, LAYERS)
    routed_nll = answers.answer_alone(model, full, question, "score").nll
    name = cache_argument_name(model)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        out = model(torch.tensor([question.prompt_ids]), use_cache=True, logits_to_keep=1, **{name: cache})
        cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
        logits = [out.logits[0, -1]]
        for token in question.answer_ids[:-1]:
            out = model(torch.tensor([[token]]), use_cache=True, **{name: cache})
            logits.append(out.logits[0, -1])
    nll = [float(-torch.log_softmax(row.double(), -1)[t]) for row, t in zip(logits, question.answer_ids)]
    assert routed_nll == pytest.approx(sum(nll) / len(nll), abs=1e-6)


def test_plan_show_on_gemma3_lists_local_and_global_layers_and_the_kv_they_keep(gemma3_home):
    result = run_cli(
        "plan",
        "show",
        str(REPO / "plans" / "gemma3" / "tova-both-256.json"),
        "--model",
        "gemma3",
        "--tokens",
        "4096",
        cwd=REPO,
        env={**os.environ, "POLYKV_HOME": str(gemma3_home)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "18 layers, 15 local (sliding window) and 3 global" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if line[:1].isdigit()]
    assert [r[1] for r in rows] == ["local" if i % 6 != 5 else "global" for i in range(LAYERS)]
    # TOVA keeps 256 everywhere; FullKV keeps the window less one in a local layer and the whole prompt in a global
    assert all(r[-2:] == (["256", "4096"] if r[1] == "global" else ["256", "511"]) for r in rows)
    # 18 x 256 tokens of 2 x 256 float32 numbers: 9 MiB, against FullKV's 15 x 511 + 3 x 4096 tokens
    assert "total: 4,608 of FullKV's 19,953 token-layers (9.0 MiB of 39.0 MiB), 23.1%" in result.stdout


def test_a_homogeneous_plan_on_gemma3_says_what_its_budget_counts(gemma3_home, tmp_path):
    result = run_cli(
        *("plan", "homogeneous", "tova", "--capacity", "512", "--scope", "prefill", "--model", "gemma3"),
        *("-o", str(tmp_path / "tova.json")),
        cwd=REPO,
        env={**os.environ, "POLYKV_HOME": str(gemma3_home)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    # 18 x 512 as written; the 15 local layers hold at most 511 of theirs
    assert "the capacities as written add up to 9,216 (512 a layer)" in result.stdout
    assert "the plan holds at most 9,201 token-layers" in result.stdout
    assert "capacity 512 keeps the window there (at most 511 tokens)" in result.stdout


def test_generate_with_gemma3_runs_its_shipped_plan_and_marks_each_layer(gemma3_home):
    result = run_cli(
        "generate",
        "--model",
        "gemma3",
        "--prompt",
        "The capital of France is",
        "--max-new-tokens",
        "8",
        cwd=REPO,
        env={**os.environ, "POLYKV_HOME": str(gemma3_home)},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "plan: mixed-gemma3" in result.stdout  # plans/gemma3/mixed.json: no --plan needed
    assert result.stdout.count("local 512") == 15 and result.stdout.count("global") == 3

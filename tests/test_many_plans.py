"""Many plans on one prompt (`polykv.runtime.many_plans`): each plan's row of the batch gives what the plan gives
alone under `routed()`, for every method and phase (and native allocation), on every model family."""

from __future__ import annotations

import collections

import pytest
import torch

from polykv.eval.results.store import Store
from polykv.eval.running.suite_runner import run_suite, run_suites
from polykv.eval.suites import fidelity, ruler
from polykv.eval.suites.ruler import RulerSettings
from polykv.methods import REGISTRY, params_that_fit
from polykv.models import cache_argument_name
from polykv.models.support import eos_ids, greedy_needs_generate
from polykv.plan import Phase, Plan
from polykv.runtime import routed
from polykv.runtime.many_plans import generate_many, many
from tests.helpers import TINY_FIDELITY, tiny_model

CAPACITY, PROMPT, STEPS = 16, 48, 12


def every_plan(layers: int) -> list[Plan]:
    """Every method in every phase it runs in, the native-allocation rules, FullKV, and a mixed plan."""
    plans = [Plan.homogeneous("full", None, layers)]
    for name, cls in REGISTRY.items():
        for phase in sorted(cls.phases, key=str) if name != "full" else ():
            plans.append(Plan.homogeneous(name, CAPACITY, layers, phase.value, params=params_that_fit(name, CAPACITY)))
    for name, scope in (("pyramidkv", "prefill"), ("cake", "prefill"), ("d2o", "decode")):
        params = params_that_fit(name, CAPACITY)
        plans.append(Plan.homogeneous(name, CAPACITY, layers, scope, params=params, allocation="native"))
    mixed = [
        {"prefill": {"method": m, "capacity": CAPACITY, "params": params_that_fit(m, CAPACITY)}}
        for m in ("snapkv", "h2o", "tova")
    ]
    plans.append(Plan.from_dict({"name": "mixed", "scope": "prefill", "layers": mixed[:layers]}))
    return plans


def distinct_tokens(model, count: int, seed: int = 0) -> torch.Tensor:
    """Distinct token ids: no two slots with equal keys, so no method meets an exact tie (a tie is decided by
    the last bit of rounding, which a batch changes)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(model.config.vocab_size - 3, generator=g)[:count] + 3


def alone(model, plan: Plan, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Teacher-forced logits under the plan alone: the prompt's last position, then after each later token."""
    name = cache_argument_name(model)
    with torch.no_grad(), routed(model, plan) as session:
        out = model(tokens[None, :PROMPT], use_cache=True)
        logits = [out.logits[0, -1]]
        for t in range(PROMPT, len(tokens)):
            logits.append(model(tokens[None, t : t + 1], use_cache=True, **{name: session.cache}).logits[0, -1])
    return logits


def _each_as_alone(model, plans: list[Plan], tokens: torch.Tensor) -> None:
    """Each plan's row of one batch fed `tokens` gives its logits alone within 1e-4, at the prompt and every step."""
    with torch.no_grad(), many(model, plans) as session:
        batch, first = session.prefill(tokens[:PROMPT])
        together = [[first] * len(plans)]
        for t in range(PROMPT, len(tokens)):
            together.append(list(batch.step([int(tokens[t])] * len(plans))))
    for i, plan in enumerate(plans):
        reference = alone(model, plan, tokens)
        worst = max((together[s][i] - reference[s]).abs().max().item() for s in range(len(reference)))
        assert worst < 1e-4, f"{plan.name}: {worst}"


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral", "gemma3"])
def test_every_plan_in_one_batch_gives_what_it_gives_alone(family):
    model = tiny_model(family, max_position_embeddings=256, vocab_size=128)
    plans = every_plan(model.config.num_hidden_layers)
    tokens = distinct_tokens(model, PROMPT + STEPS)
    _each_as_alone(model, plans, tokens)


def test_a_batch_keeps_each_plans_slots_and_positions_after_every_step():
    model = tiny_model("llama", max_position_embeddings=256, vocab_size=128)
    plans = every_plan(model.config.num_hidden_layers)
    tokens = distinct_tokens(model, PROMPT + STEPS, seed=3)
    with torch.no_grad(), many(model, plans) as session:
        batch, _ = session.prefill(tokens[:PROMPT])
        for t in range(PROMPT, len(tokens)):
            batch.step([int(tokens[t])] * len(plans))
        together = [[sorted(layer.positions[0, 0].tolist()) for layer in cache.layers] for cache in batch.caches]
    for plan, held in zip(plans, together):
        name = cache_argument_name(model)
        with torch.no_grad(), routed(model, plan) as session:
            model(tokens[None, :PROMPT], use_cache=True)
            for t in range(PROMPT, len(tokens)):
                model(tokens[None, t : t + 1], use_cache=True, **{name: session.cache})
        assert held == [sorted(layer.positions[0, 0].tolist()) for layer in session.cache.layers], plan.name


def test_rows_of_a_layer_attend_together_and_stay_in_their_shared_block(monkeypatch):
    from polykv.runtime import row_storage

    model = tiny_model("llama", max_position_embeddings=256, vocab_size=128)
    plans = every_plan(model.config.num_hidden_layers)
    tokens = distinct_tokens(model, PROMPT + STEPS, seed=5)
    attended, real = [], row_storage.attend_block
    monkeypatch.setattr(row_storage, "attend_block", lambda block, *a: attended.append(block) or real(block, *a))
    came_back = 0
    with torch.no_grad(), many(model, plans) as session:
        batch, _ = session.prefill(tokens[:PROMPT])
        batch.reserve(STEPS)
        for t in range(PROMPT, len(tokens)):
            layers = batch._cache.layers
            cut = {
                (r, i) for r, rows in enumerate(layers) if rows.shared for i in rows.shared.home if not _home(rows, i)
            }
            attended.clear()
            batch.step([int(tokens[t])] * len(plans))
            # most rows of every layer live in shared blocks (D2O and CaM merge in blocks of their own) and attend
            # there; a row cut at the last step (Scissorhands drops m at once) is back in its slice
            for rows in layers:
                assert len(rows.shared.home) >= len(plans) - 6
                for i, (block, _) in rows.shared.home.items():  # an evicting row's block is sized to its capacity,
                    if not rows.layers[i].methods[Phase.DECODE].passive:  # not to a prompt it held at first
                        assert block.size < PROMPT, plans[i].name
            if t > PROMPT:  # at the first step a decode-only plan still holds its prompt: it moves in after its cut
                assert {id(b) for b in attended} == {id(b) for rows in layers for b in rows.shared.blocks}
            came_back += sum(_home(layers[r], i) for r, i in cut)
    assert came_back > 0


def _home(rows, i) -> bool:
    """Does row i of a batched layer hold its keys and values in its slice of its shared block?"""
    block, row = rows.shared.home[i]
    return rows.layers[i].slots.kv_block is block.slice(row)


def test_generate_many_matches_generate_under_routed_and_rows_stop_at_their_own_end():
    model = tiny_model("llama", max_position_embeddings=256, vocab_size=128)
    plans = [p for p in every_plan(model.config.num_hidden_layers) if "knorm" not in p.name]
    prompt = distinct_tokens(model, PROMPT, seed=1)  # a prompt after which some plans end (token 2) early
    end = model.generation_config.eos_token_id
    together = generate_many(model, plans, prompt.tolist(), 10)
    for plan, tokens in zip(plans, together):
        with torch.no_grad(), routed(model, plan):
            out = model.generate(prompt[None], max_new_tokens=10, do_sample=False, pad_token_id=0)
        expected = out[0, PROMPT:].tolist()
        if end in expected:  # generate pads a finished row; its tokens end at the end token
            expected = expected[: expected.index(end) + 1]
        assert tokens == expected, plan.name
    lengths = {len(tokens) for tokens in together}
    assert 10 in lengths and min(lengths) < 10  # rows ended at their own step, the others ran on


def test_min_new_tokens_masks_the_end_token():
    model = tiny_model("llama", max_position_embeddings=256, vocab_size=128)
    prompt = distinct_tokens(model, PROMPT, seed=5)
    with torch.no_grad():
        first = model(prompt[None]).logits[0, -1].argmax().item()
    plans = [Plan.homogeneous("full", None, model.config.num_hidden_layers)]
    assert generate_many(model, plans, prompt.tolist(), 4, eos_token_id=first)[0] == [first]
    masked = generate_many(model, plans, prompt.tolist(), 4, eos_token_id=first, min_new_tokens=4)[0]
    assert len(masked) == 4 and first not in masked


def test_a_generation_config_with_logits_processors_is_run_plan_by_plan():
    model = tiny_model("llama")
    assert greedy_needs_generate(model) is None and eos_ids(model, [5, 7]) == {5, 7}
    model.generation_config.repetition_penalty = 1.3
    assert "repetition_penalty" in greedy_needs_generate(model)


def test_run_suites_stores_each_run_as_run_suite_does(tmp_path, demo_model):
    model, tokenizer = demo_model
    plans = [Plan.homogeneous(m, 16, 5, "decode", params=params_that_fit(m, 16)) for m in ("h2o", "tova", "cam")]
    plans.append(Plan.homogeneous("snapkv", 16, 5, "prefill", params=params_that_fit("snapkv", 16)))
    plans.append(Plan.homogeneous("full", None, 5))
    store = Store(tmp_path / "together.sqlite")
    seen = []
    ids = run_suites(
        store, "demo", model, tokenizer, plans, "fidelity", TINY_FIDELITY, progress=lambda *a: seen.append(a)
    )
    alone_store = Store(tmp_path / "alone.sqlite")
    for plan, run_id in zip(plans, ids):
        assert run_suite(alone_store, "demo", model, tokenizer, plan, "fidelity", TINY_FIDELITY) == run_id
        assert store.run(run_id).status == "finished"
        together, single = store.task_scores(run_id), alone_store.task_scores(run_id)
        assert together.keys() == single.keys()
        for task in together:
            for metric in ("kl", "top1", "ppl", "rougeL"):
                assert together[task][metric] == pytest.approx(single[task][metric], rel=1e-4, abs=1e-6), (
                    plan.name,
                    task,
                    metric,
                )
    assert [s[:2] for s in seen] == [(i + 1, len(seen)) for i in range(len(seen))]
    # asked again, every run is found finished: nothing is scored
    assert run_suites(store, "demo", model, tokenizer, plans, "fidelity", TINY_FIDELITY) == ids


@pytest.mark.slow  # RULER on the demo model, batched and alone
def test_ruler_scores_the_same_together_and_alone(demo_model):
    model, tokenizer = demo_model
    settings = RulerSettings(tasks=("niah_single_1", "fwe"), length=512, samples_per_task=1)
    plans = [Plan.homogeneous(m, 32, 5, "prefill", params=params_that_fit(m, 32)) for m in ("snapkv", "tova")]
    plans += [Plan.homogeneous("h2o", 32, 5, "decode"), Plan.homogeneous("full", None, 5)]
    for _, _, payload in ruler.build_samples(tokenizer, model, settings, seed=0):
        assert ruler.score_samples(model, plans, payload, settings) == [
            ruler.score_sample(model, plan, payload, settings) for plan in plans
        ]


def test_fidelity_scores_the_same_together_and_alone_with_unequal_lengths(demo_model):
    # More greedy tokens than teacher-forced steps, and the other way round: each half leaves on its own.
    model, tokenizer = demo_model
    plans = [Plan.homogeneous("tova", 16, 5, "both"), Plan.homogeneous("d2o", 16, 5, "decode")]
    for continuation, generate in ((4, 9), (9, 4)):
        settings = fidelity.FidelitySettings(
            tasks=("stories",), samples_per_task=1, prompt_tokens=80, continuation=continuation, generate=generate
        )
        (_, _, ids), *_ = fidelity.build_samples(tokenizer, model, settings, seed=0)
        together = fidelity.score_samples(model, plans, ids, settings)
        for plan, scores in zip(plans, together):
            single = fidelity.score_sample(model, plan, ids, settings)
            assert scores.metrics.keys() == single.metrics.keys()
            for metric, value in scores.metrics.items():
                assert value == pytest.approx(single.metrics[metric], rel=1e-4, abs=1e-6), (plan.name, metric)
            assert scores.kv_held == single.kv_held  # batched holds what alone holds
            entering = 16 if plan.scope.value == "both" else 80  # a decode-only plan holds the whole 80-token prompt
            assert scores.kv_held["entering"] == [entering] * 5 and scores.kv_held["seen_entering"] == 80


def _rows_dropping(model, plans, tokens, together: bool, monkeypatch) -> tuple[list, collections.Counter]:
    """Each plan's layers' keys, values, positions and H2O scores after every step of one batch; and how many rows
    of each method dropped together. `together` False: every row steps alone."""
    from polykv.runtime import row_storage

    if not together:
        monkeypatch.setattr(row_storage, "TOGETHER_AT_LEAST", 10**9)
    dropped, real = collections.Counter(), row_storage.drop_together

    def counting(block, members, cls, *args):
        dropped[cls.name] += len(members)
        return real(block, members, cls, *args)

    monkeypatch.setattr(row_storage, "drop_together", counting)
    states = []
    with torch.no_grad(), many(model, plans) as session:
        batch, _ = session.prefill(tokens[:PROMPT])
        for t in range(PROMPT, len(tokens)):
            batch.step([int(tokens[t])] * len(plans))
            states.append(
                [(lay.keys, lay.values, lay.positions, _score(lay)) for c in batch.caches for lay in c.layers]
            )
            states[-1] = [tuple(None if x is None else x.clone() for x in held) for held in states[-1]]
    monkeypatch.undo()
    return states, dropped


def _score(layer):
    return layer.methods[Phase.DECODE].per_token.get("score")


@pytest.mark.parametrize("heads", [4, 8], ids=["2 query heads per KV head", "8 query heads per KV head"])
def test_rows_drop_together_with_the_same_slots_and_scores_as_each_alone(heads, monkeypatch):
    """H2O's and TOVA's rows, with and without their prefill, at two capacities and two heavy ratios, beside FullKV's
    and lone rows: dropping together keeps every key, value, position and H2O score bit for bit as each row's own
    step. With 8 query heads per KV head (a CPU's sum over 5 or more of them rounds by the length it sums) rows of
    one method but different lengths step apart."""
    model = tiny_model(
        "llama", max_position_embeddings=256, vocab_size=128, num_attention_heads=heads, num_key_value_heads=heads // 4
    )
    layers = model.config.num_hidden_layers
    plans = [Plan.homogeneous("full", None, layers), Plan.homogeneous("h2o", 14, layers)]  # FullKV; a lone row
    for method, capacity, params in (
        ("h2o", 12, {"heavy_ratio": 0.5}),
        ("h2o", 16, {"heavy_ratio": 0.25}),
        ("tova", 12, {}),
    ):
        for scope in ("both", "decode"):  # a pair that drops together from the second step (the first cuts the prompt)
            plans.append(Plan.homogeneous(method, capacity, layers, scope, params=params))
    tokens = distinct_tokens(model, PROMPT + STEPS, seed=7)
    alone, none_together = _rows_dropping(model, plans, tokens, False, monkeypatch)
    together, dropped = _rows_dropping(model, plans, tokens, True, monkeypatch)
    assert not none_together
    assert dropped == {"h2o": layers * 2 * 2 * (STEPS - 1), "tova": layers * 2 * (STEPS - 1)}
    for step, (a, b) in enumerate(zip(alone, together)):
        for i, (mine, theirs) in enumerate(zip(a, b)):
            for x, y in zip(mine, theirs):
                assert (x is None and y is None) or torch.equal(x, y), (step, i)


def test_a_prompt_one_slot_over_a_capacity_leaves_the_other_plans_prompt_as_it_was():
    """A prompt of capacity + 1 tokens: the plan's prefill drops one slot, from its own copy of the prompt's keys
    and values, which every plan's layer shares. Each plan's logits then match its own alone."""
    model = tiny_model("llama", max_position_embeddings=256, vocab_size=128)
    layers = model.config.num_hidden_layers
    plans = [Plan.homogeneous("tova", PROMPT - 1, layers), Plan.homogeneous("full", None, layers)]
    plans += [Plan.homogeneous(m, PROMPT - 1, layers) for m in ("streamingllm", "h2o")]
    plans.append(Plan.homogeneous("snapkv", PROMPT - 1, layers, "prefill"))
    tokens = distinct_tokens(model, PROMPT + STEPS, seed=11)
    _each_as_alone(model, plans, tokens)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_attention_free_scorers_in_one_batch_give_what_they_give_alone(family):
    """ExpectedAttention, KeyDiff, LagKV (chunks short enough to score at this prompt) and Random, in every phase
    they run in, beside TOVA: batched = alone, local layers within their window included."""
    model = tiny_model(family, max_position_embeddings=256, vocab_size=128)
    layers = model.config.num_hidden_layers
    chosen = {
        "expected_attention": {"n_sink": 2, "n_future_positions": 64},
        "keydiff": {},
        "lagkv": {"sinks": 2, "lag_size": 6},
        "random": {"seed": 5},
        "tova": {},
    }
    plans = [
        Plan.homogeneous(name, CAPACITY, layers, scope, params=params)
        for name, params in chosen.items()
        for scope in ("prefill", "decode", "both")
        if scope == "both" or Phase(scope) in REGISTRY[name].phases
        if scope != "both" or REGISTRY[name].phases == frozenset(Phase)
    ]
    assert len(plans) == 1 + 3 + 1 + 3 + 3  # the prefill-only two once, the others in each scope
    _each_as_alone(model, plans, distinct_tokens(model, PROMPT + STEPS, seed=7))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("question", ["in the prompt", "after compression"])
def test_a_kept_prompt_pass_replayed_for_other_plans_gives_what_their_own_pass_gives(family, question):
    from polykv.eval.suites import answers
    from polykv.runtime.many_plans import PromptPasses

    model = tiny_model(family)
    plans = every_plan(model.config.num_hidden_layers)  # every method in every phase, native rules, a mix
    tokens = distinct_tokens(model, PROMPT + 6).tolist()
    start = None if question == "in the prompt" else PROMPT - 8
    sample = answers.AnswerSample(tokens[:PROMPT], tokens[PROMPT:], max_new_tokens=6, question_start=start)
    kept = PromptPasses()
    answers.answer_many(model, plans[::2], sample, "both", kept=kept)  # runs the pass and keeps it
    passes = []
    with ForwardLengths(model, passes):
        replayed = answers.answer_many(model, plans[1::2], sample, "both", kept=kept)
    assert passes and max(passes) <= 8  # the model never saw the prompt again: only the question and the answer
    fresh = answers.answer_many(model, plans[1::2], sample, "both")
    assert [(a.tokens, a.nll, a.match, a.kv_held) for a in replayed] == [
        (a.tokens, a.nll, a.match, a.kv_held) for a in fresh
    ]  # bit for bit: the same calls on the same tensors


def test_prompt_passes_keep_the_first_met_within_their_budget_and_only_for_their_model():
    from polykv.eval.suites import answers
    from polykv.runtime.many_plans import PromptPasses

    model = tiny_model("llama")
    plan = Plan.homogeneous("tova", CAPACITY, model.config.num_hidden_layers, "prefill")
    samples = [answers.AnswerSample(distinct_tokens(model, 40, seed).tolist(), [5, 6], 2) for seed in range(3)]
    kept = PromptPasses()
    for sample in samples:
        answers.answer_many(model, [plan], sample, "score", kept=kept)
    one = kept.get(model, torch.tensor(samples[0].prompt_ids)).nbytes()
    assert one > 0 and kept.nbytes() == pytest.approx(3 * one, rel=0.1)
    small = PromptPasses(budget=int(2.5 * one))
    for sample in samples * 2:  # a search's rounds: the same samples in the same order
        answers.answer_many(model, [plan], sample, "score", kept=small)
    assert [small.get(model, torch.tensor(s.prompt_ids)) is not None for s in samples] == [True, True, False]
    assert small.get(tiny_model("llama"), torch.tensor(samples[0].prompt_ids)) is None  # another model's: none


def test_a_pass_replayed_twice_for_plans_that_ask_for_new_signals_gives_their_own_pass(demo_model):
    from polykv.eval.suites import answers
    from polykv.runtime.many_plans import PromptPasses

    model, _ = demo_model
    layers = model.config.num_hidden_layers
    sample = answers.AnswerSample(distinct_tokens(model, PROMPT).tolist(), [5, 6, 7], 3, question_start=PROMPT - 6)
    kept = PromptPasses()
    answers.answer_many(model, [Plan.homogeneous("knorm", CAPACITY, layers, "prefill")], sample, "score", kept=kept)
    for names in (("tova", "snapkv"), ("h2o", "scissorhands", "expected_attention")):  # each adds signals
        plans = [Plan.homogeneous(n, CAPACITY, layers, "prefill", params=params_that_fit(n, CAPACITY)) for n in names]
        before = kept.nbytes()
        replayed = answers.answer_many(model, plans, sample, "score", kept=kept)
        assert kept.nbytes() > before  # the signals they asked for are kept with the pass
        fresh = answers.answer_many(model, plans, sample, "score")
        assert [(a.nll, a.kv_held) for a in replayed] == [(a.nll, a.kv_held) for a in fresh]


class ForwardLengths:
    """Record the length of every input the model's forward sees inside the block."""

    def __init__(self, model, lengths: list[int]):
        self.model, self.lengths = model, lengths

    def __enter__(self):
        self.handle = self.model.register_forward_pre_hook(
            lambda module, args, kwargs: self.lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
        )

    def __exit__(self, *exc):
        self.handle.remove()

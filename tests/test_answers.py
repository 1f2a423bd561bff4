"""answer_nll and agreement (polykv.eval.suites.answers): the gold answer's likelihood under a plan, alone and
batched, against the unmodified model; a plan with room for everything is FullKV; what the suites store."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from polykv.eval.method_protocols import baseline_plan
from polykv.eval.results.store import Store
from polykv.eval.running.suite_runner import run_suite, run_suites
from polykv.eval.suites import answer_settings, answers, ruler
from polykv.eval.suites.ruler import RulerSettings
from polykv.plan import Plan
from tests.helpers import FAMILIES, tiny_model

METHODS = ("streamingllm", "h2o", "tova", "snapkv", "pyramidkv", "cake", "d2o", "scissorhands", "cam", "knorm")


def vanilla_nll(model, question: answers.AnswerSample) -> float:
    """The unmodified model (its own attention, the DynamicCache it makes for itself: sliding-window layers
    where its config has them): the prompt in one pass, then the answer token by token, each token's -log p
    in float64, averaged."""
    from polykv.models import cache_argument_name

    prompt = torch.tensor([question.prompt_ids])
    with torch.no_grad():
        out = model(
            prompt, use_cache=True, logits_to_keep=1, **{cache_argument_name(model): DynamicCache(config=model.config)}
        )
        cache, logits = out.past_key_values if hasattr(out, "past_key_values") else out.cache, [out.logits[0, -1]]
        for token in question.answer_ids[:-1]:
            out = model(torch.tensor([[token]]), use_cache=True, **{cache_argument_name(model): cache})
            logits.append(out.logits[0, -1])
    nll = [float(-torch.log_softmax(row.double(), -1)[t]) for row, t in zip(logits, question.answer_ids)]
    return sum(nll) / len(nll)


def one_pass_nll(model, question: answers.AnswerSample) -> float:
    """The same NLL from one forward pass over prompt + answer (no cache at all)."""
    ids = torch.tensor([question.prompt_ids + question.answer_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].double()
    start = len(question.prompt_ids) - 1
    targets = question.answer_ids
    logp = torch.log_softmax(logits[start : start + len(targets)], -1)
    return float(-logp[range(len(targets)), targets].mean())


def question_for(model, prompt_length: int = 40, answer_length: int = 6, seed: int = 3) -> answers.AnswerSample:
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (prompt_length + answer_length,), generator=generator).tolist()
    return answers.AnswerSample(ids[:prompt_length], ids[prompt_length:], max_new_tokens=8)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_answer_nll_of_fullkv_is_the_vanilla_models_teacher_forced_nll_exactly_at_batch_1(family):
    model = tiny_model(family)
    question = question_for(model)
    full = Plan.homogeneous("full", None, model.config.num_hidden_layers)
    alone = answers.answer_alone(model, full, question, "score").nll
    assert alone == vanilla_nll(model, question)  # bit for bit: the routed full plan is the vanilla computation
    assert alone == pytest.approx(one_pass_nll(model, question), abs=1e-5)  # one pass vs token by token: rounding


def test_batched_answer_nll_equals_each_plan_alone_within_float_rounding(llama):
    # Batched, a row's products round differently from a single row's, and a layer needing the prompt's column
    # sums takes its prompt output from SDPA: 1e-5 nats per token bounds it (measured: about 1e-7).
    question = question_for(llama, prompt_length=48)
    layers = llama.config.num_hidden_layers
    plans = [Plan.homogeneous("full", None, layers)] + [baseline_plan(m, 20, layers) for m in METHODS]
    batched = answers.answer_many(llama, plans, question, "score")
    for plan, answer in zip(plans, batched):
        alone = answers.answer_alone(llama, plan, question, "score").nll
        assert answer.nll == pytest.approx(alone, abs=1e-5), plan.name
    assert batched[0].nll == pytest.approx(vanilla_nll(llama, question), abs=1e-5)
    assert len({round(a.nll, 6) for a in batched}) > 3  # the evicting plans really differ


def test_answer_match_is_100_exactly_when_greedy_generation_writes_the_gold_tokens(llama):
    """The gold answer is a plan's own greedy answer (100), or that answer with one token changed (0); batched, each
    plan's match is the one it has alone."""
    asked = question_for(llama, prompt_length=48)
    layers = llama.config.num_hidden_layers
    plans = [Plan.homogeneous("full", None, layers), baseline_plan("streamingllm", 6, layers)]
    for plan in plans:
        greedy = answers.answer_alone(llama, plan, asked, "generate").tokens[:6]
        own = answers.AnswerSample(asked.prompt_ids, greedy, max_new_tokens=8)
        changed = answers.AnswerSample(asked.prompt_ids, greedy[:3] + [(greedy[3] + 1) % 96 or 3] + greedy[4:], 8)
        assert answers.answer_alone(llama, plan, own, "score").match == 100.0, plan.name
        assert answers.answer_alone(llama, plan, changed, "score").match == 0.0, plan.name
        for question in (own, changed):
            batched = [a.match for a in answers.answer_many(llama, plans, question, "score")]
            assert batched == [answers.answer_alone(llama, p, question, "score").match for p in plans]


@pytest.mark.parametrize("method", METHODS)
def test_a_plan_with_room_for_everything_is_fullkv(llama, method):
    question = question_for(llama, prompt_length=32)
    layers = llama.config.num_hidden_layers
    # capacity above prompt + answer: nothing is ever evicted (D2O's native split gets 3x: its smallest share
    # is >= 1/e of the average)
    roomy = baseline_plan(method, 3 * (32 + 8), layers)
    full = Plan.homogeneous("full", None, layers)
    got, want = (answers.answer_alone(llama, p, question, "both") for p in (roomy, full))
    assert got.tokens == want.tokens
    assert got.nll == pytest.approx(want.nll, abs=1e-5)  # methods scoring attention use an explicit softmax


def test_the_first_answer_token_is_predicted_by_the_prompt_pass_whatever_the_plan(llama):
    question = question_for(llama)
    question = answers.AnswerSample(question.prompt_ids, question.answer_ids[:1], 4)
    layers = llama.config.num_hidden_layers
    plans = [baseline_plan(m, 8, layers) for m in ("streamingllm", "tova", "snapkv")]
    values = {answers.answer_alone(llama, p, question, "score").nll for p in plans}
    assert len(values) == 1  # eviction happens after the prompt attends in full


def test_gold_answers_get_a_space_unless_the_prompt_ends_in_whitespace(demo_model):
    _, tokenizer = demo_model
    plain = tokenizer("The answer is", add_special_tokens=False).input_ids
    spaced = tokenizer("The answer is ", add_special_tokens=False).input_ids
    natural = tokenizer("The answer is 42", add_special_tokens=False).input_ids[len(plain) :]
    assert answers.gold_ids(tokenizer, plain, "42", 10) == natural  # the prompt's continuation, one space
    if tokenizer.decode(spaced[-1:]).endswith(" "):
        assert answers.gold_ids(tokenizer, spaced, "42", 10) == tokenizer("42", add_special_tokens=False).input_ids
    assert len(answers.gold_ids(tokenizer, plain, "one two three four five six", 2)) == 2  # cut to the limit
    with pytest.raises(ValueError, match="empty gold answer"):
        answers.gold_ids(_Letters(), [3], "", 10)  # a prompt ending in a space and nothing to answer


def test_modes_report_their_metrics_and_runs_keep_every_answer(demo_model, tmp_path):
    model, tokenizer = demo_model
    store = Store(tmp_path / "results.sqlite")
    full = Plan.homogeneous("full", None, 5)
    tova = Plan.homogeneous("tova", 32, 5)
    for mode, metrics in answer_settings.MODE_METRICS.items():
        settings = RulerSettings(tasks=("niah_single_1",), length=400, samples_per_task=2, mode=mode)
        alone = run_suite(store, "demo", model, tokenizer, tova, "ruler", settings)
        together = run_suites(
            store, "demo", model, tokenizer, [tova.model_copy(update={"name": "t"}), full], "ruler", settings
        )
        for run_id in (alone, *together):
            rows = store.samples(run_id)
            assert all(set(row.metrics) == set(metrics) for row in rows), (mode, rows[0]["metrics"])
            assert all(row.gold and len(row.gold) == 1 and row.prompt["task"] == "niah_single_1" for row in rows)
            assert all((row.prediction is not None) == answer_settings.generates(mode) for row in rows)
            assert all(len(row.kv_held["entering"]) == 5 for row in rows)  # every sample's KV, measured
        # the same samples, alone or batched: the same answer_nll up to rounding, the same answers
        a, b = store.samples(alone), store.samples(together[0])
        assert [r.kv_held for r in a] == [r.kv_held for r in b]  # batched holds what alone holds
        assert all(r.kv_held["entering"] == [32] * 5 for r in a)  # TOVA keeps 32 of the 400-token prompt
        if answer_settings.scores_answer(mode):
            assert [r.metrics["answer_nll"] for r in a] == pytest.approx([r.metrics["answer_nll"] for r in b], abs=1e-5)
            assert [r.metrics["answer_match"] for r in a] == [r.metrics["answer_match"] for r in b]
        if mode == "both":  # the gold tokens greedy under teacher forcing: generation writes them, and scores
            for row in (*a, *store.samples(together[1])):
                assert row.metrics["answer_match"] in (0.0, 100.0)
                assert row.metrics["answer_match"] == 0.0 or row.metrics["score"] == 100.0, row.prediction
        if answer_settings.generates(mode):
            assert [r.prediction for r in a] == [r.prediction for r in b]
            assert all(r.metrics["agreement"] == 1.0 for r in store.samples(together[1]))  # FullKV agrees with itself
    prompts = {r.prompt["sha256"] for r in store.samples(alone)}
    assert len(prompts) == 2 and all(len(h) == 16 for h in prompts)  # a hash of the prompt, not the prompt


def test_agreement_is_fullkvs_answer_after_rulers_postprocessing():
    payload = {"task": "niah_single_1", "answers": ["1234567"], "tokenizer": _Letters()}
    judge = ruler._judge(payload)
    metrics, prediction = judge([1, 2], [1, 2, 3])  # "ab" vs "ab " (a trailing space RULER strips)
    assert metrics["agreement"] == 1.0 and prediction == "ab"
    metrics, _ = judge([1, 2], [2, 1])
    assert metrics == {"score": 0.0, "agreement": 0.0}


class _Letters:
    """Token t decodes to the t-th letter (3: a space); text encodes letter by letter."""

    def decode(self, tokens, skip_special_tokens=True):
        return "".join(" " if t == 3 else chr(ord("a") + t - 1) for t in tokens)

    def __call__(self, text, add_special_tokens=False):
        return type("Encoded", (), {"input_ids": [3 if c == " " else ord(c) - ord("a") + 1 for c in text]})()


def test_a_mode_the_suites_do_not_know_is_refused():
    with pytest.raises(ValueError, match="mode must be one of generate, score, both"):
        RulerSettings(mode="guess")


def test_an_experiments_metric_chooses_the_question_suites_mode_unless_settings_name_one():
    from polykv.cli.common import _suite_settings
    from polykv.errors import SettingsError

    ruler_json = '{"tasks": ["niah_single_1"], "samples_per_task": 1}'
    assert _suite_settings("ruler", 1, None, 0, ruler_json, "demo", "answer_nll").mode == "score"
    assert _suite_settings("ruler", 1, None, 0, ruler_json, "demo", "agreement").mode == "generate"
    both = '{"tasks": ["niah_single_1"], "mode": "both"}'
    assert _suite_settings("ruler", 1, None, 0, both, "demo", "answer_nll").mode == "both"  # named: kept
    with pytest.raises(SettingsError, match="metric answer_nll is not reported in generate mode"):
        _suite_settings("ruler", 1, None, 0, '{"mode": "generate"}', "demo", "answer_nll")
    assert _suite_settings("ruler", 1, None, 0, ruler_json, "demo").mode == RulerSettings().mode  # no metric


def test_the_gold_answer_is_tokenized_as_the_prompts_continuation_with_a_dummy_prefix_tokenizer():
    """A llama2.c-style tokenizer puts a word's leading space inside its first token (" 42"): the gold answer
    after "is" is that token, not a lone space and then "42" (tokenizing " 42" alone gives both spaces)."""
    from transformers import PreTrainedTokenizerFast

    from polykv.models.tokenizer import Llama2cVocab, build_tokenizer

    words = [" ", "4", "2", "i", "s", " i", " is", "42", " 4", " 42", "  "]
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *words]
    scores = [0.0] * 259 + [-float(k) for k in range(len(words))]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(Llama2cVocab(pieces, scores, 3)))
    prompt_ids = tokenizer("is", add_special_tokens=False).input_ids
    natural = tokenizer("is 42", add_special_tokens=False).input_ids[len(prompt_ids) :]
    assert tokenizer.convert_ids_to_tokens(natural) == [" 42"]
    assert answers.gold_ids(tokenizer, prompt_ids, "42", 10) == natural
    assert len(tokenizer(" 42", add_special_tokens=False).input_ids) == 2  # what tokenizing it alone gives

"""The question protocol (`question: "after-compression"`, `polykv.eval.suites.answers`): the plan compresses the
context, the question is fed after it at its true positions and kept in full. Where the question starts (RULER,
LongBench), that FullKV is unchanged by the split, that SnapKV's window then sees no question token, that the
question survives the step it is fed in, that batched equals alone, and that the workload profile measures the
same numbers as a plan scored alone."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from polykv.eval.method_protocols import baseline_plan
from polykv.eval.running.settings import suite_settings
from polykv.eval.suites import answers, longbench, ruler
from polykv.eval.suites.ruler import RulerSettings
from polykv.methods import params_that_fit
from polykv.methods.attention.snapkv import SnapKV
from polykv.models import cache_argument_name
from polykv.plan import Phase, Plan
from polykv.profile.cell_plan import single_layer_plan
from polykv.profile.profiler import profile_methods
from polykv.question_protocol import QuestionProtocol
from polykv.runtime import routed
from tests.helpers import FAMILIES, REPO, assert_one_line_error, tiny_model
from tests.test_answers import METHODS, question_for, vanilla_nll
from tests.test_longbench import record, write_task

AFTER = QuestionProtocol.AFTER_COMPRESSION


def split(question: answers.AnswerSample, start: int) -> answers.AnswerSample:
    return dataclasses.replace(question, question_start=start)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fullkv_after_compression_is_the_vanilla_model(family):
    # nothing is evicted, so feeding the question apart changes nothing but rounding (a block of queries after the
    # cache rounds differently from the same queries inside one pass)
    model = tiny_model(family)
    question = question_for(model, prompt_length=40)
    full = Plan.homogeneous("full", None, model.config.num_hidden_layers)
    apart = answers.answer_alone(model, full, split(question, 28), "both")
    whole = answers.answer_alone(model, full, question, "both")
    assert apart.tokens == whole.tokens
    assert apart.nll == pytest.approx(vanilla_nll(model, question), abs=1e-5)


def test_every_method_batched_gives_what_it_gives_alone_after_compression(llama):
    question = split(question_for(llama, prompt_length=48), 36)
    layers = llama.config.num_hidden_layers
    plans = [Plan.homogeneous("full", None, layers)] + [baseline_plan(m, 20, layers) for m in METHODS]
    plans += [
        Plan.homogeneous(m, 20, layers, "decode", params=params_that_fit(m, 20))
        for m in ("h2o", "tova", "cake", "scissorhands", "knorm", "streamingllm")
    ]
    batched = answers.answer_many(llama, plans, question, "both")
    for plan, answer in zip(plans, batched):
        alone = answers.answer_alone(llama, plan, question, "both")
        assert answer.tokens == alone.tokens, plan.name
        assert answer.nll == pytest.approx(alone.nll, abs=1e-5), plan.name
    whole = dataclasses.replace(question, question_start=None)
    in_prompt = [a.nll for a in answers.answer_many(llama, plans, whole, "score")]
    assert sum(abs(a.nll - b) > 1e-6 for a, b in zip(batched, in_prompt)) >= 5  # prefill methods see no question


def test_snapkvs_observation_window_holds_no_question_token(llama, monkeypatch):
    question = split(question_for(llama, prompt_length=48), 36)
    layers = llama.config.num_hidden_layers
    plan = Plan.homogeneous("snapkv", 16, layers, "prefill", params={"window": 4})
    seen = []
    original = SnapKV.score

    def spy(self, view):
        seen.append((int(view.positions.max()), view.rows.shape[2]))
        return original(self, view)

    monkeypatch.setattr(SnapKV, "score", spy)
    answers.answer_alone(llama, plan, question, "score")
    assert seen and all(newest == 35 and window == 4 for newest, window in seen)  # the context's last 4 queries
    seen.clear()
    answers.answer_alone(llama, plan, dataclasses.replace(question, question_start=None), "score")
    assert all(newest == 47 for newest, _ in seen)  # in the prompt, the window is the question's last tokens


def test_the_question_is_kept_in_full_then_decode_eviction_resumes(llama):
    layers = llama.config.num_hidden_layers
    ids = question_for(llama, prompt_length=48).prompt_ids
    plan = Plan.homogeneous("tova", 20, layers, "both")
    with torch.no_grad(), routed(llama, plan) as session:
        out = llama(torch.tensor([ids[:36]]), use_cache=True)
        cache = session.cache
        assert cache.retained_per_layer() == [20] * layers  # the context compressed
        cache.keep_until(48)
        out = llama(torch.tensor([ids[36:]]), use_cache=True, **{cache_argument_name(llama): cache})
        assert cache.retained_per_layer() == [32] * layers  # + the 12 question tokens, none evicted
        kept = cache.layers[0].positions[0, 0].tolist()
        assert set(range(36, 48)) <= set(kept)
        llama(out.logits[:, -1:].argmax(-1), use_cache=True, **{cache_argument_name(llama): cache})
        assert cache.retained_per_layer() == [20] * layers  # the first answer token: back to the capacity


def test_decode_only_cake_keeps_the_question_at_its_first_cut(llama):
    layers = llama.config.num_hidden_layers
    ids = question_for(llama, prompt_length=48).prompt_ids
    plan = Plan.homogeneous("cake", 24, layers, "decode", params={"window": 4})
    with torch.no_grad(), routed(llama, plan) as session:
        llama(torch.tensor([ids[:36]]), use_cache=True)
        cache = session.cache
        cache.keep_until(48)
        out = llama(torch.tensor([ids[36:]]), use_cache=True, **{cache_argument_name(llama): cache})
        llama(out.logits[:, -1:].argmax(-1), use_cache=True, **{cache_argument_name(llama): cache})
    for layer in cache.layers:
        kept = set(layer.positions[0, 0].tolist())
        assert len(kept) == 24 and set(range(32, 49)) <= kept  # window 32..35, the question 36..47, the new token


def test_ruler_places_the_question_after_the_haystack(demo_model):
    model, tokenizer = demo_model
    settings = RulerSettings(tasks=("niah_single_1", "niah_multivalue"), length=512, samples_per_task=1)
    whole = ruler.build_samples(tokenizer, model, settings, 0)
    apart = ruler.build_samples(tokenizer, model, dataclasses.replace(settings, question=AFTER), 0)
    for (_, _, a), (_, _, b) in zip(whole, apart):
        assert a["prompt_ids"] == b["prompt_ids"] and "question_start" not in a  # the same tokens either way
        start = b["question_start"]
        question = tokenizer.decode(b["prompt_ids"][start:])
        assert question.startswith("What ") and "mentioned in the provided text?" in question
        assert question.endswith("mentioned in the provided text is") or question.endswith("text are")
        assert "special magic number" not in tokenizer.decode(b["prompt_ids"][start - 5 : start])


def test_ruler_places_the_question_inside_a_chat_template(demo_model):
    model, tokenizer = demo_model
    import copy

    chat = copy.deepcopy(tokenizer)
    chat.chat_template = "{% for m in messages %}<user>{{ m['content'] }}</user>{% endfor %}<bot>"
    settings = RulerSettings(tasks=("niah_single_1",), length=512, samples_per_task=1, question=AFTER)
    (_, _, payload) = ruler.build_samples(chat, model, settings, 0)[0]
    question = chat.decode(payload["prompt_ids"][payload["question_start"] :])
    assert question.startswith("What is the special magic number")
    assert "</user><bot>" in question.replace(" ", "") and question.endswith("mentioned in the provided text is")


def test_longbench_places_the_question_after_the_context_and_says_which_tasks_ask_none(demo_model, tmp_path):
    model, tokenizer = demo_model
    story = "Once upon a time there was a little girl named Lily. She liked to play in the park. " * 3
    write_task(tmp_path, "hotpotqa", [record("hotpotqa", 0, story, "Who played in the park?", ["Lily"])])
    write_task(tmp_path, "passage_count", [record("passage_count", 0, story, "", ["3"])])
    settings = longbench.LongBenchSettings(tasks=("hotpotqa", "passage_count"), data_dir=str(tmp_path), question=AFTER)
    rows = {task: payload for task, _, payload in longbench.build_samples(tokenizer, model, settings, 0)}
    hotpot = tokenizer.decode(rows["hotpotqa"]["ids"][rows["hotpotqa"]["question_start"] :])
    assert hotpot.startswith("Answer the question based on the given passages") and "Who played in the park?" in hotpot
    count = tokenizer.decode(rows["passage_count"]["ids"][rows["passage_count"]["question_start"] :])
    assert count.startswith("Please enter the final count")
    assert "passage_count" in longbench.INSTRUCTION_ONLY and "hotpotqa" not in longbench.INSTRUCTION_ONLY


def test_the_default_protocol_leaves_settings_and_run_ids_as_they_were():
    assert "question" not in RulerSettings().to_dict()
    assert RulerSettings(question=AFTER).to_dict()["question"] == AFTER
    assert "question" not in longbench.LongBenchSettings().to_dict()
    with pytest.raises(Exception, match="question: Input should be 'in-prompt' or 'after-compression'"):
        suite_settings("ruler", '{"question": "before"}')


def test_the_protocol_is_one_enum_from_the_json_to_the_store():
    # settings read from JSON hold the enum; what they store is the plain value, so ids hashed from it stay
    for suite in ("ruler", "longbench"):
        settings = suite_settings(suite, json.dumps({"question": "after-compression"}))
        assert settings.question is QuestionProtocol.AFTER_COMPRESSION
        stored = settings.to_dict()["question"]
        assert type(stored) is str and json.dumps(stored) == '"after-compression"'
    assert QuestionProtocol.of({}) is QuestionProtocol.IN_PROMPT  # settings saved before the setting existed
    assert QuestionProtocol.of(RulerSettings(question=AFTER)) is AFTER
    assert not AFTER.compresses_question and QuestionProtocol.IN_PROMPT.compresses_question


@pytest.mark.parametrize("mode", ["generate", "score", "both"])
def test_polykv_eval_runs_after_compression_in_every_mode(polykv, tmp_path, mode):
    settings = {"tasks": ["niah_single_1"], "length": 512, "samples_per_task": 1, "question": AFTER, "mode": mode}
    result = polykv(
        "eval", "--model", "demo", "--suite", "ruler", "--settings", json.dumps(settings),
        "--plan", "plans/demo/snapkv-prefill-64.json", "--workspace", str(tmp_path / "ws"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    shown = polykv("runs", "--workspace", str(tmp_path / "ws"))
    assert shown.returncode == 0 and "ruler (question after-compression)" in shown.stdout


def test_a_question_protocol_the_suites_do_not_know_is_one_line(polykv, tmp_path):
    result = polykv(
        "eval", "--model", "demo", "--suite", "ruler", "--settings", '{"question": "first"}',
        "--workspace", str(tmp_path / "ws"),
    )  # fmt: skip
    assert_one_line_error(result, "question: Input should be 'in-prompt' or 'after-compression' (got \"first\")")
    assert not (tmp_path / "ws").exists()


def test_the_workload_profile_after_compression_measures_what_a_plan_scores_alone(llama):
    generator = torch.Generator().manual_seed(1)
    context, asked, answer = 40, 6, 5
    sequences = [
        torch.randint(3, llama.config.vocab_size, (context + asked + answer,), generator=generator).tolist()
        for _ in range(2)
    ]
    methods = ["tova", "h2o", "snapkv", "cake"]
    count = len(sequences)
    fed, scored, kept = [asked + answer - 1] * count, [answer] * count, [asked] * count
    profile = profile_methods(llama, sequences, 12, continuations=fed, scored=scored, kept=kept, methods=methods)
    naive = profile_methods(
        llama, sequences, 12, continuations=fed, scored=scored, kept=kept, methods=methods, reuse_prefix=False
    )
    layers = llama.config.num_hidden_layers
    for row, other in zip(profile.sequences, naive.sequences):
        assert row["nll"] == pytest.approx(other["nll"], abs=1e-4)
        if row["sequence"] == 0 and row["layer"] == 1:
            plan = single_layer_plan(layers, 1, Phase(row["scope"]), row["method"], 12)
            ids = sequences[0]
            q = answers.AnswerSample(ids[: context + asked], ids[context + asked :], 4, question_start=context)
            alone = answers.answer_alone(llama, plan, q, "score").nll
            assert row["nll"] / answer == pytest.approx(alone, abs=1e-5), (row["scope"], row["method"])


def test_the_runs_page_launches_a_run_whose_question_comes_after_compression(demo_model):
    from app import job_forms

    plan = Plan.load(REPO / "plans" / "demo" / "snapkv-prefill-64.json")
    settings = json.dumps({"tasks": ["niah_single_1"], "length": 512, "samples_per_task": 1, "question": AFTER})
    job = job_forms.eval_job("demo", "cpu", plan, "ruler", settings, "", [], 0, 0, demo_model)
    (run,) = job.runs
    assert json.loads(run.unit.settings_json)["question"] == AFTER  # the run carries the protocol to the worker


def test_compare_says_when_two_runs_compare_across_protocols(polykv, tmp_path):
    workspace = str(tmp_path / "ws")
    base = {"tasks": ["niah_single_1"], "length": 512, "samples_per_task": 2, "mode": "score"}
    ids = []
    for plan, question in (("snapkv-prefill-64", AFTER), ("tova-both-64", "in-prompt")):
        settings = json.dumps({**base, "question": question})
        result = polykv(
            "eval", "--model", "demo", "--suite", "ruler", "--settings", settings,
            "--plan", f"plans/demo/{plan}.json", "--workspace", workspace,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        ids.append(result.stdout.split()[1].rstrip(":"))
    shown = polykv("compare", *ids, "--metric", "answer_nll", "--workspace", workspace)
    assert shown.returncode == 0, shown.stderr
    assert "across protocols: A's question is after-compression, B's in-prompt; A acts in prefill, B in both" in (
        shown.stdout
    )


def test_a_longbench_prompt_cut_in_the_middle_keeps_its_question_after_the_cut(demo_model, tmp_path):
    model, tokenizer = demo_model
    story = "Once upon a time there was a little girl named Lily. She liked to play in the park. " * 30
    write_task(tmp_path, "hotpotqa", [record("hotpotqa", 0, story, "Who played in the park?", ["Lily"])])
    settings = longbench.LongBenchSettings(tasks=("hotpotqa",), data_dir=str(tmp_path), max_length=200, question=AFTER)
    ((_, _, payload),) = longbench.build_samples(tokenizer, model, settings, 0)
    assert len(payload["ids"]) <= 200  # cut in the middle
    question = tokenizer.decode(payload["ids"][payload["question_start"] :])
    assert question.startswith("Answer the question based on the given passages") and "Who played" in question
    too_short = longbench.LongBenchSettings(tasks=("hotpotqa",), data_dir=str(tmp_path), max_length=40, question=AFTER)
    with pytest.raises(ValueError, match="the middle truncation cut into the question"):
        longbench.build_samples(tokenizer, model, too_short, 0)


def test_a_one_token_answer_after_compression_is_profiled(llama):
    generator = torch.Generator().manual_seed(2)
    context, asked = 40, 6
    sequences = [torch.randint(3, llama.config.vocab_size, (context + asked + 1,), generator=generator).tolist()]
    profile = profile_methods(llama, sequences, 12, continuations=[asked], scored=[1], kept=[asked], methods=["tova"])
    assert profile.reference_nll[0] > 0 and len(profile.sequences) == 2 * 2 * llama.config.num_hidden_layers


def test_the_protocols_values_are_written_once_in_the_library_and_the_app():
    # every other module names a protocol through the enum, so a renamed value cannot be missed somewhere
    written = [
        str(path.relative_to(REPO))
        for folder in ("polykv", "app")
        for path in sorted((REPO / folder).rglob("*.py"))
        if path.name != "question_protocol.py"
        and any(value in path.read_text(encoding="utf-8") for value in ("in-prompt", "after-compression"))
    ]
    assert written == []

"""The KV a plan held, measured from its cache (`RoutedCache.kv_held`): what each layer holds entering the answer
and at the end, under both question protocols and every mode, batched as alone, a local layer never above its
window; stored with each sample and read back as a run's mean (`polykv.eval.results.kv_measured`), printed by
`runs show` and `compare`."""

from __future__ import annotations

import dataclasses

import pytest

from polykv.eval.results.kv_measured import measured_kv, unequal_kv
from polykv.eval.results.store import SampleRecord, Store
from polykv.eval.suites import answers
from polykv.methods import params_that_fit
from polykv.plan import Plan
from tests.helpers import tiny_model
from tests.test_answers import question_for

PROMPT, ANSWER = 40, 6  # question_for's prompt and gold answer lengths here


def held(model, plan, question, mode="score"):
    return answers.answer_alone(model, plan, question, mode).kv_held


def test_each_layer_holds_its_capacity_entering_the_answer_and_what_its_decode_phase_keeps_at_the_end(llama):
    layers = llama.config.num_hidden_layers
    question = question_for(llama, PROMPT, ANSWER)
    fed = ANSWER - 1  # the gold's last token is predicted, never fed
    prefill = held(llama, Plan.homogeneous("tova", 20, layers, "prefill"), question)
    assert prefill == {"entering": [20] * layers, "end": [20 + fed] * layers, "seen_entering": PROMPT,
                       "seen_end": PROMPT + fed}  # fmt: skip
    decode = held(llama, Plan.homogeneous("tova", 20, layers, "decode"), question)
    assert decode["entering"] == [PROMPT] * layers and decode["end"] == [20] * layers  # cut at the first answer token
    full = held(llama, Plan.homogeneous("full", None, layers), question)
    assert full["entering"] == [PROMPT] * layers and full["end"] == [PROMPT + fed] * layers


def test_a_question_after_compression_is_held_in_full_on_top_of_the_compressed_context(llama):
    layers = llama.config.num_hidden_layers
    question = dataclasses.replace(question_for(llama, PROMPT, ANSWER), question_start=28)
    kv = held(llama, Plan.homogeneous("tova", 20, layers, "prefill"), question)
    assert kv["entering"] == [20 + (PROMPT - 28)] * layers and kv["seen_entering"] == PROMPT


def test_a_native_allocation_is_measured_as_it_split_the_budget(llama):
    layers = llama.config.num_hidden_layers
    question = question_for(llama, PROMPT, ANSWER)
    kv = held(llama, Plan.homogeneous("pyramidkv", 16, layers, "prefill", allocation="native"), question)
    assert sum(kv["entering"]) == 16 * layers and len(set(kv["entering"])) > 1  # the pyramid: same total, uneven


@pytest.mark.parametrize("mode", ["score", "generate", "both"])
@pytest.mark.parametrize("start", [None, 30])
def test_batched_plans_hold_what_each_holds_alone(llama, mode, start):
    layers = llama.config.num_hidden_layers
    question = dataclasses.replace(question_for(llama, PROMPT, ANSWER), question_start=start)
    plans = [Plan.homogeneous("full", None, layers)] + [
        Plan.homogeneous(m, 16, layers, scope, params=params_that_fit(m, 16))
        for m, scope in (("tova", "prefill"), ("snapkv", "prefill"), ("h2o", "decode"), ("keydiff", "both"))
    ]
    batched = answers.answer_many(llama, plans, question, mode)
    for plan, answer in zip(plans, batched):
        assert answer.kv_held == held(llama, plan, question, mode), plan.name


def test_generating_the_end_counts_the_generated_tokens_fed():
    model = tiny_model("llama")
    layers = model.config.num_hidden_layers
    question = question_for(model, PROMPT, ANSWER)
    answer = answers.answer_alone(model, Plan.homogeneous("full", None, layers), question, "generate")
    fed = len(answer.tokens) - 1
    assert answer.kv_held["end"] == [PROMPT + fed] * layers and answer.kv_held["seen_end"] == PROMPT + fed


def test_a_local_layer_never_holds_more_than_its_window_less_one():
    model = tiny_model("gemma3")  # layers 0 and 1 local (window 16), layer 2 global
    question = question_for(model, PROMPT, ANSWER)
    for plan in (
        Plan.homogeneous("full", None, 3),
        Plan.homogeneous("tova", 24, 3, "prefill"),
        Plan.homogeneous("pyramidkv", 20, 3, "prefill", allocation="native"),
    ):
        for mode in ("score", "generate"):
            kv = held(model, plan, question, mode)
            assert max(kv["entering"][:2] + kv["end"][:2]) <= 15, (plan.name, mode, kv)
    full = held(model, Plan.homogeneous("full", None, 3), question)
    assert full["entering"] == [15, 15, PROMPT]


def _rows(store: Store, run_id: str, held_by_sample: list[dict | None]):
    for i, kv in enumerate(held_by_sample):
        store.add_sample(run_id, "t", f"{i:03d}", {"answer_nll": 1.0}, 0.1, SampleRecord(kv_held=kv))
    return store.samples(run_id)


def test_a_runs_measured_kv_is_the_mean_of_its_samples_and_fullkvs_counts_a_local_layer_at_its_window(tmp_path):
    store = Store(tmp_path / "results.sqlite")
    store.create_run("r", model="demo", plan_name="p", plan_hash="h", plan_json="{}", suite="ruler", settings={},
                     seed=0, total_samples=3, versions={})  # fmt: skip
    rows = _rows(
        store,
        "r",
        [
            {"entering": [10, 20], "end": [12, 22], "seen_entering": 100, "seen_end": 102},
            {"entering": [20, 30], "end": [22, 32], "seen_entering": 200, "seen_end": 202},
            None,  # a sample stored before PolyKV measured: left out of the mean
        ],
    )
    kv = measured_kv(rows, windows=[64, None])
    assert kv.samples == 2 and kv.entering == [15, 25] and kv.end == [17, 27]
    assert kv.fullkv_entering == (63 + 100 + 63 + 200) / 2  # the local layer at most 63, the global one every token
    assert measured_kv(rows[2:]) is None


def test_a_contrast_between_runs_of_unequal_measured_kv_says_so():
    def of(total):
        return measured_kv_of([total / 2, total / 2])

    assert unequal_kv(of(100), of(100.9)) is None  # within 1%
    line = unequal_kv(of(100), of(110), ("tova", "snapkv"))
    assert line.startswith("note: not at equal KV: entering the answer tova held 100.0 token-layers and snapkv 110.0")
    assert "not measured" in unequal_kv(None, of(100))
    assert unequal_kv(None, None) is None


def measured_kv_of(entering):
    from polykv.eval.results.kv_measured import MeasuredKV

    return MeasuredKV(1, list(entering), list(entering))


def test_runs_show_and_compare_print_the_measured_kv(polykv, tmp_path):
    store = Store(tmp_path / "ws" / "results.sqlite")
    for run_id, capacity in (("aaaa", 8), ("bbbb", 12)):
        plan = Plan.homogeneous("tova", capacity, 5)
        store.create_run(run_id, model="demo", plan_name=plan.name, plan_hash="h", plan_json=plan.to_json(),
                         suite="ruler", settings={"mode": "score"}, seed=0, total_samples=1, versions={})  # fmt: skip
        kv = {"entering": [capacity] * 5, "end": [capacity] * 5, "seen_entering": 100, "seen_end": 105}
        for task in ("t", "u"):
            prompt = {"task": task, "sample": "000", "seed": 0, "sha256": task}
            record = SampleRecord(prompt=prompt, kv_held=kv)
            store.add_sample(run_id, task, "000", {"answer_nll": capacity}, 0.1, record)
        store.set_task_scores(run_id, {t: {"answer_nll": capacity} for t in "tu"}, {"t": 1, "u": 1})
        store.set_status(run_id, "finished")
    shown = polykv("runs", "show", "aaaa", "-w", str(tmp_path / "ws")).stdout
    assert "KV held, measured (mean of 2 samples): entering the answer 40.0 token-layers" in shown
    assert "8.0% of FullKV's 500" in shown and "per layer entering the answer: 8 8 8 8 8" in shown
    compared = polykv("compare", "aaaa", "bbbb", "--metric", "answer_nll", "-w", str(tmp_path / "ws"))
    assert compared.returncode == 0, compared.stderr
    compared = compared.stdout
    assert "note: not at equal KV: entering the answer A held 40.0 token-layers and B 60.0" in compared

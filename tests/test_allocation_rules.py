"""Allocation rules apart from the methods: a static rule (`polykv.routing.rules`) or CAKE's run-time rule
(`polykv.runtime.layer_budgets`) splits a plan's budget over its layers for any scoring method; PyramidKV's preset is
SnapKV's selection under the pyramid rule, and under CAKE's rule any method gets CAKE's own split; a rule with room
for everything is the vanilla model, batched equals alone; on a hybrid model no local layer is given more than its
window holds; the CLI writes such plans and refuses bad rules in one line."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from polykv.eval.suites import answers
from polykv.methods import validate_plan
from polykv.methods.attention.pyramidkv import PyramidKV, PyramidKVParams
from polykv.models import cache_argument_name
from polykv.plan import Plan, PlanError
from polykv.plan_edits.painting import paint
from polykv.profile.squeeze import attention_similarity
from polykv.routing.rules import apply_rule, predicted_split, rule_capacities, rule_params, three_groups
from polykv.runtime import routed
from tests.helpers import assert_batched_as_alone, assert_one_line_error, decode_logits, tiny_model
from tests.test_answers import question_for, vanilla_nll

PROMPT = 80


def _prefilled(model, plan):
    ids = torch.randint(3, 96, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    with routed(model, plan) as session:
        decode_logits(model, ids, 0, cache_argument_name(model))
    return session.cache


def test_the_pyramid_rule_is_pyramidkvs_layer_rule_and_keeps_the_total():
    capacities = rule_capacities("pyramid", 30 * 64, 30, {"window": 8, "beta": 20})
    assert capacities == PyramidKV.allocate(30 * 64, [None] * 30, PyramidKVParams(window=8, beta=20))
    assert sum(capacities) == 30 * 64 and capacities == sorted(capacities, reverse=True)
    assert rule_capacities("uniform", 10, 3) == [4, 3, 3]


def test_pyramidkv_is_snapkvs_selection_under_the_pyramid_rule():
    model = tiny_model("llama", num_hidden_layers=4)
    preset = Plan.homogeneous("pyramidkv", 24, 4, "prefill", allocation="native")
    snapkv = Plan.homogeneous("snapkv", 24, 4, "prefill", {"window": 8, "kernel_size": 7, "pooling": "max"})
    ruled = apply_rule(snapkv, "pyramid", {"window": 8, "beta": 20}, prompt_length=PROMPT)
    a, b = _prefilled(model, preset), _prefilled(model, ruled)
    assert a.capacities("prefill") == [layer.prefill.capacity for layer in ruled.layers]
    for mine, theirs in zip(a.layers, b.layers):
        assert torch.equal(mine.positions.sort(-1).values, theirs.positions.sort(-1).values)


@pytest.mark.parametrize("method", ["tova", "h2o", "snapkv", "knorm", "keydiff", "streamingllm"])
def test_any_scoring_method_runs_under_the_rule_and_holds_what_it_gives(method):
    model = tiny_model("llama", num_hidden_layers=4)
    plan = apply_rule(
        Plan.homogeneous(method, 24, 4, "prefill", {"window": 4} if method == "snapkv" else {}),
        "pyramid",
        {"window": 4},
    )
    capacities = [layer.prefill.capacity for layer in plan.layers]
    assert sum(capacities) == 4 * 24 and capacities[0] > capacities[-1] and plan.allocation == "fixed"
    assert plan.provenance["rule"] == "pyramid" and "pyramid rule (window 4, beta 20.0)" in plan.description
    assert _prefilled(model, plan).retained_per_layer() == capacities


def test_a_layer_given_too_few_tokens_for_its_methods_window_runs_with_the_window_shrunk():
    plan = apply_rule(Plan.homogeneous("snapkv", 24, 4, "prefill", {"window": 16}), "pyramid", {"window": 4})
    capacities = [layer.prefill.capacity for layer in plan.layers]
    windows = [layer.prefill.params["window"] for layer in plan.layers]
    assert windows == [16 if c > 16 else c // 4 for c in capacities] and 16 in windows and min(capacities) <= 16
    refitted = [f"{i} (prefill)" for i, c in enumerate(capacities) if c <= 16]
    assert f"Layers {', '.join(refitted)} got too few tokens for their method's window" in plan.description
    validate_plan(plan, 4)
    assert _prefilled(tiny_model("llama", num_hidden_layers=4), plan).retained_per_layer() == capacities


def test_a_layer_the_rule_gives_fewer_tokens_than_its_method_runs_with_gets_the_least_from_the_others():
    sensitivity = [0.0, 5.0, 5.0, 5.0]  # proportional: layer 0 would get nothing (split_total's floor: 1 token)
    tova = apply_rule(Plan.homogeneous("tova", 6, 4, "prefill"), "ppl", statistics=sensitivity)
    assert [layer.prefill.capacity for layer in tova.layers] == [1, 8, 8, 7]  # TOVA runs with 1 token
    snapkv = apply_rule(Plan.homogeneous("snapkv", 6, 4, "prefill", {"window": 2}), "ppl", statistics=sensitivity)
    capacities = [layer.prefill.capacity for layer in snapkv.layers]
    assert capacities[0] == 2 and sum(capacities) == 24  # SnapKV needs a window of 1 and one more token
    assert "Every layer gets at least 2 tokens in the prefill phase" in snapkv.description
    validate_plan(snapkv, 4)


def test_on_a_hybrid_model_the_rule_gives_no_local_layer_more_than_its_window_holds():
    windows = [16, 16, None]  # the tiny Gemma 3: two local layers, one global
    plan = apply_rule(Plan.homogeneous("tova", 20, 3, "prefill"), "pyramid", {"window": 4}, windows=windows)
    capacities = [layer.prefill.capacity for layer in plan.layers]
    assert capacities[:2] == [15, 15] and sum(capacities) == 60  # the surplus went to the global layer
    assert "what the rule gave it beyond went to the others" in plan.description
    assert _prefilled(tiny_model("gemma3"), plan).retained_per_layer() == capacities


def test_a_rule_refuses_what_it_cannot_split():
    with pytest.raises(PlanError, match="fixed allocation"):
        apply_rule(Plan.homogeneous("pyramidkv", 24, 4, allocation="native"), "pyramid")
    with pytest.raises(ValueError, match="unknown allocation rule 'adakv'"):
        apply_rule(Plan.homogeneous("tova", 24, 4), "adakv")
    with pytest.raises(ValueError, match="the pyramid rule's beta"):
        apply_rule(Plan.homogeneous("tova", 24, 4), "pyramid", {"beta": 0})


def written(polykv, out, *options) -> Plan:
    """`plan homogeneous tova` in the prefill scope with these options, written to `out` and read back."""
    result = polykv("plan", "homogeneous", "tova", "--scope", "prefill", *options, "-o", str(out))
    assert result.returncode == 0, result.stderr
    return Plan.load(out)


def test_plan_homogeneous_writes_a_ruled_plan_and_refuses_a_bad_rule_in_one_line(polykv, tmp_path):
    options = ("--capacity", "32", "--rule", "pyramid", "--rule-param", "window=8")
    plan = written(polykv, tmp_path / "pyramid.json", *options)
    assert sum(layer.prefill.capacity for layer in plan.layers) == 5 * 32 and plan.provenance["rule"] == "pyramid"
    bad = polykv("plan", "homogeneous", "tova", "--capacity", "32", "--rule", "pyramid", "--rule-param", "beta=0",
                 "-o", str(tmp_path / "bad.json"))  # fmt: skip
    assert_one_line_error(bad, "the pyramid rule's beta")
    assert not (tmp_path / "bad.json").exists()


# ---- CAKE's rule for any method, decided at run time (`polykv.runtime.layer_budgets`) ---------------------------
def test_under_cakes_rule_any_method_gets_the_split_cake_itself_gets_on_that_prompt():
    model = tiny_model("llama", num_hidden_layers=4)
    cake = _prefilled(model, Plan.homogeneous("cake", 24, 4, "prefill", {"window": 4}, allocation="native"))
    for method in ("tova", "h2o", "keydiff", "snapkv"):
        params = {"window": 2} if method == "snapkv" else {}  # under the least the rule gives: its window, 4
        plan = Plan.homogeneous(method, 24, 4, "prefill", params, allocation="cake").model_copy(
            update={"allocation_params": {"window": 4}}
        )
        cache = _prefilled(model, plan)
        assert cache.capacities("prefill") == cake.capacities("prefill"), method  # the same preferences, same split
        assert cache.retained_per_layer() == cache.capacities("prefill") and sum(cache.capacities("prefill")) == 96


def test_cakes_rule_with_room_for_the_whole_prompt_is_the_vanilla_model():
    model = tiny_model("llama", num_hidden_layers=4)
    question = question_for(model, PROMPT, 6)
    plan = Plan.homogeneous("tova", 1000, 4, allocation="cake")
    assert answers.answer_alone(model, plan, question, "score").nll == vanilla_nll(model, question)


@pytest.mark.parametrize("start", [None, 60])
def test_cakes_rule_batched_gives_what_it_gives_alone(start):
    model = tiny_model("llama", num_hidden_layers=4)
    question = dataclasses.replace(question_for(model, PROMPT, 6), question_start=start)
    plans = [
        Plan.homogeneous(m, 20, 4, scope, allocation="cake").model_copy(update={"allocation_params": {"window": 8}})
        for m, scope in (("tova", "prefill"), ("h2o", "both"), ("keydiff", "prefill"), ("streamingllm", "both"))
    ]
    assert_batched_as_alone(model, plans, question)


def test_cakes_rule_gives_no_local_layer_more_than_its_window_holds():
    plan = Plan.homogeneous("tova", 20, 3, "prefill", allocation="cake").model_copy(
        update={"allocation_params": {"window": 4}}
    )
    cache = _prefilled(tiny_model("gemma3"), plan)
    assert max(cache.capacities("prefill")[:2]) <= 15 and sum(cache.capacities("prefill")) == 60


def test_cakes_predicted_split_is_the_mean_of_what_each_prompt_got():
    model = tiny_model("llama", num_hidden_layers=4)
    plan = Plan.homogeneous("tova", 24, 4, "prefill", allocation="cake").model_copy(
        update={"allocation_params": {"window": 4}}
    )
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, model.config.vocab_size, (80,), generator=generator).tolist() for _ in range(2)]
    each = []
    for ids in prompts:
        with routed(model, plan) as session, torch.no_grad():
            model(torch.tensor([ids]), use_cache=True)
            each.append(session.cache.capacities("prefill"))
    predicted = predicted_split(model, plan, prompts)["prefill"]
    assert predicted == [(a + b) / 2 for a, b in zip(*each)] and sum(predicted) == 96
    with pytest.raises(PlanError, match="only a run-time split is predicted"):
        predicted_split(model, Plan.homogeneous("tova", 24, 4, "prefill"), prompts)


def test_cakes_rule_refuses_a_layer_without_a_capacity_and_a_method_that_cannot_run_at_its_least():
    with pytest.raises(PlanError, match="allocation: 'cake' splits each phase's total: layer 0, prefill needs"):
        validate_plan(Plan.homogeneous("full", None, 4, "prefill", allocation="cake"), 4)
    with pytest.raises(PlanError, match="may give a layer as few as 32 slots"):
        validate_plan(Plan.homogeneous("snapkv", 64, 4, "prefill", allocation="cake"), 4)  # SnapKV's window: 32
    bad = Plan.homogeneous("tova", 64, 4, allocation="cake").model_copy(update={"allocation_params": {"gamma": -1}})
    with pytest.raises(PlanError, match="allocation_params: "):
        validate_plan(bad, 4)
    assert Plan.from_json(bad.to_json()).allocation_params == {"gamma": -1}  # the rule's parameters are kept
    assert "allocation_params" not in Plan.homogeneous("tova", 64, 4).to_dict()  # plans without a rule as before


# ---- SqueezeAttention's rule (`polykv.profile.squeeze`, rule "squeeze") -------------------------------------------
def test_three_groups_is_the_exact_one_dimensional_kmeans():
    assert three_groups([0.9, 0.1, 0.5, 0.95, 0.12, 0.52]) == [2, 0, 1, 2, 0, 1]
    assert three_groups([0.0, 0.0, 1.0, 10.0]) == [0, 0, 1, 2]


def test_the_squeeze_rule_gives_the_least_changed_layers_their_share_and_the_others_the_rest_equally():
    similarity = [0.5, 0.9, 0.91, 0.2, 0.89, 0.52]  # layers 1, 2, 4 change the hidden state least
    capacities = rule_capacities("squeeze", 6 * 100, 6, {"squeezed": 0.4}, statistics=similarity)
    assert [capacities[i] for i in (1, 2, 4)] == [40, 40, 40] and [capacities[i] for i in (0, 3, 5)] == [160] * 3
    plan = apply_rule(Plan.homogeneous("tova", 100, 6, "prefill"), "squeeze", statistics=similarity)
    assert sum(layer.prefill.capacity for layer in plan.layers) == 600 and plan.provenance["statistics"][1] == 0.9
    with pytest.raises(ValueError, match="one attention similarity per layer"):
        rule_capacities("squeeze", 600, 6)
    with pytest.raises(ValueError, match="squeezed, the share"):
        rule_params("squeeze", {"squeezed": 1.5})


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_attention_similarity_is_read_from_the_models_own_modules(family):
    model = tiny_model(family)
    ids = torch.randint(3, 96, (2, 24), generator=torch.Generator().manual_seed(0)).tolist()
    similarity = attention_similarity(model, ids)
    assert len(similarity) == model.config.num_hidden_layers and all(-1 <= s <= 1 for s in similarity)
    # by hand for layer 0: the hidden state entering it, and that plus its attention output (Gemma 3 normalises the
    # attention output before adding it)
    layer, captured = model.get_decoder().layers[0], []

    def keep(module, args, out):
        captured.append(out[0])

    handle = layer.self_attn.register_forward_hook(keep)
    total = 0.0
    with torch.no_grad():
        for row in ids:
            entering = model(torch.tensor([row]), output_hidden_states=True, use_cache=False).hidden_states[0]
            added = captured[-1] if family == "llama" else layer.post_attention_layernorm(captured[-1])
            total += float(
                torch.nn.functional.cosine_similarity(entering.double(), (entering + added).double(), -1).mean()
            )
    handle.remove()
    assert similarity[0] == pytest.approx(total / len(ids), abs=1e-6)


def test_the_calibration_similarity_is_kept_and_read_back_for_the_same_model_and_length(
    demo_model, tmp_path, monkeypatch
):
    from polykv.profile import squeeze

    model, tokenizer = demo_model
    measured = squeeze.calibration_similarity("demo", model, tokenizer, 48, tmp_path)
    (kept,) = tmp_path.glob("squeeze-*.json")
    with monkeypatch.context() as patch:  # read back without measuring
        patch.setattr(squeeze, "attention_similarity", lambda *args: pytest.fail("measured again"))
        assert squeeze.calibration_similarity("demo", model, tokenizer, 48, tmp_path) == measured
    assert squeeze.calibration_similarity("demo", model, tokenizer, 40, tmp_path) != measured  # another length
    kept.write_text("{damaged")
    assert squeeze.calibration_similarity("demo", model, tokenizer, 48, tmp_path) == measured  # measured again


def test_plan_homogeneous_writes_a_cake_rule_plan_that_plan_show_names(polykv, tmp_path):
    out = tmp_path / "tova-cake.json"
    plan = written(polykv, out, "--capacity", "64", "--allocation", "cake", "--rule-param", "window=16")
    assert plan.allocation == "cake" and plan.allocation_params == {"window": 16}
    shown = polykv("plan", "show", str(out)).stdout
    assert "allocation cake (CAKE's layer rule splits each phase's total" in shown.splitlines()[0]
    both = polykv("plan", "homogeneous", "tova", "--capacity", "64", "--allocation", "cake", "--rule", "pyramid",
                  "-o", str(tmp_path / "both.json"))  # fmt: skip
    assert_one_line_error(both, "a rule applies to a plan of fixed allocation")


def test_cakes_rule_refuses_a_capacity_under_its_window_an_unknown_method_and_stale_parameters():
    with pytest.raises(PlanError, match="at least its window \\(32 slots\\): the prefill phase's total 64"):
        validate_plan(Plan.homogeneous("tova", 16, 4, "prefill", allocation="cake"), 4)  # would not split at run time
    unknown = Plan.homogeneous("tova", 64, 4, "prefill", allocation="cake").to_dict()
    unknown["layers"][1]["prefill"]["method"] = "nosuch"
    with pytest.raises(PlanError, match="unknown method 'nosuch'"):
        validate_plan(Plan.from_dict(unknown), 4)
    stale = Plan.homogeneous("tova", 64, 4, "prefill").model_copy(update={"allocation_params": {"window": 8}})
    with pytest.raises(PlanError, match="allocation_params: only a run-time rule takes them"):
        validate_plan(stale, 4)
    ruled = Plan.homogeneous("tova", 64, 4, "prefill", allocation="cake").model_copy(
        update={"allocation_params": {"window": 8}}
    )
    painted = paint(ruled, [0], "prefill", capacity=40)  # painted capacities are explicit: the rule leaves
    assert painted.allocation == "fixed" and painted.allocation_params == {}


# ---- the profile rules (entropy, ppl) for any method -------------------------------------------------------------
def test_the_profile_rules_split_by_the_profiles_entropy_or_phase_sensitivity_for_any_method(
    polykv, small_profile, tmp_path
):
    from polykv.routing.allocation import allocate_entropy, allocate_ppl

    for rule, expected in (
        ("entropy", lambda phase: allocate_entropy(small_profile.entropy, 32)),
        ("ppl", lambda phase: allocate_ppl(small_profile.table, phase, 32)),
    ):
        plan = written(polykv, tmp_path / f"{rule}.json", "--capacity", "32", "--rule", rule,
                       "--profile", str(small_profile.path))  # fmt: skip
        capacities = [layer.prefill.capacity for layer in plan.layers]
        assert capacities == expected("prefill") and plan.provenance["rule"] == rule  # TopRank's split, for TOVA
        assert {layer.prefill.method for layer in plan.layers} == {"tova"}
    missing = polykv("plan", "homogeneous", "tova", "--capacity", "32", "--rule", "ppl", "-o", str(tmp_path / "m.json"))
    assert_one_line_error(missing, "--rule ppl splits by a profile's statistics: give --profile DIR")


def test_the_designers_split_over_some_layers_names_those_whose_window_shrank_by_their_own_index():
    from polykv.plan_edits.whole_plan import split_by_rule

    plan = Plan.homogeneous("snapkv", 40, 6, "prefill", {"window": 16})
    ruled = split_by_rule(plan, "pyramid", 40, layers=[3, 4, 5])
    assert [layer.prefill.capacity for layer in ruled.layers] == [40, 40, 40, 70, 40, 10]
    assert [layer.prefill.params["window"] for layer in ruled.layers] == [16] * 5 + [2]
    assert ruled.description.endswith("over layers 3, 4, 5: layer 5 got too few tokens for their method's parameters, "
                                      "which shrink to fit there.")  # fmt: skip

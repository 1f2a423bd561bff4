"""Plan search (`polykv.search`): exact totals after every move, never worse than the start, reproducible,
within its evaluation budget, disjoint search and held-out text, and a planted best plan found."""

from __future__ import annotations

import json
import math
import random
import string
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from polykv.methods import for_phase, validate_plan
from polykv.plan import Plan, Scope
from polykv.search import Objective, SearchSettings, apply, build_sequences, check_disjoint, proposals, search, totals
from polykv.search.moves import Move, base_params, check_space
from polykv.search.objective import plan_key
from polykv.search.text.run import held_out_verdict, homogeneous_plans
from tests.helpers import assert_one_line_error, plan_of, random_sequences, tiny_model


# ---- moves ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scope", ["decode", "prefill", "both"])
def test_totals_stay_exact_after_every_move(scope):
    budget, layers = 16, 4
    methods = [m for m in for_phase(Scope(scope).phases[0]) if all(m in for_phase(p) for p in Scope(scope).phases)]
    plan = plan_of([methods[0]] * layers, [budget] * layers, scope)
    want = {p.value: layers * budget for p in Scope(scope).phases}
    params = base_params([plan])
    rng = random.Random(0)
    kinds = set()
    for _ in range(60):  # a random walk through the space, every step checked
        neighbours = proposals(plan, budget, params, context_length=1024)
        assert neighbours
        move, plan = rng.choice(neighbours)
        kinds.add(move.kind)
        assert totals(plan) == want, move.describe()
        check_space(plan, budget)
        validate_plan(plan, layers, 1024)
        assert all(layer[p].capacity >= 2 for layer in plan.layers for p in plan.scope.phases)
    assert {"method", "transfer"} <= kinds <= {"method", "transfer", "rule", "heads"}


def test_rule_and_head_moves_split_a_phase_by_a_published_rule_and_toggle_ada_kv_where_it_runs():
    plan = plan_of(["tova"] * 4, [16] * 4, "prefill")
    neighbours = {m.describe(): (m, p) for m, p in proposals(plan, 16, base_params([plan]), context_length=1024)}
    move, pyramid = neighbours["prefill split by the pyramid rule"]
    capacities = [layer.prefill.capacity for layer in pyramid.layers]
    assert list(move.capacities) == capacities and sum(capacities) == 64 and capacities[0] > capacities[-1]
    assert [layer.prefill.method for layer in pyramid.layers] == ["tova"] * 4
    assert "prefill split by the uniform rule" not in neighbours  # already uniform: no move
    assert neighbours["KV heads -> adakv"][1].head_allocation == "adakv"
    back = proposals(pyramid, 16, base_params([plan]), context_length=1024)
    assert any(m.describe() == "prefill split by the uniform rule" for m, _ in back)
    decode = plan_of(["tova"] * 4, [16] * 4, "decode")  # Ada-KV's decode rule: proposed there too
    assert [m.describe() for m, _ in proposals(decode, 16, base_params([decode]), context_length=1024)][0] == (
        "KV heads -> adakv"
    )
    merging = plan_of(["cam"] * 4, [16] * 4, "decode")  # a merging method has no scores to split: not proposed
    assert not [m for m, _ in proposals(merging, 16, base_params([merging]), context_length=1024) if m.kind == "heads"]


def test_capacity_moves_refit_windows_and_check_space_refuses_outsiders():
    plan = plan_of(["cake", "cake"], [64, 64])
    params = base_params([plan])
    assert plan.layers[0].decode.params == {}  # the default window 32 fits under 64
    moved = apply(plan, Move("transfer", "decode", 1, donor=0, amount=56), params)
    assert [lay.decode.capacity for lay in moved.layers] == [8, 120]
    assert moved.layers[0].decode.params["window"] == 2  # shrunk to a quarter of 8, so it fits
    back = apply(moved, Move("transfer", "decode", 0, donor=1, amount=56), params)
    assert plan_key(back) == plan_key(plan)  # the window follows the capacity back: base parameters, refitted
    with pytest.raises(ValueError, match="add up to"):
        check_space(plan, 60)
    with pytest.raises(ValueError, match="fixed-allocation"):
        check_space(Plan.homogeneous("cake", 64, 2, "decode", allocation="native"), 64)


def test_moves_are_ranked_by_the_profile():
    # layer 1's current method (streamingllm) is far worse than tova there; layer 0 barely suffers.
    rows = []
    for layer, scores in enumerate([{"streamingllm": 0.01, "tova": 0.02}, {"streamingllm": 0.9, "tova": 0.1}]):
        for method in for_phase("decode"):
            rows.append(
                {"layer": layer, "scope": "decode", "method": method, "cosine": 0.9, "dppl": scores.get(method, 0.5)}
            )
    meta = SimpleNamespace(method_params={}, scopes=["decode"])
    profile = SimpleNamespace(table=pd.DataFrame(rows), meta=meta, entropy=[1.0, 3.0])
    plan = plan_of(["streamingllm", "streamingllm"], [16, 16])
    ranked = proposals(plan, 16, base_params([plan], profile), profile, "dppl")
    first_method = next(m for m, _ in ranked if m.kind == "method")
    first_transfer = next(m for m, _ in ranked if m.kind == "transfer")
    assert (first_method.layer, first_method.method) == (1, "tova")
    assert (first_transfer.donor, first_transfer.layer) == (0, 1)  # capacity goes where the method hurts most
    # the profile's own rules are moves too: the entropy rule splits 32 tokens 1 : 3
    rules = {m.method: m.capacities for m, _ in ranked if m.kind == "rule"}
    assert rules["entropy"] == (8, 24) and sum(rules["ppl"]) == 32 and "pyramid" in rules


def test_on_a_hybrid_model_every_move_keeps_the_retained_kv_exact():
    # Layers 0, 1 and 3 are local (window 9: they hold at most 8 tokens); layer 2 is global.
    from polykv.kv_memory import layer_tokens

    windows = [9, 9, None, 9]

    def retained(plan):
        return sum(after for _, after in layer_tokens(plan, prompt=100, answer=10, windows=windows))  # decode plans

    roomy = plan_of(["tova"] * 4, [12] * 4)  # a budget above the window: the local layers keep their windows
    neighbours = proposals(roomy, 12, base_params([roomy]), context_length=1024, windows=windows)
    # only the global layer's method may change: it is the one global layer, and a local layer's capacity above
    # its held tokens is not memory it could give
    # (and the head rule, which changes how a layer's capacity splits over its heads, not how much it keeps)
    assert neighbours and {(m.kind, m.layer) for m, _ in neighbours} == {("method", 2), ("heads", 0)}
    plan = plan_of(["tova"] * 4, [4] * 4)  # under the window: local capacity is held and may move
    rng = random.Random(0)
    receivers = set()
    for _ in range(40):
        neighbours = proposals(plan, 4, base_params([plan]), context_length=1024, windows=windows)
        for move, after in neighbours:
            assert retained(after) == retained(plan) == 16, move.describe()
            assert all(a.decode.capacity <= 8 for a, w in zip(after.layers, windows) if w), move.describe()
        move, plan = rng.choice(neighbours)
        receivers.add(move.layer)
    assert 2 in receivers and receivers & {0, 1, 3}  # the global layer and local ones both receive


# ---- the search on a tiny random model ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    model = tiny_model("llama", seed=3)
    return model, random_sequences(4, 48, model.config.vocab_size)


def run_search(model, sequences, starts, **settings):
    objective = Objective(model, sequences, continuation=8)
    options = {"budget": 8, "evaluations": 120, "candidates": 4, "first_rung": 1, "seed": 0, **settings}
    return objective, search(objective, starts, SearchSettings(**options))


@pytest.mark.slow  # runs the search twice over the tiny model
def test_search_is_never_worse_than_its_start_and_the_trace_only_falls(tiny):
    model, sequences = tiny
    starts = [plan_of(["streamingllm"] * 3, [8] * 3), plan_of(["knorm"] * 3, [8] * 3)]
    objective, result = run_search(model, sequences, starts)
    assert result.objective <= min(result.starts.values())
    # Executed again from scratch (no cached score), the returned plan scores what the search says.
    fresh = Objective(model, sequences, continuation=8)
    assert fresh.value(result.plan) == pytest.approx(result.objective, rel=1e-9, abs=1e-12)
    assert fresh.value(result.plan) <= min(fresh.value(p) for p in starts) + 1e-12
    values = [t.objective for t in result.trace]
    assert all(b <= a for a, b in zip(values, values[1:]))
    assert totals(result.plan) == {"decode": 24}
    json.dumps(result.to_dict())  # plain data


@pytest.mark.slow  # runs the search twice
def test_the_same_seed_gives_the_same_plan(tiny):
    model, sequences = tiny
    starts = [plan_of(["tova"] * 3, [8] * 3)]
    _, first = run_search(model, sequences, starts, seed=5)
    _, again = run_search(model, sequences, starts, seed=5)
    assert plan_key(first.plan) == plan_key(again.plan)
    assert [t.to_dict() for t in first.trace] == [t.to_dict() for t in again.trace]
    assert [m.describe() for m in first.moves] == [m.describe() for m in again.moves]


def test_the_evaluation_budget_is_never_exceeded(tiny):
    model, sequences = tiny
    starts = [plan_of(["h2o"] * 3, [8] * 3)]
    objective, result = run_search(model, sequences, starts, evaluations=23)
    assert result.evaluations <= 23 and objective.executions == result.evaluations
    assert result.stopped == "budget" and result.trace[-1].event == "budget"
    with pytest.raises(ValueError, match="cannot even evaluate"):
        run_search(model, sequences, starts, evaluations=3)  # 4 sequences for the start alone


# ---- a planted best plan ------------------------------------------------------------------------------------
VOCAB, HIDDEN, BOS = 32, 64, 1
SIGNAL = (7, 17, 27)  # the tokens whose values carry the planted layer's output


def planted_model(seed: int = 0):
    """Three layers; only layer 1's attention matters, and there only the rules that read the keys alone (Knorm,
    KeyDiff) are harmless.

    Layers 0 and 2 write nothing (o_proj = 0) and no MLP writes (down_proj = 0), so any method is harmless
    there. Layer 1 sees the embeddings, which flag three kinds of tokens (BOS, signal, noise), and its one
    head has a constant query (low-frequency RoPE dimensions only, rope_theta 1e12: no position effect):
      BOS    score 12, key norm 12: holds almost all attention; its value is small
      noise  score 2, key norm 40: more attention than signal, but negligible in all; value 0
      signal score 0, key norm 0: tiny attention, but a value so large that it moves the output
    Every method that ranks by attention (H2O, TOVA, Scissorhands, CAKE, D2O) keeps noise before signal;
    StreamingLLM and CaM keep only sinks and recent tokens; Random keeps what it draws. Knorm drops the largest
    keys (noise) first and keeps BOS and every signal token; KeyDiff drops the keys most like the mean key
    direction, the noise's, and keeps BOS and the signal (a zero key is like no direction): only they reproduce
    FullKV.
    """
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=1,
        num_key_value_heads=1,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 1e12},
        tie_word_embeddings=False,
        bos_token_id=BOS,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa").eval()
    g = torch.Generator().manual_seed(seed)
    a = c = r = 4.0  # flag, constant and identity parts: every embedding has the same norm
    rms = math.sqrt((a * a + c * c + r * r) / HIDDEN)
    flag = a / rms  # a flag after the layer norm
    with torch.no_grad():
        emb = torch.zeros(VOCAB, HIDDEN)
        identity = torch.randn(VOCAB, HIDDEN - 8, generator=g)
        emb[:, 8:] = r * identity / identity.norm(dim=-1, keepdim=True)
        emb[:, 3] = c
        for t in range(VOCAB):
            emb[t, 0 if t == BOS else 2 if t in SIGNAL else 1] = a
        model.model.embed_tokens.weight.copy_(emb)
        for i, layer in enumerate(model.model.layers):
            layer.mlp.down_proj.weight.zero_()
            att = layer.self_attn
            if i != 1:
                att.o_proj.weight.zero_()
                continue
            for w in (att.q_proj.weight, att.k_proj.weight, att.v_proj.weight, att.o_proj.weight):
                w.zero_()
            # Head dimensions 16 and 17 rotate at 1e12 ** (-2 * 16 / 64) = 1e-6 rad per position.
            att.q_proj.weight[16, 3] = 8.0 / (c / rms)  # q = 8 e16; scores are q.k / sqrt(64)
            att.k_proj.weight[16, 0] = 12.0 / flag  # BOS
            att.k_proj.weight[16, 1] = 2.0 / flag  # noise ...
            att.k_proj.weight[17, 1] = 40.0 / flag  # ... with a large norm
            att.v_proj.weight[0, 2] = 1e5 / flag  # signal
            att.v_proj.weight[1, 0] = 4.0 / flag  # BOS
            direction = torch.randn(HIDDEN - 8, generator=g)
            att.o_proj.weight[8:, 0] = direction / direction.norm()
        model.lm_head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=g))
    return model


@pytest.fixture(scope="module")
def planted():
    return planted_model(), random_sequences(4, 57, VOCAB, seed=1, bos=BOS)


KEYS_ALONE = ("knorm", "keydiff")  # the planted model's harmless methods in layer 1


def test_the_plant_holds_only_the_key_rules_are_harmless_in_layer_1(planted):
    model, sequences = planted
    objective = Objective(model, sequences, continuation=8)
    kl = {m: objective.value(plan_of(["streamingllm", m, "streamingllm"], [12] * 3)) for m in for_phase("decode")}
    others = min(v for m, v in kl.items() if m not in KEYS_ALONE)
    assert max(kl[m] for m in KEYS_ALONE) < 0.01 * others, kl
    # and layers 0 and 2 do not matter at all
    assert objective.value(plan_of(["tova", "knorm", "h2o"], [12] * 3)) == pytest.approx(kl["knorm"], abs=1e-9)


@pytest.mark.slow  # a whole search over the planted model
def test_the_search_finds_the_planted_best_plan(planted):
    model, sequences = planted
    starts = [plan_of(["streamingllm"] * 3, [12] * 3), plan_of(["tova"] * 3, [12] * 3)]
    objective = Objective(model, sequences, continuation=8)
    result = search(objective, starts, SearchSettings(budget=12, evaluations=400, candidates=6, first_rung=1, seed=0))
    assert result.plan.layers[1].decode.method in KEYS_ALONE, [m.describe() for m in result.moves]
    assert result.objective < 0.01 * min(result.starts.values())
    assert totals(result.plan) == {"decode": 36}


# ---- sequences and the verdict --------------------------------------------------------------------------------
def test_held_out_and_search_sequences_never_overlap(demo_model, tmp_path):
    model, tokenizer = demo_model
    found = build_sequences(tokenizer, model, "demo", search=3, held_out=3, max_tokens=64, continuation=8)
    check_disjoint(found.search, found.held_out, 8)
    assert not {tuple(s) for s in found.search} & {tuple(s) for s in found.held_out}
    assert found.search_corpus["spec"]["split"] == "calibration"
    assert found.held_out_corpus["spec"]["split"] == "evaluation"
    # A text source: the two splits draw from disjoint byte ranges. The text must not repeat itself (a
    # refrain in every line would give sequences of both splits the same scored tail now and then, which
    # the check rightly refuses), so its words are random letters.
    rng = random.Random(0)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 7))) for _ in range(40_000)]
    text = tmp_path / "text.txt"
    text.write_text("\n".join(" ".join(words[i : i + 10]) for i in range(0, len(words), 10)))
    texts = build_sequences(
        tokenizer, model, "demo", search=4, held_out=4, max_tokens=48, continuation=8, sources=[f"file:{text}"]
    )
    assert not {tuple(s) for s in texts.search} & {tuple(s) for s in texts.held_out}
    with pytest.raises(ValueError, match="also appears"):
        check_disjoint(found.search, [found.held_out[0], found.search[1]], 8)
    with pytest.raises(ValueError, match="also appears"):  # the same scored tail after another prompt
        check_disjoint(found.search, [found.held_out[0][:20] + found.search[2][20:]], 8)


def test_held_out_verdict_pairs_sequences(tiny):
    model, sequences = tiny
    held_out = Objective(model, sequences, continuation=8)
    a, b = plan_of(["tova"] * 3, [8] * 3), plan_of(["streamingllm"] * 3, [8] * 3)
    verdict = held_out_verdict(held_out, {"searched": a, "toprank": a, "homogeneous": b})
    json.dumps(verdict.model_dump(mode="json"))
    same = [c for c in verdict.contrasts if (c.a, c.b) == ("searched", "toprank")]
    assert {c.metric for c in same} == {"kl", "top1", "ppl"}
    assert all(c.difference == 0 and c.low == 0 and c.high == 0 for c in same if not c.log)
    kl = next(c for c in verdict.contrasts if (c.a, c.b, c.metric) == ("searched", "homogeneous", "kl"))
    per = verdict.plans
    expected = sum(x.kl - y.kl for x, y in zip(per["searched"].per_sequence, per["homogeneous"].per_sequence))
    assert kl.difference == pytest.approx(expected / len(sequences))
    assert kl.low <= kl.difference <= kl.high
    assert len(per["searched"].per_sequence) == len(sequences)


def test_homogeneous_candidates_cover_the_scope():
    plans = homogeneous_plans(Scope.DECODE, 16, 3, base_params([]))
    names = {p.name for p in plans}
    assert {f"{m}-decode-16" for m in for_phase("decode")} <= names
    assert "cake-decode-16-native" in names and "d2o-decode-16-native" in names


# ---- the command -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--budget", "16", "--budget", "16"], "twice"),
        (["--budget", "16", "--metric", "ppl"], "--metric"),
        (["--budget", "16", "--statistic", "mean"], "--statistic"),
        (["--budget", "4096"], "context"),
        (["--budget", "16", "--profile", "no-such-profile"], "no-such-profile"),
    ],
)
def test_search_command_refuses_bad_input_in_one_line(polykv, tmp_path, args, expected):
    result = polykv("search", "--out", str(tmp_path / "out"), "-w", str(tmp_path / "ws"), *args)
    assert_one_line_error(result, expected)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_search_command_end_to_end(polykv, tmp_path):
    ws, out = tmp_path / "ws", tmp_path / "out"
    made = polykv("profile", "--sequences", "2", "--max-tokens", "128", "-w", str(ws))
    assert made.returncode == 0, made.stderr
    key = next((ws / "profiles").iterdir()).name
    result = polykv(
        "search",
        "--profile",
        key,
        "--budget",
        "16",
        "--budget",
        "24",
        "--evaluations",
        "40",
        "--search-sequences",
        "2",
        "--held-out",
        "3",
        "--max-tokens",
        "128",
        "--out",
        str(out),
        "-w",
        str(ws),
    )
    assert result.returncode == 0, result.stderr
    assert "searched - toprank" in result.stdout and "searched - homogeneous" in result.stdout
    report = json.loads((out / "report.json").read_text())
    assert [b["budget"] for b in report["budgets"]] == [16, 24]
    seq = report["sequences"]
    assert seq["search"]["fingerprint"] != seq["held_out"]["fingerprint"]
    for entry in report["budgets"]:
        plan = Plan.load(out / f"{entry['plan']['name']}.json")
        assert plan.provenance["built_by"] == "search" and plan.provenance["budget"] == entry["budget"]
        assert totals(plan) == {"decode": 5 * entry["budget"]}
        assert entry["search"]["evaluations"] <= 40
        assert entry["search"]["objective"] <= min(entry["search"]["starts"].values())
    from polykv.search.text.report import main

    assert main([str(out / "report.json"), "--out", str(tmp_path / "search.md")]) == 0
    text = (tmp_path / "search.md").read_text()
    assert "## Verdict" in text and "## Budget 16" in text and "## Budget 24" in text


def test_the_dppl_objective_is_the_perplexity_change(tiny):
    model, sequences = tiny
    objective = Objective(model, sequences, continuation=8, metric="dppl")
    plan = plan_of(["tova"] * 3, [8] * 3)
    scores = objective.scores(plan, range(len(sequences)))
    expected = sum(math.exp(s.nll) - math.exp(s.reference_nll) for s in scores) / len(scores)
    assert objective.value(plan) == pytest.approx(expected)
    assert objective.executions == len(sequences)  # scored once each, then cached
    with pytest.raises(ValueError, match="objective metric"):
        Objective(model, sequences, metric="top1")


def test_a_capacity_only_search_moves_capacity_between_layers_and_never_changes_a_method(tiny):
    model, sequences = tiny
    start = plan_of(["tova", "knorm", "tova"], [8] * 3)
    _, result = run_search(model, sequences, [start], evaluations=60, moves=("transfer",))
    tried = [t.move for t in result.trace if t.move]
    assert tried and all(" -> L" in move and move.endswith(" tokens") for move in tried)  # transfers only
    assert all(m.kind == "transfer" for m in result.moves)
    assert [layer.decode.method for layer in result.plan.layers] == ["tova", "knorm", "tova"]
    assert totals(result.plan) == {"decode": 24} and result.settings.to_dict()["moves"] == ["transfer"]
    with pytest.raises(ValueError, match="moves: \\['teleport'\\]"):
        SearchSettings(8, moves=("teleport",))

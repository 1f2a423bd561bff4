"""Profiles end to end on the demo model: `polykv profile` -> `polykv route` -> a valid plan."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from polykv.methods import validate_plan
from polykv.plan import Plan
from polykv.profile.corpus import CorpusSpec, build_corpus
from polykv.profile.profiler import profile_methods
from polykv.profile.store import ProfileError, load_profile
from tests.helpers import assert_one_line_error, slow_after, tiny_model

SMALL = ["--sequences", "4", "--max-tokens", "160"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """One small profile of the demo model, built through the CLI's library call."""
    from polykv.models import load_model
    from polykv.profile.build import build_profile

    patch = pytest.MonkeyPatch()
    patch.setenv("POLYKV_HOME", str(tmp_path_factory.mktemp("home")))
    model, tokenizer = load_model("demo")
    root = tmp_path_factory.mktemp("workspace") / "profiles"
    profile = build_profile("demo", model, tokenizer, root, CorpusSpec(num_sequences=4, max_tokens=160))
    yield profile, model, tokenizer, root
    patch.undo()


def test_profile_has_every_layer_method_and_scope(profiled):
    profile, model, *_ = profiled
    table = profile.table
    assert set(table.scope) == {"prefill", "decode"}
    assert len(table) == 5 * (
        len(table[table.scope == "prefill"].method.unique()) + len(table[table.scope == "decode"].method.unique())
    )
    assert "snapkv" in set(table[table.scope == "prefill"].method) and "snapkv" not in set(
        table[table.scope == "decode"].method
    )
    full = table[table.method == "full"]
    assert (full.cosine - 1.0).abs().max() <= 1e-6  # a layer left full is FullKV
    # fp32 rounding between the block reference and the incremental runs: ~1e-7 of a PPL in the hundreds
    # (this small model on prose it was not trained on)
    assert full.dppl.abs().max() <= 1e-4
    assert table.cosine.notna().all() and table.dppl.notna().all()
    assert len(profile.entropy) == 5 and all(h > 0 for h in profile.entropy)
    meta = json.loads((profile.path / "profile.json").read_text())
    assert (
        meta["model"] == "demo"
        and meta["corpus"]["spec"]["seed"] == 0
        and meta["capacity"] == profile.metadata["capacity"]
    )
    assert pd.read_csv(profile.path / "methods.csv").shape == table.shape


def test_same_key_reuses_the_profile(profiled):
    from polykv.profile.build import build_profile

    profile, model, tokenizer, root = profiled
    again = build_profile("demo", model, tokenizer, root, CorpusSpec(num_sequences=4, max_tokens=160))
    assert again.path == profile.path and again.metadata["created"] == profile.metadata["created"]


def test_prefix_reuse_gives_the_naive_profile(profiled):
    _, model, tokenizer, _ = profiled
    corpus = build_corpus(tokenizer, CorpusSpec(num_sequences=2, max_tokens=96), model=model)
    kwargs = dict(methods=["tova", "snapkv", "h2o"])
    fast = pd.DataFrame(profile_methods(model, corpus.sequences, 16, **kwargs).rows)
    naive = pd.DataFrame(profile_methods(model, corpus.sequences, 16, reuse_prefix=False, **kwargs).rows)
    # Identical up to fp32 summation order (layers below l: one block pass vs token by token)
    assert (fast.cosine - naive.cosine).abs().max() <= 1e-6
    assert (fast.dppl - naive.dppl).abs().max() <= 1e-3  # PPLs here are in the hundreds


@pytest.mark.parametrize("scope", ["prefill", "decode", "both"])
def test_route_builds_a_valid_plan_for_each_scope(profiled, polykv, tmp_path, scope):
    profile, *_ = profiled
    out = tmp_path / f"{scope}.json"
    result = polykv(
        "route", str(profile.path), "--scope", scope, "--budget", "40", "--allocation", "entropy", "-o", str(out)
    )
    assert result.returncode == 0, result.stderr
    plan = validate_plan(Plan.load(out), 5)
    assert plan.scope.value == scope and plan.provenance["profile"] == profile.key
    # FullKV's perplexity per source, then a confidence table per phase: a row per layer, TopRank's pick first
    assert "FullKV perplexity of the calibration continuations: " in result.stdout
    lines = result.stdout.splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith("layer  winner")]
    assert len(headers) == len(plan.scope.phases)
    for phase, i in zip(plan.scope.phases, headers):
        assert lines[i - 1].startswith(f"{phase.value} route by cosine") and "win freq" in lines[i]
        assert [line.split()[1] for line in lines[i + 1 : i + 6]] == [layer[phase].method for layer in plan.layers]
    for phase in plan.scope.phases:
        assert plan.summary().phases[phase].total_capacity == 5 * 40


def test_cli_profile_then_route(polykv, tmp_path):
    ws = tmp_path / "ws"
    result = polykv("profile", *SMALL, "--scope", "decode", "-w", str(ws))
    assert result.returncode == 0, result.stderr
    assert "decode: dPPL by layer" in result.stdout
    (profile_dir,) = (ws / "profiles").iterdir()
    routed_plan = polykv(
        "route", str(profile_dir), "--scope", "decode", "--budget", "32", "-o", str(tmp_path / "p.json")
    )
    assert routed_plan.returncode == 0, routed_plan.stderr
    prefill = polykv("route", str(profile_dir), "--scope", "prefill", "--budget", "32", "-o", str(tmp_path / "q.json"))
    assert_one_line_error(prefill, "has no prefill measurements")


def test_bad_profile_inputs_are_one_line(polykv, profiled, tmp_path):
    profile, *_ = profiled
    assert_one_line_error(
        polykv("profile", *SMALL, "--sources", "kjv,file:/no/such.txt", "-w", str(tmp_path)), "no/such.txt"
    )
    assert_one_line_error(polykv("profile", *SMALL, "--sources", "wikitext", "-w", str(tmp_path)), "wikitext")
    assert_one_line_error(
        polykv("profile", *SMALL, "--b-cal", "400", "-w", str(tmp_path)), "b_cal (400) must be smaller"
    )
    other = tmp_path / "tiny"
    tiny_model("llama").save_pretrained(other)
    result = polykv("route", str(profile.path), "--budget", "32", "--model", str(other), "-o", str(tmp_path / "x.json"))
    assert_one_line_error(result, "was measured on 'demo' (5 layers)")
    assert_one_line_error(
        polykv("route", str(tmp_path), "--budget", "32", "-o", str(tmp_path / "x.json")), "not a profile directory"
    )


def test_load_profile_refuses_a_foreign_directory(tmp_path):
    (tmp_path / "profile.json").write_text('{"format": "something-else"}')
    (tmp_path / "methods.csv").write_text("layer,scope,method,cosine,dppl\n")
    (tmp_path / "layers.csv").write_text("layer,entropy\n")
    with pytest.raises(ProfileError, match="not a version-1 PolyKV profile"):
        load_profile(tmp_path)


def test_cli_heterogeneity(polykv):
    result = polykv("heterogeneity", "--inputs", "3", "--max-tokens", "96")
    assert result.returncode == 0, result.stderr
    assert "90% attention support per layer, 3 inputs of 96 tokens" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines()[2:]]
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3, 4]
    assert all(1 <= float(r[1]) <= 96 for r in rows)  # median support sizes within the context


def test_the_profiles_entropy_sums_each_querys_attention_entropy_by_hand():
    """`entropy_sums`, what the profiler records: zero queries attend uniformly over what they see (causally), so the
    queries at positions 0, 1 and 3 over keys 0..3 have entropies 0, log 2 and log 4."""
    import math

    import torch

    from polykv.runtime.attention_math import entropy_sums

    query, key = torch.zeros(1, 1, 3, 4), torch.randn(1, 1, 4, 4)
    total = entropy_sums(query, key, torch.tensor([0, 1, 3]), torch.arange(4).view(1, 1, 4), 1.0, None)
    assert torch.allclose(total, torch.tensor([[math.log(2) + math.log(4)]], dtype=torch.float64))


# ---- per-sequence values, intervals, staleness, entropy ------------------------------------------
def test_profile_keeps_per_sequence_values_behind_every_cell(profiled):
    from polykv.plan import Phase
    from polykv.profile.confidence import cell_intervals, fullkv_perplexity
    from polykv.profile.profiler import PROFILE_REVISION, profiled_methods
    from polykv.profile.store import INTERVAL_COLUMNS, METHOD_COLUMNS

    profile, *_ = profiled
    saved = load_profile(profile.path)
    meta, n, tokens = saved.metadata, 4, saved.metadata["continuation"]
    assert meta["methods"] == profiled_methods([Phase(s) for s in meta["scopes"]]) and meta["methods"]["cake"] == 2
    assert meta["profile_revision"] == PROFILE_REVISION
    assert meta["entropy"] == "mean attention entropy over all prompt queries, heads and sequences (nats)"
    assert list(pd.read_csv(profile.path / "methods.csv").columns) == METHOD_COLUMNS + INTERVAL_COLUMNS

    # every cell's point values are the per-sequence values' mean (cosine) and PPL difference (dPPL)
    sequences, reference = saved.sequences, saved.reference
    assert len(sequences) == n * len(saved.table) and list(reference.sequence) == list(range(n))
    sources = [r["source"] for r in meta["corpus"]["records"]]
    assert list(reference.source) == sources
    cells = sequences.groupby(["layer", "scope", "method"]).agg(cosine=("cosine", "mean"), nll=("nll", "sum"))
    table = saved.table.set_index(["layer", "scope", "method"]).loc[cells.index]
    assert (table.cosine - cells.cosine).abs().max() <= 1e-12
    ref_ppl = math.exp(reference.nll.sum() / (n * tokens))
    assert ((cells.nll / (n * tokens)).map(math.exp) - ref_ppl - table.dppl).abs().max() <= 1e-9

    # intervals: the bootstrap of the saved values; FullKV's own rows have none to speak of
    again = cell_intervals(sequences, reference.nll.tolist(), tokens).set_index(["layer", "scope", "method"])
    assert (again[INTERVAL_COLUMNS] - table[INTERVAL_COLUMNS]).abs().max().max() <= 1e-12
    assert (table.cosine_low <= table.cosine_high).all() and (table.dppl_low <= table.dppl_high).all()
    full = table.xs("full", level="method")
    # fp32 rounding again, now on replicates whose PPL reaches the worst source's (hundreds here)
    assert full[["dppl_low", "dppl_high"]].abs().max().max() <= 1e-3
    assert meta["fullkv_ppl"] == pytest.approx(fullkv_perplexity(reference.nll, sources, tokens))
    assert list(meta["fullkv_ppl"]) == list(dict.fromkeys(sources))


def _throwaway_method():
    from polykv.methods.attention_free.streamingllm import StreamingLLM

    class Throwaway(StreamingLLM):
        name = "throwaway"

    return Throwaway


def _refresh(profile) -> str:
    spec = profile.metadata["corpus"]["spec"]
    return (
        f"polykv profile --model demo --b-cal {profile.metadata['capacity']} --seed 0 --sources "
        f"{','.join(spec['sources'])} --sequences 4 --max-tokens 160"
    )


def test_a_new_method_makes_the_profile_stale(profiled, monkeypatch, polykv, tmp_path):
    from polykv.methods import REGISTRY
    from polykv.profile import build
    from polykv.routing import plan_from_profile

    profile, model, tokenizer, root = profiled
    monkeypatch.setitem(REGISTRY, "throwaway", _throwaway_method())
    with pytest.raises(ProfileError, match="lacks throwaway") as refused:
        plan_from_profile(profile, "decode", 24)
    assert _refresh(profile) in str(refused.value) and len(str(refused.value).splitlines()) == 1

    # asking for the profile again measures it (a new key) instead of reusing the old one
    class Measured(Exception):
        pass

    def measure(*args, **kwargs):
        raise Measured

    monkeypatch.setattr(build, "profile_methods", measure)
    with pytest.raises(Measured):
        build.build_profile("demo", model, tokenizer, root, CorpusSpec(num_sequences=4, max_tokens=160))

    result = polykv("route", str(profile.path), "--budget", "24", "-o", str(tmp_path / "p.json"))
    assert_one_line_error(result, "lacks throwaway", _refresh(profile))


def test_a_method_revision_bump_makes_the_profile_stale(profiled, monkeypatch):
    from polykv.methods import REGISTRY
    from polykv.profile import build
    from polykv.routing import plan_from_profile

    profile, model, tokenizer, root = profiled
    monkeypatch.setattr(REGISTRY["tova"], "revision", REGISTRY["tova"].revision + 1)
    with pytest.raises(ProfileError, match=r"measured tova at revision 1 \(now 2\)"):
        plan_from_profile(profile, "both", 24)
    monkeypatch.setattr(build, "profile_methods", lambda *a, **k: (_ for _ in ()).throw(LookupError("measured")))
    with pytest.raises(LookupError, match="measured"):
        build.build_profile("demo", model, tokenizer, root, CorpusSpec(num_sequences=4, max_tokens=160))


def test_a_profile_without_revisions_is_refused(profiled, polykv, tmp_path):
    import shutil

    from polykv.routing import plan_from_profile

    profile, *_ = profiled
    old = tmp_path / "profiles" / profile.key
    shutil.copytree(profile.path, old)
    meta = json.loads((old / "profile.json").read_text())
    del meta["methods"], meta["profile_revision"]
    (old / "profile.json").write_text(json.dumps(meta))
    with pytest.raises(ProfileError, match="predates method revisions"):
        plan_from_profile(load_profile(old), "decode", 24)
    result = polykv("route", str(old), "--budget", "24", "-o", str(tmp_path / "p.json"))
    assert_one_line_error(result, "predates method revisions", _refresh(profile) + f" -w {tmp_path}")


@pytest.mark.parametrize("family, overrides", [("llama", {}), ("mistral", {"sliding_window": 8})])
def test_entropy_is_the_mean_over_every_prompt_query(family, overrides):
    import torch

    from polykv.plan import Phase

    model = tiny_model(family, **overrides)
    sequences = torch.randint(0, 96, (3, 41), generator=torch.Generator().manual_seed(1)).tolist()
    continuation, prompt = 8, 41 - 1 - 8
    result = profile_methods(
        model, sequences, 8, scopes=(Phase.PREFILL,), methods=["streamingllm"], continuation=continuation, batch_size=2
    )  # two batches: 2 + 1 sequences
    # directly: the eager attention weights of the prompt, every query's entropy, mean over everything
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(torch.tensor(sequences)[:, :prompt], output_attentions=True).attentions
    direct = [float(-torch.special.xlogy(a.double(), a.double()).sum(-1).mean()) for a in attentions]
    assert result.entropy == pytest.approx(direct, abs=1e-6)


@pytest.mark.parametrize(
    "family, overrides",
    slow_after(
        [
            # SmolLM2's grouping: 9 query heads over 3 KV heads
            ("llama", {"hidden_size": 72, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 8}),
            ("mistral", {"sliding_window": 20}),  # the window cuts through the prompt: masked above layer l too
            ("qwen3", {}),
            ("gemma3", {}),  # local layers (a 16-token window) and a global one, each with its own rotary base
        ]
    ),
)
def test_the_shared_profile_is_the_naive_loop_for_every_method_and_scope(family, overrides):
    # The fast profiler (one prompt pass per layer for every method, the cells as one batch, the layers
    # above as a block over FullKV's prompt) against every layer run every time, token by token.
    import torch

    model = tiny_model(family, **overrides)
    # distinct tokens within a sequence: no two keys with equal norms, whose order (Knorm) would be decided by
    # the last bit of rounding, which a batch changes
    g = torch.Generator().manual_seed(1)
    sequences = [[1] + (torch.randperm(94, generator=g)[:63] + 2).tolist() for _ in range(3)]
    fast = profile_methods(model, sequences, 12, continuation=8, batch_size=2)  # batches of 2 and 1
    naive = profile_methods(model, sequences, 12, continuation=8, batch_size=2, reuse_prefix=False)
    by_cell = lambda rows: {(r["layer"], r["scope"], r["method"], r["sequence"]): r for r in rows}  # noqa: E731
    fast_cells, naive_cells = by_cell(fast.sequences), by_cell(naive.sequences)
    assert fast_cells.keys() == naive_cells.keys() and len({k[2] for k in fast_cells}) >= 9
    for key, row in fast_cells.items():
        assert row["cosine"] == pytest.approx(naive_cells[key]["cosine"], abs=1e-6), key
        assert row["nll"] == pytest.approx(naive_cells[key]["nll"], rel=1e-6), key
    assert fast.reference_nll == naive.reference_nll and fast.entropy == naive.entropy


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_profiles_fullkv_reference_is_the_vanilla_models_nll(family):
    # The profiler runs the decoder's layers itself: on a hybrid model every layer must get its own layer type's
    # rotary embedding and window, or FullKV's continuation NLL would not be the model's.
    import torch

    model = tiny_model(family)
    g = torch.Generator().manual_seed(2)
    sequences = [[1] + (torch.randperm(94, generator=g)[:47] + 2).tolist() for _ in range(2)]  # 48 > the window
    result = profile_methods(model, sequences, 12, continuation=8, methods=["tova"])
    with torch.no_grad():
        logits = model(torch.tensor(sequences)).logits[:, -9:-1].double()
    targets = torch.tensor(sequences)[:, -8:]
    vanilla = -torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1).sum(-1)
    assert result.reference_nll == pytest.approx(vanilla.tolist(), rel=1e-4)


def test_cli_heterogeneity_of_one_input_prints_no_interval(polykv):
    result = polykv("heterogeneity", "--inputs", "1", "--max-tokens", "64")
    assert result.returncode == 0, result.stderr
    assert "1 input of 64 tokens (one measurement per layer: no interval):" in result.stdout

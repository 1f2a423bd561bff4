"""Profiles end to end on the demo model: `polykv profile` -> `polykv route` -> a valid plan."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import tiny_model
from test_cli import assert_one_line_error, polykv  # noqa: F401  (the fixture)

from polykv.methods import validate_plan
from polykv.plan import Plan
from polykv.profile.corpus import CorpusSpec, build_corpus
from polykv.profile.profiler import profile_methods
from polykv.profile.store import ProfileError, load_profile

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
    assert len(table) == 5 * (len(table[table.scope == "prefill"].method.unique()) + len(table[table.scope == "decode"].method.unique()))
    assert "snapkv" in set(table[table.scope == "prefill"].method) and "snapkv" not in set(table[table.scope == "decode"].method)
    full = table[table.method == "full"]
    assert (full.cosine - 1.0).abs().max() <= 1e-6  # a layer left full is FullKV
    # fp32 rounding between the block reference and the incremental runs: ~1e-7 of a PPL in the hundreds
    # (this small model on prose it was not trained on)
    assert full.dppl.abs().max() <= 1e-4
    assert table.cosine.notna().all() and table.dppl.notna().all()
    assert len(profile.entropy) == 5 and all(h > 0 for h in profile.entropy)
    meta = json.loads((profile.path / "profile.json").read_text())
    assert meta["model"] == "demo" and meta["corpus"]["spec"]["seed"] == 0 and meta["capacity"] == profile.metadata["capacity"]
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
def test_route_builds_a_valid_plan_for_each_scope(profiled, polykv, tmp_path, scope):  # noqa: F811
    profile, *_ = profiled
    out = tmp_path / f"{scope}.json"
    result = polykv("route", str(profile.path), "--scope", scope, "--budget", "40", "--allocation", "entropy", "-o", str(out))
    assert result.returncode == 0, result.stderr
    plan = validate_plan(Plan.load(out), 5)
    assert plan.scope.value == scope and plan.provenance["profile"] == profile.key
    for phase in plan.scope.phases:
        assert plan.summary().phases[phase].total_capacity == 5 * 40


def test_cli_profile_then_route(polykv, tmp_path):  # noqa: F811
    ws = tmp_path / "ws"
    result = polykv("profile", *SMALL, "--scope", "decode", "-w", str(ws))
    assert result.returncode == 0, result.stderr
    assert "decode: dPPL by layer" in result.stdout
    (profile_dir,) = (ws / "profiles").iterdir()
    routed_plan = polykv("route", str(profile_dir), "--scope", "decode", "--budget", "32", "-o", str(tmp_path / "p.json"))
    assert routed_plan.returncode == 0, routed_plan.stderr
    prefill = polykv("route", str(profile_dir), "--scope", "prefill", "--budget", "32", "-o", str(tmp_path / "q.json"))
    assert_one_line_error(prefill, "has no prefill measurements")


def test_bad_profile_inputs_are_one_line(polykv, profiled, tmp_path):  # noqa: F811
    profile, *_ = profiled
    assert_one_line_error(polykv("profile", *SMALL, "--sources", "kjv,file:/no/such.txt", "-w", str(tmp_path)), "no/such.txt")
    assert_one_line_error(polykv("profile", *SMALL, "--sources", "wikitext", "-w", str(tmp_path)), "wikitext")
    assert_one_line_error(polykv("profile", *SMALL, "--b-cal", "400", "-w", str(tmp_path)), "b_cal (400) must be smaller")
    other = tmp_path / "tiny"
    tiny_model("llama").save_pretrained(other)
    result = polykv("route", str(profile.path), "--budget", "32", "--model", str(other), "-o", str(tmp_path / "x.json"))
    assert_one_line_error(result, "was measured on 'demo' (5 layers)")
    assert_one_line_error(polykv("route", str(tmp_path), "--budget", "32", "-o", str(tmp_path / "x.json")), "not a profile directory")


def test_load_profile_refuses_a_foreign_directory(tmp_path):
    (tmp_path / "profile.json").write_text('{"format": "something-else"}')
    (tmp_path / "methods.csv").write_text("layer,scope,method,cosine,dppl\n")
    (tmp_path / "layers.csv").write_text("layer,entropy\n")
    with pytest.raises(ProfileError, match="not a version-1 PolyKV profile"):
        load_profile(tmp_path)


def test_cli_heterogeneity(polykv):  # noqa: F811
    result = polykv("heterogeneity", "--inputs", "3", "--max-tokens", "96")
    assert result.returncode == 0, result.stderr
    assert "90% attention support per layer, 3 inputs of 96 tokens" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines()[2:]]
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3, 4]
    assert all(1 <= float(r[1]) <= 96 for r in rows)  # median support sizes within the context


def test_attention_entropy_on_hand_made_rows():
    import math

    import torch

    from polykv.profile.profiler import attention_entropy

    rows = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    assert torch.allclose(attention_entropy(rows), torch.tensor([math.log(4), 0.0, math.log(2)], dtype=torch.float64))

"""`polykv plan export --to kvpress`: a plan kvpress can express becomes a short Python file building the press that
keeps, at the given prompt length, what the plan keeps in each layer (tested on its text: kvpress need not be
installed); a plan it cannot express is refused in one line, before anything is written."""

from __future__ import annotations

import ast

import pytest

from polykv.kvpress_export import keep_ratio, kvpress_source
from polykv.plan import Plan, PlanError
from polykv.routing.rules import apply_rule
from tests.helpers import assert_one_line_error


def _assigned(source: str) -> dict:
    """The file's top-level assignments, as literals where they are, else the call's text."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                out[node.targets[0].id] = ast.unparse(node.value)
    return out


def test_the_ratio_keeps_exactly_the_capacity_as_kvpress_counts():
    for tokens in (100, 1000, 4096, 131072):
        for capacity in (1, 7, 64, 99, tokens - 1):
            assert max(1, int(tokens * (1 - keep_ratio(tokens, capacity)))) == capacity  # kvpress's compute_n_kept
    assert keep_ratio(64, 128) == 0.0  # a prompt shorter than the capacity: nothing evicted


def test_a_per_layer_split_of_one_method_becomes_a_per_layer_compression_press():
    plan = apply_rule(Plan.homogeneous("tova", 64, 5, "prefill"), "pyramid", {"window": 8})
    source = kvpress_source(plan, 1000)
    assigned = _assigned(source)
    capacities = [layer.prefill.capacity for layer in plan.layers]
    assert [int(1000 * (1 - r)) for r in assigned["compression_ratios"]] == capacities
    assert assigned["press"] == "PerLayerCompressionPress(press=TOVAPress(), compression_ratios=compression_ratios)"
    assert "from kvpress import PerLayerCompressionPress, TOVAPress" in source


def test_one_capacity_everywhere_is_the_scorer_alone_with_kvpress_parameter_names():
    assigned = _assigned(kvpress_source(Plan.homogeneous("lagkv", 256, 4, "prefill", {"lag_size": 64}), 2048))
    assert assigned["press"] == "LagKVPress(compression_ratio=0.874755859375, n_sink=4, lag_size=64)"
    snapkv = Plan.homogeneous("snapkv", 128, 4, "prefill", {"pooling": "avg", "window": 64, "kernel_size": 5})
    assert _assigned(kvpress_source(snapkv, 1024))["press"].endswith("window_size=64, kernel_size=5)")


def test_the_adakv_head_rule_becomes_adakvs_press_around_the_scorer():
    plan = Plan.homogeneous("knorm", 128, 4, "prefill").model_copy(
        update={"head_allocation": "adakv", "head_allocation_params": {"alpha_safeguard": 0.3}}
    )
    assigned = _assigned(kvpress_source(plan, 1024))
    assert assigned["press"] == "AdaKVPress(press=KnormPress(compression_ratio=0.87451171875), alpha_safeguard=0.3)"
    split = apply_rule(plan, "pyramid", {"window": 8})
    with pytest.raises(PlanError, match="AdaKVPress .* takes one compression ratio"):
        kvpress_source(split, 1024)


@pytest.mark.parametrize(
    "plan, why",
    [
        (Plan.homogeneous("tova", 64, 4, "both"), "evicts in the decode phase"),
        (Plan.homogeneous("h2o", 64, 4, "prefill"), "h2o has no kvpress press of the same rule"),
        (Plan.homogeneous("snapkv", 64, 4, "prefill"), "pools the votes by average; this plan's snapkv pools by max"),
        (Plan.homogeneous("pyramidkv", 64, 4, "prefill", allocation="native"), "allocation 'native'"),
        (Plan.homogeneous("tova", 64, 4, "prefill", allocation="cake"), "allocation 'cake'"),
    ],
)
def test_what_kvpress_cannot_express_is_refused_in_one_line(plan, why):
    with pytest.raises(PlanError, match=why):
        kvpress_source(plan, 1000)


def test_the_cli_writes_a_parsable_file_and_refuses_a_mixed_plan_in_one_line(polykv, tmp_path):
    plan = tmp_path / "tova.json"
    apply_rule(Plan.homogeneous("tova", 32, 5, "prefill"), "pyramid", {"window": 8}).save(plan)
    out = tmp_path / "press.py"
    result = polykv("plan", "export", str(plan), "--to", "kvpress", "--tokens", "512", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "compression_ratios" in _assigned(out.read_text())
    mixed = tmp_path / "mixed.json"
    data = Plan.homogeneous("tova", 32, 5, "prefill").to_dict()
    data["layers"][2]["prefill"]["method"] = "knorm"
    Plan.from_dict(data).save(mixed)
    refused = polykv("plan", "export", str(mixed), "--tokens", "512", "-o", str(tmp_path / "no.py"))
    assert_one_line_error(refused, "kvpress runs one method in every layer; this plan runs knorm, tova")
    assert not (tmp_path / "no.py").exists()


def test_a_model_with_sliding_window_layers_is_refused_and_the_file_says_what_kvpress_needs():
    plan = Plan.homogeneous("tova", 64, 3, "prefill")
    with pytest.raises(PlanError, match="kvpress compresses what a sliding-window layer holds"):
        kvpress_source(plan, 4096, windows=[512, 512, None])
    assert "kvpress" in kvpress_source(plan, 4096, windows=[None] * 3)
    per_layer = kvpress_source(apply_rule(Plan.homogeneous("tova", 64, 5, "prefill"), "pyramid"), 4096)
    assert "works only with flash attention" in per_layer

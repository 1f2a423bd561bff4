"""Plan files: schema, exact round-trip, validation messages, summary, homogeneous helper."""

from __future__ import annotations

import json

import pytest

from polykv.methods import REGISTRY, validate_plan
from polykv.plan import LayerPlan, Phase, PhaseAssignment, Plan, PlanError, Scope


def mixed_plan() -> Plan:
    return Plan(
        name="mixed",
        description="snapkv prefill, tova / h2o decode",
        scope=Scope.BOTH,
        provenance={"built_by": "test"},
        layers=[
            LayerPlan(
                prefill=PhaseAssignment(method="snapkv", capacity=64, params={"window": 8}),
                decode=PhaseAssignment(method="tova", capacity=96),
            ),
            LayerPlan(prefill=PhaseAssignment(method="full"), decode=PhaseAssignment(method="h2o", capacity=32)),
            LayerPlan(
                prefill=PhaseAssignment(method="streamingllm", capacity=48, params={"sinks": 2}),
                decode=PhaseAssignment(method="streamingllm", capacity=48),
            ),
        ],
    )


def test_round_trip_is_exact(tmp_path):
    plan = mixed_plan()
    path = plan.save(tmp_path / "p.json")
    text = path.read_text()
    loaded = Plan.load(path)
    assert loaded == plan
    assert loaded.to_json() == text  # the file is canonical: saving again writes the same bytes
    assert json.loads(text)["layers"][1] == {"prefill": {"method": "full"}, "decode": {"method": "h2o", "capacity": 32}}
    assert loaded.layers[0].decode.capacity == 96 and loaded.layers[0][Phase.PREFILL].params == {"window": 8}


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path):
    mixed_plan().save(tmp_path / "p.json")
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


def test_summary_counts_methods_and_capacity():
    s = mixed_plan().summary()
    assert s.phases[Phase.PREFILL].total_capacity == 64 + 48
    assert s.phases[Phase.PREFILL].average_capacity == 56
    assert s.phases[Phase.PREFILL].bounded_layers == 2
    assert s.phases[Phase.DECODE].total_capacity == 96 + 32 + 48
    assert s.phases[Phase.DECODE].method_counts == {"tova": 1, "h2o": 1, "streamingllm": 1}
    assert s.phases[Phase.PREFILL].method_counts == {"snapkv": 1, "full": 1, "streamingllm": 1}
    assert any("B=176" in line for line in s.lines())


def test_homogeneous_helper():
    plan = Plan.homogeneous("snapkv", 128, num_layers=4, scope="prefill")
    validate_plan(plan, 4)
    assert all(layer.prefill == PhaseAssignment(method="snapkv", capacity=128) for layer in plan.layers)
    assert all(layer.decode.method == "full" for layer in plan.layers)
    assert plan.summary().phases[Phase.PREFILL].average_capacity == 128
    both = Plan.homogeneous("tova", 64, num_layers=2)
    assert both.scope is Scope.BOTH and both.layers[1].decode.capacity == 64


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d["layers"][1]["decode"].update(method="nope"), "layer 1, decode, method: unknown method 'nope'"),
        (
            lambda d: d["layers"][0]["decode"].update(method="snapkv", capacity=8),
            "layer 0, decode, method: 'snapkv' does not support the decode phase (supported: prefill)",
        ),
        (
            lambda d: d["layers"][0]["prefill"].update(capacity=0),
            "layer 0, prefill, capacity: Input should be greater than 0",
        ),
        (
            lambda d: d["layers"][2]["decode"].update(capacity=-5),
            "layer 2, decode, capacity: Input should be greater than 0",
        ),
        (
            lambda d: d["layers"][2]["decode"].update(capacity=2.5),
            "layer 2, decode, capacity: Input should be a valid integer",
        ),
        (
            lambda d: d["layers"][2]["decode"].pop("capacity"),
            "layer 2, decode, capacity: 'streamingllm' needs a capacity",
        ),
        (
            lambda d: d["layers"][1]["prefill"].update(capacity=4),
            "layer 1, prefill, capacity: 'full' keeps every token",
        ),
        (
            lambda d: d["layers"][0]["prefill"]["params"].update(window=-1),
            "layer 0, prefill, params.window: snapkv: Input should be greater than or equal to 1",
        ),
        (
            lambda d: d["layers"][0]["prefill"]["params"].update(window=64),
            "layer 0, prefill, params: snapkv: window (64) must be smaller than the capacity (64)",
        ),
        (
            lambda d: d["layers"][0]["prefill"]["params"].update(windw=4),
            "layer 0, prefill, params.windw: snapkv has no parameter 'windw'",
        ),
        (
            lambda d: d.update(scope="prefill"),
            "layer 0, decode, method: the plan's scope is 'prefill', so the decode phase must use 'full'",
        ),
        (lambda d: d.pop("name"), "name: required field is missing"),
        (lambda d: d.update(version=9), "version: this PolyKV reads plan version 1, got 9"),
    ],
)
def test_validation_names_layer_phase_and_field(mutate, expected):
    data = mixed_plan().to_dict()
    mutate(data)
    with pytest.raises(PlanError) as err:
        validate_plan(Plan.from_dict(data), 3)
    message = str(err.value)
    assert expected in message
    assert "\n" not in message


def test_wrong_layer_count():
    with pytest.raises(PlanError, match="the plan has 3 layers but the model has 5"):
        validate_plan(mixed_plan(), 5)


def test_malformed_json_and_missing_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "layers": [')
    with pytest.raises(PlanError, match=r"bad.json: malformed JSON at line 1"):
        Plan.load(bad)
    with pytest.raises(PlanError, match="no such plan file"):
        Plan.load(tmp_path / "missing.json")
    with pytest.raises(PlanError, match="a plan must be a JSON object"):
        Plan.from_json("[1, 2]")


def test_every_registered_method_declares_phases_and_defaults():
    for name, cls in REGISTRY.items():
        assert cls.name == name
        assert cls.phases and cls.phases <= set(Phase)
        assert isinstance(cls.defaults(), dict)
        assert cls.__doc__ and len(cls.__doc__) > 80, f"{name} must state its rule"


@pytest.mark.parametrize(
    "method, params, capacity, expected",
    [
        ("cake", {"gamma": -1}, 64, "params.gamma: cake: Input should be greater than or equal to 0 (got -1)"),
        (
            "cake",
            {"window": 64},
            64,
            "params: cake: window (64) must be smaller than the capacity (64); allowed range 1 .. 63",
        ),
        ("pyramidkv", {"window": -2}, 64, "params.window: pyramidkv: Input should be greater than or equal to 1"),
        ("pyramidkv", {"beta": 0.5}, 64, "params.beta: pyramidkv: Input should be greater than 1"),
        (
            "scissorhands",
            {"recent": 40},
            32,
            "params: scissorhands: recent (40) must be smaller than the capacity (32)",
        ),
        (
            "scissorhands",
            {"history": 0},
            32,
            "params.history: scissorhands: Input should be greater than or equal to 1",
        ),
        ("d2o", {"alpha": 1.0}, 32, "params.alpha: d2o: Input should be less than 1"),
        ("cam", {"merge_budget": 0}, 32, "params.merge_budget: cam: Input should be greater than or equal to 1"),
        ("cam", {"merge": 4}, 32, "params.merge: cam has no parameter 'merge' (parameters: sinks, merge_budget, seed)"),
    ],
)
def test_method_parameter_errors_name_method_parameter_and_range(method, params, capacity, expected):
    scope = "decode" if Phase.PREFILL not in REGISTRY[method].phases else "prefill"
    with pytest.raises(PlanError) as err:
        validate_plan(Plan.homogeneous(method, capacity, 2, scope, params), 2)
    assert expected in str(err.value) and "\n" not in str(err.value)

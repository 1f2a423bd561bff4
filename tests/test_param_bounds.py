"""Values that pass plan validation never fail later: every method parameter is strictly typed and
bounded, token counts fit MAX_TOKENS and the model's context, absurd plans are refused at once, and
native allocation gets one capacity and one set of parameters."""

from __future__ import annotations

import json
import math
from typing import Literal, get_args, get_origin

import numpy as np
import pytest
from pydantic import ValidationError

from polykv.methods import REGISTRY, params_that_fit, validate_plan
from polykv.methods.attention.cake import CAKE, preference
from polykv.methods.attention.scissorhands import HISTORY_ALWAYS_ALLOWED, Scissorhands
from polykv.methods.attention.snapkv import SnapKV
from polykv.methods.params import lower_bound
from polykv.plan import MAX_LAYERS, MAX_TOKENS, Phase, Plan, PlanError
from tests.helpers import assert_one_line_error

CAPACITY = 4096  # every default fits under it
CONTEXT = 8192


def _fields(kind: str) -> list[tuple[str, str]]:
    out = []
    for method, cls in REGISTRY.items():
        for name, field in cls.Params.model_fields.items():
            literal = get_origin(field.annotation) is Literal
            if (
                (kind == "int" and field.annotation is int)
                or (kind == "float" and field.annotation is float)
                or (kind == "literal" and literal)
                or (kind == "bool" and field.annotation is bool)
            ):
                out.append((method, name))
    return out


INT_PARAMS = _fields("int")
FLOAT_PARAMS = _fields("float")
LITERAL_PARAMS = _fields("literal")
BOOL_PARAMS = _fields("bool")
TOKEN_PARAMS = [(m, n) for m, cls in REGISTRY.items() for n in cls.token_params()]


def _bounds(method: str, name: str) -> dict[str, float]:
    field = REGISTRY[method].Params.model_fields[name]
    return {
        k: getattr(m, k) for m in field.metadata for k in ("ge", "gt", "le", "lt") if getattr(m, k, None) is not None
    }


def _capacity(method: str) -> int | None:
    return None if method == "full" else CAPACITY


def _problems(method: str, params: dict, capacity: int | None = CAPACITY, context: int | None = None) -> list[str]:
    return REGISTRY[method].check(params, capacity if method != "full" else None, context)


def _assert_refused(method: str, name: str, value, *expected: str) -> str:
    problems = _problems(method, {name: value})
    assert problems, f"{method}.{name}={value!r} was accepted"
    line = next((p for p in problems if p.startswith(f"params.{name}: {method}:")), None)
    assert line is not None, problems
    assert "\n" not in line
    for text in expected:
        assert text in line, line
    return line


def test_every_parameter_is_covered():
    covered = set(INT_PARAMS) | set(FLOAT_PARAMS) | set(LITERAL_PARAMS) | set(BOOL_PARAMS)
    every = {(m, n) for m, cls in REGISTRY.items() for n in cls.Params.model_fields}
    assert covered == every
    assert ("scissorhands", "history") in TOKEN_PARAMS and ("cake", "kernel_size") in TOKEN_PARAMS
    assert ("cam", "seed") not in TOKEN_PARAMS  # a seed is no token count


@pytest.mark.parametrize("method", sorted(REGISTRY))
def test_defaults_are_accepted_with_and_without_a_context(method):
    cls = REGISTRY[method]
    assert cls.check({}, _capacity(method)) == []
    assert cls.check(cls.defaults(), _capacity(method), CONTEXT) == []
    cls(_capacity(method), cls.defaults())  # and the runtime builds them


@pytest.mark.parametrize("method, name", INT_PARAMS, ids=lambda x: str(x))
@pytest.mark.parametrize(
    "value, why",
    [
        (True, "bool"),
        (False, "bool"),
        ("8", "str"),
        (8.0, "float"),
        (np.int64(8), "numpy"),
        (None, "null"),
        ([8], "list"),
    ],
)
def test_integer_parameters_refuse_other_types(method, name, value, why):
    _assert_refused(method, name, value, "Input should be a valid integer", f"(got {value!r})", "allowed range")


@pytest.mark.parametrize("method, name", INT_PARAMS, ids=lambda x: str(x))
def test_integer_parameters_refuse_values_out_of_range(method, name):
    b = _bounds(method, name)
    low, high = b["ge"], b["le"]
    assert high <= (MAX_TOKENS if (method, name) in TOKEN_PARAMS else 2**63 - 1)
    _assert_refused(method, name, low - 1, f"(got {low - 1})", f"allowed range {low} .. {high}")
    _assert_refused(method, name, -1, "(got -1)", f"allowed range {low} .. {high}")
    _assert_refused(method, name, high + 1, f"(got {high + 1})", f"allowed range {low} .. {high}")
    _assert_refused(method, name, 10**30, f"allowed range {low} .. {high}")


@pytest.mark.parametrize("method, name", TOKEN_PARAMS, ids=lambda x: str(x))
def test_token_counts_are_at_most_max_tokens_and_the_models_context(method, name):
    cls = REGISTRY[method]
    assert _bounds(method, name)["le"] == MAX_TOKENS
    _assert_refused(method, name, MAX_TOKENS + 1, f"(got {MAX_TOKENS + 1})", f".. {MAX_TOKENS}")
    # At the largest capacity the largest value fits (a window stays under the capacity; with the method's other
    # windows at their least, a joint rule such as LagKV's sinks + 2 x lag - 1 is the capacity at most).
    least = {n: lower_bound(cls.Params, n) for n in cls.below_capacity if n != name}
    top = MAX_TOKENS - 1 if name in cls.below_capacity else MAX_TOKENS
    while cls.least_capacity(cls.Params(**{**least, name: top})) > MAX_TOKENS:
        top -= 1
    assert top > MAX_TOKENS // 3 and cls.check({**least, name: top}, MAX_TOKENS) == []
    # Above the model's context: refused, naming the parameter and the context; at the context: fine.
    over = cls.check({name: CONTEXT + 1}, MAX_TOKENS, CONTEXT)
    expected = f"params: {method}: {name} ({CONTEXT + 1}) must be at most the model's context ({CONTEXT} tokens)"
    assert any(p.startswith(expected) for p in over), over
    at_context = {**least, name: CONTEXT}
    capacity = max(CONTEXT + 1, cls.least_capacity(cls.Params(**at_context)))
    assert cls.check(at_context, capacity, CONTEXT) == []


@pytest.mark.parametrize("method, name", FLOAT_PARAMS, ids=lambda x: str(x))
@pytest.mark.parametrize(
    "value, expected",
    [
        ("1.0", "Input should be a valid number"),
        (True, "Input should be a valid number"),
        (False, "Input should be a valid number"),
        (None, "Input should be a valid number"),
        (np.int64(1), "Input should be a valid number"),
        (math.inf, "Input should be a finite number"),
        (-math.inf, "Input should be a finite number"),
        (math.nan, "Input should be a finite number"),
    ],
)
def test_real_parameters_refuse_strings_bools_and_non_finite_numbers(method, name, value, expected):
    _assert_refused(method, name, value, expected, f"(got {value!r})", "allowed: a finite number in ")


@pytest.mark.parametrize("method, name", FLOAT_PARAMS, ids=lambda x: str(x))
def test_real_parameters_have_finite_bounds_and_refuse_values_outside(method, name):
    b = _bounds(method, name)
    low, high = b.get("ge", b.get("gt")), b.get("le", b.get("lt"))
    assert low is not None and high is not None and math.isfinite(low) and math.isfinite(high)
    description = REGISTRY[method].Params.model_fields[name].description
    assert "a finite number in " in description  # the range is documented with the parameter
    span = high - low
    _assert_refused(method, name, low - span / 10 - 1e-3, "(got ")
    _assert_refused(method, name, high + span / 10 + 1e-3, "(got ")
    if "gt" in b:
        _assert_refused(method, name, low, f"(got {low!r})")
    else:
        assert _problems(method, {name: low}) == []
    if "lt" in b:
        _assert_refused(method, name, high, f"(got {high!r})")
    else:
        assert _problems(method, {name: high}) == []


def _integers_inside(method: str, name: str) -> list[int]:
    b = _bounds(method, name)
    return [
        n
        for n in range(math.ceil(b.get("ge", b.get("gt", 0))), math.floor(b.get("le", b.get("lt", 0))) + 1)
        if ("gt" not in b or n > b["gt"]) and ("lt" not in b or n < b["lt"])
    ]


# importance_quantile, in (0, 1), has no integer inside its range
@pytest.mark.parametrize("method, name", [f for f in FLOAT_PARAMS if _integers_inside(*f)], ids=lambda x: str(x))
def test_real_parameters_take_json_integers(method, name):
    value = _integers_inside(method, name)[-1]
    assert _problems(method, {name: value}) == []
    assert getattr(REGISTRY[method](_capacity(method), {name: value}).params, name) == float(value)


@pytest.mark.parametrize("method, name", LITERAL_PARAMS, ids=lambda x: str(x))
def test_choices_are_exact_strings(method, name):
    choices = get_args(REGISTRY[method].Params.model_fields[name].annotation)
    for value in (choices[0].upper(), f" {choices[0]}", 1, True, None):
        _assert_refused(method, name, value, f"(got {value!r})", "allowed: " + " or ".join(map(repr, choices)))
    for value in choices:
        assert _problems(method, {name: value}) == []


@pytest.mark.parametrize("method, name", BOOL_PARAMS, ids=lambda x: str(x))
def test_switches_are_json_booleans(method, name):
    for value in (1, 0, "true", "false", None, 1.0):
        _assert_refused(method, name, value, f"(got {value!r})")
    for value in (True, False):
        assert _problems(method, {name: value}) == []


def test_the_runtime_never_coerces_either():
    with pytest.raises(ValidationError):
        SnapKV(64, {"window": True})
    with pytest.raises(ValidationError):
        SnapKV(64, {"window": "8"})
    assert SnapKV(64, {"window": 8}).params.window == 8


def test_scissorhands_history_is_bounded_by_max_tokens_and_the_capacity():
    # 1e9 queries of flags per slot was 380 GB; refused before anything runs.
    _assert_refused("scissorhands", "history", 10**9, "(got 1000000000)", f"allowed range 1 .. {MAX_TOKENS}")
    _assert_refused("scissorhands", "history", 1e9, "Input should be a valid integer")
    with pytest.raises(PlanError, match=r"params\.history: scissorhands: .*\(got 1000000000\)"):
        validate_plan(Plan.homogeneous("scissorhands", 64, 2, params={"history": 10**9}), 2)
    # The flags take history bytes per slot: a history longer than the capacity + 1 is refused,
    # except up to HISTORY_ALWAYS_ALLOWED (the authors' default 100 fits every capacity).
    assert Scissorhands.check({"history": 513, "recent": 4}, 512) == []
    assert Scissorhands.check({"history": 514, "recent": 4}, 512) == [
        (
            f"params: scissorhands: history (514) must be at most max(capacity + 1, {HISTORY_ALWAYS_ALLOWED}) = 513 "
            "(its flags take history bytes per cached token and KV head); allowed range 1 .. 513"
        )
    ]
    assert Scissorhands.check({"history": HISTORY_ALWAYS_ALLOWED, "recent": 4}, 16) == []
    assert Scissorhands.check({"history": HISTORY_ALWAYS_ALLOWED + 1, "recent": 4}, 16)[0].startswith(
        "params: scissorhands: history (129) must be at most"
    )


def test_cake_temperatures_and_gamma_are_bounded():
    for tau in ("tau1", "tau2"):
        _assert_refused("cake", tau, 1e-300, "(got 1e-300)", "allowed: a finite number in [0.1, 100]")
        _assert_refused("cake", tau, 0, "(got 0)")
    _assert_refused("cake", "gamma", math.inf, "Input should be a finite number (got inf)", "[0, 1000]")
    _assert_refused("cake", "gamma", 1e4, "(got 10000.0)")
    with pytest.raises(PlanError, match=r"params\.gamma: cake: Input should be a finite number \(got inf\)"):
        validate_plan(Plan.homogeneous("cake", 64, 2, params={"gamma": math.inf}), 2)


def test_cake_preference_never_overflows_inside_the_allowed_range():
    # H^(1/tau1) * V^(1/tau2) with the smallest temperatures and absurd dispersions: a finite float.
    for entropy, variance in [(1e5, 1e3), (1e300, 1e300), (math.inf, 1.0), (1e-300, 1e-300)]:
        p = preference(entropy, variance, 0.1, 0.1)
        assert math.isfinite(p) and p >= 0
    assert preference(0.0, 5.0, 0.1, 0.1) == 0.0
    assert math.isclose(preference(3.0, 0.5, 1.6, 0.4), 3.0 ** (1 / 1.6) * 0.5 ** (1 / 0.4), rel_tol=1e-12)
    # Budgets from huge preferences still split the total exactly.
    budgets = CAKE.allocate(4 * 64, [1e304, 1e304, 1e303, 0.0], CAKE.Params(window=8), prompt_length=1000)
    assert sum(budgets) == 4 * 64 and abs(budgets[0] - budgets[1]) <= 1 and budgets[1] > budgets[2] > budgets[3] == 8


def test_json_plans_are_strict_too(tmp_path):
    data = Plan.homogeneous("cake", 64, 2, params={"window": 8, "gamma": 1}).to_dict()
    assert validate_plan(Plan.from_json(json.dumps(data)), 2)  # a JSON integer for a real is fine
    for params, expected in [
        ({"window": "8"}, "params.window: cake: Input should be a valid integer (got '8')"),
        ({"window": True}, "params.window: cake: Input should be a valid integer (got True)"),
        ({"tau1": "1.0"}, "params.tau1: cake: Input should be a valid number (got '1.0')"),
        ({"gamma": "HUGE"}, "params.gamma: cake: Input should be a finite number (got inf)"),  # 1e400 reads as inf
    ]:
        for layer in data["layers"]:
            layer["prefill"]["params"] = layer["decode"]["params"] = params
        with pytest.raises(PlanError) as err:
            validate_plan(Plan.from_json(json.dumps(data).replace('"HUGE"', "1e400")), 2)
        assert expected in str(err.value) and "\n" not in str(err.value)


def test_capacity_is_at_most_max_tokens_and_may_exceed_the_models_context():
    data = Plan.homogeneous("h2o", 64, 2).to_dict()
    data["layers"][1]["decode"]["capacity"] = MAX_TOKENS + 1
    with pytest.raises(
        PlanError, match=rf"layer 1, decode, capacity: Input should be less than or equal to {MAX_TOKENS}"
    ):
        Plan.from_dict(data)
    # A capacity above the context never evicts (the layer runs as FullKV); budget sweeps rely on that.
    plan = Plan.homogeneous("h2o", 4096, 2)
    assert validate_plan(plan, 2, 4096) is plan and validate_plan(plan, 2, context_length=2048) is plan


def test_a_plan_for_a_known_model_keeps_capacities_and_intervals_within_its_context():
    plan = Plan.homogeneous("h2o", 4096, 2)
    with pytest.raises(
        PlanError, match=r"layer 0, prefill, capacity: 4096 is more than the model's context \(2048 tokens\)"
    ):
        validate_plan(plan, 2, 2048, within_context=True)
    assert validate_plan(plan, 2, 4096, within_context=True) is plan  # the whole context is allowed
    data = Plan.homogeneous("tova", 64, 2, "decode").to_dict()
    data["layers"][1]["decode"]["interval"] = 3000
    with pytest.raises(PlanError, match="layer 1, decode, interval: 3000 is more than the model's context"):
        validate_plan(Plan.from_dict(data), 2, 2048, within_context=True)


def test_context_check_reaches_every_token_parameter_through_validate_plan():
    plan = Plan.homogeneous("snapkv", 512, 2, "prefill", params={"window": 300, "kernel_size": 301})
    assert validate_plan(plan, 2) is plan and validate_plan(plan, 2, 512) is plan
    with pytest.raises(PlanError) as err:
        validate_plan(plan, 2, 256)
    problems = err.value.problems
    assert not any("capacity" in p for p in problems)
    assert any(
        p.startswith("layer 0, prefill, params: snapkv: window (300) must be at most the model's context (256 tokens)")
        for p in problems
    )
    assert any(
        p.startswith("layer 1, prefill, params: snapkv: kernel_size (301) must be at most the model's context")
        for p in problems
    )


def test_positional_signatures_still_work_and_two_argument_catalogs_too():
    plan = Plan.homogeneous("h2o", 64, 3)
    assert validate_plan(plan, 3) is plan and plan.validate_for(3, REGISTRY) is plan
    assert plan.problems(3, REGISTRY) == []
    windowed = Plan.homogeneous("snapkv", 64, 3, "prefill")  # default window 32
    assert windowed.problems(3, REGISTRY) == [] and windowed.problems(3, REGISTRY, 16) != []

    class TwoArgs:
        phases = frozenset(Phase)
        native_allocation = False

        @staticmethod
        def check(params, capacity):
            return []

    assert plan.problems(3, {"h2o": TwoArgs, "full": TwoArgs}) == []


def test_a_huge_plan_is_refused_before_its_layers_are_parsed():
    layers = [{"prefill": {"method": "full"}, "decode": {"method": "h2o", "capacity": 8}}] * 1_800_000
    with pytest.raises(PlanError) as err:
        Plan.from_dict({"name": "huge", "scope": "decode", "layers": layers})
    assert str(err.value) == f"layers: a plan has at most {MAX_LAYERS:,} layers (got 1,800,000)"
    with pytest.raises(PlanError, match=r"^layers: a plan has at most 4,096 layers \(got 4,097\)$"):
        Plan.homogeneous("h2o", 8, MAX_LAYERS + 1)
    assert Plan.homogeneous("h2o", 8, MAX_LAYERS).num_layers == MAX_LAYERS


def test_a_layer_count_mismatch_is_the_only_problem_reported():
    data = Plan.homogeneous("snapkv", 16, 3, "prefill").to_dict()
    for layer in data["layers"]:
        layer["prefill"]["params"] = {"window": True, "nope": 1}
    plan = Plan.from_dict(data)
    assert plan.problems(5, REGISTRY) == ["layers: the plan has 3 layers but the model has 5"]
    with pytest.raises(PlanError) as err:
        validate_plan(plan, 5)
    assert err.value.problems == ["layers: the plan has 3 layers but the model has 5"]
    assert len(plan.problems(3, REGISTRY)) == 6  # the right count: every layer's problems


def _native(method: str, scope: str, mutate) -> Plan:
    data = Plan.homogeneous(method, 64, 4, scope, allocation="native").to_dict()
    mutate(data["layers"])
    return Plan.from_dict(data)


def test_native_allocation_refuses_different_capacities_per_layer():
    plan = _native("pyramidkv", "prefill", lambda layers: layers[3]["prefill"].update(capacity=32))
    with pytest.raises(PlanError) as err:
        validate_plan(plan, 4)
    assert err.value.problems == [
        (
            "allocation: 'native' splits one total with one rule: layer 3, prefill has capacity 32 but layer 0 has "
            "capacity 64 (give every layer the same capacity and params, or use allocation 'fixed')"
        )
    ]
    fixed = Plan.from_dict({**plan.to_dict(), "allocation": "fixed"})
    assert validate_plan(fixed, 4) is fixed


def test_native_allocation_refuses_different_parameters_per_layer():
    plan = _native("cake", "both", lambda layers: layers[2]["decode"].update(params={"window": 16}))
    with pytest.raises(PlanError) as err:
        validate_plan(plan, 4)
    assert err.value.problems == [
        (
            "allocation: 'native' splits one total with one rule: layer 2, decode has params {\"window\": 16} but "
            "layer 0 has params {} (give every layer the same capacity and params, or use allocation 'fixed')"
        )
    ]
    same = _native("d2o", "decode", lambda layers: [layer["decode"].update(params={"sinks": 2}) for layer in layers])
    assert validate_plan(same, 4) is same
    # Parameters that only spell out a default are the same parameters.
    spelled = _native("pyramidkv", "prefill", lambda layers: layers[1]["prefill"].update(params={"window": 8}))
    assert validate_plan(spelled, 4) is spelled


def test_params_that_fit_gives_plain_ints_for_any_integer_capacity():
    for method, cls in REGISTRY.items():
        if method == "full":
            continue
        params = params_that_fit(method, np.int64(8))
        assert all(type(v) is int for v in params.values())
        assert cls.check(params, 8) == []


def test_cli_plan_validate_refuses_a_boolean_window_in_one_line(tmp_path, polykv):
    data = Plan.homogeneous("snapkv", 64, 5, "prefill").to_dict()
    data["layers"][1]["prefill"]["params"] = {"window": True}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    assert_one_line_error(
        polykv("plan", "validate", str(path)),
        "layer 1, prefill, params.window: snapkv: Input should be a valid integer (got True)",
        "allowed range 1 .. 1048576",
    )

"""polykv.eval.method_protocols: the standalone-baseline table, baseline plans under it, and overrides."""

from __future__ import annotations

import pytest

from polykv.eval.method_protocols import (
    PROTOCOLS,
    baseline_methods,
    baseline_plan,
    parse_overrides,
    protocol,
    protocol_lines,
)
from polykv.methods import REGISTRY, validate_plan
from polykv.plan import FULL, Phase, Scope


def test_every_registered_method_but_full_has_a_protocol():
    assert set(PROTOCOLS) == set(REGISTRY) - {FULL}
    assert baseline_methods() == [name for name in REGISTRY if name != FULL]  # registry order
    for name, row in PROTOCOLS.items():
        assert row.method == name and row.source
        assert all(phase in REGISTRY[name].phases for phase in row.scope.phases)  # a scope it can run in


def test_the_table_says_the_phases_and_allocations_of_the_paper():
    paper = {
        "streamingllm": Scope.BOTH,
        "h2o": Scope.BOTH,
        "tova": Scope.BOTH,
        "scissorhands": Scope.BOTH,
        "cake": Scope.BOTH,
        "snapkv": Scope.PREFILL,
        "pyramidkv": Scope.PREFILL,
        "d2o": Scope.DECODE,
        "cam": Scope.DECODE,
    }
    assert {name: PROTOCOLS[name].scope for name in paper} == paper  # methods added since have rows of their own
    native = {name for name, row in PROTOCOLS.items() if row.allocation == "native"}
    assert native == {"pyramidkv", "cake", "d2o"} == {n for n, c in REGISTRY.items() if c.native_allocation}
    assert all(row.allocation == "fixed" for name, row in PROTOCOLS.items() if name not in native)


def test_unknown_methods_and_full_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        protocol("nope")
    with pytest.raises(ValueError, match="full keeps every token"):
        protocol(FULL)
    with pytest.raises(ValueError, match="full keeps every token"):
        baseline_plan(FULL, 16, 5)


def test_baseline_plans_follow_their_protocol():
    snapkv = validate_plan(baseline_plan("snapkv", 16, 5), 5)
    assert snapkv.scope is Scope.PREFILL and snapkv.allocation == "fixed"
    assert all(lay.decode.method == FULL and lay.prefill.capacity == 16 for lay in snapkv.layers)
    assert snapkv.layers[0].prefill.params["window"] == 4  # the default 32 does not fit under 16: a quarter
    tova = validate_plan(baseline_plan("tova", 16, 5), 5)
    assert tova.scope is Scope.BOTH and all(lay[p].method == "tova" for lay in tova.layers for p in Phase)
    d2o = validate_plan(baseline_plan("d2o", 16, 5), 5)
    assert d2o.scope is Scope.DECODE and d2o.allocation == "native"
    cake = validate_plan(baseline_plan("cake", 64, 5), 5)
    assert cake.scope is Scope.BOTH and cake.allocation == "native"
    assert cake.layers[0].prefill.params == {}  # the default window 32 fits under 64
    for phase in Phase:
        assert cake.summary().phases[phase].total_capacity == 5 * 64


def test_overrides_change_the_scope_only_to_one_the_method_can_run_in():
    assert parse_overrides(["tova=decode", " cake = prefill "]) == {"tova": Scope.DECODE, "cake": Scope.PREFILL}
    assert parse_overrides(None) == {} and parse_overrides([]) == {}
    assert parse_overrides(["tova=decode", "tova=decode"]) == {"tova": Scope.DECODE}
    overridden = protocol("tova", {"tova": Scope.DECODE})
    assert overridden.scope is Scope.DECODE and "overridden to decode" in overridden.source
    assert protocol("h2o", {"tova": Scope.DECODE}) == PROTOCOLS["h2o"]
    assert baseline_plan("tova", 16, 5, {"tova": "decode"}).scope is Scope.DECODE
    for bad, message in [
        ("tova", "expected METHOD=SCOPE"),
        ("=decode", "expected METHOD=SCOPE"),
        ("tova=", "expected METHOD=SCOPE"),
        ("nope=decode", "unknown method 'nope'"),
        ("full=both", "full keeps every token"),
        ("tova=sideways", "must be prefill, decode or both"),
        ("snapkv=decode", "snapkv runs only in prefill"),
        ("d2o=both", "d2o runs only in decode"),
    ]:
        with pytest.raises(ValueError, match=message) as info:
            parse_overrides([bad])
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="names tova twice"):
        parse_overrides(["tova=decode", "tova=prefill"])


def test_protocol_lines_name_phases_allocation_and_parameters():
    lines = protocol_lines(["snapkv", "tova", "d2o"], {"tova": "decode"})
    assert len(lines) == 3
    assert lines[0].startswith(
        "protocol snapkv: prefill (decode keeps every token), fixed allocation, defaults window=32"
    )
    assert "window shrunk to a quarter of the budget" in lines[0]
    assert lines[1].startswith("protocol tova: decode (prefill keeps every token), fixed allocation, no parameters")
    assert "overridden to decode" in lines[1]
    assert lines[2].startswith("protocol d2o: decode (prefill keeps every token), native allocation")
    assert protocol_lines(["h2o"])[0].startswith("protocol h2o: prefill + decode, fixed allocation")

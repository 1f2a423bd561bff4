"""Plan editing (the designer's operations): paint, the per-layer table, rescaling, diffs, file names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polykv.methods import REGISTRY
from polykv.plan import Phase, Plan, PlanError, Scope
from polykv.plan_edits.choices import PHASE_CHOICES, layers_in, paint_message, phase_choice, phase_values
from polykv.plan_edits.comparison import change_summary, diff
from polykv.plan_edits.edit_history import EDITED_SUFFIX, MAX_EDITS, edits
from polykv.plan_edits.painting import DEFAULT_CAPACITY, paint
from polykv.plan_edits.saving import plan_filename, save_plan
from polykv.plan_edits.table import from_table, table_methods, to_table
from polykv.plan_edits.whole_plan import build_from_profile, current_budget, profile_scopes, rescale, reset_to_full
from polykv.routing import scale_budget

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def mixed():
    return Plan.load(REPO / "plans" / "demo" / "mixed.json")


def test_paint_sets_method_and_capacity_only_on_the_chosen_cells(mixed):
    painted = paint(mixed, [0, 3], "decode", "h2o", 40)
    for i, (old, new) in enumerate(zip(mixed.layers, painted.layers)):
        assert new.prefill == old.prefill
        if i in (0, 3):
            assert (new.decode.method, new.decode.capacity, new.decode.params) == ("h2o", 40, {})
        else:
            assert new.decode == old.decode


def test_paint_capacity_alone_keeps_methods_and_their_parameters(mixed):
    painted = paint(mixed, [1], "both", capacity=30)
    assert painted.layers[1].prefill == mixed.layers[1].prefill.model_copy(update={"capacity": 30})
    assert painted.layers[1].decode == mixed.layers[1].decode.model_copy(update={"capacity": 30})


def test_paint_shrinks_default_windows_that_would_not_fit_the_capacity(mixed):
    painted = paint(mixed, [2], "prefill", "snapkv", 16)
    assert painted.layers[2].prefill.params == {"window": 4}  # default window 32 does not fit under 16


def test_painting_full_drops_the_capacity_and_the_scope_follows_the_evicting_phases():
    plan = Plan.homogeneous("tova", 32, 3, "decode")
    assert paint(plan, [0, 1, 2], "decode", "full").layers[0].decode.capacity is None
    both = paint(plan, [1], "prefill", "snapkv", 16)
    assert both.scope is Scope.BOTH
    back = paint(both, [1], "prefill", "full")
    assert back.scope is Scope.DECODE


def test_painting_a_bounded_method_onto_a_full_cell_uses_the_phase_average_capacity():
    plan = Plan.homogeneous("full", None, 4)
    painted = paint(plan, [2], "decode", "tova")
    assert painted.layers[2].decode.capacity == DEFAULT_CAPACITY
    plan = paint(Plan.homogeneous("tova", 20, 4, "decode"), [0], "decode", "full")
    assert paint(plan, [0], "decode", "h2o").layers[0].decode.capacity == 20


def test_paint_makes_a_native_plan_fixed(mixed):
    native = Plan.homogeneous("cake", 64, 5, "both", allocation="native")
    assert paint(native, [0], "decode", capacity=40).allocation == "fixed"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(layers=[0], phases="decode", method="snapkv"), "'snapkv' does not run in the decode phase"),
        (
            dict(layers=[0], phases="decode", method="lagkv"),
            r"'lagkv' does not run in the decode phase \(it runs in: prefill\): a token's score needs the lag_size",
        ),
        (dict(layers=[9], phases="decode", method="tova"), "layer 9 does not exist"),
        (dict(layers=[], phases="decode", method="tova"), "select at least one layer"),
        (dict(layers=[0], phases="decode"), "choose a method, a capacity, or both"),
        (dict(layers=[0], phases="decode", method="nope"), "unknown method 'nope'"),
        (dict(layers=[0], phases="decode", capacity=0), "capacity must be a positive integer"),
        (dict(layers=[0], phases="decode", method="streamingllm", capacity=2), "sinks"),
    ],
)
def test_paint_refuses_bad_requests_with_one_line(mixed, kwargs, message):
    with pytest.raises(PlanError, match=message) as err:
        paint(mixed, **kwargs)
    assert "\n" not in str(err.value)


def test_table_round_trip_is_the_identity_for_every_shipped_plan():
    for path in sorted((REPO / "plans").rglob("*.json")):
        plan = Plan.load(path)
        assert from_table(plan, to_table(plan)) == plan, path


def test_table_round_trip_keeps_a_run_time_allocation_and_each_cells_interval():
    # the table shows no allocation and no interval: reading it back unedited must not turn a native or rule plan
    # into a fixed one (the designer reads its table back on every rerun), nor an edited one lose its intervals
    native = Plan.homogeneous("pyramidkv", 32, 5, "prefill", allocation="native")
    ruled = Plan.homogeneous("tova", 48, 5, "prefill", allocation="cake")
    for plan in (native, ruled):
        assert from_table(plan, to_table(plan)) == plan
    spaced = Plan.from_dict({**Plan.homogeneous("tova", 32, 5, "decode").to_dict(), "name": "k"})
    spaced = spaced.with_layers([layer.model_copy(update={"decode": layer.decode.model_copy(update={"interval": 4})})
                                 for layer in spaced.layers])  # fmt: skip
    frame = to_table(spaced)
    frame.loc[0, "decode_capacity"] = 40
    edited = from_table(spaced, frame)
    assert edited.layers[0].decode.capacity == 40 and all(layer.decode.interval == 4 for layer in edited.layers)


def test_table_edits_apply_and_bad_cells_name_layer_phase_and_field(mixed):
    table = to_table(mixed)
    table.loc[4, "decode_method"] = "tova"
    table.loc[4, "decode_capacity"] = 12
    edited = from_table(mixed, table)
    assert (edited.layers[4].decode.method, edited.layers[4].decode.capacity) == ("tova", 12)
    for column, value, message in [
        ("decode_capacity", 0, "layer 2, decode, capacity: must be a positive whole number of tokens (got 0)"),
        ("decode_capacity", 2.5, "layer 2, decode, capacity: must be a positive whole number"),
        ("prefill_params", "{window: 3", "layer 2, prefill, params: not JSON"),
        ("prefill_params", "[1]", "layer 2, prefill, params: expected a JSON object"),
        ("decode_method", "snapkv", "layer 2, decode, method: 'snapkv' does not support the decode phase"),
    ]:
        bad = to_table(mixed)
        bad[column] = bad[column].astype(object)
        bad.loc[2, column] = value
        with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
            from_table(mixed, bad)


def test_match_budget_keeps_the_route_and_proportions_and_hits_the_total(mixed):
    scaled = scale_budget(mixed, 24, name=mixed.name, description=mixed.description)
    assert scaled.name == mixed.name
    for phase in Phase:
        assert [lay[phase].method for lay in scaled.layers] == [lay[phase].method for lay in mixed.layers]
        assert scaled.summary().phases[phase].total_capacity == 24 * 5
    with pytest.raises(PlanError, match="must be positive"):
        scale_budget(mixed, 0)


def test_diff_lists_changed_cells_and_plan_fields(mixed):
    other = paint(mixed, [3], "decode", "h2o", 40)
    rows = diff(mixed, other).to_dict("records")
    assert rows == [{"where": "layer 3 decode", "a": "tova@40", "b": "h2o@40"}]
    assert diff(mixed, mixed).empty
    prefill_only = Plan.homogeneous("snapkv", 16, 5, "prefill", {"window": 4})
    assert {"where": "scope", "a": "both", "b": "prefill"} in diff(mixed, prefill_only).to_dict("records")


@pytest.mark.parametrize(
    ("name", "file"),
    [
        ("my plan", "my-plan.json"),
        ("../../etc/passwd", "etc-passwd.json"),
        ("a/b\\c", "a-b-c.json"),
        ("ok.json", "ok.json"),
        ("  spaced  ", "spaced.json"),
    ],
)
def test_plan_filenames_are_safe(name, file):
    assert plan_filename(name) == file


@pytest.mark.parametrize("name", ["../..", "план", "...", "日本語の計画"])
def test_a_name_without_ascii_letters_gets_a_stable_generated_file_name(name):
    file = plan_filename(name)
    assert re.fullmatch(r"plan-[0-9a-f]{10}\.json", file)
    assert plan_filename(name) == file != plan_filename(name + "x")


def test_an_empty_plan_name_is_refused():
    with pytest.raises(PlanError, match="give the plan a name"):
        plan_filename("   ")


def test_every_method_can_be_painted_where_it_runs(mixed):
    for name, cls in REGISTRY.items():
        for phase in cls.phases:
            painted = paint(mixed, [0, 1, 2, 3, 4], phase.value, name, 64)
            assert all(lay[phase].method == name for lay in painted.layers)


# ---- the designer's small decisions (the page only draws) -------------------------------------------
def test_save_plan_writes_a_safe_file_and_overwrites_only_when_told(mixed, tmp_path):
    path, message, named = save_plan(mixed, tmp_path, "  ../My plan!  ")
    assert path == tmp_path / "My-plan.json" and message == f"Saved {path}"
    assert Plan.load(path) == named and named.name == "../My plan!"  # the name inside is kept, stripped
    assert named.layers == mixed.layers and named.description == f"edited from {mixed.name}"
    changed = paint(mixed, [0], "decode", "h2o", 40)
    refused = save_plan(changed, tmp_path, "My plan!")
    assert refused.path is None and refused.message == f"My-plan.json exists in {tmp_path}"
    assert Plan.load(path) == named  # left as it was
    replaced = save_plan(changed, tmp_path, "My plan!", overwrite=True)
    assert replaced.path == path and Plan.load(path).layers == changed.layers
    (tmp_path / "link.json").symlink_to(tmp_path / "nowhere.json")  # a dangling link is an existing name too
    assert save_plan(mixed, tmp_path, "link").path is None
    with pytest.raises(PlanError, match="give the plan a name"):
        save_plan(mixed, tmp_path, "  ")


@pytest.mark.parametrize("name", ["red\x1b[31m", "two\nlines", "txt\u202egpj.exe"])
def test_save_plan_refuses_a_name_with_control_characters_and_writes_nothing(mixed, tmp_path, name):
    with pytest.raises(PlanError, match=r"plan name: must not hold control characters \(found U\+"):
        save_plan(mixed, tmp_path, name)
    assert list(tmp_path.iterdir()) == []


def test_phase_choices_name_phases_and_a_selection_names_a_choice():
    assert PHASE_CHOICES == ("both", "prefill", "decode")
    assert phase_values("both") == ("prefill", "decode")
    assert phase_values("decode") == ("decode",)
    assert phase_choice(["decode"]) == "decode"
    assert phase_choice(["decode", "prefill", "decode"]) == "both"
    assert phase_choice([]) is None
    assert layers_in([4, 0, 7, -1, 2], 5) == [4, 0, 2]


def test_paint_message_says_what_was_painted_where():
    assert paint_message([1, 2, 3], "decode", "h2o", 40) == "Painted h2o @40 onto layers 1, 2, 3 (decode)."
    assert paint_message([0], "both", None, 16) == "Painted @16 onto layers 0 (both)."
    assert paint_message([4], "prefill", "snapkv", None) == "Painted snapkv onto layers 4 (prefill)."


def test_table_methods_put_full_first_then_every_method_of_the_phase():
    for phase in Phase:
        methods = table_methods(phase)
        assert methods[0] == "full"
        assert set(methods) == {name for name, cls in REGISTRY.items() if phase in cls.phases or name == "full"}
    assert "knorm" in table_methods("prefill") and "knorm" in table_methods("decode")


def test_rescale_starts_from_the_first_active_phase_budget_and_keeps_name_and_route(mixed):
    assert current_budget(mixed) == mixed.summary().phases["prefill"].average_capacity == 36.8
    assert current_budget(Plan.homogeneous("tova", 20, 3, "decode")) == 20
    assert current_budget(Plan.homogeneous("full", None, 3)) == DEFAULT_CAPACITY
    scaled = rescale(mixed, 24)
    expected = scale_budget(mixed, 24, name=mixed.name, description=mixed.description)
    assert scaled == expected.model_copy(update={"provenance": scaled.provenance})  # provenance: see below
    with pytest.raises(PlanError, match=r"^rescale to budget 0: .*must be positive") as err:
        rescale(mixed, 0)
    assert "\n" not in str(err.value)


def test_reset_to_full_evicts_nowhere(mixed):
    full = reset_to_full(mixed)
    assert all(layer[p].method == "full" and layer[p].capacity is None for layer in full.layers for p in Phase)
    assert (full.scope, full.allocation, full.name, full.num_layers) == (Scope.BOTH, "fixed", mixed.name, 5)


def test_profile_scopes_and_a_refused_build_from_profile_are_one_line():
    from types import SimpleNamespace

    decode_only = SimpleNamespace(key="p1", meta=SimpleNamespace(scopes=["decode"]))
    both = SimpleNamespace(key="p2", meta=SimpleNamespace(scopes=["prefill", "decode"]))
    assert profile_scopes(decode_only) == ["decode"]
    assert profile_scopes(both) == ["prefill", "decode", "both"]
    with pytest.raises(PlanError, match="profile p1 has no prefill measurements"):
        build_from_profile(decode_only, "prefill", 24, "cosine", "uniform")
    with pytest.raises(PlanError, match="allocation must be one of"):
        build_from_profile(decode_only, "decode", 24, "cosine", "nope")


# ---- provenance: every edit is one line in the plan ---------------------------------------------------
def test_every_designer_edit_appends_one_line_and_keeps_built_by(mixed):
    painted = paint(mixed, [1, 2, 3], "decode", "h2o", 40)
    table = to_table(painted)
    table.loc[2, "decode_capacity"] = 32
    edited = from_table(painted, table)
    scaled = rescale(edited, 64)
    assert edits(mixed) == [] and "edited" not in mixed.provenance
    assert edits(scaled) == [
        "painted h2o@40 onto layers 1, 2, 3 (decode)",
        "table: layer 2 decode capacity 40 -> 32",
        "rescaled to budget 64",
    ]
    assert scaled.provenance["edited"] is True
    assert {k: v for k, v in scaled.provenance.items() if k not in ("edited", "edits")} == mixed.provenance
    assert scaled.name == mixed.name  # a plan written by hand keeps its name
    assert Plan.from_json(scaled.to_json()) == scaled  # the provenance survives a save


def test_a_built_plan_once_edited_is_named_so_once():
    built = Plan.homogeneous("tova", 32, 4, "decode")
    once = paint(built, [0], "decode", capacity=16)
    twice = paint(once, [1], "both", "full")
    assert once.name == twice.name == f"{built.name}{EDITED_SUFFIX}"
    assert twice.provenance["built_by"] == "homogeneous" and twice.provenance["method"] == "tova"
    assert edits(twice) == ["painted @16 onto layers 0 (decode)", "painted full onto layers 1 (both)"]


def test_an_edit_that_changes_nothing_records_nothing(mixed):
    assert from_table(mixed, to_table(mixed)) == mixed
    same = mixed.layers[0].decode
    assert paint(mixed, [0], "decode", same.method, same.capacity) == mixed


def test_a_table_edit_of_many_cells_is_still_one_short_line(mixed):
    table = to_table(mixed)
    table["decode_capacity"] = 20
    table.loc[0, "decode_params"] = '{"sinks": 2}'
    [line] = edits(from_table(mixed, table))
    assert line.startswith("table: layer 0 decode capacity 64 -> 20; layer 0 decode params")
    assert re.search(r"and \d+ more$", line) and "\n" not in line


def test_a_fresh_plan_starts_a_new_provenance(mixed):
    edited = paint(mixed, [0], "both", capacity=30)
    reset = reset_to_full(edited)
    assert reset.provenance == {"built_by": "reset_to_full", "source": edited.name} and edits(reset) == []
    again = paint(reset, [0], "decode", "tova", 16)
    assert again.name == f"{edited.name}{EDITED_SUFFIX}" and edits(again) == ["painted tova@16 onto layers 0 (decode)"]


def test_a_change_is_summed_up_by_its_recorded_edit_else_by_the_cells_it_changed(mixed):
    painted = paint(mixed, [1, 2], "decode", "h2o", 40)
    assert change_summary(mixed, painted) == "painted h2o@40 onto layers 1, 2 (decode)"
    again = paint(painted, [0], "both", None, 16)
    assert change_summary(painted, again) == "painted @16 onto layers 0 (both)"
    other = Plan.homogeneous("tova", 24, 5, name="tova-24")  # a plan loaded in its place: no edit of the first
    changed = sum(a[p] != b[p] for a, b in zip(mixed.layers, other.layers) for p in Phase)
    assert change_summary(mixed, other) == f"{changed} cells changed ('mixed-demo' -> 'tova-24')"
    assert change_summary(mixed, mixed) == "no cell changed"
    full = reset_to_full(mixed)  # a fresh provenance, the name kept
    assert change_summary(mixed, full) == "10 cells changed"  # every cell of the 5 layers evicts in mixed


def test_a_change_summary_survives_the_provenance_dropping_its_oldest_edit(mixed):
    plan = mixed
    for i in range(MAX_EDITS):  # a full provenance: the next edit pushes the oldest out
        plan = paint(plan, [i % 5], "decode", None, 8 + i)
    assert len(edits(plan)) == MAX_EDITS
    last = paint(plan, [3], "decode", "tova", 31)
    assert len(edits(last)) == MAX_EDITS
    assert change_summary(plan, last) == "painted tova@31 onto layers 3 (decode)"

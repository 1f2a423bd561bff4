"""Drafts: the designer's working plan per browser session and model, saved whole and read back checked."""

from __future__ import annotations

import json

import pytest

from polykv import drafts
from polykv.plan import Plan
from polykv.plan_edits.choices import palette, scope_change, shortcuts
from polykv.plan_edits.painting import paint
from tests.helpers import MIXED

SESSION = "0123456789abcdef"


def test_a_draft_round_trips_with_its_history_and_is_kept_per_model(tmp_path):
    plan = Plan.load(MIXED)
    older = Plan.homogeneous("tova", 24, 5).to_json()
    drafts.save_draft(tmp_path, SESSION, "demo", drafts.Draft(plan, undo=[older], redo=[]))
    back = drafts.load_draft(tmp_path, SESSION, "demo")
    assert back.plan == plan and back.undo == [older] and back.redo == []
    assert drafts.load_draft(tmp_path, SESSION, "meta-llama/Llama-3.1-8B-Instruct") is None  # another model
    assert drafts.load_draft(tmp_path, "fedcba9876543210", "demo") is None  # another session


def test_the_history_is_bounded(tmp_path):
    plan = Plan.load(MIXED)
    many = [Plan.homogeneous("tova", c, 5).to_json() for c in range(8, 8 + drafts.HISTORY + 10)]
    drafts.save_draft(tmp_path, SESSION, "demo", drafts.Draft(plan, undo=many))
    assert drafts.load_draft(tmp_path, SESSION, "demo").undo == many[-drafts.HISTORY :]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"{not json", "malformed JSON"),
        (json.dumps({"model": "demo", "plan": "{}", "extra": 1}).encode(), "extra"),
        (json.dumps({"model": "other", "plan": Plan.load(MIXED).to_json()}).encode(), "a draft of 'other'"),
        (json.dumps({"model": "demo", "plan": '{"layers": 3}'}).encode(), ""),
    ],
)
def test_a_damaged_or_foreign_draft_is_one_line_error(tmp_path, content, message):
    path = drafts.draft_path(tmp_path, SESSION, "demo")
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(drafts.DraftError) as caught:
        drafts.load_draft(tmp_path, SESSION, "demo")
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("bad", ["", "../../etc", "ABCDEF0123456789", "0123", "a" * 40, None, 12345678])
def test_only_hex_session_ids_name_a_folder(tmp_path, bad):
    assert drafts.valid_session_id(bad) is None
    with pytest.raises(drafts.DraftError):
        drafts.draft_path(tmp_path, bad, "demo")
    assert drafts.valid_session_id(drafts.new_session_id()) is not None


def test_model_keys_are_safe_file_names_and_unique():
    keys = {drafts.model_key(m) for m in ("demo", "/models/a/demo", "org/demo", "../..", "Qwen/Qwen3-8B")}
    assert len(keys) == 5 and all("/" not in k and not k.startswith(".") for k in keys)


def test_the_session_remembers_its_model(tmp_path):
    assert drafts.load_session_model(tmp_path, SESSION) is None
    drafts.save_session_model(tmp_path, SESSION, "org/model", "cuda")
    assert drafts.load_session_model(tmp_path, SESSION) == ("org/model", "cuda")


def test_the_palette_greys_methods_that_cannot_run_in_the_phase_and_says_why():
    decode = dict(palette("decode"))
    assert decode["snapkv"] == "snapkv runs only in the prefill phase" and decode["d2o"] is None
    assert decode["lagkv"] == (  # a method that says why its rule does not extend to the phase
        "lagkv runs only in the prefill phase (a token's score needs the lag_size tokens after it, which a decode "
        "step has not seen)"
    )
    both = dict(palette("both"))
    assert both["d2o"] == "d2o runs only in the decode phase" and both["tova"] is None and both["full"] is None
    keys = shortcuts([name for name, _ in palette("both")])
    assert len(set(keys.values())) == len(keys) and not {"C", "R"} & set(keys.values())


def test_a_scope_change_is_put_in_words():
    decode = Plan.homogeneous("tova", 24, 5, "decode")
    both = paint(decode, [0], "both", "h2o", 16)
    assert scope_change(decode, both) == "The plan's scope changed from decode to both."
    assert scope_change(decode, paint(decode, [0], "decode", "h2o")) is None


def test_a_draft_keeps_the_designers_selection_and_older_drafts_without_one_still_open(tmp_path):
    plan = Plan.load(MIXED)
    drafts.save_draft(tmp_path, SESSION, "demo", drafts.Draft(plan, layers=[1, 3], phase="decode"))
    back = drafts.load_draft(tmp_path, SESSION, "demo")
    assert (back.layers, back.phase) == ([1, 3], "decode")
    path = drafts.draft_path(tmp_path, SESSION, "demo")
    old = json.loads(path.read_text())
    del old["layers"], old["phase"]  # a draft written before the selection was kept
    path.write_text(json.dumps(old))
    back = drafts.load_draft(tmp_path, SESSION, "demo")
    assert back.plan == plan and (back.layers, back.phase) == ([], None)
    old.update(layers=[0, 4, 7, -1])  # layers the plan does not have are dropped
    path.write_text(json.dumps(old))
    assert drafts.load_draft(tmp_path, SESSION, "demo").layers == [0, 4]
    old.update(phase="sideways")
    path.write_text(json.dumps(old))
    with pytest.raises(drafts.DraftError, match="phase"):
        drafts.load_draft(tmp_path, SESSION, "demo")


def test_the_workspaces_drafts_are_listed_newest_first_a_damaged_one_with_its_problem(tmp_path):
    import os

    plan = Plan.load(MIXED)
    first = drafts.save_draft(tmp_path, "aaaa1111", "demo", drafts.Draft(plan))
    drafts.save_draft(tmp_path, "bbbb2222", "smollm2", drafts.Draft(plan.model_copy(update={"name": "other"})))
    os.utime(first, (1_000_000_000, 1_000_000_000))  # the older one
    drafts.save_pages(tmp_path, "aaaa1111", {"run_seed": 3})  # not a draft: not listed
    (tmp_path / "drafts" / "cccc3333").mkdir()
    (tmp_path / "drafts" / "cccc3333" / "x.json").write_text("{")
    (tmp_path / "drafts" / "not-a-session").mkdir()  # not a session's folder: not listed
    found = drafts.list_drafts(tmp_path)
    assert [(d.session, d.model, d.plan_name) for d in found if d.problem is None] == [
        ("bbbb2222", "smollm2", "other"),
        ("aaaa1111", "demo", plan.name),
    ]
    (damaged,) = [d for d in found if d.problem is not None]
    assert damaged.session == "cccc3333" and "malformed JSON" in damaged.problem
    drafts.delete_draft(next(d for d in found if d.session == "aaaa1111"))
    assert [d.session for d in drafts.list_drafts(tmp_path)] == ["bbbb2222", "cccc3333"] or [
        d.session for d in drafts.list_drafts(tmp_path)
    ] == ["cccc3333", "bbbb2222"]  # the damaged one's time is the test's own: either order
    assert (tmp_path / "drafts" / "aaaa1111" / "pages.json").is_file()  # the session's other files stay
    assert drafts.list_drafts(tmp_path / "nowhere") == []

"""The searches' reports are typed (`SearchReport`, `WorkloadReport`): every report committed in docs/ reads into its
model and saves back exactly the JSON it was read from (not a key added, dropped or changed: the writers keep the
file format), and the text search's page renders from the model as committed."""

from __future__ import annotations

import json

import pytest

from polykv.errors import FileError
from polykv.search.text.report import SearchReport, markdown
from polykv.search.workload.report import WorkloadReport
from tests.helpers import REPO

TEXT = [REPO / "docs" / "search" / "report.json"]
WORKLOAD = sorted(REPO.glob("docs/*-workload/*/report.json"))


@pytest.mark.parametrize(
    ("model", "path"),
    [*((SearchReport, p) for p in TEXT), *((WorkloadReport, p) for p in WORKLOAD)],
    ids=lambda x: str(x.relative_to(REPO)) if hasattr(x, "relative_to") else x.__name__,
)
def test_a_committed_report_reads_into_its_model_and_saves_back_the_same_json(model, path, tmp_path):
    report = model.load(path)
    assert report.budgets and all(entry.search.trace for entry in report.budgets)
    assert report.to_dict() == json.loads(path.read_text(encoding="utf-8"))
    report.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()  # the writer's bytes too
    assert model.load(tmp_path / "again.json") == report


def test_the_committed_reports_are_all_found():
    assert len(TEXT) == 1 and TEXT[0].is_file() and len(WORKLOAD) >= 5


def test_the_text_search_page_renders_from_the_typed_report_as_committed():
    page = REPO / "docs" / "search" / "report.md"
    assert markdown(SearchReport.load(TEXT[0])) == page.read_text(encoding="utf-8")


def test_a_report_of_the_other_search_or_a_damaged_one_is_refused_in_one_line(tmp_path):
    with pytest.raises(FileError, match="is not a search report"):
        SearchReport.load(WORKLOAD[0])
    saved = json.loads(TEXT[0].read_text(encoding="utf-8"))
    del saved["budgets"][0]["verdict"]["plans"]
    damaged = tmp_path / "report.json"
    damaged.write_text(json.dumps(saved))
    with pytest.raises(FileError, match=r"not a search report this version reads \(budgets\.0\.verdict\.plans"):
        SearchReport.load(damaged)


def test_a_workload_report_from_before_some_fields_existed_reads_and_saves_back_as_it_was(tmp_path):
    """Reports saved before the competence rule, the KV table, the timed steps and the contrasts' kind, scope and
    count of differing samples have none of them: they read (the defaults in their place) and save back without them."""
    from polykv.search.workload.markdown import markdown as page
    from polykv.search.workload.verdict_text import verdict_rows

    saved = json.loads(WORKLOAD[0].read_text(encoding="utf-8"))
    for key in ("kv", "competence", "fullkv_accuracy", "seconds_steps", "text_profile"):
        saved.pop(key, None)
    for entry in saved["budgets"]:
        for family in entry["verdict"].values():
            for c in family["contrasts"]:
                for key in ("kind", "matched", "exact", "agrees", "differing"):
                    c.pop(key)
    report = WorkloadReport.from_dict(saved)
    assert report.to_dict() == saved
    assert report.kv is None and report.competence.pilot is None and report.text_profile is None
    c = report.budgets[0].verdict["searched tasks"].contrasts[0]
    assert (c.kind, c.matched, c.exact, c.agrees, c.differing) == ("", True, False, True, None)
    assert verdict_rows(report.budgets[0])[0][1:4] == ("", "searched - homogeneous", "yes")
    text = page(report)
    assert "The report does not say the model's KV dimensions." in text and "run `?`" in text

"""Every report in docs/ can be opened down to its samples: the results databases it names are in git, and every
run id it prints is a run in one of them (a number without its database cannot be checked)."""

from __future__ import annotations

import re
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

REPORTS = sorted([*REPO.glob("docs/*.md"), *REPO.glob("docs/**/report.md")])
RUN_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{16}(?![0-9a-f])")  # the store's run ids: 16 hex digits alone
DATABASE = re.compile(r"[\w./-]*results\.sqlite")


def named_databases(report: Path, text: str) -> set[Path]:
    """The databases a report names, as paths from the repository root or from the report's folder."""
    found = set()
    for name in DATABASE.findall(text):
        for base in (REPO, report.parent):
            path = (base / name).resolve()
            if path.is_file():
                found.add(path)
    return found


def tracked(path: Path) -> bool:
    relative = path.relative_to(REPO)
    result = subprocess.run(["git", "ls-files", "--error-unmatch", str(relative)], cwd=REPO, capture_output=True)
    return result.returncode == 0


def run_ids(database: Path) -> set[str]:
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        return {row[0] for row in db.execute("SELECT id FROM runs")}


def test_docs_hold_reports():
    assert len(REPORTS) >= 4  # the studies, the workload searches and the text search


@pytest.mark.parametrize("report", REPORTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_run_id_a_report_prints_is_in_a_committed_database_it_names(report):
    text = report.read_text(encoding="utf-8")
    printed = set(RUN_ID.findall(text))
    databases = named_databases(report, text)
    for database in databases:
        assert tracked(database), f"{report.name} names {database.relative_to(REPO)}, which is not in git"
    if not printed:
        return
    assert databases, f"{report.name} prints {len(printed)} run ids but names no results database that exists"
    known = set().union(*(run_ids(d) for d in databases))
    missing = sorted(printed - known)
    assert not missing, f"{report.name}: {len(missing)} run ids in no database it names, e.g. {missing[:3]}"

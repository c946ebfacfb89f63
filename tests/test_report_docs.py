"""Every column of the report's CSV files is named in docs/reports.md, the page the README points to."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_report import D0, add_day

from telemetry.report import build_report, period_window, report_tables
from telemetry.store import open_store

DOC = Path(__file__).resolve().parents[1] / "docs" / "reports.md"
DOCUMENTED = ("modes", "change", "anomalies", "projection", "nodes_by_sla", "speedups", "acceptance_by_domain")


@pytest.fixture(scope="module")
def headers(tmp_path_factory) -> dict[str, tuple[str, ...]]:
    """The headers a report writes, from report_tables (they do not depend on the figures)."""
    engine = open_store(f"sqlite:///{tmp_path_factory.mktemp('store') / 'store.db'}")
    try:
        add_day(engine, D0)
        return {t.name: t.header for t in report_tables(build_report(engine, period_window("daily", since=D0)),
                                                        engine)}
    finally:
        engine.dispose()


def test_every_csv_the_report_writes_is_documented_or_pointed_to(headers):
    assert set(headers) == {*DOCUMENTED, "runs_cost"}  # runs_cost.csv: export --what cost's columns
    assert "export --what cost" in DOC.read_text()


@pytest.mark.parametrize("name", DOCUMENTED)
def test_every_column_of_a_report_csv_is_documented_in_its_section(headers, name):
    match = re.search(rf"^## `{name}\.csv`.*?(?=^## |\Z)", DOC.read_text(), re.S | re.M)
    assert match, f"docs/reports.md has no section for {name}.csv"
    documented = re.findall(r"^- `([^`]+)`", match.group(0), re.M)
    assert documented == list(headers[name]), f"docs/reports.md's {name}.csv section and its header differ"


def test_the_readme_points_to_the_report_columns():
    assert "docs/reports.md" in (DOC.parents[1] / "README.md").read_text()

"""Times labelled UTC are UTC whatever the timezone of the PostgreSQL session (a database whose default zone
is not UTC, PGTZ in the environment) or of the machine: the dashboard's time range, the CSV exports."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session
from synthetic import Req, make_run, spec_req

from telemetry.store import open_store

ROOT = Path(__file__).resolve().parents[1]
# 03:36 UTC on the 5th is still the 4th in Los Angeles and New York: a day boundary between the zones
BENCHED_AT = datetime(2026, 12, 5, 3, 36, 1, 630000, tzinfo=UTC)
WEST = "America/Los_Angeles"


def _fill(url: str) -> None:
    engine = open_store(url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(output_tokens=33, ttft_ms=100, e2e_ms=900)], started_at=BENCHED_AT)
        make_run(s, "spec", requests=[spec_req(33, k=4, accepted=24, ttft_ms=100, e2e_ms=500)],
                 started_at=BENCHED_AT)
        s.commit()
    engine.dispose()


@pytest.fixture
def west_pg_url(pg_url) -> str:
    """A fresh PostgreSQL database whose sessions default to Los Angeles time, holding runs benched at 03:36 UTC."""
    from sqlalchemy import create_engine

    name = pg_url.rsplit("/", 1)[1]
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f"ALTER DATABASE \"{name}\" SET timezone TO '{WEST}'"))
    admin.dispose()
    _fill(pg_url)
    return pg_url


def test_day_of_a_store_time_is_its_utc_date():
    """An aware time in a zone west of UTC (as PostgreSQL hands it back in such a session) is dated in UTC."""
    from app.dashboard.filters import _day

    local = BENCHED_AT.astimezone(ZoneInfo(WEST))
    assert local.date() == date(2026, 12, 4)
    assert _day(local) == date(2026, 12, 5)
    assert _day(BENCHED_AT.replace(tzinfo=None)) == date(2026, 12, 5)  # SQLite: naive UTC
    assert _day(None) is None


def test_dashboard_time_range_is_utc_on_a_postgres_session_west_of_utc(west_pg_url, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SPECFINOPS_DB_URL", west_pg_url)
    monkeypatch.syspath_prepend(str(ROOT))
    at = AppTest.from_file(str(ROOT / "app" / "dashboard" / "main.py"), default_timeout=120)
    at = at.run().switch_page("views/overview.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.date_input(key="f_time").value == (date(2026, 12, 5), date(2026, 12, 5))
    assert not any("No runs" in i.value for i in at.info), [i.value for i in at.info]
    assert len(at.multiselect(key="f_runs").options) == 2


def _csv_column(path: Path, name: str) -> list[str]:
    import csv

    with path.open(newline="", encoding="utf-8") as fh:
        return [row[name] for row in csv.DictReader(fh)]


def test_csv_cells_write_aware_times_in_utc():
    from telemetry.export import _cell

    local = BENCHED_AT.astimezone(ZoneInfo(WEST))
    assert _cell(local) == "2026-12-05T03:36:01.630000+00:00"
    assert _cell(BENCHED_AT.replace(tzinfo=None)) == "2026-12-05T03:36:01.630000+00:00"


@pytest.mark.parametrize("what, column", [("requests", "started_at"), ("cost", "started_at")])
def test_exports_are_utc_on_a_postgres_session_west_of_utc(west_pg_url, tmp_path, what, column):
    from app.cli import main

    out = tmp_path / f"{what}.csv"
    assert main(["export", "--what", what, "--out", str(out), "--db", west_pg_url]) == 0
    assert _csv_column(out, column) == ["2026-12-05T03:36:01.630000+00:00"] * 2


def _read_back(url: str) -> tuple[str, datetime]:
    from sqlalchemy import select

    from telemetry.db import Request, make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as c:
            return c.scalar(text("SHOW timezone")), c.scalar(select(Request.started_at).limit(1))
    finally:
        engine.dispose()


def test_postgres_sessions_are_utc_on_a_database_whose_default_zone_is_not(west_pg_url):
    zone, started = _read_back(west_pg_url)
    assert zone == "UTC"
    assert started == BENCHED_AT and started.utcoffset().total_seconds() == 0
    assert started.isoformat() == "2026-12-05T03:36:01.630000+00:00"


def test_postgres_sessions_are_utc_with_pgtz_set(pg_url, monkeypatch):
    _fill(pg_url)
    monkeypatch.setenv("PGTZ", "America/New_York")
    zone, started = _read_back(pg_url)
    assert zone == "UTC"
    assert started.isoformat() == "2026-12-05T03:36:01.630000+00:00"


def test_a_date_cut_in_sql_is_the_utc_date_on_a_session_west_of_utc(west_pg_url):
    """SQL that cuts days (date_trunc, ::date) cuts them at UTC midnight, not the session zone's."""
    from telemetry.db import make_engine

    engine = make_engine(west_pg_url)
    try:
        with engine.connect() as c:
            assert c.scalar(text("SELECT min(started_at)::date FROM requests")) == date(2026, 12, 5)
    finally:
        engine.dispose()


def test_report_shows_run_starts_in_utc_on_a_session_west_of_utc(west_pg_url, tmp_path):
    """The report's 'started (UTC)' column is UTC (the session is, so the report's readers need not convert)."""
    from datetime import timedelta

    from telemetry.report import period_window
    from telemetry.report_writer import write_report

    since = datetime(2026, 12, 5, tzinfo=UTC)
    engine = open_store(west_pg_url)
    try:
        result = write_report(engine, period_window("custom", since=since, until=since + timedelta(days=1)),
                              tmp_path, now=since + timedelta(days=2))
    finally:
        engine.dispose()
    html = result.html_path.read_text(encoding="utf-8")
    assert "2026-12-05 03:36:01" in html and "2026-12-04 19:36:01" not in html

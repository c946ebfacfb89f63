"""Report folders of two stores in one --out (ids are per store, so names collide), cleanup that removes only
what it created, and a scheduled report whose delivery failed being delivered by the next run."""

from __future__ import annotations

import hashlib
import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session
from test_delivery import Hook
from test_report import D0, add_day

from app.cli import main
from telemetry import report_writer
from telemetry import scheduler as sched_mod
from telemetry.db import Report
from telemetry.report import period_window
from telemetry.store import open_store

DAY_ARGS = ("--period", "daily", "--since", D0.isoformat())


def _store(path: Path):
    url = f"sqlite:///{path}"
    engine = open_store(url)
    add_day(engine, D0)
    return url, engine


@pytest.fixture
def two_stores(tmp_path):
    (a_url, a), (b_url, b) = _store(tmp_path / "staging.db"), _store(tmp_path / "prod.db")
    yield (a_url, a), (b_url, b), tmp_path / "shared"
    a.dispose()
    b.dispose()


def _rows(engine) -> list[Report]:
    with Session(engine) as s:
        return list(s.scalars(select(Report).order_by(Report.id)))


def _tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden ones too) with the hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def _report(url: str, out: Path) -> int:
    return main(["report", "--db", url, "--out", str(out), *DAY_ARGS])


def test_two_stores_into_one_out_keep_both_reports(two_stores, capsys):
    (a_url, a), (b_url, b), out = two_stores
    assert _report(a_url, out) == 0
    [ra] = _rows(a)
    first = Path(ra.csv_dir)
    assert first.name == report_writer.report_dir_name(ra.id, period_window("daily", since=D0))
    before = _tree(first)
    capsys.readouterr()

    assert _report(b_url, out) == 0  # the same id (1) and period: the same usual name
    err = capsys.readouterr().err
    [rb] = _rows(b)
    second = Path(rb.csv_dir)
    assert rb.id == ra.id and second != first and second.parent == first.parent
    assert second.name.startswith(first.name + "-") and f"already holds {first.name}" in err
    assert _tree(first) == before  # the other store's report untouched
    assert Path(rb.html_path) == second / "report.html" and Path(rb.html_path).is_file()
    assert rb.summary["html_path"] == rb.html_path and all(Path(f).parent == second for f in rb.summary["csv_files"])
    assert Path(ra.html_path).is_file() and _rows(a)[0].csv_dir == str(first)
    assert sorted(p.name for p in out.iterdir()) == sorted([first.name, second.name])  # nothing else, no .tmp
    assert not any((p / report_writer.CLAIM_MARKER).exists() for p in (first, second))


def test_a_failing_write_leaves_the_folders_there_and_nothing_of_its_own(two_stores, monkeypatch):
    (a_url, a), (b_url, b), out = two_stores
    assert _report(a_url, out) == 0
    before = {p.name: _tree(p) for p in out.iterdir()}

    def broken(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report_writer, "write_csv", broken)
    with pytest.raises(OSError, match="no space left on the device holding the --out folder"):
        report_writer.write_report(b, period_window("daily", since=D0), out)
    assert {p.name: _tree(p) for p in out.iterdir()} == before  # no temporary folder, the other report intact
    assert _rows(b) == []  # no claim left behind


def test_a_folder_appearing_at_the_chosen_name_is_left_alone(two_stores, monkeypatch):
    """The old failure: renaming onto a folder that is there failed, and the cleanup removed that folder."""
    (a_url, a), _, out = two_stores
    real = report_writer.render_html
    squatter = {}

    def render_and_squat(*args, **kw):
        [row] = _rows(a)
        final = Path(row.csv_dir)
        final.mkdir()
        (final / "theirs.txt").write_text("not ours", encoding="utf-8")
        squatter["path"] = final
        return real(*args, **kw)

    monkeypatch.setattr(report_writer, "render_html", render_and_squat)
    with pytest.raises(FileExistsError, match="appeared while report #1 was being written"):
        report_writer.write_report(a, period_window("daily", since=D0), out)
    assert [p.name for p in out.iterdir()] == [squatter["path"].name]
    assert (squatter["path"] / "theirs.txt").read_text(encoding="utf-8") == "not ours"
    assert _rows(a) == []


def test_releasing_a_stale_claim_never_removes_another_stores_folder(two_stores):
    """A claim recorded by an older version names the usual folder, which may be another store's report."""
    (a_url, a), (b_url, b), out = two_stores
    assert _report(a_url, out) == 0
    [ra] = _rows(a)
    theirs = Path(ra.csv_dir)
    before = _tree(theirs)
    window = period_window("daily", since=D0)
    old = datetime.now(UTC) - timedelta(seconds=report_writer.STALE_AFTER_S + 60)
    with Session(b) as s:  # store B's killed claim, recorded with the same (usual) folder
        s.add(Report(period="daily", since=window.since, until=window.until, html_path="", csv_dir=str(theirs),
                     delivery_status="generating", created_at=old))  # fmt: skip
        s.commit()
    assert len(report_writer.release_stale_claims(b, out)) == 1
    assert _rows(b) == [] and _tree(theirs) == before


def _killed_claims_folder(engine, out: Path, since: datetime) -> tuple[int, Path]:
    """A daily claim killed between renaming its folder into place and recording it: its 'generating' row, stale,
    and the folder it names (made, empty): the claim's id and folder."""
    window = period_window("daily", since=since)
    old = datetime.now(UTC) - timedelta(seconds=report_writer.STALE_AFTER_S + 60)
    with Session(engine) as s:
        row = Report(period="daily", since=window.since, until=window.until, html_path="", csv_dir="",
                     delivery_status="generating", created_at=old)
        s.add(row)
        s.flush()
        final = out / report_writer.report_dir_name(row.id, window)
        row.csv_dir = str(final)
        s.commit()
        rid = row.id
    final.mkdir(parents=True)
    return rid, final


def test_a_killed_claims_own_unrecorded_folder_is_released(two_stores):
    """Killed between renaming its folder into place and recording it: the folder carries the claim's marker."""
    (a_url, a), _, out = two_stores
    rid, final = _killed_claims_folder(a, out, D0)
    (final / report_writer.CLAIM_MARKER).write_text(report_writer._claim_token(a, rid, final), encoding="utf-8")
    assert len(report_writer.release_stale_claims(a, out)) == 1
    assert not final.exists()


def test_a_claims_marker_holds_no_password_and_an_older_versions_marker_is_still_its_claims(pg_url, tmp_path,
                                                                                            monkeypatch):
    """The marker named the store by render_as_string(hide_password=True), which hides the user-info password
    only: a `?password=` went into the file. No password lands in it now; a marker an earlier version wrote (the
    query password in it) still marks its claim's folder, released as the claim's."""
    url = pg_url.replace("://postgres@", "://postgres:userinfo-pw@", 1) + "?password=query-pw"
    engine = open_store(url)
    try:
        add_day(engine, D0)
        out = tmp_path / "reports"
        real, markers = report_writer.render_html, []

        def render_and_read_marker(*args, **kw):
            markers.extend(p.read_text(encoding="utf-8") for p in out.glob(f".*.tmp/{report_writer.CLAIM_MARKER}"))
            return real(*args, **kw)

        monkeypatch.setattr(report_writer, "render_html", render_and_read_marker)
        assert report_writer.write_report(engine, period_window("daily", since=D0), out) is not None
        [marker] = markers
        assert "query-pw" not in marker and "userinfo-pw" not in marker and "password=" in marker, marker
        # killed between renaming its folder into place and recording it, by an older version: its own marker
        rid, final = _killed_claims_folder(engine, out, D0 + timedelta(days=1))
        legacy = f"{engine.url.render_as_string(hide_password=True)} report {rid} {final}"
        assert "query-pw" in legacy  # what the older version wrote
        (final / report_writer.CLAIM_MARKER).write_text(legacy + "\n", encoding="utf-8")
        assert len(report_writer.release_stale_claims(engine, out)) == 1
        assert not final.exists()
    finally:
        engine.dispose()


def test_a_marker_and_a_shown_command_mask_a_store_by_one_rule_and_older_markers_are_still_read(tmp_path):
    """The marker masked every query key naming a password (any case), telemetry.db.shown_db_url only `password`
    and `sslpassword`: a `?PGPASSWORD=` was shown in commands. One masking names a store in both; the markers
    of earlier versions (the query password in clear, or masked as %2A%2A%2A) still mark their claim's folder."""
    from sqlalchemy import create_engine

    from telemetry.db import masked_password_note, shown_db_url

    url = "postgresql+psycopg://u:userinfo-pw@h/db?password=query-pw&PGPASSWORD=env-pw&sslmode=require"
    engine = create_engine(url)  # never connected: a marker names the store by its URL alone
    try:
        final = tmp_path / "report-7"
        token = report_writer._claim_token(engine, 7, final)
        shown = shown_db_url(url)
        for text in (token, shown):
            assert not any(pw in text for pw in ("userinfo-pw", "query-pw", "env-pw")), text
        assert "PGPASSWORD=***" in shown and "password=***" in shown and "sslmode=require" in shown, shown
        assert masked_password_note("postgresql://u@h/db?PGPASSWORD=env-pw") == " (*** is its password)"
        assert token == f"{shown.replace('postgresql://', 'postgresql+psycopg://', 1)} report 7 {final}"
        masked = engine.url.update_query_dict({"password": "***", "PGPASSWORD": "***"})
        for i, legacy in enumerate((engine.url.render_as_string(hide_password=True),
                                    masked.render_as_string(hide_password=True))):
            folder = tmp_path / f"tmp{i}"
            folder.mkdir()
            (folder / report_writer.CLAIM_MARKER).write_text(f"{legacy} report 7 {final}\n", encoding="utf-8")
            assert report_writer._claimed_by(folder, token), legacy
            assert not report_writer._claimed_by(folder, report_writer._claim_token(engine, 8, final))
    finally:
        engine.dispose()


# ---- a failed delivery is delivered by the next scheduled run -------------------------------------------


def test_a_failed_delivery_is_retried_by_the_next_scheduled_run(tmp_path, monkeypatch, capsys):
    url, engine = _store(tmp_path / "store.db")
    out = tmp_path / "reports"
    clock = iter([D0 + timedelta(days=1, hours=6), D0 + timedelta(days=2, hours=6), D0 + timedelta(days=2, hours=7)])
    monkeypatch.setattr(sched_mod, "_clock", lambda: next(clock))
    hook = Hook(500)  # down at the first run
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    job = sched_mod.ReportJob(job_id="report-daily", db_url=url, out_dir=str(out), webhook_url=hook.url,
                              delivery_backoff_s=0.01)  # fmt: skip
    try:
        first = sched_mod.run_report_job(**job.kwargs())
        [row] = _rows(engine)
        assert row.id == first and row.delivery_status == "failed" and len(hook.bodies) == 3

        s = sched_mod.make_scheduler(engine)  # the job in the store's job table, as a scheduler keeps it
        sched_mod.schedule_report_job(s, engine, job, sched_mod.parse_cron("0 6 * * *"))
        s.start(paused=True)
        s.shutdown()
        assert main(["scheduler", "--db", url, "--list"]) == 0  # the failed delivery is listed
        listed = capsys.readouterr().out
        assert f"report #{first}" in listed and "delivery failed" in listed and "retried by the job's next run" in listed

        hook.status = 200  # back up: the next run writes its own report and re-sends the failed one's summary
        second = sched_mod.run_report_job(**job.kwargs())
        rows = {r.id: r for r in _rows(engine)}
        assert second != first and set(rows) == {first, second}  # the failed one is not regenerated
        assert rows[first].delivery_status == "delivered" and rows[first].delivery_error is None
        assert rows[second].delivery_status == "delivered"
        posted = [json.loads(b)["report_id"] for _, b in hook.bodies[3:]]
        assert sorted(posted) == sorted([first, second])

        n = len(hook.bodies)  # a run of a period already reported re-sends nothing delivered
        assert sched_mod.run_report_job(**job.kwargs()) is None and len(hook.bodies) == n
        assert main(["scheduler", "--db", url, "--list"]) == 0
        assert "delivery failed" not in capsys.readouterr().out
    finally:
        hook.shutdown()
        hook.server_close()
        engine.dispose()


def test_a_failed_delivery_is_retried_within_the_limit_only(tmp_path, monkeypatch):
    url, engine = _store(tmp_path / "store.db")
    out = tmp_path / "reports"
    hook = Hook(200)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    monkeypatch.setattr(sched_mod, "_clock", lambda: D0 + timedelta(days=1, hours=6))
    job = sched_mod.ReportJob(job_id="report-daily", db_url=url, out_dir=str(out), webhook_url=hook.url,
                              delivery_backoff_s=0.01)  # fmt: skip
    try:
        first = sched_mod.run_report_job(**job.kwargs())
        too_old = datetime.now(UTC) - timedelta(seconds=sched_mod.REDELIVER_FAILED_FOR_S + 60)
        with engine.begin() as c:  # as if it failed long ago
            c.execute(update(Report).where(Report.id == first).values(delivery_status="failed", delivery_error="x",
                                                                      created_at=too_old))  # fmt: skip
        n = len(hook.bodies)
        assert sched_mod.redeliver_failed(engine, job) == []
        assert len(hook.bodies) == n and _rows(engine)[0].delivery_status == "failed"
        with engine.begin() as c:
            c.execute(update(Report).where(Report.id == first).values(created_at=datetime.now(UTC)))
        [line] = sched_mod.redeliver_failed(engine, job)
        assert f"report #{first}" in line and _rows(engine)[0].delivery_status == "delivered"
    finally:
        hook.shutdown()
        hook.server_close()
        engine.dispose()


def test_two_stores_reports_at_one_path_on_two_machines_have_two_idempotency_keys(two_stores, tmp_path, capsys):
    """The webhook's Idempotency-Key was the report id and a hash of the report page's path: two stores (staging
    and production, each writing to /srv/reports on its own machine; or one store reset, its old folder gone)
    give their report #1 of a day the same path, so a receiver that drops a key it has seen dropped the second
    report as a retry of the first. The key is made when the report is written and stored with its summary: the
    same on every re-delivery of that report, another for every other report."""
    import shutil

    from telemetry.delivery import idempotency_key

    (a_url, a), (b_url, b), out = two_stores
    assert _report(a_url, out) == 0
    [ra] = _rows(a)
    shutil.move(out, tmp_path / "staging-machine")  # not on the production machine, where the path is free
    assert _report(b_url, out) == 0
    [rb] = _rows(b)
    assert rb.id == ra.id and rb.html_path == ra.html_path  # one id, one path: two reports
    key_a, key_b = idempotency_key(ra.summary), idempotency_key(rb.summary)
    assert key_a.startswith("specfinops-report-1-") and key_b.startswith("specfinops-report-1-")
    assert key_a != key_b
    assert idempotency_key(_rows(b)[0].summary) == key_b  # read back from the store: the same key again

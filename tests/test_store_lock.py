"""A SQLite store another process holds write-locked for longer than SQLite's busy timeout: a command's single
writes (a run's start, `prices set`, a report's record, a delivery's outcome, the scheduler's jobs) wait for it,
saying so, and give up after a bound with an error that names the file and the lock, writing nothing."""

from __future__ import annotations

import logging
import random
import re
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from recorder_child import run_info, synthetic_request
from sqlalchemy import select, text
from sqlalchemy.orm import Session
from test_delivery import Hook
from test_report import D0, add_day

from app.cli import main
from telemetry import db
from telemetry.recorder import Recorder, RecorderError
from telemetry.store import open_store

HOLD_LOCK = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute('BEGIN IMMEDIATE')
c.execute('update runs set status = status')
print('locked', flush=True)
time.sleep(float(sys.argv[2]))
c.execute('COMMIT')
"""


def _hold_lock(path: Path, seconds: float) -> subprocess.Popen:
    """A process that holds the store's write lock for `seconds`, returned once it holds it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path), str(seconds)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


@contextmanager
def _lock_held(path: Path, seconds: float = 60) -> Iterator[None]:
    """The store's write lock held by another process (`_hold_lock`) for the block, released at its end."""
    holder = _hold_lock(path, seconds)
    try:
        yield
    finally:
        holder.kill()
        holder.wait(30)


@contextmanager
def _locked_until_a_write_waits(path: Path, says: str = "locked by another process") -> Iterator[threading.Event]:
    """A second connection holds the store's write lock (BEGIN IMMEDIATE) until a write in the block says it waits
    for it (retry_while_locked's warning; `says`: another one's, a migration's); a thread then releases it. Yields
    the event set once a write waited. A write that does not wait but fails at SQLite's first 'database is locked'
    leaves the event unset."""
    waited, said = threading.Event(), threading.Event()

    class Waits(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if says in record.getMessage():
                waited.set()
                said.set()

    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    releaser = threading.Thread(target=lambda: (said.wait(120), holder.execute("ROLLBACK")), daemon=True)
    log, handler = logging.getLogger("telemetry.db"), Waits(logging.WARNING)
    level = log.level
    log.addHandler(handler)
    if not log.isEnabledFor(logging.WARNING):
        log.setLevel(logging.WARNING)
    releaser.start()
    try:
        yield waited
    finally:
        said.set()  # a block that never waited (it failed): the lock is released all the same
        releaser.join(30)
        log.removeHandler(handler)
        log.setLevel(level)
        holder.close()


@pytest.fixture
def short_tries(monkeypatch):
    """SQLite's own wait for the lock cut to 0.1 s (engines made from now on): a write that does not retry fails
    at once, one that does tries again until the lock is released."""
    monkeypatch.setattr(db, "SQLITE_BUSY_TIMEOUT_MS", 100)


def _count(url: str, sql: str) -> int:
    engine = open_store(url)
    try:
        with engine.connect() as c:
            return c.execute(text(sql)).scalar()
    finally:
        engine.dispose()


def test_a_run_starts_once_a_lock_held_longer_than_the_busy_timeout_is_released(empty_store, tmp_path, caplog):
    engine = open_store(empty_store)
    rec = Recorder(engine)
    holder = _hold_lock(tmp_path / "store.db", 7)  # longer than SQLITE_BUSY_TIMEOUT_MS (5 s)
    try:
        with caplog.at_level(logging.WARNING, logger="telemetry.db"):
            run_id = rec.start_run(run_info())
    finally:
        holder.wait(30)
        rec.close()
        engine.dispose()
    waits = [r.getMessage() for r in caplog.records if "locked by another process" in r.getMessage()]
    assert len(waits) == 1 and str(tmp_path / "store.db") in waits[0]
    assert _count(empty_store, f"SELECT count(*) FROM runs WHERE id = {run_id} AND status = 'running'") == 1


def test_a_write_that_waited_its_bound_names_the_file_and_the_lock_and_writes_nothing(empty_store, tmp_path,
                                                                                       monkeypatch, capsys):
    monkeypatch.setattr(db, "SQLITE_LOCK_WAIT_S", 1.0)
    path = tmp_path / "store.db"
    before = _count(empty_store, "SELECT count(*) FROM prices")
    with _lock_held(path):
        rc = main(["prices", "set", "my-node", "12", "--kind", "node", "--source", "test", "--db", empty_store])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"the store {path} is locked: another process holds a write lock on it" in err
    assert "Retry" in err and "Traceback" not in err and "cannot use the database" not in err
    assert _count(empty_store, "SELECT count(*) FROM prices") == before


def test_a_recorder_start_gives_up_with_the_clear_error(empty_store, tmp_path, monkeypatch):
    monkeypatch.setattr(db, "SQLITE_LOCK_WAIT_S", 1.0)
    engine = open_store(empty_store)
    rec = Recorder(engine)
    holder = _hold_lock(tmp_path / "store.db", 60)
    try:
        with pytest.raises(db.StoreLockedError, match="another process holds a write lock"):
            rec.start_run(run_info())
    finally:
        holder.kill()
        holder.wait(30)
        rec.close()
        engine.dispose()
    assert _count(empty_store, "SELECT count(*) FROM runs") == 0


def test_a_run_end_the_lock_kept_out_names_the_file_and_the_lock(empty_store, tmp_path):
    engine = open_store(empty_store)
    rec = Recorder(engine, flush_interval_s=0.02, sqlite_busy_timeout_ms=20, retry_max_s=0.05)
    run_id = rec.start_run(run_info())
    with _lock_held(tmp_path / "store.db"):
        rec.record_request(run_id, synthetic_request(random.Random(0), 3))
        store = re.escape(str(tmp_path / "store.db"))
        with pytest.raises(RecorderError, match=rf"the store {store} is locked, another process holds a write lock"):
            rec.end_run(run_id, timeout_s=0.5)
    rec.close()  # the records were kept and are written once the lock is gone
    assert _count(empty_store, f"SELECT count(*) FROM runs WHERE id = {run_id} AND status = 'completed'") == 1
    engine.dispose()


# ---- reports, deliveries and the scheduler's jobs -----------------------------------------------------------


@pytest.fixture
def traffic(sqlite_url, tmp_path, short_tries):
    """(store URL, engine, its file) of a store with a day of traffic (D0)."""
    engine = open_store(sqlite_url)
    add_day(engine, D0)
    yield sqlite_url, engine, tmp_path / "store.db"
    engine.dispose()


def _add_report(engine, status: str, error: str | None = None) -> int:
    from telemetry.report import period_window

    window = period_window("daily", since=D0)
    with Session(engine) as s:
        row = db.Report(period="daily", since=window.since, until=window.until, html_path="x", csv_dir="x",
                        delivery_status=status, delivery_error=error, job_id="report-daily",
                        summary={"report_id": 1})  # fmt: skip
        s.add(row)
        s.commit()
        return row.id


def _report_rows(engine) -> list[tuple]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(select(db.Report.id, db.Report.delivery_status, db.Report.delivery_error,
                                                   db.Report.csv_dir).order_by(db.Report.id))]


def test_a_report_waits_for_the_lock_and_is_recorded_once(traffic, tmp_path, capsys):
    url, engine, path = traffic
    out = tmp_path / "reports"
    with _locked_until_a_write_waits(path) as waited:
        rc = main(["report", "--db", url, "--period", "daily", "--since", f"{D0:%Y-%m-%d}", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert waited.is_set()  # the claim met the lock, and was written once it was released
    [(report_id, status, _, csv_dir)] = _report_rows(engine)
    assert status == "not requested" and (Path(csv_dir) / "report.html").is_file()
    assert [p.name for p in out.iterdir()] == [Path(csv_dir).name]  # one folder: nothing left of a first try


def test_a_report_record_filled_in_while_another_process_holds_the_lock_waits_for_it(traffic, tmp_path,
                                                                                     monkeypatch):
    """The lock taken after the claim, while the files are written: the record is filled in once it is released,
    and the report is kept (a failed fill-in removed the finished report and its claim)."""
    from telemetry import report_writer
    from telemetry.report import period_window

    _, engine, path = traffic
    held = ExitStack()
    waits: list[threading.Event] = []
    render = report_writer.render_html

    def render_then_lock(*args, **kwargs):
        html = render(*args, **kwargs)
        waits.append(held.enter_context(_locked_until_a_write_waits(path)))
        return html

    monkeypatch.setattr(report_writer, "render_html", render_then_lock)
    with held:
        result = report_writer.write_report(engine, period_window("daily", since=D0), tmp_path / "reports")
    assert [w.is_set() for w in waits] == [True]
    assert _report_rows(engine) == [(result.report_id, "not requested", None, str(result.csv_dir))]
    assert result.html_path.is_file() and not (result.csv_dir / report_writer.CLAIM_MARKER).exists()


@pytest.mark.parametrize("stop", [ValueError("the report failed"), KeyboardInterrupt()])
def test_a_report_stopped_while_another_process_holds_the_lock_says_its_own_error_at_once(traffic, tmp_path,
                                                                                       monkeypatch, stop):
    """A report that fails (or is stopped, Ctrl-C) while another process holds the store locked: its cleanup
    tries once to drop the claim, and the report's own error is raised. The cleanup waited for the lock like a
    write (SQLITE_LOCK_WAIT_S) and then raised a StoreLockedError of its own in place of the report's error;
    the claim is left "generating", for release_stale_claims."""
    from telemetry import report_writer
    from telemetry.report import period_window

    monkeypatch.setattr(db, "SQLITE_LOCK_WAIT_S", 1.0)
    _, engine, path = traffic
    holder = sqlite3.connect(path, isolation_level=None)

    def lock_then_fail(*args, **kwargs):
        holder.execute("BEGIN IMMEDIATE")
        raise stop

    monkeypatch.setattr(report_writer, "render_html", lock_then_fail)
    out = tmp_path / "reports"
    try:
        with pytest.raises(type(stop)) as raised:
            report_writer.write_report(engine, period_window("daily", since=D0), out)
    finally:
        holder.close()
    assert raised.value is stop
    [(_, status, _, _)] = _report_rows(engine)
    assert status == report_writer.GENERATING and list(out.iterdir()) == []


def test_a_killed_reports_claim_is_released_once_the_lock_is(traffic, tmp_path):
    from telemetry.report_writer import STALE_AFTER_S, release_stale_claims

    _, engine, path = traffic
    report_id = _add_report(engine, "generating")
    with engine.begin() as c:  # a `specfinops report` made by hand, killed long ago
        c.execute(db.Report.__table__.update().values(job_id=None, csv_dir="", created_at=datetime.now(UTC)
                                                      - timedelta(seconds=STALE_AFTER_S + 60)))  # fmt: skip
    with _locked_until_a_write_waits(path) as waited:
        [line] = release_stale_claims(engine, tmp_path / "reports")
    assert waited.is_set() and f"report #{report_id} (" in line
    assert _report_rows(engine) == []


def test_a_report_the_lock_keeps_out_says_so_in_one_line_and_leaves_nothing(traffic, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(db, "SQLITE_LOCK_WAIT_S", 1.0)
    url, engine, path = traffic
    out = tmp_path / "reports"
    with _lock_held(path):
        rc = main(["report", "--db", url, "--period", "daily", "--since", f"{D0:%Y-%m-%d}", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"the store {path} is locked: another process holds a write lock on it" in err
    assert "Retry" in err and "Traceback" not in err
    assert _report_rows(engine) == [] and not out.exists()


def test_a_delivery_outcome_waits_for_the_lock(traffic):
    from telemetry.delivery import DELIVERED, DeliveryOutcome, record_delivery

    _, engine, path = traffic
    report_id = _add_report(engine, "pending")
    with _locked_until_a_write_waits(path) as waited:
        record_delivery(engine, report_id, DeliveryOutcome(DELIVERED, None, {"webhook": 1}))
    assert waited.is_set()
    assert _report_rows(engine) == [(report_id, DELIVERED, None, "x")]


def test_a_delivery_lease_waits_for_the_lock(traffic, caplog):
    """The lease is dated when it is taken, after the wait: it was dated when take_delivery was called, so a long
    wait for the lock left it that much older (taken over as stale sooner)."""
    from telemetry.report_writer import DELIVERY_LEASE
    from telemetry.scheduler import take_delivery

    _, engine, path = traffic
    report_id = _add_report(engine, "pending")
    with caplog.at_level(logging.WARNING, logger="telemetry.db"), _locked_until_a_write_waits(path) as waited:
        assert take_delivery(engine, report_id)
    assert waited.is_set()
    [(_, status, error, _)] = _report_rows(engine)
    assert status == "pending" and error.startswith(DELIVERY_LEASE)
    [waiting] = [r for r in caplog.records if "locked by another process" in r.getMessage()]
    assert datetime.fromisoformat(error.removeprefix(DELIVERY_LEASE)).timestamp() >= waiting.created
    assert not take_delivery(engine, report_id)  # taken once: its lease is young


def test_a_failed_delivery_is_taken_again_once_the_lock_is_released_and_sent_once(traffic, tmp_path):
    from telemetry.scheduler import ReportJob, redeliver_failed

    url, engine, path = traffic
    report_id = _add_report(engine, "failed", "webhook: HTTP 500")
    with engine.begin() as c:  # the report is a day old: young enough to be delivered again
        c.execute(db.Report.__table__.update().values(created_at=datetime.now(UTC) - timedelta(days=1)))
    hook = Hook(200)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    try:
        job = ReportJob(job_id="report-daily", db_url=url, out_dir=str(tmp_path / "reports"), webhook_url=hook.url,
                        delivery_backoff_s=0.01)
        with _locked_until_a_write_waits(path) as waited:
            [line] = redeliver_failed(engine, job)
    finally:
        hook.shutdown()
        hook.server_close()
    assert waited.is_set() and "its failed delivery made again (delivered)" in line
    assert len(hook.bodies) == 1
    assert _report_rows(engine) == [(report_id, "delivered", None, "x")]


def test_the_scheduler_job_table_and_its_jobs_wait_for_the_lock(traffic, tmp_path):
    """The job table made, the job added (written as it is scheduled, before the scheduler starts), updated,
    removed: each meets the lock, waits, and is written once it is released."""
    from telemetry.scheduler import (
        JOBS_TABLE,
        ReportJob,
        _job_store,
        make_scheduler,
        parse_cron,
        remove_other_jobs,
        schedule_report_job,
    )

    url, engine, path = traffic
    job = ReportJob(job_id="report-daily", db_url=url, out_dir=str(tmp_path / "reports"))
    scheduler = make_scheduler(engine)
    with _locked_until_a_write_waits(path) as waited:
        _job_store(engine)  # the job table made
    assert waited.is_set()
    with _locked_until_a_write_waits(path) as waited:
        assert schedule_report_job(scheduler, engine, job, parse_cron("0 6 * * *")) == "added"
    assert waited.is_set() and _count(url, f"SELECT count(*) FROM {JOBS_TABLE}") == 1
    scheduler.start(paused=True)
    try:
        assert _count(url, f"SELECT count(*) FROM {JOBS_TABLE}") == 1
        with _locked_until_a_write_waits(path) as waited:
            scheduler.pause_job("report-daily")
        assert waited.is_set()
        assert _count(url, f"SELECT count(*) FROM {JOBS_TABLE} WHERE next_run_time IS NULL") == 1
    finally:
        scheduler.shutdown(wait=False)
    with _locked_until_a_write_waits(path) as waited:
        assert [j.id for j in remove_other_jobs(engine, "another-job")] == ["report-daily"]
    assert waited.is_set() and _count(url, f"SELECT count(*) FROM {JOBS_TABLE}") == 0


def test_a_scheduler_whose_next_run_time_the_lock_keeps_out_says_so_and_keeps_running(traffic, tmp_path,
                                                                                        monkeypatch):
    """A run submitted while another process holds the store locked past the wait: APScheduler's loop stores the
    job's next run time with no try around it, so the StoreLockedError ended the loop (the scheduler's thread
    died; `specfinops scheduler` exited). It says so in one ERROR line, and stores it once the lock is gone."""
    from test_scheduler import wait_for

    from telemetry.scheduler import JOBS_TABLE, ReportJob, make_scheduler, parse_cron, schedule_report_job

    monkeypatch.setattr(db, "SQLITE_LOCK_WAIT_S", 1.0)
    died, said = threading.Event(), threading.Event()
    monkeypatch.setattr(threading, "excepthook", lambda args: died.set())

    class Says(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("scheduler: the job table was not updated: the store "):
                said.set()

    url, engine, path = traffic
    job = ReportJob(job_id="report-daily", db_url=url, out_dir=str(tmp_path / "reports"))
    scheduler = make_scheduler(engine)
    schedule_report_job(scheduler, engine, job, parse_cron("0 6 * * *"))
    scheduler.start(paused=True)
    log, handler = logging.getLogger("telemetry.scheduler"), Says(logging.ERROR)
    log.addHandler(handler)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        scheduler.modify_job("report-daily", next_run_time=datetime.now(UTC) - timedelta(minutes=1))
        holder.execute("BEGIN IMMEDIATE")
        scheduler.resume()
        wait_for(lambda: said.is_set() or died.is_set(), "the loop to meet the lock")
        holder.execute("ROLLBACK")
        assert not died.is_set() and said.is_set()
        scheduler.wakeup()  # not the retry interval's 10 s
        now = datetime.now(UTC).timestamp()
        wait_for(lambda: _count(url, f"SELECT count(*) FROM {JOBS_TABLE} WHERE next_run_time > {now}") == 1,
                 "the next run time stored")
    finally:
        holder.close()
        log.removeHandler(handler)
        scheduler.shutdown(wait=True)
    assert not died.is_set()


def test_a_scheduled_run_the_lock_keeps_out_is_one_error_line(traffic, tmp_path, monkeypatch, caplog):
    from telemetry import scheduler as sched_mod
    from telemetry.scheduler import ReportJob

    monkeypatch.setattr(db, "SQLITE_LOCK_WAIT_S", 1.0)
    monkeypatch.setattr(sched_mod, "_clock", lambda: D0 + timedelta(days=1, hours=6))
    url, engine, path = traffic
    job = ReportJob(job_id="report-daily", db_url=url, out_dir=str(tmp_path / "reports"))
    with _lock_held(path):
        with caplog.at_level(logging.ERROR, logger="telemetry.scheduler"):
            assert sched_mod.run_report_job(**job.kwargs()) is None  # no exception: APScheduler prints no traceback
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith("report job report-daily: run failed: the store ")
    assert "is locked: another process holds a write lock on it" in line
    assert _report_rows(engine) == []


def test_the_scheduler_command_the_lock_keeps_out_says_so_in_one_line(traffic, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(db, "SQLITE_LOCK_WAIT_S", 1.0)
    url, engine, path = traffic
    out = tmp_path / "reports"
    with _lock_held(path):
        rc = main(["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"the store {path} is locked: another process holds a write lock on it" in err
    assert "Traceback" not in err and not out.exists()


def test_dropping_the_scheduler_job_table_waits_for_the_lock(traffic, tmp_path, capsys):
    """`db downgrade base` drops the scheduler's job table in its migration transaction, which waits for the lock."""
    from telemetry.scheduler import JOBS_TABLE, _job_store

    url, engine, path = traffic
    _job_store(engine)
    with _locked_until_a_write_waits(path, says="is being written by another process") as waited:
        assert main(["db", "downgrade", "base", "--db", url, "--yes"]) == 0
    assert waited.is_set() and "dropped the scheduler's job table (0 jobs)" in capsys.readouterr().out
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM sqlite_master WHERE name = :t"), {"t": JOBS_TABLE}).scalar() == 0

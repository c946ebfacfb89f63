"""Scheduled reports: APScheduler with the SQLAlchemy job store in the specfinops database.

Seconds-long triggers drive real schedulers; the period a run reports on comes from a fake clock (one day
later on every call), so each run reports a new day. Waits poll the store with a generous deadline; nothing
asserts how long anything took.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from apscheduler.events import EVENT_JOB_EXECUTED, EVENT_JOB_MISSED, EVENT_JOB_SUBMITTED
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.cron import CronTrigger
from sqlalchemy import select, text
from sqlalchemy.orm import Session
from test_delivery import Hook
from test_report import D0, add_day

from app.cli import main
from telemetry import scheduler as sched_mod
from telemetry.db import Report
from telemetry.scheduler import JOBS_TABLE, ReportJob, make_scheduler, parse_cron, schedule_report_job
from telemetry.store import alembic_config, open_store

EVERY_SECOND = CronTrigger(second="*", timezone=UTC)
DEADLINE_S = 60


class StepClock:
    """Returns start, start + step, start + 2 step, ... (thread-safe)."""

    def __init__(self, start: datetime, step: timedelta):
        self.start, self.step, self.n, self.lock = start, step, 0, threading.Lock()

    def __call__(self) -> datetime:
        with self.lock:
            self.n += 1
            return self.start + (self.n - 1) * self.step


def wait_for(predicate, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what}")


def reports(engine) -> list[Report]:
    with Session(engine) as s:
        return list(s.scalars(select(Report).order_by(Report.id)))


def job_rows(engine) -> list[str]:
    with engine.connect() as c:
        return [r[0] for r in c.execute(text(f"SELECT id FROM {JOBS_TABLE}"))]


@pytest.fixture
def store(sqlite_url, tmp_path, monkeypatch):
    """A store with traffic on D0; runs report D0, D0 + 1 day, ... in turn."""
    engine = open_store(sqlite_url)
    add_day(engine, D0)
    monkeypatch.setattr(sched_mod, "_clock", StepClock(D0 + timedelta(days=1, hours=6), timedelta(days=1)))
    yield sqlite_url, engine, tmp_path / "reports"
    engine.dispose()


def _job(url: str, out, **kw) -> ReportJob:
    return ReportJob(job_id="report-daily", db_url=url, out_dir=str(out), delivery_backoff_s=0.01, **kw)


def _started(engine, job: ReportJob, trigger=EVERY_SECOND, paused: bool = False):
    s = make_scheduler(engine)
    how = schedule_report_job(s, engine, job, trigger)
    s.start(paused=paused)
    return s, how


def test_seconds_trigger_writes_reports_records_and_delivers(store):
    url, engine, out = store
    hook = Hook(200)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    s, how = _started(engine, _job(url, out, webhook_url=hook.url))
    try:
        assert how == "added"
        wait_for(lambda: sum(r.delivery_status == "delivered" for r in reports(engine)) >= 2, "two delivered reports")
    finally:
        s.shutdown(wait=True)
        hook.shutdown()
        hook.server_close()
    rows = [r for r in reports(engine) if r.delivery_status == "delivered"]
    first, second = rows[0], rows[1]
    assert first.job_id == "report-daily" and first.summary["traffic"] and not second.summary["traffic"]
    assert first.summary["since"] == D0.isoformat() and second.summary["since"] == (D0 + timedelta(days=1)).isoformat()
    assert all(open(r.html_path, encoding="utf-8").read().startswith("<!DOCTYPE html>") for r in rows)
    posted = [json.loads(b) for _, b in hook.bodies]
    assert [p["report_id"] for p in posted][:2] == [first.id, second.id]


def test_restart_continues_the_persisted_job(store):
    url, engine, out = store
    s, how = _started(engine, _job(url, out))
    try:
        wait_for(lambda: len(reports(engine)) >= 1, "a first report")
    finally:
        s.shutdown(wait=True)
    before = len(reports(engine))
    assert job_rows(engine) == ["report-daily"]
    engine2 = open_store(url)  # a new process would open its own engine
    s2, how2 = _started(engine2, _job(url, out))
    try:
        assert how2 == "kept"  # same configuration: the stored job (and its next run time) is continued
        wait_for(lambda: len(reports(engine)) > before, "a report after the restart")
    finally:
        s2.shutdown(wait=True)
        engine2.dispose()
    assert job_rows(engine) == ["report-daily"]
    sinces = [r.since for r in reports(engine)]
    assert len(set(sinces)) == len(sinces)  # every run reported a new day
    s3 = make_scheduler(engine)
    assert schedule_report_job(s3, engine, _job(url, out, sla_ms=40.0), EVERY_SECOND) == "replaced"


def test_missed_run_beyond_grace_is_skipped(store):
    url, engine, out = store
    yearly = parse_cron("0 0 1 1 *")
    missed = threading.Event()
    s, _ = _started(engine, _job(url, out, misfire_grace_s=60), yearly, paused=True)
    try:
        s.add_listener(lambda _e: missed.set(), EVENT_JOB_MISSED)
        s.modify_job("report-daily", next_run_time=datetime.now(UTC) - timedelta(hours=2))
        s.resume()
        wait_for(missed.is_set, "the missed-run event")
        assert s.get_job("report-daily").next_run_time > datetime.now(UTC)  # moved on to next year
    finally:
        s.shutdown(wait=True)
    assert reports(engine) == []


def test_the_start_up_line_says_whether_missed_runs_run_or_are_skipped(store, capsys):
    """It said "runs now (missed ...)" of a job whose missed runs APScheduler then skipped (it judges the latest
    missed time against the grace), and nothing of the periods the missed runs would have reported that no run
    now reports, nor how to write them."""
    from app.commands.scheduler import _say_next_run

    url, engine, out = store
    now = datetime(2026, 12, 6, 12, 30, tzinfo=UTC)
    s, _ = _started(engine, _job(url, out, misfire_grace_s=86_400), parse_cron("0 6 * * *"), paused=True)
    try:
        # daily at 06:00, stopped since before Thu Dec 3's run: Dec 3, 4, 5 and 6 missed
        s.modify_job("report-daily", next_run_time=datetime(2026, 12, 3, 6, 0, tzinfo=UTC))
        _say_next_run(s, now=now)  # the last, 6.5 h ago, is within a day: one run now, reporting Dec 5
        line = capsys.readouterr().out
        assert "scheduler: job report-daily runs now, for 4 runs (from Thu 2026-12-03 06:00 UTC) missed while " \
               "stopped (the last Sun 2026-12-06 06:00 UTC); no run reports 3 periods from Wed 2026-12-02 00:00 " \
               f"UTC: `specfinops report --db {url} --period daily --since 2026-12-02T00:00 --out {out}" in line, line
        assert "writes the first (the others: --since of each)" in line
        s.modify_job("report-daily", misfire_grace_time=3600)  # the last is over an hour late: skipped
        _say_next_run(s, now=now)
        line = capsys.readouterr().out
        assert "scheduler: job report-daily missed 4 runs (from Thu 2026-12-03 06:00 UTC) while stopped, the last " \
               "(Sun 2026-12-06 06:00 UTC) later than --misfire-grace-s 3600: skipped; next runs Mon 2026-12-07 " \
               "06:00 UTC; no run reports 4 periods from Wed 2026-12-02 00:00 UTC" in line, line
        assert "runs now" not in line
        s.modify_job("report-daily", next_run_time=datetime(2026, 12, 6, 6, 0, tzinfo=UTC), misfire_grace_time=86_400)
        _say_next_run(s, now=now)  # one missed run, within the grace: it reports its own period, nothing lost
        assert capsys.readouterr().out.strip() == ("scheduler: job report-daily runs now, for 1 run missed while "
                                                   "stopped (the last Sun 2026-12-06 06:00 UTC)")
    finally:
        s.shutdown(wait=False)


def test_missed_runs_within_grace_are_coalesced_into_one(store):
    url, engine, out = store
    hourly = parse_cron("0 * * * *")
    submitted, executed = [], threading.Event()
    s, _ = _started(engine, _job(url, out, misfire_grace_s=7200), hourly, paused=True)
    try:
        s.add_listener(lambda e: submitted.append(e.scheduled_run_times), EVENT_JOB_SUBMITTED)
        s.add_listener(lambda _e: executed.set(), EVENT_JOB_EXECUTED)
        s.modify_job("report-daily", next_run_time=datetime.now(UTC) - timedelta(hours=3, minutes=1))
        s.resume()
        wait_for(executed.is_set, "the coalesced run")
        assert s.get_job("report-daily").next_run_time > datetime.now(UTC)  # the backlog is consumed
    finally:
        s.shutdown(wait=True)
    assert len(submitted) == 1 and len(submitted[0]) == 1  # >= 3 missed run times, run once
    assert len(reports(engine)) == 1


def test_two_schedulers_never_write_the_same_report_twice(store, monkeypatch):
    url, engine, out = store
    monkeypatch.setattr(sched_mod, "_clock", lambda: D0 + timedelta(days=1, hours=6))  # every run: period D0
    results: list = []
    lock = threading.Lock()

    def record(event):
        with lock:
            results.append(event.retval)

    engine_b = open_store(url)
    a, _ = _started(engine, _job(url, out), paused=True)
    b, how_b = _started(engine_b, _job(url, out), paused=True)
    try:
        assert how_b == "kept"
        for s in (a, b):
            s.add_listener(record, EVENT_JOB_EXECUTED)
            s.resume()
        wait_for(lambda: len(results) >= 4, "four runs of the job between the two schedulers")
    finally:
        a.shutdown(wait=True)
        b.shutdown(wait=True)
        engine_b.dispose()
    rows = reports(engine)
    assert len(rows) == 1 and [r for r in results if r is not None] == [rows[0].id]
    assert len(list(out.iterdir())) == 1


def test_alembic_check_ignores_the_job_store_table(store):
    url, engine, out = store
    s, _ = _started(engine, _job(url, out), paused=True)
    s.shutdown(wait=False)
    assert job_rows(engine) == ["report-daily"]
    command.check(alembic_config(url))  # raises when models, migrations and database disagree


# ---- the command line -----------------------------------------------------------------------------------


def test_cli_persists_the_cron_job_and_keeps_it_on_restart(store, monkeypatch, capsys):
    url, engine, out = store
    started = []

    def start_and_stop(self, *args, **kwargs):  # instead of blocking: start paused, note the job, stop
        BaseScheduler.start(self, paused=True)
        started.append(self.get_job("report-weekly"))
        BaseScheduler.shutdown(self, wait=False)

    monkeypatch.setattr(BlockingScheduler, "start", start_and_stop)
    args = ["scheduler", "--db", url, "--cron", "0 6 * * 1", "--period", "weekly", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "job report-weekly added" in printed
    assert "job report-weekly next runs Mon " in printed  # the day crontab means by 1
    job = started[0]
    assert repr(job.trigger) == repr(parse_cron("0 6 * * 1")) and job.misfire_grace_time == 3600
    assert job.kwargs["period"] == "weekly" and job.kwargs["out_dir"] == str(out.resolve())
    assert main(args) == 0 and "job report-weekly kept" in capsys.readouterr().out
    assert main([*args[:4], "0 7 * * 1", *args[5:]]) == 0 and "replaced" in capsys.readouterr().out
    assert job_rows(engine) == ["report-weekly"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--cron", "61 * * * *"], "--cron '61 * * * *' is not a valid crontab expression"),
        (["--cron", "every day"], "--cron must have 5 fields"),
        (["--cron", "0 0 31 2 *"], "--cron '0 0 31 2 *' never fires"),
        (["--cron", "0 7 * * 8"], "--cron '0 7 * * 8' is not a valid crontab expression: day of week '8'"),
        (["--cron", "0 6 * * *", "--period", "custom"], "--period for a schedule must be one of daily, weekly"),
        (["--cron", "0 6 * * *", "--period", "hourly"], "--period for a schedule must be one of daily, weekly"),
        (["--cron", "0 6 * * *", "--webhook", "hooks.example/x"], "--webhook must be an http"),
        (["--cron", "0 6 * * *", "--webhook", "http://127.0.0.1:99999/hook"], "--webhook has a bad port"),
        (["--cron", "0 6 * * *", "--webhook", "http://h:abc/hook"], "--webhook has a bad port"),
        (["--cron", "0 6 * * *", "--webhook", "http://[::1"], "--webhook is not a valid URL: Invalid IPv6 URL"),
        (["--cron", "0 6 * * *", "--smtp"], "--smtp needs the environment variables SPECFINOPS_SMTP_HOST"),
        (["--cron", "0 6 * * *", "--misfire-grace-s", "soon"], "--misfire-grace-s must be a whole number"),
        # accepted, it overflowed APScheduler's timedelta at every firing: each run failed with a traceback
        (["--cron", "0 6 * * *", "--misfire-grace-s", "100000000000000"], "from 1 to 31622400 (366 days)"),
        (["--cron", "0 6 * * *", "--job-id", ""], "--job-id must be 1-128 characters, got ''"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(store, monkeypatch, capsys, extra, needle):
    url, engine, out = store
    for name in ("HOST", "FROM", "TO"):
        monkeypatch.delenv(f"SPECFINOPS_SMTP_{name}", raising=False)
    assert main(["scheduler", "--db", url, "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err


def test_cli_unwritable_out_is_exit_2(store, tmp_path, capsys):
    url, _, _ = store
    (tmp_path / "file").write_text("x")
    assert main(["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(tmp_path / "file" / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a writable directory" in err


# ---- crontab's weekdays ---------------------------------------------------------------------------------


def _fire_days(expr: str, n: int = 14) -> list[str]:
    """The weekdays of the next `n` runs of `expr` from a Wednesday."""
    trigger, when, days = parse_cron(expr), datetime(2025, 1, 1, tzinfo=UTC), []
    for _ in range(n):
        when = trigger.get_next_fire_time(None, when + timedelta(seconds=1))
        days.append(when.strftime("%a"))
    return days


@pytest.mark.parametrize(
    ("expr", "days"),
    [
        ("0 7 * * 1", {"Mon"}),
        ("0 7 * * 0", {"Sun"}),
        ("0 7 * * 7", {"Sun"}),
        ("0 9 * * 1-5", {"Mon", "Tue", "Wed", "Thu", "Fri"}),
        ("0 9 * * 1-5/2", {"Mon", "Wed", "Fri"}),
        ("0 9 * * */2", {"Sun", "Tue", "Thu", "Sat"}),
        ("0 9 * * 6,7", {"Sat", "Sun"}),
        ("0 9 * * 5-7", {"Fri", "Sat", "Sun"}),
        ("0 7 * * MON", {"Mon"}),
        ("0 7 * * sun", {"Sun"}),
        ("0 7 * * mon-fri", {"Mon", "Tue", "Wed", "Thu", "Fri"}),
        ("0 7 * * 1,sat", {"Mon", "Sat"}),
        # named ranges from Sunday: APScheduler numbers Sunday 6 and refused them ("sun-thu" is 0-4 in crontab)
        ("0 6 * * sun-thu", {"Sun", "Mon", "Tue", "Wed", "Thu"}),
        ("0 6 * * SUN-SAT", {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}),
        ("0 6 * * fri-sun", {"Fri", "Sat", "Sun"}),
        ("0 6 * * mon-fri/2", {"Mon", "Wed", "Fri"}),
        ("0 7 * * *", {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}),
    ],
)
def test_cron_weekday_numbers_mean_what_crontab_means(expr, days):
    """Crontab counts 0 (or 7) = Sunday, 1 = Monday; APScheduler's own numbers start at Monday = 0."""
    assert set(_fire_days(expr)) == days


def test_a_cron_that_never_fires_is_refused():
    with pytest.raises(ValueError, match="never fires"):
        parse_cron("0 0 31 2 *")
    assert parse_cron("0 0 29 2 *").get_next_fire_time(None, datetime(2025, 1, 1, tzinfo=UTC)).year == 2028


def _fire_dates(expr: str, n: int) -> list[str]:
    """The next `n` runs of `expr` from Wednesday 2025-01-01 00:00 UTC, as 'MM-DD' ('YYYY-MM-DD' after 2025)."""
    trigger, when, dates = parse_cron(expr), datetime(2025, 1, 1, tzinfo=UTC), []
    for _ in range(n):
        when = trigger.get_next_fire_time(None, when + timedelta(seconds=1))
        assert (when.hour, when.minute) == (6, 0) or expr.startswith("0 0 ")
        dates.append(f"{when:%m-%d}" if when.year == 2025 else f"{when:%Y-%m-%d}")
    return dates


@pytest.mark.parametrize(
    ("expr", "dates"),
    [
        # both day fields restricted: crontab runs on every 1st AND every Monday (APScheduler alone: only both)
        ("0 6 1 * 1", ["01-01", "01-06", "01-13", "01-20", "01-27", "02-01", "02-03", "02-10"]),
        ("0 6 13 * 5", ["01-03", "01-10", "01-13", "01-17", "01-24", "01-31", "02-07", "02-13", "02-14"]),
        ("0 6 1,15 * sun", ["01-01", "01-05", "01-12", "01-15", "01-19", "01-26", "02-01", "02-02"]),
        # no 31 February, but crontab still runs on February's Mondays
        ("0 0 31 2 1", ["02-03", "02-10", "02-17", "02-24", "2026-02-02"]),
        # a day field starting with * is unrestricted (Vixie cron, cronie): both must match, Mondays on odd days
        ("0 6 */2 * 1", ["01-13", "01-27", "02-03", "02-17", "03-03", "03-17", "03-31"]),
        ("0 6 1 * *", ["01-01", "02-01", "03-01"]),
        ("0 6 * * 1", ["01-06", "01-13", "01-20"]),
    ],
)
def test_day_of_month_and_day_of_week_are_ored_as_crontab_does(expr, dates):
    assert _fire_dates(expr, len(dates)) == dates


def test_the_job_line_says_which_runs_its_reports_cover(store, no_blocking, capsys):
    """Adding a job says the runs its reports cover, as --list and a later removal say them: the line ended at
    'daily reports into OUT' whatever --workload, --temperature or --max-new-tokens was just given."""
    url, engine, out = store
    args = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out), "--workload", "code",
            "--max-new-tokens", "128"]
    assert main(args) == 0
    added = [ln for ln in capsys.readouterr().out.splitlines() if "job report-daily added" in ln]
    assert len(added) == 1 and "daily reports of workload 'code', 128 new tokens only into" in added[0], added
    assert main(["scheduler", "--db", url, "--list"]) == 0
    assert "daily reports of workload 'code', 128 new tokens only into" in capsys.readouterr().out


def test_an_ored_cron_is_listed_as_written_and_kept_on_restart(store, no_blocking, capsys):
    assert sched_mod.cron_text(parse_cron("0 6 1 * 1")) == "0 6 1 * mon"
    assert sched_mod.cron_text(parse_cron("0 6 */2 * 1")) == "0 6 */2 * mon"
    url, engine, out = store
    args = ["scheduler", "--db", url, "--cron", "0 6 1 * 1", "--out", str(out)]
    assert main(args) == 0 and "job report-daily added" in capsys.readouterr().out
    [job] = no_blocking[-1]
    assert repr(job.trigger) == repr(parse_cron("0 6 1 * 1"))
    assert main(args) == 0 and "job report-daily kept" in capsys.readouterr().out
    assert main(["scheduler", "--db", url, "--list"]) == 0
    assert "cron '0 6 1 * mon' (UTC)" in capsys.readouterr().out


# ---- audit fixes ----------------------------------------------------------------------------------------


def test_duplicate_run_logs_the_periods_label_not_a_repr(store, caplog):
    from telemetry.report import period_window
    from telemetry.report_writer import write_report

    url, engine, out = store
    window = period_window("daily", now=D0 + timedelta(days=1, hours=6))
    assert write_report(engine, window, out, job_id="report-daily") is not None
    with caplog.at_level("INFO", logger="telemetry.report_writer"):
        assert write_report(engine, window, out, job_id="report-daily") is None
    [line] = [r.getMessage() for r in caplog.records if "already reported" in r.getMessage()]
    assert window.label() in line and "Window(" not in line and "datetime" not in line


def test_cli_refuses_a_store_that_does_not_exist(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(BlockingScheduler, "start", lambda self, *a, **kw: None)  # never block
    missing, out = tmp_path / "typo.db", tmp_path / "reports"
    assert main(["scheduler", "--db", str(missing), "--cron", "0 6 * * *", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"no store at {missing}" in err
    assert not missing.exists() and not out.exists()  # no empty store, no empty folder


def test_cli_on_a_read_only_store_leaves_no_empty_out_folder(db_url, read_only_url, tmp_path, monkeypatch,
                                                                capsys):
    """A read-only store opens and refuses only the job (its table, its row), after --out was made: the folders
    made for it were left behind, empty. They go again."""
    monkeypatch.setattr(BlockingScheduler, "start", lambda self, *a, **kw: None)  # never block
    engine = open_store(db_url)
    add_day(engine, D0)
    engine.dispose()
    out = tmp_path / "s2" / "x"
    assert main(["scheduler", "--db", read_only_url(db_url), "--cron", "0 6 * * *", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "readonly database" in err or "read-only transaction" in err, err
    assert not (tmp_path / "s2").exists()


@pytest.fixture
def no_blocking(monkeypatch):
    """`scheduler` starts paused, notes the jobs it would run, and stops instead of blocking."""
    ran: list[list] = []

    def start_and_stop(self, *args, **kwargs):
        BaseScheduler.start(self, paused=True)
        ran.append(self.get_jobs())
        BaseScheduler.shutdown(self, wait=False)

    monkeypatch.setattr(BlockingScheduler, "start", start_and_stop)
    return ran


def test_cli_runs_only_its_own_job_and_removes_the_others(store, no_blocking, capsys):
    url, engine, out = store
    base = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out)]
    secret = "https://hooks.example.test/services/T000/B000/s3cr3t"
    assert main([*base, "--job-id", "failtest", "--webhook", secret]) == 0
    assert main([*base, "--period", "weekly", "--keep-other-jobs"]) == 0
    assert main([*base, "--job-id", "failtest2", "--keep-other-jobs"]) == 0  # kept: all three run
    assert sorted(job_rows(engine)) == ["failtest", "failtest2", "report-weekly"]
    assert sorted(j.id for j in no_blocking[-1]) == ["failtest", "failtest2", "report-weekly"]
    capsys.readouterr()

    assert main(["scheduler", "--db", url, "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert sorted(line.split(":")[0] for line in listed) == ["failtest", "failtest2", "report-weekly"]
    [line] = [x for x in listed if x.startswith("failtest:")]
    assert "cron '0 6 * * *' (UTC), daily reports into" in line and "next run " in line
    assert "webhook https://hooks.example.test/***" in line and "s3cr3t" not in line

    assert main([*base, "--job-id", "failtest2"]) == 0
    printed = capsys.readouterr().out
    removed = [x for x in printed.splitlines() if x.startswith("scheduler: removed job ")]
    assert len(removed) == 2 and any("failtest:" in x for x in removed) and "s3cr3t" not in printed
    assert job_rows(engine) == ["failtest2"] and [j.id for j in no_blocking[-1]] == ["failtest2"]
    assert no_blocking[-1][0].name == "specfinops daily report failtest2"  # log lines say which job ran


def test_cli_list_needs_no_cron_and_an_empty_store_says_so(store, capsys):
    url, _, _ = store
    assert main(["scheduler", "--db", url, "--list"]) == 0
    assert capsys.readouterr().out.strip() == "scheduler: no jobs in the store"
    with pytest.raises(SystemExit) as exc:
        main(["scheduler", "--db", url])
    assert exc.value.code == 2 and "--cron, --out (or --list)" in capsys.readouterr().err


def test_list_takes_no_schedule_options_and_out_must_name_a_folder(store, tmp_path, capsys, monkeypatch):
    """--list beside --cron/--out dropped them unsaid; --out '' was the current folder (a job persisted to write
    wherever the scheduler happened to be started)."""
    url, _, _ = store
    assert main(["scheduler", "--db", url, "--list", "--cron", "0 6 * * *", "--out", "rs"]) == 2
    assert "--list lists the persisted jobs and takes no --cron, --out" in capsys.readouterr().err
    here = tmp_path / "started-here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", ""]) == 2
    assert main(["report", "--db", url, "--period", "daily", "--out", " "]) == 2
    err = capsys.readouterr().err
    assert "scheduler: error: --out must name a folder, got ''" in err and "--out must name a folder, got ' '" in err
    assert list(here.iterdir()) == []
    assert main(["scheduler", "--db", url, "--list"]) == 0
    assert capsys.readouterr().out.strip() == "scheduler: no jobs in the store"


def test_a_kept_job_stored_under_the_old_name_is_renamed(store):
    url, engine, out = store
    job = _job(url, out)
    s = make_scheduler(engine)
    s.add_job(sched_mod.JOB_FUNC, EVERY_SECOND, id=job.job_id, name="specfinops daily report", kwargs=job.kwargs(),
              coalesce=True, max_instances=1, misfire_grace_time=job.misfire_grace_s)  # fmt: skip
    s.start(paused=True)
    s.shutdown(wait=False)
    before = sched_mod.persisted_jobs(engine)[0].next_run_time
    assert schedule_report_job(make_scheduler(engine), engine, job, EVERY_SECOND) == "kept"
    [stored] = sched_mod.persisted_jobs(engine)
    assert stored.name == "specfinops daily report report-daily" and stored.next_run_time == before


# ---- stopping: SIGTERM, and what a killed run leaves behind ---------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def _due_now(engine, job_id: str = "report-daily") -> None:
    """Make the persisted job due a minute ago (a run missed within the grace time runs at once on start)."""
    store = SQLAlchemyJobStore(engine=engine, tablename=JOBS_TABLE)
    job = store.lookup_job(job_id)
    state = job.__getstate__()
    state["next_run_time"] = datetime.now(UTC) - timedelta(minutes=1)
    job.__setstate__(state)
    store.update_job(job)


def _scheduler_process(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app.cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


@pytest.fixture
def failing_hook():
    hook = Hook(500)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    yield hook
    hook.shutdown()
    hook.server_close()


def _killed_between_retries(store, hook, no_blocking, sig, *more) -> tuple[subprocess.Popen, list[str]]:
    """A scheduler process whose run wrote its report and failed its first webhook attempt, sent `sig` (then
    each of `more`, half a second apart)."""
    url, engine, out = store
    args = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out), "--webhook", hook.url]
    assert main(args) == 0  # persists the job exactly as the command line configures it
    _due_now(engine)
    proc = _scheduler_process(args)
    try:
        wait_for(lambda: len(hook.bodies) >= 1 or proc.poll() is not None, "the first webhook attempt")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)  # now in the backoff between attempt 1 and 2
        hook.status = 200  # the next attempt, if any, succeeds
        for again in more:
            time.sleep(0.5)
            proc.send_signal(again)
        proc.wait(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc, args


def test_sigterm_stops_like_ctrl_c_and_the_delivery_in_progress_finishes(store, failing_hook, no_blocking):
    url, engine, out = store
    proc, _ = _killed_between_retries(store, failing_hook, no_blocking, signal.SIGTERM)
    _, err = proc.communicate()
    assert proc.returncode == 130 and "interrupted" in err  # not -15
    [row] = reports(engine)
    assert row.delivery_status == "delivered" and len(failing_hook.bodies) >= 2  # not left "pending"


def test_a_second_sigterm_neither_interrupts_the_stopping_nor_kills_the_run(store, failing_hook, no_blocking):
    """`timeout -s TERM` signals the scheduler and then its process group: the second TERM is ignored (it printed
    a traceback from inside the stopping, or killed the run still delivering)."""
    url, engine, out = store
    proc, _ = _killed_between_retries(store, failing_hook, no_blocking, signal.SIGTERM, signal.SIGTERM)
    _, err = proc.communicate()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.count("SIGTERM: stopping") == 1, err
    [row] = reports(engine)
    assert row.delivery_status == "delivered"


def test_ctrl_c_waits_for_the_run_in_progress_and_says_so(store, failing_hook, no_blocking):
    url, engine, out = store
    proc, _ = _killed_between_retries(store, failing_hook, no_blocking, signal.SIGINT)
    _, err = proc.communicate()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "waiting for the report run in progress to finish" in err
    [row] = reports(engine)
    assert row.delivery_status == "delivered"


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM])
def test_a_second_ctrl_c_stops_at_once_without_a_traceback_and_a_restart_delivers(store, failing_hook, no_blocking,
                                                                                  capsys, first):
    """Ctrl-C while the scheduler waits for its run in progress stops it at once: one line, exit 130 (Python
    printed a KeyboardInterrupt traceback from joining the run's thread at exit); the report it wrote stays
    'pending' and the next start of the job delivers it."""
    url, engine, out = store
    proc, args = _killed_between_retries(store, failing_hook, no_blocking, first, signal.SIGINT)
    _, err = proc.communicate()
    assert proc.returncode == 130 and "Traceback" not in err and "Exception ignored" not in err, err
    assert "stopped without waiting" in err
    # it says when its leftovers are finished (a start right away left them alone, unsaid, and --list hid them)
    assert "finished by this job's first run, or `specfinops scheduler` start, from " in err, err
    [row] = reports(engine)
    assert row.delivery_status == "pending"
    capsys.readouterr()
    assert main(["scheduler", "--db", url, "--list"]) == 0
    listed = capsys.readouterr().out
    assert f"report #{row.id} (" in listed and "job report-daily: pending, written, its delivery not made; " \
        "finished by the job's first run, or scheduler start, from " in listed, listed
    assert main(args) == 0  # right away: too young to take (another scheduler may be at it), and said so
    started = capsys.readouterr().out
    assert f"report job report-daily: report #{row.id} (" in started and "left alone (another scheduler may be at " \
        "it); this job's first run, or scheduler start, from " in started, started
    assert reports(engine)[0].delivery_status == "pending"
    with engine.begin() as c:  # as if the restart came later than sched_mod.STALE_AFTER_S
        c.execute(text("UPDATE reports SET created_at = :t"), {"t": datetime.now(UTC) - timedelta(hours=1)})
    capsys.readouterr()
    assert main(args) == 0
    assert f"report #{row.id} left undelivered, delivering it now (delivered)" in capsys.readouterr().out
    assert reports(engine)[0].delivery_status == "delivered"


def _left_pending(engine, url: str, out) -> Report:
    """A report of job report-daily written and left 'pending', as a run killed while delivering leaves it."""
    sched_mod.run_report_job(**_job(url, out).kwargs())
    with engine.begin() as c:
        c.execute(text("UPDATE reports SET delivery_status = 'pending', delivery_error = NULL"))
    [row] = reports(engine)
    return row


def test_a_pending_report_of_a_job_that_delivers_nothing_is_said_to_stay_pending(store, no_blocking, capsys):
    """Restarted without its delivery, the job never finishes a report a killed run left 'pending'
    (recover_reports only warns): the start and --list said the job's first run or start finishes it."""
    url, engine, out = store
    row = _left_pending(engine, url, out)
    capsys.readouterr()
    assert main(["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out)]) == 0  # no --webhook now
    started = capsys.readouterr().out
    assert f"report job report-daily: report #{row.id} (" in started and "is written, its delivery not made: left " \
        "pending: no delivery configured (the job has no --webhook, --webhook-env or --smtp)" in started, started
    assert "finishes it" not in started, started
    for age in (timedelta(0), timedelta(hours=1)):  # too young to recover, and old enough: left pending alike
        with engine.begin() as c:
            c.execute(text("UPDATE reports SET created_at = :t"), {"t": datetime.now(UTC) - age})
        assert main(["scheduler", "--db", url, "--list"]) == 0
        listed = capsys.readouterr().out
        assert f"report #{row.id} (" in listed and "job report-daily: pending, written, its delivery not made; left " \
            "pending: no delivery configured" in listed, listed
        assert "finished by" not in listed, listed
    assert reports(engine)[0].delivery_status == "pending"


def test_an_unfinished_report_whose_job_is_gone_is_listed_with_the_command_that_writes_it_again(store, no_blocking,
                                                                                                 capsys):
    """--list said 'finished by the job's next run or scheduler start' of a report whose job is no longer in the
    job table (removed by another job's start): nothing finishes it. The command it names writes its period."""
    import shlex

    url, engine, out = store
    args = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out), "--webhook", "http://127.0.0.1:9/h"]
    assert main(args) == 0
    row = _left_pending(engine, url, out)
    assert main(["scheduler", "--db", url, "--cron", "0 7 * * *", "--out", str(out), "--job-id", "other"]) == 0
    assert [j.id for j in sched_mod.persisted_jobs(engine)] == ["other"]  # report-daily removed
    capsys.readouterr()
    assert main(["scheduler", "--db", url, "--list"]) == 0
    listed = capsys.readouterr().out
    command = f"specfinops report --db {url} --period daily --since {row.since:%Y-%m-%dT%H:%M} --out {out}"
    assert f"report #{row.id} (" in listed and "job report-daily: pending, written, its delivery not made; its job " \
        f"is gone (`{command}` to write it again); till " in listed, listed  # young: it may be a run at work
    assert "finished by" not in listed, listed
    assert main(shlex.split(command)[1:]) == 0
    again = reports(engine)[-1]
    assert again.id != row.id and again.job_id is None and again.since == row.since
    assert Path(again.csv_dir).parent == out


def _claim_left_generating(engine, job_id: str, since: datetime, out, age: timedelta) -> tuple[Report, Path]:
    """What a run of `job_id` killed inside write_report leaves: its claim, `age` old, and its temporary folder
    holding a half-written page."""
    from telemetry.report import period_window
    from telemetry.report_writer import report_dir_name

    window = period_window("daily", since=since)
    with Session(engine, expire_on_commit=False) as s:
        row = Report(period="daily", since=window.since, until=window.until, html_path="", csv_dir="",
                     delivery_status="generating", job_id=job_id, created_at=datetime.now(UTC) - age)  # fmt: skip
        s.add(row)
        s.flush()
        row.csv_dir = str(out / report_dir_name(row.id, window))
        s.commit()
    tmp = out / f".{report_dir_name(row.id, window)}.tmp"
    tmp.mkdir(parents=True)
    (tmp / "report.html").write_text("<html>half", encoding="utf-8")
    return row, tmp


def test_a_claim_left_generating_by_a_job_that_is_gone_is_released(store, no_blocking, capsys):
    """A run killed while writing left its claim 'generating'; then another job's start removed its job. Only
    that job's scheduler released it (recover_reports): it stayed 'generating' for ever, its half-written
    folder with it. Once stale it is released by a scheduler's start and by any report written, and said so
    with the command that writes its period again; a claim of a job still in the job table is left to its job."""
    from telemetry.report import period_window
    from telemetry.report_writer import STALE_AFTER_S, write_report

    url, engine, out = store
    old = timedelta(seconds=STALE_AFTER_S + 60)
    assert main(["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out), "--job-id", "kept"]) == 0
    kept, kept_tmp = _claim_left_generating(engine, "kept", D0 - timedelta(days=9), out, old)
    gone, gone_tmp = _claim_left_generating(engine, "report-daily", D0 - timedelta(days=3), out, old)
    young, young_tmp = _claim_left_generating(engine, "report-daily", D0 - timedelta(days=2), out, timedelta(0))
    capsys.readouterr()
    assert main(["scheduler", "--db", url, "--list"]) == 0
    listed = capsys.readouterr().out
    assert f"report #{young.id} (" in listed and "its claim is released by the next report written to this store " \
        "or scheduler started on it from " in listed, listed
    # another job's start, keeping 'kept': report-daily is not in the job table (never was), its old claim released
    args = ["scheduler", "--db", url, "--cron", "0 7 * * *", "--out", str(out), "--job-id", "other"]
    assert main([*args, "--keep-other-jobs"]) == 0
    started = capsys.readouterr().out
    command = f"specfinops report --db {url} --period daily --since {gone.since:%Y-%m-%dT%H:%M} --out {out}"
    assert f"scheduler: report #{gone.id} (daily " in started and "of job report-daily was left 'generating' by a " \
        "run that was killed, and its job is gone from the store's job table (nothing would finish it): its record " \
        f"and temporary folder are removed; `{command}` writes that period again" in started, started
    assert not gone_tmp.exists() and kept_tmp.exists() and young_tmp.exists()
    assert {r.id: r.delivery_status for r in reports(engine)} == {kept.id: "generating", young.id: "generating"}
    with engine.begin() as c:  # the young one grows stale: a report written by hand releases it
        c.execute(text("UPDATE reports SET created_at = :t WHERE id = :i"), {"t": datetime.now(UTC) - old,
                                                                            "i": young.id})
    assert write_report(engine, period_window("daily", since=D0), out) is not None
    assert not young_tmp.exists() and kept_tmp.exists()
    rows = reports(engine)
    assert [r.job_id for r in rows if r.delivery_status == "generating"] == ["kept"], rows  # its job's to rewrite
    assert not any(p.name.endswith(".tmp") and p != kept_tmp for p in out.iterdir())


def test_a_start_keeps_the_claims_of_the_jobs_it_removes_for_their_restart(store, no_blocking, capsys):
    """Job B's start without --keep-other-jobs removed job A and then released A's stale claim (its job gone):
    A, started again with --keep-other-jobs as the removal tells its user, had nothing left to rewrite (its
    killed run's period went unreported). The start that removes a job leaves its claim; the restart rewrites
    it. A claim of a job gone before the start (not removed by it) is released, as before."""
    from telemetry.report import period_window
    from telemetry.report_writer import STALE_AFTER_S

    url, engine, out = store
    old = timedelta(seconds=STALE_AFTER_S + 60)
    a_args = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out), "--job-id", "A"]
    assert main(a_args) == 0
    window = period_window("daily", now=D0 + timedelta(days=1, hours=6))  # what A's next run reports
    a_claim, a_tmp = _claim_left_generating(engine, "A", window.since, out, old)
    gone, gone_tmp = _claim_left_generating(engine, "gone-before", D0 - timedelta(days=5), out, old)
    capsys.readouterr()
    assert main(["scheduler", "--db", url, "--cron", "0 7 * * *", "--out", str(out), "--job-id", "B"]) == 0
    started = capsys.readouterr().out
    assert "scheduler: removed job A: " in started, started
    assert f"report #{gone.id} (" in started and f"report #{a_claim.id} (" not in started, started
    assert {r.id: r.delivery_status for r in reports(engine)} == {a_claim.id: "generating"}
    assert a_tmp.exists() and not gone_tmp.exists()
    assert main([*a_args, "--keep-other-jobs"]) == 0  # A started again: its killed run's report is rewritten
    assert "an interrupted run's claim released, rewritten as #" in capsys.readouterr().out
    [again] = [r for r in reports(engine) if r.job_id == "A"]
    assert again.delivery_status == "not requested" and again.summary["traffic"]
    assert again.since.replace(tzinfo=UTC) == window.since and (Path(again.csv_dir) / "report.html").is_file()
    assert not a_tmp.exists()


def test_a_stale_scheduled_claim_in_a_store_with_no_job_table_is_left_to_its_job(store):
    """A store no scheduler made its job table in tells no job gone (d11d8ff): a stale scheduled claim there is
    left to its job, not released as a gone job's, and a report written to the store is written (the job table
    is not looked for in vain, nor made)."""
    from sqlalchemy import inspect

    from telemetry.report import period_window
    from telemetry.report_writer import STALE_AFTER_S, release_stale_claims, write_report

    url, engine, out = store
    assert not inspect(engine).has_table(JOBS_TABLE)
    claim, tmp = _claim_left_generating(engine, "report-daily", D0 - timedelta(days=3),
                                        out, timedelta(seconds=STALE_AFTER_S + 60))
    assert release_stale_claims(engine, out) == []
    assert write_report(engine, period_window("daily", since=D0), out) is not None
    assert {r.id: r.delivery_status for r in reports(engine)}[claim.id] == "generating" and tmp.exists()
    assert not inspect(engine).has_table(JOBS_TABLE)


def test_a_report_by_a_role_that_may_not_read_the_job_table_is_written(pg_url, pg_reader, tmp_path, no_blocking,
                                                                       capsys):
    """A PostgreSQL role granted the report tables but not the scheduler's job table: every `specfinops report`
    failed (`cannot use the database: permission denied for table apscheduler_jobs`, exit 2), the job table read
    at its start for gone jobs' claims. The report is written; those claims are left to a role that may read it."""
    from sqlalchemy import create_engine

    from telemetry.report_writer import STALE_AFTER_S

    engine = open_store(pg_url)
    try:
        add_day(engine, D0)
        out = tmp_path / "reports"
        assert main(["scheduler", "--db", pg_url, "--cron", "0 6 * * *", "--out", str(out), "--job-id", "J1"]) == 0
        gone, gone_tmp = _claim_left_generating(engine, "gone-job", D0 - timedelta(days=3), out,
                                                timedelta(seconds=STALE_AFTER_S + 60))
        role, role_url = pg_reader()
        admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(f'REVOKE ALL ON {JOBS_TABLE} FROM "{role}"'))
                conn.execute(text(f'GRANT INSERT, UPDATE, DELETE ON reports TO "{role}"'))
                conn.execute(text(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO "{role}"'))
        finally:
            admin.dispose()
        capsys.readouterr()
        args = ["report", "--db", role_url, "--out", str(out), "--period", "daily", "--since", D0.isoformat()]
        assert main(args) == 0, capsys.readouterr().err
        said = capsys.readouterr()
        assert "permission denied" not in said.out + said.err and "Traceback" not in said.err, said
        rows = {r.id: r for r in reports(engine)}
        assert rows[gone.id].delivery_status == "generating" and gone_tmp.exists()  # left to a role that may
        [made] = [r for r in rows.values() if r.job_id is None]
        assert (Path(made.csv_dir) / "report.html").is_file()
    finally:
        engine.dispose()


def test_the_sigterm_handler_disarms_after_the_first_signal(capsys):
    import os

    from app.commands._common import sigterm_as_ctrl_c

    original = signal.getsignal(signal.SIGTERM)
    try:
        with sigterm_as_ctrl_c("x"):  # not signalled: the handler is put back
            pass
        assert signal.getsignal(signal.SIGTERM) is original
        with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c("scheduler: SIGTERM: stopping"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises in here
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # while stopping: ignored, neither raised nor fatal
            time.sleep(0.2)
        except KeyboardInterrupt:
            pytest.fail("a second SIGTERM interrupted the stopping")
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # until the process exits
    finally:
        signal.signal(signal.SIGTERM, original)
    assert capsys.readouterr().err.count("SIGTERM: stopping") == 1


def test_a_sigterm_after_ctrl_c_does_not_interrupt_the_stopping(capsys):
    """A command that ignores SIGINT while it stops (bench, loadtest after a first Ctrl-C) must not be interrupted
    by a SIGTERM then (`docker stop` after Ctrl-C): it raised KeyboardInterrupt inside the cleanup."""
    import os

    from app.commands._common import sigterm_as_ctrl_c

    original_term, original_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        with sigterm_as_ctrl_c("stopping"):
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # what the command's stopping does after the first Ctrl-C
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs in here: it must neither raise nor exit
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # fired once: ignored until the process exits
    finally:
        signal.signal(signal.SIGTERM, original_term)
        signal.signal(signal.SIGINT, original_int)


def test_a_scheduled_run_releases_a_killed_manual_reports_claim(store, tmp_path):
    """A `specfinops report` killed outright left its claim 'generating' (no job id): a scheduled run releases it
    once stale and removes its temporary folder, where the claim recorded it."""
    from telemetry.report import period_window
    from telemetry.report_writer import STALE_AFTER_S, report_dir_name

    url, engine, out = store
    window = period_window("daily", since=D0)
    by_hand = tmp_path / "by-hand"
    with Session(engine) as s:
        row = Report(period="daily", since=window.since, until=window.until, html_path="", csv_dir="",
                     delivery_status="generating", created_at=datetime.now(UTC) - timedelta(seconds=STALE_AFTER_S + 60))
        s.add(row)
        s.flush()
        row.csv_dir = str(by_hand / report_dir_name(row.id, window))
        s.commit()
        leftover = by_hand / f".{report_dir_name(row.id, window)}.tmp"
    leftover.mkdir(parents=True)
    assert sched_mod.run_report_job(**_job(url, out).kwargs()) is not None
    [row] = reports(engine)  # the scheduled run's report only (SQLite may give it the released id again)
    assert row.job_id == "report-daily" and row.delivery_status == "not requested" and not leftover.exists()


def test_a_delivery_killed_outright_is_made_on_restart(store, failing_hook, no_blocking, capsys):
    url, engine, out = store
    _, args = _killed_between_retries(store, failing_hook, no_blocking, signal.SIGKILL)
    [row] = reports(engine)
    assert row.delivery_status == "pending"  # what SIGKILL leaves: written, never delivered
    posts = len(failing_hook.bodies)
    capsys.readouterr()
    assert main(args) == 0 and "job report-daily kept" in capsys.readouterr().out  # too young: left alone
    assert reports(engine)[0].delivery_status == "pending" and len(failing_hook.bodies) == posts
    with engine.begin() as c:  # as if the restart came later than sched_mod.STALE_AFTER_S
        c.execute(text("UPDATE reports SET created_at = :t"), {"t": datetime.now(UTC) - timedelta(hours=1)})
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"report #{row.id} left undelivered, delivering it now (delivered)" in printed
    [row] = reports(engine)
    assert row.delivery_status == "delivered" and json.loads(failing_hook.bodies[-1][1])["report_id"] == row.id


def test_a_claim_left_generating_is_released_and_the_period_written(store, no_blocking, capsys):
    from telemetry.report import period_window

    def report_dir_name(report_id, window):  # write_report's layout
        return f"report-{report_id}-{window.period}-{window.since:%Y%m%dT%H%MZ}"

    url, engine, out = store
    args = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out)]
    assert main(args) == 0
    window = period_window("daily", now=D0 + timedelta(days=1, hours=6))
    created = {"young": datetime.now(UTC), "old": datetime.now(UTC) - timedelta(hours=1)}
    with Session(engine) as s:  # what a run killed inside write_report leaves: its claim and a temporary folder
        for age, since in (("old", window.since), ("young", window.since - timedelta(days=1))):
            s.add(Report(period="daily", since=since, until=since + timedelta(days=1), html_path="", csv_dir="",
                         delivery_status="generating", job_id="report-daily", created_at=created[age]))  # fmt: skip
        s.commit()
    old_id = reports(engine)[0].id
    leftover = out / f".{report_dir_name(old_id, window)}.tmp"
    leftover.mkdir(parents=True)
    capsys.readouterr()
    assert main(args) == 0
    assert "an interrupted run's claim released, rewritten as #" in capsys.readouterr().out
    rows = {r.since.replace(tzinfo=UTC): r for r in reports(engine)}
    again = rows[window.since]
    assert again.id != old_id and again.delivery_status == "not requested" and again.summary["traffic"]
    assert (out / report_dir_name(again.id, window) / "report.html").is_file() and not leftover.exists()
    assert rows[window.since - timedelta(days=1)].delivery_status == "generating"  # young: maybe in progress


def test_webhook_url_from_the_environment_is_never_stored(store, no_blocking, monkeypatch, capsys):
    url, engine, out = store
    hook = Hook(200)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    secret_url = hook.url + "/T000/s3cr3t"
    base = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out)]
    monkeypatch.delenv("FINOPS_HOOK", raising=False)
    assert main([*base, "--webhook-env", "FINOPS_HOOK"]) == 2
    assert "the environment variable FINOPS_HOOK is not set" in capsys.readouterr().err
    assert main([*base, "--webhook-env", "FINOPS_HOOK", "--webhook", secret_url]) == 2
    assert "not both" in capsys.readouterr().err
    monkeypatch.setenv("FINOPS_HOOK", secret_url)
    try:
        assert main([*base, "--webhook-env", "FINOPS_HOOK"]) == 0
        with engine.connect() as c:
            [state] = c.execute(text(f"SELECT job_state FROM {JOBS_TABLE}")).scalars()
        assert b"s3cr3t" not in state and b"FINOPS_HOOK" in state
        assert main(["scheduler", "--db", url, "--list"]) == 0
        assert "delivery webhook from $FINOPS_HOOK" in capsys.readouterr().out
        [job] = no_blocking[-1]
        assert sched_mod.run_report_job(**job.kwargs) is not None  # a run reads the variable
        [row] = reports(engine)
        assert row.delivery_status == "delivered" and len(hook.bodies) == 1
    finally:
        hook.shutdown()
        hook.server_close()


def test_a_job_of_one_temperature_and_run_kind_keeps_them_and_reports_only_those_runs(store, no_blocking, capsys):
    url, engine, out = store  # D0's runs: bench, temperature 0
    base = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out)]
    assert main([*base, "--temperature", "0.8", "--run-kind", "bench"]) == 0
    assert main(["scheduler", "--db", url, "--list"]) == 0
    assert "daily reports of temperature 0.8, bench runs only into" in capsys.readouterr().out
    [job] = no_blocking[-1]
    assert job.kwargs["temperature"] == 0.8 and job.kwargs["kind"] == "bench"
    assert sched_mod.run_report_job(**job.kwargs) is not None  # reports D0: no traffic at 0.8
    [row] = reports(engine)
    assert (row.summary["temperature"], row.summary["run_kind"], row.summary["traffic"]) == (0.8, "bench", False)
    # a job without them stores neither (a job stored before they existed compares equal)
    assert main(base) == 0
    [job] = no_blocking[-1]
    assert "temperature" not in job.kwargs and "kind" not in job.kwargs
    assert main([*base, "--temperature", "warm"]) == 2
    assert "--temperature must be a number, got 'warm'" in capsys.readouterr().err


def test_a_job_of_one_workload_and_target_keeps_them_and_warns_of_names_no_run_recorded(store, no_blocking, capsys):
    url, engine, out = store  # D0's runs: workload code, target demo/target-tiny
    base = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out)]
    assert main([*base, "--workload", "code", "--target", "demo/target-tiny"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["scheduler", "--db", url, "--list"]) == 0
    assert "daily reports of workload 'code', target 'demo/target-tiny' only into" in capsys.readouterr().out
    [job] = no_blocking[-1]
    assert job.kwargs["workload"] == "code" and job.kwargs["target"] == "demo/target-tiny"
    assert sched_mod.run_report_job(**job.kwargs) is not None
    [row] = reports(engine)
    assert (row.summary["workload"], row.summary["target"], row.summary["traffic"]) == ("code", "demo/target-tiny",
                                                                                        True)
    # a model not measured yet is scheduled, with a warning naming what the store has
    assert main([*base, "--target", "m/next"]) == 0
    err = capsys.readouterr().err
    assert "scheduler: warning: no runs with target 'm/next' (targets in the store: demo/target-tiny)" in err
    [job] = no_blocking[-1]
    assert job.kwargs["target"] == "m/next" and "workload" not in job.kwargs
    # a job without them stores neither (a job stored before they existed compares equal)
    assert main(base) == 0
    [job] = no_blocking[-1]
    assert "workload" not in job.kwargs and "target" not in job.kwargs


def test_a_workload_file_is_stored_by_its_absolute_path_and_a_builtin_by_its_name(store, no_blocking, capsys,
                                                                                 tmp_path, monkeypatch):
    """`--workload my_prompts.jsonl` was stored as typed and resolved at each run, from wherever the scheduler ran
    then: from another folder its runs (recorded by bench under the file's absolute path) were 'no traffic'."""
    url, engine, out = store
    here, elsewhere = tmp_path / "prompts-here", tmp_path / "started-elsewhere"
    here.mkdir(), elsewhere.mkdir()
    monkeypatch.chdir(here)
    base = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out)]
    assert main([*base, "--workload", "my_prompts.jsonl"]) == 0
    capsys.readouterr()
    [job] = no_blocking[-1]
    recorded = str((here / "my_prompts.jsonl").resolve())
    assert job.kwargs["workload"] == recorded
    assert main(["scheduler", "--db", url, "--list"]) == 0
    assert f"daily reports of workload {recorded!r} only into" in capsys.readouterr().out
    with engine.begin() as c:  # D0's runs, as bench records a workload file: its absolute path
        c.execute(text("UPDATE runs SET workload = :w"), {"w": recorded})
    monkeypatch.chdir(elsewhere)
    assert sched_mod.run_report_job(**job.kwargs) is not None
    [row] = reports(engine)
    assert (row.summary["workload"], row.summary["traffic"]) == (recorded, True)
    for name in ("code", "chat", "all"):  # builtin workloads stay names
        assert main([*base, "--workload", name]) == 0
        [job] = no_blocking[-1]
        assert job.kwargs["workload"] == name


def test_a_job_priced_at_the_users_gpu_keeps_its_prices_and_every_run_reports_at_them(store, no_blocking, capsys):
    """`scheduler` took no --gpu / --gpus-per-node / --node-hourly-usd: a scheduled report could only price at
    the catalog. The job stores project's prices with its other options and each run's report is at them."""
    url, engine, out = store
    traffic = ["--daily-tokens", "5e8", "--peak-factor", "2", "--p95-tpot-sla-ms", "50"]
    base = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out), *traffic]
    prices = ["--gpu", "H100", "--gpus-per-node", "8"]
    assert main([*base, *prices]) == 0
    assert "daily reports priced at --gpu H100 --gpus-per-node 8 into" in capsys.readouterr().out
    assert main(["scheduler", "--db", url, "--list"]) == 0
    assert "daily reports priced at --gpu H100 --gpus-per-node 8 into" in capsys.readouterr().out
    [job] = no_blocking[-1]  # as the job store holds it
    assert (job.kwargs["gpu"], job.kwargs["gpus_per_node"], job.kwargs["sla_ms"]) == ("H100", 8, 50.0)
    assert main(["project", "--db", url, *traffic, *prices, "--json"]) == 0
    projected = json.loads(capsys.readouterr().out)
    for _ in range(2):  # every run: D0, then the day after (no traffic: no projection, the prices still said)
        assert sched_mod.run_report_job(**job.kwargs) is not None
    first, second = reports(engine)
    for row in (first, second):
        assert row.summary["priced_at"] == "--gpu H100 --gpus-per-node 8"
        assert row.summary["pricing"]["gpu"] == "H100" and row.summary["pricing"]["gpus_per_node"] == 8
        assert "Priced at <code>--gpu H100 --gpus-per-node 8</code>" in Path(row.html_path).read_text("utf-8")
    p = first.summary["projection"]
    assert p["assumptions"]["priced_as"] == "H100 x8" and p["assumptions"]["gpus_per_node"] == 8
    assert (p["nodes_ar"], p["nodes_spec"], p["annual_savings_usd"]) == (
        projected["nodes_ar"], projected["nodes_spec"], projected["annual_savings_usd"])
    # the same options again: the job is kept; without prices it stores none (a job stored before they existed
    # compares equal) and is replaced
    assert main([*base, *prices]) == 0
    assert "job report-daily kept" in capsys.readouterr().out
    assert main([*base, "--sla-ms", "50"]) == 0
    assert "job report-daily replaced" in capsys.readouterr().out
    [job] = no_blocking[-1]
    assert not {"gpu", "gpus_per_node", "node_hourly_usd", "usd_per_kwh", "pue"} & set(job.kwargs)


def test_a_stored_webhook_with_a_bad_port_records_a_failed_delivery_and_the_cli_refuses_it(store, no_blocking, capsys):
    url, engine, out = store
    # a job stored before the URL was checked where it entered: the run writes its report and records the failure
    bad = "http://127.0.0.1:99999/hook"
    assert sched_mod.run_report_job(**_job(url, out, webhook_url=bad, delivery_attempts=1).kwargs()) is not None
    [row] = reports(engine)
    assert row.delivery_status == "failed" and len(row.delivery_error.splitlines()) == 1
    assert "not attempted: --webhook has a bad port" in row.delivery_error
    # the command line refuses it, naming --webhook, before the store's other jobs are removed
    base = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out)]
    assert main([*base, "--job-id", "other"]) == 0
    capsys.readouterr()
    assert main([*base, "--webhook", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--webhook has a bad port" in err
    assert job_rows(engine) == ["other"]


def _errors(caplog) -> list:
    return [r for r in caplog.records if r.levelname == "ERROR"]


def test_a_run_whose_out_became_a_file_logs_one_line_and_no_traceback(store, caplog):
    """The job's --out replaced by a plain file: APScheduler printed 'ValueError: --out ... is not a writable
    directory' with a full traceback. The run now logs one ERROR line naming the job, and the next run of
    the scheduler goes on (and succeeds once the folder is back)."""
    url, engine, out = store
    out.write_text("x")
    s, _ = _started(engine, _job(url, out))
    try:
        with caplog.at_level("INFO"):
            wait_for(lambda: len(_errors(caplog)) >= 2, "two failed runs")
    finally:
        s.shutdown(wait=True)
    errors = _errors(caplog)
    assert all(r.name == "telemetry.scheduler" and r.exc_info is None for r in errors), errors
    line = errors[0].getMessage()
    assert line.startswith("report job report-daily: run failed: --out ") and "is not a writable directory" in line
    assert len(line.splitlines()) == 1 and "Traceback" not in caplog.text
    assert reports(engine) == []  # nothing half-written
    out.unlink()
    assert sched_mod.run_report_job(**_job(url, out).kwargs()) is not None


def test_a_run_that_cannot_reach_its_database_logs_one_line(tmp_path, caplog):
    job = ReportJob(job_id="pgjob", db_url="postgresql+psycopg://root@127.0.0.1:1/test", out_dir=str(tmp_path))
    with caplog.at_level("INFO"):
        assert sched_mod.run_report_job(**job.kwargs()) is None
    [error] = _errors(caplog)
    assert error.exc_info is None and error.getMessage().startswith("report job pgjob: run failed: database error: ")
    assert "\n" not in error.getMessage() and "SELECT" not in error.getMessage()


def test_a_bug_in_a_run_still_reaches_apscheduler_with_its_traceback(store, monkeypatch):
    url, _, out = store

    def bug(*_a, **_k):
        raise TypeError("a bug")

    monkeypatch.setattr(sched_mod, "_write", bug)
    with pytest.raises(TypeError, match="a bug"):
        sched_mod.run_report_job(**_job(url, out).kwargs())


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--misfire-grace-s", "0"],
         "--misfire-grace-s must be a whole number of seconds from 1 to 31622400 (366 days), got 0"),
        (["--job-id", "j" * 200], "--job-id must be 1-128 characters"),
        (["--job-id", ""], "--job-id must be 1-128 characters"),
        (["--webhook", "http://127.0.0.1:99999/hook"], "--webhook has a bad port"),
        (["--sla-ms", "0"], "--sla-ms must be > 0"),
        (["--p95-tpot-sla-ms", "0"], "--sla-ms must be > 0"),  # project's name of it
        # a price no run could be costed at: refused before the job is stored, not 'cost n/a' at every run
        (["--gpu", "H1000"], "--gpu: unknown price name 'H1000'"),
        # the energy entries are in the catalog but are no node's price: refused as up front as an unknown name
        (["--gpu", "pue"], "--gpu 'pue' names the pue price (ratio), not an hourly GPU or node price"),
        (["--gpu", "electricity"],
         "--gpu 'electricity' names the electricity price (usd_per_kwh), not an hourly GPU or node price"),
        (["--gpu", "cpu-2core", "--gpus-per-node", "2"], "'cpu-2core' is a node price"),
        (["--gpus-per-node", "2"], "--gpus-per-node needs --gpu NAME"),
        (["--node-hourly-usd", "-1"], "--node-hourly-usd must be > 0"),
    ],
)
def test_cli_bad_input_leaves_no_out_folder(store, tmp_path, capsys, extra, needle):
    """'--misfire-grace-s 0' or a 200-character --job-id printed the error but left the empty --out folder:
    ReportJob checked them after check_out_dir had made it."""
    url, _, _ = store
    out = tmp_path / "q1"
    assert main(["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err
    assert not out.exists()


def test_the_missed_periods_command_masks_the_password_and_keeps_every_digit():
    """It printed the store's password to the log and rounded the job's options (`--daily-tokens 1.23457e+08`
    for 123456789, a temperature of 0.123457 that matches no run)."""
    from types import SimpleNamespace

    from app.commands.scheduler import _unreported_text

    lost = [SimpleNamespace(period="daily", since=datetime(2026, 12, 2, tzinfo=UTC), span_text=lambda: "Dec 2")]
    text = _unreported_text(lost, {"db_url": "postgresql+psycopg://ops:hunter2@db:5432/specfinops",
                                   "out_dir": "/reports", "daily_tokens": 123456789.0, "temperature": 0.123456789})
    assert "hunter2" not in text and "postgresql://ops:***@db:5432/specfinops" in text, text  # as the user writes it
    assert "` (*** is its password) writes it" in text, text
    assert "--daily-tokens 123456789.0" in text and "--temperature 0.123456789" in text, text
    priced = _unreported_text(lost, {"db_url": "/s.db", "out_dir": "/reports", "gpu": "H100", "gpus_per_node": 8})
    assert "--gpu H100 --gpus-per-node 8` writes it" in priced, priced  # the report at the job's own prices


def test_of_two_schedulers_recovering_one_undelivered_report_only_one_sends_it(store, failing_hook, monkeypatch):
    """Two schedulers started together on one store both found the report a killed run left "pending" and both
    sent it (the receiver got report #3 twice). Each now takes it in one UPDATE first: both read the stale
    record before either has sent it, and one sends it."""
    from telemetry import report_writer

    url, engine, out = store
    hook = failing_hook
    hook.status = 200
    job = _job(url, out, webhook_url=hook.url)
    written = sched_mod._write(engine, job, report_writer_window(job))
    with engine.begin() as c:  # written, never delivered, an hour ago: what a scheduler killed outright leaves
        c.execute(text("UPDATE reports SET created_at = :t"), {"t": datetime.now(UTC) - timedelta(hours=1)})
    seen = report_writer.stale_reports(engine, Report.job_id == job.job_id, (report_writer.PENDING,))
    assert [r.report_id for r in seen] == [written.report_id]
    monkeypatch.setattr(report_writer, "stale_reports", lambda *a, **k: seen)  # both read it before either sends
    first, second = sched_mod.recover_reports(engine, job), sched_mod.recover_reports(engine, job)
    assert len(first) == 1 and "(delivered)" in first[0] and second == []
    assert len(hook.bodies) == 1 and json.loads(hook.bodies[0][1])["report_id"] == written.report_id
    [row] = reports(engine)
    assert row.delivery_status == "delivered" and row.delivery_error is None


def test_a_delivery_under_way_is_left_to_its_scheduler_until_its_lease_is_stale(store):
    url, engine, out = store
    job = _job(url, out, webhook_url="http://127.0.0.1:9/hook")
    written = sched_mod._write(engine, job, report_writer_window(job))
    now = datetime.now(UTC)
    assert sched_mod.take_delivery(engine, written.report_id, now=now)
    assert not sched_mod.take_delivery(engine, written.report_id, now=now + timedelta(minutes=14))  # under way
    assert sched_mod.take_delivery(engine, written.report_id, now=now + timedelta(minutes=16))  # its process died
    [row] = reports(engine)
    assert row.delivery_status == "pending" and row.delivery_error.startswith(sched_mod.DELIVERY_LEASE)


def report_writer_window(job):
    from telemetry.report import period_window

    return period_window(job.period, now=D0 + timedelta(days=1, hours=6))


@pytest.mark.parametrize("start_s", [0.0, 0.3])
def test_a_scheduler_whose_job_another_removed_stops_and_says_so(store, monkeypatch, capsys, start_s):
    """A second `scheduler` started on the store without --keep-other-jobs removed the first one's job: the first
    went on running, the second's job in place of its own, and said nothing. A start slower than the first look
    (the new job is written to the store as the scheduler starts) is not taken for a removal."""
    url, engine, out = store
    monkeypatch.setattr("app.commands.scheduler.WATCH_S", 0.1)
    start = BlockingScheduler.start

    def slow_start(self, *args, **kwargs):
        time.sleep(start_s)
        return start(self, *args, **kwargs)

    monkeypatch.setattr(BlockingScheduler, "start", slow_start)

    def second_scheduler_starts():
        time.sleep(1.0)
        sched_mod.remove_other_jobs(engine, "report-weekly")

    threading.Thread(target=second_scheduler_starts, daemon=True).start()
    give_up = threading.Timer(DEADLINE_S, os.kill, (os.getpid(), signal.SIGINT))  # not noticed: Ctrl-C, exit 130
    give_up.start()
    try:
        assert main(["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out), "--job-id", "mine"]) == 1
    finally:
        give_up.cancel()
    err = capsys.readouterr().err
    assert "job mine is gone from the store's job table" in err and "--keep-other-jobs" in err


def test_listing_writes_nothing_and_reads_a_read_only_store(store, capsys):
    """--list made the job table it read (on a read-only store: "attempt to write a readonly database")."""
    url, engine, _ = store
    path = url.removeprefix("sqlite:///")
    assert main(["scheduler", "--db", f"sqlite:///file:{path}?mode=ro&uri=true", "--list"]) == 0
    assert capsys.readouterr().out.strip() == "scheduler: no jobs in the store"
    assert main(["scheduler", "--db", url, "--list"]) == 0
    with engine.connect() as c:
        assert not c.execute(text("SELECT name FROM sqlite_master WHERE name = :t"), {"t": JOBS_TABLE}).all()


def test_a_lease_is_stamped_when_it_is_taken_not_when_the_redelivery_began(store, monkeypatch):
    """Failed deliveries re-sent one after another (each up to its attempts x 10 s): every lease carried the time
    the loop began, so one taken after 15 minutes of others was stale at once and another scheduler sent the same
    report while this one did."""
    url, engine, out = store
    job = _job(url, out, webhook_url="http://127.0.0.1:9/hook")
    written = sched_mod._write(engine, job, report_writer_window(job))
    with engine.begin() as c:
        c.execute(text("UPDATE reports SET delivery_status = 'failed', delivery_error = 'HTTP 500'"))
    taken_meanwhile = []

    def deliver(engine_, job_, report_id, summary):
        taken_meanwhile.append(sched_mod.take_delivery(engine_, report_id))  # another scheduler, now
        return "delivered"

    monkeypatch.setattr(sched_mod, "_deliver", deliver)
    began = datetime.now(UTC) - timedelta(minutes=16)  # the loop began 16 minutes before this report's turn
    assert len(sched_mod.redeliver_failed(engine, job, now=began)) == 1
    assert taken_meanwhile == [False]
    assert written.report_id == reports(engine)[0].id


def test_a_monthly_job_runs_on_the_1st_and_reports_the_month_before(store, monkeypatch):
    """`--period monthly` is a schedule's period: cron "0 6 1 * *" runs on the 1st, and a run reports the
    calendar month before it, into a folder named by that month."""
    url, engine, out = store
    assert parse_cron("0 6 1 * *").get_next_fire_time(None, datetime(2026, 11, 15, 12, tzinfo=UTC)) == datetime(
        2026, 12, 1, 6, tzinfo=UTC)
    monkeypatch.setattr(sched_mod, "_clock", lambda: datetime(2026, 12, 1, 6, tzinfo=UTC))
    job = ReportJob(job_id="report-monthly", db_url=url, out_dir=str(out), period="monthly")
    report_id = sched_mod.run_report_job(**job.kwargs())
    [r] = reports(engine)
    assert r.id == report_id and r.summary["month"] == "November 2026" and r.summary["traffic"]
    assert r.summary["since"] == "2026-11-01T00:00:00+00:00" and r.summary["until"] == "2026-12-01T00:00:00+00:00"
    assert Path(r.csv_dir).name == f"report-{report_id}-monthly-2026-11"


def test_cli_schedules_a_monthly_job(store, no_blocking, capsys):
    url, engine, out = store
    assert main(["scheduler", "--db", url, "--cron", "0 6 1 * *", "--period", "monthly", "--out", str(out)]) == 0
    assert "job report-monthly added: cron '0 6 1 * *' (UTC), monthly reports" in capsys.readouterr().out
    [job] = sched_mod.persisted_jobs(engine)
    assert job.kwargs["period"] == "monthly" and job.next_run_time.day == 1 and job.next_run_time.hour == 6


def test_a_monthly_jobs_failed_delivery_is_retried_by_its_next_run(store, monkeypatch):
    """8 days covers a weekly job's next run, not a monthly one's (28 to 31 days on): its failed delivery was
    never retried by the job. A monthly report whose delivery failed is re-sent by the run a month on, and
    --list says until when; a daily one that old is not."""
    assert sched_mod.redeliver_failed_for_s("monthly") >= (31 + 1) * 86_400
    assert sched_mod.redeliver_failed_for_s("daily") == sched_mod.redeliver_failed_for_s("weekly") == 8 * 86_400
    url, engine, out = store
    monkeypatch.setattr(sched_mod, "_clock", lambda: datetime(2026, 12, 1, 6, tzinfo=UTC))
    job = ReportJob(job_id="report-monthly", db_url=url, out_dir=str(out), period="monthly",
                    webhook_url="http://127.0.0.1:9/hook")
    sched_mod.run_report_job(**{**job.kwargs(), "webhook_url": None})
    [r] = reports(engine)
    with engine.begin() as c:
        c.execute(text("UPDATE reports SET delivery_status = 'failed', delivery_error = 'HTTP 500'"))
    created = r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=UTC)
    sent = []
    monkeypatch.setattr(sched_mod, "_deliver", lambda engine_, job_, report_id, summary: sent.append(report_id)
                        or "delivered")
    month_on = created + timedelta(days=30)
    s, _ = _started(engine, job, parse_cron("0 6 1 * *"), paused=True)  # its job in the table, delivering
    s.shutdown()
    listed = "\n".join(sched_mod.failed_deliveries(engine, now=month_on))
    assert f"retried by the job's next run (until {created + timedelta(days=32):%Y-%m-%d %H:%M} UTC)" in listed
    with engine.begin() as c:  # the same report as a daily one: 30 days on, no longer retried
        c.execute(text("UPDATE reports SET period = 'daily'"))
    assert sched_mod.redeliver_failed(engine, job, now=month_on) == [] and sent == []
    with engine.begin() as c:
        c.execute(text("UPDATE reports SET period = 'monthly'"))
    assert len(sched_mod.redeliver_failed(engine, job, now=month_on)) == 1 and sent == [r.id]


def test_missed_monthly_runs_name_the_months_no_run_reports(store, capsys):
    from app.commands.scheduler import _say_next_run

    url, engine, out = store
    now = datetime(2026, 12, 6, 12, 30, tzinfo=UTC)
    job = ReportJob(job_id="report-monthly", db_url=url, out_dir=str(out), period="monthly", misfire_grace_s=3600)
    s, _ = _started(engine, job, parse_cron("0 6 1 * *"), paused=True)
    try:  # stopped since before Oct 1's run: Oct 1, Nov 1 and Dec 1 missed, the last days late: skipped
        s.modify_job("report-monthly", next_run_time=datetime(2026, 10, 1, 6, tzinfo=UTC))
        _say_next_run(s, now=now)
        line = capsys.readouterr().out
        assert "missed 3 runs (from Thu 2026-10-01 06:00 UTC) while stopped" in line, line
        assert "next runs Fri 2027-01-01 06:00 UTC; no run reports 3 months from September 2026: " \
               f"`specfinops report --db {url} --period monthly --since 2026-09-01T00:00 --out {out} " in line, line
        s.modify_job("report-monthly", next_run_time=datetime(2026, 11, 1, 6, tzinfo=UTC),
                     misfire_grace_time=7 * 86_400)
        _say_next_run(s, now=now)  # Nov 1 and Dec 1 missed, the last within the grace: November reported now
        line = capsys.readouterr().out
        assert "no run reports the month October 2026 (2026-10-01 00:00 to 2026-11-01 00:00 UTC)" in line, line
    finally:
        s.shutdown(wait=False)


def test_a_job_replaced_on_restart_still_runs_the_run_it_missed_while_stopped(store, capsys):
    """Restarted with an option changed (--out), the job was replaced with its next run time from now: the
    period of the run missed while stopped was never reported, and nothing said so. It is caught up as a kept
    job's is, with the new options."""
    from app.commands.scheduler import _say_next_run

    url, engine, out = store
    daily = parse_cron("0 6 * * *")
    missed_at = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)

    def stop_before_the_run(at: datetime) -> None:  # stopped before its run at `at`, restarted after it
        stored = sched_mod._persisted(engine, "report-daily")
        stored.next_run_time = at
        sched_mod._job_store(engine).update_job(stored)

    s, _ = _started(engine, _job(url, out, misfire_grace_s=86_400), daily, paused=True)
    s.shutdown(wait=False)
    stop_before_the_run(missed_at)
    s2 = make_scheduler(engine)
    how = schedule_report_job(s2, engine, _job(url, out / "b", misfire_grace_s=86_400), daily)
    s2.start(paused=True)
    try:
        assert how == "replaced"
        job = s2.get_job("report-daily")
        assert job.next_run_time == missed_at and job.kwargs["out_dir"] == str(out / "b")
        capsys.readouterr()
        _say_next_run(s2)
        assert "scheduler: job report-daily runs now, for" in capsys.readouterr().out
    finally:
        s2.shutdown(wait=False)
    # APScheduler 3.11's shutdown wakes the loop for one last pass (stopped, not paused) that stores the run time
    # after the due one: a restart would find one to come, replaced from now or kept alike. The missed run again:
    stop_before_the_run(missed_at)
    s3 = make_scheduler(engine)  # replaced again (--out c) and started: the missed run is made, into the new --out
    executed = threading.Event()
    s3.add_listener(lambda _e: executed.set(), EVENT_JOB_EXECUTED)
    assert schedule_report_job(s3, engine, _job(url, out / "c", misfire_grace_s=86_400), daily) == "replaced"
    s3.start()
    try:
        wait_for(executed.is_set, "the missed run")
        assert s3.get_job("report-daily").next_run_time > datetime.now(UTC)  # the missed run is consumed
    finally:
        s3.shutdown(wait=True)
    [row] = reports(engine)
    assert row.job_id == "report-daily" and Path(row.csv_dir).parent == out / "c"
    # a job not due is replaced from now, as before: its stored run time to come is the old schedule's
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(days=3)
    stop_before_the_run(later)
    s4 = make_scheduler(engine)
    assert schedule_report_job(s4, engine, _job(url, out, misfire_grace_s=86_400), daily) == "replaced"
    s4.start(paused=True)
    try:
        next_run = s4.get_job("report-daily").next_run_time
        assert datetime.now(UTC) < next_run < later, next_run  # the daily run to come, not the stored one
    finally:
        s4.shutdown(wait=False)


def test_a_job_replaced_with_another_cron_catches_up_by_the_new_schedule_only(store, capsys):
    """Replaced with another --cron after missing a run while stopped, the job kept the old schedule's missed time:
    a daily job made weekly ran at start, at the old hour, for a run the new schedule never had. The missed runs
    are the new schedule's from the stored time on; where its first is still to come, none is caught up."""
    from app.commands.scheduler import _say_next_run

    url, engine, out = store
    missed_at = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=2)

    def replaced_after_a_miss(cron: str):
        s = make_scheduler(engine)
        schedule_report_job(s, engine, _job(url, out, misfire_grace_s=86_400), parse_cron("0 6 * * *"))
        stored = sched_mod._persisted(engine, "report-daily")  # stopped before its run at `missed_at`
        stored.next_run_time = missed_at
        sched_mod._job_store(engine).update_job(stored)
        s2 = make_scheduler(engine)
        assert schedule_report_job(s2, engine, _job(url, out, misfire_grace_s=86_400), parse_cron(cron)) == "replaced"
        s2.start(paused=True)
        return s2

    # made weekly, on the day three days on: its first time after the miss is to come, nothing is caught up
    day = (datetime.now(UTC) + timedelta(days=3)).strftime("%a").lower()
    s = replaced_after_a_miss(f"30 7 * * {day}")
    try:
        when = s.get_job("report-daily").next_run_time
        assert when > datetime.now(UTC) and when.strftime("%a").lower() == day and (when.hour, when.minute) == (7, 30)
        capsys.readouterr()
        _say_next_run(s)
        assert "runs now" not in capsys.readouterr().out
    finally:
        s.shutdown(wait=False)
    # moved an hour later: the new schedule's time after the miss is past, caught up at its own time
    new_at = missed_at + timedelta(hours=1)
    s = replaced_after_a_miss(f"{new_at.minute} {new_at.hour} * * *")
    try:
        assert s.get_job("report-daily").next_run_time == new_at
        capsys.readouterr()
        _say_next_run(s)
        assert f"runs now, for 1 run missed while stopped (the last {new_at:%a %Y-%m-%d %H:%M} UTC)" in \
            capsys.readouterr().out
    finally:
        s.shutdown(wait=False)


def test_a_cron_moved_earlier_while_stopped_catches_up_the_time_it_moved_to():
    """Weekly `0 6 * * 1`, stopped Monday 04:00 to 07:00, started again with `0 5 * * 1`: the new schedule was
    searched from the missed 06:00 on only, found next Monday, and that week's report was never made (nothing
    said so). Searched from the last real run on (halfway to the missed one: not the last run's own moved time),
    Monday 05:00 is caught up; a move later catches up its time once past, and not before; the old schedule's
    time never."""
    from types import SimpleNamespace

    monday = datetime(2026, 12, 7, tzinfo=UTC)
    assert monday.strftime("%a") == "Mon"
    stored = SimpleNamespace(next_run_time=monday.replace(hour=6), trigger=parse_cron("0 6 * * 1"))
    at_7 = monday.replace(hour=7)

    def caught_up(cron: str, now: datetime = at_7):
        return sched_mod._catch_up(stored, parse_cron(cron), now).get("next_run_time")

    assert caught_up("0 5 * * 1") == monday.replace(hour=5)  # moved earlier: its time this Monday
    assert caught_up("30 6 * * 1") == monday.replace(hour=6, minute=30)  # moved later, its time past
    # moved later, its time still to come: from now (last Monday's 08:00 is the run made at 06:00 then)
    assert caught_up("0 8 * * 1") is None
    assert caught_up("0 6 * * 6") == monday - timedelta(days=2, hours=-6)  # Saturday, nearer the missed Monday
    assert caught_up("0 6 * * 3") is None  # Wednesday: last week's is the last run's, next week's to come
    # the old schedule's missed time is not caught up by a new one: a weekday moved on is from now
    assert caught_up("0 6 * * 2") is None
    assert sched_mod._previous_fire(parse_cron("0 6 * * 1"), monday.replace(hour=6)) == monday.replace(hour=6) - \
        timedelta(days=7)
    assert sched_mod._previous_fire(parse_cron("0 0 1 1 *"), monday) == datetime(2026, 1, 1, tzinfo=UTC)


def test_a_first_failed_delivery_is_said_as_failed_and_only_a_repeat_as_failed_again(store, failing_hook, caplog):
    """The run's first failed delivery was logged 'delivery failed again; earlier failed deliveries are retried'."""
    import logging

    url, engine, out = store  # each run reports the next day (StepClock)
    job = _job(url, out, webhook_url=failing_hook.url, delivery_attempts=1)
    with caplog.at_level(logging.INFO, logger="telemetry.scheduler"):
        first = sched_mod.run_report_job(**job.kwargs())
        said = [r.getMessage() for r in caplog.records if "failed" in r.getMessage() and "report job" in r.getMessage()]
        assert said == [f"report job report-daily: delivery of report #{first} failed; the job's next run delivers it "
                        "again"], said
        caplog.clear()
        second = sched_mod.run_report_job(**job.kwargs())
    said = [r.getMessage() for r in caplog.records if "failed" in r.getMessage() and "report job" in r.getMessage()]
    assert said == [f"report job report-daily: delivery of report #{second} failed, as 1 earlier one did; the job's "
                    "next run delivers them again"], said
    assert [r.delivery_status for r in reports(engine)] == ["failed", "failed"]


def test_cli_on_a_read_only_store_holding_the_job_says_not_writable_and_leaves_no_folder(
        db_url, read_only_url, tmp_path, no_blocking, capsys):
    """A read-only store that holds the job already (replaced, as its options changed): APScheduler writes a job
    added before it starts only at its start, after `removing_made_folders` and the "job J1 replaced" line, so the
    command said it replaced the job, then failed on the write, and left its --out folder, empty. Refused as
    `report` refuses such a store, before --out is made."""
    engine = open_store(db_url)
    add_day(engine, D0)
    engine.dispose()
    base = ["scheduler", "--cron", "0 6 * * *", "--job-id", "J1"]
    assert main([*base, "--db", db_url, "--out", str(tmp_path / "first")]) == 0
    capsys.readouterr()
    out = tmp_path / "s2" / "x"
    assert main([*base, "--db", read_only_url(db_url), "--out", str(out), "--sla-ms", "40"]) == 2
    said = capsys.readouterr()
    assert "replaced" not in said.out and "replaced" not in said.err, said
    assert "scheduler: error: --db " in said.err and ": not writable: " in said.err, said.err
    assert "give a store it may write" in said.err and len(said.err.strip().splitlines()) == 1, said.err
    assert not (tmp_path / "s2").exists()


def test_cli_whose_job_write_the_store_refuses_says_so_before_saying_it_scheduled_it(pg_url, pg_reader, tmp_path,
                                                                                     no_blocking, capsys):
    """A role that may record reports but not change the job table: the job's write fails inside the block that
    removes the --out folder made for it, before the command says the job is scheduled (it said "job J1
    replaced", then failed at the scheduler's start, and left the folder)."""
    from sqlalchemy import create_engine

    engine = open_store(pg_url)
    add_day(engine, D0)
    engine.dispose()
    base = ["scheduler", "--cron", "0 6 * * *", "--job-id", "J1"]
    assert main([*base, "--db", pg_url, "--out", str(tmp_path / "first")]) == 0
    role, reader_url = pg_reader()
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'GRANT INSERT, UPDATE ON reports TO "{role}"'))
    admin.dispose()
    capsys.readouterr()
    out = tmp_path / "s2" / "x"
    assert main([*base, "--db", reader_url, "--out", str(out), "--sla-ms", "40"]) == 2
    said = capsys.readouterr()
    assert "replaced" not in said.out and "replaced" not in said.err, said
    assert "not writable: " in said.err and JOBS_TABLE in said.err and "Traceback" not in said.err, said.err
    assert not (tmp_path / "s2").exists()


@pytest.mark.parametrize("changed", ["an attribute gone", "a job not written", "a replacement not written"])
def test_apscheduler_internals_that_changed_are_a_clear_error_naming_its_version(store, changed, monkeypatch):
    """`_store_pending_jobs` writes the queued job with APScheduler's private steps (its start's): where those
    changed, the job is not silently left unwritten (scheduled, said so, then written or refused only at the
    start), nor is it an AttributeError traceback: a RuntimeError naming the APScheduler version."""
    import apscheduler

    url, engine, out = store
    if changed == "a replacement not written":  # the job is stored already, with other options
        assert schedule_report_job(make_scheduler(engine), engine, _job(url, out, sla_ms=40.0), EVERY_SECOND) \
            == "added"
    s = make_scheduler(engine)
    if changed == "an attribute gone":
        monkeypatch.delattr(BaseScheduler, "_real_add_job")
    else:
        monkeypatch.setattr(type(s), "_real_add_job", lambda self, job, alias, replace_existing: None)
    with pytest.raises(RuntimeError, match=f"APScheduler {apscheduler.__version__}") as exc:
        schedule_report_job(s, engine, _job(url, out), EVERY_SECOND)
    assert not isinstance(exc.value, AttributeError)
    assert "report-daily" in str(exc.value)


@pytest.mark.parametrize("other", ["replaced it", "removed it"])
def test_a_job_another_process_changes_while_this_one_schedules_it_is_not_blamed_on_apscheduler(store, other,
                                                                                                 monkeypatch):
    """Another scheduler process on the same store replacing the job (its own options) or removing it (its
    remove_other_jobs) between this one's write and its check: APScheduler's steps did write it, so the error says
    another process changed it, not that APScheduler's internals changed (a false blame, and advice to install the
    version already installed)."""
    url, engine, out = store
    real_add = sched_mod.LockWaitingJobStore.add_job
    busy = []

    def add_then_another_process(self, job):
        real_add(self, job)
        if busy:
            return
        busy.append(job.id)
        if other == "replaced it":  # another `specfinops scheduler` scheduling the same id, with other options
            schedule_report_job(make_scheduler(engine), engine, _job(url, out, sla_ms=40.0), EVERY_SECOND)
        else:
            SQLAlchemyJobStore.remove_job(self, job.id)

    monkeypatch.setattr(sched_mod.LockWaitingJobStore, "add_job", add_then_another_process)
    with pytest.raises(RuntimeError) as exc:
        schedule_report_job(make_scheduler(engine), engine, _job(url, out), EVERY_SECOND)
    said = str(exc.value)
    assert "APScheduler" not in said and "install" not in said, said
    verb = "changed" if other == "replaced it" else "removed"
    assert f"the job report-daily was {verb} by another process while this one scheduled it" in said, said


def test_a_failed_delivery_is_said_retried_only_where_its_job_is_there_and_delivers(store, no_blocking, capsys):
    """`--list` said "retried by the job's next run" of a report whose job was gone, or restarted without a
    delivery: nothing retried it. It says why not and the command that sends it again, which does."""
    url, engine, out = store
    job = _job(url, out)
    sched_mod.run_report_job(**job.kwargs())
    [r] = reports(engine)
    with engine.begin() as c:
        c.execute(text("UPDATE reports SET delivery_status = 'failed', delivery_error = 'HTTP 500'"))
    [line] = sched_mod.failed_deliveries(engine)  # no job in the table
    assert "retried by" not in line and "not retried: its job is gone from the job table" in line
    assert "start `specfinops scheduler --job-id report-daily --period daily` with --webhook" in line
    base = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out)]
    assert main(base) == 0  # the job back, delivering nothing
    capsys.readouterr()
    assert main(["scheduler", "--db", url, "--list"]) == 0
    listed = capsys.readouterr().out
    assert "not retried: its job delivers nothing now (no --webhook, --webhook-env or --smtp)" in listed
    assert "retried by" not in listed
    hook = Hook(200)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    try:
        assert main([*base, "--webhook", hook.url]) == 0  # what the line says: its start sends it
    finally:
        hook.shutdown()
        hook.server_close()
    assert f"report #{r.id} (" in capsys.readouterr().out
    assert [x.delivery_status for x in reports(engine)] == ["delivered"]

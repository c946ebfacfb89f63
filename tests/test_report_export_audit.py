"""Audit of `specfinops report`, `scheduler`, `export` and `db` as a FinOps engineer uses them: the defects found."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy.orm import Session
from synthetic import Req, make_run

from telemetry.store import open_store

ROOT = Path(__file__).resolve().parents[1]

# an export whose rows stop coming after the first: the process is stopped part-way through its file
SLOW_EXPORT = """
import sys, time
import telemetry.export
real = telemetry.export.export_rows
def slow(engine, what, window):
    header, rows = real(engine, what, window)
    def some_then_wait():
        yield next(iter(rows))
        print("writing", flush=True)
        time.sleep(120)
        yield from rows
    return header, some_then_wait()
telemetry.export.export_rows = slow
from app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _fill(url: str) -> None:
    engine = open_store(url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(output_tokens=5, ttft_ms=10, e2e_ms=50, start_s=i) for i in range(3)])
        s.commit()
    engine.dispose()


def test_sigterm_during_an_export_leaves_no_partial_file(sqlite_url, tmp_path):
    """`timeout`/`docker stop`/`kill` send SIGTERM: the export stops as on Ctrl-C (exit 130, 'interrupted'),
    the earlier file untouched and no hidden temporary file left beside it (it was left, half-written)."""
    _fill(sqlite_url)
    out = tmp_path / "out"
    out.mkdir()
    target = out / "requests.csv"
    target.write_text("the previous export\n")
    proc = subprocess.Popen([sys.executable, "-c", SLOW_EXPORT, "export", "--db", sqlite_url, "--what", "requests",
                             "--out", str(target)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "writing", proc.communicate()
        assert any(p.name.endswith(".tmp") for p in out.iterdir())  # what the cleanup has to remove
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert sorted(p.name for p in out.iterdir()) == ["requests.csv"]
    assert target.read_text() == "the previous export\n"


def _persisted_kwargs(url: str, cwd: Path, monkeypatch, *args: str) -> dict:
    """Run `specfinops scheduler` from `cwd` (started paused and stopped at once); the job's stored kwargs."""
    from apscheduler.schedulers.base import BaseScheduler
    from apscheduler.schedulers.blocking import BlockingScheduler

    from app.cli import main
    from telemetry.scheduler import persisted_jobs

    monkeypatch.setattr(BlockingScheduler, "start", lambda self, *a, **kw: (BaseScheduler.start(self, paused=True),
                                                                           BaseScheduler.shutdown(self, wait=False)))
    monkeypatch.chdir(cwd)
    assert main(["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", "reports", *args]) == 0
    engine = open_store(str(cwd / url) if "://" not in url else url)
    try:
        return {job.id: job.kwargs for job in persisted_jobs(engine)}
    finally:
        engine.dispose()


def test_a_scheduled_job_stores_its_sqlite_store_as_an_absolute_path(tmp_path, monkeypatch, capsys):
    """`--db store.db` (relative) was stored as is: a scheduler started later from another folder (with
    --keep-other-jobs) ran that job against a NEW empty store it created there, and wrote "no traffic" reports
    into it every period; the same store named by its absolute path 'replaced' the job (its next run reset)."""
    home = tmp_path / "home"
    home.mkdir()
    _fill(f"sqlite:///{home / 'store.db'}")
    for url in ("store.db", "sqlite:///store.db"):
        stored = _persisted_kwargs(url, home, monkeypatch)["report-daily"]
        assert stored["db_url"] == f"sqlite:///{home / 'store.db'}"
    capsys.readouterr()
    _persisted_kwargs(str(home / "store.db"), home, monkeypatch)
    assert "job report-daily kept" in capsys.readouterr().out  # one store, one job: not 'replaced'


def test_a_scheduled_run_never_creates_a_store(tmp_path, caplog):
    """A job whose store is gone (or a relative path stored by an earlier version, resolved from another
    folder) fails with one ERROR line naming the store, instead of creating an empty store and reporting on it."""
    from telemetry.scheduler import run_report_job

    missing = tmp_path / "elsewhere" / "store.db"
    assert run_report_job(db_url=f"sqlite:///{missing}", out_dir=str(tmp_path / "r"), period="daily",
                          job_id="report-daily") is None  # fmt: skip
    assert not missing.exists() and not missing.parent.exists()
    assert any("no store at" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)


def test_absolute_db_url_keeps_queries_servers_and_memory(tmp_path, monkeypatch):
    from telemetry.scheduler import absolute_db_url

    monkeypatch.chdir(tmp_path)
    assert absolute_db_url("sqlite:///sub/x.db?timeout=5") == f"sqlite:///{tmp_path}/sub/x.db?timeout=5"
    assert absolute_db_url("sqlite:///file:x.db?mode=ro&uri=true") == f"sqlite:///file:{tmp_path}/x.db?mode=ro&uri=true"
    assert absolute_db_url("sqlite+pysqlite:///y.db") == f"sqlite+pysqlite:///{tmp_path}/y.db"
    for same in ("sqlite:////abs/x.db", "postgresql+psycopg://u:p@h/db", "sqlite://", "sqlite:///:memory:",
                 "sqlite:///file:m?mode=memory&uri=true"):  # fmt: skip
        assert absolute_db_url(same) == same


def test_db_downgrade_base_drops_the_scheduler_jobs_too(empty_store, tmp_path, capsys):
    """'base' drops everything: the scheduler's job table stayed, so `scheduler --list` then called the store
    "not specfinops's" (its table apscheduler_jobs), and after `db upgrade` the dropped store's jobs came back
    and ran (with their old output folders and webhooks)."""
    from sqlalchemy import inspect

    from app.cli import main
    from telemetry.scheduler import JOBS_TABLE, ReportJob, make_scheduler, parse_cron, schedule_report_job

    engine = open_store(empty_store)
    scheduler = make_scheduler(engine)
    schedule_report_job(scheduler, engine, ReportJob(job_id="old", db_url=empty_store, out_dir=str(tmp_path)),
                        parse_cron("0 6 * * *"))  # fmt: skip
    scheduler.start(paused=True)
    scheduler.shutdown(wait=False)
    engine.dispose()
    assert main(["db", "downgrade", "base", "--db", empty_store]) == 2  # a job is recorded data: --yes drops it
    assert "going to base drops 1 scheduler job: pass --yes to go ahead" in capsys.readouterr().err
    assert main(["db", "downgrade", "base", "--db", empty_store, "--yes"]) == 0
    assert "dropped the scheduler's job table (1 job)" in capsys.readouterr().out
    engine = open_store(empty_store)  # upgraded again, as `db upgrade` does
    try:
        assert JOBS_TABLE not in inspect(engine).get_table_names()
    finally:
        engine.dispose()
    capsys.readouterr()
    assert main(["scheduler", "--db", empty_store, "--list"]) == 0
    assert "no jobs in the store" in capsys.readouterr().out

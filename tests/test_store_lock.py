"""A SQLite store another process holds write-locked for longer than SQLite's busy timeout: a command's single
writes (a run's start, `prices set`) wait for it, saying so, and give up after a bound with an error that names
the file and the lock, writing nothing."""

from __future__ import annotations

import logging
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from recorder_child import run_info, synthetic_request
from sqlalchemy import text

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
    holder = _hold_lock(path, 60)
    try:
        rc = main(["prices", "set", "my-node", "12", "--kind", "node", "--source", "test", "--db", empty_store])
    finally:
        holder.kill()
        holder.wait(30)
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
    holder = _hold_lock(tmp_path / "store.db", 60)
    try:
        rec.record_request(run_id, synthetic_request(random.Random(0), 3))
        store = re.escape(str(tmp_path / "store.db"))
        with pytest.raises(RecorderError, match=rf"the store {store} is locked, another process holds a write lock"):
            rec.end_run(run_id, timeout_s=0.5)
    finally:
        holder.kill()
        holder.wait(30)
    rec.close()  # the records were kept and are written once the lock is gone
    assert _count(empty_store, f"SELECT count(*) FROM runs WHERE id = {run_id} AND status = 'completed'") == 1
    engine.dispose()

"""Schema changes are all or nothing, and two processes creating or upgrading one store do not collide.

SQLite: Python's sqlite3 driver opens no transaction before DDL, so each CREATE/ALTER of a migration used to
commit on its own; a failure or a kill in the middle left a store stamped at the old revision with part of
the new schema (`duplicate column name: temperature` ever after). PostgreSQL: `db upgrade` took no lock.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from racing import race
from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import Engine

from app.cli import main as cli_main
from telemetry.db import Base
from telemetry.store import StoreError, alembic_config, head_revision, open_store

REPO = Path(__file__).resolve().parents[1]
RUN = ("INSERT INTO runs (id, kind, mode, node_id, hostname, device, backend, dtype, target, k_policy, temperature, "
       "top_p, concurrency, workload, power_source, software_version, started_at, status, dropped_records) VALUES "
       "({i}, 'bench', 'spec', 'n', 'h', 'cpu', 'torch', 'bfloat16', 't', 'fixed:4', 0, 1, 1, 'code', 'none', 'v', "
       "'2026-12-02 00:00:00', 'completed', 0)")
REQUEST = ("INSERT INTO requests (id, run_id, domain, started_at, prompt_tokens, output_tokens, num_drafts, "
           "num_draft_tokens, num_accepted_tokens, status) VALUES ({i}, {i}, 'code', '2026-12-02 00:00:00', 5, 9, 2, "
           "8, 6, 'ok')")
# 0004 rebuilds `runs` in batch mode: CREATE _alembic_tmp_runs, copy, DROP runs, then this rename. Failing here
# is failing at the worst moment: requests already has its new columns and runs is gone.
RENAME = "ALTER TABLE _alembic_tmp_runs RENAME TO runs"


def _store_at_0003(url: str, runs: int = 3) -> None:
    command.upgrade(alembic_config(url), "0003")
    engine = create_engine(url)
    with engine.begin() as conn:
        for i in range(1, runs + 1):
            conn.execute(text(RUN.format(i=i)))
            conn.execute(text(REQUEST.format(i=i)))
    engine.dispose()


def _state(url: str) -> dict:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            insp = inspect(conn)
            return {
                "revision": conn.execute(text("SELECT version_num FROM alembic_version")).scalar(),
                "tables": set(insp.get_table_names()),
                "request_columns": {c["name"] for c in insp.get_columns("requests")},
                "counts": [conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar() for t in ("runs", "requests")],
            }
    finally:
        engine.dispose()


def _assert_still_at_0003(url: str) -> None:
    state = _state(url)
    assert state["revision"] == "0003"
    assert not {t for t in state["tables"] if t.startswith("_alembic_tmp")}, state["tables"]
    assert state["tables"] == set(Base.metadata.tables) - {"serve_keys"} | {"alembic_version"}
    assert not {"temperature", "top_p"} & state["request_columns"]  # 0004's columns rolled back too
    assert state["counts"] == [3, 3]


def test_an_upgrade_that_fails_midway_leaves_the_store_at_its_old_revision(sqlite_url, monkeypatch):
    _store_at_0003(sqlite_url)

    def fail_at_rename(conn, cursor, statement, *_):
        if statement.strip().startswith(RENAME):
            raise RuntimeError("injected failure in the middle of revision 0004")

    event.listen(Engine, "before_cursor_execute", fail_at_rename)
    try:
        with pytest.raises(RuntimeError, match="injected failure"):
            open_store(sqlite_url)
    finally:
        event.remove(Engine, "before_cursor_execute", fail_at_rename)
    _assert_still_at_0003(sqlite_url)
    store = open_store(sqlite_url)  # and the next open upgrades it
    with store.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1  # the pooled connection has them back
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    store.dispose()
    state = _state(sqlite_url)
    assert state["revision"] == head_revision() and state["counts"] == [3, 3]
    assert {"temperature", "top_p"} <= state["request_columns"]


KILLED_UPGRADE = """
import os, signal, sys
from sqlalchemy import event
from sqlalchemy.engine import Engine

def kill_at_rename(conn, cursor, statement, *_):
    if statement.strip().startswith({rename!r}):
        os.kill(os.getpid(), signal.SIGKILL)  # as `kill -9` would, mid-migration: no Python cleanup runs

event.listen(Engine, "before_cursor_execute", kill_at_rename)
from app.cli import main
sys.exit(main(["db", "upgrade", "--db", sys.argv[1]]))
"""


def test_a_db_upgrade_killed_midway_leaves_the_store_at_its_old_revision(sqlite_url, capsys):
    _store_at_0003(sqlite_url)
    child = [sys.executable, "-c", KILLED_UPGRADE.format(rename=RENAME), sqlite_url]
    proc = subprocess.run(child, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    _assert_still_at_0003(sqlite_url)
    assert cli_main(["db", "upgrade", "--db", sqlite_url]) == 0
    assert "(at head)" in capsys.readouterr().out
    assert _state(sqlite_url)["counts"] == [3, 3]


# ---- two processes at once -----------------------------------------------------------------------------

def test_two_processes_creating_one_new_sqlite_store_both_succeed(tmp_path):
    """`prices set` twice at once on a new file: one of them used to fail (3 of 5 tries) with 'table
    alembic_version already exists' or 'table prices already exists'. Four new stores, two openers each."""
    commands = []
    for n in range(4):
        db = str(tmp_path / f"race{n}.db")
        commands += [["prices", "set", "H100", "3", "--source", "x", "--db", db],
                     ["prices", "set", "A100-80GB", "2", "--source", "y", "--db", db]]
    results = race(tmp_path, commands)
    for r in results:
        assert r.returncode == 0, f"{r.args}: {r.stderr}"
    for n in range(4):
        url = f"sqlite:///{tmp_path / f'race{n}.db'}"
        engine = create_engine(url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == head_revision()
            got = dict(conn.execute(text("SELECT name, value FROM prices WHERE name IN ('H100', 'A100-80GB')")).all())
        engine.dispose()
        assert got == {"H100": 3.0, "A100-80GB": 2.0}


def test_a_store_made_without_alembic_that_differs_names_the_tables_in_a_short_line(sqlite_url):
    """It used to put a whole `Table('sweeps', MetaData(), Column(...` repr (over 1,000 characters) in the line."""
    engine = create_engine(sqlite_url)
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE sweeps"))
        conn.execute(text("DROP TABLE serve_keys"))
        conn.execute(text("CREATE INDEX ix_extra ON runs (hostname)"))
    engine.dispose()
    with pytest.raises(StoreError) as exc:
        open_store(sqlite_url)
    said = str(exc.value)
    assert "missing tables: serve_keys, sweeps" in said and "tables that differ: runs" in said
    assert "Table(" not in said and "Column(" not in said and len(said) < 400, said


@pytest.mark.parametrize("start", ["empty", "0003"])
def test_two_db_upgrades_at_once_on_postgresql_both_succeed(pg_url, tmp_path, start):
    """`db upgrade` took no lock (open_store did): two at once failed 3 of 4 tries on an empty database
    ('duplicate key value violates unique constraint "pg_type_typname_nsp_index"') and 2 of 3 from 0003 with
    data ('column "temperature" of relation "requests" already exists'). Now the second waits for the
    first's advisory lock, then finds the store at head. Three rounds."""
    cfg = alembic_config(pg_url)
    url = pg_url.replace("postgres@", "postgres:s3cr3t@")  # trust auth: the password is not checked
    for n in range(3):
        if n:
            command.downgrade(cfg, "base")
        if start == "0003":
            _store_at_0003(pg_url)
        results = race(tmp_path / str(n), [["db", "upgrade", "--db", url]] * 2)
        for r in results:
            assert r.returncode == 0, f"round {n}: {r.stderr}"
            assert "(at head)" in r.stdout and "s3cr3t" not in r.stdout + r.stderr
        state = _state(pg_url)
        assert state["revision"] == head_revision() and state["tables"] == set(Base.metadata.tables) | {
            "alembic_version"}
        assert state["counts"] == ([3, 3] if start == "0003" else [0, 0])

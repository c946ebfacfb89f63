"""remove_unused_store (a bench or calibrate stopped before its first run removes the store file it made) checked
the file held no row, then deleted it apart: a run another process recorded between the two was deleted with
the file, and so was the store of a bench that had opened it and recorded its run just after. The check and the
removal now happen under one exclusive lock on the file: an open store is another's, and stays; a run that starts
meanwhile is either seen (the store stays) or refused by SQLite (never written into a deleted file)."""

from __future__ import annotations

import sqlite3

import telemetry.db as tdb
from telemetry.db import new_store_paths, remove_unused_store, resolve_db_url, sqlite_file
from telemetry.store import open_store

RUN = ("INSERT INTO runs (kind, mode, node_id, hostname, device, backend, dtype, target, k_policy, concurrency, "
       "workload, power_source, software_version, started_at, status, dropped_records) VALUES ('bench', 'ar', 'n', "
       "'h', 'cpu', 'torch', 'float32', 't', 'none', 1, 'w', 'none', 'v', '2026-12-07 00:00:00', 'running', 0)")


def _new_store(tmp_path):
    db = f"sqlite:///{tmp_path / 'new' / 'store.db'}"
    made = new_store_paths(sqlite_file(resolve_db_url(db)))
    open_store(db).dispose()  # what bench's store_opened_for does: made, given its schema, closed
    return made


def _runs_at(path) -> int:
    if not path.is_file():
        return 0
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]


def test_a_run_started_between_the_check_and_the_removal_is_never_deleted(tmp_path, monkeypatch):
    """Another bench starts its run in the new store after the check found it empty, before the file goes."""
    made = _new_store(tmp_path)
    path = made[-1]
    remove = tdb._remove
    wrote = []

    def another_bench_starts_a_run_first(created):
        try:
            with sqlite3.connect(path, timeout=0.2) as conn:
                conn.execute(RUN)
            wrote.append(True)
        except sqlite3.OperationalError:  # held locked: its bench says the store is locked, nothing is lost
            wrote.append(False)
        remove(created)

    monkeypatch.setattr(tdb, "_remove", another_bench_starts_a_run_first)
    remove_unused_store(made)
    assert wrote  # the removal was reached: the store held nothing at the check
    assert not wrote[0] or _runs_at(path) == 1  # a run that was written is in the store, never deleted with it


def test_a_store_another_bench_has_open_stays_for_the_run_it_records(tmp_path, monkeypatch):
    """Another bench opened the new store (before the check) and records its run a moment later: the store it
    holds open is not removed from under it."""
    made = _new_store(tmp_path)
    path = made[-1]
    other = open_store(f"sqlite:///{path}", must_exist=True)
    remove = tdb._remove
    recorded = []

    def record():
        with other.begin() as conn:
            conn.exec_driver_sql(RUN)
        recorded.append(True)

    def its_run_lands_before_the_removal(created):
        record()
        remove(created)

    monkeypatch.setattr(tdb, "_remove", its_run_lands_before_the_removal)
    try:
        with other.connect() as conn:  # the store is open: as bench's own open_store leaves it, pooled
            conn.exec_driver_sql("SELECT COUNT(*) FROM runs")
        remove_unused_store(made)
        if not recorded:  # kept without a removal to reach: the other bench records its run as it would
            record()
        assert _runs_at(path) == 1
    finally:
        other.dispose()


def test_an_unused_store_nothing_has_open_is_still_removed(tmp_path):
    made = _new_store(tmp_path)
    remove_unused_store(made)
    assert not (tmp_path / "new").exists()

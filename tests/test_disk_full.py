"""A full disk is named as such, with the file it holds: SQLite says only 'database or disk is full' or 'disk I/O
error', and a write into a report's folder 'No space left on device' (as if a bug: "run with --verbose for the
traceback"). A store the command was creating is not left behind as a 0-byte file. The failures are faked where
they happen (a real full device needs a mount)."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from app.cli import describe_failure, main


def _sqlite_error(text: str) -> OperationalError:
    return OperationalError("INSERT INTO runs ...", {}, sqlite3.OperationalError(text))


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--verbose" not in err, err
    return err.strip().splitlines()[-1]


def test_a_store_that_fills_its_disk_while_created_is_named_and_removed(tmp_path, monkeypatch, capsys):
    import telemetry.store

    def full(engine):
        with engine.connect():  # the file exists by now, as after SQLite opened it
            pass
        raise _sqlite_error("database or disk is full")

    monkeypatch.setattr(telemetry.store, "upgrade_to_head", full)
    path = tmp_path / "new" / "store.db"
    assert main(["prices", "set", "H100", "2.5", "--source", "quote", "--db", str(path)]) == 2
    assert _error_line(capsys) == (f"specfinops prices: error: no space left on the device holding the store {path}: "
                                   "free some space there, or use another device")
    assert not path.exists() and not path.parent.exists()  # neither the 0-byte file nor the folder made for it


def test_a_store_there_before_is_kept_when_its_disk_is_full(tmp_path, monkeypatch, capsys):
    import telemetry.store

    path = tmp_path / "old.db"
    sqlite3.connect(path).close()  # an empty file the user made: not this command's to remove
    monkeypatch.setattr(telemetry.store, "upgrade_to_head", lambda engine: (_ for _ in ()).throw(
        _sqlite_error("database or disk is full")))
    assert main(["prices", "set", "H100", "2.5", "--source", "quote", "--db", str(path)]) == 2
    assert "no space left on the device holding the store" in _error_line(capsys)
    assert path.is_file()


@pytest.fixture
def store(one_run_store) -> str:
    return one_run_store


@pytest.mark.parametrize("text, free_blocks, full", [
    ("database or disk is full", 10, True),
    ("disk I/O error", 0, True),  # the -shm file could not grow: said so where the store's device has no space
    ("disk I/O error", 10, False),  # another I/O error: SQLite's words, as before
])  # fmt: skip
def test_a_store_error_of_a_full_disk_names_the_store(text, free_blocks, full, store, monkeypatch, capsys):
    import telemetry.costing

    class Stat:
        f_bavail = free_blocks

    def fail(*args, **kwargs):
        raise _sqlite_error(text)

    # fails after the store opened, as a write mid-run does (cost prices through costs_and_unpriced)
    monkeypatch.setattr(telemetry.costing, "costs_and_unpriced", fail)
    monkeypatch.setattr(os, "statvfs", lambda path: Stat())
    assert main(["cost", "--db", store]) == 2
    path = Path(store.removeprefix("sqlite:///"))
    line = _error_line(capsys)
    assert line == (f"specfinops cost: error: no space left on the device holding the store {path}: free some space "
                    "there, or use another device" if full else f"specfinops cost: error: cannot use the database: "
                    f"{text}")


def test_no_space_left_without_a_file_name_is_no_bug():
    assert describe_failure(OSError(errno.ENOSPC, "No space left on device", "/data/x.csv")) == (
        "no space left on the device holding /data/x.csv: free some space there")
    said = describe_failure(OSError(errno.ENOSPC, "No space left on device"))
    assert said == "no space left on device: a disk this command writes to is full"


def test_a_report_whose_folder_fills_names_it_and_leaves_nothing(store, tmp_path, monkeypatch, capsys):
    import telemetry.report_writer

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")  # a write, naming no file

    monkeypatch.setattr(telemetry.report_writer, "render_html", full)
    out = tmp_path / "reports"
    assert main(["report", "--db", store, "--out", str(out), "--period", "custom", "--since", "2000-01-01",
                 "--until", "2100-01-01"]) == 2
    assert _error_line(capsys) == (f"specfinops report: error: no space left on the device holding the --out folder "
                                   f"{out.resolve()}: free some space there, or use another device")
    assert not out.exists()  # the folder made for it removed again


def test_an_out_folder_on_a_full_disk_is_named_before_the_report(store, tmp_path, monkeypatch, capsys):
    import telemetry.report_writer

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")  # the write test: a file SQLite never named

    monkeypatch.setattr(telemetry.report_writer.tempfile, "NamedTemporaryFile", full)
    out = tmp_path / "reports"
    assert main(["report", "--db", store, "--out", str(out), "--period", "daily"]) == 2
    assert f"no space left on the device holding the --out folder {out}" in _error_line(capsys)


def test_folders_a_failed_mkdir_never_made_do_not_keep_those_above(tmp_path):
    """mkdir -p that ran out of space part-way: the outer folder it made is removed all the same."""
    from telemetry.db import new_store_paths, remove_new_store

    path = tmp_path / "a" / "b" / "store.db"
    created = new_store_paths(path)
    assert created == [tmp_path / "a", tmp_path / "a" / "b", path]
    (tmp_path / "a").mkdir()  # 'b' failed: no space
    remove_new_store(created)
    assert not (tmp_path / "a").exists()


def test_a_store_whose_path_holds_uri_characters_is_kept_when_it_holds_tables(tmp_path):
    """remove_new_store keeps a file that holds tables by now (another process's store): it read the file through
    a SQLite URI built by hand, which a '?' or '#' in a folder's name broke, so such a store counted as empty."""
    import sqlite3

    from telemetry.db import remove_new_store

    folder = tmp_path / "odd?name#1"
    folder.mkdir()
    store = folder / "store.db"
    with sqlite3.connect(store) as conn:
        conn.execute("CREATE TABLE runs (id INTEGER)")
    remove_new_store([folder, store])
    assert store.exists() and folder.exists()


def test_a_new_store_another_process_wrote_into_is_kept_though_it_holds_no_run(tmp_path):
    """bench stopped before its first run removed the store it made where it held no run, though another process
    had written there meanwhile (here a `prices set --db` price): the file and the price were gone."""
    from telemetry.db import new_store_paths, remove_unused_store, resolve_db_url, sqlite_file
    from telemetry.prices import get_price, set_price
    from telemetry.store import open_store

    db = f"sqlite:///{tmp_path / 'new' / 'store.db'}"
    made = new_store_paths(sqlite_file(resolve_db_url(db)))
    open_store(db).dispose()
    engine = open_store(db, must_exist=True)
    try:
        set_price(engine, "H100", 9.9, source="quote", kind="gpu")
    finally:
        engine.dispose()
    remove_unused_store(made)
    engine = open_store(db, must_exist=True)
    try:
        assert get_price(engine, "H100").value == 9.9
    finally:
        engine.dispose()


def test_a_new_store_that_holds_only_its_schema_is_removed_with_its_folder(tmp_path):
    """What a new store holds (no migration inserts a row) does not count as another process's rows."""
    from telemetry.db import new_store_paths, remove_unused_store, resolve_db_url, sqlite_file
    from telemetry.store import open_store

    db = f"sqlite:///{tmp_path / 'new' / 'store.db'}"
    made = new_store_paths(sqlite_file(resolve_db_url(db)))
    open_store(db).dispose()
    remove_unused_store(made)
    assert not (tmp_path / "new").exists()

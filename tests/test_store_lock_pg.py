"""A PostgreSQL store another session holds locked (a row `SELECT ... FOR UPDATE` left open, a table LOCK'd, the
migration lock of an upgrade): a command waits a bounded time, saying so where it retries, then fails with an error
that names the store and the lock, writing nothing (it waited forever, silently). Two real connections."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, text

from app.cli import main
from telemetry import db
from telemetry.store import open_store

FALLBACK_S = 15  # a holder lets go after this long whatever happens, so that a command that waits forever ends


@contextmanager
def _held(pg_url: str, *sql: str, until: str | None = None) -> Iterator[threading.Event]:
    """Another session runs `sql` in a transaction it keeps open (its locks held) until a line of telemetry.db's
    log holds `until` (then rolls back; yields the event set then), or until the block ends, or FALLBACK_S."""
    said, release = threading.Event(), threading.Event()

    class Waits(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if until is not None and until in record.getMessage():
                said.set()
                release.set()

    holder = create_engine(pg_url)  # a plain engine: no lock timeout of ours
    conn = holder.connect()
    tx = conn.begin()
    for statement in sql:
        conn.execute(text(statement))
    releaser = threading.Thread(target=lambda: (release.wait(FALLBACK_S), tx.rollback()), daemon=True)
    log, handler = logging.getLogger("telemetry.db"), Waits(logging.WARNING)
    level = log.level
    log.addHandler(handler)
    if not log.isEnabledFor(logging.WARNING):
        log.setLevel(logging.WARNING)
    releaser.start()
    try:
        yield said
    finally:
        release.set()
        releaser.join(30)
        log.removeHandler(handler)
        log.setLevel(level)
        conn.close()
        holder.dispose()


def _price(pg_url: str, name: str) -> float | None:
    engine = create_engine(pg_url)
    try:
        with engine.connect() as c:
            return c.execute(text("SELECT value FROM prices WHERE name = :n"), {"n": name}).scalar()
    finally:
        engine.dispose()


@pytest.fixture
def pg_store(pg_url, monkeypatch):
    """A PostgreSQL store at head whose catalog prices H100 at 5; each lock waited for at most 0.3 s."""
    open_store(pg_url).dispose()
    assert main(["prices", "set", "h100", "5", "--source", "t", "--db", pg_url]) == 0
    monkeypatch.setattr(db, "PG_LOCK_TIMEOUT_MS", 300)
    return pg_url


def test_prices_set_waits_for_a_row_another_session_holds_saying_so(pg_store, capsys):
    with _held(pg_store, "SELECT * FROM prices WHERE name = 'H100' FOR UPDATE", until="is locked by another session") \
            as said:
        rc = main(["prices", "set", "h100", "6", "--source", "t", "--db", pg_store])
    err = capsys.readouterr().err
    assert said.is_set() and rc == 0, err
    assert _price(pg_store, "H100") == 6


def test_prices_set_gives_up_after_its_bound_naming_the_store_and_writing_nothing(pg_store, monkeypatch, capsys):
    monkeypatch.setattr(db, "SQLITE_LOCK_WAIT_S", 1.0)
    started = time.monotonic()
    with _held(pg_store, "SELECT * FROM prices WHERE name = 'H100' FOR UPDATE"):
        rc = main(["prices", "set", "h100", "6", "--source", "t", "--db", pg_store])
        waited = time.monotonic() - started
    err = capsys.readouterr().err
    assert rc == 2 and waited < FALLBACK_S - 5, err
    shown = db.shown_db_url(pg_store)
    assert f"the store {shown} is locked: another session holds a lock on what this needs" in err, err
    assert "nothing was written" in err and "Traceback" not in err
    assert _price(pg_store, "H100") == 5


def test_a_read_of_a_table_another_session_locked_ends_with_the_clear_error(pg_store, capsys):
    started = time.monotonic()
    with _held(pg_store, "LOCK TABLE runs IN ACCESS EXCLUSIVE MODE"):
        rc = main(["cost", "--db", pg_store])
        waited = time.monotonic() - started
    err = capsys.readouterr().err
    assert rc == 2 and waited < FALLBACK_S - 5, err
    assert f"the store {db.shown_db_url(pg_store)} is locked: another session holds a lock" in err, err


def test_a_write_the_lock_timeout_stops_leaves_none_of_its_transaction(pg_store, monkeypatch):
    """A transaction that wrote a row before it met the lock is rolled back whole, each try."""
    monkeypatch.setattr(db, "SQLITE_LOCK_WAIT_S", 1.0)
    engine = db.make_engine(pg_store)

    def write() -> None:
        with engine.begin() as conn:
            conn.execute(text("UPDATE prices SET value = 7 WHERE name = 'H100'"))
            conn.execute(text("SELECT * FROM runs FOR UPDATE"))  # runs is locked: fails here

    try:
        with _held(pg_store, "LOCK TABLE runs IN ACCESS EXCLUSIVE MODE"):
            with pytest.raises(db.StoreLockedError, match="another session holds a lock"):
                db.retry_while_locked(engine, write)
    finally:
        engine.dispose()
    assert _price(pg_store, "H100") == 5


def test_an_upgrade_waits_for_the_migration_lock_another_session_holds_saying_so(pg_store, capsys):
    with _held(pg_store, f"SELECT pg_advisory_xact_lock({db.PG_MIGRATION_LOCK_KEY})",
               until="is being written by another session") as said:
        rc = main(["db", "upgrade", "--db", pg_store])
    assert said.is_set() and rc == 0, capsys.readouterr().err


def test_an_upgrade_gives_up_on_the_migration_lock_after_its_bound(pg_store, monkeypatch, capsys):
    monkeypatch.setattr(db, "SQLITE_MIGRATION_WAIT_MS", 1500)
    started = time.monotonic()
    with _held(pg_store, f"SELECT pg_advisory_xact_lock({db.PG_MIGRATION_LOCK_KEY})"):
        rc = main(["db", "upgrade", "--db", pg_store])
        waited = time.monotonic() - started
    err = capsys.readouterr().err
    assert rc == 2 and waited < FALLBACK_S - 5, err
    assert f"the store {db.shown_db_url(pg_store)} is locked" in err and "Traceback" not in err, err


@contextmanager
def _reading(pg_url: str, table: str, for_s: float) -> Iterator[None]:
    """Another session reads `table` in a transaction it keeps open for `for_s` (its ACCESS SHARE lock held),
    then ends it: a dashboard or report in the middle of its reads."""
    holder = create_engine(pg_url)
    conn = holder.connect()
    tx = conn.begin()
    conn.execute(text(f"SELECT 1 FROM {table}"))
    ender = threading.Timer(for_s, tx.rollback)
    ender.start()
    try:
        yield
    finally:
        ender.join(30)
        conn.close()
        holder.dispose()


def _revision(pg_url: str) -> str:
    engine = create_engine(pg_url)
    try:
        with engine.connect() as c:
            return c.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()


@pytest.mark.parametrize("how", ["db upgrade", "opening it", "db downgrade"])
def test_a_migration_waits_for_a_reader_past_the_lock_timeout_then_succeeds(pg_store, how, capsys, caplog):
    """The sessions' lock timeout (PG_LOCK_TIMEOUT_MS) is not the migration's: an ALTER TABLE runs waits for a
    reader of runs for as long as an upgrade is waited for (README: up to 30 min), not 5 s (it failed 'locked')."""
    from telemetry.store import head_revision

    if how != "db downgrade":
        assert main(["db", "downgrade", "0010", "--yes", "--db", pg_store]) == 0  # 0011 adds runs.invocation
    started = time.monotonic()
    with _reading(pg_store, "runs", 2.0), caplog.at_level(logging.WARNING, logger="telemetry.db"):
        if how == "db upgrade":
            rc = main(["db", "upgrade", "--db", pg_store])
        elif how == "db downgrade":
            rc = main(["db", "downgrade", "0010", "--yes", "--db", pg_store])
        else:  # a command that opens an older store upgrades it
            rc = main(["prices", "set", "h100", "6", "--source", "t", "--db", pg_store])
        waited = time.monotonic() - started
    err = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in err and "is locked:" not in err, err
    assert 1.5 < waited < FALLBACK_S, waited
    assert _revision(pg_store) == ("0010" if how == "db downgrade" else head_revision())
    # the wait is said, once, as SQLite's and a retried write's are (it was silent for up to 30 min)
    line = (f"the store {db.shown_db_url(pg_store)} is locked by another session (reading or writing a table the "
            "schema change alters): waiting up to 30 min for it; Ctrl-C stops it")
    assert caplog.messages.count(line) == 1, caplog.messages


def test_a_migration_that_waits_for_no_lock_says_no_waiting_line(pg_store, caplog):
    """A schema change that runs longer than the watch's first look but waits for no lock says nothing."""
    assert main(["db", "downgrade", "0010", "--yes", "--db", pg_store]) == 0
    engine = db.make_engine(pg_store)
    try:
        with caplog.at_level(logging.WARNING, logger="telemetry.db"), db.migration_transaction(engine) as conn:
            time.sleep(2.2)  # a long rebuild, blocked by nobody
            conn.execute(text("SELECT 1"))
    finally:
        engine.dispose()
    assert not [m for m in caplog.messages if "is locked by another session" in m], caplog.messages


@pytest.mark.parametrize("how", ["db upgrade", "opening it"])
def test_a_migration_that_times_out_on_a_reader_names_its_own_bound(pg_store, how, monkeypatch, capsys):
    """The migration waited its own bound (SET LOCAL lock_timeout), not the session's lock_timeout (300 ms here):
    its error says what it waited and that bound, not 'the session's lock_timeout, 300ms'."""
    assert main(["db", "downgrade", "0010", "--yes", "--db", pg_store]) == 0  # 0011 adds runs.invocation
    monkeypatch.setattr(db, "SQLITE_MIGRATION_WAIT_MS", 1500)
    with _reading(pg_store, "runs", 4.0):
        if how == "db upgrade":
            rc = main(["db", "upgrade", "--db", pg_store])
        else:
            rc = main(["prices", "set", "h100", "6", "--source", "t", "--db", pg_store])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert f"the store {db.shown_db_url(pg_store)} is locked: another session holds a lock" in err, err
    assert "session's lock_timeout" not in err and "300ms" not in err, err
    assert "s of waiting; a schema change waits up to 1.5 s)" in err, err
    assert _revision(pg_store) == "0010"


def _session_lock_timeout_of(url: str) -> str:
    engine = db.make_engine(url)
    try:
        with engine.connect() as c:
            return c.execute(text("SELECT current_setting('lock_timeout')")).scalar()
    finally:
        engine.dispose()


@pytest.mark.parametrize("where", ["database", "role", "url", "none", "url of another setting"])
def test_a_lock_timeout_set_outside_specfinops_is_kept_and_only_none_gets_the_default(pg_url, where, monkeypatch):
    """The PG_LOCK_TIMEOUT_MS default goes only to a session whose lock_timeout nothing set (0): one the database's
    or role's settings, PGOPTIONS or the URL's options give is kept (it was overridden with 5 s), and an options
    that sets another *_timeout is no lock_timeout (it left 0: waiting forever)."""
    monkeypatch.setattr(db, "PG_LOCK_TIMEOUT_MS", 4321)
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    name = pg_url.rsplit("/", 1)[1]
    role = None
    url = pg_url
    try:
        with admin.connect() as c:
            if where == "database":
                c.execute(text(f'ALTER DATABASE "{name}" SET lock_timeout = 1234'))
            elif where == "role":
                role = f"fix_pg2_role_{name[-10:]}"
                c.execute(text(f'CREATE ROLE "{role}" LOGIN'))
                c.execute(text(f'ALTER ROLE "{role}" SET lock_timeout = 1234'))
                url = pg_url.replace("://postgres@", f"://{role}@", 1)
                assert url != pg_url
        if where == "url":
            url = pg_url + "?options=-c%20lock_timeout%3D1234"
        elif where == "url of another setting":
            url = pg_url + "?options=-c%20deadlock_timeout%3D2s"
        expected = "4321ms" if where in ("none", "url of another setting") else "1234ms"
        assert _session_lock_timeout_of(url) == expected
    finally:
        with admin.connect() as c:
            if role is not None:
                c.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()


@pytest.mark.parametrize("how", ["url", "PGOPTIONS", "database"])
def test_a_lock_timeout_of_0_set_on_purpose_is_kept(pg_url, how, monkeypatch):
    """0 (wait forever) set deliberately is kept as any other value: the default goes only where nothing set
    lock_timeout (pg_settings.source 'default'), not wherever it reads 0 (a deliberate 0 got 5 s)."""
    monkeypatch.setattr(db, "PG_LOCK_TIMEOUT_MS", 4321)
    url = pg_url
    if how == "url":
        url = pg_url + "?options=-c%20lock_timeout%3D0"
    elif how == "PGOPTIONS":
        monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=0")
    else:
        admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text(f'ALTER DATABASE "{pg_url.rsplit("/", 1)[1]}" SET lock_timeout = 0'))
        admin.dispose()
    assert _session_lock_timeout_of(url) == "0"
    assert db.session_lock_timeout(db.shown_db_url(url)) == "0"


def test_a_lock_timeout_pgoptions_sets_is_kept(pg_url, monkeypatch):
    monkeypatch.setattr(db, "PG_LOCK_TIMEOUT_MS", 4321)
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=1234")
    assert _session_lock_timeout_of(pg_url) == "1234ms"


def test_the_locked_error_of_a_read_names_the_sessions_own_lock_timeout_and_no_write(pg_store, capsys):
    """The session waited its lock_timeout (here 300 ms, not 5 s), and `cost` writes nothing: its error says no
    'nothing was written' as though a write had been tried."""
    with _held(pg_store, "LOCK TABLE runs IN ACCESS EXCLUSIVE MODE"):
        rc = main(["cost", "--db", pg_store])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "lock_timeout, 300ms" in err and " s of waiting" not in err, err
    assert "nothing was written" not in err and "rolled back" in err, err


def test_a_run_end_that_times_out_on_a_locked_pg_store_names_the_store_and_the_lock(pg_store):
    """The recorder's end_run error said 'locked' only for SQLite's 'database is locked': on PostgreSQL it showed
    the raw 'canceling statement due to lock timeout' alone. The same is_locked test names the store and holder."""
    import random

    from recorder_child import run_info, synthetic_request

    from telemetry.recorder import Recorder, RecorderError

    engine = open_store(pg_store)
    rec = Recorder(engine, flush_interval_s=0.02, retry_max_s=0.05)
    try:
        run_id = rec.start_run(run_info())
        with _held(pg_store, "LOCK TABLE requests IN ACCESS EXCLUSIVE MODE"):
            rec.record_request(run_id, synthetic_request(random.Random(0), 3))
            with pytest.raises(RecorderError) as exc:
                rec.end_run(run_id, timeout_s=1.5)
        said = str(exc.value)
        assert f"the store {db.shown_db_url(pg_store)} is locked, another session holds a lock" in said, said
    finally:
        rec.close()
        engine.dispose()

"""open_store: empty -> head, behind -> head, at head -> no Alembic; the `specfinops db` command."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import create_engine, inspect, text

import telemetry.store as store
from app.cli import main as cli_main
from telemetry.db import Base, make_engine
from telemetry.store import StoreError, alembic_config, head_revision, open_store


def _revision(url: str) -> str | None:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return store.current_revision(conn)
    finally:
        engine.dispose()


def test_open_store_upgrades_empty_database(db_url):
    engine = open_store(db_url)
    try:
        assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert _revision(db_url) == head_revision()


def test_open_store_upgrades_database_behind_head(db_url):
    command.upgrade(alembic_config(db_url), "head")
    command.downgrade(alembic_config(db_url), "base")
    assert _revision(db_url) is None
    open_store(db_url).dispose()
    assert _revision(db_url) == head_revision()


def test_open_store_at_head_does_not_run_alembic(sqlite_url, monkeypatch):
    open_store(sqlite_url).dispose()

    def fail(_engine):
        raise AssertionError("upgrade_to_head called although the store is at head")

    monkeypatch.setattr(store, "upgrade_to_head", fail)
    open_store(sqlite_url).dispose()


def test_sqlite_store_is_in_wal_mode(sqlite_url):
    engine = open_store(sqlite_url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    engine.dispose()


def test_schema_made_by_create_all_is_stamped(sqlite_url):
    engine = create_engine(sqlite_url)
    Base.metadata.create_all(engine)
    engine.dispose()
    open_store(sqlite_url).dispose()
    assert _revision(sqlite_url) == head_revision()


def test_foreign_schema_without_version_is_refused(sqlite_url):
    engine = create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE runs (id INTEGER PRIMARY KEY, something TEXT)"))
    engine.dispose()
    with pytest.raises(StoreError, match="not a specfinops store: only its table runs is named like one of"):
        open_store(sqlite_url)


def test_all_tables_without_version_whose_schema_differs_are_refused(sqlite_url):
    """Every table of the models there (a store made without Alembic), one of them not as the models have it."""
    engine = create_engine(sqlite_url)
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE prices ADD COLUMN extra TEXT"))
    engine.dispose()
    with pytest.raises(StoreError, match="no alembic_version table and its schema differs from the models"):
        open_store(sqlite_url)


def test_unknown_revision_is_refused(sqlite_url):
    command.upgrade(alembic_config(sqlite_url), "head")
    engine = create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'fffffffff'"))
    engine.dispose()
    with pytest.raises(StoreError, match="'fffffffff', unknown to this specfinops"):
        open_store(sqlite_url)


def test_db_command_upgrade_current_check_downgrade(db_url, capsys):
    assert cli_main(["db", "upgrade", "--db", db_url]) == 0
    assert "(at head)" in capsys.readouterr().out
    assert cli_main(["db", "check", "--db", db_url]) == 0
    assert "agree" in capsys.readouterr().out
    assert cli_main(["db", "downgrade", "base", "--db", db_url]) == 0
    assert "(no schema)" in capsys.readouterr().out
    assert _revision(db_url) is None
    assert cli_main(["db", "current", "--db", db_url]) == 0


def test_db_check_of_a_database_behind_head_names_the_upgrade_on_both_stores(db_url, capsys):
    """SQLite and PostgreSQL alike: not Alembic's bare "Target database is not up to date."."""
    make_engine(db_url).connect().close()  # the database exists (a SQLite file too), with no schema
    assert cli_main(["db", "check", "--db", db_url]) == 2
    err = capsys.readouterr().err
    assert "the database has no schema yet; `specfinops db upgrade --db " in err and "not up to date" not in err
    assert len(err.strip().splitlines()) == 1
    assert cli_main(["db", "upgrade", "0001", "--db", db_url]) == 0
    capsys.readouterr()
    assert cli_main(["db", "check", "--db", db_url]) == 2
    err = capsys.readouterr().err
    assert f"is at revision 0001, behind head {head_revision()}; `specfinops db upgrade --db " in err, err


@pytest.mark.postgres
def test_db_check_suggests_an_upgrade_that_runs_and_never_prints_a_password(pg_url, capsys):
    """The URL as the user writes it (postgresql://, not postgresql+psycopg://), its password masked, and said so
    (the masked form is no --db that runs as written)."""
    secret = pg_url.replace("://postgres@", "://postgres:s3cret@", 1)  # trust auth takes any password
    assert secret != pg_url
    make_engine(secret).connect().close()
    assert cli_main(["db", "check", "--db", secret]) == 2
    err = capsys.readouterr().err
    shown = secret.replace("postgresql+psycopg://", "postgresql://").replace(":s3cret@", ":***@")
    assert f"`specfinops db upgrade --db {shown}` (*** is its password)" in err and "s3cret" not in err, err
    assert "psycopg" not in err, err
    assert cli_main(["db", "check", "--db", pg_url]) == 2  # no password: the URL itself, ready to paste
    plain = pg_url.replace("postgresql+psycopg://", "postgresql://")
    assert f"`specfinops db upgrade --db {plain}` brings" in capsys.readouterr().err


def test_db_downgrade_of_a_database_without_schema_says_so(db_url, capsys):
    make_engine(db_url).connect().close()  # the database exists (a SQLite file too), with no schema
    assert cli_main(["db", "downgrade", "0003", "--db", db_url]) == 2
    err = capsys.readouterr().err
    assert "the database has no schema, so there is nothing to downgrade to 0003" in err, err
    assert "not a valid downgrade target" not in err and len(err.strip().splitlines()) == 1
    assert cli_main(["db", "downgrade", "base", "--db", db_url]) == 0  # already there: nothing to do
    assert "(no schema)" in capsys.readouterr().out


@pytest.mark.postgres
def test_db_upgrade_backwards_suggests_a_downgrade_that_runs(pg_url, capsys):
    secret = pg_url.replace("://postgres@", "://postgres:s3cret@", 1)
    assert cli_main(["db", "upgrade", "--db", secret]) == 0
    capsys.readouterr()
    assert cli_main(["db", "upgrade", "0001", "--db", secret]) == 2
    err = capsys.readouterr().err
    shown = secret.replace("postgresql+psycopg://", "postgresql://").replace(":s3cret@", ":***@")
    assert f"`specfinops db downgrade 0001 --db {shown}` (*** is its password)" in err and "s3cret" not in err, err


def test_db_command_errors_are_one_line(empty_store, capsys):
    assert cli_main(["db", "downgrade", "nosuchrev", "--db", empty_store]) == 2
    assert "Can't locate revision identified by 'nosuchrev'" in capsys.readouterr().err
    assert cli_main(["db"]) == 2
    assert "choose an action" in capsys.readouterr().err


def test_db_command_help_has_examples(capsys):
    with pytest.raises(SystemExit):
        cli_main(["db", "--help"])
    assert "specfinops db upgrade --db postgresql://" in capsys.readouterr().out


def test_a_plain_file_path_is_a_sqlite_store(tmp_path, capsys):
    path = tmp_path / "sub" / "runs.db"
    assert cli_main(["db", "upgrade", "--db", str(path)]) == 0
    assert path.is_file() and _revision(f"sqlite:///{path}") == head_revision()


def test_db_current_on_a_missing_file_says_so_and_creates_nothing(tmp_path, capsys):
    path = tmp_path / "typo.db"
    assert cli_main(["db", "current", "--db", str(path)]) == 0
    assert "no such file (no store yet)" in capsys.readouterr().out
    assert not path.exists()


def test_open_store_must_exist_refuses_a_missing_sqlite_file_only(tmp_path, sqlite_url):
    from telemetry.store import NoStoreError

    with pytest.raises(NoStoreError, match="no store at"):
        open_store(sqlite_url, must_exist=True)
    assert list(tmp_path.iterdir()) == []
    open_store(sqlite_url).dispose()  # a recorder creates it
    open_store(sqlite_url, must_exist=True).dispose()  # then a reader opens it


@pytest.mark.parametrize(("db", "needle"), [
    ("foo://bar", "unknown database kind 'foo'"),
    # a kind SQLAlchemy knows, whose driver is not installed: not "a module this needs is not installed: MySQLdb"
    ("mysql://x:pw@y/z", "'mysql://x:***@y/z': unknown database kind 'mysql': only sqlite:/// and postgresql:// "
                         "stores are supported"),
    ("postgresql+nosuchdriver://x@y/z", "only sqlite:/// and postgresql:// stores are supported"),
    ("postgresql://root@127.0.0.1:1/test", "cannot use the database: connection failed"),
    ("sqlite:///{tmp}", "is a directory"),
    ("{tmp}", "is a directory"),
])
def test_a_bad_database_is_one_line_naming_it(db, needle, tmp_path, capsys):
    assert cli_main(["db", "current", "--db", db.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# ---- a reader pointed at a database that holds no store ------------------------------------------------


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_a_store_downgraded_to_base_is_said_to_hold_only_its_empty_version_table(db_url):
    """`db downgrade base` leaves an empty alembic_version table: 'it has no tables' was not what the user saw."""
    from telemetry.store import NotAStoreError

    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"))
    engine.dispose()
    with pytest.raises(NotAStoreError, match=r"it has no specfinops tables \(only an empty version table, as "
                                             r"`specfinops db downgrade base` leaves\)"):
        open_store(db_url, must_exist=True)


@pytest.mark.parametrize("foreign", [True, False], ids=["another-apps-tables", "empty"])
def test_a_reader_refuses_a_database_without_a_store_and_creates_nothing(db_url, foreign):
    from telemetry.store import NotAStoreError

    engine = create_engine(db_url)
    with engine.begin() as conn:  # also makes the SQLite file exist
        conn.execute(text("CREATE TABLE customers (id INTEGER PRIMARY KEY)" if foreign else "SELECT 1"))
    engine.dispose()
    path = store.sqlite_file(db_url)
    before = path.read_bytes() if path is not None else None
    with pytest.raises(NotAStoreError) as exc:
        open_store(db_url, must_exist=True)
    said = str(exc.value)
    assert said.startswith("no store in ") and "specfinops db upgrade --db" in said and len(said.splitlines()) == 1
    assert ("its table customers is not specfinops's" if foreign else "it has no tables") in said
    assert _tables(db_url) == ({"customers"} if foreign else set())  # no specfinops table installed
    if path is not None:
        assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_a_reader_upgrades_a_store_of_an_older_revision(db_url):
    command.upgrade(alembic_config(db_url), "0001")
    open_store(db_url, must_exist=True).dispose()
    assert _revision(db_url) == head_revision()


@pytest.mark.parametrize("command_line", [
    ["export", "--what", "requests", "--out", "-"],
    ["report", "--period", "daily", "--out", "{tmp}/reports"],
    ["cost"],
    ["scheduler", "--cron", "0 6 * * *", "--out", "{tmp}/reports"],
    ["scheduler", "--list"],
])
def test_read_only_commands_refuse_another_apps_database_in_one_line(pg_url, tmp_path, capsys, monkeypatch,
                                                                    command_line):
    from apscheduler.schedulers.blocking import BlockingScheduler

    monkeypatch.setattr(BlockingScheduler, "start", lambda self, *a, **kw: None)  # never block
    engine = create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE customers (id INTEGER PRIMARY KEY)"))
    engine.dispose()
    url = pg_url.replace("postgres@", "postgres:s3cr3t@")  # trust auth: the password is not checked
    argv = [a.format(tmp=tmp_path) for a in command_line]
    assert cli_main([argv[0], "--db", url, *argv[1:]]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "no store in postgresql://postgres:***@127.0.0.1" in err and "s3cr3t" not in err and "psycopg" not in err
    assert "its table customers is not specfinops's" in err
    assert "specfinops db upgrade --db postgresql://postgres:***@127.0.0.1" in err and "(*** is its password)" in err
    assert _tables(pg_url) == {"customers"} and not (tmp_path / "reports").exists()


@pytest.mark.parametrize("command", [["cost"], ["prices"]])
def test_a_read_only_store_behind_head_names_its_revision(db_url, command, capsys):
    """A store at an older schema opened read-only (a SQLite URI with mode=ro, a PostgreSQL session whose
    transactions are read-only) failed 'cannot use the database: attempt to write a readonly database': every
    command upgrades the store it opens, which a read-only one cannot be."""
    assert cli_main(["db", "upgrade", "0003", "--db", db_url]) == 0
    capsys.readouterr()
    if db_url.startswith("sqlite"):
        ro_url = f"sqlite:///file:{db_url.removeprefix('sqlite:///')}?mode=ro&uri=true"
    else:
        ro_url = db_url + "?options=-c%20default_transaction_read_only%3Don"
    assert cli_main([*command, "--db", ro_url]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"is at revision 0003 and this specfinops needs revision {head_revision()}, but it is open read-only" \
           in err, err
    if db_url.startswith("sqlite"):  # a file: upgrade a copy of it
        assert "so it cannot be upgraded: run `specfinops db upgrade --db COPY` on a writable copy" in err, err
    else:  # a server's database has no copy to make: a role and session that can write upgrade it
        assert "so it cannot be upgraded: run `specfinops db upgrade --db URL` with a role and session that can " \
               "write" in err and "COPY" not in err, err
    assert "readonly database" not in err and "read-only transaction" not in err
    assert _revision(db_url) == "0003"


def test_a_read_only_store_made_without_alembic_is_not_said_to_have_no_schema(tmp_path, capsys):
    from telemetry.db import Base

    path = tmp_path / "made.db"
    engine = create_engine(f"sqlite:///{path}")
    Base.metadata.create_all(engine)
    engine.dispose()
    assert cli_main(["cost", "--db", f"sqlite:///file:{path}?mode=ro&uri=true"]) == 2
    err = capsys.readouterr().err
    assert "is without an Alembic version (its tables were made without Alembic)" in err and "schema" not in err


# ---- a command that records, pointed at another application's database ---------------------------------


def _journal_mode(path) -> str:
    import contextlib
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute("PRAGMA journal_mode").fetchone()[0]


def test_a_writer_refuses_another_apps_database_and_leaves_it_as_it_was(db_url, capsys):
    """`prices set` (bench, loadtest and serve likewise: they open the store as it does) turned another
    application's SQLite file into a store, its tables beside the other's, and switched it to WAL; `db upgrade`
    stays the way to do that on purpose."""
    from telemetry.store import NotAStoreError

    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)"))
    engine.dispose()
    path = store.sqlite_file(db_url)
    before = path.read_bytes() if path is not None else None
    with pytest.raises(NotAStoreError, match="its table customers is not specfinops's") as exc:
        open_store(db_url)
    assert "to add a store to it anyway: specfinops db upgrade --db" in str(exc.value)
    assert "specfinops bench" not in str(exc.value)  # it would refuse the database as well
    assert cli_main(["prices", "set", "mynode", "1.5", "--kind", "node", "--source", "t", "--db", db_url]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "no store in " in err and "its table customers is not specfinops's" in err
    assert _tables(db_url) == {"customers"}
    if path is not None:
        assert path.read_bytes() == before and _journal_mode(path) == "delete"
        assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no -wal, no -shm
    assert cli_main(["db", "upgrade", "--db", db_url]) == 0  # on purpose: the store goes beside its tables
    open_store(db_url).dispose()
    assert _tables(db_url) >= {"customers", *Base.metadata.tables}


@pytest.mark.parametrize("must_exist", [False, True], ids=["writer", "reader"])
def test_a_file_whose_tables_differ_from_the_models_is_refused_before_it_is_switched_to_wal(tmp_path, must_exist):
    """Another application's `prices` table was refused (now: "not a specfinops store", its other tables missing)
    only after the file had been switched to WAL."""
    path = tmp_path / "other.db"
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE prices (sku TEXT PRIMARY KEY, cents INTEGER)"))
    engine.dispose()
    before = path.read_bytes()
    with pytest.raises(StoreError, match=r"not a specfinops store: only its table prices is named like one of"):
        open_store(f"sqlite:///{path}", must_exist=must_exist)
    assert path.read_bytes() == before and _journal_mode(path) == "delete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_a_database_with_only_another_apps_table_named_like_one_of_ours_is_said_alike_by_each_command(db_url,
                                                                                                         capsys):
    """Another application's `prices` alone: `db current` said "has the tables but no Alembic version", `db check`
    that `db upgrade` "stamps it, where its tables match the models", and `db upgrade` then refused "database has
    specfinops tables ['prices'] ... (28 differences ...)". Each says the same: only a table named like one of
    specfinops's is there, the others are missing, so it is no specfinops store; and what to do."""
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE prices (sku VARCHAR(20) PRIMARY KEY, cents INTEGER)"))
    engine.dispose()
    said = ("not a specfinops store: only its table prices is named like one of specfinops's, and not as "
            "specfinops makes it; its other ")
    assert cli_main(["db", "current", "--db", db_url]) == 0
    out = capsys.readouterr().out
    assert "revision (none)" in out and said in out and "are missing" in out, out
    assert "has the tables" not in out, out
    for argv in (["db", "check"], ["db", "upgrade"], ["cost"]):
        assert cli_main([*argv, "--db", db_url]) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
        assert said in err and "are missing" in err and "check --db / SPECFINOPS_DB_URL" in err, (argv, err)
        assert "has the tables" not in err and "stamps it" not in err and "differences" not in err, (argv, err)
    assert _tables(db_url) == {"prices"}


def test_another_alembic_managed_apps_database_is_not_said_to_be_a_newer_store(db_url, capsys):
    """Its own alembic_version, at a revision of its own, read as "written by a newer version" of specfinops to
    every command, `db upgrade` included: none of specfinops's tables is there, so it is no store at all."""
    from telemetry.store import NotAStoreError

    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"))
        conn.execute(text("INSERT INTO alembic_version VALUES ('3f2a9c1b7d4e')"))
        conn.execute(text("CREATE TABLE users (id INTEGER)"))
    engine.dispose()
    said = ("its table users is not specfinops's, and its alembic_version table (at revision '3f2a9c1b7d4e') is "
            "another Alembic-managed application's. Check --db / SPECFINOPS_DB_URL: a store needs a database of "
            "its own")
    for must_exist in (False, True):
        with pytest.raises(NotAStoreError, match="^no store in ") as exc:
            open_store(db_url, must_exist=must_exist)
        assert said in str(exc.value)
    for argv in (["cost"], ["db", "upgrade"], ["prices", "set", "mynode", "1.5", "--kind", "node", "--source", "t"]):
        assert cli_main([*argv, "--db", db_url]) == 2, argv
        err = capsys.readouterr().err
        assert said in err and "newer" not in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert cli_main(["db", "current", "--db", db_url]) == 0
    assert "revision 3f2a9c1b7d4e, head" in (out := capsys.readouterr().out)
    assert "(not a specfinops store: its table users is not specfinops's)" in out, out
    assert cli_main(["db", "check", "--db", db_url]) == 2
    assert "not a specfinops store: its table users is not specfinops's" in capsys.readouterr().err
    path = store.sqlite_file(db_url)
    assert path is None or _journal_mode(path) == "delete"
    assert _tables(db_url) == {"alembic_version", "users"} and _revision(db_url) == "3f2a9c1b7d4e"


@pytest.mark.postgres
def test_a_role_that_may_not_change_the_schema_is_told_the_revision_it_needs(pg_url, pg_reader, capsys):
    """A store behind head opened by a role that may read it but not alter its tables failed "cannot use the
    database: must be owner of table runs"; it is told, as for a read-only store, what revision it is at and that
    the upgrade needs a role that may."""
    assert cli_main(["db", "upgrade", "0003", "--db", pg_url]) == 0
    capsys.readouterr()
    role, reader_url = pg_reader()
    for argv in (["cost"], ["prices", "set", "mynode", "1.5", "--kind", "node", "--source", "t"]):
        assert cli_main([*argv, "--db", reader_url]) == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert (f"is at revision 0003 and this specfinops needs revision {head_revision()}, but the role {role} "
                "may not change its schema, so it cannot be upgraded: run `specfinops db upgrade --db URL` as "
                "a role that may (the owner of its tables)") in err, err
        assert "must be owner" not in err and "read-only" not in err
    assert _revision(pg_url) == "0003"  # the failed upgrade was rolled back whole


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///:memory:", "sqlite:///file:m?mode=memory&uri=true"])
def test_an_in_memory_store_is_refused_before_any_work(url, monkeypatch, capsys):
    """`prices set --db sqlite://` said it saved the price and kept nothing; a bench into `sqlite://` (an unset
    variable in `sqlite:///$DB` is `sqlite:///`) ran to its end, then lost every record. Refused, naming the URL."""
    from app.cli import main
    from telemetry.store import StoreError

    with pytest.raises(StoreError, match="is an in-memory SQLite database"):
        open_store(url)
    assert main(["prices", "set", "L4", "0.9", "--source", "x", "--db", url]) == 2
    assert "in-memory SQLite database: nothing written there outlives the command" in capsys.readouterr().err
    monkeypatch.setenv("SPECFINOPS_DB_URL", url)
    for argv in (["cost"], ["db", "upgrade"]):
        assert main(argv) == 2
        assert "in-memory SQLite database" in capsys.readouterr().err


def test_a_store_on_a_read_only_file_system_names_its_folder(tmp_path, monkeypatch):
    """On a read-only mount (a container's :ro volume) SQLite says only 'unable to open database file' where a
    folder without write permission gives 'readonly': both are named as the folder SQLite cannot write."""
    import os
    import sqlite3

    import telemetry.db as db

    store = tmp_path / "store.db"
    cantopen = sqlite3.OperationalError("unable to open database file")
    assert db.folder_error(store, cantopen) is None  # a writable folder: another cause, left as it is
    monkeypatch.setattr(db.os, "access", lambda p, mode: not (mode == os.W_OK and str(p) == str(tmp_path)))
    clear = db.folder_error(store, cantopen)
    assert clear is not None and f"its folder {tmp_path} is not writable (permissions, or a read-only file " \
        "system)" in str(clear)


def _readme() -> str:
    from pathlib import Path

    return " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8").split())


def test_the_readme_says_how_a_database_with_another_apps_table_named_like_ours_is_refused(sqlite_url, capsys):
    """README said `db upgrade` adds a store beside another application's tables: where one of them takes a
    specfinops table's name it is refused, as every command refuses it; the README quotes that line."""
    engine = create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE prices (sku VARCHAR(20) PRIMARY KEY, cents INTEGER)"))
    engine.dispose()
    assert cli_main(["db", "upgrade", "--db", sqlite_url]) == 2
    err = " ".join(capsys.readouterr().err.split())
    said = err[err.index("not a specfinops store: "):err.index("; its other ")]
    readme = _readme()
    assert said in readme and store.NOT_A_STORE_ADVICE in readme, said

"""Shared fixtures: real databases (a SQLite file per test, a fresh PostgreSQL database per session)."""

from __future__ import annotations

import os
import signal
import uuid

import pytest

# A suite a script starts in the background (`nohup pytest ... &`) inherits SIGINT ignored, and so does every command
# the tests start as a process: the Ctrl-C tests then signal processes that cannot hear it and fail for the launch's
# sake. The suite runs as from a terminal; tests of an inherited SIG_IGN set it on their child themselves.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

PG_ADMIN_URL = os.environ.get("SPECFINOPS_TEST_PG_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """A SQLite file that does not exist yet (commands that record create it; commands that only read refuse it)."""
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def empty_store(sqlite_url) -> str:
    """An existing SQLite store at the newest schema, with no runs."""
    from telemetry.store import open_store

    open_store(sqlite_url).dispose()
    return sqlite_url


@pytest.fixture
def one_run_store(sqlite_url) -> str:
    """An existing SQLite store holding one AR run of one request (400 tokens in 9 s)."""
    from sqlalchemy.orm import Session
    from synthetic import Req, make_run

    from telemetry.store import open_store

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(400, ttft_ms=100, e2e_ms=9000, start_s=0.0)])
        s.commit()
    engine.dispose()
    return sqlite_url


def _pg_admin():
    from sqlalchemy import create_engine, text

    engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.execute(text("select 1"))
    return engine


@pytest.fixture
def pg_url():
    """A fresh, empty PostgreSQL database for one test; skipped (with the reason) when no server answers."""
    from sqlalchemy import text

    try:
        admin = _pg_admin()
    except Exception as exc:  # noqa: BLE001 - any connection failure means: no server here
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {type(exc).__name__}: {exc}".splitlines()[0])
    name = f"specfinops_t_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def pg_reader(pg_url):
    """(a login role granted SELECT only on pg_url's tables as they stand, a URL connecting as it); call it once
    the tables are made. The role is dropped after the test."""
    from sqlalchemy import create_engine, text

    made: list[str] = []
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")

    def make() -> tuple[str, str]:
        role = f"specfinops_reader_{uuid.uuid4().hex[:10]}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
            made.append(role)
            conn.execute(text(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"'))
        reader_url = pg_url.replace("://postgres@", f"://{role}@", 1)
        assert reader_url != pg_url
        return role, reader_url

    yield make
    with admin.connect() as conn:
        for role in made:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """Run a test on both stores."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("pg_url")


def _read_only(url: str) -> str:
    if url.startswith("sqlite:///"):
        return f"sqlite:///file:{url.removeprefix('sqlite:///')}?mode=ro&uri=true"  # SQLite opens the file read-only
    return url + "?options=-c%20default_transaction_read_only%3Don"  # every transaction of the session read-only


@pytest.fixture
def read_only_url():
    """URL -> the same store opened read-only (as a file this user may not write, or a read-only server, is): a
    SQLite URI with mode=ro, a PostgreSQL session whose transactions are read-only. Tests run as root, to whom
    file permissions mean nothing."""
    return _read_only

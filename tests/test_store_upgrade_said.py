"""A command that upgrades an older store as it opens it (every process of this version does, README) says so on
stderr, once: older versions refuse the store afterwards. A new store given its schema is not said."""

from __future__ import annotations

from sqlalchemy import create_engine, text

from app.cli import main
from telemetry.store import head_revision


def _revision(url: str) -> str:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as c:
            return c.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()


def test_a_reporting_command_says_it_upgraded_an_older_store(db_url, capsys):
    assert main(["db", "upgrade", "0010", "--db", db_url]) == 0
    capsys.readouterr()
    assert main(["invocations", "--db", db_url]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("upgraded the store")]
    assert len(said) == 1, err
    assert f"from revision 0010 to {head_revision()}" in said[0]
    assert "older specfinops versions will refuse it" in said[0]
    assert _revision(db_url) == head_revision()
    assert main(["invocations", "--db", db_url]) == 0  # at head now: nothing more to say
    assert "upgraded the store" not in capsys.readouterr().err


def test_the_upgrade_line_masks_a_password(pg_url, capsys):
    url = pg_url.replace("://postgres@", "://postgres:s3cr3t@", 1)  # trust auth: any password is let in
    assert main(["db", "upgrade", "0010", "--db", url]) == 0
    capsys.readouterr()
    assert main(["invocations", "--db", url]) == 0
    err = capsys.readouterr().err
    assert "upgraded the store postgresql://postgres:***@" in err and "s3cr3t" not in err


def test_a_new_store_given_its_schema_is_not_said_to_be_upgraded(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'new.db'}"
    assert main(["prices", "set", "my-node", "12", "--kind", "node", "--source", "test", "--db", url]) == 0
    assert "upgraded" not in capsys.readouterr().err

"""A SQLite URL with a query string (`?timeout=30`, a URI's `?mode=ro&uri=true`) names the file before the `?`."""

from __future__ import annotations

import pytest

from app.cli import main
from telemetry.db import resolve_db_url, sqlite_file


@pytest.mark.parametrize("query", ["?timeout=30", "?timeout=30&check_same_thread=false"])
def test_sqlite_file_leaves_the_query_out(tmp_path, query):
    assert sqlite_file(f"sqlite:///{tmp_path}/c.db{query}") == tmp_path / "c.db"
    assert sqlite_file(f"sqlite:///file:{tmp_path}/c.db?mode=ro&uri=true") == tmp_path / "c.db"


@pytest.mark.parametrize("form", ["sqlite:///{path}?timeout=30", "sqlite:///file:{path}?mode=ro&uri=true"])
def test_a_reporting_command_reads_a_store_named_with_a_query(one_run_store, tmp_path, capsys, form):
    url = form.format(path=tmp_path / "store.db")
    assert main(["cost", "--db", url, "--gpu", "H100"]) == 0, capsys.readouterr().err
    assert "no store at" not in capsys.readouterr().err


def test_mode_ro_without_uri_is_refused_with_the_url_that_works(one_run_store, tmp_path, capsys):
    """The driver ignores `mode=ro` without `uri=true`: the store was opened writable, and `prices set` wrote."""
    path = tmp_path / "store.db"
    with pytest.raises(ValueError, match=r"sqlite:///file:/path/store.db\?mode=ro&uri=true"):
        resolve_db_url(f"sqlite:///{path}?mode=ro")
    assert main(["prices", "set", "H100", "9", "--source", "x", "--db", f"sqlite:///{path}?mode=ro"]) == 2
    err = capsys.readouterr().err
    assert "only in a URI" in err and "Traceback" not in err

"""No traceback reaches a user of the CLI: bad input, a bad database, a closed pipe, a busy port, and an
error nobody foresaw each end in one line (exit 2 for input and environment, 1 for a bug)."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys

import pytest
from sqlalchemy.orm import Session
from synthetic import Req, make_run

from app.cli import main
from telemetry.store import open_store


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 or lines[0].startswith("usage:"), err
    return lines[-1]


@pytest.fixture
def store(one_run_store) -> str:
    return one_run_store


def test_a_closed_pipe_ends_the_export_quietly(store):
    """`specfinops export --out - | head -1`: the reader leaves early; no BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "export", "--what", "tokens", "--out", "-",
                             "--db", store], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0
    assert first.startswith(b"token_event_id") and "Traceback" not in err and "BrokenPipe" not in err


def test_a_file_that_is_no_database(tmp_path, capsys):
    junk = tmp_path / "notes.txt"
    junk.write_text("#!/bin/sh\necho hello\n" * 50)
    assert main(["cost", "--db", str(junk)]) == 2
    assert "cannot use the database: file is not a database" in _one_line(capsys)


@pytest.mark.parametrize("argv", [
    ["cost"],
    ["project", "--daily-tokens", "1e6", "--peak-factor", "2", "--p95-tpot-sla-ms", "50", "--node-hourly-usd", "3"],
    ["export", "--what", "requests", "--out", "-"],
    ["report", "--period", "weekly", "--out", "{tmp}/report"],
    ["dashboard", "--port", "0"],
], ids=lambda a: a[0])
def test_a_reader_pointed_at_a_missing_file_creates_nothing(argv, tmp_path, capsys):
    """A mistyped --db is named as such; it does not become a new, empty store (nor its directory)."""
    missing = tmp_path / "typo" / "runs.db"
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main([*argv, "--db", str(missing)]) == 2
    line = _one_line(capsys)
    assert f"no store at {missing}" in line and "specfinops bench" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_listing_prices_of_a_missing_store_shows_the_defaults_and_creates_nothing(tmp_path, capsys):
    from telemetry.prices import default_entries

    missing = tmp_path / "typo" / "runs.db"
    assert main(["prices", "list", "--json", "--db", str(missing)]) == 0
    captured = capsys.readouterr()
    shown = {e["name"]: e["value"] for e in json.loads(captured.out)}
    assert shown == {e.name: e.value for e in default_entries()}
    assert f"no store at {missing} yet" in captured.err and "default prices" in captured.err
    assert list(tmp_path.iterdir()) == []
    # a bad `prices set` creates nothing either; a good one creates the store, and list then reads it
    assert main(["prices", "set", "H100", "--db", str(missing)]) == 2
    assert list(tmp_path.iterdir()) == []
    assert main(["prices", "set", "H100", "2.5", "--source", "quote", "--db", str(missing)]) == 0
    capsys.readouterr()
    assert main(["prices", "list", "--json", "--db", str(missing)]) == 0
    captured = capsys.readouterr()
    stored = json.loads(captured.out)
    assert {e["name"]: e["value"] for e in stored}["H100"] == 2.5 and "no store" not in captured.err
    # listed in one order with or without a store (the defaults came in the file's order: electricity last)
    assert [e["name"] for e in stored] == list(shown)


@pytest.mark.parametrize("argv", [["prices"], ["prices", "list", "--json"],
                                  ["prices", "set", "NEWGPU", "5", "--source", "x"]],
                         ids=["prices", "list", "set-new-name"])
def test_prices_refuses_another_applications_database(argv, tmp_path, capsys):
    """A SQLite file holding only another application's table is no store that `prices` could list the defaults of
    (it said "no store at ... yet" and exit 0) nor one a new price name is judged against the defaults for (it
    asked for --kind): refused as every other command refuses it, naming its table; nothing is written to it."""
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE foo (x INTEGER)")
    conn.close()
    assert main([*argv, "--db", str(other)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err, err
    assert f"no store in {other}: its table foo is not specfinops's" in err and "default prices" not in err, err
    with sqlite3.connect(other) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["foo"]
    conn.close()


def test_listing_prices_of_an_empty_database_shows_the_defaults(tmp_path, capsys):
    """An empty file (no tables) is where `prices set` starts a store: listing it still shows the defaults."""
    empty = tmp_path / "empty.db"
    empty.touch()
    assert main(["prices", "list", "--db", str(empty)]) == 0
    assert f"no store at {empty} yet" in capsys.readouterr().err


def test_a_reader_on_the_default_store_before_any_run_creates_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPECFINOPS_DB_URL", raising=False)
    assert main(["cost"]) == 2
    # the relative default is named as found from the working folder too: that folder decides the store read
    assert f"no store at var/specfinops.db ({tmp_path / 'var' / 'specfinops.db'}, from the working folder)" \
        in _one_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_recorder_still_creates_its_store(tmp_path, capsys):
    path = tmp_path / "new" / "runs.db"
    assert main(["prices", "set", "H100", "2.5", "--source", "quote", "--db", str(path)]) == 0
    assert path.is_file()
    assert main(["cost", "--db", str(path)]) == 2  # exists now: the reader's complaint is the missing runs
    assert "specfinops bench" in _one_line(capsys)


@pytest.mark.parametrize("argv", [
    ["cost"],
    ["project", "--daily-tokens", "1e6", "--peak-factor", "2", "--p95-tpot-sla-ms", "50", "--node-hourly-usd", "3"],
    ["report", "--period", "weekly", "--out", "{tmp}/report"],
], ids=lambda a: a[0])
def test_the_empty_store_hint_records_into_the_store_given(argv, tmp_path, monkeypatch, capsys):
    """`--db` names another store than the default: the bench the hint proposes records into that one, not
    into the default store the command did not read."""
    monkeypatch.delenv("SPECFINOPS_DB_URL", raising=False)
    path = tmp_path / "a" / "empty store.db"  # a space: the command stays one shell word
    assert main(["db", "upgrade", "--db", str(path)]) == 0
    capsys.readouterr()
    argv = [a.format(tmp=tmp_path) for a in argv]
    for db in (str(path), f"sqlite:///{path}"):
        assert main([*argv, "--db", db]) == 2
        line = _one_line(capsys)
        assert f"run `specfinops bench --workload code --mode both --db '{path}'` to measure" in line, line


def test_the_empty_store_hint_leaves_out_the_default_store(tmp_path, monkeypatch, capsys):
    """Without --db, or with the store a bench records into without one ($SPECFINOPS_DB_URL, else
    var/specfinops.db), the hint needs no --db."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPECFINOPS_DB_URL", raising=False)
    assert main(["db", "upgrade"]) == 0
    capsys.readouterr()
    for argv in (["cost"], ["cost", "--db", "var/specfinops.db"], ["cost", "--db", str(tmp_path / "var" / "specfinops.db")]):
        assert main(argv) == 2
        assert "run `specfinops bench --workload code --mode both` to measure" in _one_line(capsys)
    monkeypatch.setenv("SPECFINOPS_DB_URL", str(tmp_path / "env.db"))
    assert main(["db", "upgrade"]) == 0
    capsys.readouterr()
    assert main(["cost"]) == 2  # the environment's store: a bench without --db records there too
    assert "run `specfinops bench --workload code --mode both` to measure" in _one_line(capsys)
    assert main(["cost", "--db", "var/specfinops.db"]) == 2  # not the environment's: named
    assert "--mode both --db var/specfinops.db` to measure" in _one_line(capsys)


def test_the_empty_store_hint_masks_a_password():
    from types import SimpleNamespace

    from sqlalchemy.engine import make_url

    from telemetry.queries import empty_store_hint

    engine = SimpleNamespace(url=make_url("postgresql+psycopg://ops:s3cret@db.example:5432/finops"))
    hint = empty_store_hint(engine)
    assert "s3cret" not in hint
    # as the user writes it (postgresql://, not the driver's name), the masked password said
    assert "--db 'postgresql://ops:***@db.example:5432/finops'` (*** is its password) to measure" in hint, hint


def test_no_measured_tokens_names_the_store_given(tmp_path, monkeypatch):
    from telemetry.costing import project_from_store

    monkeypatch.delenv("SPECFINOPS_DB_URL", raising=False)
    path = tmp_path / "other.db"
    engine = open_store(str(path))
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(0, ttft_ms=None, e2e_ms=None)])
        s.commit()
    with pytest.raises(ValueError, match="no measured runs with output tokens") as err:
        project_from_store(engine, daily_tokens=1e6, peak_factor=2, sla_ms=50, node_hourly_usd=3)
    assert f"--mode both --db {path}`" in str(err.value)


def test_a_store_written_by_a_newer_version(tmp_path, capsys):
    path = tmp_path / "newer.db"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        c.execute("INSERT INTO alembic_version VALUES ('f00dfeed')")
    assert main(["cost", "--db", str(path)]) == 2
    assert "unknown to this specfinops" in _one_line(capsys)
    assert main(["db", "current", "--db", str(path)]) == 0
    assert "unknown revision" in capsys.readouterr().out  # not "behind head": it is ahead


def test_export_of_an_unknown_run_fails_and_a_bad_store_keeps_the_old_file(store, tmp_path, capsys):
    out = tmp_path / "o.csv"
    assert main(["export", "--what", "requests", "--run", "777", "--out", str(out), "--db", store]) == 2
    assert "no run 777" in _one_line(capsys) and not out.exists()
    keep = tmp_path / "keep.csv"
    keep.write_text("precious\n")
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite" * 100)
    assert main(["export", "--what", "requests", "--out", str(keep), "--db", str(junk)]) == 2
    assert keep.read_text() == "precious\n"
    capsys.readouterr()


@pytest.mark.parametrize(("argv", "needle"), [
    (["cost", "--run", "99999999999999999999999"], "must be a run id"),
    (["export", "--what", "requests", "--out", "-", "--run", "-3"], "must be a run id"),
    (["prices", "set", "H100", "5.5", "--source", "quote", "--as-of", "2026-13-45"], "--as-of must be a date"),
    (["distill", "--out", "/tmp/never", "--threads", "0"], "must be a positive integer"),
    (["bench", "--json", "{tmp}", "--limit", "1"], "is a directory"),
    (["bench", "--json", "/proc/specfinops/x.json", "--limit", "1"], "cannot make its directory"),
    (["loadtest", "--url", "http://127.0.0.1:99999"], "Port out of range"),
    (["loadtest", "--url", "http://[::1"], "Invalid IPv6 URL"),
    (["dashboard", "--host", "nohost.invalid"], "not an address this machine can listen on"),
    (["report", "--period", "custom", "--since", "1970-01-01", "--until", "2030-01-01", "--history", "366",
      "--out", "{tmp}/r"], "outside the range of dates"),
    (["report", "--period", "weekly", "--since", "9999-12-30", "--out", "{tmp}/r"], "outside the range of dates"),
    # the option that reached outside years 1-9999 is named: the period of --since 9999-12-31 itself (it blamed
    # --history, which was the default), the --history periods before a report near year 1
    (["report", "--period", "daily", "--since", "9999-12-31", "--out", "{tmp}/r"],
     "--since 9999-12-31 00:00 UTC: the daily period from it reaches outside the range of dates (years 1-9999)"),
    (["report", "--period", "monthly", "--since", "9999-12-01", "--out", "{tmp}/r"],
     "--since 9999-12-01 00:00 UTC: the monthly period from it reaches outside the range of dates"),
    (["report", "--period", "daily", "--until", "0001-01-01", "--out", "{tmp}/r"],
     "--until 0001-01-01 00:00 UTC: the daily period up to it reaches outside the range of dates"),
    (["report", "--period", "daily", "--since", "0001-01-03", "--out", "{tmp}/r"],
     "--history 7: the 7 daily periods before the report's (0001-01-03 00:00 to 0001-01-04 00:00 UTC) reach outside"),
    (["export", "--what", "requests", "--out", "-", "--until", "9999-12-31T23:59:59-05:00"], "out of the range"),
    # past any real traffic: an OverflowError that named no option, or node counts 300 digits long
    (["project", "--daily-tokens", "5e8", "--peak-factor", "1e308", "--p95-tpot-sla-ms", "50"],
     "--peak-factor must be at most 100, got '1e308'"),
    (["project", "--daily-tokens", "1e300", "--peak-factor", "2", "--p95-tpot-sla-ms", "50"],
     "--daily-tokens must be at most 1e+14"),
    (["project", "--daily-tokens", "5e8", "--peak-factor", "2", "--p95-tpot-sla-ms", "1e400"],
     "--p95-tpot-sla-ms must be a finite number, got '1e400'"),
    (["report", "--period", "daily", "--out", "{tmp}/r", "--daily-tokens", "1e15"], "--daily-tokens must be at most"),
    (["project", "--daily-tokens", "5e8", "--peak-factor", "2", "--p95-tpot-sla-ms", "1e300"],
     "--p95-tpot-sla-ms must be at most 1e+06"),  # the dashboard's SLA chart ran its axis to 1e300
    (["invocations", "--limit", "99999999999999999999"], "must be at most 2147483647"),  # no SQL INTEGER holds it
    # a whole node's cost over a fraction of a token a day: "$inf" and JSON Infinity
    (["project", "--daily-tokens", "1e-305", "--peak-factor", "1", "--p95-tpot-sla-ms", "100"],
     "--daily-tokens must be >= 1, got '1e-305'"),
    (["report", "--period", "daily", "--out", "{tmp}/r", "--daily-tokens", "0.5"], "--daily-tokens must be >= 1"),
])
def test_bad_input_is_one_line(argv, needle, empty_store, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in argv]
    try:
        rc = main([*argv, "--db", empty_store])
    except SystemExit as exc:  # argparse's own errors: usage and one line
        rc = exc.code
    assert rc == 2
    assert needle in _one_line(capsys)


def test_a_busy_port_is_named_before_the_dashboard_starts(empty_store, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert main(["dashboard", "--db", empty_store, "--port", str(port)]) == 2
    assert f"127.0.0.1:{port} is in use" in _one_line(capsys)


def test_an_unforeseen_error_is_one_line_and_verbose_shows_the_traceback(monkeypatch, sqlite_url, capsys):
    import app.commands.cost as cost

    def boom(args):
        raise KeyError("surprise")

    monkeypatch.setattr(cost, "run_cost_command", boom)
    argv = ["cost", "--db", sqlite_url]
    assert main(argv) == 1
    line = _one_line(capsys)
    assert "KeyError" in line and "surprise" in line and "--verbose" in line
    # where --verbose goes: before the command (`specfinops cost ... --verbose` is an unrecognized argument)
    assert line.endswith("(run `specfinops --verbose cost ...` for the traceback)"), line
    with pytest.raises(KeyError):
        main(["--verbose", *argv])


def test_serve_checks_its_port_and_store_before_loading_a_model(sqlite_url, tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert main(["serve", "--db", sqlite_url, "--port", str(port)]) == 2
    assert "is in use" in _one_line(capsys)
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite" * 100)
    assert main(["serve", "--db", str(junk), "--port", "0"]) == 2
    assert "file is not a database" in _one_line(capsys)


def test_a_home_relative_sqlite_path_is_expanded(monkeypatch, tmp_path):
    from telemetry.db import resolve_db_url

    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_db_url("~/a.db") == f"sqlite:///{tmp_path}/a.db"
    assert resolve_db_url("sqlite:///~/b.db") == f"sqlite:///{tmp_path}/b.db"
    assert resolve_db_url("sqlite:///rel/c.db") == "sqlite:///rel/c.db"


def test_bench_checks_its_store_before_loading_a_model(tmp_path, capsys):
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite" * 100)
    assert main(["bench", "--limit", "1", "--db", str(junk)]) == 2
    assert "file is not a database" in _one_line(capsys)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def test_a_loadtest_with_no_server_up_creates_no_store(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPECFINOPS_DB_URL", raising=False)
    url = f"http://127.0.0.1:{_free_port()}"
    assert main(["loadtest", "--url", url, "--duration", "1"]) == 2
    assert f"cannot reach {url}" in _one_line(capsys)
    assert list(tmp_path.iterdir()) == []  # no var/specfinops.db


@pytest.mark.parametrize("action", [["check"], ["downgrade", "base"]])
def test_db_check_or_downgrade_of_a_missing_file_creates_nothing(action, tmp_path, capsys):
    missing = tmp_path / "nope.db"
    assert main(["db", *action, "--db", f"sqlite:///{missing}"]) == 2
    assert "no such file (no store yet)" in _one_line(capsys)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["bench", "serve"])
@pytest.mark.parametrize(("extra", "needle"), [
    (["--power", "solar"], "--power must be one of auto | nvml | rapl | estimate | none, got 'solar'"),
    (["--power", "estimate", "--tdp-w", "-5"], "--tdp-w must be > 0 watts, got -5"),
    (["--tdp-w", "0"], "--tdp-w must be > 0 watts, got 0"),
    (["--power", "estimate"], "--power estimate needs --tdp-w"),
    (["--max-len", "0"], "argument --max-len: must be >= 3 tokens, got '0'"),
])
def test_bench_and_serve_check_power_and_max_len_before_loading_a_model(command, extra, needle, monkeypatch,
                                                                         capsys):
    import serving.server_setup
    import serving.worker

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(serving.worker, "load", no_load)
    monkeypatch.setattr(serving.server_setup, "load", no_load)
    argv = [command, "--no-telemetry", *extra] + (["--port", "0"] if command == "serve" else ["--limit", "1"])
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors: usage and one line
        rc = exc.code
    assert rc == 2
    assert needle in _one_line(capsys)


@pytest.mark.parametrize(("db", "needle"), [
    ("", "argument --db: must be a database URL or a SQLite file path, got ''"),
    ("postgresql://postgres@127.0.0.1:notaport/x", "argument --db: the port must be a number 1-65535, got 'notaport'"),
    ("postgresql://u:secret@[::1]:70000/x", "argument --db: the port must be a number 1-65535, got '70000'"),
    # argparse said only "argument --db: invalid db_url value: '...'" (urlsplit's ValueError), the password too
    ("postgresql://u:secret@[::1/x", "argument --db: malformed URL: a '[' without its ']' or a ']' without its '['"),
    ("postgresql://u:secret@::1]:5432/x", "argument --db: malformed URL: a '[' without its ']'"),
])
def test_a_db_option_that_names_no_store_is_refused_as_given(db, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # an empty --db used to fall back to ./var/specfinops.db
    with pytest.raises(SystemExit) as exc:
        main(["prices", "set", "H100", "2.5", "--source", "quote", "--db", db])
    assert exc.value.code == 2
    line = _one_line(capsys)
    assert needle in line and "secret" not in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("env", "needle"), [
    ("postgresql://u:secret@127.0.0.1:abc/y", "SPECFINOPS_DB_URL: the port must be a number 1-65535, got 'abc'"),
    ("postgresql://u:secret@127.0.0.1:70000/y", "SPECFINOPS_DB_URL: the port must be a number 1-65535, got '70000'"),
    ("postgresql://u:secret@[::1/y",
     "SPECFINOPS_DB_URL: malformed URL: a '[' without its ']' or a ']' without its '['"),
], ids=["port-abc", "port-70000", "bracket"])
@pytest.mark.parametrize("argv", [["cost"], ["db", "current"], ["prices", "set", "H100", "2.5", "--source", "quote"]],
                         ids=lambda a: a[0])
def test_a_malformed_db_url_variable_is_refused_naming_it(env, needle, argv, tmp_path, monkeypatch, capsys):
    """SPECFINOPS_DB_URL is checked as --db is: the same URLs said only "invalid literal for int() with base 10:
    'abc'" (or ':1'), naming neither the variable nor what was wrong; the password is never repeated."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECFINOPS_DB_URL", env)
    assert main(argv) == 2
    line = _one_line(capsys)
    assert needle in line and "secret" not in line and "int()" not in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["cost"], ["db", "current"], ["prices", "set", "H100", "2.5", "--source", "quote"],
                                  ["db", "upgrade"]], ids=lambda a: " ".join(a[:2]))
def test_a_blank_db_url_variable_is_refused_naming_it(argv, tmp_path, monkeypatch, capsys):
    """SPECFINOPS_DB_URL of spaces names no store, as `--db "   "` does not: `prices set` made a SQLite file named
    by the three spaces. Refused, naming the variable and what an empty one means; nothing is created."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECFINOPS_DB_URL", "   ")
    assert main(argv) == 2
    line = _one_line(capsys)
    assert "SPECFINOPS_DB_URL: must be a database URL or a SQLite file path, got '   '" in line, line
    assert "set it empty, for the default store var/specfinops.db" in line, line
    assert list(tmp_path.iterdir()) == []


def test_an_empty_db_url_variable_counts_as_unset(tmp_path, monkeypatch, capsys):
    """`SPECFINOPS_DB_URL=` (a shell's, a compose file's `${SPECFINOPS_DB_URL:-}`): the default store, as unset."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECFINOPS_DB_URL", "")
    assert main(["db", "current"]) == 0
    assert capsys.readouterr().out.startswith("sqlite:///var/specfinops.db: no such file (no store yet)")
    assert main(["prices", "set", "H100", "2.5", "--source", "quote"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["var"] and (tmp_path / "var" / "specfinops.db").is_file()


def test_the_db_url_variable_takes_libpq_postgres_scheme(monkeypatch):
    from telemetry.db import resolve_db_url

    monkeypatch.setenv("SPECFINOPS_DB_URL", "postgres://u@h:5433/d")
    assert resolve_db_url() == "postgresql+psycopg://u@h:5433/d"


@pytest.mark.parametrize("argv", [
    ["prices", "set", "H100", "5", "--source", "x"], ["db", "upgrade"], ["calibrate"], ["serve", "--port", "0"],
], ids=lambda a: a[0])
@pytest.mark.parametrize(("db", "folder"), [("/proc/x.db", "its folder /proc is not writable"),
                                            ("sqlite:////proc/x.db", "its folder /proc is not writable"),
                                            ("/proc/sub/x.db", "its folder /proc/sub cannot be made: /proc is not "
                                                               "writable")], ids=["path", "url", "sub"])
def test_a_new_store_in_a_folder_that_takes_no_file_is_named_under_db(argv, db, folder, monkeypatch, capsys):
    """SQLite says only 'unable to open database file' for a new store whose folder takes no file (an
    OperationalError, not the OSError open_db_option named): the file, the option and the folder are named. /proc
    takes no new file, for root too (a chmod 0555 folder does not stop root)."""
    import serving.worker

    def no_load(spec):
        raise AssertionError("the model was loaded before the store was checked")

    monkeypatch.setattr(serving.worker, "load", no_load)
    monkeypatch.delenv("SPECFINOPS_DB_URL", raising=False)
    assert main([*argv, "--db", db]) == 2
    line = _one_line(capsys)
    assert f"error: --db {db}: cannot create the store: {folder}" in line, line
    assert "unable to open database file" not in line, line


def test_a_new_store_in_an_unwritable_folder_from_the_variable_names_it(monkeypatch, capsys):
    monkeypatch.setenv("SPECFINOPS_DB_URL", "/proc/x.db")
    assert main(["prices", "set", "H100", "5", "--source", "x"]) == 2
    line = _one_line(capsys)
    assert "SPECFINOPS_DB_URL /proc/x.db: cannot create the store: its folder /proc is not writable" in line, line


def test_libpq_postgres_scheme_is_taken_as_postgresql():
    from app.commands._common import db_url
    from telemetry.db import resolve_db_url

    assert db_url("postgres://u@h:5433/d") == "postgresql://u@h:5433/d"
    assert resolve_db_url(db_url("postgres://u@h:5433/d")).startswith("postgresql+psycopg://")
    assert db_url("runs.db") == "runs.db"


def test_serve_names_max_batch_not_concurrency(capsys):
    from serving.server_setup import ServeOptions
    from serving.worker import EngineSpec

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--no-telemetry", "--port", "0", "--max-batch", "0"])
    assert exc.value.code == 2 and "argument --max-batch: must be a positive integer, got '0'" in _one_line(capsys)
    with pytest.raises(ValueError, match="--max-batch must be >= 1, got 0"):
        ServeOptions(spec=EngineSpec(max_batch=0)).validate()


@pytest.mark.parametrize("temperature", ["-1", "2.5", "nan"])
def test_loadtest_checks_its_temperature(temperature, capsys):
    assert main(["loadtest", "--no-telemetry", "--duration", "1", "--temperature", temperature]) == 2
    assert "--temperature must be within [0, 2]" in _one_line(capsys)


def test_verbose_keeps_an_expected_error_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope.db"
    assert main(["-v", "cost", "--db", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"no store at {missing}" in err.strip().splitlines()[-1]


@pytest.mark.parametrize(("argv", "usage"), [
    (["cost", "--db", "X", "--bogus-flag"], "usage: specfinops cost "),
    (["db", "upgrade", "--bogus-flag"], "usage: specfinops db upgrade "),
    (["models", "list", "--bogus-flag"], "usage: specfinops models list "),  # was under `specfinops models`
    (["models", "pull", "--bogus-flag"], "usage: specfinops models pull "),
    (["models", "path", "--bogus-flag"], "usage: specfinops models path "),
    (["models", "--bogus-flag"], "usage: specfinops models "),
    (["--bogus-flag", "cost"], "usage: specfinops [-h]"),
])
def test_an_unknown_option_is_named_under_its_commands_usage(argv, usage, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith(usage) and "unrecognized arguments: --bogus-flag" in err, err


def test_every_command_and_action_names_unknown_options_under_its_own_usage():
    """app.cli names an unknown option under the usage of the parser it followed (args.command_parser); an action
    added without it (`models list`) fell back to its parent's usage. Every parser that runs something sets it."""
    import argparse

    from app.cli import build_parser

    def parsers(p: argparse.ArgumentParser):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    yield child
                    yield from parsers(child)

    found = list(parsers(build_parser()))
    assert any(p.prog == "specfinops models list" for p in found)
    assert [p.prog for p in found if p.get_default("command_parser") is not p] == []


@pytest.mark.parametrize("argv", [
    ["prices", "set", "newgpu", "3", "--source", "x"],
    ["prices", "set", "H100", "3", "--source", "x", "--as-of", "someday"],
    ["prices", "set", "H100", "0", "--source", "x"],
    ["prices", "set", "H100", "3", "--source", "x", "--kind", "node"],  # a default's kind cannot change
    ["prices", "set", "L4", "3", "--source", "x", "--kind", "pue"],
])
def test_a_failed_prices_set_creates_no_store(argv, tmp_path, capsys):
    assert main([*argv, "--db", f"sqlite:///{tmp_path / 'new.db'}"]) == 2
    _one_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_prices_list_filters_by_kind_and_refuses_what_it_does_not_take(empty_store, capsys):
    assert main(["prices", "list", "--kind", "gpu", "--json", "--db", empty_store]) == 0
    assert {e["kind"] for e in json.loads(capsys.readouterr().out)} == {"gpu"}
    for extra in (["extra"], ["--source", "x"], ["--kind", "spaceship"]):
        assert main(["prices", "list", *extra, "--db", empty_store]) == 2
        _one_line(capsys)
    assert main(["prices", "set", "electricity", "0", "--source", "own solar", "--db", empty_store]) == 0
    assert "electricity (electricity) = 0 usd_per_kwh" in capsys.readouterr().out


@pytest.mark.parametrize("backend", ["torch", "vllm"])
def test_a_node_id_longer_than_the_column_is_refused_before_a_model_loads(backend, pg_url, monkeypatch, capsys):
    """A 200-character --node-id was accepted, then PostgreSQL refused the first run after ~57 s of model
    loading: 'cannot use the database: value too long for type character varying(128)', naming no option."""
    import serving.worker

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before --node-id was checked")

    monkeypatch.setattr(serving.worker, "load", no_load)
    monkeypatch.setattr(serving.worker, "run_info", no_load)
    try:
        rc = main(["bench", "--backend", backend, "--limit", "1", "--db", pg_url, "--node-id", "n" * 200])
    except SystemExit as exc:  # argparse's own errors: usage and one line
        rc = exc.code
    assert rc == 2
    line = _one_line(capsys)
    assert "argument --node-id: must be at most 128 characters (the store's runs.node_id), got 200" in line, line


def test_a_node_id_of_the_column_length_is_accepted():
    from app.commands.bench import node_id

    assert node_id("n" * 128) == "n" * 128


@pytest.mark.parametrize("command", [["serve"], ["loadtest", "--url", "http://127.0.0.1:9"]])
def test_serve_and_loadtest_refuse_a_node_id_longer_than_the_column(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*command, "--node-id", "n" * 200])
    assert exc.value.code == 2
    assert "argument --node-id: must be at most 128 characters" in capsys.readouterr().err


def _no_model_or_load(monkeypatch):
    """A model load or a load test's first level fails the test: the store is to be refused before either."""
    import serving.loadtest
    import serving.server_setup
    import serving.worker

    def no_load(*a, **kw):
        raise AssertionError("the work began before the store was found read-only")

    async def server_up(spec, prompts=()):
        return {"id": spec.model or "m"}

    monkeypatch.setattr(serving.worker, "load", no_load)
    monkeypatch.setattr(serving.server_setup, "load", no_load)
    monkeypatch.setattr(serving.loadtest, "probe_server", server_up)  # a server that answers
    monkeypatch.setattr(serving.loadtest, "run_loadtest", no_load)


RECORDING_COMMANDS = {"bench": ["bench", "--limit", "1", "--max-new-tokens", "2", "--mode", "ar"],
                      "serve": ["serve", "--port", "0"],
                      "loadtest": ["loadtest", "--url", "http://127.0.0.1:9", "--duration", "1"]}


@pytest.mark.parametrize("command", list(RECORDING_COMMANDS))
def test_a_recording_command_refuses_a_read_only_store_before_its_work(command, db_url, read_only_url, tmp_path,
                                                                        monkeypatch, capsys):
    """A read-only store at head opens fine: bench loaded its model (minutes for a real target) and only then
    failed 'cannot use the database: attempt to write a readonly database'; a load test ran its first level
    first, a server loaded its model. The store is now made to take one write (rolled back) when opened, and
    refused under --db before any of that; a command that only reads it still does."""
    engine = open_store(db_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(400, ttft_ms=100, e2e_ms=9000, start_s=0.0)])
        s.commit()
    engine.dispose()
    ro = read_only_url(db_url)
    _no_model_or_load(monkeypatch)
    json_out = tmp_path / "out.json"
    extra = [] if command == "serve" else ["--json", str(json_out)]
    assert main([*RECORDING_COMMANDS[command], *extra, "--db", ro]) == 2
    line = _one_line(capsys)
    assert f"specfinops {command}: error: --db " in line and ": not writable: " in line, line
    assert "attempt to write a readonly database" in line or "read-only transaction" in line, line
    assert "--no-telemetry" in line and not json_out.exists()
    assert main(["cost", "--db", ro]) == 0  # reading is what a read-only store is for
    capsys.readouterr()


@pytest.mark.parametrize(("argv", "says"), [
    (["report", "--period", "daily", "--since", "2026-11-02"], "records each report there"),
    (["prices", "set", "L4", "0.9", "--source", "quote"], "keeps the price catalog there"),
])
def test_a_command_that_writes_a_record_names_a_read_only_store_before_its_work(argv, says, db_url, read_only_url,
                                                                               tmp_path, capsys):
    """`report` (it records each report) and `prices set` gave the database's bare 'attempt to write a readonly
    database' (report after writing its files); they are refused when the store is opened, saying what they
    write there, and no report folder is made."""
    engine = open_store(db_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(400, ttft_ms=100, e2e_ms=9000, start_s=0.0)])
        s.commit()
    engine.dispose()
    out = ["--out", str(tmp_path / "reports")] if argv[0] == "report" else []
    assert main([*argv, *out, "--db", read_only_url(db_url)]) == 2
    line = _one_line(capsys)
    assert ": not writable: " in line and f"this command {says}" in line and "--no-telemetry" not in line, line
    assert not (tmp_path / "reports").exists()


@pytest.mark.postgres
def test_a_role_granted_the_table_its_command_writes_passes_the_write_check(pg_url, pg_reader, tmp_path, capsys):
    """The write check tries the table the command writes: a reporting role (SELECT, and writes on reports) may
    run `report`, a price editor (writes on prices) `prices set`; each was refused as 'permission denied for table
    runs', which neither writes. A role without its table is refused naming it."""
    from sqlalchemy import create_engine, text

    engine = open_store(pg_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(400, ttft_ms=100, e2e_ms=9000, start_s=0.0)])
        s.commit()
    engine.dispose()
    report = ["report", "--period", "daily", "--since", "2026-11-02", "--out", str(tmp_path / "r")]
    prices = ["prices", "set", "L4", "0.9", "--source", "quote"]
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    try:
        for argv, table, other in ((report, "reports", prices), (prices, "prices", report)):
            role, url = pg_reader()
            with admin.connect() as c:
                c.execute(text(f'GRANT INSERT, UPDATE, DELETE ON {table} TO "{role}"'))
                c.execute(text(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO "{role}"'))
            assert main([*argv, "--db", url]) == 0, capsys.readouterr().err
            capsys.readouterr()
            assert main([*other, "--db", url]) == 2
            line = _one_line(capsys)
            assert "not writable: permission denied for table" in line and f"table {table}" not in line, line
    finally:
        admin.dispose()


@pytest.mark.postgres
def test_a_role_that_may_only_read_the_store_is_refused_before_a_model_loads(pg_url, pg_reader, monkeypatch,
                                                                              capsys):
    """The write a recording command checks for is one the role must be granted too: a role with SELECT only
    is told so under --db before bench loads anything."""
    open_store(pg_url).dispose()
    _, reader_url = pg_reader()
    _no_model_or_load(monkeypatch)
    assert main([*RECORDING_COMMANDS["bench"], "--db", reader_url]) == 2
    line = _one_line(capsys)
    assert ": not writable: permission denied for table runs" in line, line


def test_the_write_check_changes_nothing_and_takes_a_store_another_process_is_writing(sqlite_url):
    """The check inserts no row and rolls back; a SQLite store locked by another writer past the busy timeout is
    writable (its lock is no refusal), not refused as read-only."""
    from sqlalchemy import create_engine, func, select

    from telemetry.db import Run
    from telemetry.store import refuse_unless_writable

    engine = open_store(sqlite_url, to_write=True)
    with engine.connect() as c:
        assert c.execute(select(func.count(Run.id))).scalar() == 0
    engine.dispose()
    path = sqlite_url.removeprefix("sqlite:///")
    writer = sqlite3.connect(path)
    impatient = create_engine(sqlite_url, connect_args={"timeout": 0.05})
    try:
        writer.execute("BEGIN IMMEDIATE")  # holds the write lock
        refuse_unless_writable(impatient, sqlite_url)  # 'database is locked': not refused
    finally:
        writer.rollback()
        writer.close()
        impatient.dispose()


@pytest.mark.parametrize("url", ["postgresql://root:Pw0rd@xyz9@127.0.0.1:5432/db",
                                 "postgres://root:Pw0rd@xyz9@127.0.0.1/db",
                                 "postgresql+psycopg://root@corp:Pw0rd@xyz9@127.0.0.1:5432/db"])
@pytest.mark.parametrize("given", ["--db", "env"])
@pytest.mark.parametrize("argv", [["cost"], ["db", "current"], ["prices", "set", "H100", "2.5", "--source", "quote"]],
                         ids=lambda a: a[0])
def test_a_db_url_whose_password_holds_an_unescaped_at_is_refused_showing_none_of_it(url, given, argv, tmp_path,
                                                                                      monkeypatch, capsys):
    """An '@' in the password (or user name) must be written %40: the URL's host was taken from after the first
    one, and the driver said `failed to resolve host 'xyz9@127.0.0.1'`, a part of the password."""
    monkeypatch.chdir(tmp_path)
    if given == "env":
        monkeypatch.setenv("SPECFINOPS_DB_URL", url)
        assert main(argv) == 2
    else:
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--db", url])
        assert exc.value.code == 2
    line = _one_line(capsys)
    assert "Pw0rd" not in line and "xyz9" not in line, line
    assert "holds an '@'" in line and "%40" in line, line
    assert ("SPECFINOPS_DB_URL: " if given == "env" else "argument --db: ") in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url, secret", [("postgresql://u:pa#ss@wordsecret@127.0.0.1/db", "wordsecret"),
                                         ("postgresql://u:p?x@y@h/db", "y@h"),
                                         ("postgresql://u:s3cr/et@x@h/db", "x@h"),
                                         ("postgresql://u:p?x@y@h:abc/db", "y@h")])
def test_an_at_in_a_password_after_a_hash_question_mark_or_slash_is_refused_showing_none_of_it(url, secret,
                                                                                                tmp_path, monkeypatch,
                                                                                                capsys):
    """urlsplit's netloc ends at the first '#', '?' or '/', SQLAlchemy's password at the first '@': the host
    make_url reads holds the rest of the password, which the driver then named as a host it could not resolve."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["cost", "--db", url])
    assert exc.value.code == 2
    line = _one_line(capsys)
    assert all(part not in line for part in (secret, "pa#", "p?x", "s3cr")), line
    assert "holds an '@'" in line and "%40" in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["postgresql://u:pa#ss@h:99999/db", "postgresql://u:pa?ss@h:abc/db"])
def test_a_bad_port_after_a_password_holding_a_hash_or_question_mark_is_named_without_the_password(url, capsys):
    """The port named in the message is the one make_url reads (after the '@'), not a part of the password."""
    with pytest.raises(SystemExit) as exc:
        main(["cost", "--db", url])
    assert exc.value.code == 2
    line = _one_line(capsys)
    assert "pa" not in line.split("got", 1)[-1] and "the port must be a number 1-65535" in line, line


@pytest.mark.parametrize("url", ["postgresql://u@h:5432/db?application_name=a@b", "postgresql://h:5432/db@x",
                                 "postgresql://[::1]:5432/db?application_name=a@b",
                                 "postgresql://u@[::1]/db?application_name=a@b",
                                 "postgresql+psycopg://u@h:5432/db#a@b", "postgres://u@h:5432/db?x=a@b"])
@pytest.mark.parametrize("given", ["--db", "env"])
def test_an_at_after_the_host_that_moves_the_host_make_url_reads_is_refused(url, given, tmp_path, monkeypatch,
                                                                           capsys):
    """Without a password, make_url reads a user name up to a ':' and a password up to the next '@', wherever it
    is: `postgresql://u@h:5432/db?application_name=a@b` was user 'u@h', host 'b' (the driver tried to reach 'b'
    as 'u@h'). The user, host and port make_url reads must be those of the URL's netloc (urlsplit's)."""
    monkeypatch.chdir(tmp_path)
    if given == "env":
        monkeypatch.setenv("SPECFINOPS_DB_URL", url)
        assert main(["cost"]) == 2
    else:
        with pytest.raises(SystemExit) as exc:
            main(["cost", "--db", url])
        assert exc.value.code == 2
    line = _one_line(capsys)
    assert "an '@' after the host" in line and "%40" in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["sqlite:////tmp/a@b/s.db", "/tmp/a@b/s.db", "sqlite:///rel@x.db", "runs@1.db",
                                 "postgresql://u:p@h/db@x", "postgresql://u:p@h/db?host=/var/run@x",
                                 "postgresql:///db?host=/var/run@x", "postgresql://u:p%40ss@h/db",
                                 "postgresql:///test?host=/var/run/postgresql", "postgresql://u@h/db?application_name=a@b",
                                 "postgresql://u@h:5432/db?application_name=a%40b", "postgresql://h:5432/db%40x",
                                 "postgresql://u:p@[::1]:5432/db?application_name=a@b", "postgresql://[::1]/db",
                                 "postgresql://u@[fe80::1]:5433/db", "postgresql+psycopg://u:p@H.example:5/db@x",
                                 "postgresql://u:p/ss@h/db"])
def test_an_at_outside_the_user_name_and_password_or_written_as_pct40_is_accepted(url):
    from telemetry.db import checked_db_url

    assert checked_db_url(url) == url


def test_the_readme_says_an_at_in_the_user_name_or_password_is_written_pct40(capsys):
    from pathlib import Path

    with pytest.raises(SystemExit):
        main(["cost", "--db", "postgresql://u:p@ss@h/db"])
    line = _one_line(capsys)
    rule = line[line.index("the user name or password"):]
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8").split())
    assert rule in readme, rule


@pytest.mark.parametrize(("argv", "said"), [
    (["bench", "--workload", "code", "--limt", "2"], "unrecognized arguments: --limt 2 (--limt: did you mean --limit?)"),
    (["bench", "--mdoe=both"], "(--mdoe: did you mean --mode?)"),
    (["--verbse", "cost"], "(--verbse: did you mean --verbose?)"),
    (["export", "--wat", "requests", "--out", "x.csv"],
     "the following arguments are required: --what (--wat was given: did you mean --what?)"),
    (["bnech"], "invalid choice: 'bnech'"),
    (["models", "verfy"], "(did you mean verify?)"),
])
def test_a_misspelt_option_or_command_gets_the_nearest_name(argv, said, capsys):
    """Python 3.11's argparse suggests nothing: `--limt 2` got the whole usage and 'unrecognized arguments', and
    `export --wat requests` only 'the following arguments are required: --what'."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and said in err.strip().splitlines()[-1], err
    if argv == ["bnech"]:
        assert err.strip().endswith("(did you mean bench?)"), err


def test_an_unknown_option_with_nothing_near_gets_no_suggestion(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["cost", "--db", "X", "--zzzz"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "did you mean" not in err and "unrecognized arguments: --zzzz" in err, err


@pytest.mark.parametrize(("argv", "said"), [
    (["bench", "--no-telem"], "unrecognized arguments: --no-telem (--no-telem: options are written in full: "
                              "--no-telemetry?)"),
    (["project", "--run", "3"], "unrecognized arguments: --run 3"),
    (["scheduler", "--nope"], "unrecognized arguments: --nope"),
])
def test_a_cut_short_option_is_named_in_full_and_no_far_one_is_suggested(argv, said, capsys):
    """`bench --no-telem` got "did you mean --interleave?" (an option it cuts short was never suggested),
    `project --run 3` and `scheduler --nope` "did you mean --pue?" (the `--` every option shares lifted difflib's
    ratio past its cutoff). A name cut short within a word is named in full; one naming whole words of a longer
    option (`--run` of `--run-kind`) is another option and gets nothing, as a name with nothing near."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and last.endswith(said), last
    if "written in full" not in said:
        assert "did you mean" not in last and "--pue" not in last and "--run-kind" not in last, last


def test_a_parser_used_outside_main_suggests_from_the_words_it_parses(monkeypatch, capsys):
    """build_parser() used outside main (a test, another program) suggested from sys.argv, or an earlier main
    call's words: `report --out x` with sys.argv ['pytest', '--perod', 'x'] said "(--perod was given: did you
    mean --period?)". Suggestions come from the words the parse was given."""
    from app.cli import build_parser

    monkeypatch.setattr(sys, "argv", ["pytest", "--perod", "x"])
    with pytest.raises(SystemExit):
        main(["export", "--perod", "x"])  # an earlier call's words
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["report", "--out", "x"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--perod" not in err and "required" in err, err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["report", "--out", "x", "--perod", "7d"])
    assert "--perod" in capsys.readouterr().err


def test_building_the_parser_stays_light():
    """Suggestions import difflib only when there is an error to suggest for: building the parser imports no torch,
    no model code and no difflib."""
    code = ("import sys; from app.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'serving.models', 'difflib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out

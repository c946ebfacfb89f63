"""`specfinops db`: what it says about a store it cannot or should not change."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from app.cli import main as cli_main
from telemetry.store import head_revision, open_store

REPO = Path(__file__).resolve().parents[1]


def _revision(url: str) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return c.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def _unprivileged(argv: list[str]) -> list[str]:
    """argv run without the right to write where the file modes forbid it (root ignores them)."""
    if os.geteuid() != 0:
        return argv
    if shutil.which("capsh") is None:
        pytest.skip("running as root and capsh is not installed: cannot drop CAP_DAC_OVERRIDE")
    return ["capsh", "--drop=cap_dac_override,cap_dac_read_search", "--", "-c", shlex.join(argv)]


@pytest.mark.parametrize("command", [["db", "current"], ["prices"], ["cost"]])
def test_a_store_in_a_read_only_folder_names_the_folder(tmp_path, command):
    """Even `db current` failed with 'attempt to write a readonly database' (SQLite in WAL mode must create
    store.db-wal and -shm next to the file), naming neither the file nor its folder."""
    folder = tmp_path / "ro"
    folder.mkdir()
    store = folder / "store.db"
    open_store(f"sqlite:///{store}").dispose()  # the -wal and -shm files go with the last connection
    assert sorted(p.name for p in folder.iterdir()) == ["store.db"]
    folder.chmod(0o555)
    try:
        argv = _unprivileged([sys.executable, "-m", "app.cli", *command, "--db", str(store)])
        proc = subprocess.run(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                              text=True, timeout=120)
    finally:
        folder.chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert f"cannot use the store {store}: its folder {folder} is not writable" in line, line
    assert "store.db-wal and store.db-shm" in line and "attempt to write a readonly database" not in line


@pytest.mark.parametrize("action", [["upgrade"], ["upgrade", "0003"], ["check"], ["downgrade", "0003"]])
def test_a_store_of_a_newer_version_is_named_as_such(empty_store, action, capsys):
    """They said only "Can't locate revision identified by '0099'", where `cost` says a newer version wrote it."""
    engine = create_engine(empty_store)
    with engine.begin() as c:
        c.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    engine.dispose()
    assert cli_main(["db", *action, "--db", empty_store]) == 2
    line = _err_line(capsys)
    assert f"database is at revision '0099', unknown to this specfinops (head '{head_revision()}'); it was written " \
           "by a newer version" in line, line
    assert "Can't locate" not in line
    assert _revision(empty_store) == "0099"


def test_db_option_before_the_action(empty_store, capsys):
    """`specfinops db --db x.db current` said "argument ACTION: invalid choice: 'x.db'"."""
    assert cli_main(["db", "--db", empty_store, "current"]) == 0
    assert f"{empty_store}: revision {head_revision()}" in capsys.readouterr().out
    assert cli_main(["db", "--db", empty_store, "upgrade"]) == 0
    assert "(at head)" in capsys.readouterr().out
    assert cli_main(["db", "--db", empty_store, "current", "--db", empty_store]) == 0  # the same twice: fine
    capsys.readouterr()
    assert cli_main(["db", "--db", empty_store, "current", "--db", "other.db"]) == 2
    assert "--db given twice, before and after the action" in _err_line(capsys)


def test_upgrading_to_a_revision_the_store_is_past_says_so(db_url, capsys):
    """`db upgrade 0003` of a store at head did nothing and exited 0."""
    open_store(db_url).dispose()
    assert cli_main(["db", "upgrade", "0003", "--db", db_url]) == 2
    line = _err_line(capsys)
    assert f"the database is at revision {head_revision()}, already past 0003; `specfinops db downgrade 0003 " \
           "--db " in line, line
    assert _revision(db_url) == head_revision()
    assert cli_main(["db", "upgrade", head_revision(), "--db", db_url]) == 0  # where it is: nothing to say
    assert "(at head)" in capsys.readouterr().out
    assert cli_main(["db", "downgrade", "0003", "--db", db_url]) == 0
    assert cli_main(["db", "upgrade", "0004", "--db", db_url]) == 0  # forwards, as before
    assert _revision(db_url) == "0004"


def test_upgrading_to_base_or_to_no_revision_is_refused(db_url, capsys):
    """`db upgrade base` of a store at head did nothing and exited 0; `db upgrade ""` failed with a bare
    AssertionError from Alembic."""
    open_store(db_url).dispose()
    assert cli_main(["db", "upgrade", "base", "--db", db_url]) == 2
    assert (f"the database is at revision {head_revision()}, past base; `specfinops db downgrade base --db "
            in _err_line(capsys))
    for action in (["upgrade", ""], ["downgrade", " "]):
        assert cli_main(["db", *action, "--db", db_url]) == 2, action
        assert f"{action[0]} REV must name a revision: 'head', 'base' or one `specfinops db current` prints" \
               in _err_line(capsys)
    assert _revision(db_url) == head_revision()


def test_current_and_check_only_read_another_applications_file(tmp_path, capsys):
    """They switched any SQLite file they were pointed at to WAL (another application's, or an empty one),
    rewriting a file that a command which only looks must leave as it is, and `check` called another
    application's database one "with no schema yet" to be upgraded."""
    import sqlite3

    foreign, empty = tmp_path / "app.db", tmp_path / "empty.db"
    with sqlite3.connect(foreign) as c:
        c.execute("CREATE TABLE invoices (x)")
    empty.write_bytes(b"")
    before = foreign.read_bytes()
    assert cli_main(["db", "current", "--db", str(foreign)]) == 0
    assert "revision (none), head" in capsys.readouterr().out
    assert cli_main(["db", "check", "--db", str(foreign)]) == 2
    assert "not a specfinops store: its table invoices is not specfinops's" in _err_line(capsys)
    assert cli_main(["db", "current", "--db", str(empty)]) == 0
    assert "(no schema)" in capsys.readouterr().out
    assert cli_main(["db", "check", "--db", str(empty)]) == 2
    assert "the database has no schema yet; `specfinops db upgrade --db" in _err_line(capsys)
    assert foreign.read_bytes() == before and empty.read_bytes() == b""
    with sqlite3.connect(foreign) as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


@pytest.mark.parametrize("revision", ["nonsense", "nonsense+1"])
def test_a_failed_upgrade_leaves_no_store_file_and_no_folder_behind(tmp_path, revision, capsys):
    """`db upgrade nonsense --db new/dir/d.db` failed ("Can't locate revision") after making the folders and an
    empty store file, which every later command then took for a store. An unknown REV is refused before anything
    is made; an upgrade failing later (a relative REV Alembic cannot resolve) removes what it made."""
    store = tmp_path / "new" / "dir" / "d.db"
    assert cli_main(["db", "upgrade", revision, "--db", f"sqlite:///{store}"]) == 2
    assert f"Can't locate revision identified by '{revision.split('+')[0]}'" in _err_line(capsys)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "new").mkdir()  # a folder that was there before stays
    assert cli_main(["db", "upgrade", revision, "--db", f"sqlite:///{store}"]) == 2
    capsys.readouterr()
    assert [p.name for p in tmp_path.iterdir()] == ["new"] and list((tmp_path / "new").iterdir()) == []


def test_upgrade_stamps_a_store_made_without_alembic(db_url, capsys):
    """A store whose tables `create_all` made (no alembic_version) is one every command opens, stamping it; but
    `db current` said "(no schema)", `db check` "no schema yet; db upgrade brings it up to date", and `db upgrade`
    then failed: "table prices already exists"."""
    from telemetry.db import Base, make_engine

    engine = make_engine(db_url)
    Base.metadata.create_all(engine)
    engine.dispose()
    assert cli_main(["db", "current", "--db", db_url]) == 0
    out = capsys.readouterr().out
    assert "revision (none)" in out and "(has the tables but no Alembic version)" in out and "no schema" not in out
    assert cli_main(["db", "check", "--db", db_url]) == 2
    line = _err_line(capsys)
    assert "the database has the tables but no Alembic version (alembic_version); `specfinops db upgrade --db " \
           in line and "stamps it, where its tables match the models, and brings it up to date" in line, line
    assert cli_main(["db", "upgrade", "--db", db_url]) == 0
    assert "(at head)" in capsys.readouterr().out
    assert _revision(db_url) == head_revision()
    assert cli_main(["db", "check", "--db", db_url]) == 0


@pytest.mark.parametrize("command", [["db", "upgrade"], ["db", "current"], ["cost"], ["prices"]])
def test_a_store_path_through_a_file_names_that_file(tmp_path, command, capsys):
    """`--db /tmp/x/file.db/x.db`, file.db a regular file, said only "File exists: /tmp/x/file.db"."""
    (tmp_path / "file.db").write_bytes(b"")
    for store in (tmp_path / "file.db" / "x.db", tmp_path / "file.db" / "a" / "b" / "x.db"):
        assert cli_main([*command, "--db", str(store)]) == 2
        line = _err_line(capsys)
        assert f"--db {store}: {tmp_path / 'file.db'} is a file, not a directory" in line, line
        assert "File exists" not in line
    assert (tmp_path / "file.db").read_bytes() == b""


def test_make_engine_names_the_file_in_the_way(tmp_path):
    from telemetry.db import make_engine

    (tmp_path / "file.db").write_bytes(b"")
    with pytest.raises(ValueError, match=f"{tmp_path / 'file.db'} is a file, not a directory"):
        make_engine(f"sqlite:///{tmp_path / 'file.db' / 'a' / 'x.db'}")


def test_a_failed_upgrade_leaves_a_store_another_process_made_meanwhile(tmp_path):
    """The clean-up of a failed upgrade of a new store removes only an empty file: a bench that made a store
    at the same path while the upgrade waited for its lock keeps it."""
    import sqlite3

    from telemetry.db import remove_new_store

    path = tmp_path / "new" / "store.db"
    path.parent.mkdir()
    with sqlite3.connect(path) as conn:
        conn.execute("create table runs (id integer)")
    remove_new_store([path.parent, path])
    assert path.is_file()
    empty = tmp_path / "other" / "store.db"
    empty.parent.mkdir()
    sqlite3.connect(empty).close()
    remove_new_store([empty.parent, empty])
    assert not empty.parent.exists()


def test_an_upgrade_to_an_earlier_revision_of_a_store_made_without_alembic_says_where_it_left_it(tmp_path, capsys):
    from telemetry.db import Base, make_engine

    url = f"sqlite:///{tmp_path / 'made.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    engine.dispose()
    assert cli_main(["db", "upgrade", "0005", "--db", url]) == 0
    assert "it was stamped there, past 0005" in capsys.readouterr().err
    assert _revision(url) == head_revision()


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_an_upgrade_waiting_for_another_writers_lock_stops_on_ctrl_c_or_sigterm(tmp_path, sig):
    """`db upgrade` waits up to 30 minutes for the write lock another process holds: the wait is made of short
    tries, so Ctrl-C stops it while the lock is still held (one wait inside SQLite's busy handler left Ctrl-C dead
    until the other writer let go), and SIGTERM as Ctrl-C does, saying so (it exited 143 saying nothing)."""
    import signal
    import sqlite3
    import time

    store = tmp_path / "store.db"
    open_store(f"sqlite:///{store}").dispose()
    holder = sqlite3.connect(store, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer, for as long as this test holds it
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "db", "upgrade", "--db", f"sqlite:///{store}"],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                                                  signal.SIG_DFL))
    try:
        waiting = proc.stderr.readline()  # the first line it says: that it waits for the other writer
        assert "is being written by another process" in waiting, waiting
        time.sleep(0.5)
        proc.send_signal(getattr(signal, f"SIG{sig}"))
        out, err = proc.communicate(timeout=60)  # stuck in the lock's wait, it would outlast the test's hold
    finally:
        if proc.poll() is None:
            proc.kill()
        holder.execute("ROLLBACK")
        holder.close()
    assert proc.returncode == 130, (proc.returncode, err)
    assert "interrupted" in err and "Traceback" not in err
    assert ("db upgrade: SIGTERM: stopping as on Ctrl-C" in err) == (sig == "TERM")
    assert _revision(f"sqlite:///{store}") == head_revision()


def _store_with_runs(url: str) -> None:
    """Two runs, three requests with steps and token events, a price, at head."""
    from sqlalchemy.orm import Session
    from synthetic import Req, make_run

    from telemetry.prices import set_price

    engine = open_store(url)
    try:
        with Session(engine) as s:
            make_run(s, "ar", requests=[Req(40, ttft_ms=10, e2e_ms=900, start_s=0.0)], with_events=True)
            make_run(s, "spec", requests=[Req(40, ttft_ms=10, e2e_ms=500, start_s=0.0),
                                          Req(20, ttft_ms=10, e2e_ms=300, start_s=1.0)], with_events=True)
            s.commit()
        set_price(engine, "H100", 2.5, source="quote")
    finally:
        engine.dispose()


def _count(url: str, table: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return c.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar()
    finally:
        engine.dispose()


def test_a_downgrade_to_base_of_a_store_with_records_needs_yes(db_url, capsys):
    """`db downgrade base` of a store holding runs dropped them all, saying nothing of it (exit 0): refused
    without --yes, saying what it would drop, nothing changed; with --yes, done, saying what it dropped."""
    _store_with_runs(db_url)
    counts = {t: _count(db_url, t) for t in ("runs", "requests", "steps", "token_events", "prices")}
    assert counts["runs"] == 2 and counts["requests"] == 3 and counts["steps"] and counts["token_events"]
    assert cli_main(["db", "downgrade", "base", "--db", db_url]) == 2
    line = _err_line(capsys)
    assert f"going to base drops 2 runs, 3 requests, {counts['steps']} steps, {counts['token_events']} token " \
           "events, 1 price: pass --yes to go ahead (nothing was changed)" in line, line
    assert _revision(db_url) == head_revision()
    assert {t: _count(db_url, t) for t in counts} == counts
    assert cli_main(["db", "downgrade", "base", "--db", db_url, "--yes"]) == 0
    out = capsys.readouterr().out
    assert f"dropped 2 runs, 3 requests, {counts['steps']} steps, {counts['token_events']} token events, 1 price\n" \
           in out, out
    assert "(no schema)" in out


@pytest.mark.parametrize(("rev", "change", "said"), [
    ("0010", "UPDATE runs SET invocation_id = 'abc'", "the invocation_id of 2 runs"),
    ("0013", "UPDATE runs SET pid = 7 WHERE id = (SELECT MIN(id) FROM runs)", "the pid, process_key of 1 run"),
    ("0009", "UPDATE requests SET top_k = 40 WHERE id = (SELECT MIN(id) FROM requests)",
     "the top_k, seed, max_new_tokens of 1 request"),
    ("0008", "UPDATE runs SET software_version = 'v' || repeat('x', 80) WHERE id = (SELECT MIN(id) FROM runs)",
     "the characters past 64 of software_version in 1 run"),
    ("0011", "UPDATE requests SET prompt_tokens = NULL", "the unknown (NULL) prompt and speculation counts of 3 "
     "requests, written as 0"),
    ("0003", "UPDATE runs SET temperature = NULL, top_k = NULL, seed = NULL, max_new_tokens = NULL",
     "the unknown (NULL) temperature, top_p of 2 runs, written as their requests' highest, else as greedy (0.0, 1.0)"),
])
def test_a_downgrade_that_drops_recorded_columns_needs_yes(db_url, rev, change, said, capsys):
    """A downgrade to an intermediate revision that drops columns holding values (or rewrites values) is refused
    without --yes too, naming them; the same downgrade of a store where they hold nothing needs none."""
    _store_with_runs(db_url)
    engine = create_engine(db_url)
    with engine.begin() as c:
        if c.dialect.name == "sqlite":
            change = change.replace("repeat('x', 80)", "printf('%.80c', 'x')")
        c.execute(text(change))
    engine.dispose()
    assert cli_main(["db", "downgrade", rev, "--db", db_url]) == 2
    line = _err_line(capsys)
    assert f"going to {rev} drops {said}: pass --yes to go ahead (nothing was changed)" in line, line
    assert _revision(db_url) == head_revision()
    assert cli_main(["db", "downgrade", rev, "--db", db_url, "--yes"]) == 0
    assert f"dropped {said}\n" in capsys.readouterr().out
    assert _revision(db_url) == rev and _count(db_url, "runs") == 2


def test_a_downgrade_that_drops_nothing_recorded_needs_no_yes(db_url, capsys):
    """Columns and tables that hold nothing: no --yes, nothing said of drops (0013's downgrade puts an index back;
    make_run records no invocation, no serve key)."""
    _store_with_runs(db_url)
    assert cli_main(["db", "downgrade", "0010", "--db", db_url]) == 0
    out = capsys.readouterr().out
    assert "dropped" not in out and "revision 0010" in out, out
    assert _count(db_url, "runs") == 2

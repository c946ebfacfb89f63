"""`specfinops export` and telemetry/export.py: streaming, header row, UTF-8, formula injection, bad input."""

from __future__ import annotations

import csv
import inspect
import io

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session
from synthetic import BASE_TIME, Req, make_run, spec_req

from app.cli import main
from telemetry.db import TokenEvent
from telemetry.export import ExportWindow, export_rows, frame_to_csv_bytes, neutralise, write_csv
from telemetry.store import open_store

FORMULA_DOMAINS = ['=HYPERLINK("x")', "+1", "-1", "@SUM(A1)", "\tTAB", "\rCR"]


def _fill(url: str, domains: list[str]) -> None:
    engine = open_store(url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(output_tokens=5, ttft_ms=10, e2e_ms=50, start_s=i, domain=d, energy_j=1.0)
                                    for i, d in enumerate(domains)], with_events=True, power_w=[100.0, 110.0])
        make_run(s, "spec", requests=[spec_req(9, k=4, accepted=4, ttft_ms=10, e2e_ms=40, domain="naïve ☃")],
                 with_events=True, started_at=BASE_TIME.replace(day=3))
        s.commit()
    engine.dispose()


def _files(folder) -> list[str]:
    """What is in `folder` beside the store (and its -wal/-shm files)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("store.db"))


def _read(path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def test_formula_named_domains_come_out_escaped(db_url, tmp_path):
    _fill(db_url, FORMULA_DOMAINS)
    out = tmp_path / "requests.csv"
    assert main(["export", "--db", db_url, "--what", "requests", "--out", str(out)]) == 0
    rows = _read(out)
    domains = [r["domain"] for r in rows if r["mode"] == "ar"]
    assert domains == ["'" + d for d in FORMULA_DOMAINS]
    assert all(not d.startswith(("=", "+", "-", "@", "\t", "\r")) for d in domains)
    # numbers stay numbers, missing stays empty, UTF-8 text survives
    assert {r["ttft_ms"] for r in rows} == {"10.0"}
    spec = [r for r in rows if r["mode"] == "spec"]
    assert spec[0]["domain"] == "naïve ☃" and spec[0]["energy_j"] == ""


def test_neutralise_leaves_safe_values_alone():
    assert neutralise("code") == "code"
    assert neutralise(-1.5) == -1.5  # a number is not a formula
    assert neutralise("-1") == "'-1"
    assert neutralise("") == ""


def test_tokens_export_is_a_lazy_stream(db_url, tmp_path):
    _fill(db_url, ["code", "chat"])
    engine = open_store(db_url)
    statements = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    header, rows = export_rows(engine, "tokens", ExportWindow())
    assert inspect.isgenerator(rows)
    assert statements == []  # nothing ran yet: rows are produced as they are consumed
    first = next(rows)
    assert len(first) == len(header) and header[:4] == ["token_event_id", "request_id", "run_id", "position"]
    rest = list(rows)
    with engine.connect() as c:
        total = c.scalar(select(func.count()).select_from(TokenEvent))
    assert 1 + len(rest) == total == 5 * 2 + 9


def test_write_csv_reports_progress_and_counts(sqlite_url):
    _fill(sqlite_url, ["code"])
    header, rows = export_rows(open_store(sqlite_url), "tokens", ExportWindow())
    buf, seen = io.StringIO(), []
    n = write_csv(buf, header, rows, progress=seen.append, progress_every=4)
    assert n == 14 and seen == [4, 8, 12]
    assert buf.getvalue().splitlines()[0] == ",".join(header)


def test_run_and_time_window_filter_rows(sqlite_url, tmp_path):
    _fill(sqlite_url, ["code", "chat"])
    out = tmp_path / "steps.csv"
    assert main(["export", "--db", sqlite_url, "--what", "steps", "--run", "2", "--out", str(out)]) == 0
    rows = _read(out)
    assert rows and {r["run_id"] for r in rows} == {"2"}
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--since", "2026-11-03", "--out", str(out)]) == 0
    assert [r["run_id"] for r in _read(out)] == ["2"]
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--until", "2026-11-03T00:00+00:00",
                 "--out", str(out)]) == 0
    assert {r["run_id"] for r in _read(out)} == {"1"}


def test_power_and_cost_exports(sqlite_url, tmp_path):
    _fill(sqlite_url, ["code"])
    out = tmp_path / "x.csv"
    assert main(["export", "--db", sqlite_url, "--what", "power", "--out", str(out)]) == 0
    power = _read(out)
    assert [float(r["power_w"]) for r in power] == [100.0, 110.0]
    assert main(["export", "--db", sqlite_url, "--what", "cost", "--out", str(out)]) == 0
    cost = _read(out)
    assert [r["mode"] for r in cost] == ["ar", "spec"]
    assert all(float(r["total_usd_per_1m"]) > 0 for r in cost)
    # a finance sheet tells a run still going, or a load test's, from a completed bench, as `cost --json` does
    with Session(engine := open_store(sqlite_url)) as s:
        make_run(s, "spec", kind="loadtest", status="running", concurrency=8,
                 requests=[spec_req(9, k=4, accepted=4, ttft_ms=10, e2e_ms=40)])
        s.commit()
    engine.dispose()
    assert main(["export", "--db", sqlite_url, "--what", "cost", "--out", str(out)]) == 0
    assert {r["run_id"]: (r["kind"], r["status"], r["concurrency"]) for r in _read(out)} == {
        "1": ("bench", "completed", "1"), "2": ("bench", "completed", "1"), "3": ("loadtest", "running", "8")}


def test_stdout_export(sqlite_url, capsys):
    _fill(sqlite_url, ["=1+1"])
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--run", "1", "--out", "-"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["domain"] for r in rows] == ["'=1+1"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--what", "bogus"], "--what must be one of"),
        (["--what", "requests", "--since", "yesterday"], "--since must be an ISO date"),
        (["--what", "requests", "--since", "2026-02-01", "--until", "2026-01-01"], "must be before --until"),
        # a folder no one can make (a missing one is made: test_export_makes_the_folders_of_out...)
        (["--what", "requests", "--out", "/dev/null/x.csv"], "--out /dev/null/x.csv: cannot make its directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(empty_store, capsys, args, needle):
    argv = ["export", "--db", empty_store, *args]
    if "--out" not in args:
        argv += ["--out", "-"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


def test_dashboard_table_download_is_escaped():
    import pandas as pd

    frame = pd.DataFrame({"domain": ["@SUM(A1)", "code"], "alpha": [0.7, None]})
    text = frame_to_csv_bytes(frame).decode("utf-8")
    assert text.splitlines() == ["domain,alpha", "'@SUM(A1),0.7", "code,"]


def _export_fails_part_way(monkeypatch):
    """export_rows made to yield one row and then fail as a database gone away does; returns the real one."""
    import telemetry.export

    real = telemetry.export.export_rows

    def failing(engine, what, window):
        header, rows = real(engine, what, window)

        def some_then_fail():
            yield next(iter(rows))
            raise OSError("the database went away")

        return header, some_then_fail()

    monkeypatch.setattr(telemetry.export, "export_rows", failing)
    return real


def test_an_export_that_fails_part_way_leaves_the_file_as_it_was(sqlite_url, tmp_path, monkeypatch, capsys):
    """Rows are written to FILE.part and renamed at the end: a failure after some rows leaves the earlier
    FILE untouched and no partial file beside it."""
    import telemetry.export

    _fill(sqlite_url, ["code", "chat"])
    out = tmp_path / "requests.csv"
    out.write_text("the previous export\n")
    real = _export_fails_part_way(monkeypatch)
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", str(out)]) != 0
    assert "the database went away" in capsys.readouterr().err
    assert out.read_text() == "the previous export\n" and _files(tmp_path) == ["requests.csv"]
    monkeypatch.setattr(telemetry.export, "export_rows", real)
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", str(out)]) == 0
    assert len(_read(out)) == 3  # _fill: 2 AR + 1 spec
    assert _files(tmp_path) == ["requests.csv"]


def test_export_leaves_a_users_part_file_alone_and_keeps_the_mode(sqlite_url, tmp_path):
    """The temporary file has a fresh name: a FILE.part of the user's own is never clobbered."""
    _fill(sqlite_url, ["code"])
    out = tmp_path / "requests.csv"
    mine = tmp_path / "requests.csv.part"
    mine.write_text("my own notes\n")
    out.write_text("old\n")
    out.chmod(0o640)
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", str(out)]) == 0
    assert mine.read_text() == "my own notes\n" and len(_read(out)) == 2
    assert out.stat().st_mode & 0o777 == 0o640


def test_export_through_a_symlink_replaces_the_file_it_points_at(sqlite_url, tmp_path):
    _fill(sqlite_url, ["code"])
    real = tmp_path / "real.csv"
    real.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(real)
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", str(link)]) == 0
    assert link.is_symlink() and len(_read(real)) == 2


def test_export_to_a_fifo_writes_through_it(sqlite_url, tmp_path):
    """A FIFO (or /dev/stdout, a device) is written to, never replaced by a regular file."""
    import os

    _fill(sqlite_url, ["code"])
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader is there: opening to write will not block
    try:
        assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", str(fifo)]) == 0
        try:
            got = os.read(reader, 1 << 16).decode()
        except BlockingIOError:
            got = ""
    finally:
        os.close(reader)
    assert fifo.is_fifo() and got.startswith("request_id,") and len(got.splitlines()) == 3  # header + 2
    assert _files(tmp_path) == ["pipe"]


@pytest.mark.parametrize("out", ["", "{tmp}"])
def test_export_refuses_an_empty_or_directory_out_before_writing(empty_store, tmp_path, capsys, out):
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["export", "--db", empty_store, "--what", "requests", "--out", out.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--out" in err and len(err.splitlines()) == 1 and "PosixPath" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_export_refuses_to_write_over_the_store_itself(sqlite_url, tmp_path, capsys):
    """`--out store.db --db store.db` (or a link to it) renamed the CSV over the store: every run was gone."""
    import os

    _fill(sqlite_url, ["code"])
    store = tmp_path / "store.db"
    os.symlink(store, tmp_path / "link.db")
    for out in (store, tmp_path / "link.db", tmp_path / "store.db-wal"):
        assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", str(out)]) == 2
        assert f"--out {out} is the store's own file" in capsys.readouterr().err
    assert store.read_bytes().startswith(b"SQLite format 3")
    assert main(["cost", "--db", sqlite_url, "--json"]) == 0


def test_out_dev_stdout_appends_where_the_shell_redirects_stdout(sqlite_url, tmp_path):
    """`export --out /dev/stdout >> log.csv` replaced log.csv (the CSV written beside it and renamed over it):
    what the shell had appended before was lost, where `--out -` keeps it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    _fill(sqlite_url, ["code"])
    log = tmp_path / "log.csv"
    log.write_text("EARLIER LINE\n")
    repo = Path(__file__).resolve().parents[1]
    with open(log, "a") as fh:
        proc = subprocess.run([sys.executable, "-m", "app.cli", "export", "--db", sqlite_url, "--what", "requests",
                               "--out", "/dev/stdout"], stdout=fh, stderr=subprocess.PIPE, text=True, cwd=repo,
                              env={**os.environ, "PYTHONPATH": str(repo)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = log.read_text().splitlines()
    assert lines[0] == "EARLIER LINE" and lines[1].startswith("request_id,") and len(lines) == 4  # + header + 2


def test_an_export_empty_in_its_time_window_says_when_the_selection_has_rows(sqlite_url, capsys):
    _fill(sqlite_url, ["code"])
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", "-", "--since", "2030-01-01"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("request_id,") and len(out.splitlines()) == 1
    assert ("export: no requests rows: none in the time window (at or after 2030-01-01 00:00:00 UTC); the "
            "selection's requests started from 2026-11-02 09:00:00 UTC to 2026-11-03 09:00:00 UTC") in err, err
    with Session(engine := open_store(sqlite_url)) as s:
        make_run(s, "ar", power_source="estimate", power_w=[90.0, 95.0], started_at=BASE_TIME.replace(day=4),
                 requests=[Req(output_tokens=5, ttft_ms=10, e2e_ms=50)])
        s.commit()
    engine.dispose()
    assert main(["export", "--db", sqlite_url, "--what", "power", "--out", "-", "--until", "2026-11-01"]) == 0
    assert ("none in the time window (before 2026-11-01 00:00:00 UTC); the selection's power samples were taken "
            "from 2026-11-02 09:00:00 UTC to 2026-11-04 09:00:00 UTC") in capsys.readouterr().err
    # a selection with no rows anywhere keeps the general line (temperature 0.5 is in the store, on an AR run of
    # another workload: a value nothing in the store has is refused, as `cost` refuses it)
    with Session(engine := open_store(sqlite_url)) as s:
        make_run(s, "ar", temperature=0.5, workload="chat", started_at=BASE_TIME.replace(day=5),
                 requests=[Req(output_tokens=5, ttft_ms=10, e2e_ms=50)])
        s.commit()
    engine.dispose()
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", "-", "--mode", "spec",
                 "--workload", "code", "--since", "2030-01-01", "--temperature", "0.5"]) == 0
    assert "none in the time window" not in capsys.readouterr().err


def test_a_write_error_names_the_out_file(sqlite_url, capsys):
    import os

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    _fill(sqlite_url, ["code"])
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", "/dev/full"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("cannot write --out /dev/full: No space left on device") and len(err.splitlines()) == 1, err


def test_an_empty_steps_export_blames_the_window_only_where_steps_lie_outside_it(sqlite_url, capsys):
    """Requests inside the window that recorded no steps read "none in the time window; the selection's requests
    started at <a time inside it>"."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(output_tokens=5, ttft_ms=10, e2e_ms=50)])  # no step or token rows
        s.commit()
    engine.dispose()
    for what in ("steps", "tokens"):
        assert main(["export", "--db", sqlite_url, "--what", what, "--out", "-", "--since", "2026-11-02T08:00",
                     "--until", "2026-11-02T10:00"]) == 0
        assert "none in the time window" not in capsys.readouterr().err, what
    _fill(sqlite_url, ["code"])  # a run with steps, at 09:00 on the 2nd and the 3rd
    assert main(["export", "--db", sqlite_url, "--what", "steps", "--out", "-", "--since", "2026-11-05"]) == 0
    assert "the selection's requests with steps started from 2026-11-02 09:00:00 UTC to 2026-11-03 09:00:00 UTC" \
        in capsys.readouterr().err


def test_a_request_without_two_tokens_has_no_tpot_and_an_empty_since_is_refused(sqlite_url, tmp_path, capsys):
    """A cancelled request keeps its times with 0 tokens: its exported tpot_ms read -200; and `--since ""` (an
    unset shell variable) exported the whole store."""
    import csv

    from sqlalchemy.orm import Session
    from synthetic import Req, make_run

    from app.cli import main
    from telemetry.store import open_store

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(0, ttft_ms=100, e2e_ms=300, status="cancelled"),
                                    Req(11, ttft_ms=100, e2e_ms=1100, start_s=1.0)])
        s.commit()
    out = tmp_path / "requests.csv"
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert sorted(r["tpot_ms"] for r in rows) == ["", "100.0"], rows
    for flag in ("--since", "--until"):
        assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", str(out), flag, ""]) == 2
        assert f"{flag} is empty" in capsys.readouterr().err


def _late_rows_store(url: str):
    """Three runs whose requests start out of id order (run 3 before run 2), and whose steps and token events
    are not in request order: request 1 gets more of each after runs 2 and 3 were recorded (as a server's
    concurrent requests interleave theirs)."""
    from telemetry.db import Step

    engine = open_store(url)
    with Session(engine) as s:
        make_run(s, "ar", with_events=True, requests=[
            Req(output_tokens=5, ttft_ms=10, e2e_ms=50, start_s=i * 600) for i in range(3)])
        make_run(s, "spec", with_events=True, started_at=BASE_TIME.replace(day=4), node_id="node-b",
                 requests=[spec_req(9, k=4, accepted=4, ttft_ms=10, e2e_ms=40, start_s=i * 60) for i in range(2)])
        make_run(s, "spec", with_events=True, started_at=BASE_TIME.replace(day=3),
                 requests=[spec_req(9, k=4, accepted=4, ttft_ms=10, e2e_ms=40)])
        s.flush()
        for i in range(3):
            s.add(TokenEvent(request_id=1, position=5 + i, emit_offset_ms=60.0 + i, step_index=5 + i, source="ar"))
            s.add(Step(request_id=1, step_index=5 + i, k=0, accepted=0, num_emitted=1, draft_ms=0.0, verify_ms=1.0,
                       batch_size=1, t_offset_ms=60.0 + i))
        s.commit()
    return engine


WINDOWS = [
    {"since": "2026-11-02T09:05"}, {"until": "2026-11-02T09:05"}, {"since": "2026-11-03", "until": "2026-11-04"},
    {"since": "2026-11-04T09:00:30"}, {"run_id": 1}, {"node_id": "node-b"}, {"mode": "spec", "until": "2026-11-04"},
    {"since": "2030-01-01"},
]


@pytest.mark.parametrize("what", ["steps", "tokens"])
def test_a_windowed_steps_or_tokens_export_holds_exactly_its_requests_rows_in_id_order(db_url, what):
    """The rows of a window or selection, read through the requests it selects, are the store's rows (in id
    order, a request's late rows included) of exactly the requests a requests export of it holds."""
    from telemetry.export import parse_when

    engine = _late_rows_store(db_url)
    header, everything = export_rows(engine, what, ExportWindow())
    everything = [tuple(r) for r in everything]
    assert [r[0] for r in everything] == sorted(r[0] for r in everything)
    for kw in WINDOWS:
        window = ExportWindow(**{k: parse_when(v, k) if k in ("since", "until") else v for k, v in kw.items()})
        chosen = {r[0] for r in export_rows(engine, "requests", window)[1]}
        _, rows = export_rows(engine, what, window)
        assert [tuple(r) for r in rows] == [r for r in everything if r[1] in chosen], kw
    engine.dispose()


def test_a_windowed_export_does_not_read_the_whole_steps_or_tokens_table(sqlite_url):
    """A narrow --since on SQLite read the whole token_events (or steps) table in id order, joining each row to
    its request to test its start (0.4 s for a minute's 1.7k token events on a 1.5M-row store, more as the
    store grows): the window's requests are found first (ix_requests_started_at), then their rows by
    ix_*_request_id. With no window the table is read in id order, as before (streamed, no sort)."""
    from telemetry.export import parse_when

    engine = _late_rows_store(sqlite_url)
    seen = []
    event.listen(engine, "before_cursor_execute", lambda c, cur, st, params, ctx, many: seen.append((st, params)))

    def plan(what: str, window: ExportWindow) -> str:
        seen.clear()
        list(export_rows(engine, what, window)[1])
        (statement, params), = seen
        with engine.connect() as c:
            return " | ".join(r[3] for r in c.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params))

    for what, table in (("steps", "steps"), ("tokens", "token_events")):
        for window in (ExportWindow(since=parse_when("2026-11-04T09:00:30", "since")),
                       ExportWindow(until=parse_when("2026-11-02T09:05", "until")), ExportWindow(node_id="node-b")):
            got = plan(what, window)
            assert f"SCAN {table}" not in got and f"INDEX ix_{table}_request_id" in got, (what, window, got)
        assert f"SCAN {table}" in plan(what, ExportWindow())
    engine.dispose()


def test_a_postgresql_export_plans_its_cursor_for_every_row(pg_url):
    """PostgreSQL plans a cursor for its first tenth of rows (cursor_tuple_fraction 0.1): on a store not yet
    analysed, one run's token export read token_events whole in id order (21 s, not 1.8 s). An export reads every
    row: its transaction says so, and only its transaction (SET LOCAL)."""
    _fill(pg_url, ["code", "chat"])
    engine = open_store(pg_url)
    in_effect = []

    def setting(conn, cursor, statement, *_):
        if statement.lstrip().startswith("SELECT token_events.id"):
            with conn.connection.dbapi_connection.cursor() as probe:
                probe.execute("SHOW cursor_tuple_fraction")
                in_effect.append(probe.fetchone()[0])

    event.listen(engine, "before_cursor_execute", setting)
    header, rows = export_rows(engine, "tokens", ExportWindow(run_id=1))
    assert len(list(rows)) == 10
    assert in_effect == ["1"]
    with engine.connect() as c:
        assert c.exec_driver_sql("SHOW cursor_tuple_fraction").scalar() == "0.1"  # the pool's connection as before
    engine.dispose()


def test_a_window_given_at_another_offset_selects_the_same_instants_on_every_store(db_url):
    """The library's windows (queries.Filters, ExportWindow, report.Window) given a time at +05:30 or a naive one
    (UTC) select the rows of that instant: SQLite keeps times as text without an offset and compared 05:30+05:30
    as 05:30 UTC (5 requests of 7 where PostgreSQL counted 7), and a report labelled the wall time 'UTC'."""
    from datetime import UTC, timedelta, timezone

    from telemetry.export import count_rows
    from telemetry.queries import Filters, mode_summaries
    from telemetry.report import Window

    engine = open_store(db_url)
    with Session(engine) as s:  # one request an hour from BASE_TIME
        make_run(s, "ar", requests=[Req(5, ttft_ms=10, e2e_ms=50, start_s=3600 * i) for i in range(8)])
        s.commit()
    ist = timezone(timedelta(hours=5, minutes=30))
    since_utc = BASE_TIME.replace(tzinfo=UTC) + timedelta(hours=1)
    since_ist = since_utc.astimezone(ist)
    for since in (since_ist, since_utc, since_utc.replace(tzinfo=None)):
        (ar,) = mode_summaries(engine, Filters(since=since))
        assert ar.stats.num_requests_ok == 7, since
        assert count_rows(engine, "requests", ExportWindow(since=since)) == 7, since
    # a naive bound beside an aware one is the UTC instant too (it was a TypeError comparing them)
    until = since_utc.replace(tzinfo=None) + timedelta(hours=2)
    assert Filters(since=since_ist, until=until).until == until.replace(tzinfo=UTC)
    window = Window("custom", since_ist, since_ist + timedelta(days=1))
    assert window.since == since_utc and window.since.utcoffset() == timedelta(0)
    with pytest.raises(ValueError, match="since must be a datetime"):
        Filters(since="2026-11-02")


def test_a_windowed_cost_csv_says_which_window_each_row_covers(sqlite_url, tmp_path):
    """A run cut by midnight is a row in each day's cost export, both with the run's started_at: each row says the
    window its figures cover (window_since, window_until; empty where unbounded), so joined daily exports keep
    each day's part on its day."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:  # BASE_TIME 09:00; requests at 23:00 and 01:00 the next day
        make_run(s, "ar", requests=[Req(5, ttft_ms=10, e2e_ms=50, start_s=3600 * h) for h in (14, 16)])
        s.commit()
    engine.dispose()
    out = tmp_path / "cost.csv"
    day = {}
    for since, until in (("2026-11-02", "2026-11-03"), ("2026-11-03", "2026-11-04")):
        assert main(["export", "--db", sqlite_url, "--what", "cost", "--since", since, "--until", until,
                     "--out", str(out)]) == 0
        (row,) = _read(out)
        day[since] = row
        assert (row["window_since"], row["window_until"]) == (f"{since}T00:00:00+00:00", f"{until}T00:00:00+00:00")
    assert day["2026-11-02"]["started_at"] == day["2026-11-03"]["started_at"]
    assert main(["export", "--db", sqlite_url, "--what", "cost", "--until", "2026-11-03", "--out", str(out)]) == 0
    (row,) = _read(out)
    assert (row["window_since"], row["window_until"]) == ("", "2026-11-03T00:00:00+00:00")


def test_an_export_removes_the_temporary_files_of_killed_exports_to_its_out(sqlite_url, tmp_path, capsys):
    """A killed export (SIGKILL, the OOM killer) left its hidden '.<out>.*.tmp' file for good, however many GB:
    the next export to that --out removes those whose writer, on this host, no longer runs and that no one has
    written to for ten minutes; a live writer's, another host's and a recent one stay."""
    import os
    import subprocess
    import sys

    from app.commands.export import _temporary_prefix

    _fill(sqlite_url, ["code"])
    out = tmp_path / "req.csv"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    mine = _temporary_prefix(str(out))
    stale = tmp_path / (mine.replace(f".{os.getpid()}.", f".{dead_pid}.") + "k1ll3d.tmp")
    live = tmp_path / (mine + "runn1n.tmp")
    elsewhere = tmp_path / (f".req.csv.another-host.{dead_pid}." + "sh4red.tmp")
    recent = tmp_path / (mine.replace(f".{os.getpid()}.", f".{dead_pid}.") + "r3cent.tmp")
    for f in (stale, live, elsewhere, recent):
        f.write_text("partial")
    hour_ago = os.stat(recent).st_mtime - 3600
    for f in (stale, live, elsewhere):
        os.utime(f, (hour_ago, hour_ago))
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", str(out)]) == 0
    assert not stale.exists() and live.exists() and elsewhere.exists()
    assert recent.exists()  # its pid gone here, but written to minutes ago: another pid namespace's, maybe
    assert f"removed {stale}" in capsys.readouterr().err
    assert len(_read(out)) == 2  # the export itself as ever


def test_out_after_an_equals_sign_expands_the_home_folder(sqlite_url, tmp_path, monkeypatch):
    """`--out=~/x.csv`: the shell expands no ~ after '=', and export wrote to a folder named '~' in the working
    folder, or failed; --db and report --out expand it."""
    _fill(sqlite_url, ["code"])
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--out=~/req.csv"]) == 0
    assert len(_read(home / "req.csv")) == 2 and list(work.iterdir()) == []


def test_rows_to_a_stdout_that_cannot_hold_them_fail_instead_of_being_escaped(sqlite_url):
    """With an ASCII stdout, `export --out -` of a value it cannot hold fails naming the character, as it did
    before the CLI escaped what it prints for people: the CSV's node_id must not silently read 'n\\u0153ud'."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", node_id="nœud-é", requests=[Req(5, ttft_ms=10, e2e_ms=50)])
        s.commit()
    engine.dispose()
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "app.cli", "export", "--db", sqlite_url, "--what", "requests",
                           "--out", "-"], cwd=root, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(root), "PYTHONIOENCODING": "ascii"})
    assert proc.returncode != 0 and b"\\u0153" not in proc.stdout, proc.stdout[-300:]
    assert b"can't encode character" in proc.stderr


@pytest.mark.parametrize("what", ["requests", "tokens"])
def test_an_export_of_an_empty_store_says_so_and_exits_0(empty_store, tmp_path, what, capsys):
    """It wrote a header-only CSV with no word, where cost, project and report say 'the store has no runs'.
    Exit 0 (docs/export.md): an empty day of a scheduled export is no failure."""
    out = tmp_path / "e.csv"
    assert main(["export", "--db", empty_store, "--what", what, "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 1  # the header
    err = capsys.readouterr().err
    assert f"export: no {what} rows in the store: the store has no runs; run `specfinops bench" in err, err
    assert "the CSV holds the header row alone" in err


def test_an_export_of_rows_no_run_recorded_says_so(sqlite_url, capsys):
    with Session(engine := open_store(sqlite_url)) as s:
        make_run(s, "ar", requests=[Req(output_tokens=5, ttft_ms=10, e2e_ms=50)])  # no step or token rows
        s.commit()
    engine.dispose()
    assert main(["export", "--db", sqlite_url, "--what", "tokens", "--out", "-"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1
    assert "export: no tokens rows in the store: its runs recorded none; the CSV holds the header row alone" in err


def test_an_export_of_one_run_that_recorded_no_rows_names_the_run_not_the_store(sqlite_url, capsys):
    """`--run N` of a run with no step rows said "no steps rows in the store: its runs recorded none" while
    another run had some: it is the run that recorded none."""
    with Session(engine := open_store(sqlite_url)) as s:
        empty = make_run(s, "ar", requests=[Req(output_tokens=5, ttft_ms=10, e2e_ms=50)]).id
        make_run(s, "spec", requests=[spec_req(9, k=4, accepted=4, ttft_ms=10, e2e_ms=40)], with_events=True)
        s.commit()
    engine.dispose()
    assert main(["export", "--db", sqlite_url, "--what", "steps", "--out", "-"]) == 0
    assert len(capsys.readouterr().out.splitlines()) > 1  # the store holds steps rows
    assert main(["export", "--db", sqlite_url, "--what", "steps", "--run", str(empty), "--out", "-"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1
    assert f"export: run {empty} recorded no steps rows; the CSV holds the header row alone" in err
    assert "in the store" not in err


def test_export_makes_the_folders_of_out_and_removes_them_if_it_fails(sqlite_url, tmp_path, monkeypatch, capsys):
    """`--out missing/dir/e.csv` failed 'No such file or directory', where report --out and bench --json make
    their folders. A failed export leaves none of the folders it made."""
    import telemetry.export

    _fill(sqlite_url, ["code"])
    real = _export_fails_part_way(monkeypatch)
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", str(tmp_path / "new/dir/e.csv")]) != 0
    assert "the database went away" in capsys.readouterr().err and _files(tmp_path) == []
    monkeypatch.setattr(telemetry.export, "export_rows", real)
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", str(tmp_path / "new/dir/e.csv")]) == 0
    assert len(_read(tmp_path / "new/dir/e.csv")) == 2
    (tmp_path / "a_file").write_text("")
    assert main(["export", "--db", sqlite_url, "--what", "requests", "--out", str(tmp_path / "a_file/e.csv")]) == 2
    assert f"--out {tmp_path / 'a_file/e.csv'}: cannot make its directory: " in capsys.readouterr().err

"""The batch recorder: complete rows on both stores, counted overflow, a locked database, SIGKILL."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from recorder_child import run_info, synthetic_request
from sqlalchemy import text

from telemetry.recorder import Recorder, RecorderError
from telemetry.records import PowerReading
from telemetry.store import open_store

REPO = Path(__file__).resolve().parents[1]
# How long the test holds the SQLite lock (the real case is 30 s; override to try that).
LOCK_S = float(os.environ.get("SPECFINOPS_TEST_LOCK_S", "2.0"))


def _scalar(engine, sql: str):
    with engine.connect() as conn:
        return conn.execute(text(sql)).scalar()


def _wait_for(predicate, what: str, limit_s: float = 60.0) -> None:
    """Poll until predicate() holds; a guard against hanging, not a timing assertion."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {limit_s} s")
        time.sleep(0.02)


def test_writes_runs_requests_steps_tokens_and_power(db_url):
    engine = open_store(db_url)
    rng = random.Random(7)
    records = [synthetic_request(rng, n) for n in (1, 2, 5, 37, 128, 300)]
    t0 = datetime.now(UTC)
    power = [PowerReading(t0 + timedelta(seconds=i), 0, 100.0 + i, None, 50.0, "estimate") for i in range(4)]
    with Recorder(engine, flush_interval_s=0.05) as rec:
        run_id = rec.start_run(run_info())
        assert _scalar(engine, f"SELECT status FROM runs WHERE id = {run_id}") == "running"
        for r in records:
            rec.record_request(run_id, r)
        rec.record_power(run_id, power)
        rec.end_run(run_id)
        assert rec.stats().num_token_events_written == sum(r.output_tokens for r in records)
    with engine.connect() as c:
        run = c.execute(text(f"SELECT status, ended_at, dropped_records FROM runs WHERE id = {run_id}")).one()
        assert run.status == "completed" and run.ended_at is not None and run.dropped_records == 0
        n_tokens = c.execute(text("SELECT count(*) FROM token_events")).scalar()
        assert n_tokens == c.execute(text("SELECT sum(output_tokens) FROM requests")).scalar()
        assert n_tokens == sum(len(r.tokens) for r in records)
        assert c.execute(text("SELECT count(*) FROM steps")).scalar() == sum(len(r.steps) for r in records)
        acc = c.execute(text("SELECT sum(accepted), sum(k) FROM steps")).one()
        assert tuple(acc) == (sum(r.num_accepted_tokens for r in records), sum(r.num_draft_tokens for r in records))
        rows = c.execute(text("SELECT output_tokens, id FROM requests ORDER BY id")).all()
        assert [n for n, _ in rows] == [r.output_tokens for r in records]  # written in order
        for n, rid in rows:  # positions 0..n-1, each once, on the right request
            pos = c.execute(text(f"SELECT position FROM token_events WHERE request_id = {rid} ORDER BY position"))
            assert [p for (p,) in pos] == list(range(n))
        assert c.execute(text("SELECT count(*) FROM power_samples WHERE source = 'estimate'")).scalar() == 4
    engine.dispose()


def test_full_buffer_drops_and_counts_into_the_run(sqlite_url, tmp_path):
    engine = open_store(sqlite_url)
    rec = Recorder(engine, max_buffered_requests=5, flush_interval_s=0.02, sqlite_busy_timeout_ms=50)
    run_id = rec.start_run(run_info())
    lock = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")  # nothing can be written: the buffer fills
    rng = random.Random(3)
    for _ in range(20):
        rec.record_request(run_id, synthetic_request(rng, 10))
    assert rec.dropped(run_id) == 15
    assert rec.buffered() == 5
    lock.execute("ROLLBACK")
    lock.close()
    rec.end_run(run_id, timeout_s=60)
    rec.close()
    assert _scalar(engine, f"SELECT dropped_records FROM runs WHERE id = {run_id}") == 15
    assert _scalar(engine, "SELECT count(*) FROM requests") == 5
    assert _scalar(engine, "SELECT count(*) FROM token_events") == 50
    engine.dispose()


def test_locked_database_does_not_block_the_caller_and_everything_is_written_after(sqlite_url, tmp_path):
    engine = open_store(sqlite_url)
    rec = Recorder(engine, flush_interval_s=0.02, sqlite_busy_timeout_ms=100, retry_max_s=0.2)
    run_id = rec.start_run(run_info())
    lock = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    rng = random.Random(5)
    expected_tokens = 0
    num_recorded = 0
    locked_until = time.monotonic() + LOCK_S
    while time.monotonic() < locked_until:  # "generation" goes on while the database is locked
        r = synthetic_request(rng, rng.randint(1, 50))
        rec.record_request(run_id, r)  # returns although the database is locked
        expected_tokens += r.output_tokens
        num_recorded += 1
        time.sleep(0.005)
    _wait_for(lambda: rec.stats().num_retries >= 2, "the writer to retry")
    stats = rec.stats()
    assert stats.num_requests_written == 0 and stats.num_buffered == num_recorded
    assert "locked" in (stats.last_error or "")
    assert lock.execute("SELECT count(*) FROM requests").fetchone()[0] == 0
    lock.execute("ROLLBACK")
    lock.close()
    rec.end_run(run_id, timeout_s=60)
    rec.close()
    assert rec.dropped(run_id) == 0
    assert _scalar(engine, "SELECT count(*) FROM requests") == num_recorded
    assert _scalar(engine, "SELECT count(*) FROM token_events") == expected_tokens
    assert _scalar(engine, f"SELECT status FROM runs WHERE id = {run_id}") == "completed"
    engine.dispose()


def test_end_run_times_out_with_a_clear_error_while_locked(sqlite_url, tmp_path):
    engine = open_store(sqlite_url)
    rec = Recorder(engine, flush_interval_s=0.02, sqlite_busy_timeout_ms=20, retry_max_s=0.05)
    run_id = rec.start_run(run_info())
    lock = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    rec.record_request(run_id, synthetic_request(random.Random(0), 3))
    with pytest.raises(RecorderError, match=r"run \d+: 2 records still unwritten .*locked"):
        rec.end_run(run_id, timeout_s=0.5)
    lock.execute("ROLLBACK")
    lock.close()
    rec.close()  # the request and the run end were kept and are written now
    assert _scalar(engine, f"SELECT status FROM runs WHERE id = {run_id}") == "completed"
    assert _scalar(engine, "SELECT count(*) FROM token_events") == 3
    engine.dispose()


def test_a_close_the_store_never_answers_names_the_runs_it_leaves_running(sqlite_url, tmp_path):
    """The store locked past close (a long VACUUM, a backup): the error said how many records were lost, not that
    a run's end was among them, so the run left 'running' could not be found from it."""
    engine = open_store(sqlite_url)
    rec = Recorder(engine, flush_interval_s=0.02, sqlite_busy_timeout_ms=20, retry_max_s=0.05)
    run_id = rec.start_run(run_info())
    lock = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        rec.record_request(run_id, synthetic_request(random.Random(0), 3))
        with pytest.raises(RecorderError):
            rec.end_run(run_id, timeout_s=0.2)
        with pytest.raises(RecorderError, match=rf"2 records were not written before close; the end of run {run_id} "
                                                r"among them: it stays 'running' in the store .*locked"):
            rec.close(timeout_s=0.5)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert _scalar(engine, f"SELECT status FROM runs WHERE id = {run_id}") == "running"
    engine.dispose()


def test_a_server_stopping_on_a_locked_store_queues_both_run_ends_and_says_so_in_one_line(sqlite_url, tmp_path,
                                                                                            caplog):
    """`serve` stopped while another process held the store's write lock past its wait: the first run's end timed
    out with a traceback ("Application shutdown failed"), the second run's end was never queued, the recorder was
    never closed; both runs stayed 'running'."""
    from serving.server_metrics import ServeMetrics
    from serving.server_telemetry import ServeTelemetry
    from telemetry.power import NoPowerSource

    engine = open_store(sqlite_url)
    rec = Recorder(engine, flush_interval_s=0.02, sqlite_busy_timeout_ms=20, retry_max_s=0.05)
    telemetry = ServeTelemetry(ServeMetrics("m"), NoPowerSource(), recorder=rec,
                               run_infos={"spec": run_info(), "ar": run_info(mode="ar")}).start()
    telemetry.close_wait_s = 0.5
    lock = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        telemetry.close()  # no exception: one line in the log
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    spec, ar = telemetry.run_ids["spec"], telemetry.run_ids["ar"]
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serve: ")]
    assert f"the end of runs {min(spec, ar)}, {max(spec, ar)} among them: they stay 'running'" in line, line
    engine.dispose()


def test_a_record_the_database_rejects_is_counted_and_the_rest_is_written(sqlite_url):
    engine = open_store(sqlite_url)
    rng = random.Random(9)
    with Recorder(engine, flush_interval_s=10) as rec:  # one batch: good and bad records together
        run_id = rec.start_run(run_info())
        rec.record_request(run_id, synthetic_request(rng, 4))
        rec.record_request(run_id + 1000, synthetic_request(rng, 4))  # no such run: foreign key fails
        rec.record_request(run_id, synthetic_request(rng, 6))
        rec.end_run(run_id)
        assert rec.dropped(run_id + 1000) == 1
        assert rec.dropped(run_id) == 0
    assert _scalar(engine, "SELECT count(*) FROM requests") == 2
    assert _scalar(engine, "SELECT count(*) FROM token_events") == 10
    engine.dispose()


def test_a_record_no_measurement_can_give_is_dropped_counted_and_named(db_url, caplog):
    """Impossible values were stored as they came (more accepted than drafted tokens, a negative count, a
    step accepting more than it drafted, an unknown status) and every aggregate over the run carried them: an
    acceptance rate of 4.5, negative tokens. Such a record is dropped and counted for its run, the log names the
    field, and the good records of its batch are written."""
    import dataclasses

    from telemetry.records import StepRow

    engine = open_store(db_url)
    rng = random.Random(3)
    good = synthetic_request(rng, 4)
    step = StepRow(step_index=0, k=2, accepted=7, num_emitted=8, draft_ms=1.0, verify_ms=2.0, t_offset_ms=3.0)
    bad = [dataclasses.replace(synthetic_request(rng, 4), **change) for change in (
        {"num_draft_tokens": 2, "num_accepted_tokens": 9}, {"output_tokens": -5}, {"ttft_ms": float("nan")},
        {"status": "bogus"}, {"steps": [step]})]
    with Recorder(engine, flush_interval_s=10) as rec:  # one batch: good and bad records together
        run_id = rec.start_run(run_info())
        for r in (good, *bad):
            rec.record_request(run_id, r)
        rec.end_run(run_id)
    assert _scalar(engine, "SELECT count(*) FROM requests") == 1
    assert _scalar(engine, f"SELECT dropped_records FROM runs WHERE id = {run_id}") == len(bad)
    (said,) = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]  # once per run and kind
    assert "num_accepted_tokens 9 exceeds num_draft_tokens 2" in said and "by the database" not in said, said
    from telemetry.records import request_problem

    assert [request_problem(r) for r in bad][1:] == [
        "output_tokens is -5, below 0", "ttft_ms is nan, not a finite value >= 0",
        "status 'bogus' is not one of ok, error, cancelled", "step 0: k 2, accepted 7, emitted 8"]
    assert request_problem(dataclasses.replace(good, prompt_tokens=None, num_drafts=None)) is None  # unknown
    engine.dispose()


def test_invalid_use_is_refused(sqlite_url):
    engine = open_store(sqlite_url)
    with pytest.raises(ValueError, match="max_buffered_requests"):
        Recorder(engine, max_buffered_requests=0)
    rec = Recorder(engine)
    run_id = rec.start_run(run_info())
    with pytest.raises(ValueError, match="status must be one of"):
        rec.end_run(run_id, status="done")
    rec.close()
    with pytest.raises(RuntimeError, match="Recorder is closed"):
        rec.record_request(run_id, synthetic_request(random.Random(0), 2))
    engine.dispose()


def test_sigkill_mid_run_leaves_a_consistent_store(sqlite_url, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    child = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "recorder_child.py"), sqlite_url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        line = child.stdout.readline()
        assert line.startswith("run "), f"child did not start: {line!r} {child.stderr.read()}"
        probe = sqlite3.connect(tmp_path / "store.db", timeout=30)
        _wait_for(lambda: probe.execute("SELECT count(*) FROM requests").fetchone()[0] >= 300, "300 requests")
        probe.close()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL

    engine = open_store(sqlite_url)
    with engine.connect() as c:
        assert c.execute(text("PRAGMA integrity_check")).scalar() == "ok"
        assert c.execute(text("PRAGMA foreign_key_check")).all() == []
        orphans = "SELECT count(*) FROM {} WHERE request_id NOT IN (SELECT id FROM requests)"
        assert c.execute(text(orphans.format("steps"))).scalar() == 0
        assert c.execute(text(orphans.format("token_events"))).scalar() == 0
        half_written = c.execute(text("""
            SELECT count(*) FROM requests r
            WHERE r.output_tokens != (SELECT count(*) FROM token_events t WHERE t.request_id = r.id)
               OR r.num_drafts != (SELECT count(*) FROM steps s WHERE s.request_id = r.id)
        """)).scalar()  # fmt: skip
        assert half_written == 0
        assert c.execute(text("SELECT count(*) FROM requests")).scalar() >= 300
        assert c.execute(text("SELECT status FROM runs")).scalar() == "running"  # killed: never ended
    engine.dispose()


def test_postgres_unreachable_then_back_everything_is_written(pg_url):
    from conftest import PG_ADMIN_URL
    from sqlalchemy import create_engine

    name = pg_url.rsplit("/", 1)[1]
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    engine = open_store(pg_url)
    rec = Recorder(engine, flush_interval_s=0.02, retry_max_s=0.2)
    run_id = rec.start_run(run_info())
    rng = random.Random(11)
    with admin.connect() as c:  # the database goes away: refuses connections, open ones are cut
        c.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
        c.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
    try:
        records = [synthetic_request(rng, rng.randint(1, 60)) for _ in range(40)]
        for r in records:
            rec.record_request(run_id, r)
        _wait_for(lambda: rec.stats().num_retries >= 2, "the writer to retry")
        assert rec.stats().num_requests_written == 0 and rec.buffered() == 40
    finally:
        with admin.connect() as c:
            c.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        admin.dispose()
    rec.end_run(run_id, timeout_s=60)
    rec.close()
    assert _scalar(engine, "SELECT count(*) FROM requests") == 40
    assert _scalar(engine, "SELECT count(*) FROM token_events") == sum(r.output_tokens for r in records)
    assert _scalar(engine, f"SELECT status FROM runs WHERE id = {run_id}") == "completed"
    engine.dispose()

"""The batch recorder: the hot path only enqueues; a writer thread inserts in batches.

`record_request` appends to an in-memory buffer under a lock held for a few instructions: no I/O, no
logging, no SQL. A background thread takes batches and writes each batch in ONE transaction (request
rows, their steps and token events, power samples, run updates), so a crash never leaves a request
without its steps or tokens. The buffer is bounded: when it is full the record is dropped and counted
for its run; the count is written to `runs.dropped_records` (never silent). When the database is
unreachable or locked, the writer keeps its batch and retries with exponential backoff while the
caller keeps generating; once the database answers, everything still buffered is written.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from types import TracebackType

from sqlalchemy import Table, insert, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from telemetry.db import (
    PowerSample,
    Request,
    Run,
    Step,
    TokenEvent,
    is_locked,
    locked_store,
    retry_while_locked,
)
from telemetry.liveness import process_key
from telemetry.power import PowerSampler, PowerSource
from telemetry.prices import load_catalog, price_snapshot
from telemetry.records import BadRecord, PowerReading, RequestRecord, RunInfo, request_problem

logger = logging.getLogger(__name__)

RUN_END_STATUSES = ("completed", "failed", "cancelled")
# Errors after which the same batch may succeed later: locked, unreachable, connection lost.
TRANSIENT_ERRORS = (OperationalError, InterfaceError, DisconnectionError, PoolTimeoutError)

_REQUEST, _POWER, _END = 0, 1, 2

_runs = Run.__table__
# runs.seed and requests.seed are BIGINTs; the engine also takes seeds up to 2**64 - 1, which they cannot hold
# (recorded as None: unknown)
SEED_COLUMN_MIN, SEED_COLUMN_MAX = -(2**63), 2**63 - 1


def column_seed(seed: int | None) -> int | None:
    """`seed` as a seed column holds it: None where it does not fit a signed 64-bit integer."""
    return seed if seed is not None and SEED_COLUMN_MIN <= seed <= SEED_COLUMN_MAX else None
_requests = Request.__table__
_steps = Step.__table__
_tokens = TokenEvent.__table__
_power = PowerSample.__table__


STEP_COLUMNS = (
    "request_id", "step_index", "k", "accepted", "num_emitted", "draft_ms", "verify_ms", "batch_size",
    "k_reason", "t_offset_ms",
)  # fmt: skip
TOKEN_COLUMNS = ("request_id", "position", "emit_offset_ms", "step_index", "source")


def _bulk_insert(conn: Connection, table: Table, columns: tuple[str, ...], rows: list[tuple]) -> None:
    """Insert plain tuples inside the connection's transaction: COPY on PostgreSQL, executemany elsewhere.

    The per-token tables get no per-row SQLAlchemy parameter processing: their values are ints, floats
    and short strings the drivers take as they are. This is what lets one writer keep up with decoding.
    """
    quote = conn.dialect.identifier_preparer.quote
    cols = ", ".join(quote(c) for c in columns)
    if conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg":
        cursor = conn.connection.driver_connection.cursor()
        with cursor.copy(f"COPY {quote(table.name)} ({cols}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cursor.close()
        return
    marks = ", ".join(["?"] * len(columns) if conn.dialect.paramstyle == "qmark" else ["%s"] * len(columns))
    conn.exec_driver_sql(f"INSERT INTO {quote(table.name)} ({cols}) VALUES ({marks})", rows)


class RecorderError(RuntimeError):
    """Records could not be written in time; the message says how many and the last database error."""


@dataclass(frozen=True, slots=True)
class RecorderStats:
    num_buffered: int  # records (requests, power batches, run ends) not yet committed
    num_requests_written: int
    num_token_events_written: int
    num_power_samples_written: int
    num_retries: int  # failed write attempts that were retried
    num_dropped: int  # all runs: buffer overflow plus records the database rejected
    last_error: str | None


def _utc(t: datetime) -> datetime:
    """Aware datetimes are stored in UTC (SQLite keeps no offset); naive ones are taken as UTC already."""
    return t.astimezone(UTC) if t.tzinfo is not None else t


class Recorder:
    """Writes runs, requests (with steps and token events) and power samples without blocking the caller.

    `max_buffered_requests` bounds the records held in memory (including the batch being written);
    `flush_interval_s` is the longest a record waits before the writer looks at the buffer;
    `max_batch_token_events` bounds one transaction (a batch closes once it holds this many rows);
    `sqlite_busy_timeout_ms` is how long one SQLite write waits on a lock before the writer backs off;
    `retry_max_s` caps the backoff between attempts while the database is unavailable.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_buffered_requests: int = 10_000,
        flush_interval_s: float = 0.25,
        max_batch_token_events: int = 50_000,
        retry_initial_s: float = 0.05,
        retry_max_s: float = 2.0,
        sqlite_busy_timeout_ms: int = 1_000,
    ) -> None:
        if max_buffered_requests < 1:
            raise ValueError(f"max_buffered_requests must be >= 1, got {max_buffered_requests}")
        if flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be > 0, got {flush_interval_s}")
        if not 0 < retry_initial_s <= retry_max_s:
            raise ValueError(f"need 0 < retry_initial_s <= retry_max_s, got {retry_initial_s}, {retry_max_s}")
        self._engine = engine
        self._max_buffered = max_buffered_requests
        self._flush_interval_s = flush_interval_s
        self._max_batch_tokens = max_batch_token_events
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._busy_timeout_ms = int(sqlite_busy_timeout_ms)
        self._wake_at = max(1, min(2_000, max_buffered_requests // 2))

        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._queue: deque[tuple] = deque()
        self._num_buffered = 0  # queued + taken by the writer but not yet committed
        self._dropped: dict[int, int] = {}
        self._dropped_written: dict[int, int] = {}
        self._ends_pending: set[int] = set()  # runs whose end is enqueued but not committed yet
        self._rejections_said: set[tuple[int, str]] = set()
        self._closed = False

        self._wake = threading.Event()
        self._stop = threading.Event()  # leave once the buffer is empty
        self._abandon = threading.Event()  # leave now (close timed out)
        self._conn: Connection | None = None
        self._num_requests = self._num_tokens = self._num_power = self._num_retries = 0
        self._last_error: str | None = None
        self._last_locked = False  # whether that error said the store is locked (`is_locked`)
        self._thread = threading.Thread(target=self._run_writer, name="specfinops-recorder", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- caller side

    @property
    def engine(self) -> Engine:
        """The store's engine the recorder writes through (its caller's: the recorder never disposes it)."""
        return self._engine

    def start_run(self, info: RunInfo) -> int:
        """Insert the run row now (status 'running') and return its id; raises if the database is down. A SQLite
        store another process holds locked is waited for (telemetry.db.retry_while_locked), then named.

        The row carries the prices in force now (prices.price_snapshot, read in the same transaction), so
        the run keeps its cost when the catalog is edited later; a RunInfo's own price_snapshot is kept."""
        started_at = datetime.now(UTC)
        row = {f.name: getattr(info, f.name) for f in fields(info)}
        # the process recording it: a run it leaves 'running' when killed outright reads 'stale' (telemetry.liveness)
        row.update(status="running", dropped_records=0, started_at=started_at, pid=os.getpid(),
                   process_key=process_key())
        if row["seed"] is not None and column_seed(row["seed"]) is None:
            logger.warning("run seed %d does not fit runs.seed (a signed 64-bit integer): recorded as unknown",
                           row["seed"])
            row["seed"] = None
        snapshot = row["price_snapshot"]

        def insert_run() -> int:  # one transaction: a try that meets another writer's lock leaves nothing
            with self._engine.begin() as conn:
                row["price_snapshot"] = snapshot if snapshot is not None else price_snapshot(
                    load_catalog(conn), info.device, started_at)
                return int(conn.execute(insert(_runs).returning(_runs.c.id), row).scalar_one())

        return retry_while_locked(self._engine, insert_run)

    def record_request(self, run_id: int, rec: RequestRecord) -> None:
        """Hot path: enqueue only. Dropped (and counted for the run) when the buffer is full."""
        self._enqueue((_REQUEST, run_id, rec), run_id)

    def record_power(self, run_id: int, readings: list[PowerReading]) -> None:
        """Enqueue power readings of a run (one buffer slot per call)."""
        if readings:
            self._enqueue((_POWER, run_id, list(readings)), run_id)

    def _enqueue(self, item: tuple, run_id: int) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("Recorder is closed: no more records can be written")
            if self._num_buffered >= self._max_buffered:
                self._dropped[run_id] = self._dropped.get(run_id, 0) + 1
                return
            self._queue.append(item)
            self._num_buffered += 1
            wake = self._num_buffered >= self._wake_at
        if wake and not self._wake.is_set():
            self._wake.set()

    def end_run(self, run_id: int, status: str = "completed", *, timeout_s: float | None = 60.0) -> None:
        """Flush the run's records, then set ended_at, status and dropped_records.

        Raises RecorderError when the records are not written within `timeout_s`; they stay buffered and
        are written (run end included) as soon as the database answers.
        """
        if status not in RUN_END_STATUSES:
            raise ValueError(f"status must be one of {RUN_END_STATUSES}, got {status!r}")
        with self._lock:  # the run end is never dropped: it must carry the dropped count
            if self._closed:
                raise RuntimeError(f"Recorder is closed: cannot end run {run_id}")
            self._queue.append((_END, run_id, (status, datetime.now(UTC))))
            self._num_buffered += 1
            self._ends_pending.add(run_id)
        if not self.flush(timeout_s):
            raise RecorderError(
                f"run {run_id}: {self.buffered()} records still unwritten after {timeout_s} s "
                f"(last database error: {self._last_error}){self._locked_text()}; they stay buffered and are retried"
            )

    def _locked_text(self) -> str:
        """Where the last error said the store is locked (`is_locked`: SQLite's 'database is locked', PostgreSQL's
        lock timeout): which store, and that another process (session) holds it."""
        if not self._last_locked:
            return ""
        store, server = locked_store(self._engine)
        holder = "another session holds a lock on what this writes" if server else \
            "another process holds a write lock on it"
        return f": the store {store or ''} is locked, {holder}"

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything enqueued so far is committed; False when `timeout` (s) ran out first."""
        self._wake.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._drained:
            while self._num_buffered:
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or not self._thread.is_alive():
                    return False
                self._drained.wait(0.5 if left is None else min(left, 0.5))
        return True

    def dropped(self, run_id: int) -> int:
        """Records of this run that were not written (buffer full, or rejected by the database)."""
        with self._lock:
            return self._dropped.get(run_id, 0)

    def buffered(self) -> int:
        with self._lock:
            return self._num_buffered

    def stats(self) -> RecorderStats:
        with self._lock:
            return RecorderStats(
                num_buffered=self._num_buffered,
                num_requests_written=self._num_requests,
                num_token_events_written=self._num_tokens,
                num_power_samples_written=self._num_power,
                num_retries=self._num_retries,
                num_dropped=sum(self._dropped.values()),
                last_error=self._last_error,
            )

    def close(self, timeout_s: float | None = 60.0) -> None:
        """Flush, stop the writer. Raises RecorderError naming how many records were lost if it can't."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        drained = self.flush(timeout_s)
        if not drained:
            self._abandon.set()
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10.0)
        lost = self.buffered()
        if lost:
            with self._lock:
                ended = sorted(self._ends_pending)
            left = (f"; the end of run{'s' if len(ended) > 1 else ''} {', '.join(map(str, ended))} among them: "
                    f"{'they stay' if len(ended) > 1 else 'it stays'} 'running' in the store" if ended else "")
            raise RecorderError(
                f"{lost} records were not written before close{left} (last database error: {self._last_error})"
            )

    # Close it (or use `with`): the writer is a daemon thread, so records still buffered when the
    # interpreter exits without close() are lost.

    def __enter__(self) -> Recorder:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.close()
        except RecorderError:
            if exc_type is None:
                raise
            logger.exception("while handling another error, the recorder could not flush")

    # ---------------------------------------------------------------- writer thread

    def _run_writer(self) -> None:
        try:
            while not self._abandon.is_set():
                self._wake.wait(self._flush_interval_s)
                self._wake.clear()
                while not self._abandon.is_set() and (batch := self._take_batch()):
                    self._write_with_retry(batch)
                if self._stop.is_set() and not self._queue:
                    break
        finally:
            self._release_connection()
            with self._drained:
                self._drained.notify_all()

    def _take_batch(self) -> list[tuple]:
        batch: list[tuple] = []
        num_tokens = 0
        with self._lock:
            while self._queue and num_tokens < self._max_batch_tokens:
                item = self._queue.popleft()
                batch.append(item)
                if item[0] == _REQUEST:
                    num_tokens += len(item[2].tokens) + len(item[2].steps) + 1
        return batch

    def _done(self, batch: list[tuple], counts: tuple[int, int, int]) -> None:
        with self._drained:
            self._num_buffered -= len(batch)
            self._ends_pending.difference_update(item[1] for item in batch if item[0] == _END)
            self._num_requests += counts[0]
            self._num_tokens += counts[1]
            self._num_power += counts[2]
            self._drained.notify_all()

    def _write_with_retry(self, batch: list[tuple]) -> None:
        delay = self._retry_initial_s
        while True:
            try:
                self._done(batch, self._write(batch))
                return
            except TRANSIENT_ERRORS as exc:
                self._note_error(exc)
                self._release_connection()
                with self._lock:
                    self._num_retries += 1
                if self._abandon.wait(delay):
                    return
                delay = min(2 * delay, self._retry_max_s)
            except Exception as exc:  # noqa: BLE001 - a record the database rejects must not stop the writer
                self._note_error(exc)
                if len(batch) > 1:  # find the bad record: write the others one by one
                    for item in batch:
                        self._write_with_retry([item])
                    return
                self._reject(batch[0], exc)
                return

    def _reject(self, item: tuple, exc: Exception) -> None:
        run_id = item[1]
        key = (run_id, type(exc).__name__)
        if key not in self._rejections_said:  # said once per run and kind of error; all are counted
            self._rejections_said.add(key)
            by = "" if isinstance(exc, BadRecord) else " by the database"
            logger.error("run %s: record rejected%s, counted as dropped: %s", run_id, by, exc)
        with self._lock:
            if item[0] != _END:
                self._dropped[run_id] = self._dropped.get(run_id, 0) + 1
        self._done([item], (0, 0, 0))

    def _note_error(self, exc: Exception) -> None:
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        with self._lock:
            self._last_error = text
            self._last_locked = is_locked(exc)

    def _connection(self) -> Connection:
        if self._conn is None:
            conn = self._engine.connect()
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql(f"PRAGMA busy_timeout={self._busy_timeout_ms}")
                conn.commit()  # end the autobegun transaction so the batch can begin its own
            self._conn = conn
        return self._conn

    def _release_connection(self) -> None:
        """Drop the writer's connection (it may be broken, and it carries our busy_timeout)."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                conn.invalidate()
                conn.close()
            except Exception:  # noqa: BLE001, S110 - the connection is being discarded anyway
                pass

    def _write(self, batch: list[tuple]) -> tuple[int, int, int]:
        """One transaction for the whole batch. Returns (requests, token events, power samples) written."""
        reqs = [(item[1], item[2]) for item in batch if item[0] == _REQUEST]
        power = [
            {
                "run_id": item[1],
                "t": _utc(r.t),
                "device_index": r.device_index,
                "power_w": r.power_w,
                "energy_mj": r.energy_mj,
                "utilization_pct": r.utilization_pct,
                "source": r.source,
            }
            for item in batch
            if item[0] == _POWER
            for r in item[2]
        ]
        ends = [(item[1], *item[2]) for item in batch if item[0] == _END]
        num_tokens = 0
        conn = self._connection()
        with conn.begin():
            if reqs:
                num_tokens = self._insert_requests(conn, reqs)
            if power:
                conn.execute(insert(_power), power)
            with self._lock:
                dropped = dict(self._dropped)
            for run_id, num in dropped.items():  # overflow reaches the run row with the next batch
                if num != self._dropped_written.get(run_id, 0):
                    conn.execute(update(_runs).where(_runs.c.id == run_id).values(dropped_records=num))
            for run_id, status, ended_at in ends:
                conn.execute(
                    update(_runs)
                    .where(_runs.c.id == run_id)
                    .values(status=status, ended_at=ended_at, dropped_records=dropped.get(run_id, 0))
                )
        self._dropped_written.update(dropped)
        return len(reqs), num_tokens, len(power)

    @staticmethod
    def _insert_requests(conn: Connection, reqs: list[tuple[int, RequestRecord]]) -> int:
        for run_id, r in reqs:  # a bad record fails its batch; the writer then writes the others one by one
            if (problem := request_problem(r)) is not None:
                raise BadRecord(f"request {r.external_id or '(no id)'} of run {run_id}: {problem}")
        rows = [
            {
                "run_id": run_id,
                "external_id": r.external_id,
                "domain": r.domain,
                "started_at": _utc(r.started_at),
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "num_drafts": r.num_drafts,
                "num_draft_tokens": r.num_draft_tokens,
                "num_accepted_tokens": r.num_accepted_tokens,
                "ttft_ms": r.ttft_ms,
                "e2e_ms": r.e2e_ms,
                "energy_j": r.energy_j,
                "temperature": r.temperature,
                "top_p": r.top_p,
                "top_k": r.top_k,
                "seed": column_seed(r.seed),
                "max_new_tokens": r.max_new_tokens,
                "status": r.status,
                "error": r.error,
            }
            for run_id, r in reqs
        ]
        stmt = insert(_requests).returning(_requests.c.id, sort_by_parameter_order=True)
        ids = conn.execute(stmt, rows).scalars().all()
        steps = [
            (rid, s.step_index, s.k, s.accepted, s.num_emitted, s.draft_ms, s.verify_ms, s.batch_size,
             s.k_reason, s.t_offset_ms)
            for rid, (_, r) in zip(ids, reqs, strict=True)
            for s in r.steps
        ]  # fmt: skip
        tokens = [
            (rid, t.position, t.emit_offset_ms, t.step_index, t.source)
            for rid, (_, r) in zip(ids, reqs, strict=True)
            for t in r.tokens
        ]
        if steps:
            _bulk_insert(conn, _steps, STEP_COLUMNS, steps)
        if tokens:
            _bulk_insert(conn, _tokens, TOKEN_COLUMNS, tokens)
        return len(tokens)


@contextmanager
def recorded_run(recorder: Recorder | None, source: PowerSource, info: RunInfo) -> Iterator[tuple[int | None, PowerSampler]]:
    """One run of a benchmark: (its id, None without a recorder; a power sampler feeding its samples to
    the store). The run ends 'completed' when the block finishes, 'cancelled' when it is interrupted (Ctrl-C,
    or SIGTERM where the command turns it into one), 'failed' when it raises anything else."""
    run_id = recorder.start_run(info) if recorder else None
    sink = (lambda rs: recorder.record_power(run_id, rs)) if recorder else None
    sampler = PowerSampler(source, sink).start()
    status = "failed"
    try:
        yield run_id, sampler
        status = "completed"
    except KeyboardInterrupt:
        status = "cancelled"
        raise
    finally:
        sampler.stop()
        if recorder:
            recorder.end_run(run_id, status)

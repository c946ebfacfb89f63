"""Telemetry of a serving process: one 'serve' run per mode, the power sampler, the request records.

The engine thread hands each finished request to `finish` (a queue put); a small thread attributes
energy (concurrent requests share the node's energy, `attribute_energy`), updates the Prometheus
metrics and enqueues the record on the batch recorder. `close` drains that thread, stops power
sampling, ends the runs and flushes the recorder, so a shutdown leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import secrets
import threading
from datetime import timedelta

from serving.server_metrics import MODES, ServeMetrics
from telemetry.energy import attribute_energy
from telemetry.power import PowerSampler, PowerSource
from telemetry.records import RequestRecord, RunInfo

logger = logging.getLogger(__name__)

# A client that records its own view of a request in the server's store sends the server's client key here
# (`specfinops loadtest` does); the server then leaves the request out of its own 'serve' runs, so a shared
# store holds each request once (metrics still count it). The key is random per server start and kept in
# the store (`publish_client_key`): only who can read the store can keep a request out of the server's runs.
RECORDED_IN_HEADER = "X-Specfinops-Recorded-In"


def publish_client_key(engine, run_id: int) -> str:
    """A new random client key, stored with the server's run `run_id` (table serve_keys)."""
    from telemetry.db import ServeKey, retry_while_locked

    key = secrets.token_hex(16)

    def write() -> None:  # one transaction, waited for while another process holds the store locked
        with engine.begin() as conn:
            conn.execute(ServeKey.__table__.insert().values(run_id=run_id, key=key))

    retry_while_locked(engine, write)
    return key


def client_key_id(key: str) -> str:
    """What the server publishes of its key (model card, `specfinops.telemetry.key_id`): a client finds the
    key in its store and knows by this that it is the same store, and the same server, without learning it
    from the card."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def read_client_key(engine, run_id: int, key_id: str) -> str | None:
    """The client key kept with run `run_id` in this store when its id is `key_id`; None otherwise (another
    store, which may hold a run of the same id, or a server that records elsewhere)."""
    from sqlalchemy import select

    from telemetry.db import ServeKey

    with engine.connect() as conn:
        key = conn.execute(select(ServeKey.key).where(ServeKey.run_id == run_id)).scalar_one_or_none()
    return key if key is not None and secrets.compare_digest(client_key_id(key), key_id) else None


class ServeTelemetry:
    close_wait_s = 60.0  # how long a stopping server waits for a busy store to take its last records

    def __init__(self, metrics: ServeMetrics, source: PowerSource, *, recorder=None,
                 run_infos: dict[str, RunInfo] | None = None):
        self.metrics = metrics
        self.recorder = recorder
        self.source = source
        self.run_ids: dict[str, int] = {}
        if recorder is not None:
            for mode in MODES:  # a run each for the modes the server serves (`--k 0`: 'ar' only)
                if mode in run_infos:
                    self.run_ids[mode] = recorder.start_run(run_infos[mode])
        self.sampler = PowerSampler(source, self._on_power)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="specfinops-serve-telemetry", daemon=True)
        self._closed = False
        self.num_recorded = 0
        self.num_left_to_client = 0  # requests a client records in this store itself (RECORDED_IN_HEADER)

    def start(self) -> ServeTelemetry:
        self.sampler.start()
        self._thread.start()
        return self

    def _on_power(self, readings) -> None:
        self.metrics.observe_power(readings)
        if self.recorder is not None:
            for run_id in self.run_ids.values():  # each run (spec and ar; one, ar, at --k 0) spans the node and period
                self.recorder.record_power(run_id, readings)

    def finish(self, mode: str, rec: RequestRecord, others, *, window=None, store: bool = True) -> None:
        """Engine thread: hand over a finished request (no I/O here); `store=False` counts it in the
        metrics only (a client records it in this store already).

        `window` (start, end): the request's time in the batch, sharing the node's energy with the `others`;
        None for a request that never ran (cancelled while it waited): it is recorded without energy, as a
        request a benchmark abandons is. It did no compute, so no joule of the node is its own, and 0 J would
        read as a measured figure where the power source may measure nothing; left out, it takes nothing from
        the requests that ran (a share of their time, counted before from its arrival, was lost to J/token)."""
        self._queue.put((mode, rec, others, window, store))

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every request handed over so far is in the store; False on timeout."""
        mark = threading.Event()
        self._queue.put(mark)
        if not mark.wait(timeout_s):
            return False
        return self.recorder.flush(timeout_s) if self.recorder is not None else True

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._record(*item)
            except Exception:  # noqa: BLE001 - one bad record must not stop the others
                logger.exception("could not record a request")

    def _record(self, mode: str, rec: RequestRecord, others, window, store: bool = True) -> None:
        if window is not None and self.source.source != "none":
            self.sampler.sample_now()  # cover the request's end
            start = window[0]
            readings = [r for r in self.sampler.readings() if start - timedelta(seconds=5) <= r.t]
            if readings:
                rec.energy_j = attribute_energy(readings, [window, *others])[0]
        self.metrics.observe_request(mode, rec)
        if not store:
            self.num_left_to_client += 1
            return
        if self.recorder is not None:
            self.recorder.record_request(self.run_ids[mode], rec)
        self.num_recorded += 1

    def close(self, status: str = "completed") -> None:
        """Drain the pending records, stop sampling, end both runs, flush and close the recorder."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(60)
        self.sampler.stop()
        try:
            if self.recorder is not None:
                from telemetry.recorder import RecorderError

                for run_id in self.run_ids.values():  # every run's end queued before any wait for the store
                    with contextlib.suppress(RecorderError):
                        self.recorder.end_run(run_id, status, timeout_s=0)
                try:
                    self.recorder.close(self.close_wait_s)  # waits for the store, then gives up on what is left
                except RecorderError as exc:  # a store locked or gone at shutdown: one line, no traceback
                    logger.error("serve: %s", exc)
        finally:
            self.source.close()

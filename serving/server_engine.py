"""The engine thread of the server: the one owner of the batched `Engine`.

Handlers (asyncio) `submit` a `Job` and await its `out` queue. The thread loops: take cancellations,
admit waiting jobs while the engine has free slots (`engine.add` prefills and emits the first token),
run one `engine.step()` for every running sequence together, then hand the tokens of that step to
the event loop in ONE `call_soon_threadsafe` (one wake-up per step, not per token). A finished,
cancelled or failed job gets a `Finished` on its queue and its telemetry record goes to `on_finish`.
The thread never awaits anything and never touches the database.

A request's energy window (`Job.ran`) runs from its admission to its end: the queue does no compute, so the
time a request waits for a batch slot takes no share of the node's energy from the requests that run then
(it did: requests cancelled while queued took joules that J/token, summed over completed requests, lost).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from serving.engine import Engine, StepEvent
from serving.sequence import Sequence
from serving.server_schemas import APIError, Checked
from serving.worker import append_step
from telemetry.records import RequestRecord

logger = logging.getLogger(__name__)

Window = tuple[datetime, datetime]


@dataclass(frozen=True, slots=True)
class Finished:
    """The last item on a job's queue."""

    finish_reason: str  # stop | length | cancelled | error
    num_prompt: int
    num_output: int
    error: str | None = None
    num_drafts: int = 0  # speculation counts, sent in the usage's "specfinops" extension
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # arrival to admission into a batch slot, ms; None where it never ran. Sent in the usage's "specfinops"
    # extension: a load test's energy window then starts at admission, as the server's (`Job.ran`) does
    queue_ms: float | None = None


@dataclass(eq=False)
class Job:
    id: str
    checked: Checked
    t_start: float  # perf_counter at arrival at the server: TTFT and E2E count from here
    wall_start: datetime
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue = field(default_factory=asyncio.Queue)  # list[int] per step, then one Finished
    record: RequestRecord | None = None
    seq: Sequence | None = None
    cancelled: bool = False
    finished: bool = False
    holds_slot: bool = False  # taken from the queue for a batch slot, not finished yet
    recorded_by_client: bool = False  # a load test records it in this server's own store: not twice
    admitted_at: datetime | None = None  # when the engine took it into a batch slot (None: it never ran)
    cancelled_at: float | None = None  # perf_counter when `EngineLoop.cancel` was called (the client left)
    ran: Window | None = None  # once finished: admission to end, its energy window; None if it never ran

    @property
    def mode(self) -> str:
        return "spec" if self.checked.speculate else "ar"


class EngineLoop:
    """Owns `engine`; `on_finish(job, record, overlapping_windows)` is called on this thread: the windows of
    the requests that ran beside the job's own window `job.ran` (none when that is None)."""

    def __init__(self, engine: Engine, on_finish: Callable[[Job, RequestRecord, list[Window]], None], *,
                 max_waiting: int = 1024):
        self.engine = engine
        self.engine.on_step = self._on_step
        self.has_drafter = engine.drafter is not None
        self._on_finish = on_finish
        self._max_waiting = max_waiting
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._num_holding = 0  # jobs holding (or about to take) a batch slot; guarded by _cv
        self._cancels: deque[Job] = deque()
        self._jobs: dict[str, Job] = {}  # admitted and not finished, by request id
        # taken from the queues this round (cancels, then the admit batch): in neither _waiting nor _jobs until
        # admitted, so a crash of the engine thread can still answer them
        self._in_hand: list[Job] = []
        self._outbox: list[tuple[Job, tuple[int, ...]]] = []
        self._recent: deque[Window] = deque(maxlen=512)  # finished requests' `ran`, for energy sharing
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="specfinops-engine", daemon=True)
        self.num_step_errors = 0

    # ------------------------------------------------------------------ any thread
    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    @property
    def num_running(self) -> int:
        """Requests holding a batch slot: decoding, and those taken from the queue that are being admitted
        (prefilling), as vLLM counts a prefilling sequence running. A job is in neither the queue nor
        `engine.running` while `engine.add` prefills it: /health and vllm:num_requests_running missed it."""
        return max(self._num_holding, len(self.engine.running))

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def submit(self, job: Job) -> None:
        """Queue `job`; 503 when `max_waiting` requests already wait beyond the free batch slots (a job the
        engine thread has not yet moved into a free slot does not count: it starts at the next admission)."""
        with self._cv:
            if self._stopping or not self._thread.is_alive():
                raise APIError(503, "the server is shutting down", code="shutting_down")
            queued = len(self._waiting) - max(self.engine.max_batch - self._num_holding, 0)
            if queued >= self._max_waiting:
                raise APIError(503, f"the server is overloaded ({queued} request{'s' if queued != 1 else ''} "
                               "waiting for a batch slot); retry later", code="overloaded", retry_after_s=1)
            self._waiting.append(job)
            self._cv.notify()

    def cancel(self, job: Job) -> None:
        """Cancel from any thread (e.g. the client went away); recorded as 'cancelled'. A job still in the
        queue leaves it at once, so it no longer counts as waiting (nor against `max_waiting`)."""
        if job.finished or job.cancelled:
            return
        job.cancelled_at = time.perf_counter()  # a job that never ran ends here, not when the engine thread gets to it
        job.cancelled = True
        with self._cv:
            try:
                self._waiting.remove(job)
            except ValueError:  # admitted already (or being admitted): the engine thread cancels its sequence
                pass
            self._cancels.append(job)
            self._cv.notify()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop admitting; cancel whatever still runs or waits (recorded as cancelled); join the thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # noqa: BLE001 - a bug here must not leave clients waiting forever
            logger.exception("the engine thread failed; failing every request in flight")
            self._fail_all(f"engine thread failed: {type(exc).__name__}: {exc}")

    def _fail_all(self, error: str) -> None:
        """Every job not finished, wherever the crash left it (queued, cancelled but not yet ended, taken for a
        batch slot and not yet admitted, admitted): ended with `error`, its client answered. The engine's
        sequences are dropped and the slot count reset, so /health, num_requests_running and a SIGTERM drain
        see nothing running (a job taken for admission stayed counted: the drain waited its whole --drain-s)."""
        with self._cv:
            self._stopping = True
            jobs = list(self._waiting) + list(self._cancels) + self._in_hand + list(self._jobs.values())
            self._waiting.clear()
            self._cancels.clear()
            self._in_hand = []
        for seq in list(self.engine.running):
            try:
                self.engine.cancel(seq, reason="error")
            except Exception:  # noqa: BLE001 - the jobs below are answered whatever the engine's state
                logger.exception("could not drop sequence %s", seq.request_id)
        seen: set[int] = set()
        for job in jobs:
            if job.finished or id(job) in seen:
                continue
            seen.add(id(job))
            try:
                if job.record is None:
                    job.record = _record(job)
                self._finish(job, "error", error)
            except Exception:  # noqa: BLE001 - its client still gets its end
                logger.exception("could not record request %s", job.id)
                job.finished = True
                self._outbox.append((job, Finished("error", len(job.checked.prompt_ids), 0, error)))
        with self._cv:
            self._num_holding = 0
        self.engine.running.clear()
        self._deliver()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._waiting or self._cancels or self.engine.running or self._stopping):
                    self._cv.wait()
                cancels = list(self._cancels)
                self._cancels.clear()
                stopping = self._stopping
                admit = []
                if stopping:
                    admit, cancels = [], cancels + list(self._waiting) + list(self._jobs.values())
                    self._waiting.clear()
                else:
                    while self._waiting and len(admit) < len(self.engine.free_slots):
                        job = self._waiting.popleft()
                        job.holds_slot = True
                        self._num_holding += 1
                        admit.append(job)
                self._in_hand = cancels + admit
            for job in cancels:
                self._cancel(job)
            if cancels:  # a cancelled request's end goes out now, not after the next step
                self._deliver()
            for job in admit:
                self._admit(job)
                # its first token, sampled at prefill, goes out now: not after the next prefill or decode step
                self._deliver()
            self._in_hand = []
            if self.engine.running and not stopping:
                self._step()
            self._deliver()
            if stopping:
                return

    def _admit(self, job: Job) -> None:
        if job.finished:  # cancelled while it waited
            self._release_slot(job)
            return
        c = job.checked
        job.record = _record(job)
        if job.cancelled:
            self._finish(job, "cancelled")
            return
        job.admitted_at = datetime.now(UTC)
        self._jobs[job.id] = job
        try:
            job.seq = self.engine.add(c.prompt_ids, c.params, request_id=job.id, t_start=job.t_start,
                                      speculate=c.speculate)
        except Exception as exc:  # noqa: BLE001 - one bad request fails alone, the server keeps serving
            logger.warning("request %s failed at prefill: %s", job.id, exc)
            self._finish(job, "error", f"{type(exc).__name__}: {exc}")
            return
        if job.seq.done:
            self._finish(job, job.seq.finish_reason or "stop")

    def _step(self) -> None:
        try:
            finished = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - fail the batch's requests, keep the server alive
            self.num_step_errors += 1
            logger.exception("decode step failed; failing its %d requests", len(self.engine.running))
            for seq in list(self.engine.running):
                self.engine.cancel(seq, reason="error")
                job = self._jobs.get(seq.request_id)
                if job is not None:
                    self._finish(job, "error", f"decode step failed: {type(exc).__name__}: {exc}")
            return
        for seq in finished:
            job = self._jobs.get(seq.request_id)
            if job is not None:
                self._finish(job, seq.finish_reason or "stop")

    def _cancel(self, job: Job) -> None:
        if job.finished:
            return
        if job.record is None:  # still waiting: never reached the engine
            job.record = _record(job)
        if job.seq is not None:
            self.engine.cancel(job.seq)
        self._finish(job, "cancelled")

    def _on_step(self, ev: StepEvent) -> None:
        """Hot path (inside engine.add / engine.step): plain appends only."""
        job = self._jobs.get(ev.request_id)
        if job is None:
            return
        append_step(job.record, ev, job.t_start)
        if ev.tokens:
            self._outbox.append((job, ev.tokens))

    def _release_slot(self, job: Job) -> None:
        if job.holds_slot:
            job.holds_slot = False
            with self._cv:
                self._num_holding -= 1

    def _finish(self, job: Job, reason: str, error: str | None = None) -> None:
        job.finished = True
        self._jobs.pop(job.id, None)
        self._release_slot(job)  # the engine gave the sequence's slot back (finished, cancelled or failed)
        rec, seq = job.record, job.seq
        rec.status = {"cancelled": "cancelled", "error": "error"}.get(reason, "ok")
        rec.error = error
        if seq is not None:
            rec.output_tokens = len(rec.tokens)  # what was emitted (and streamed) to the client
            rec.num_drafts, rec.num_draft_tokens, rec.num_accepted_tokens = (
                seq.num_drafts, seq.num_draft_tokens, seq.num_accepted)
            if seq.emit_times:
                rec.ttft_ms = (seq.emit_times[0] - seq.t_start) * 1000.0
                rec.e2e_ms = (seq.emit_times[-1] - seq.t_start) * 1000.0
        else:
            rec.tokens.clear()
            rec.steps.clear()
        if rec.e2e_ms is None:  # nothing emitted: it ended when it was cancelled (a queued job waits for the
            # engine thread to get to its cancel, a whole step or more), else now
            end = job.cancelled_at if job.cancelled_at is not None else time.perf_counter()
            rec.e2e_ms = (end - job.t_start) * 1000.0
        others, queue_ms = [], None
        if job.admitted_at is not None:  # it ran: it shares the energy of its time in the batch
            queue_ms = max((job.admitted_at - job.wall_start).total_seconds() * 1000.0, 0.0)
            end = max(job.wall_start + timedelta(milliseconds=rec.e2e_ms), job.admitted_at)
            now = datetime.now(UTC)
            job.ran = (job.admitted_at, end)
            others = [w for w in self._recent if w[1] > job.admitted_at]
            others += [(j.admitted_at, now) for j in self._jobs.values()]
            self._recent.append(job.ran)
        self._outbox.append((job, Finished(reason, rec.prompt_tokens, rec.output_tokens, error, rec.num_drafts,
                                           rec.num_draft_tokens, rec.num_accepted_tokens, queue_ms)))
        try:
            self._on_finish(job, rec, others)
        except Exception:  # noqa: BLE001 - telemetry trouble must not stop serving
            logger.exception("could not hand request %s to telemetry", job.id)

    def _deliver(self) -> None:
        """Everything emitted since the last delivery, in one wake-up per event loop."""
        if not self._outbox:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for job, item in self._outbox:
            by_loop.setdefault(job.loop, []).append((job.out, item))
        self._outbox = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass


def _put_all(items: list) -> None:
    for queue, item in items:
        queue.put_nowait(list(item) if isinstance(item, tuple) else item)


def _record(job: Job) -> RequestRecord:
    """A request's record as it starts: its kind, id, prompt length and its own sampling (the length cap as
    applied: the client's max_tokens, else the default capped by the room left in the context window)."""
    c, p = job.checked, job.checked.params
    return RequestRecord(started_at=job.wall_start, domain=c.kind, external_id=job.id, prompt_tokens=len(c.prompt_ids),
                         temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, seed=p.seed,
                         max_new_tokens=p.max_new_tokens)

"""A bounded load test against an OpenAI-compatible server on this machine (loopback only).

For each concurrency level and mode, N workers send streaming chat requests (workload prompts, round
robin) for `duration_s` seconds with the official `openai` client, then stop issuing; requests in
flight finish (bounded by max_tokens and a hard deadline, after which they are cancelled). Timing is
the client's view: TTFT = request sent -> first content chunk, TPOT = (E2E - TTFT) / (tokens - 1),
ITL = gaps between chunks (tokens that arrive in one chunk arrive together and count once).
Each (level, mode) is stored as a run (kind 'loadtest', concurrency = level) with its requests, so
the FinOps capacity at SLA can use it. Loopback only: the device recorded is this machine's.

A worker pauses after a failed request (doubling up to BACKOFF_MAX_S); a level whose requests all fail
for FAIL_FAST_S (the server gone, refusing everything, or failing the requests it accepted) or by its end stops
the load test (`LoadTestFailed`, the run 'failed'). A refusal (no 200) while a request the server accepted is in
flight and heard from within ACCEPTED_SILENT_S does not count: an overloaded server answers the surplus 503 while
it serves those it took. Stopped by Ctrl-C / SIGTERM, a level cancels its workers before
the client closes: requests in flight are recorded 'cancelled', none as an error of our own making. A request
that ends cancelled or failed keeps the tokens it made (`_take_counts`): the server counted them in /metrics.
What the client cannot know (the prompt tokens of a stream that ended without the server's usage, a speculative
request's drafts where the server sent no counts) is stored unknown (NULL, revision 0012), not 0.
When the server records into the same store (`SharedStore`), the requests carry the energy its power
samples give them, shared among the requests in flight at each instant (`ServerPower`): each from its admission
into a batch slot (the usage's `queue_ms`), as the server counts its own requests' energy, not from its send.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import urlparse

from serving.workloads import Prompt
from telemetry.energy import attribute_energy
from telemetry.records import PowerReading, RequestRecord, TokenRow, requests_span_s

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = ("localhost", "ip6-localhost")
DRAIN_GRACE_S = 120.0  # after the duration, in-flight requests get this long before they are cancelled
TOKEN_SOURCE = "client"  # token events seen from the client: which step made them is unknown here
BACKOFF_S, BACKOFF_MAX_S = 0.05, 2.0  # a worker's pause after its 1st, 2nd, ... failure in a row: doubling
FAIL_FAST_S = 5.0  # every request failing this long (3 at least), refusals excused as below: the level stops
FAIL_FAST_MIN = 3
# An accepted request in flight (200, stream open) excuses the refusals beside it while the server was heard from
# on it (its 200, its last token) within this long: 12 x FAIL_FAST_S. `specfinops serve` prefills one request at a
# time, each sending its first token at its prefill, so a working server goes this long without a token to any
# client only on one prefill this slow: a prompt of thousands of tokens on a CPU takes tens of seconds. A server
# that took a request and hangs on it while it refuses the rest stops the level ACCEPTED_SILENT_S + FAIL_FAST_S
# after its last word, not at the end of the duration and the drain grace.
ACCEPTED_SILENT_S = 60.0


def base_url(url: str) -> str:
    """http://127.0.0.1:8000[/v1] -> http://127.0.0.1:8000/v1; ValueError unless the host is loopback."""
    try:
        parsed = urlparse(url)
        parsed.port  # noqa: B018 - parsing the port is what raises on a bad one
    except ValueError as exc:  # an unclosed [IPv6] bracket, a port out of 0-65535
        raise ValueError(f"--url {url!r}: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"--url must look like http://127.0.0.1:8000, got {url!r}")
    host = parsed.hostname
    loopback = host in LOOPBACK_NAMES
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
    if not loopback:
        raise ValueError(f"loadtest only targets a server on this machine (loopback: 127.0.0.1, ::1, localhost); "
                         f"got host {host!r}")
    path = parsed.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return f"{parsed.scheme}://{parsed.netloc}{path}"


@dataclass(frozen=True, slots=True)
class LoadSpec:
    url: str
    levels: tuple[int, ...]
    duration_s: float
    modes: tuple[str, ...] = ("ar", "spec")
    max_tokens: int = 64
    temperature: float = 0.0
    api_key: str | None = None
    model: str | None = None  # default: the first model the server lists

    def validate(self) -> None:
        from serving.request_limits import MAX_TEMPERATURE  # the server's range: it refuses others

        base_url(self.url)
        if not self.levels or any(n < 1 for n in self.levels):
            raise ValueError(f"--concurrency levels must be >= 1, got {self.levels}")
        if max(self.levels) > 256:
            raise ValueError(f"--concurrency is capped at 256 clients, got {max(self.levels)}")
        if not (math.isfinite(self.duration_s) and 0 < self.duration_s <= 3600):
            raise ValueError(f"--duration must be within (0, 3600] seconds, got {self.duration_s:g}")
        if not (math.isfinite(self.temperature) and 0 <= self.temperature <= MAX_TEMPERATURE):
            raise ValueError(f"--temperature must be within [0, {MAX_TEMPERATURE:g}], got {self.temperature:g}")
        if any(m not in ("spec", "ar") for m in self.modes) or not self.modes:
            raise ValueError(f"--mode must be spec, ar or both, got {self.modes}")
        if self.max_tokens < 1:
            raise ValueError(f"--max-tokens must be >= 1, got {self.max_tokens}")


@dataclass
class ClientResult:
    prompt: Prompt
    record: RequestRecord
    chunk_times_ms: list[float] = field(default_factory=list)  # content chunks, from request start
    ended_at: datetime | None = None  # the client's end of the request: its window for energy shares
    unreachable: bool = False  # failed to connect, or the connection was lost (openai.APIConnectionError)
    admitted_at: datetime | None = None  # when the server took it into a batch slot, where it said (`admission`)
    accepted: bool = False  # the server answered it 200 (its stream open): it took the request, no refusal
    heard_at: float | None = None  # time.perf_counter() of the server's last word on it: its 200, its last token

    @property
    def energy_since(self) -> datetime:
        """Where its energy window starts: its admission, as the server's own requests' (serving.server_engine:
        the queue does no compute, and a request waiting for a slot took a share of the energy of those running);
        its send where the server said nothing (another server, a stream cut without usage), queueing included."""
        return self.admitted_at or self.record.started_at

    @property
    def tpot_ms(self) -> float | None:
        r = self.record
        if r.status != "ok" or r.output_tokens < 2 or r.ttft_ms is None or r.e2e_ms is None:
            return None
        return (r.e2e_ms - r.ttft_ms) / (r.output_tokens - 1)

    @property
    def itl_ms(self) -> list[float]:
        t = self.chunk_times_ms
        return [b - a for a, b in zip(t, t[1:], strict=False)] if self.record.status == "ok" else []


@dataclass
class LevelResult:
    level: int
    mode: str
    results: list[ClientResult]
    wall_s: float
    run_id: int | None = None
    interrupted: bool = False  # stopped by Ctrl-C / SIGTERM: `results` are the requests until then


class LevelFailed(RuntimeError):
    """A level stopped because its requests fail (`run_level`); `result` holds what it did."""

    def __init__(self, reason: str, result: LevelResult):
        super().__init__(reason)
        self.result = result


class LoadTestFailed(RuntimeError):
    """The load test stopped at a failed level; `results`: the levels run, the failed one last."""

    def __init__(self, reason: str, results: list[LevelResult]):
        super().__init__(reason)
        self.results = results


def error_messages(results: list[ClientResult]) -> list[str]:
    """The distinct error messages of the failed requests, sorted."""
    return sorted({r.record.error for r in results if r.record.status == "error" and r.record.error})


def _distinct_errors(results: list[ClientResult], most: int = 3) -> str:
    errors = error_messages(results)
    more = f" (and {len(errors) - most} more)" if len(errors) > most else ""
    return "; ".join(errors[:most]) + more


def token_rows(chunks: list[tuple[float, int]], num_tokens: int) -> list[TokenRow]:
    """Spread `num_tokens` over the content chunks (arrival ms, characters), each chunk at least one token
    while tokens last, the rest by text length (largest remainder); tokens of a chunk share its time."""
    if not chunks or num_tokens < 1:
        return []
    if num_tokens <= len(chunks):
        counts = [1] * num_tokens + [0] * (len(chunks) - num_tokens)
    else:
        extra = num_tokens - len(chunks)
        chars = [max(c, 0) for _, c in chunks]
        total = sum(chars) or len(chunks)
        shares = [extra * (c if sum(chars) else 1) / total for c in chars]
        counts = [1 + int(s) for s in shares]
        left = num_tokens - sum(counts)
        for i in sorted(range(len(chunks)), key=lambda i: int(shares[i]) - shares[i])[:left]:
            counts[i] += 1
    rows, pos = [], 0
    for step, ((t_ms, _), n) in enumerate(zip(chunks, counts, strict=True)):
        for _ in range(n):
            rows.append(TokenRow(pos, t_ms, step - 1, TOKEN_SOURCE))
            pos += 1
    return rows


def new_result(prompt: Prompt) -> ClientResult:
    rec = RequestRecord(started_at=datetime.now(UTC), domain=prompt.domain, external_id=prompt.id)
    return ClientResult(prompt, rec)


async def one_request(client, model: str, res: ClientResult, spec: LoadSpec, mode: str) -> None:
    """Send one streaming request and fill `res` (its record's start is when it was created). `res.accepted` is
    set as soon as the server answers 200 (its stream opens), `res.heard_at` then and at each token, the record's
    TTFT as soon as the first content chunk arrives: a request in flight that the server accepted shows that the
    server works while it was heard from within ACCEPTED_SILENT_S (queued behind others, a slow prefill)."""
    from openai import APIConnectionError

    rec, t0 = res.record, time.perf_counter()
    rec.started_at = datetime.now(UTC)
    chunks: list[tuple[float, int]] = []
    usage = None
    try:
        stream = await client.chat.completions.create(
            model=model, messages=res.prompt.as_messages(), max_tokens=spec.max_tokens,
            temperature=spec.temperature, stream=True, stream_options={"include_usage": True},
            extra_body={"speculative": mode == "spec"})
        res.accepted, res.heard_at = True, time.perf_counter()
        async with stream:  # closed when cancelled too: the server sees the client go and frees the slot
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    text = choice.delta.content if choice.delta else None
                    if text:
                        res.heard_at = time.perf_counter()
                        chunks.append(((res.heard_at - t0) * 1000.0, len(text)))
                        if rec.ttft_ms is None:
                            rec.ttft_ms = chunks[0][0]
        if usage is None:
            raise RuntimeError("the stream ended without usage (stream_options.include_usage)")
        if _usage_counts(usage) is None:
            raise RuntimeError(f"the stream's usage has no token counts: {usage}")
    except asyncio.CancelledError:
        rec.status, rec.error = "cancelled", "cancelled by the load test"  # run_level says why
        raise
    except Exception as exc:  # noqa: BLE001 - a failed request is a result, recorded with its error
        rec.status, rec.error = "error", f"{type(exc).__name__}: {exc}"[:500]
        res.unreachable = isinstance(exc, APIConnectionError)
    finally:
        res.ended_at = datetime.now(UTC)
        res.chunk_times_ms = [t for t, _ in chunks]
        if chunks:
            rec.ttft_ms, rec.e2e_ms = chunks[0][0], chunks[-1][0]
        _take_counts(rec, chunks, usage, spec=mode == "spec")
        res.admitted_at = admission(rec.started_at, res.ended_at, usage)


def admission(started_at: datetime, ended_at: datetime, usage) -> datetime | None:
    """When the server admitted the request into a batch slot: its send plus the wait `specfinops serve` reports
    in the usage's "specfinops" extension (`queue_ms`, arrival to admission), at most its end; None without it.
    The server is on this machine (loopback only), so send and arrival are the same instant but for the
    loopback's microseconds."""
    ours = (getattr(usage, "model_extra", None) or {}).get("specfinops")
    queue_ms = ours.get("queue_ms") if isinstance(ours, dict) else None
    if isinstance(queue_ms, bool) or not isinstance(queue_ms, int | float) or not 0 <= queue_ms < math.inf:
        return None
    try:
        return min(started_at + timedelta(milliseconds=queue_ms), ended_at)
    except OverflowError:  # a wait no server reports: said nothing
        return None


def _take_counts(rec: RequestRecord, chunks: list[tuple[float, int]], usage, *, spec: bool) -> None:
    """The request's tokens, whatever way it ended: the usage's counts where the server sent them (`specfinops
    serve` sends them before the error event of a stream that failed or that it cancelled), else what the client
    received, one token per content chunk (each carries one at least; a step's tokens come in one chunk). The
    server generated those tokens whether the request ended ok or not: kept, the store's sums follow /metrics.
    Without usage (a stream the load test cut, a lost connection) the prompt tokens, the tokens the server made
    but the client did not receive and a speculative request's speculation counts cannot be known here: the
    prompt tokens and those counts are recorded as unknown (None, NULL in the store), not 0 (an AR request drafts
    nothing: its 0 drafts are known)."""
    counts = _usage_counts(usage)
    num_output = counts[1] if counts is not None else len(chunks)
    rec.tokens = token_rows(chunks, num_output)
    # one token row per counted token; tokens that came without any text (the usage counts them) count, with
    # no first-token time or token rows: when they were generated the client cannot tell
    rec.output_tokens = len(rec.tokens) if chunks else num_output
    if counts is None:
        rec.prompt_tokens = None
        if spec:
            rec.num_drafts = rec.num_draft_tokens = rec.num_accepted_tokens = None
        return
    rec.prompt_tokens = counts[0]
    _take_speculation_counts(rec, usage, spec=spec)


def _usage_counts(usage) -> tuple[int, int] | None:
    """(prompt tokens, completion tokens) of a usage object; None without usage, or where they are not counts."""
    counts = getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
    return counts if all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts) else None


def _take_speculation_counts(rec, usage, *, spec: bool) -> None:
    """The server's speculation counts for the request (usage's "specfinops" extension), when it sent them:
    the load test's runs then carry acceptance, though not the steps only the server sees. A speculative request
    whose server sent none (another OpenAI-compatible server), or counts no engine makes (more accepted than
    drafted tokens), has unknown counts (None), not 0."""
    counts = (getattr(usage, "model_extra", None) or {}).get("specfinops")
    values = [counts.get(k) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")] \
        if isinstance(counts, dict) else []
    drafts, drafted, accepted = values or (None, None, None)
    if values and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values) \
            and accepted <= drafted and drafts <= drafted:  # counts no engine makes stay unknown, not stored
        rec.num_drafts, rec.num_draft_tokens, rec.num_accepted_tokens = values
    elif spec:
        rec.num_drafts = rec.num_draft_tokens = rec.num_accepted_tokens = None


PROGRESS_EVERY_S = 0.5  # how often a level reports its progress (`on_progress`)


def backoff_s(failures: int) -> float:
    """A worker's pause after `failures` failed requests in a row: no worker loops on a refusing server."""
    return min(BACKOFF_S * 2 ** (failures - 1), BACKOFF_MAX_S)


class _Stop(Exception):
    """A worker's word that the level must stop: its requests all fail (the reason is the message)."""


class _Failing:
    """The requests that failed since the level last saw a request ok (refusals excused by `serving` not
    counted)."""

    def __init__(self) -> None:
        self.results: list[ClientResult] = []
        self.since: float | None = None

    def working(self) -> None:
        self.results, self.since = [], None

    def failed(self, res: ClientResult, now: float) -> str | None:
        """Count a failure; the reason to stop once every request failed for FAIL_FAST_S (FAIL_FAST_MIN at least)."""
        self.results.append(res)
        self.since = now if self.since is None else self.since
        n, span = len(self.results), now - self.since
        if n < FAIL_FAST_MIN or span < FAIL_FAST_S:
            return None
        if all(r.unreachable for r in self.results):
            return (f"the server stopped answering: {n} requests in {span:.0f} s failed to connect "
                    f"({_distinct_errors(self.results)})")
        return f"every request failed for {span:.0f} s ({n} requests): {_distinct_errors(self.results)}"


async def run_level(client, model: str, prompts: list[Prompt], spec: LoadSpec, level: int, mode: str,
                    on_result: Callable[[ClientResult], None] | None = None,
                    on_progress: Callable[[float, int, int, bool], None] | None = None,
                    power: ServerPower | None = None) -> LevelResult:
    """`level` workers issue requests back to back until the duration is over; in-flight ones finish
    (or are cancelled, and recorded so, DRAIN_GRACE_S later). A worker pauses after a failed request
    (`backoff_s`); LevelFailed (after recording what the level did) when every request failed for
    FAIL_FAST_S, or none succeeded by the end. On any way out, Ctrl-C included, the workers are cancelled
    and awaited before this returns, and the requests in flight are recorded 'cancelled'.
    `on_result(res)` records a finished request; with `power`, once its energy share is known.
    `on_progress(elapsed_s, requests_ok, output_tokens, final)` is called every PROGRESS_EVERY_S while
    the level runs, and at its end with final True."""
    results: list[ClientResult] = []
    inflight: dict[int, ClientResult] = {}
    ended: list[tuple[datetime, datetime]] = []  # finished requests' windows that later ones may overlap
    counter = iter(range(1 << 62))
    t_begin = time.perf_counter()
    deadline = t_begin + spec.duration_s
    ok = [0, 0]  # requests ok, their output tokens: what `on_progress` reports
    failing = _Failing()

    def record(res: ClientResult) -> None:
        if on_result is not None:
            on_result(res)

    def done(res: ClientResult) -> None:
        results.append(res)
        if res.record.status == "ok":
            ok[0] += 1
            ok[1] += res.record.output_tokens
        if power is None:
            record(res)
            return
        # who shared the devices with it: finished requests that overlapped it, and those still in flight (their
        # admission, so their windows, known once they finish: ServerPower waits for them)
        start, end = res.energy_since, res.ended_at
        alive = [r for r in inflight.values() if r is not res and r.record.started_at < end]
        power.add(res, [w for w in ended if w[1] > start and w[0] < end], alive)
        oldest = min((r.record.started_at for r in inflight.values()), default=end)
        ended[:] = [w for w in ended if w[1] > oldest]  # no request still to finish can overlap the others
        ended.append((start, end))

    def serving(now: float) -> bool:
        """A request the server accepted is in flight, and the server was heard from on it within
        ACCEPTED_SILENT_S: one it took and then hangs on shows it works for that long only."""
        return any(r.accepted and now - r.heard_at < ACCEPTED_SILENT_S for r in inflight.values())

    async def worker() -> None:
        failures = 0
        while time.perf_counter() < deadline:
            res = new_result(prompts[next(counter) % len(prompts)])
            inflight[id(res)] = res
            await one_request(client, model, res, spec, mode)
            del inflight[id(res)]
            done(res)
            if res.record.status == "ok":
                failures = 0
                failing.working()
                continue
            failures += 1
            now = time.perf_counter()
            if not res.accepted and serving(now):
                # a refusal while the server serves those it took (an overloaded server answers the surplus 503):
                # not counted. A request it accepted and then failed is the server's failure: counted, whatever
                # else is in flight.
                pass
            elif (reason := failing.failed(res, now)) is not None:
                raise _Stop(reason)
            await asyncio.sleep(min(backoff_s(failures), max(deadline - now, 0.0)))

    async def ticker() -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            on_progress(time.perf_counter() - t_begin, ok[0], ok[1], False)

    async def settler() -> None:
        while True:
            await asyncio.sleep(SETTLE_EVERY_S)
            keep_from = min((r.record.started_at for r in inflight.values()), default=datetime.now(UTC))
            for res in await power.settle(keep_from=keep_from):
                record(res)

    workers = [asyncio.ensure_future(worker()) for _ in range(level)]
    helpers = [asyncio.ensure_future(ticker())] if on_progress is not None else []
    if power is not None:
        helpers.append(asyncio.ensure_future(settler()))
    interrupted, stopped = True, None
    why = "cancelled: the load test was interrupted (Ctrl-C or SIGTERM)"
    try:
        finished, _ = await asyncio.wait(workers, timeout=spec.duration_s + DRAIN_GRACE_S,
                                         return_when=asyncio.FIRST_EXCEPTION)
        interrupted = False
        errors = [w.exception() for w in finished if w.exception() is not None]
        for exc in errors:
            if not isinstance(exc, _Stop):
                raise exc  # a bug: as it is
        stopped = str(errors[0]) if errors else None
        why = ("cancelled: the level stopped, its requests failing" if stopped
               else "cancelled at the load test's deadline")
    finally:
        for task in workers + helpers:  # before anything else: no worker may run on (a closed client)
            task.cancel()
        await asyncio.gather(*workers, *helpers, return_exceptions=True)
        for res in list(inflight.values()):  # cancelled above, or by the interrupt: recorded so, by us
            res.record.status, res.record.error = "cancelled", why  # with the tokens it received (one_request)
            del inflight[id(res)]  # out of flight first, as a worker does: done() shares with it as one that ended
            done(res)
        t_end = time.perf_counter()  # the load ends here: waiting for power samples below is not its time
        if power is not None:
            for res in await power.settle(final=True, wait_s=0.0 if interrupted else SETTLE_S):
                record(res)
    if on_progress is not None:
        on_progress(t_end - t_begin, ok[0], ok[1], True)
    result = LevelResult(level, mode, results, requests_span_s(r.record for r in results) or (t_end - t_begin))
    if stopped is not None:
        raise LevelFailed(stopped, result)
    if ok[0] == 0 and results:
        raise LevelFailed(f"no request of the level succeeded ({len(results)} requests): "
                          f"{_distinct_errors(results) or 'all cancelled'}", result)
    if not results:  # the duration ended before a request was sent: nothing was measured
        raise LevelFailed(f"the level sent no request in its {spec.duration_s:g} s (--duration too short?)", result)
    return result


# ---------------------------------------------------------------------------------------------- energy

SETTLE_EVERY_S = 0.5  # how often a level reads the server's new power samples (ServerPower)
SETTLE_S = 3.0  # after a level, how long it waits for samples covering its last requests' ends
READINGS_KEPT_S = 10.0  # samples kept from before the oldest request still to be attributed


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)  # the store keeps UTC (SQLite: naive)


class ServerPower:
    """Energy for the load test's requests from the power samples a server records into the same store
    (with its 'serve' run `run_id`): at every instant the devices' energy is shared equally by the load
    test's requests running then (`attribute_energy`, as the server shares it among its requests; other
    clients' requests at the same time are not seen here). A request runs from its admission to its end
    (`ClientResult.energy_since`): its time queued at the server takes no share, as the server counts it. A
    request's share is known once samples cover its end and the requests in flight beside it have finished
    (their admission is in their usage): it waits here until then; one the samples never cover (the server gone)
    is recorded without energy."""

    def __init__(self, engine, run_id: int) -> None:
        self._engine, self._run_id = engine, run_id
        self._readings: list[PowerReading] = []
        self._pending: list[tuple[ClientResult, list[tuple[datetime, datetime]], list[ClientResult]]] = []
        self._after = datetime.now(UTC) - timedelta(seconds=READINGS_KEPT_S)  # newest sample read
        self._broken = False

    def add(self, res: ClientResult, sharers: list[tuple[datetime, datetime]],
            alive: Sequence[ClientResult] = ()) -> None:
        """A finished request, the windows of the finished requests beside it and the requests still in flight
        at its end (their windows once they finish)."""
        self._pending.append((res, sharers, list(alive)))

    @staticmethod
    def _windows(res: ClientResult, sharers, alive) -> list[tuple[datetime, datetime]] | None:
        """`res`'s energy window and those of the requests beside it, each from its admission to its end; None
        while one in flight beside it has not finished (its admission unknown yet). One in flight at `res`'s end
        may have ended before it all the same: the requests a level cancels at its end are cut one by one, and
        shared with one another in any order (`run_level`)."""
        if any(r.ended_at is None for r in alive):
            return None
        end = res.ended_at
        beside = [*sharers, *((r.energy_since, min(r.ended_at, end)) for r in alive)]
        return [(res.energy_since, end), *(w for w in beside if w[0] < min(w[1], end) and w[1] > res.energy_since)]

    def _read(self, after: datetime) -> list[PowerReading]:
        """The run's samples newer than `after` (database I/O: called in a thread)."""
        from sqlalchemy import select

        from telemetry.db import PowerSample as P

        with self._engine.connect() as conn:
            rows = conn.execute(select(P.t, P.device_index, P.power_w, P.energy_mj, P.utilization_pct, P.source)
                                .where(P.run_id == self._run_id, P.t > after).order_by(P.t, P.id)).all()
        return [PowerReading(_aware(t), device, power_w, energy_mj, util, source)
                for t, device, power_w, energy_mj, util, source in rows]

    async def settle(self, *, final: bool = False, wait_s: float = 0.0,
                     keep_from: datetime | None = None) -> list[ClientResult]:
        """Read the new samples (waiting up to `wait_s` until they cover every pending request) and return the
        requests they cover, each with its share in `record.energy_j`; `final`: every pending one, the rest
        without energy. Samples older than every request still to come (`keep_from`) are let go."""
        deadline = time.perf_counter() + wait_s
        while True:
            if not self._broken:
                try:
                    new = await asyncio.to_thread(self._read, self._after)
                except Exception as exc:  # noqa: BLE001 - the energy is lost then, never the requests
                    self._broken = True
                    logger.warning("loadtest: cannot read the server's power samples (%s): requests are "
                                   "recorded without energy", exc)
                    new = []
                if new:
                    self._readings.extend(new)
                    self._after = new[-1].t
            covered = self._readings[-1].t if self._readings else None
            waiting = any(covered is None or covered < res.ended_at for res, _, _ in self._pending)
            if not waiting or self._broken or time.perf_counter() >= deadline:
                break
            await asyncio.sleep(0.1)
        out, keep = [], []
        for res, sharers, alive in self._pending:
            windows = self._windows(res, sharers, alive)
            if covered is not None and covered >= res.ended_at and windows is not None:
                res.record.energy_j = attribute_energy(self._readings, windows)[0]
                out.append(res)
            elif final:
                out.append(res)
            else:
                keep.append((res, sharers, alive))
        self._pending = keep
        starts = [t for res, sharers, alive in keep
                  for t in (res.record.started_at, *(s for s, _ in sharers), *(r.record.started_at for r in alive))]
        if keep_from is not None:
            starts.append(keep_from)
        if starts:
            cut = min(starts) - timedelta(seconds=READINGS_KEPT_S)
            self._readings = [r for r in self._readings if r.t >= cut]
        return out


# ---------------------------------------------------------------------------------------------- driver


class NotOpenAIServer(ValueError):
    """GET /v1/models answered 2xx, but not with an OpenAI model list (`check_server` names the URL)."""


def model_cards(response) -> list[dict]:
    """The model cards of an httpx response to GET /v1/models: {"data": [{"id": ...}, ...]}, or NotOpenAIServer
    saying what it answered instead (an HTML page, JSON of another shape)."""
    try:
        body = response.json()
    except ValueError:  # not JSON (UnicodeDecodeError included)
        body = None
    data = body.get("data") if isinstance(body, dict) else None
    if isinstance(data, list) and all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in data):
        return data
    kind = response.headers.get("content-type", "no content type").split(";")[0].strip()
    shape = "" if body is None else " without a 'data' list of models ({'id': ...})"
    excerpt = response.text[:60].strip()
    said = f": {excerpt!r}{'...' if len(response.text) > 60 else ''}" if excerpt else ", an empty body"
    raise NotOpenAIServer(f"GET {response.request.url.path} answered {response.status_code} {kind}{shape}{said}")


async def server_model(client, wanted: str | None) -> dict:
    """The model card to load-test (the first the server lists unless `wanted`)."""
    answer = await client.models.with_raw_response.list()  # unparsed: a page of another shape is said as such
    cards = model_cards(answer.http_response)
    if not cards:
        raise ValueError("the server lists no model")
    if wanted is None:
        return cards[0]
    for card in cards:
        if card["id"] == wanted:
            return card
    raise ValueError(f"--model: the server does not serve {wanted!r}; it serves {', '.join(c['id'] for c in cards)}")


def _server_said(exc) -> str:
    """An openai.APIStatusError as '401 incorrect API key': the status and the server's own message."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    message = body.get("message") if isinstance(body, dict) else None
    return f"{exc.status_code} {message or exc.message}"


def _client(spec: LoadSpec, *, headers: dict | None = None, timeout_s: float | None = None):
    """The load test's client, which reaches the loopback URL it was given and nothing else: it follows no redirect
    and takes no proxy from the environment (HTTP_PROXY, ALL_PROXY). The SDK's own client did both, so a server
    answering 307 to another host, or a proxy variable, sent the workload, the API key and the store's client key
    off this machine."""
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    return AsyncOpenAI(base_url=base_url(spec.url), api_key=spec.api_key or "none", max_retries=0,
                       timeout=timeout_s or spec.duration_s + DRAIN_GRACE_S, default_headers=headers,
                       http_client=DefaultAsyncHttpxClient(follow_redirects=False, trust_env=False))


async def check_server(client, spec: LoadSpec, prompts: Sequence[Prompt] = ()) -> dict:
    """The card of the model to load-test, once the server has answered for it; ValueError saying what is
    wrong otherwise: nothing answers, what answers is not an OpenAI-compatible server, the API key is refused,
    no such model, or --max-tokens cannot fit its context window (every request would be refused): after a
    one-token prompt, and, on a `specfinops serve` server, after the longest of `prompts` (`refuse_long_prompts`)."""
    import openai

    try:
        card = await server_model(client, spec.model)
    except openai.AuthenticationError as exc:
        if spec.api_key is None:  # the client sent a placeholder key: the server's word on it ("incorrect") misleads
            raise ValueError(f"the server at {spec.url} wants an API key: pass --api-key ({exc.status_code}; no key "
                             "was given)") from None
        raise ValueError(f"the server at {spec.url} refused the API key (--api-key) ({_server_said(exc)})") from None
    except openai.APIConnectionError as exc:
        cause = f": {exc.__cause__}" if exc.__cause__ is not None and str(exc.__cause__) else ""
        raise ValueError(f"cannot reach {spec.url}: {exc.message}{cause}") from None
    except openai.APIStatusError as exc:
        if 300 <= exc.status_code < 400:
            to = exc.response.headers.get("location") or "another address"
            raise ValueError(f"the server at {spec.url} redirects GET /v1/models ({exc.status_code}) to {to}: the "
                             "load test follows no redirect, it reaches only the loopback URL it is given; give "
                             "--url the address the server answers on") from None
        raise ValueError(f"the server at {spec.url} answered GET /v1/models with {_server_said(exc)}") from None
    except NotOpenAIServer as exc:
        raise ValueError(f"the server at {spec.url} is not an OpenAI-compatible server ({exc})") from None
    max_len = card.get("max_model_len")
    if isinstance(max_len, int) and not isinstance(max_len, bool) and spec.max_tokens > max_len - 2:
        raise ValueError(f"--max-tokens {spec.max_tokens} cannot fit the server's context window: max_model_len "
                         f"{max_len}, shared by the prompt and the output (at most {max_len - 2} output tokens "
                         "after a one-token prompt)")
    refuse_spec_without_drafter(card, spec)
    if isinstance(max_len, int) and not isinstance(max_len, bool) and card.get("owned_by") == "specfinops":
        await refuse_long_prompts(client, card["id"], spec, prompts, max_len)
    return card


LONGEST_PROBED = 4  # the workload's prompts with the most characters whose token counts the server is asked for
_PROMPT_TOKENS = re.compile(r"the prompt is (\d+) tokens")  # `specfinops serve`'s context_length_exceeded wording


async def refuse_long_prompts(client, model: str, spec: LoadSpec, prompts: Sequence[Prompt], max_len: int) -> None:
    """ValueError when --max-tokens cannot follow the workload's longest prompt in the server's context window,
    or when that prompt alone does not fit it (then no --max-tokens helps): the requests that send it would be
    refused 400 and the runs filled with errors. The longest prompts by characters (LONGEST_PROBED of them) are sent with max_tokens = `max_len`,
    which leaves no prompt room: `specfinops serve` refuses each at once (400, nothing run or recorded) saying
    how many tokens its prompt is, chat template included. A prompt it says nothing of is not judged."""
    import openai

    longest = sorted({p.id: p for p in prompts}.values(),
                     key=lambda p: sum(len(str(m.get("content") or "")) for m in p.as_messages()),
                     reverse=True)[:LONGEST_PROBED]
    counted: list[tuple[int, Prompt]] = []
    for prompt in longest:
        try:
            await client.chat.completions.create(model=model, messages=prompt.as_messages(), max_tokens=max_len,
                                                 temperature=spec.temperature)
        except openai.BadRequestError as exc:
            found = _PROMPT_TOKENS.search(_server_said(exc))
            if found:
                counted.append((int(found.group(1)), prompt))
        except openai.APIError:  # not this server's refusal: the requests themselves will say
            continue
    if not counted:
        return
    num_prompt, prompt = max(counted, key=lambda c: c[0])
    if num_prompt > max_len - 2:  # the prompt alone fills the window: no --max-tokens fits after it
        too_long = sorted((c for c in counted if c[0] > max_len - 2), key=lambda c: c[0], reverse=True)
        one = len(too_long) == 1
        it = "it" if one else "them"
        named = ", ".join(f"{p.id} ({n} tokens)" for n, p in too_long)
        raise ValueError(f"the workload's prompt{'' if one else 's'} {named} {'is' if one else 'are'} too long for "
                         f"the server's context window, as the server counts {it}: max_model_len {max_len} holds "
                         f"at most {max_len - 2} prompt tokens (with one output token), whatever --max-tokens is; "
                         f"the requests that send {it} would be refused (serve with a larger --max-len, or use a "
                         f"workload without {it})")
    room = max_len - 1 - num_prompt  # the prompt and the output share max_len - 1 positions (serve keeps one spare)
    if spec.max_tokens > room:
        raise ValueError(f"--max-tokens {spec.max_tokens} cannot fit the server's context window after this "
                         f"workload's longest prompt ({prompt.id}, {num_prompt} tokens as the server counts it): "
                         f"max_model_len {max_len}, at most {room} output tokens fit after it; the requests that "
                         "send it would be refused (lower --max-tokens, or serve with a larger --max-len)")


def refuse_spec_without_drafter(card: dict, spec: LoadSpec) -> None:
    """ValueError when --mode spec or both targets a server whose model card says it drafts nothing (drafter
    null, k_policy 'none': `specfinops serve --k 0`, a plain AR server): its 'spec' runs would be AR decoding
    recorded as speculation, and `cost`/`invocations` would report a speedup that never happened. A card
    that says nothing of its drafter (another OpenAI-compatible server) is not judged."""
    extra = card.get("specfinops")
    if "spec" not in spec.modes or not isinstance(extra, dict):
        return
    if "drafter" not in extra or extra["drafter"] is not None or extra.get("k_policy") != "none":
        return
    why = ("--mode both would compare AR decoding with AR decoding, a speedup that never happened"
           if "ar" in spec.modes else "its 'spec' runs would be AR decoding recorded as speculation")
    raise ValueError(f"the server at {spec.url} does not speculate (its card: drafter none): {why}; "
                     "use --mode ar, or serve with a K of 1 or more")


async def probe_server(spec: LoadSpec, prompts: Sequence[Prompt] = ()) -> dict:
    """`check_server` with a client of its own (10 s timeout): before a store is opened or created."""
    client = _client(spec, timeout_s=10.0)
    try:
        return await check_server(client, spec, prompts)
    finally:
        await client.close()


@dataclass(frozen=True, slots=True)
class SharedStore:
    """The server records into the load test's store too: the key that leaves it the requests the load
    test records (RECORDED_IN_HEADER), and its 'serve' run, whose power samples give them their energy."""

    engine: object
    key: str
    run_id: int
    power_source: str  # the server's: nvml | rapl | estimate | none


def shared_store(engine, card: dict) -> SharedStore | None:
    """The server's side of this store when it records into it: the model card names its run and the id of
    its key (`specfinops.telemetry`), which this store must hold. None when it records elsewhere or not at
    all: then it records the load test's requests in its own store as well."""
    from sqlalchemy import select

    from serving.server_telemetry import read_client_key
    from telemetry.db import Run

    extra = card.get("specfinops")
    tel = extra.get("telemetry") if isinstance(extra, dict) else None
    if not isinstance(tel, dict):
        return None
    run_id, key_id = tel.get("run_id"), tel.get("key_id")
    if not isinstance(run_id, int) or isinstance(run_id, bool) or not isinstance(key_id, str):
        return None
    key = read_client_key(engine, run_id, key_id)
    if key is None:
        return None
    with engine.connect() as conn:
        source = conn.execute(select(Run.power_source).where(Run.id == run_id)).scalar_one()
    return SharedStore(engine, key, run_id, source)


def loadtest_run_info(card: dict, mode: str, level: int, workload: str, temperature: float, node_id: str,
                      power_source: str = "none", *, max_tokens: int | None = None, invocation_id: str | None = None):
    """A 'loadtest' run: the server's device where its model card says it (`specfinops serve` does: its process's
    threads, which the run is priced by), else this machine's (loopback: the server runs here), its model, and the
    server's power source when its power samples give the requests their energy (`ServerPower`). Its sampling is
    what every request asks for: `temperature` and `max_tokens`; no top_p, top_k or seed is sent, so top_p 1 and
    top_k 0 (off, the API's defaults) and no seed. `invocation_id`: the load test's, shared by all its runs."""
    import socket

    from serving.worker import device_name, software_version
    from telemetry.records import RunInfo

    extra = card.get("specfinops") or {}
    return RunInfo(
        mode=mode, node_id=node_id, hostname=socket.gethostname(), device=str(extra.get("device") or device_name()),
        backend=extra.get("backend", "unknown"), dtype=extra.get("dtype", "unknown"),
        target=str(card.get("root") or card["id"]), drafter=extra.get("drafter") if mode == "spec" else None,
        k_policy=extra.get("k_policy", "unknown") if mode == "spec" else "none", temperature=temperature,
        workload=workload, power_source=power_source, software_version=software_version(), concurrency=level,
        kind="loadtest", top_p=1.0, top_k=0, seed=None, max_new_tokens=max_tokens, invocation_id=invocation_id,
    )


async def run_loadtest(spec: LoadSpec, prompts: list[Prompt], *, workload: str, recorder=None,
                       shared: SharedStore | None = None, card: dict | None = None, node_id: str = "",
                       say: Callable[[str], None] = lambda m: None,
                       progress: Callable[[str, int], Callable[[float, int, int, bool], None]] | None = None,
                       results: list[LevelResult] | None = None, invocation_id: str | None = None) -> list[LevelResult]:
    """Every level x mode in turn; each stored as a run when `recorder` is given. `shared` (the server
    records into the recorder's store too, `shared_store`): its key goes with every request, so the server
    leaves these requests to the load test's runs, and they carry the energy its power samples give them.
    `card`: the server's model card, when `probe_server` got it already. LoadTestFailed at a failed level
    (its run 'failed'); Ctrl-C ends the level's run 'cancelled'. `progress(mode, level)`, when given,
    returns the level's `on_progress` (see run_level); without it each level is announced through `say`.
    `results`, when given, is the list returned, filled as each level ends: what ran when Ctrl-C stops the
    load test (the level it stopped is there too, `interrupted`, with its requests until then).
    `invocation_id` (a fresh uuid4 hex when None) goes on every run: speedups pair this load test's spec and AR
    levels, measured against the same server under the same conditions."""
    import uuid

    from serving.server_telemetry import RECORDED_IN_HEADER

    spec.validate()
    invocation_id = invocation_id or uuid.uuid4().hex
    if recorder is None:
        shared = None
    client = _client(spec, headers={RECORDED_IN_HEADER: shared.key} if shared is not None else None)
    out: list[LevelResult] = results if results is not None else []
    try:
        card = card or await check_server(client, spec, prompts)
        refuse_spec_without_drafter(card, spec)  # a card probe_server got: checked there too, for other callers
        measured = shared is not None and shared.power_source != "none"
        for level in spec.levels:
            for mode in spec.modes:
                tick = progress(mode, level) if progress is not None else None
                if tick is None:
                    say(f"{mode} c={level}: {spec.duration_s:g} s ...")
                run_id = None
                if recorder is not None:
                    run_id = recorder.start_run(loadtest_run_info(
                        card, mode, level, workload, spec.temperature, node_id,
                        shared.power_source if measured else "none", max_tokens=spec.max_tokens,
                        invocation_id=invocation_id))
                seen: list[ClientResult] = []  # every request the level records, whatever way it ends

                def sink(r: ClientResult, rid: int | None = run_id, seen: list[ClientResult] = seen) -> None:
                    seen.append(r)
                    if recorder is not None:
                        recorder.record_request(rid, r.record)

                power = ServerPower(shared.engine, shared.run_id) if measured else None
                status, t_level = "failed", time.perf_counter()
                try:
                    res = await run_level(client, card["id"], prompts, spec, level, mode, on_result=sink,
                                          on_progress=tick, power=power)
                    status = "completed"
                except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C / SIGTERM: stopped, not failed
                    status = "cancelled"
                    wall = requests_span_s(r.record for r in seen) or (time.perf_counter() - t_level)
                    out.append(LevelResult(level, mode, seen, wall, run_id,
                                           interrupted=True))  # the store's wall time, as run_level's
                    raise
                except LevelFailed as exc:
                    exc.result.run_id = run_id
                    out.append(exc.result)
                    raise LoadTestFailed(f"{mode} c={level}: {exc}", out) from None
                finally:
                    if recorder is not None:
                        recorder.end_run(run_id, status)
                res.run_id = run_id
                out.append(res)
    finally:
        await client.close()  # the levels' workers are all done: nothing is left to use it
    return out


def summarize(res: LevelResult) -> dict:
    from telemetry.queries import percentile

    ok = [r for r in res.results if r.record.status == "ok"]
    tokens = sum(r.record.output_tokens for r in ok)
    ttft = [r.record.ttft_ms for r in ok if r.record.ttft_ms is not None]
    tpot = [t for r in ok if (t := r.tpot_ms) is not None]
    itl = [g for r in ok for g in r.itl_ms]
    row = {"mode": res.mode, "concurrency": res.level, "run_id": res.run_id, "wall_s": res.wall_s,
           "requests_ok": len(ok), "requests_error": sum(r.record.status == "error" for r in res.results),
           "requests_cancelled": sum(r.record.status == "cancelled" for r in res.results),
           # no request finished ok: nothing was measured (None, shown '—'), not 0 tokens/s
           "output_tokens": tokens, "tokens_per_s": tokens / res.wall_s if ok and res.wall_s > 0 else None,
           "interrupted": res.interrupted}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl)):
        for q in (50, 95, 99):
            row[f"{name}_p{q}_ms"] = percentile(values, q)
    row["errors"] = error_messages(res.results)[:5]
    return row


def _fmt(x, spec=".1f") -> str:
    return "—" if x is None else format(x, spec)


def format_table(rows: list[dict]) -> str:
    head = (f"{'mode':<5} {'conc':>4} {'req ok':>6} {'err':>4} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p95':>9} "
            f"{'TPOT p50':>9} {'TPOT p95':>9} {'TPOT p99':>9} {'ITL p50':>8} {'ITL p95':>8} {'run':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['mode']:<5} {r['concurrency']:>4} {r['requests_ok']:>6} {r['requests_error']:>4} "
            f"{_fmt(r['tokens_per_s']):>7} {_fmt(r['ttft_p50_ms']):>9} {_fmt(r['ttft_p95_ms']):>9} "
            f"{_fmt(r['tpot_p50_ms']):>9} {_fmt(r['tpot_p95_ms']):>9} {_fmt(r['tpot_p99_ms']):>9} "
            f"{_fmt(r['itl_p50_ms']):>8} {_fmt(r['itl_p95_ms']):>8} {_fmt(r['run_id'], 'd'):>5}")
    lines.append("times in ms, client's view; TPOT = (E2E - TTFT) / (tokens - 1); ITL between stream chunks")
    for r in rows:
        if not r["requests_ok"] and not r.get("interrupted"):
            lines.append(f"{r['mode']} c={r['concurrency']}: no request succeeded ({r['requests_error']} failed, "
                         f"{r['requests_cancelled']} cancelled): nothing measured")
        if r.get("interrupted"):
            lines.append(f"{r['mode']} c={r['concurrency']} was interrupted (Ctrl-C or SIGTERM): its row counts "
                         "the requests until then")
    return "\n".join(lines)

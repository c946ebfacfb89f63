"""A bounded load test against an OpenAI-compatible server on this machine (loopback only).

For each concurrency level and mode, N workers send streaming chat requests (workload prompts, round
robin) for `duration_s` seconds with the official `openai` client, then stop issuing; requests in
flight finish (bounded by max_tokens and a hard deadline, after which they are cancelled). Timing is
the client's view: TTFT = request sent -> first content chunk, TPOT = (E2E - TTFT) / (tokens - 1),
ITL = gaps between chunks (tokens that arrive in one chunk arrive together and count once).
Each (level, mode) is stored as a run (kind 'loadtest', concurrency = level) with its requests, so
the FinOps capacity at SLA can use it. Loopback only: the device recorded is this machine's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlparse

from serving.workloads import Prompt
from telemetry.records import RequestRecord, TokenRow

LOOPBACK_NAMES = ("localhost", "ip6-localhost")
DRAIN_GRACE_S = 120.0  # after the duration, in-flight requests get this long before they are cancelled
TOKEN_SOURCE = "client"  # token events seen from the client: which step made them is unknown here


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
        base_url(self.url)
        if not self.levels or any(n < 1 for n in self.levels):
            raise ValueError(f"--concurrency levels must be >= 1, got {self.levels}")
        if max(self.levels) > 256:
            raise ValueError(f"--concurrency is capped at 256 clients, got {max(self.levels)}")
        if not 0 < self.duration_s <= 3600:
            raise ValueError(f"--duration must be within (0, 3600] seconds, got {self.duration_s}")
        if any(m not in ("spec", "ar") for m in self.modes) or not self.modes:
            raise ValueError(f"--mode must be spec, ar or both, got {self.modes}")
        if self.max_tokens < 1:
            raise ValueError(f"--max-tokens must be >= 1, got {self.max_tokens}")


@dataclass
class ClientResult:
    prompt: Prompt
    record: RequestRecord
    chunk_times_ms: list[float] = field(default_factory=list)  # content chunks, from request start

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
    """Send one streaming request and fill `res` (its record's start is when it was created)."""
    rec, t0 = res.record, time.perf_counter()
    rec.started_at = datetime.now(UTC)
    chunks: list[tuple[float, int]] = []
    usage = None
    try:
        stream = await client.chat.completions.create(
            model=model, messages=res.prompt.as_messages(), max_tokens=spec.max_tokens,
            temperature=spec.temperature, stream=True, stream_options={"include_usage": True},
            extra_body={"speculative": mode == "spec"})
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text = choice.delta.content if choice.delta else None
                if text:
                    chunks.append(((time.perf_counter() - t0) * 1000.0, len(text)))
        if usage is None:
            raise RuntimeError("the stream ended without usage (stream_options.include_usage)")
        rec.prompt_tokens = usage.prompt_tokens
        rec.tokens = token_rows(chunks, usage.completion_tokens)
        rec.output_tokens = len(rec.tokens)  # one token row per counted token
        _take_speculation_counts(rec, usage)
    except asyncio.CancelledError:
        rec.status, rec.error = "cancelled", "cancelled at the load test's deadline"
        raise
    except Exception as exc:  # noqa: BLE001 - a failed request is a result, recorded with its error
        rec.status, rec.error = "error", f"{type(exc).__name__}: {exc}"[:500]
    finally:
        res.chunk_times_ms = [t for t, _ in chunks]
        if chunks:
            rec.ttft_ms, rec.e2e_ms = chunks[0][0], chunks[-1][0]
        if rec.status != "ok":
            rec.output_tokens, rec.tokens = 0, []


def _take_speculation_counts(rec, usage) -> None:
    """The server's speculation counts for the request (usage's "specfinops" extension), when it sent them:
    the load test's runs then carry acceptance, though not the steps only the server sees."""
    counts = (getattr(usage, "model_extra", None) or {}).get("specfinops")
    if not isinstance(counts, dict):
        return
    values = [counts.get(k) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")]
    if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        rec.num_drafts, rec.num_draft_tokens, rec.num_accepted_tokens = values


PROGRESS_EVERY_S = 0.5  # how often a level reports its progress (`on_progress`)


async def run_level(client, model: str, prompts: list[Prompt], spec: LoadSpec, level: int, mode: str,
                    on_result: Callable[[ClientResult], None] | None = None,
                    on_progress: Callable[[float, int, int, bool], None] | None = None) -> LevelResult:
    """`level` workers issue requests back to back until the duration is over; in-flight ones finish
    (or are cancelled, and recorded so, DRAIN_GRACE_S later). `on_progress(elapsed_s, requests_ok,
    output_tokens, final)` is called every PROGRESS_EVERY_S while the level runs, and at its end with
    final True."""
    results: list[ClientResult] = []
    inflight: dict[int, ClientResult] = {}
    counter = iter(range(1 << 62))
    t_begin = time.perf_counter()
    deadline = t_begin + spec.duration_s
    ok = [0, 0]  # requests ok, their output tokens: what `on_progress` reports

    def done(res: ClientResult) -> None:
        results.append(res)
        if res.record.status == "ok":
            ok[0] += 1
            ok[1] += res.record.output_tokens
        if on_result is not None:
            on_result(res)

    async def worker() -> None:
        while time.perf_counter() < deadline:
            res = new_result(prompts[next(counter) % len(prompts)])
            inflight[id(res)] = res
            await one_request(client, model, res, spec, mode)
            del inflight[id(res)]
            done(res)

    async def ticker() -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            on_progress(time.perf_counter() - t_begin, ok[0], ok[1], False)

    workers = [asyncio.ensure_future(worker()) for _ in range(level)]
    ticking = asyncio.ensure_future(ticker()) if on_progress is not None else None
    try:
        _, pending = await asyncio.wait(workers, timeout=spec.duration_s + DRAIN_GRACE_S)
        for w in pending:
            w.cancel()
        if pending:
            await asyncio.wait(pending)
    finally:
        if ticking is not None:
            ticking.cancel()
    for res in inflight.values():
        res.record.status = "cancelled"
        res.record.output_tokens, res.record.tokens = 0, []
        done(res)
    if on_progress is not None:
        on_progress(time.perf_counter() - t_begin, ok[0], ok[1], True)
    return LevelResult(level, mode, results, time.perf_counter() - t_begin)


# ---------------------------------------------------------------------------------------------- driver


async def server_model(client, wanted: str | None) -> dict:
    """The model card to load-test (the first the server lists unless `wanted`)."""
    page = await client.models.list()
    cards = [m.model_dump() for m in page.data]
    if not cards:
        raise ValueError("the server lists no model")
    if wanted is None:
        return cards[0]
    for card in cards:
        if card["id"] == wanted:
            return card
    raise ValueError(f"the server does not serve {wanted!r}; it serves {', '.join(c['id'] for c in cards)}")


def loadtest_run_info(card: dict, mode: str, level: int, workload: str, temperature: float, node_id: str):
    """A 'loadtest' run: this machine's device (loopback: the server runs here), the server's model."""
    import socket

    from serving.worker import device_name, software_version
    from telemetry.records import RunInfo

    extra = card.get("specfinops") or {}
    return RunInfo(
        mode=mode, node_id=node_id, hostname=socket.gethostname(), device=device_name(),
        backend=extra.get("backend", "unknown"), dtype=extra.get("dtype", "unknown"),
        target=str(card.get("root") or card["id"]), drafter=extra.get("drafter") if mode == "spec" else None,
        k_policy=extra.get("k_policy", "unknown") if mode == "spec" else "none", temperature=temperature,
        workload=workload, power_source="none", software_version=software_version(), concurrency=level,
        kind="loadtest",
    )


async def run_loadtest(spec: LoadSpec, prompts: list[Prompt], *, workload: str, recorder=None,
                       store_key: str | None = None, node_id: str = "",
                       say: Callable[[str], None] = lambda m: None,
                       progress: Callable[[str, int], Callable[[float, int, int, bool], None]] | None = None,
                       ) -> list[LevelResult]:
    """Every level x mode in turn; each stored as a run when `recorder` is given. `store_key` (that
    recorder's store, `telemetry.db.store_key`) goes with every request, so a server recording into the
    same store leaves these requests to the load test's runs instead of recording them twice.
    `progress(mode, level)`, when given, returns the level's `on_progress` (see run_level); without it each
    level is announced with one line through `say`."""
    from openai import AsyncOpenAI

    from serving.server_telemetry import RECORDED_IN_HEADER

    spec.validate()
    headers = {RECORDED_IN_HEADER: store_key} if store_key else None
    client = AsyncOpenAI(base_url=base_url(spec.url), api_key=spec.api_key or "none", max_retries=0,
                         timeout=spec.duration_s + DRAIN_GRACE_S, default_headers=headers)
    out = []
    try:
        card = await server_model(client, spec.model)
        for level in spec.levels:
            for mode in spec.modes:
                tick = progress(mode, level) if progress is not None else None
                if tick is None:
                    say(f"{mode} c={level}: {spec.duration_s:g} s ...")
                run_id = None
                if recorder is not None:
                    run_id = recorder.start_run(loadtest_run_info(card, mode, level, workload, spec.temperature,
                                                                  node_id))
                sink = (lambda r, rid=run_id: recorder.record_request(rid, r.record)) if recorder else None
                status = "failed"
                try:
                    res = await run_level(client, card["id"], prompts, spec, level, mode, on_result=sink,
                                          on_progress=tick)
                    status = "completed"
                except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C / SIGTERM: stopped, not failed
                    status = "cancelled"
                    raise
                finally:
                    if recorder is not None:
                        recorder.end_run(run_id, status)
                res.run_id = run_id
                out.append(res)
    finally:
        await client.close()
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
           "output_tokens": tokens, "tokens_per_s": tokens / res.wall_s if res.wall_s > 0 else None}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl)):
        for q in (50, 95, 99):
            row[f"{name}_p{q}_ms"] = percentile(values, q)
    errors = sorted({r.record.error for r in res.results if r.record.status == "error" and r.record.error})
    row["errors"] = errors[:5]
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
    return "\n".join(lines)

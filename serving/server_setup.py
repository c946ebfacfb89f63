"""Wiring a serving process: load the model, start the engine thread and telemetry, run uvicorn.

`build_state` is used by `specfinops serve` and by the tests (which run uvicorn in a thread);
`serve` runs uvicorn in the foreground, where SIGTERM / SIGINT shut down gracefully: uvicorn stops
accepting connections and waits up to `graceful_s` for in-flight responses; then the engine cancels what is
left (recorded as cancelled), each client gets its documented answer, and the app's shutdown ends both runs
and flushes the recorder.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from serving.lookahead import fixed_k_zero
from serving.sampling import SamplingParams
from serving.server import (
    ANSWER_AFTER_CANCEL_S,
    CorsPolicy,
    ServerState,
    create_app,
    refuse_readers,
    shutdown,
)
from serving.server_engine import EngineLoop
from serving.server_metrics import ServeMetrics
from serving.server_telemetry import MODES, ServeTelemetry, client_key_id, publish_client_key
from serving.worker import EngineSpec, Loaded, default_node_id, load, run_info
from serving.worker import device_name as run_device  # the server's own device, named on its model card
from telemetry.labels import hub_id

if TYPE_CHECKING:
    from serving.engine import Engine

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 8
DEFAULT_DRAIN_S = 5.0
# what a browser sends as Origin: scheme://host[:port], nothing after it (a trailing '/' or a path never matches)
_ORIGIN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s?#]+")


@dataclass
class ServeOptions:
    spec: EngineSpec = field(default_factory=lambda: EngineSpec(max_batch=DEFAULT_MAX_BATCH))
    db: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    telemetry: bool = True
    node_id: str | None = None
    power: str = "auto"
    tdp_w: float | None = None
    served_model_name: str | None = None
    max_waiting: int = 1024
    graceful_s: float = 30.0
    default_max_tokens: int | None = None  # a request without max_tokens: None = the room left in the window
    access_log: bool = False  # uvicorn's access log: one line per HTTP request (client, method, path, status)
    # on SIGTERM, the listener stays open up to this long while requests are in flight: /health says "stopping"
    drain_s: float = DEFAULT_DRAIN_S
    # CORS (vLLM's option names): None = no CORS headers, a browser page on another origin is blocked
    allowed_origins: list[str] | None = None
    allowed_methods: list[str] | None = None  # None: every method ("*"), once origins are allowed
    allowed_headers: list[str] | None = None  # None: every header ("*"), once origins are allowed
    allow_credentials: bool = False

    def validate(self) -> None:
        if self.spec.max_batch < 1:  # before the spec's own check, which calls it "concurrency"
            raise ValueError(f"--max-batch must be >= 1, got {self.spec.max_batch}")
        self.spec.validate()
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be within 0..65535, got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("--api-key must not be empty")
        # an HTTP header carries ASCII (clients refuse to send other characters; a server reads the bytes as
        # Latin-1), and a client's token is read stripped: such a key could never be matched
        if self.api_key is not None and not (self.api_key.isascii() and self.api_key.isprintable()
                                             and self.api_key == self.api_key.strip()):
            raise ValueError("--api-key must be printable ASCII without spaces around it (HTTP headers carry "
                             "ASCII: no client could send this key)")
        # an empty name fell back to the target's name unsaid: clients sending the name given were refused (404)
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("--served-model-name must not be empty (leave it out to serve the target's name)")
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ValueError(f"--default-max-tokens must be >= 1, got {self.default_max_tokens}")
        if self.max_waiting < 1:
            raise ValueError(f"--max-waiting must be >= 1, got {self.max_waiting}")
        # NaN passed `< 0` and meant no grace at all (asyncio.sleep(nan) returns at once); inf, none ever
        if not (math.isfinite(self.graceful_s) and self.graceful_s >= 0):
            raise ValueError(f"--graceful-s must be a finite number of seconds >= 0, got {self.graceful_s:g}")
        if self.tdp_w is not None and not (math.isfinite(self.tdp_w) and self.tdp_w > 0):
            raise ValueError(f"--tdp-w must be a finite number of watts > 0, got {self.tdp_w:g}")
        if not (math.isfinite(self.drain_s) and self.drain_s >= 0):
            raise ValueError(f"--drain-s must be a finite number of seconds >= 0, got {self.drain_s:g}")
        self._validate_cors()

    def _validate_cors(self) -> None:
        if self.allowed_origins is None:  # the CORS options alone would open nothing: said, not ignored
            given = [name for name, value in (("--allowed-methods", self.allowed_methods),
                                              ("--allowed-headers", self.allowed_headers),
                                              ("--allow-credentials", self.allow_credentials or None))
                     if value is not None]
            if given:
                raise ValueError(f"{', '.join(given)} without --allowed-origins: no origin is allowed (name the web "
                                 "pages' origins, e.g. --allowed-origins http://localhost:3000)")
            return
        if not self.allowed_origins:
            raise ValueError("--allowed-origins is empty (leave it out for no CORS at all)")
        for origin in self.allowed_origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(f"--allowed-origins: {origin!r} is not an origin: scheme://host[:port] as a browser "
                                 "sends it (no path, no trailing '/'), or '*'")
        if self.allow_credentials and "*" in self.allowed_origins:
            raise ValueError("--allow-credentials with --allowed-origins '*' would let every web page send its "
                             "visitors' cookies: name the origins")
        for name, values in (("--allowed-methods", self.allowed_methods), ("--allowed-headers", self.allowed_headers)):
            if values is not None and (not values or not all(v.strip() for v in values)):
                raise ValueError(f"{name} has an empty entry (leave it out for '*': every one)")

    def cors(self) -> CorsPolicy | None:
        if self.allowed_origins is None:
            return None
        # a browser asks for the method in capitals ("POST"), which Starlette matches as written: "post" never did
        methods = tuple(m.upper() for m in self.allowed_methods or ["*"])
        return CorsPolicy(origins=tuple(self.allowed_origins), methods=methods,
                          headers=tuple(self.allowed_headers or ["*"]), credentials=self.allow_credentials)


def _k_policy(loaded: Loaded, mode: str) -> str:
    return loaded.spec.k_policy(mode)


def power_source(opts: ServeOptions):
    """The power source --power names. With --no-telemetry nothing is recorded, so `--power auto` falling back
    to no meter (or the estimate) is not warned about, as bench does not warn then; a meter that opens (NVML,
    RAPL) still feeds /metrics' power gauges."""
    from telemetry import power

    if opts.telemetry or opts.power != "auto":
        return power.detect_power_source(opts.power, tdp_w=opts.tdp_w)
    said, level = set(power._said), power.logger.level
    power.logger.setLevel(logging.ERROR)  # the fallback's 'energy not measured' warning
    try:
        return power.detect_power_source(opts.power, tdp_w=opts.tdp_w)
    finally:
        power.logger.setLevel(level)
        power._said.intersection_update(said)  # not said: an opener that records says it still


def build_state(opts: ServeOptions, loaded: Loaded | None = None, source=None) -> ServerState:
    """Load (unless given), warm up, open the store, start the runs, the telemetry and the engine thread.
    `source`: the power source already opened (`serve` opens it before anything else), else opened here."""
    from serving.kernels import in_passing_thread

    opts.validate()
    if source is None:
        source = power_source(opts)  # a meter that cannot be read is said now, not after minutes of loading
    # torch work off this thread, so the engine thread's OpenMP pool is the only one (`in_passing_thread`)
    try:
        loaded, engine = in_passing_thread(_prepare, opts, loaded)
    except BaseException:
        source.close()
        raise
    positions = loaded.target.cfg.max_position
    if opts.spec.max_len > positions:  # the engine keeps the lesser: said, as the model card's max_model_len shows
        logger.warning("context window: the target's %d positions (%s; --max-len %d is more)",
                       positions, loaded.target.cfg.max_position_source, opts.spec.max_len)
    model_id = opts.served_model_name or hub_id(loaded.target_dir) or loaded.target_dir.name
    # `--k 0` (a fixed K of 0, no tree) drafts nothing: a plain AR server throughout, its engine (`_prepare`), its
    # one 'ar' run (no empty 'spec' run), the card (no drafter, the AR run's k_policy) and the client key on that run
    main = "ar" if drafts_nothing(opts.spec) else "spec"
    modes = MODES if main == "spec" else ("ar",)
    recorder, infos, store, client_key = None, None, None, None
    try:
        if opts.telemetry:
            from telemetry.recorder import Recorder
            from telemetry.store import open_store

            store = open_store(opts.db)
            recorder = Recorder(store)
            node = opts.node_id or default_node_id()
            # each request chooses its sampling: the run records none, its requests theirs
            infos = {m: run_info(loaded, m, workload="serve", params=None, node_id=node,
                                 power_source=source.source, concurrency=opts.spec.max_batch, kind="serve",
                                 k_policy=_k_policy(loaded, m)) for m in modes}
        holder: dict = {}
        metrics = ServeMetrics(model_id, running=lambda: holder["loop"].num_running,
                               waiting=lambda: holder["loop"].num_waiting)
        telemetry = ServeTelemetry(metrics, source, recorder=recorder, run_infos=infos).start()
    except BaseException:
        if recorder is not None:
            recorder.close()
        source.close()
        raise
    if recorder is not None:  # the key a client recording into this store sends (RECORDED_IN_HEADER)
        try:
            client_key = publish_client_key(store, telemetry.run_ids[main])
        except BaseException:
            telemetry.close("failed")
            raise
    # "device": what the server runs on, as its own runs record it: a load test's runs are priced by it
    card = {"backend": "torch", "device": run_device(), "dtype": loaded.spec.dtype,
            "drafter": loaded.drafter_label if main == "spec" else None, "k_policy": _k_policy(loaded, main),
            "max_batch": opts.spec.max_batch}
    if client_key is not None:  # where its requests and power samples are; the key itself only in the store
        card["telemetry"] = {"run_id": telemetry.run_ids[main], "key_id": client_key_id(client_key)}
    k = loaded.spec.k
    if str(k).isdigit():
        metrics.prepare_positions(int(k))
    loop = EngineLoop(engine, lambda job, rec, others: telemetry.finish(job.mode if engine.drafter else "ar",
                                                                        rec, others, window=job.ran,
                                                                        store=not job.recorded_by_client),
                      max_waiting=opts.max_waiting)
    holder["loop"] = loop
    loop.start()
    return ServerState(loop_engine=loop, telemetry=telemetry, metrics=metrics, model_id=model_id,
                       max_len=engine.max_len, vocab_size=loaded.target.cfg.vocab_size,
                       tokenizer=loaded.tokenizer, decode=loaded.decode, api_key=opts.api_key,
                       created=int(time.time()), root=str(loaded.target_dir), card=card,
                       store_key=client_key,  # what RECORDED_IN_HEADER must carry: the key, not the store's name
                       default_max_tokens=opts.default_max_tokens, cors=opts.cors())


def _prepare(opts: ServeOptions, loaded: Loaded | None) -> tuple[Loaded, Engine]:
    """Load (unless given) and warm up the model, and make the server's engine (its KV cache)."""
    # a fixed K of 0 drafts nothing (plain AR, as parse_policy says): the AR engine, no drafter fed for nothing, so
    # every request is recorded and counted on /metrics as AR, not as a speculative one with 0 drafts; and no draft
    # model loaded for it (prompt lookup, the drafter named then, reads no model; `serve --k 0` drops any other)
    mode = "ar" if drafts_nothing(opts.spec) else "spec"
    spec = opts.spec if mode == "spec" else replace(opts.spec, drafter="ngram", draft_model=None)
    loaded = loaded or load(spec)
    _warm_up(loaded, mode)
    return loaded, loaded.engine(mode, max_batch=opts.spec.max_batch)


def drafts_nothing(spec) -> bool:
    """A fixed lookahead of 0 (`--k 0`), no tree: speculative decoding that never drafts."""
    return spec.tree is None and fixed_k_zero(spec.k)


def _warm_up(loaded: Loaded, mode: str = "spec") -> None:
    """One short untimed generation in the server's mode, so first-call costs do not land on the first client."""
    ids = list(loaded.tokenizer.encode("Hello"))
    loaded.engine(mode, max_batch=1).generate(ids, SamplingParams(max_new_tokens=4))


def serve(opts: ServeOptions, *, log_level: str = "info", source=None) -> None:
    """Run the server in the foreground until SIGTERM / SIGINT (`source`: as build_state takes it)."""
    state = build_state(opts, source=source)
    run(graceful_server(state, opts, log_level=log_level), state)


def run(server, state: ServerState) -> None:
    """Run `server` (`graceful_server`) until it stops, then end the runs (idempotent: the app's shutdown
    did, unless the start failed, e.g. port in use)."""
    status = "failed"
    try:
        server.run()
        status = "completed" if server.started else "failed"
    finally:
        shutdown(state, status)


def graceful_server(state: ServerState, opts: ServeOptions, *, log_level: str = "info"):
    """uvicorn serving `state`'s app on opts.host:opts.port, whose grace the app ends itself (`--graceful-s`).
    In the main thread SIGTERM / SIGINT stop it; elsewhere (tests) `handle_exit(signal, None)` does."""
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn, whose grace the app ends itself: at `graceful_s` the engine cancels what still runs or
        waits, so each handler sends its documented answer and finishes. uvicorn's own deadline, later by
        the time those answers take, then never has to cancel handlers (nor log an error for it)."""

        async def shutdown(self, sockets=None) -> None:
            deadline = asyncio.ensure_future(_cancel_after_grace(state, opts.graceful_s))
            try:
                await _drain(state, opts.drain_s, lambda: self.force_exit)
                await super().shutdown(sockets)
                if self.force_exit:
                    # a second Ctrl-C (force quit): uvicorn stops waiting for the requests in flight and skips the
                    # app's shutdown, so asyncio.run cancelled every task: a bare 500 or a cut stream per client,
                    # and the lifespan's traceback in the log. Run the app's shutdown all the same; it does not
                    # wait for the requests, it cancels them at once (one decode step), and each is answered.
                    await self.lifespan.shutdown()
            finally:
                deadline.cancel()

    config = uvicorn.Config(create_app(state), host=opts.host, port=opts.port, log_level=log_level,
                            timeout_graceful_shutdown=opts.graceful_s + ANSWER_AFTER_CANCEL_S,
                            access_log=opts.access_log)
    return GracefulServer(config)


def _in_flight(state: ServerState) -> int:
    """Generation requests not answered yet: running, waiting, or still reading, checking or streaming."""
    handlers = sum(not t.done() for t in state.handlers)
    return max(handlers, state.loop_engine.num_running + state.loop_engine.num_waiting)


async def _drain(state: ServerState, drain_s: float, forced) -> None:
    """SIGTERM's first step: the server says it is stopping (/health 503 "stopping", new requests 503
    `shutting_down`) on a listener that stays open, so a load balancer polling /health sees the node draining
    and takes it out, up to `drain_s` while requests are in flight. uvicorn's own shutdown closed the listener at
    once: a health check met a closed port and never a "stopping". An idle server goes straight on (nothing to
    drain); so does a forced quit (a second Ctrl-C). The --graceful-s deadline counts from the signal."""
    state.stopping = True
    busy = _in_flight(state)
    if not busy or drain_s <= 0:
        return
    logger.info("draining: /health answers 503 stopping and new requests are refused while %d request(s) in flight "
                "finish (the listener closes after --drain-s %g at most)", busy, drain_s)
    loop = asyncio.get_running_loop()
    end = loop.time() + drain_s
    while _in_flight(state) and not forced() and loop.time() < end:
        await asyncio.sleep(0.05)


async def _cancel_after_grace(state: ServerState, graceful_s: float) -> None:
    """After `graceful_s`, cancel every request still running or waiting (each is recorded as cancelled and
    its client answered: 503 `cancelled`, or an error event and [DONE]), and every request still reading or
    checking its body (answered 503 `shutting_down`; it never reached the engine: nothing to record). A client
    that stalled mid-body held the shutdown until uvicorn's own deadline, which cancelled it with an ERROR."""
    await asyncio.sleep(graceful_s)
    busy = state.loop_engine.num_running + state.loop_engine.num_waiting
    if busy:
        logger.warning("graceful shutdown: %d request(s) still in flight after --graceful-s %g: cancelling them",
                       busy, graceful_s)
    refused = refuse_readers(state)
    if refused:
        logger.warning("graceful shutdown: %d request(s) still sending or checking their body after --graceful-s "
                       "%g: refused them", refused, graceful_s)
    await asyncio.to_thread(state.loop_engine.stop)

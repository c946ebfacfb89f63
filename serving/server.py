"""OpenAI-compatible HTTP API over the batched engine (FastAPI).

Concurrency model (docs/serving.md): handlers run on the asyncio event loop; they read the body, have it
parsed, validated and tokenized on the tokenizer thread, and submit a `Job` to the ONE engine thread
(`server_engine.EngineLoop`), which owns the `Engine` and decodes every admitted request together
(continuous batching, `max_batch` slots). Tokens come back through the job's asyncio queue, once per
decode step. A client that goes away cancels its sequence; every finished request becomes a telemetry
record of its mode's 'serve' run.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NoReturn

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect

from serving.server_engine import EngineLoop, Finished, Job
from serving.server_metrics import CONTENT_TYPE, ServeMetrics
from serving.server_schemas import (
    APIError,
    ChatRequest,
    Checked,
    CompletionRequest,
    check,
    error_body,
    parse_body,
    validation_error,
)
from serving.server_telemetry import RECORDED_IN_HEADER, ServeTelemetry
from serving.server_text import TextStream, max_prompt_chars

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024  # a request body beyond this is refused (413) without reading the rest
LOG_EVERY_S = 10.0  # a flood of rejections or cancellations: one log line per kind this often, with the count
# A handler cancelled by uvicorn (its graceful-shutdown timeout ran out) cancels its job and waits this long for
# the engine's answer (one decode step at most) before it sends the documented 503 / error event itself.
ANSWER_AFTER_CANCEL_S = 10.0


class RequestLog:
    """What became of requests that the log would not show otherwise (uvicorn's access log is off unless
    `serve --access-log`): refused (503 overloaded, shutting down) or cancelled (the client went away). The
    first of a kind is said at once, with its detail; those that follow within LOG_EVERY_S are counted and said
    in one line at its end ("rejected 192 more requests (overloaded) in the last 10 s"), so a flood of them
    takes a line every 10 s, not one each. On the event loop."""

    def __init__(self, every_s: float = LOG_EVERY_S) -> None:
        self.every_s = every_s
        self._counts: dict[tuple[int, str, str], int] = {}  # (level, verb, why) -> not said yet
        self._windows: dict[tuple[int, str, str], tuple[float, asyncio.TimerHandle]] = {}  # opened at, its end

    def note(self, level: int, verb: str, why: str, detail: str) -> None:
        key = (level, verb, why)
        if key in self._windows:  # said within the last every_s: counted, said at the window's end
            self._counts[key] = self._counts.get(key, 0) + 1
            return
        logger.log(level, "%s a request (%s): %s", verb, why, detail)
        self._open(key)

    def _open(self, key: tuple[int, str, str]) -> None:
        loop = asyncio.get_running_loop()
        self._windows[key] = loop.time(), loop.call_later(self.every_s, self._say, key)

    def _say(self, key: tuple[int, str, str], reopen: bool = True) -> None:
        """Say the count of `key` since its last line; while there is one, keep counting for another every_s."""
        opened, _ = self._windows.pop(key)
        count = self._counts.pop(key, 0)
        if not count:
            return
        level, verb, why = key
        logger.log(level, "%s %d more request%s (%s) in the last %.0f s", verb, count, "s" if count != 1 else "",
                   why, asyncio.get_running_loop().time() - opened)
        if reopen:
            self._open(key)

    def close(self) -> None:
        """Say what is counted and not said yet (the server is stopping)."""
        for key, (_, timer) in list(self._windows.items()):
            timer.cancel()
            self._say(key, reopen=False)


@dataclass(frozen=True)
class CorsPolicy:
    """Which web pages (origins) a browser lets call this API (`serve --allowed-origins`, as vLLM names them).
    None on the state: no CORS header at all, so a page on another origin is blocked by its browser."""

    origins: tuple[str, ...]
    methods: tuple[str, ...] = ("*",)
    headers: tuple[str, ...] = ("*",)
    credentials: bool = False


@dataclass
class ServerState:
    """Everything the handlers share; built by `serving.server_setup.build_state`."""

    loop_engine: EngineLoop
    telemetry: ServeTelemetry
    metrics: ServeMetrics
    model_id: str
    max_len: int
    vocab_size: int
    tokenizer: object
    decode: object  # ids -> text
    api_key: str | None = None
    created: int = 0
    root: str | None = None  # the target's path, like vLLM's model card "root"
    card: dict | None = None  # extension on /v1/models: backend, dtype, drafter, k_policy, max_batch
    store_key: str | None = None  # the client key (server_telemetry.publish_client_key) RECORDED_IN_HEADER must carry
    max_chars: int | None = None  # the longest prompt (characters) that can fit; from the tokenizer if None
    default_max_tokens: int | None = None  # a request's cap without max_tokens (--default-max-tokens); None: the room
    # one thread that validates and tokenizes requests, off the event loop (a long prompt takes seconds)
    checker: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        1, thread_name_prefix="specfinops-tokenize"))
    handlers: set[asyncio.Task] = field(default_factory=set)  # generation requests in flight (their tasks)
    # those of them still reading or checking their body (no job submitted yet): the grace's end cancels them
    reading: set[asyncio.Task] = field(default_factory=set)
    said: RequestLog = field(default_factory=RequestLog)  # rejections and cancellations, in the log
    cors: CorsPolicy | None = None  # None: no CORS headers (`serve --allowed-origins` not given)
    # SIGTERM received: /health answers 503 "stopping" and new requests are refused while those in flight finish
    stopping: bool = False

    def __post_init__(self) -> None:
        if self.max_chars is None:
            self.max_chars = max_prompt_chars(self.tokenizer, self.max_len)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            raise APIError(400, "this model has no chat template: use /v1/completions", param="messages",
                           code="unsupported_value")
        # what chat templates are rendered with
        from jinja2.exceptions import TemplateError, TemplateSyntaxError

        try:
            return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=False))
        except TemplateSyntaxError:  # the model's template is broken: the server's problem (a 500, logged)
            raise
        except TemplateError as exc:  # the template refuses these messages (its raise_exception, e.g. roles that
            # do not alternate, or a system message it has no place for): the client's to fix, not a 500
            raise APIError(400, f"this model's chat template refuses these messages: {exc}", param="messages",
                           code="invalid_value") from None

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        # uvicorn has stopped accepting and waited up to its graceful timeout for in-flight responses, then
        # cancelled the handlers still running. Stop the engine (what runs or waits is cancelled and recorded
        # so), let those handlers send their answers (503 `cancelled`, or an error event and [DONE]) before
        # the process exits, then end the runs and flush the recorder.
        await asyncio.to_thread(state.loop_engine.stop)
        refuse_readers(state)  # (a forced quit skips the grace, whose end refuses them otherwise)
        pending = [t for t in state.handlers if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=ANSWER_AFTER_CANCEL_S)
        state.said.close()  # the counts not said yet
        await asyncio.to_thread(shutdown, state)

    # redirect_slashes off: "/v1/completions/" is an unknown path (404 in the API's error shape), not a bare 307 to
    # a Location built from the client's Host header
    app = FastAPI(title="specfinops", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    app.state.serve = state
    _install_error_handlers(app)
    app.add_middleware(_UnexpectedErrors)
    app.add_middleware(_CorsFromState, state=state)  # outermost: preflights answered before routing and auth

    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: load balancers' and uptime probes' check
    async def health():
        ok = state.loop_engine.alive and not state.stopping  # draining (SIGTERM): out of the balancer's pool
        body = {"status": "ok" if ok else "stopping", "running": state.loop_engine.num_running,
                "waiting": state.loop_engine.num_waiting}
        return JSONResponse(body, status_code=200 if ok else 503)

    # HEAD wherever GET is served (RFC 9110: uptime probes and link checkers ask so); it was a 405
    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics():
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE)

    def model_card() -> dict:
        return {"id": state.model_id, "object": "model", "created": state.created, "owned_by": "specfinops",
                "root": state.root, "max_model_len": state.max_len, "specfinops": state.card or {}}

    @app.api_route("/v1/models", methods=["GET", "HEAD"])
    async def models(request: Request):
        _authorize(request, state)
        return {"object": "list", "data": [model_card()]}

    # openai's models.retrieve(); a served name may hold a '/'. "/v1/models/" (no id) is the list, as without
    # the slash: it answered "the model '' does not exist"
    @app.api_route("/v1/models/{model_id:path}", methods=["GET", "HEAD"])
    async def model(model_id: str, request: Request):
        _authorize(request, state)
        if not model_id:
            return await models(request)
        if model_id != state.model_id:
            raise APIError(404, f"the model {model_id!r} does not exist: this server serves {state.model_id!r}",
                           param="model", code="model_not_found")
        return model_card()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await _generate(request, state, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _generate(request, state, "completion")

    return app


def refuse_readers(state: ServerState) -> int:
    """Cancel the requests still reading or checking their body (each answers 503 `shutting_down`; none reached
    the engine); how many. On the event loop."""
    reading = [t for t in state.reading if not t.done()]
    for task in reading:
        task.cancel()
    return len(reading)


def shutdown(state: ServerState, status: str = "completed") -> None:
    """Stop the engine thread (cancelling what is left), end the runs, flush the recorder. Idempotent."""
    state.loop_engine.stop()
    state.telemetry.close(status)
    state.checker.shutdown(wait=False)


# ---------------------------------------------------------------------------------------------- errors


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def fastapi_validation(request: Request, exc: RequestValidationError):
        err = validation_error(list(exc.errors()))
        return JSONResponse(err.body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"unknown path {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return JSONResponse(error_body(message, kind), status_code=exc.status_code, headers=exc.headers)


class _UnexpectedErrors:
    """ASGI middleware around the app (inside Starlette's ServerErrorMiddleware): an error no handler answered
    becomes ONE log record, with its traceback, and a 500 in the API's error shape, on a connection that stays
    open. (An `Exception` handler runs in ServerErrorMiddleware, which re-raises after it answered: uvicorn
    logged the error a second time and closed the client's keep-alive connection.) Once the response has
    started nothing can be answered any more: the error goes on to uvicorn, which logs it (once) and closes
    the connection, the response being cut."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except Exception:
            if started:
                raise
            logger.exception("unexpected error on %s %s", scope["method"], scope["path"])
            answer = JSONResponse(error_body("internal server error (logged on the server)", "server_error"),
                                  status_code=500)
            await answer(scope, receive, send)


class _Cors(CORSMiddleware):
    """Starlette's CORS, where an origin not allowed gets no CORS header at all (Starlette's sent it
    Access-Control-Allow-Methods / -Credentials all the same): its preflight is refused (403, the API's error
    shape) and its other requests pass untouched, so the browser blocks the page. A preflight never reaches
    the routes: no API key asked (a browser sends none with it), nothing recorded or counted."""

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            origin = headers.get("origin")
            if origin is not None and not self.is_allowed_origin(origin):
                if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
                    refused = JSONResponse(error_body(f"the origin {origin!r} is not allowed (serve "
                                                      "--allowed-origins)", "invalid_request_error",
                                                      code="origin_not_allowed"), status_code=403)
                    await refused(scope, receive, send)
                else:
                    await self.app(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


class _CorsFromState:
    """`state.cors` applied (`_Cors`), read on the first request as the handlers read the state (the app is
    built before anything of the state is read); no CORS at all where it is None (the default)."""

    def __init__(self, app, state: ServerState) -> None:
        self.app, self.state = app, state
        self._cors: _Cors | None = None

    async def __call__(self, scope, receive, send) -> None:
        policy = self.state.cors
        if policy is None:
            await self.app(scope, receive, send)
            return
        if self._cors is None:
            self._cors = _Cors(self.app, allow_origins=policy.origins, allow_methods=policy.methods,
                               allow_headers=policy.headers, allow_credentials=policy.credentials)
        await self._cors(scope, receive, send)


def _authorize(request: Request, state: ServerState) -> None:
    if state.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
        raise APIError(401, "incorrect API key", code="invalid_api_key")


# ---------------------------------------------------------------------------------------------- generation


async def _generate(request: Request, state: ServerState, kind: str):
    t_start, wall_start = time.perf_counter(), datetime.now(UTC)  # TTFT counts from arrival
    task = asyncio.current_task()
    state.handlers.add(task)  # the app's shutdown waits for it to answer
    task.add_done_callback(state.handlers.discard)
    _authorize(request, state)
    if state.stopping:  # draining after SIGTERM: the requests in flight finish, no new one starts here
        _rejected(state, APIError(503, "the server is shutting down: it takes no new requests",
                                  code="shutting_down"))
    state.reading.add(task)
    try:
        raw = await _read_body(request)
        checked = await asyncio.get_running_loop().run_in_executor(state.checker, _parse_and_check, raw, kind,
                                                                   state)
    except ClientDisconnect:  # the client left before its body was whole: nobody to answer, nothing to record
        logger.debug("client went away while sending the body of %s %s", request.method, request.url.path)
        return Response(status_code=499)  # (it was logged as an unexpected error, a traceback, and a 500)
    except asyncio.CancelledError:  # the grace ran out before the request reached the engine
        task.uncancel()
        raise APIError(503, "the server is shutting down", code="shutting_down") from None
    finally:
        state.reading.discard(task)  # (no await from here to the submit: the grace's end cannot slip between)
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    job = Job(f"{prefix}-{uuid.uuid4().hex[:24]}", checked, t_start, wall_start, asyncio.get_running_loop())
    recorded_in = request.headers.get(RECORDED_IN_HEADER)
    job.recorded_by_client = bool(recorded_in and state.store_key) and hmac.compare_digest(
        recorded_in.encode(), state.store_key.encode())
    try:
        state.loop_engine.submit(job)
    except APIError as exc:  # 503 overloaded / shutting_down: refused before the engine (not recorded)
        _rejected(state, exc)
    if checked.stream:
        return _EventStream(job, state)
    return await _complete(request, job, state)


def _rejected(state: ServerState, exc: APIError) -> NoReturn:
    """Raise `exc`, a request refused before the engine (503): counted on /metrics and said in the log."""
    state.metrics.observe_rejected(exc.code or "error")
    state.said.note(logging.WARNING, "rejected", (exc.code or "error").replace("_", " "), exc.message)
    raise exc


def _parse_and_check(raw: bytes, kind: str, state: ServerState) -> Checked:
    """The body -> a checked request: JSON, validation, tokenizing. On the tokenizer thread: for a body of
    megabytes each step takes seconds, which the event loop (/health, the streams in flight) must not wait."""
    req = parse_body(raw, ChatRequest if kind == "chat" else CompletionRequest, max_len=state.max_len)
    return check(req, kind, model_id=state.model_id, max_len=state.max_len, vocab_size=state.vocab_size,
                 encode_chat=state.encode_chat, encode_text=state.encode_text, max_chars=state.max_chars,
                 default_max_tokens=state.default_max_tokens)


async def _read_body(request: Request) -> bytes:
    """The body, or APIError(413) as soon as it is known to exceed MAX_BODY_BYTES."""
    too_large = APIError(413, f"the request body is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB",
                         code="request_too_large")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def _complete(request: Request, job: Job, state: ServerState):
    collect = asyncio.ensure_future(_collect(job))
    if not await _until_done_or_gone(collect, request.receive, job, state):
        return Response(status_code=499)
    if not collect.done() or collect.cancelled():
        # cancelled by uvicorn and the engine did not answer in time; or the collecting task itself was cancelled
        # (a forced quit, a second Ctrl-C: asyncio.run cancels every task): its result() raised CancelledError
        # through the app, a traceback in the log and a bare 500 text/plain to the client
        state.loop_engine.cancel(job)  # nobody collects its tokens any more: recorded as cancelled, as answered
        raise APIError(503, "the request was cancelled (server shutting down)", code="cancelled")
    ids, fin = collect.result()
    if fin.finish_reason == "error":
        raise APIError(500, f"generation failed: {fin.error}", code="generation_failed")
    if fin.finish_reason == "cancelled":
        raise APIError(503, "the request was cancelled (server shutting down)", code="cancelled")
    text = TextStream(state.decode, job.checked.params.stop).final(ids)
    usage = _usage(fin)
    if job.checked.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": _reason(fin)}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": _reason(fin)}
        obj = "text_completion"
    return {"id": job.id, "object": obj, "created": int(job.wall_start.timestamp()), "model": state.model_id,
            "choices": [choice], "usage": usage}


async def _collect(job: Job) -> tuple[list[int], Finished]:
    ids: list[int] = []
    while True:
        item = await job.out.get()
        if isinstance(item, Finished):
            return ids, item
        ids.extend(item)


async def _wait_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _until_done_or_gone(work: asyncio.Future, receive, job: Job, state: ServerState) -> bool:
    """Wait for `work` (it ends once the job's Finished arrives) or the client's disconnect; False when the
    client left first (the job and `work` are cancelled).

    When uvicorn cancels this handler (its graceful-shutdown timeout ran out), the handler does not vanish
    (a bare 500, a stream cut mid-body): it cancels the job and gives `work` up to ANSWER_AFTER_CANCEL_S to
    end with the engine's 'cancelled' answer, then returns True (`work` is cancelled if still not done)."""
    gone = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        asyncio.current_task().uncancel()
        state.loop_engine.cancel(job)
        await asyncio.wait({work}, timeout=ANSWER_AFTER_CANCEL_S)
        if not work.done():
            work.cancel()
        return True
    finally:
        gone.cancel()
    if work.done():
        return True
    state.loop_engine.cancel(job)
    work.cancel()
    state.said.note(logging.INFO, "cancelled", "the client went away", job.id)
    return False


class _EventStream(StreamingResponse):
    """The server-sent events of a streamed request. Starlette runs a stream's body in a task group that the
    handler's cancellation (uvicorn's graceful-shutdown timeout) cuts mid-body, without an error event or
    [DONE]; here the body runs in a task of its own, and a cancelled handler cancels the job, so `_stream`
    ends with its 'cancelled' error event and [DONE]."""

    def __init__(self, job: Job, state: ServerState):
        super().__init__(_stream(job, state), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._job, self._state = job, state

    async def __call__(self, scope, receive, send) -> None:
        body = asyncio.ensure_future(self.stream_response(send))
        await _until_done_or_gone(body, receive, self._job, self._state)
        if body.done() and not body.cancelled():
            body.result()  # its failure, if any, surfaces here as in StreamingResponse


async def _stream(job: Job, state: ServerState) -> AsyncIterator[str]:
    chat = job.checked.kind == "chat"
    created = int(job.wall_start.timestamp())
    obj = "chat.completion.chunk" if chat else "text_completion"
    text = TextStream(state.decode, job.checked.params.stop)

    def chunk(piece: str | None, reason: str | None = None, role: bool = False) -> str:
        if chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": piece} if piece else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": reason}
        body = {"id": job.id, "object": obj, "created": created, "model": state.model_id, "choices": [choice]}
        if job.checked.include_usage:  # OpenAI: every chunk carries "usage", null but in the last
            body["usage"] = None
        return _sse(body)

    done = False
    try:
        if chat:
            yield chunk(None, role=True)
        while True:
            item = await job.out.get()
            if isinstance(item, Finished):
                done = True
                break
            piece = text.add(item)
            if piece:
                yield chunk(piece)
        fin = item
        usage = _sse({"id": job.id, "object": obj, "created": created, "model": state.model_id,
                      "choices": [], "usage": _usage(fin)})
        if fin.finish_reason in ("error", "cancelled"):
            why = (APIError(500, f"generation failed: {fin.error}", code="generation_failed")
                   if fin.finish_reason == "error" else
                   APIError(503, "the request was cancelled (server shutting down)", code="cancelled"))
            if job.checked.include_usage:  # what it made before it failed: the error event ends a client's read
                yield usage
            yield _sse(why.body())
        else:
            tail = text.flush()
            if tail:
                yield chunk(tail)
            yield chunk(None, _reason(fin))
            if job.checked.include_usage:
                yield usage
        yield "data: [DONE]\n\n"
    except Exception as exc:  # noqa: BLE001 - headers are sent: report in the stream, never a traceback
        logger.exception("stream %s failed", job.id)
        yield _sse(error_body(f"internal server error: {type(exc).__name__}", "server_error"))
        yield "data: [DONE]\n\n"
    finally:
        if not done:  # client disconnected (task cancelled / generator closed) or failure
            state.loop_engine.cancel(job)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _usage(fin: Finished) -> dict:
    """OpenAI's usage, plus the request's speculation counts under "specfinops" (clients ignore it;
    `specfinops loadtest` records them with its client-side view of the request), and, for a request that ran,
    `queue_ms`: its wait from arrival to admission into a batch slot (the load test's energy window starts
    after it, as the server's own does)."""
    ours = {"num_drafts": fin.num_drafts, "num_draft_tokens": fin.num_draft_tokens,
            "num_accepted_tokens": fin.num_accepted_tokens}
    if fin.queue_ms is not None:
        ours["queue_ms"] = round(fin.queue_ms, 3)
    return {"prompt_tokens": fin.num_prompt, "completion_tokens": fin.num_output,
            "total_tokens": fin.num_prompt + fin.num_output, "specfinops": ours}


def _reason(fin: Finished) -> str:
    return "length" if fin.finish_reason == "length" else "stop"

"""Edges of the HTTP API found by probing a live server with real clients (raw sockets, httpx): what a client
sends that the other server tests do not, and what each must get back (a 4xx naming what was wrong, a row in
the store for every request answered 200, no traceback in the log)."""

from __future__ import annotations

import json
import logging
import signal
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlparse

import httpx
import pytest
from serve_live import AUTH, shared_live
from sqlalchemy import create_engine, text

pytestmark = pytest.mark.slow

CHAT, COMP = "/v1/chat/completions", "/v1/completions"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def live(request):
    return shared_live(request.config)


def _row(live, external_id: str):
    live.flush()
    with create_engine(live.db_url).connect() as c:
        return c.execute(text("select status, top_k, top_p, output_tokens from requests where external_id = :e"),
                         {"e": external_id}).all()


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def log_records():
    """WARNING and ERROR records of the server's and uvicorn's loggers (uvicorn's do not propagate)."""
    handler = _Records()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("uvicorn.error")]
    for lg in loggers:
        lg.addHandler(handler)
    yield handler.records
    for lg in loggers:
        lg.removeHandler(handler)


def _wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------------- sampling values


def test_a_top_k_beyond_the_vocabulary_is_served_recorded_and_recorded_as_off(live):
    """top_k 2**70 was answered 200 but its record was rejected by the database (an integer column) and dropped:
    a request served and missing from the store. Keeping at least the whole vocabulary is top-k off: 0."""
    for top_k in (2**70, live.state.vocab_size):
        body = {"model": live.model, "prompt": "hello", "max_tokens": 2, "temperature": 1.0, "top_k": top_k}
        r = httpx.post(live.url + COMP, json=body, headers=AUTH, timeout=120)
        assert r.status_code == 200, r.text
        rows = _row(live, r.json()["id"])
        assert [(status, k) for status, k, *_ in rows] == [("ok", 0)], (top_k, rows)


def test_speculative_null_is_the_default_like_any_other_optional_field(live):
    """`"speculative": null` was a 400 ('Input should be a valid boolean') where every other optional field takes
    null as its default; null speculates, false does not."""
    modes = {}
    for value in (None, False):
        body = {"model": live.model, "prompt": "hello", "max_tokens": 2, "temperature": 0, "speculative": value}
        r = httpx.post(live.url + COMP, json=body, headers=AUTH, timeout=120)
        assert r.status_code == 200, r.text
        live.flush()
        with create_engine(live.db_url).connect() as c:
            modes[value] = c.execute(text("select runs.mode from requests join runs on runs.id = requests.run_id "
                                          "where requests.external_id = :e"), {"e": r.json()["id"]}).scalar_one()
    assert modes == {None: "spec", False: "ar"}


def test_a_top_p_too_small_for_float32_keeps_the_likeliest_token(live):
    """top_p 1e-300 is within (0, 1] but rounded to 0 in the sampler's float32, which then kept no token at all:
    a 500 'probability tensor contains either inf, nan' and an error row. Any top_p that small keeps the most
    likely token alone; it is applied (and recorded) as the smallest the sampler holds."""
    for stream in (False, True):
        body = {"model": live.model, "prompt": "1, 2, 3, 4,", "max_tokens": 3, "temperature": 1.0, "top_p": 1e-300,
                "stream": stream}
        r = httpx.post(live.url + COMP, json=body, headers=AUTH, timeout=120)
        assert r.status_code == 200, r.text
        if stream:
            events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
            assert events and not any("error" in e for e in events), events[-1]
            request_id = events[0]["id"]
        else:
            request_id = r.json()["id"]
        rows = _row(live, request_id)
        assert len(rows) == 1 and rows[0][0] == "ok" and 0 < rows[0][2] < 1e-6, rows
        assert rows[0][3] == 3


# ---------------------------------------------------------------------------------------------- error shapes


@pytest.mark.parametrize("body,got", [(b"null", "null"), (b'"hello"', "a string"), (b"[1, 2]", "an array"),
                                      (b"5", "a number"), (b"true", "a boolean")])
def test_a_body_that_is_not_an_object_is_named_in_json_terms(live, body, got):
    """It said 'got NoneType', 'got str', 'got list': Python's names, not what the client sent."""
    r = httpx.post(live.url + COMP, content=body, headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"] == f"the request body must be a JSON object, got {got}", err


@pytest.mark.parametrize("path,fields,param,code", [
    (COMP, {"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    (COMP, {"stop": ""}, "stop", "invalid_value"),
    (COMP, {"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
    (COMP, {"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage",
     "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content", "unsupported_value"),
])
def test_an_error_naming_a_parameter_carries_a_code_like_the_others(live, path, fields, param, code):
    """These few had "code": null where every other refusal of a parameter says invalid_value or
    unsupported_value; a client that branches on the code could not tell them apart from a malformed body."""
    base = {"model": live.model, "max_tokens": 2, **({"messages": USER} if path == CHAT else {"prompt": "hi"})}
    r = httpx.post(live.url + path, json={**base, **fields}, headers=AUTH)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error"), err


# as Llama 2's, Mistral's and Gemma's templates do: raise_exception on messages they have no place for
STRICT_TEMPLATE = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                   "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
                   "{% endif %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
                   "{% if add_generation_prompt %}assistant: {% endif %}")


def test_messages_a_strict_chat_template_refuses_are_a_400_naming_them(live, log_records, monkeypatch):
    """A target whose chat template raises (roles that do not alternate, a system message) answered a 500
    'internal server error' and logged the jinja2 TemplateError's traceback: the client's messages were wrong,
    and nothing said so."""
    monkeypatch.setattr(live.state.tokenizer, "chat_template", STRICT_TEMPLATE)
    body = {"model": live.model, "max_tokens": 2, "messages": [{"role": "system", "content": "Be brief."}, *USER]}
    r = httpx.post(live.url + CHAT, json=body, headers=AUTH, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"], err["type"]) == ("messages", "invalid_value", "invalid_request_error"), err
    assert "Conversation roles must alternate" in err["message"], err
    assert not log_records, [(rec.name, rec.getMessage()) for rec in log_records]
    ok = httpx.post(live.url + CHAT, json={**body, "messages": USER}, headers=AUTH, timeout=120)
    assert ok.status_code == 200, ok.text  # the template's accepted messages are served


def test_holding_back_a_long_stop_string_does_not_try_each_of_its_prefix_lengths():
    """Each decode step of each stream, on the event loop, the text that may still grow into a stop string is
    held back. It was found by slicing and comparing the text's tail with every prefix of the stop string: for
    stop strings of thousands of characters, quadratic work per step that stalled every stream. Counted here
    without timing: the slices the stream takes of the decoded text."""
    from serving.server_text import TextStream

    class Counted(str):
        slices = 0

        def __getitem__(self, key):
            if isinstance(key, slice):
                Counted.slices += 1
            return Counted(str.__getitem__(self, key))

    stops = ("x" * 2000, "ab" + "z" * 2000, "\n\nUser: " * 300)
    ts = TextStream(lambda ids: Counted("abcd" * len(ids)), stops)
    sent = "".join(ts.add([1, 1]) for _ in range(200)) + ts.flush()
    assert sent == "abcd" * 400  # no stop string occurs: all of it, in the end
    assert Counted.slices <= 3 * 201, Counted.slices  # the decoded text's cut and the piece sent, per step


# ---------------------------------------------------------------------------------------------- HTTP


def test_head_is_answered_wherever_get_is(live):
    """HEAD /metrics and HEAD /v1/models were 405 (only /health took HEAD): a HEAD is a GET without its body."""
    with httpx.Client(base_url=live.url, headers=AUTH) as http:
        for path in ("/metrics", "/v1/models", f"/v1/models/{live.model}"):
            get, head = http.get(path), http.head(path)
            assert head.status_code == get.status_code == 200, (path, head.status_code, head.text)
            assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"], path
        missing = http.head("/v1/models/no-such-model")
        assert missing.status_code == 404 and missing.content == b""
        # and the methods that are not served stay 405
        assert http.request("DELETE", "/metrics").status_code == 405


def test_the_models_list_with_a_trailing_slash_is_the_list(live):
    """GET /v1/models/ answered 404 "the model '' does not exist": the route of one model read an empty id."""
    with httpx.Client(base_url=live.url, headers=AUTH) as http:
        listed, slashed = http.get("/v1/models"), http.get("/v1/models/")
        assert slashed.status_code == 200, slashed.text
        assert slashed.json() == listed.json() and slashed.json()["data"][0]["id"] == live.model
        assert http.head("/v1/models/").status_code == 200
        assert httpx.get(live.url + "/v1/models/").status_code == 401  # the API key guards it too


def test_a_client_that_leaves_mid_body_is_no_server_error(live, log_records):
    """A client that closed its connection before sending the whole body (Content-Length promised more) was
    logged as an unexpected error, with a traceback (starlette's ClientDisconnect), and answered a 500 that
    nobody read. Nothing reached the engine or the store: there is nothing to log above debug."""
    url = urlparse(live.url)
    body = json.dumps({"model": live.model, "prompt": "hello", "max_tokens": 2}).encode()
    head = (f"POST {COMP} HTTP/1.1\r\nHost: {url.hostname}\r\nAuthorization: {AUTH['Authorization']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body) + 100}\r\n\r\n").encode()
    handlers = live.state.handlers
    with socket.create_connection((url.hostname, url.port)) as s:
        s.sendall(head + body)  # 100 bytes short
        _wait_for(lambda: len(handlers) == 1, "the handler to start reading the body")
    _wait_for(lambda: not handlers, "the handler to end")
    noisy = [r for r in log_records if r.levelno >= logging.WARNING]
    assert not noisy, [(r.name, r.getMessage()) for r in noisy]
    r = httpx.post(live.url + COMP, json={"model": live.model, "prompt": "hello", "max_tokens": 2}, headers=AUTH,
                   timeout=120)
    assert r.status_code == 200, r.text


def test_a_request_whose_collecting_task_is_cancelled_is_answered_503_and_recorded_cancelled(live, monkeypatch,
                                                                                           log_records):
    """The task collecting a plain request's tokens is cancelled from outside when asyncio.run tears the loop down
    (a forced quit): its result() raised CancelledError through the app, logged as 'Exception in ASGI
    application' with a traceback, a bare 500 text/plain to the client, and the request decoded on to the end,
    recorded 'ok'. Here the collecting coroutine cancels itself at once."""
    import asyncio

    import serving.server as server

    async def cancelled(job):
        raise asyncio.CancelledError

    def rows():
        live.flush()
        with create_engine(live.db_url).connect() as c:
            return c.execute(text("select status, output_tokens from requests order by id desc")).all()

    before = len(rows())
    monkeypatch.setattr(server, "_collect", cancelled)
    r = httpx.post(live.url + COMP, json={"model": live.model, "prompt": "1, 2, 3,", "max_tokens": 200,
                                          "temperature": 0}, headers=AUTH, timeout=120)
    monkeypatch.undo()
    assert r.status_code == 503 and r.headers["content-type"] == "application/json", (r.status_code, r.text)
    assert r.json()["error"]["code"] == "cancelled"
    _wait_for(lambda: len(rows()) > before, "the request's record")  # the engine ends it after the answer
    status, output_tokens = rows()[0]
    assert status == "cancelled" and output_tokens < 200, (status, output_tokens)
    assert not log_records, [(rec.name, rec.getMessage()) for rec in log_records]


@pytest.mark.parametrize("name", ["", "   "])
def test_an_empty_served_model_name_is_refused_before_loading(name, monkeypatch, capsys):
    """`serve --served-model-name ''` served under the target's name, saying nothing: the clients sending the
    name they were given were refused 404 model_not_found."""
    import serving.server_setup
    import serving.worker
    from app.cli import main

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(serving.worker, "load", no_load)
    monkeypatch.setattr(serving.server_setup, "load", no_load)
    assert main(["serve", "--no-telemetry", "--port", "0", "--served-model-name", name]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["specfinops serve: error: --served-model-name must not be empty (leave it out to serve the "
                   "target's name)"], err


@pytest.mark.parametrize(("extra", "said"), [
    (["--power", "nvml"], "nvidia-ml-py"),
    (["--api-key", "s\u00e9cret"], "--api-key must be printable ASCII"),
    (["--api-key", " key "], "--api-key must be printable ASCII"),
])
def test_a_meter_that_cannot_be_read_or_a_key_no_client_can_send_is_refused_before_loading(
        extra, said, monkeypatch, capsys, tmp_path):
    """`serve --power nvml` (or rapl) where that meter cannot be read failed only after the model had loaded
    (46 s here), leaving an empty store; an --api-key with a non-ASCII character could never be matched (a
    server reads header bytes as Latin-1; clients refuse to send such a header)."""
    import importlib.util

    import serving.server_setup
    import serving.worker
    from app.cli import main

    if extra[0] == "--power" and importlib.util.find_spec("pynvml") is not None:
        pytest.skip("NVML's Python binding is installed here: the meter may open")

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(serving.worker, "load", no_load)
    monkeypatch.setattr(serving.server_setup, "load", no_load)
    db = tmp_path / "s.db"
    assert main(["serve", "--port", "0", "--db", str(db), *extra]) == 2
    err = capsys.readouterr().err
    assert said in err and not db.exists(), err


# ---------------------------------------------------------------------------------------------- shutdown
# `specfinops serve`'s own uvicorn (serving.server_setup.graceful_server and run, as `serve` runs them) in a thread,
# on the bundled model loaded once for these tests; SIGTERM / SIGINT as its signal handler takes them
# (`handle_exit`: off the main thread uvicorn installs none).


@pytest.fixture(scope="module")
def loaded(live):  # after the shared server: its model is in the cache
    from serving.worker import EngineSpec, load

    return load(EngineSpec(dtype="bfloat16", k="4", max_batch=2, max_len=1024))


@dataclass
class Serving:
    state: object
    server: object
    thread: threading.Thread
    url: str
    port: int
    db_url: str
    errors: list[logging.LogRecord]
    warnings: list[str]


def _serve(loaded, tmp_path, **options) -> Serving:
    from serving.server_setup import ServeOptions, build_state, graceful_server, run
    from serving.worker import EngineSpec

    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    opts = ServeOptions(spec=EngineSpec(dtype="bfloat16", k="4", max_batch=2, max_len=1024), db=db_url,
                        power="none", port=0, **options)
    state = build_state(opts, loaded)
    server = graceful_server(state, opts, log_level="warning")
    records = _Records()  # after uvicorn configured its loggers (which drops their handlers)
    for name in ("", "uvicorn", "uvicorn.error"):
        logging.getLogger(name).addHandler(records)
    thread = threading.Thread(target=run, args=(server, state), name="test-graceful-uvicorn", daemon=True)
    thread.start()
    _wait_for(lambda: server.started or not thread.is_alive(), "the server to start")
    assert server.started
    port = server.servers[0].sockets[0].getsockname()[1]
    return Serving(state, server, thread, f"http://127.0.0.1:{port}", port, db_url, records.records, [])


def _stopped(s: Serving) -> None:
    s.thread.join(120)
    for name in ("", "uvicorn", "uvicorn.error"):
        for h in [h for h in logging.getLogger(name).handlers if isinstance(h, _Records)]:
            logging.getLogger(name).removeHandler(h)
    s.warnings[:] = [r.getMessage() for r in s.errors if r.levelno == logging.WARNING]
    s.errors[:] = [r for r in s.errors if r.levelno >= logging.ERROR or r.exc_info]
    assert not s.thread.is_alive(), "the server did not stop"


def _runs_and_requests(s: Serving):
    with create_engine(s.db_url).connect() as c:
        runs = [tuple(r) for r in c.execute(text("select mode, status from runs order by id"))]
        statuses = [st for (st,) in c.execute(text("select status from requests order by id"))]
    return runs, statuses


def _stall(s: Serving, model: str) -> socket.socket:
    """A request whose client sends its headers and 10 bytes of its body, then nothing more."""
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 2}).encode()
    stalled = socket.create_connection(("127.0.0.1", s.port))
    stalled.sendall((f"POST {COMP} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n").encode() + body[:10])
    return stalled


def _answer(sock: socket.socket) -> tuple[bytes, bytes]:
    sock.settimeout(120)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    sock.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    return head, payload


def test_sigterm_refuses_a_request_still_sending_its_body_when_the_grace_ends(loaded, tmp_path):
    """A client that stalled mid-body held `specfinops serve` past --graceful-s until uvicorn's own deadline
    (10 s later), which cancelled its handler and logged 'ERROR: Cancel 1 running task(s), timeout graceful
    shutdown exceeded'. The end of the grace now refuses such a request itself: a 503 `shutting_down`, no
    ERROR, nothing recorded, the runs ended 'completed'."""
    s = _serve(loaded, tmp_path, graceful_s=1.0)
    try:
        stalled = _stall(s, s.state.model_id)
        _wait_for(lambda: len(s.state.handlers) == 1, "the stalled request's handler to read its body")
        s.server.handle_exit(signal.SIGTERM, None)
        head, payload = _answer(stalled)
    finally:
        s.server.should_exit = True
        _stopped(s)
    assert head.startswith(b"HTTP/1.1 503"), head
    assert json.loads(payload)["error"]["code"] == "shutting_down", payload
    assert not s.errors, [(r.name, r.getMessage()) for r in s.errors]
    assert any("still sending or checking their body" in w for w in s.warnings), s.warnings
    assert _runs_and_requests(s) == ([("spec", "completed"), ("ar", "completed")], [])


def test_a_forced_quit_still_answers_every_client_and_ends_the_runs(loaded, tmp_path):
    """A second Ctrl-C while requests are in flight makes uvicorn stop waiting and skip the app's shutdown:
    asyncio.run then cancelled every task, so the plain client got a bare 500 text/plain, the stream was cut
    mid-body, the log had tracebacks (the handler's CancelledError, the lifespan's) and both runs ended 'failed'.
    The app's shutdown now runs all the same: what runs is cancelled at once and each client gets its
    documented answer, a client still sending its body too."""
    s = _serve(loaded, tmp_path)  # the default grace, 30 s: the second Ctrl-C cuts it short
    model = s.state.model_id
    body = {"model": model, "prompt": "1, 2, 3,", "max_tokens": 900, "temperature": 0}
    results: dict[str, object] = {}
    streaming = threading.Event()

    def stream() -> None:
        lines: list[str] = []
        try:
            with httpx.stream("POST", s.url + COMP, json={**body, "stream": True}, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line[6:])
                        streaming.set()
            results["stream"] = (r.status_code, lines)
        except httpx.HTTPError as exc:
            results["stream"] = (repr(exc), lines)

    def plain() -> None:
        try:
            results["plain"] = httpx.post(s.url + COMP, json=body, timeout=120)
        except httpx.HTTPError as exc:
            results["plain"] = exc

    threads = [threading.Thread(target=stream), threading.Thread(target=plain)]
    try:
        for t in threads:
            t.start()
        assert streaming.wait(120), results
        _wait_for(lambda: s.state.loop_engine.num_running == 2, "both requests to run")
        stalled = _stall(s, model)
        _wait_for(lambda: len(s.state.handlers) == 3, "the stalled request's handler to read its body")
        s.server.handle_exit(signal.SIGINT, None)

        def closed() -> bool:  # uvicorn closed its listening socket: it waits for the requests in flight
            try:
                socket.create_connection(("127.0.0.1", s.port), timeout=1).close()
                return False
            except OSError:
                return True

        _wait_for(closed, "the first Ctrl-C to be taken")
        s.server.handle_exit(signal.SIGINT, None)  # force quit
        head, payload = _answer(stalled)
        for t in threads:
            t.join(120)
    finally:
        s.server.should_exit = s.server.force_exit = True
        _stopped(s)
    r = results["plain"]
    assert isinstance(r, httpx.Response), r
    assert r.status_code == 503 and r.headers["content-type"] == "application/json", (r.status_code, r.text)
    assert r.json()["error"]["code"] == "cancelled"
    status, lines = results["stream"]
    assert status == 200 and lines[-1] == "[DONE]", (status, lines[-3:])
    assert json.loads(lines[-2])["error"]["code"] == "cancelled", lines[-3:]
    assert head.startswith(b"HTTP/1.1 503") and json.loads(payload)["error"]["code"] == "shutting_down", head
    assert not s.errors, [(rec.name, rec.getMessage()) for rec in s.errors]
    assert _runs_and_requests(s) == ([("spec", "completed"), ("ar", "completed")], ["cancelled", "cancelled"])

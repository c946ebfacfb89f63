"""Edges of the HTTP API found by probing a live server with real clients (raw sockets, httpx): what a client
sends that the other server tests do not, and what each must get back (a 4xx naming what was wrong, a row in
the store for every request answered 200, no traceback in the log)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
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


# ---------------------------------------------------------------------------------------------- shutdown


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_refuses_a_request_still_sending_its_body_when_the_grace_ends(tmp_path):
    """A client that stalled mid-body held `specfinops serve` past --graceful-s until uvicorn's own deadline
    (10 s later), which cancelled its handler and logged 'ERROR: Cancel 1 running task(s), timeout graceful
    shutdown exceeded'. The end of the grace now refuses such a request itself: a 503 `shutting_down`, no
    ERROR, nothing recorded, the runs ended 'completed'."""
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    port = _free_port()
    cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--db", db_url, "--max-batch", "1",
           "--max-len", "512", "--power", "none", "--graceful-s", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            assert proc.poll() is None, proc.stdout.read()
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _wait_for(up, "the server to come up", 180)
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 2}).encode()
        with socket.create_connection(("127.0.0.1", port)) as stalled:
            stalled.sendall((f"POST {COMP} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(body)}\r\n\r\n").encode() + body[:10])
            # a whole request served after it: the stalled one's headers have been read, its handler waits
            assert httpx.post(url + COMP, json={"model": model, "prompt": "hi", "max_tokens": 1},
                              timeout=120).status_code == 200
            proc.send_signal(signal.SIGTERM)
            stalled.settimeout(120)
            answer = b""
            while chunk := stalled.recv(65536):
                answer += chunk
        assert proc.wait(120) in (0, -signal.SIGTERM)
        log = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), answer[:300]
    assert json.loads(payload)["error"]["code"] == "shutting_down", payload
    assert "ERROR" not in log and "Traceback" not in log and "timeout graceful shutdown exceeded" not in log, log
    with create_engine(db_url).connect() as c:
        assert [tuple(r) for r in c.execute(text("select mode, status from runs order by id"))] == [
            ("spec", "completed"), ("ar", "completed")]
        assert c.execute(text("select count(*) from requests")).scalar_one() == 1  # the request served

"""An error no handler expected (a bug, a failing dependency): one log record with its traceback, a 500 in the
API's error shape, and the client's keep-alive connection goes on serving."""

from __future__ import annotations

import http.client
import json
import logging
from urllib.parse import urlparse

import pytest
from serve_live import AUTH, shared_live

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def live(request):
    return shared_live(request.config)


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def error_records():
    """ERROR records of the server's and uvicorn's loggers (uvicorn's do not propagate to the root)."""
    handler = Records()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn")]
    for lg in loggers:
        lg.addHandler(handler)
    yield handler.records
    for lg in loggers:
        lg.removeHandler(handler)


def test_an_unexpected_error_is_one_logged_500_and_the_connection_keeps_serving(live, error_records):
    def broken(text: str) -> list[int]:
        raise RuntimeError("injected tokenizer failure")

    url = urlparse(live.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    body = json.dumps({"model": live.model, "prompt": "hello", "max_tokens": 2, "temperature": 0})
    headers = {**AUTH, "content-type": "application/json"}
    live.state.encode_text = broken
    try:
        conn.request("POST", "/v1/completions", body, headers)
        failed = conn.getresponse()
        failed_body = failed.read()
        sock = conn.sock
    finally:
        del live.state.encode_text
    try:
        conn.request("POST", "/v1/completions", body, headers)  # on the same connection: it was reset
        served = conn.getresponse()
        served_body = json.loads(served.read())
        assert conn.sock is sock
    finally:
        conn.close()
    assert failed.status == 500 and failed.getheader("content-type") == "application/json", failed_body
    assert json.loads(failed_body) == {"error": {"message": "internal server error (logged on the server)",
                                                 "type": "server_error", "param": None, "code": None}}
    assert served.status == 200 and served_body["usage"]["completion_tokens"] >= 1, served_body
    ours = [r for r in error_records if r.name.startswith(("serving", "uvicorn"))]
    assert len(ours) == 1, [r.getMessage() for r in ours]  # was two: ours and uvicorn's "Exception in ASGI ..."
    assert ours[0].name == "serving.server" and "unexpected error on POST /v1/completions" in ours[0].getMessage()
    assert ours[0].exc_info and "injected tokenizer failure" in str(ours[0].exc_info[1])

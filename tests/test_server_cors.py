"""CORS (`serve --allowed-origins`, vLLM's option names): a chat UI served on another origin (a browser page at
http://localhost:3000 calling the API at :8000) had its preflight answered 405 without CORS headers, so the
browser blocked every call. With --allowed-origins its preflights are answered (no API key: browsers send none
with them; not recorded nor counted), its responses, streamed ones too, carry Access-Control-Allow-Origin, and an
origin not allowed gets no CORS header at all. Without the option (the default) nothing changes: no CORS."""

from __future__ import annotations

import json

import httpx
import pytest
from serve_live import API_KEY, AUTH, shared_live, start_server, stop_server
from sqlalchemy import create_engine, text

pytestmark = pytest.mark.slow

UI = "http://localhost:3000"
EVIL = "http://evil.example"
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}


@pytest.fixture(scope="module")
def cors(tmp_path_factory):
    from serving.server_setup import ServeOptions
    from serving.worker import EngineSpec

    db = f"sqlite:///{tmp_path_factory.mktemp('cors') / 'store.db'}"
    live = start_server(ServeOptions(spec=EngineSpec(dtype="bfloat16", k="4", max_batch=2, max_len=1024), db=db,
                                     api_key=API_KEY, power="none", allowed_origins=[UI]))
    yield live
    stop_server(live)


def _cors_headers(r: httpx.Response) -> dict:
    return {k: v for k, v in r.headers.items() if k.lower().startswith("access-control-")}


def _counters(live) -> dict[str, float]:
    """Every request counter /metrics exposes (finished, rejected, tokens), by series."""
    exp = httpx.get(live.url + "/metrics").text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in exp.splitlines()
            if line.startswith(("specfinops:requests", "vllm:request_success", "vllm:prompt_tokens_total",
                                "vllm:generation_tokens_total", "vllm:e2e_request_latency_seconds_count"))}


def _stored_requests(live) -> int:
    live.flush()
    with create_engine(live.db_url).connect() as c:
        return c.execute(text("select count(*) from requests")).scalar_one()


def test_a_preflight_from_an_allowed_origin_is_answered_without_the_api_key(cors):
    r = httpx.options(cors.url + "/v1/chat/completions", headers={"Origin": UI, **PREFLIGHT})
    assert r.status_code == 200, (r.status_code, r.text)
    assert r.headers["access-control-allow-origin"] == UI
    assert "POST" in r.headers["access-control-allow-methods"]
    assert r.headers["access-control-allow-headers"] == "authorization,content-type"
    assert "access-control-allow-credentials" not in r.headers  # --allow-credentials not given


def test_an_origin_not_allowed_gets_no_cors_header(cors):
    r = httpx.options(cors.url + "/v1/chat/completions", headers={"Origin": EVIL, **PREFLIGHT})
    assert r.status_code == 403 and _cors_headers(r) == {}, (r.status_code, r.headers)
    assert r.json()["error"]["code"] == "origin_not_allowed"
    models = httpx.get(cors.url + "/v1/models", headers={"Origin": EVIL, **AUTH})
    assert models.status_code == 200 and _cors_headers(models) == {}, models.headers  # the browser blocks it
    assert _cors_headers(httpx.get(cors.url + "/v1/models", headers={"Origin": UI, **AUTH})) == {
        "access-control-allow-origin": UI}


def test_a_streamed_completion_carries_the_cors_headers(cors):
    body = {"model": cors.model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", cors.url + "/v1/chat/completions", json=body, headers={"Origin": UI, **AUTH},
                      timeout=120) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["access-control-allow-origin"] == UI
    assert lines[-1] == "[DONE]" and json.loads(lines[0])["object"] == "chat.completion.chunk", lines[-3:]
    # the API key is still asked of the request itself: the preflight's exemption opens nothing else
    refused = httpx.post(cors.url + "/v1/chat/completions", json=body, headers={"Origin": UI})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == UI  # readable error


def test_a_preflight_is_neither_recorded_nor_counted(cors):
    before, stored = _counters(cors), _stored_requests(cors)
    for origin in (UI, EVIL):
        for path in ("/v1/chat/completions", "/v1/completions"):
            assert httpx.options(cors.url + path, headers={"Origin": origin, **PREFLIGHT}).status_code in (200, 403)
    assert _stored_requests(cors) == stored
    assert _counters(cors) == before


def test_without_allowed_origins_no_cors_header_is_sent(request):
    live = shared_live(request.config)  # started as `serve` is by default: no --allowed-origins
    r = httpx.options(live.url + "/v1/chat/completions", headers={"Origin": UI, **PREFLIGHT})
    assert r.status_code == 405 and _cors_headers(r) == {}, (r.status_code, r.headers)
    r = httpx.get(live.url + "/v1/models", headers={"Origin": UI, **AUTH})
    assert r.status_code == 200 and _cors_headers(r) == {}, r.headers


@pytest.mark.parametrize(("options", "said"), [
    ({"allow_credentials": True}, "--allow-credentials without --allowed-origins"),
    ({"allowed_methods": ["POST"]}, "--allowed-methods without --allowed-origins"),
    ({"allowed_origins": ["http://localhost:3000/"]}, "is not an origin"),
    ({"allowed_origins": ["localhost:3000"]}, "is not an origin"),
    ({"allowed_origins": []}, "--allowed-origins is empty"),
    ({"allowed_origins": ["*"], "allow_credentials": True}, "would let every web page"),
    ({"allowed_origins": [UI], "allowed_headers": [""]}, "--allowed-headers has an empty entry"),
    ({"drain_s": float("nan")}, "--drain-s must be a finite number"),
    ({"drain_s": -1.0}, "--drain-s must be a finite number"),
])
def test_bad_cors_and_drain_options_are_refused_in_one_line(options, said):
    from serving.server_setup import ServeOptions

    with pytest.raises(ValueError, match=said.replace("*", r"\*").replace("-", r"\-")):
        ServeOptions(**options).validate()


@pytest.mark.parametrize(("value", "names"), [
    ("http://localhost:3000", ["http://localhost:3000"]),
    ("http://a:1, https://b.example", ["http://a:1", "https://b.example"]),
    ('["http://a:1", "*"]', ["http://a:1", "*"]),
])
def test_cors_lists_are_read_comma_separated_or_as_vllm_json(value, names):
    from app.commands.serve import _names

    assert _names(value) == names


@pytest.mark.parametrize(("argv", "said"), [
    (["--allow-credentials"], "--allow-credentials without --allowed-origins"),
    (["--allowed-origins", "http://localhost:3000/"], "'http://localhost:3000/' is not an origin"),
    (["--drain-s", "nan"], "--drain-s must be a finite number of seconds >= 0, got nan"),
])
def test_serve_refuses_bad_cors_and_drain_options_before_loading_a_model(argv, said, monkeypatch, capsys):
    import serving.server_setup
    from app.cli import main

    monkeypatch.setattr(serving.server_setup, "load", lambda *a, **k: pytest.fail("loaded a model"))
    assert main(["serve", "--no-telemetry", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_the_drain_default_said_in_help_is_the_servers():
    from app.commands.serve import DEFAULT_DRAIN_S as said
    from serving.server_setup import DEFAULT_DRAIN_S, ServeOptions

    assert said == DEFAULT_DRAIN_S == ServeOptions().drain_s


def test_allowed_methods_match_as_browsers_send_them():
    """A browser asks for "POST"; Starlette matches the list as written, so `--allowed-methods post` allowed none."""
    from serving.server_setup import ServeOptions

    assert ServeOptions(allowed_origins=[UI], allowed_methods=["post", "Get"]).cors().methods == ("POST", "GET")

"""The HTTP API end to end on the bundled model: the official openai client (chat and completion,
streamed and not), per-request opt-out of speculation, disconnect -> cancelled, /metrics against the
store, and SIGTERM -> graceful shutdown with the runs ended."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from openai import OpenAI
from serve_live import API_KEY, AUTH, shared_live, start_server, stop_server
from sqlalchemy import create_engine, text

pytestmark = pytest.mark.slow

COUNT_PROMPT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,"  # repetitive: the n-gram drafter proposes


@pytest.fixture(scope="module")
def live(request):
    return shared_live(request.config)


@pytest.fixture(scope="module")
def client(live):
    return OpenAI(base_url=live.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _rows(live, sql: str, **params):
    live.flush()
    with create_engine(live.db_url).connect() as c:
        return c.execute(text(sql), params).all()


def _request_row(live, external_id: str):
    rows = _rows(live, "select r.status, r.output_tokens, r.num_drafts, r.ttft_ms, r.e2e_ms, runs.mode, runs.kind, "
                 "runs.concurrency, (select count(*) from token_events t where t.request_id = r.id) as events "
                 "from requests r join runs on runs.id = r.run_id where r.external_id = :e", e=external_id)
    assert len(rows) == 1, f"expected one row for {external_id}, got {rows}"
    return rows[0]


def test_chat_streamed_and_not_agree_and_are_recorded(live, client):
    msgs = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name three colors."}]
    full = client.chat.completions.create(model=live.model, messages=msgs, max_tokens=12, temperature=0)
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant" and full.choices[0].message.content
    assert full.choices[0].finish_reason in ("stop", "length")
    assert 1 <= full.usage.completion_tokens <= 12
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens

    chunks = list(client.chat.completions.create(model=live.model, messages=msgs, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == full.choices[0].message.content  # greedy: same answer either way
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        full.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens

    row = _request_row(live, full.id)
    assert (row.status, row.mode, row.kind, row.concurrency) == ("ok", "spec", "serve", 8)
    assert row.output_tokens == full.usage.completion_tokens == row.events
    assert 0 < row.ttft_ms <= row.e2e_ms


def test_each_request_records_its_own_sampling_and_the_run_none(live, client):
    """A server's requests each choose their sampling: the store keeps each one's, and the serve run, which
    has no one temperature, records none (it read 0.0, labelling sampled traffic greedy)."""
    sampled = client.completions.create(model=live.model, prompt="Once upon a time", max_tokens=4,
                                        temperature=0.7, top_p=0.9, seed=7, extra_body={"top_k": 40})
    greedy = client.completions.create(model=live.model, prompt="Once upon a time", max_tokens=3, temperature=0)
    rows = {e: _rows(live, "select r.temperature, r.top_p, runs.temperature, runs.top_p, r.top_k, r.seed, "
                     "r.max_new_tokens, runs.top_k, runs.seed, runs.max_new_tokens from requests r "
                     "join runs on runs.id = r.run_id where r.external_id = :e", e=e)[0]
            for e in (sampled.id, greedy.id)}
    assert tuple(rows[sampled.id]) == (pytest.approx(0.7), pytest.approx(0.9), None, None, 40, 7, 4,
                                       None, None, None)
    # top_k off is 0; no seed asked for is unknown (NULL), not 0; the cap is the max_tokens applied
    assert tuple(rows[greedy.id]) == (0.0, 1.0, None, None, 0, None, 3, None, None, None)


def test_completion_streamed_and_not_and_speculation_opt_out(live, client):
    full = client.completions.create(model=live.model, prompt=COUNT_PROMPT, max_tokens=16, temperature=0)
    assert full.object == "text_completion" and full.choices[0].text
    pieces = [c.choices[0].text for c in client.completions.create(
        model=live.model, prompt=COUNT_PROMPT, max_tokens=16, temperature=0, stream=True)]
    assert "".join(pieces) == full.choices[0].text

    ar = client.completions.create(model=live.model, prompt=COUNT_PROMPT, max_tokens=16, temperature=0,
                                   extra_body={"speculative": False})
    spec_row, ar_row = _request_row(live, full.id), _request_row(live, ar.id)
    assert spec_row.mode == "spec" and spec_row.num_drafts > 0
    assert ar_row.mode == "ar" and ar_row.num_drafts == 0 and ar_row.status == "ok"
    assert ar_row.output_tokens == ar.usage.completion_tokens == ar_row.events


def test_a_server_drafting_token_trees_answers_as_plain_decoding_does_and_records_its_policy(tmp_path):
    from serving.server_setup import ServeOptions
    from serving.worker import EngineSpec

    db_url = f"sqlite:///{tmp_path / 'tree.db'}"
    # float32: greedy tree decoding is token-identical to plain decoding (bf16 rounds differently per shape)
    opts = ServeOptions(spec=EngineSpec(dtype="float32", tree="12:5:3", max_batch=2, max_len=512), db=db_url,
                        power="none")
    live = start_server(opts)
    try:
        answers = {}
        for speculative in (True, False):
            r = httpx.post(live.url + "/v1/completions", timeout=120, json={
                "model": live.model, "prompt": COUNT_PROMPT, "max_tokens": 16, "temperature": 0,
                "speculative": speculative})
            assert r.status_code == 200, r.text
            answers[speculative] = (r.json()["id"], r.json()["choices"][0]["text"])
        assert answers[True][1] == answers[False][1] and answers[True][1]
        live.flush()
        with create_engine(db_url).connect() as c:
            rows = c.execute(text("select runs.mode, runs.k_policy, r.num_drafts, r.num_accepted_tokens from requests r "
                                  "join runs on runs.id = r.run_id where r.external_id = :e"),
                             {"e": answers[True][0]}).all()
        assert len(rows) == 1
        mode, k_policy, drafts, accepted = rows[0]
        assert (mode, k_policy) == ("spec", "tree:12:5:3:0") and drafts > 0 and accepted > 0
    finally:
        stop_server(live)


def test_a_server_with_a_fixed_k_of_0_records_and_labels_its_requests_ar(tmp_path):
    """`serve --k 0` drafts nothing (K 0 is plain AR): a request asking to speculate is recorded in the AR run and
    counted as mode="ar" on /metrics, not as a speculative request with 0 drafts."""
    from serving.server_setup import ServeOptions
    from serving.worker import EngineSpec

    db_url = f"sqlite:///{tmp_path / 'k0.db'}"
    live = start_server(ServeOptions(spec=EngineSpec(dtype="bfloat16", k="0", max_batch=1, max_len=512), db=db_url,
                                     power="none"))
    try:
        r = httpx.post(live.url + "/v1/completions", timeout=120, json={
            "model": live.model, "prompt": COUNT_PROMPT, "max_tokens": 4, "temperature": 0, "speculative": True})
        assert r.status_code == 200, r.text
        metrics = httpx.get(live.url + "/metrics", timeout=30).text
        [card] = httpx.get(live.url + "/v1/models", timeout=30).json()["data"]
        live.flush()
        with create_engine(db_url).connect() as c:
            rows = c.execute(text("select runs.mode, r.num_drafts from requests r join runs on runs.id = r.run_id "
                                  "where r.external_id = :e"), {"e": r.json()["id"]}).all()
            runs = c.execute(text("select id, mode, drafter, k_policy from runs order by id")).all()
            keyed = c.execute(text("select run_id from serve_keys")).scalars().all()
    finally:
        stop_server(live)
    assert [tuple(row) for row in rows] == [("ar", 0)]
    # a plain AR server throughout: one 'ar' run (no empty 'spec' run), which the card and the client key name;
    # the card says no drafter and the AR run's k_policy, not 'ngram:3' and 'fixed:0'
    [(run_id, *run)] = runs
    assert run == ["ar", None, "none"], runs
    ours = card["specfinops"]
    assert (ours["drafter"], ours["k_policy"]) == (None, "none"), ours
    assert ours["telemetry"]["run_id"] == run_id and keyed == [run_id], (ours, keyed)
    done = [line for line in metrics.splitlines() if line.startswith("specfinops:requests_total{")]
    assert any('mode="ar"' in line and line.endswith(" 1.0") for line in done), done
    assert not any('mode="spec"' in line and not line.endswith(" 0.0") for line in done), done


def test_stop_string_cuts_the_answer(live, client):
    r = client.completions.create(model=live.model, prompt=COUNT_PROMPT, max_tokens=24, temperature=0, stop=["18"])
    assert "18" not in r.choices[0].text and r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=live.model, prompt=COUNT_PROMPT, max_tokens=24, temperature=0, stop=["18"], stream=True))
    assert streamed == r.choices[0].text


def test_concurrent_streams_are_batched_and_all_complete(live, client):
    results: dict[int, str] = {}

    def one(i: int) -> None:
        stream = client.chat.completions.create(
            model=live.model, messages=[{"role": "user", "content": f"Count to {i + 3}."}], max_tokens=10,
            temperature=0, stream=True)
        results[i] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == list(range(6)) and all(results.values())
    sizes = _rows(live, "select max(batch_size) from steps")
    assert sizes[0][0] > 1, "concurrent requests should share decode steps"


def test_client_disconnect_mid_stream_cancels_the_sequence(live, caplog):
    from serving.server import RequestLog

    caplog.set_level(logging.INFO, logger="serving.server")
    live.state.said = RequestLog()  # no window of earlier tests' cancellations open: this one is said at once
    body = {"model": live.model, "prompt": COUNT_PROMPT, "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", live.url + "/v1/completions", json=body,
                                                        headers=AUTH) as resp:
        assert resp.status_code == 200
        first = next(line for line in resp.iter_lines() if line.startswith("data: "))
        request_id = json.loads(first[6:])["id"]
    # the connection is closed: the engine cancels the sequence and records it
    deadline = time.monotonic() + 60
    while True:
        rows = _rows(live, "select status from requests where external_id = :e", e=request_id)
        if rows or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    row = _request_row(live, request_id)
    assert row.status == "cancelled"
    assert 1 <= row.output_tokens < 400 and row.events == row.output_tokens
    assert httpx.get(live.url + "/health").json()["status"] == "ok"
    # the log says so (it said nothing of what became of requests): the first at once, later ones counted
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "serving.server"]
    assert said == [(logging.INFO, f"cancelled a request (the client went away): {request_id}")], said


def _metric(exposition: str, name: str, **labels) -> float:
    total, found = 0.0, False
    for line in exposition.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(None, 1)[1])
            found = True
    assert found, f"{name} {labels} not exposed"
    return total


def test_metrics_expose_vllm_counters_equal_to_the_store(live, client):
    client.completions.create(model=live.model, prompt=COUNT_PROMPT, max_tokens=16, temperature=0)
    live.flush()
    exp = httpx.get(live.url + "/metrics").text
    drafts, drafted, accepted = _rows(
        live, "select sum(num_drafts), sum(num_draft_tokens), sum(num_accepted_tokens) from requests")[0]
    assert drafts > 0
    assert _metric(exp, "vllm:spec_decode_num_drafts_total") == drafts
    assert _metric(exp, "vllm:spec_decode_num_draft_tokens_total") == drafted
    assert _metric(exp, "vllm:spec_decode_num_accepted_tokens_total") == accepted
    per_pos = [float(v) for v in re.findall(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*'
                                            r'position="\d+"\} (\S+)$', exp, re.M)]
    assert sum(per_pos) == accepted and per_pos[0] <= drafts
    assert per_pos == sorted(per_pos, reverse=True)  # position i needs positions < i accepted
    # accepted per position from the step rows: position i counts when accepted > i
    steps = _rows(live, "select accepted from steps where k > 0")
    assert sum(a for (a,) in steps) == accepted
    for status, n in _rows(live, "select status, count(*) from requests group by status"):
        assert _metric(exp, "specfinops:requests_total", status=status) == n
    n_ok = _rows(live, "select count(*) from requests where status = 'ok'")[0][0]
    assert _metric(exp, "vllm:e2e_request_latency_seconds_count") == n_ok
    assert "vllm:time_to_first_token_seconds_bucket" in exp and "vllm:num_requests_running" in exp


def test_no_half_written_rows(live):
    bad = _rows(live, "select r.id, r.output_tokens, (select count(*) from token_events t where t.request_id = r.id) "
                "from requests r where r.status = 'ok'")
    assert bad and all(out == events for _, out, events in bad)
    runs = _rows(live, "select mode, kind, status from runs order by id")
    assert [(m, k) for m, k, _ in runs] == [("spec", "serve"), ("ar", "serve")]


# ---------------------------------------------------------------------------------------------- SIGTERM


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_past_the_grace_answers_every_client_as_cancelled_and_ends_the_runs(tmp_path):
    """--graceful-s 1, two long streams running and a plain request queued behind them (batch 2): when the grace
    runs out, each client still gets the documented answer (a 503 JSON `cancelled`; for a stream an error event
    and [DONE]). Before, uvicorn cancelled the handlers: the plain client got a bare 500 text/plain, the streams
    were cut mid-body, and the log had a CancelledError traceback per request. The store records all three
    cancelled and both runs end 'completed'."""
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    port = _free_port()
    cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--db", db_url, "--max-batch", "2",
           "--max-len", "1024", "--power", "none", "--graceful-s", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    results: dict[str, object] = {}
    streaming = {name: threading.Event() for name in ("s1", "s2")}

    def stream(name: str, body: dict) -> None:
        lines: list[str] = []
        try:
            with httpx.Client(timeout=120) as http, http.stream("POST", url + "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line[6:])
                        streaming[name].set()
            results[name] = (r.status_code, lines)
        except httpx.HTTPError as exc:
            results[name] = (f"cut: {exc!r}", lines)

    def plain(body: dict) -> None:
        try:
            results["plain"] = httpx.post(url + "/v1/completions", json=body, timeout=120)
        except httpx.HTTPError as exc:
            results["plain"] = exc

    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.3)
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": COUNT_PROMPT, "max_tokens": 900, "temperature": 0}
        threads = [threading.Thread(target=stream, args=(n, {**body, "stream": True})) for n in streaming]
        for t in threads:
            t.start()
        assert all(e.wait(120) for e in streaming.values()), results
        threads.append(threading.Thread(target=plain, args=(body,)))
        threads[-1].start()
        while httpx.get(url + "/health", timeout=5).json()["waiting"] != 1:  # queued behind the two streams
            assert time.monotonic() < deadline + 120, "the plain request never queued"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        # uvicorn shuts down gracefully, then re-raises the SIGTERM it caught (exit by that signal)
        assert proc.wait(60) in (0, -signal.SIGTERM)
        log = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
    # the app ends the grace itself (every handler answers): uvicorn never cancels a handler, nor logs an error
    assert "ERROR" not in log and "timeout graceful shutdown exceeded" not in log, log
    assert "3 request(s) still in flight after --graceful-s 1: cancelling them" in log, log
    r = results["plain"]
    assert isinstance(r, httpx.Response), r
    assert r.status_code == 503 and r.headers["content-type"] == "application/json", (r.status_code, r.text)
    assert r.json()["error"]["code"] == "cancelled"
    ids = []
    for name in streaming:
        status, lines = results[name]
        assert status == 200 and lines[-1] == "[DONE]", (status, lines[-3:])
        assert json.loads(lines[-2])["error"]["code"] == "cancelled", lines[-3:]
        ids.append(json.loads(lines[0])["id"])
    with create_engine(db_url).connect() as c:
        runs = c.execute(text("select mode, status, ended_at from runs order by id")).all()
        assert [(m, s) for m, s, _ in runs] == [("spec", "completed"), ("ar", "completed")]
        assert all(e is not None for *_, e in runs)
        rows = c.execute(text("select external_id, status, output_tokens, (select count(*) from token_events t "
                              "where t.request_id = r.id) from requests r")).all()
    assert len(rows) == 3 and all(status == "cancelled" for _, status, *_ in rows), rows
    by_id = {e: (out, events) for e, _, out, events in rows}
    assert all(by_id[i][0] == by_id[i][1] >= 1 for i in ids), rows  # what was streamed, recorded


def _start_serve(*options: str) -> tuple[subprocess.Popen, str]:
    """`specfinops serve` in a process of its own on a free port, once /health answers 200: (process, URL)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--max-len", "1024", "--power", "none",
           *options]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read())
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("server did not come up")
        time.sleep(0.3)


def test_sigterm_drains_health_says_stopping_while_the_stream_in_flight_finishes(tmp_path):
    """A load balancer polling /health after SIGTERM saw nothing but a closed port: uvicorn closed the listener at
    once and /health said "ok" until then. Now, while a request is in flight, the server keeps listening
    (--drain-s): /health answers 503 {"status": "stopping"}, a new completion is refused 503 `shutting_down`,
    the stream in flight runs to its end ([DONE], no error) and is recorded 'ok', and the process exits cleanly
    (as before: by the SIGTERM uvicorn re-raises after its shutdown, or 0)."""
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    proc, url = _start_serve("--db", db_url, "--max-batch", "2", "--drain-s", "600", "--graceful-s", "600")
    result: dict[str, object] = {}
    streaming = threading.Event()

    def stream(body: dict) -> None:
        lines: list[str] = []
        try:
            with httpx.Client(timeout=600) as http, http.stream("POST", url + "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line[6:])
                        streaming.set()
            result["stream"] = (r.status_code, lines)
        except httpx.HTTPError as exc:
            result["stream"] = (f"cut: {exc!r}", lines)

    try:
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": COUNT_PROMPT, "max_tokens": 200, "temperature": 0}
        thread = threading.Thread(target=stream, args=({**body, "stream": True},))
        thread.start()
        assert streaming.wait(120), result
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while (health := httpx.get(url + "/health", timeout=5)).status_code == 200:  # until SIGTERM is seen
            assert time.monotonic() < deadline, "/health never said stopping"
            time.sleep(0.05)
        refused = httpx.post(url + "/v1/completions", json={**body, "max_tokens": 4}, timeout=60)
        assert thread.is_alive(), "the stream ended before the drain could be seen: make it longer"
        thread.join(600)
        rc = proc.wait(60)
        log = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert health.status_code == 503 and health.json()["status"] == "stopping", (health.status_code, health.text)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down", refused.text
    assert "shut" in refused.json()["error"]["message"]
    status, lines = result["stream"]
    assert status == 200 and lines[-1] == "[DONE]", (status, lines[-3:])
    events = [json.loads(line) for line in lines[:-1]]
    assert not any("error" in e for e in events), (lines[-3:], log)
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length"), lines[-3:]
    assert rc in (0, -signal.SIGTERM), log
    assert "Traceback" not in log and "ERROR" not in log, log
    with create_engine(db_url).connect() as c:
        runs = c.execute(text("select mode, status from runs order by id")).all()
        rows = c.execute(text("select external_id, status, output_tokens from requests")).all()
    assert runs == [("spec", "completed"), ("ar", "completed")], runs
    assert [(e, s) for e, s, _ in rows] == [(events[0]["id"], "ok")], rows  # the refused one: not recorded
    assert rows[0][2] >= 1


def test_requests_refused_as_overloaded_are_counted_on_metrics(tmp_path, caplog):
    """A request refused 503 `overloaded` (--max-waiting full) reached no engine, so neither the store nor
    specfinops:requests_total held it: /metrics showed no sign of the refusals a saturated server made.
    specfinops:requests_rejected_total{reason} counts them (0 from the start)."""
    from serving.server_setup import ServeOptions
    from serving.worker import EngineSpec

    caplog.set_level(logging.INFO, logger="serving.server")
    live = start_server(ServeOptions(spec=EngineSpec(dtype="bfloat16", k="4", max_batch=1, max_len=1024),
                                     db=f"sqlite:///{tmp_path / 'store.db'}", max_waiting=1, power="none"))
    try:
        url = live.url + "/v1/completions"
        assert _metric(httpx.get(live.url + "/metrics").text, "specfinops:requests_rejected_total",
                       reason="overloaded") == 0
        with httpx.Client(timeout=120) as http:
            body = {"model": live.model, "prompt": COUNT_PROMPT, "max_tokens": 400, "temperature": 0,
                    "stream": True}
            with http.stream("POST", url, json=body) as first:  # holds the only batch slot
                next(first.iter_lines())
                deadline = time.monotonic() + 30
                while live.state.loop_engine.num_running < 1:
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                with http.stream("POST", url, json=body) as second:  # waits: --max-waiting 1
                    codes = [http.post(url, json={**body, "stream": False}).status_code for _ in range(2)]
                    exp = http.get(live.url + "/metrics").text
                    assert second.status_code == 200
        assert codes == [503, 503]
        assert _metric(exp, "specfinops:requests_rejected_total", reason="overloaded") == 2
        assert "status=\"error\"" not in exp  # refused requests are not finished ones
    finally:
        stop_server(live)
    # and in the log (there was no line for them): the first at once, the second counted, said as the server stopped
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "serving.server"]
    rejected = [(level, m) for level, m in said if m.startswith("rejected")]
    assert rejected == [(logging.WARNING, "rejected a request (overloaded): the server is overloaded (1 request "
                         "waiting for a batch slot); retry later"),
                        (logging.WARNING, rejected[1][1])], said
    assert rejected[1][1].startswith("rejected 1 more request (overloaded) in the last "), said

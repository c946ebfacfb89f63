"""`specfinops loadtest` against a small stub server (no model): stopping cleanly on Ctrl-C, backing off
and failing on a server that goes away or refuses every request, checking the server before a store is
made, and the energy a shared store's power samples give the requests. The real server: test_loadtest."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine, text

import serving.loadtest as lt
from app.cli import main

MODEL = "stub-model"
KEY = "stub-key"


class Stub:
    """An OpenAI-compatible server on a free loopback port (uvicorn in a thread) whose chat completions
    stream `chunks` chunks `chunk_s` apart, or answer 400 (`refuse`); `card_extra` goes under the model
    card's "specfinops". `fail_usage`: the stream fails after its chunks as `specfinops serve`'s does, this
    usage chunk and then an error event. `endless_after`: the requests after that many stream chunks until the
    client goes. `capacity`: at most that many requests stream at once, the others are answered 503 overloaded
    (as `specfinops serve --max-batch --max-waiting`); `first_chunk_s`: the wait before a stream's first chunk.
    `count_tokens`: each chat request is parsed and checked by `specfinops serve`'s own code (server_schemas:
    its 400s, worded as the server words them), its prompt that many tokens; `num_streamed` counts the requests
    answered with a stream."""

    def __init__(self, *, chunks: int = 3, chunk_s: float = 0.02, refuse: bool = False, api_key: str | None = None,
                 max_model_len: int = 512, card_extra: dict | None = None, content: str = "ab",
                 fail_usage: dict | None = None, redirect_to: str | None = None, endless_after: int | None = None,
                 capacity: int | None = None, first_chunk_s: float = 0.0, owned_by: str = "stub",
                 count_tokens: Callable[[list[dict]], int] | None = None):
        import uvicorn
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        self.num_chat = 0
        self.num_overloaded = 0
        self.num_streamed = 0
        self.headers: list[dict] = []
        streaming = [0]

        def refused(request) -> JSONResponse | None:
            if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
                return JSONResponse({"error": {"message": "incorrect API key", "type": "invalid_request_error",
                                               "param": None, "code": "invalid_api_key"}}, status_code=401)
            return None

        async def models(request):
            card = {"id": MODEL, "object": "model", "created": 0, "owned_by": owned_by, "root": MODEL,
                    "max_model_len": max_model_len, "specfinops": {"backend": "torch", **(card_extra or {})}}
            return refused(request) or JSONResponse({"object": "list", "data": [card]})

        async def chat(request):
            self.num_chat += 1
            endless = endless_after is not None and self.num_chat > endless_after
            self.headers.append(dict(request.headers))
            if (no := refused(request)) is not None:
                return no
            if count_tokens is not None:
                from serving.server_schemas import APIError, ChatRequest, check, parse_body

                try:
                    req = parse_body(await request.body(), ChatRequest, max_len=max_model_len)
                    check(req, "chat", model_id=MODEL, max_len=max_model_len, vocab_size=100,
                          encode_chat=lambda msgs: [1] * count_tokens(msgs), encode_text=lambda t: [1])
                except APIError as exc:
                    return JSONResponse(exc.body(), status_code=exc.status)
            if refuse:
                return JSONResponse({"error": {"message": "max_tokens is too large for this stub", "code": None,
                                               "type": "invalid_request_error", "param": "max_tokens"}},
                                    status_code=400)
            if capacity is not None and streaming[0] >= capacity:
                self.num_overloaded += 1
                return JSONResponse({"error": {"message": "the server is overloaded; retry later", "param": None,
                                               "type": "server_error", "code": "overloaded"}}, status_code=503)
            streaming[0] += 1
            self.num_streamed += 1

            async def events():
                try:
                    async for event in stream():
                        yield event
                finally:
                    streaming[0] -= 1

            async def stream():
                await asyncio.sleep(first_chunk_s)
                def sse(obj: dict) -> str:
                    return f"data: {json.dumps(obj)}\n\n"

                base = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
                sent = 0
                while endless or sent < chunks:
                    sent += 1
                    await asyncio.sleep(chunk_s)
                    yield sse({**base, "choices": [{"index": 0, "delta": {"content": content},
                                                    "finish_reason": None}]})
                if fail_usage is not None:
                    yield sse({**base, "choices": [], "usage": fail_usage})
                    yield sse({"error": {"message": "generation failed: decode step failed", "param": None,
                                         "type": "server_error", "code": "generation_failed"}})
                    yield "data: [DONE]\n\n"
                    return
                yield sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
                yield sse({**base, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": chunks,
                                                            "total_tokens": 5 + chunks}})
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        if redirect_to is not None:  # every request answered 307 to the same path on `redirect_to`
            from starlette.responses import RedirectResponse

            async def models(request):  # noqa: F811 - the redirecting stub's routes
                return RedirectResponse(redirect_to + request.url.path, status_code=307)

            chat = models
        app = Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error",
                                                    timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, name="test-stub", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the stub server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture
def stub_factory():
    made: list[Stub] = []

    def make(**kwargs) -> Stub:
        made.append(Stub(**kwargs))
        return made[-1]

    yield make
    for s in made:
        s.stop()


@pytest.fixture
def fail_fast(monkeypatch):
    """A level gives up on a failing server after 1 s instead of FAIL_FAST_S (5 s)."""
    monkeypatch.setattr(lt, "FAIL_FAST_S", 1.0, raising=False)


class FakeRecorder:
    def __init__(self):
        self.runs: dict[int, str] = {}
        self.requests: list = []

    def start_run(self, info) -> int:
        self.runs[len(self.runs) + 1] = "running"
        return len(self.runs)

    def end_run(self, run_id, status="completed"):
        self.runs[run_id] = status

    def record_request(self, run_id, rec):
        self.requests.append(rec)


def _runs(db_url: str) -> list[tuple]:
    with create_engine(db_url).connect() as c:
        return [tuple(r) for r in c.execute(text("select kind, status, power_source from runs order by id"))]


# ------------------------------------------------------------------------------ Ctrl-C / SIGTERM (defect 1)


def test_an_interrupted_level_cancels_its_workers_and_records_the_requests_in_flight_cancelled(stub_factory):
    """Ctrl-C / SIGTERM cancel run_loadtest's task (asyncio.run's handler): the level's workers go with it,
    before the client closes, so none loops on a closed client recording errors until the duration ends;
    the requests in flight are recorded 'cancelled' (a server sharing the store left them to us)."""
    stub = stub_factory(chunks=10_000, chunk_s=0.05)  # streams for minutes
    rec = FakeRecorder()
    spec = lt.LoadSpec(url=stub.url, levels=(2,), duration_s=30, modes=("spec",), max_tokens=24)

    async def scenario() -> tuple[float, list]:
        deadline = time.perf_counter() + 30
        task = asyncio.ensure_future(lt.run_loadtest(spec, [_prompt()], workload="code", recorder=rec))
        while stub.num_chat < 2:  # both workers' requests are streaming
            assert not task.done() and time.perf_counter() < deadline
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        t0 = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)  # the old code took the rest of the 30 s
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        for t in left:
            t.cancel()
        return time.perf_counter() - t0, left

    took, left = asyncio.run(scenario())
    assert took < 3 and left == []  # no worker outlives the load test
    assert rec.runs == {1: "cancelled"}
    assert [r.status for r in rec.requests] == ["cancelled", "cancelled"], [r.error for r in rec.requests]
    assert all("interrupted" in r.error for r in rec.requests)
    # the tokens the server streamed before the cut are kept, one a chunk: they were 0, with no token rows
    for r in rec.requests:
        assert r.ttft_ms is not None and r.output_tokens >= 1, r
        assert [t.position for t in r.tokens] == list(range(r.output_tokens))
        assert r.tokens[-1].emit_offset_ms == r.e2e_ms
        # no usage came: not known to the client, so unknown (None, NULL in the store), not 0 (they were 0)
        assert (r.prompt_tokens, r.num_drafts, r.num_draft_tokens, r.num_accepted_tokens) == (None,) * 4


def test_requests_still_in_flight_at_the_deadline_are_cancelled_and_share_the_energy_as_ended_ones(
        stub_factory, tmp_path, monkeypatch):
    """A level's duration over, its requests in flight get DRAIN_GRACE_S to finish; those still streaming then are
    cancelled by the load test: recorded 'cancelled' (not errors, not ok: the level completes on its ok ones),
    with the tokens they received and their prompt tokens unknown (no usage came), and with their energy share
    from their send (no usage said their admission). Together the requests hold the energy of the time any of them
    ran: the second of two cut together took the first's window twice (out of flight, still counted in flight),
    and the first took the second's to run to its own end though it was cut before (`test_requests_cut_together_
    share_only_while_both_ran`), so their energy fell short of what the server used."""
    from telemetry.recorder import Recorder
    from telemetry.records import PowerReading
    from telemetry.store import open_store

    monkeypatch.setattr(lt, "DRAIN_GRACE_S", 0.5)
    stub = stub_factory(chunks=2, chunk_s=0.01, endless_after=2)  # two answers, then streams that never end
    engine = open_store(f"sqlite:///{tmp_path / 'power.db'}")
    run = _serve_run(engine)
    t0 = datetime.now(UTC)
    recorder = Recorder(engine)  # the server's samples: 100 W (estimated) from before the level to well after it
    recorder.record_power(run, [PowerReading(t0 + timedelta(seconds=i / 10), 0, 100.0, None, None, "estimate")
                                for i in range(-10, 600)])
    recorder.close()
    spec = lt.LoadSpec(url=stub.url, levels=(2,), duration_s=2.0, modes=("spec",), max_tokens=8)
    recorded: list[lt.ClientResult] = []

    async def level() -> lt.LevelResult:
        client = lt._client(spec)
        try:
            return await lt.run_level(client, MODEL, [_prompt()], spec, 2, "spec", on_result=recorded.append,
                                      power=lt.ServerPower(engine, run))
        finally:
            await client.close()

    result = asyncio.run(level())  # not LevelFailed: the cancelled requests fail nothing
    assert stub.num_chat == 4  # the two answered, then one endless request per worker
    assert sorted(map(id, recorded)) == sorted(map(id, result.results))  # each recorded once
    by_status = {s: [r for r in result.results if r.record.status == s] for s in ("ok", "cancelled", "error")}
    assert (len(by_status["ok"]), len(by_status["cancelled"]), len(by_status["error"])) == (2, 2, 0)
    for res in by_status["cancelled"]:
        r = res.record
        assert r.error == "cancelled at the load test's deadline"
        assert r.ttft_ms is not None and r.output_tokens >= 1 and len(r.tokens) == r.output_tokens
        assert (r.prompt_tokens, r.num_drafts) == (None, None)  # the stream was cut: no usage, unknown
        assert res.admitted_at is None and res.energy_since == r.started_at  # no queue_ms: from the send
    row = lt.summarize(result)
    assert (row["requests_ok"], row["requests_error"], row["requests_cancelled"], row["errors"]) == (2, 0, 2, [])
    assert row["output_tokens"] == sum(r.record.output_tokens for r in by_status["ok"])  # the cut ones: not output
    # every request has its share; together they hold the energy of the time any of them ran (100 W), none twice
    assert all(r.record.energy_j is not None and r.record.energy_j > 0 for r in result.results)
    spans = sorted((r.energy_since, r.ended_at) for r in result.results)
    busy, (lo, hi) = 0.0, spans[0]
    for s, e in spans[1:]:
        if s > hi:
            busy, lo = busy + (hi - lo).total_seconds(), s
        hi = max(hi, e)
    busy += (hi - lo).total_seconds()
    assert sum(r.record.energy_j for r in result.results) == pytest.approx(100.0 * busy, rel=1e-6)


def test_ctrl_c_prints_and_writes_what_ran_marked_interrupted(stub_factory, tmp_path, capsys, monkeypatch):
    """Ctrl-C during the second level: exit 130 and the runs recorded (first completed, second cancelled), as
    before, and now the table and the --json file of what ran: the first level, and the second, marked
    interrupted, with the requests it recorded until then (nothing was printed or written)."""
    import os
    import signal

    stub = stub_factory(chunks=2, chunk_s=0.02)
    real_run_level = lt.run_level
    levels = []

    async def run_level(client, model, prompts, spec, level, mode, **kwargs):
        levels.append(level)
        task = asyncio.ensure_future(real_run_level(client, model, prompts, spec, level, mode, **kwargs))
        if len(levels) == 2:  # once the second level's requests are under way: Ctrl-C
            sent = stub.num_chat
            while stub.num_chat < sent + 3:
                await asyncio.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)
        return await task

    monkeypatch.setattr(lt, "run_level", run_level)
    db_url = f"sqlite:///{tmp_path / 'ctrl-c.db'}"
    out_json = tmp_path / "ctrl-c.json"
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "1,2,4", "--duration", "1", "--mode", "spec",
               "--max-tokens", "8", "--workload", "code", "--db", db_url, "--json", str(out_json)])
    out = capsys.readouterr()
    assert rc == 130 and "interrupted" in out.err, out.err
    assert levels == [1, 2]
    assert _runs(db_url) == [("loadtest", "completed", "none"), ("loadtest", "cancelled", "none")]
    doc = json.loads(out_json.read_text())
    assert doc["interrupted"] is True and "error" not in doc
    first, second = doc["levels"]
    assert (first["concurrency"], first["interrupted"], second["concurrency"], second["interrupted"]) == (
        1, False, 2, True)
    assert first["requests_ok"] >= 1
    with create_engine(db_url).connect() as c:
        stored = dict(c.execute(text("select run_id, count(*) from requests group by run_id")).all())
    for row in (first, second):  # each row counts what its run recorded
        assert row["requests_ok"] + row["requests_error"] + row["requests_cancelled"] == stored[row["run_id"]], row
    # the interrupted level's tokens/s is the store's (its requests' span), as a finished level's: it was the
    # time since the level began, which `cost` does not use
    assert main(["cost", "--db", db_url, "--run", str(second["run_id"]), "--json"]) == 0
    (costed,) = json.loads(capsys.readouterr().out)["runs"]
    assert second["wall_s"] == pytest.approx(costed["wall_s"], rel=1e-6), (second, costed)
    assert "spec     1" in out.out and "spec     2" in out.out, out.out
    assert "spec c=2 was interrupted (Ctrl-C or SIGTERM)" in out.out, out.out


def _prompt():
    from serving.workloads import load_workload

    return load_workload("code")[0]


# ------------------------------------------------------------------------------ failing servers (defect 2)


def test_a_worker_backs_off_after_failures():
    assert [lt.backoff_s(n) for n in (1, 2, 3)] == [0.05, 0.1, 0.2]
    assert lt.backoff_s(30) == lt.BACKOFF_MAX_S == 2.0


def test_a_server_that_goes_away_stops_the_load_test_failed(stub_factory, fail_fast, tmp_path, capsys):
    """kill -9 of the server mid-level: the workers back off instead of writing thousands of connection
    errors, the level stops, its run ends 'failed' and the command says why and exits 1."""
    stub = stub_factory(chunks=2, chunk_s=0.05)
    db_url = f"sqlite:///{tmp_path / 'die.db'}"

    def stop_mid_level():  # once the level is under way (4 requests sent: 2 or more answered), not at a fixed time
        until = time.monotonic() + 30  # a busy machine may take seconds to check the server and start the level
        while stub.num_chat < 4 and time.monotonic() < until:
            time.sleep(0.01)
        stub.stop()

    threading.Thread(target=stop_mid_level, daemon=True).start()
    t0 = time.perf_counter()
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "2", "--duration", "20", "--mode", "spec",
               "--max-tokens", "8", "--workload", "code", "--db", db_url, "--json", str(tmp_path / "die.json")])
    took = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert rc == 1 and took < 20, (rc, took)  # stopped by fail-fast, not at the end of its 20 s
    assert "the server stopped answering" in err and "Connection error" in err, err
    assert _runs(db_url) == [("loadtest", "failed", "none")]
    with create_engine(db_url).connect() as c:
        by_status = dict(c.execute(text("select status, count(*) from requests group by status")).all())
    assert by_status.get("ok", 0) >= 2 and 3 <= by_status["error"] <= 40, by_status  # backed off: no flood
    doc = json.loads((tmp_path / "die.json").read_text())
    assert "stopped answering" in doc["error"] and doc["levels"][0]["requests_error"] == by_status["error"]


def test_a_server_refusing_every_request_fails_the_level_with_its_reason(stub_factory, fail_fast, tmp_path, capsys):
    stub = stub_factory(refuse=True)
    db_url = f"sqlite:///{tmp_path / 'refused.db'}"
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "2,4", "--duration", "10", "--mode", "both",
               "--max-tokens", "8", "--workload", "code", "--db", db_url])
    out = capsys.readouterr()
    assert rc == 1
    assert "ar c=2: every request failed" in out.err and "max_tokens is too large for this stub" in out.err, out.err
    assert _runs(db_url) == [("loadtest", "failed", "none")]  # the load test stopped at the first level
    assert 3 <= stub.num_chat <= 30, stub.num_chat  # backed off (the old loop sent hundreds a second)
    assert "ar       2      0" in out.out  # the table of what ran is still printed


def test_an_overloaded_server_still_serving_its_accepted_requests_is_not_a_failed_level(stub_factory, fail_fast,
                                                                                       tmp_path, capsys):
    """`serve --max-batch 1 --max-waiting 1` under 4 clients: the surplus requests are answered 503 overloaded
    while the request it took waits longer than FAIL_FAST_S for its first token. The server works: the level
    ends, its ok requests beside the 503s, not 'every request failed'."""
    stub = stub_factory(capacity=1, first_chunk_s=1.6, chunks=2, chunk_s=0.01)
    db_url = f"sqlite:///{tmp_path / 'busy.db'}"
    out = tmp_path / "busy.json"
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "4", "--duration", "2", "--mode", "spec",
               "--max-tokens", "3", "--workload", "code", "--db", db_url, "--json", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "every request failed" not in err and stub.num_overloaded >= 3, (stub.num_overloaded, err)
    level = json.loads(out.read_text())["levels"][0]
    assert level["requests_ok"] >= 1 and level["requests_error"] >= 3, level
    assert _runs(db_url) == [("loadtest", "completed", "none")]


def test_a_server_whose_every_stream_opens_then_fails_stops_the_load_test(stub_factory, fail_fast, tmp_path, capsys):
    """Every request is accepted (200, stream open) and then fails: those are the server's failures, not refusals
    that another accepted request in flight excuses. With 4 clients one is always in flight: the level ran its
    whole --duration, ending 'no request succeeded', instead of stopping after FAIL_FAST_S."""
    usage = {"prompt_tokens": 5, "completion_tokens": 15, "total_tokens": 20}
    stub = stub_factory(chunks=15, chunk_s=0.1, fail_usage=usage)  # 1.5 s a stream, then its error event
    db_url = f"sqlite:///{tmp_path / 'broken.db'}"
    t0 = time.perf_counter()
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "4", "--duration", "12", "--mode", "ar",
               "--max-tokens", "8", "--workload", "code", "--db", db_url])
    took = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert rc == 1 and "every request failed for" in err and "decode step failed" in err, err
    assert took < 8, took  # FAIL_FAST_S (1 s) after the second wave failed, not the 12 s duration
    assert _runs(db_url) == [("loadtest", "failed", "none")]


def test_a_server_hanging_on_the_request_it_took_and_refusing_the_rest_stops_the_load_test(
        stub_factory, fail_fast, tmp_path, capsys, monkeypatch):
    """The server answers one request 200 and never sends its first token, and 503s the others: an accepted
    request without a token shows the server works for ACCEPTED_SILENT_S only, then the refusals count and the
    level stops FAIL_FAST_S later; it ran until the duration and the drain grace were over."""
    monkeypatch.setattr(lt, "ACCEPTED_SILENT_S", 1.5, raising=False)
    monkeypatch.setattr(lt, "DRAIN_GRACE_S", 2.0)
    stub = stub_factory(capacity=1, first_chunk_s=600, chunks=2)
    db_url = f"sqlite:///{tmp_path / 'hung.db'}"
    t0 = time.perf_counter()
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "4", "--duration", "10", "--mode", "ar",
               "--max-tokens", "8", "--workload", "code", "--db", db_url])
    took = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert rc == 1 and "every request failed for" in err and "overloaded" in err, err
    assert took < 7, took  # ~ACCEPTED_SILENT_S + FAIL_FAST_S, not the 10 s duration + the 2 s grace
    assert _runs(db_url) == [("loadtest", "failed", "none")]


def test_max_tokens_beyond_the_servers_context_window_is_refused_before_anything_runs(stub_factory, tmp_path,
                                                                                       capsys):
    stub = stub_factory(max_model_len=512)
    db = tmp_path / "ctx.db"
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "5", "--max-tokens", "100000",
               "--db", str(db)])
    assert rc == 2 and "--max-tokens 100000 cannot fit" in capsys.readouterr().err
    assert stub.num_chat == 0 and not db.exists()
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "0.3", "--mode", "ar",
               "--max-tokens", "510", "--db", str(db)])
    assert rc == 0 and stub.num_chat >= 1  # 510 = max_model_len - 2 fits a one-token prompt


def test_the_probes_pattern_reads_the_prompt_tokens_in_serves_refusal_of_max_tokens_max_len():
    """refuse_long_prompts sends max_tokens = max_model_len and reads the prompt's tokens from `specfinops
    serve`'s refusal with _PROMPT_TOKENS: a change of server_schemas.check()'s wording left the probe judging
    nothing, with only a slow test to notice. Both refusals (the prompt alone too long; the output too long
    after it) must still say the prompt's tokens."""
    from serving.server_schemas import APIError, ChatRequest, check, parse_body

    max_len = 64
    for num_prompt in (10, 62, 63, 80):  # room for output, then none (max_len - 2 prompt tokens is the most)
        req = parse_body(json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                     "max_tokens": max_len}).encode(), ChatRequest, max_len=max_len)
        with pytest.raises(APIError) as err:
            check(req, "chat", model_id=MODEL, max_len=max_len, vocab_size=100,
                  encode_chat=lambda msgs, n=num_prompt: [1] * n, encode_text=lambda t: [1])
        found = lt._PROMPT_TOKENS.search(err.value.message)
        assert err.value.status == 400 and found and int(found[1]) == num_prompt, err.value.message


def _code_prompts_chars() -> dict[str, int]:
    from serving.workloads import load_workload

    return {p.id: sum(len(m["content"]) for m in p.as_messages()) for p in load_workload("code")}


def _chars(msgs: list[dict]) -> int:  # the stub's token count: one token a character
    return sum(len(m["content"]) for m in msgs)


def test_a_prompt_too_long_for_a_specfinops_servers_window_is_named_before_anything_runs(stub_factory, tmp_path,
                                                                                        capsys):
    """A workload prompt that alone fills `specfinops serve`'s window was reported as '--max-tokens cannot fit
    ... lower --max-tokens' and 'its requests would all be refused': no --max-tokens helps, and only the requests
    sending that prompt are refused. The prompt is named with its tokens; the advice is a larger --max-len or a
    workload without it. Refused before any run or store (the probes are refused 400, nothing streams)."""
    chars = _code_prompts_chars()
    longest = max(chars, key=chars.get)
    stub = stub_factory(owned_by="specfinops", count_tokens=_chars, max_model_len=chars[longest] + 1)
    db = tmp_path / "long.db"
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "0.3", "--mode", "ar",
               "--max-tokens", "8", "--workload", "code", "--db", str(db)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"the workload's prompt {longest} ({chars[longest]} tokens) is too long for the server's context " \
           f"window, as the server counts it: max_model_len {chars[longest] + 1} holds at most " \
           f"{chars[longest] - 1} prompt tokens" in err, err
    assert "serve with a larger --max-len, or use a workload without it" in err, err
    assert "lower --max-tokens" not in err and "all be refused" not in err, err
    assert stub.num_chat >= 1 and stub.num_streamed == 0 and not db.exists()


def test_max_tokens_beyond_the_room_after_a_specfinops_servers_longest_prompt_is_refused(stub_factory, tmp_path,
                                                                                        capsys):
    """The prompt fits with 9 tokens of room: --max-tokens 20 is refused naming the room; 9 runs."""
    chars = _code_prompts_chars()
    longest = max(chars, key=chars.get)
    max_len = chars[longest] + 10
    stub = stub_factory(owned_by="specfinops", count_tokens=_chars, max_model_len=max_len, chunks=2, chunk_s=0.01)
    db = tmp_path / "room.db"
    args = ["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "0.3", "--mode", "ar",
            "--workload", "code", "--db", str(db)]
    rc = main([*args, "--max-tokens", "20"])
    err = capsys.readouterr().err
    assert rc == 2 and f"--max-tokens 20 cannot fit the server's context window after this workload's longest " \
                       f"prompt ({longest}, {chars[longest]} tokens as the server counts it): max_model_len " \
                       f"{max_len}, at most 9 output tokens fit after it" in err, err
    assert "lower --max-tokens, or serve with a larger --max-len" in err, err
    assert stub.num_streamed == 0 and not db.exists()
    assert main([*args, "--max-tokens", "9"]) == 0, capsys.readouterr().err
    assert stub.num_streamed >= 1


# ------------------------------------------------------------------------------ checked before the store (defect 3)


@pytest.mark.parametrize(("extra", "said"), [
    (["--api-key", "wrong"], "refused the API key (--api-key) (401 incorrect API key)"),
    # no --api-key: the client sent a placeholder the server calls "incorrect"; the load test says none was given
    ([], "wants an API key: pass --api-key (401; no key was given)"),
    (["--api-key", KEY, "--model", "gpt-4"], "does not serve 'gpt-4'; it serves stub-model"),
])
def test_a_refused_key_or_unknown_model_is_named_and_creates_no_store(extra, said, stub_factory, tmp_path, capsys):
    stub = stub_factory(api_key=KEY)
    db = tmp_path / "new.db"
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "1", "--db", str(db), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and said in err and "cannot reach" not in err, err
    assert extra or "incorrect" not in err, err  # no key given: the server's word on the placeholder is not quoted
    assert not db.exists() and stub.num_chat == 0


def test_nothing_answering_creates_no_store(tmp_path, capsys):
    import socket

    with socket.socket() as s:  # a free port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = tmp_path / "none.db"
    rc = main(["loadtest", "--url", f"http://127.0.0.1:{port}", "--duration", "1", "--db", str(db)])
    assert rc == 2 and f"cannot reach http://127.0.0.1:{port}" in capsys.readouterr().err and not db.exists()


class Page:
    """Something that is not an OpenAI-compatible server: http.server in a thread, answering every GET with
    `body` as `content_type`."""

    def __init__(self, body: bytes, content_type: str):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="test-page", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(("body", "content_type", "said"), [
    (b"<!doctype html><html><body>It works!</body></html>", "text/html; charset=utf-8",
     "answered 200 text/html: '<!doctype html><html><body>It works!</body></html>'"),
    (b"{}", "application/json", "answered 200 application/json without a 'data' list of models ({'id': ...}): '{}'"),
    (b'{"data": [{"name": "x"}]}', "application/json", "answered 200 application/json without a 'data' list"),
])
def test_a_server_that_is_not_openai_compatible_is_named_and_creates_no_store(body, content_type, said, tmp_path,
                                                                              capsys):
    """A web page answered 200 on /v1/models: AttributeError ('str' object has no attribute
    '_set_private_attributes'); JSON without 'data': TypeError ('NoneType' object is not iterable)."""
    page = Page(body, content_type)
    try:
        db = tmp_path / "page.db"
        rc = main(["loadtest", "--url", page.url, "--concurrency", "1", "--duration", "1", "--db", str(db)])
    finally:
        page.stop()
    err = capsys.readouterr().err
    assert rc == 2 and not db.exists(), err
    assert f"error: the server at {page.url} is not an OpenAI-compatible server (GET /v1/models {said}" in err, err
    assert len(err.strip().splitlines()) == 1, err


# ------------------------------------------------------------------------------ the server's key (defect 4)


def _serve_run(engine, power_source: str = "estimate") -> int:
    with engine.begin() as c:
        return c.execute(text(
            "INSERT INTO runs (kind, mode, node_id, hostname, device, backend, dtype, target, k_policy, concurrency, "
            "workload, power_source, software_version, started_at, status, dropped_records) VALUES ('serve', 'spec', "
            "'n', 'h', 'cpu', 'torch', 'bfloat16', 't', 'auto', 8, 'serve', :p, 'v', :t, 'running', 0) RETURNING id"),
            {"p": power_source, "t": datetime.now(UTC)}).scalar_one()


def store_fingerprint(db_file) -> str:
    """What the recorded-in header used to carry, and any HTTP client can compute: a hash of the store's path."""
    import hashlib
    from pathlib import Path

    return hashlib.sha256(f"sqlite:{Path(db_file).resolve()}".encode()).hexdigest()[:16]


def test_the_client_key_is_random_kept_in_the_store_and_found_only_there(tmp_path):
    from serving.server_telemetry import client_key_id, publish_client_key, read_client_key
    from telemetry.store import open_store

    db_url = f"sqlite:///{tmp_path / 'keys.db'}"
    engine, other = open_store(db_url), open_store(f"sqlite:///{tmp_path / 'other.db'}")
    run = _serve_run(engine)
    key = publish_client_key(engine, run)
    assert key != publish_client_key(engine, _serve_run(engine)) and len(key) == 32
    forged = store_fingerprint(tmp_path / 'keys.db')
    assert key != forged and forged not in key  # nothing an HTTP client can compute
    assert read_client_key(engine, run, client_key_id(key)) == key
    assert read_client_key(engine, run, client_key_id("guess")) is None
    _serve_run(other)  # the same run id in another store: its key is not this server's
    assert read_client_key(other, run, client_key_id(key)) is None
    card = {"id": MODEL, "specfinops": {"telemetry": {"run_id": run, "key_id": client_key_id(key)}}}
    shared = lt.shared_store(engine, card)
    assert (shared.key, shared.run_id, shared.power_source) == (key, run, "estimate")
    assert lt.shared_store(other, card) is None and lt.shared_store(engine, {"id": MODEL}) is None


# ------------------------------------------------------------------------------ energy (defect 5)


def _result(start: datetime, seconds: float) -> lt.ClientResult:
    res = lt.new_result(_prompt())
    res.record.started_at, res.ended_at = start, start + timedelta(seconds=seconds)
    return res


def test_server_power_shares_the_serve_runs_samples_among_the_requests_in_flight(tmp_path):
    """100 W (estimated) for 4 s; A runs 0-2 s, B 1-3 s: A has 1 s alone and half of 1 s, 150 J; so has B."""
    from telemetry.recorder import Recorder
    from telemetry.records import PowerReading
    from telemetry.store import open_store

    engine = open_store(f"sqlite:///{tmp_path / 'power.db'}")
    run = _serve_run(engine)
    t0 = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    a, b, late = _result(t0, 2), _result(t0 + timedelta(seconds=1), 2), _result(t0 + timedelta(seconds=3), 5)
    power = lt.ServerPower(engine, run)
    power.add(a, [(b.record.started_at, a.ended_at)])  # B was in flight when A ended
    power.add(b, [(a.record.started_at, a.ended_at)])
    power.add(late, [])
    recorder = Recorder(engine)
    recorder.record_power(run, [PowerReading(t0 + timedelta(seconds=i), 0, 100.0, None, None, "estimate")
                                for i in range(5)])
    recorder.close()
    settled = asyncio.run(power.settle())
    assert settled == [a, b] and a.record.energy_j == pytest.approx(150.0) and b.record.energy_j == pytest.approx(150.0)
    assert late.record.energy_j is None  # its end is beyond the samples: it waits
    assert asyncio.run(power.settle(final=True)) == [late] and late.record.energy_j is None  # never guessed


def test_a_requests_energy_window_starts_at_its_admission_as_the_servers_does(tmp_path):
    """The load test shared the server's energy over send-to-end windows: a request queued at the server took a
    share of what the running ones used, while the server counts a request's energy from its admission. 100 W
    for 4 s; B runs 0-3 s; A, sent at 0 s, queued 1 s (the usage's queue_ms), runs 1-2 s: A 50 J, B 250 J (over
    the send windows: 100 J and 200 J). A's share waits for B, in flight at its end, to finish: B's admission is
    in its usage."""
    from telemetry.recorder import Recorder
    from telemetry.records import PowerReading
    from telemetry.store import open_store

    engine = open_store(f"sqlite:///{tmp_path / 'power.db'}")
    run = _serve_run(engine)
    t0 = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    a, b = _result(t0, 2), lt.new_result(_prompt())
    a.admitted_at = lt.admission(a.record.started_at, a.ended_at, _usage({"queue_ms": 1000.0}))
    assert a.admitted_at == t0 + timedelta(seconds=1) and a.energy_since == a.admitted_at
    b.record.started_at = t0
    power = lt.ServerPower(engine, run)
    power.add(a, [], [b])  # B in flight when A ended
    recorder = Recorder(engine)
    recorder.record_power(run, [PowerReading(t0 + timedelta(seconds=i), 0, 100.0, None, None, "estimate")
                                for i in range(5)])
    recorder.close()
    assert asyncio.run(power.settle()) == []  # B's admission unknown yet: A waits
    b.ended_at = t0 + timedelta(seconds=3)
    b.admitted_at = lt.admission(b.record.started_at, b.ended_at, _usage({"queue_ms": 0}))
    power.add(b, [(a.energy_since, a.ended_at)])
    assert asyncio.run(power.settle()) == [a, b]
    assert (a.record.energy_j, b.record.energy_j) == (pytest.approx(50.0), pytest.approx(250.0))


def test_requests_cut_together_share_only_while_both_ran(tmp_path):
    """The requests a level cancels at its end are cut one by one, then shared with one another in any order: A
    (0-3 s), shared first, had B beside it in flight though B was cut at 2 s, and B's window was taken to run to
    A's end: A got 150 J of its 200 J (100 W: half of 0-2 s, all of 2-3 s), and 50 J went to no request."""
    from telemetry.recorder import Recorder
    from telemetry.records import PowerReading
    from telemetry.store import open_store

    engine = open_store(f"sqlite:///{tmp_path / 'power.db'}")
    run = _serve_run(engine)
    t0 = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    a, b = _result(t0, 3), _result(t0, 2)
    power = lt.ServerPower(engine, run)
    power.add(a, [], [b])  # B still in flight when A was shared (as run_level does with a level's last requests)
    power.add(b, [(a.energy_since, a.ended_at)])
    recorder = Recorder(engine)
    recorder.record_power(run, [PowerReading(t0 + timedelta(seconds=i), 0, 100.0, None, None, "estimate")
                                for i in range(5)])
    recorder.close()
    assert asyncio.run(power.settle()) == [a, b]
    assert (a.record.energy_j, b.record.energy_j) == (pytest.approx(200.0), pytest.approx(100.0))


def _usage(specfinops: dict):
    from openai.types import CompletionUsage

    return CompletionUsage(prompt_tokens=4, completion_tokens=3, total_tokens=7, specfinops=specfinops)


def test_a_server_that_says_no_admission_leaves_the_window_at_the_send():
    """Another server (vLLM), a stream cut without usage, or a wait no server reports: the window starts at the
    send, queueing included; a wait past the request's end ends there."""
    start = datetime(2026, 11, 2, 9, tzinfo=UTC)
    end = start + timedelta(seconds=2)
    assert lt.admission(start, end, None) is None
    for said in ({}, {"queue_ms": None}, {"queue_ms": True}, {"queue_ms": -1}, {"queue_ms": "5"},
                 {"queue_ms": float("nan")}, {"queue_ms": float("inf")}, {"queue_ms": 1e300}):
        assert lt.admission(start, end, _usage(said)) is None, said
    assert lt.admission(start, end, _usage({"queue_ms": 5000})) == end
    res = _result(start, 2)
    assert res.admitted_at is None and res.energy_since == start


def test_the_load_tests_invocation_is_in_its_json_on_every_run_and_named_for_cost(stub_factory, tmp_path, capsys):
    stub = stub_factory(chunks=2, chunk_s=0.01)
    db_url = f"sqlite:///{tmp_path / 'inv.db'}"
    out_json = tmp_path / "inv.json"
    assert main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "0.5", "--mode", "both",
                 "--max-tokens", "8", "--workload", "code", "--db", db_url, "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    inv = json.loads(out_json.read_text())["invocation_id"]
    assert isinstance(inv, str) and len(inv) == 32
    with create_engine(db_url).connect() as c:
        assert c.execute(text("select distinct invocation_id from runs")).scalars().all() == [inv]
    hint = f"`specfinops project --invocation {inv[:8]} --daily-tokens 5e8 --peak-factor 2 --p95-tpot-sla-ms 50`"
    assert f"runs of invocation {inv}: its costs with `specfinops cost --invocation {inv[:8]}`" in out and hint in out
    # the command it names runs as printed (it used to lack the options project requires)
    assert main(hint.strip("`").split()[1:] + ["--db", db_url]) == 0, capsys.readouterr().err
    assert "nodes needed" in capsys.readouterr().out
    assert main(["invocations", "--db", db_url, "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["invocations"]
    assert listed["invocation_id"] == inv and listed["kinds"] == ["loadtest"] and listed["runs"] == 2
    assert main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "0.5", "--mode", "spec",
                 "--max-tokens", "8", "--no-telemetry", "--json", str(out_json)]) == 0
    assert json.loads(out_json.read_text())["invocation_id"] is None  # nothing recorded: no invocation to name


def test_a_level_that_sends_nothing_fails_and_a_refused_run_leaves_no_folder(stub_factory, tmp_path, capsys):
    """--duration 1e-9 ended before a request went out: the level was 'completed' with 0 requests and the load
    test exited 0; and a --json path's folders, made to check it, stayed behind when the run was refused."""
    stub = stub_factory(chunks=2, chunk_s=0.01)
    db_url = f"sqlite:///{tmp_path / 'none-sent.db'}"
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "1e-9", "--mode", "spec",
               "--max-tokens", "8", "--workload", "code", "--db", db_url])
    err = capsys.readouterr().err
    assert rc == 1 and "sent no request" in err, err
    assert _runs(db_url) == [("loadtest", "failed", "none")]
    import socket

    with socket.socket() as sock:  # a free port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "a" / "b" / "load.json"
    assert main(["loadtest", "--url", f"http://127.0.0.1:{port}", "--duration", "1", "--no-telemetry",
                 "--json", str(out)]) == 2
    assert "cannot reach" in capsys.readouterr().err and not (tmp_path / "a").exists()


def test_tokens_without_text_count_and_all_is_recorded_as_mixed(stub_factory, tmp_path, capsys):
    """A stream whose chunks carry no text while its usage counts tokens was stored ok with 0 tokens; and
    --workload all (the same prompts as mixed) was recorded as a workload of its own, never pooled with mixed."""
    stub = stub_factory(chunks=3, chunk_s=0.01, content="")
    db_url = f"sqlite:///{tmp_path / 'no-text.db'}"
    assert main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "0.3", "--mode", "spec",
                 "--max-tokens", "8", "--workload", "all", "--db", db_url]) == 0, capsys.readouterr().err
    with create_engine(db_url).connect() as c:
        assert c.execute(text("select distinct workload from runs")).scalars().all() == ["mixed"]
        rows = c.execute(text("select status, output_tokens, ttft_ms from requests where status = 'ok'")).all()
    assert rows and all(n == 3 and ttft is None for _, n, ttft in rows), rows  # no text: no first-token time


def test_the_runs_record_the_device_the_servers_card_names(stub_factory, tmp_path, capsys):
    """A load test's runs recorded the client's CPU whatever served them, and were priced as it: the device
    the server's model card names (`specfinops serve` names its own) is theirs."""
    device = "cuda: NVIDIA H100 80GB HBM3 x 8 (tp 8)"
    stub = stub_factory(chunks=2, chunk_s=0.01, card_extra={"device": device})
    db_url = f"sqlite:///{tmp_path / 'device.db'}"
    assert main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "0.3", "--mode", "spec",
                 "--max-tokens", "8", "--workload", "code", "--db", db_url]) == 0, capsys.readouterr().err
    with create_engine(db_url).connect() as c:
        assert c.execute(text("select distinct device from runs")).scalars().all() == [device]


@pytest.mark.parametrize("mode", ["spec", "both"])
def test_spec_against_a_server_that_does_not_speculate_is_refused_before_any_run(mode, stub_factory, tmp_path,
                                                                                   capsys):
    """A `serve --k 0` server's card says it drafts nothing (drafter null, k_policy 'none'): a 'spec' level
    against it would record an AR run as 'spec', and `cost`/`invocations` a speedup that never happened (with
    --mode both: AR against AR). Refused before any store, and --mode ar still runs."""
    stub = stub_factory(chunks=2, chunk_s=0.01, card_extra={"drafter": None, "k_policy": "none"})
    db = tmp_path / "ar.db"
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "0.3", "--mode", mode,
               "--max-tokens", "8", "--db", str(db)])
    err = capsys.readouterr().err
    assert rc == 2 and f"the server at {stub.url} does not speculate (its card: drafter none)" in err, err
    assert "use --mode ar, or serve with a K of 1 or more" in err, err
    assert stub.num_chat == 0 and not db.exists()
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "0.3", "--mode", "ar",
               "--max-tokens", "8", "--db", f"sqlite:///{db}"])
    assert rc == 0, capsys.readouterr().err
    with create_engine(f"sqlite:///{db}").connect() as c:
        assert c.execute(text("select mode, drafter, k_policy from runs")).all() == [("ar", None, "none")]


def test_a_stream_that_fails_keeps_the_tokens_its_usage_counts(stub_factory, tmp_path, capsys):
    """A stream that fails after its tokens (the server's usage chunk, then its error event) was stored with 0
    prompt and output tokens, 0 drafts and no token events, though the server made and counted them (/metrics
    sums then exceeded the shared store's): the usage's counts and the chunks' token events are kept."""
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
             "specfinops": {"num_drafts": 2, "num_draft_tokens": 8, "num_accepted_tokens": 5}}
    stub = stub_factory(chunks=3, chunk_s=0.01, fail_usage=usage)
    db_url = f"sqlite:///{tmp_path / 'failed.db'}"
    assert main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "0.3", "--mode", "spec",
                 "--max-tokens", "8", "--workload", "code", "--db", db_url]) == 1  # no request ok: the level failed
    assert "APIError: generation failed" in capsys.readouterr().err
    with create_engine(db_url).connect() as c:
        rows = c.execute(text("select r.id, r.status, r.prompt_tokens, r.output_tokens, r.num_drafts, "
                              "r.num_draft_tokens, r.num_accepted_tokens, count(t.id) from requests r "
                              "left join token_events t on t.request_id = r.id group by r.id")).all()
    assert rows and all(tuple(r[1:]) == ("error", 5, 7, 2, 8, 5, 7) for r in rows), rows


def test_counts_a_server_did_not_send_are_stored_unknown_not_zero(stub_factory, tmp_path, capsys):
    """A server whose usage carries no "specfinops" speculation counts (another OpenAI-compatible server): a spec
    request's drafts were stored 0, read as "drafted nothing" in the requests CSV; they are unknown (empty), while
    an AR request's 0 drafts are known and its usage's prompt tokens are kept."""
    import csv

    stub = stub_factory(chunks=3, chunk_s=0.01)  # usage: prompt and completion tokens, no "specfinops"
    db_url = f"sqlite:///{tmp_path / 'other.db'}"
    assert main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "0.3", "--mode", "both",
                 "--max-tokens", "8", "--workload", "code", "--db", db_url]) == 0, capsys.readouterr().err
    out = tmp_path / "requests.csv"
    assert main(["export", "--db", db_url, "--what", "requests", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    cols = ("prompt_tokens", "output_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens")
    by_mode = {m: {tuple(r[c] for c in cols) for r in rows if r["mode"] == m} for m in ("spec", "ar")}
    assert by_mode == {"spec": {("5", "3", "", "", "")}, "ar": {("5", "3", "0", "0", "0")}}, by_mode
    from telemetry.queries import acceptance_by_domain
    from telemetry.store import open_store

    store = open_store(db_url)
    (code,) = acceptance_by_domain(store)  # the Speculation page's and the report's table: unknown, not 0
    store.dispose()
    assert (code.num_drafts, code.num_draft_tokens, code.num_accepted_tokens, code.acceptance_rate) == (None,) * 4


def test_speculation_counts_no_engine_makes_are_stored_unknown(stub_factory, tmp_path, capsys):
    """A server's usage whose counts no engine makes (more accepted than drafted tokens) was stored as sent, and the
    run's acceptance rate read above 1: such counts are unknown (NULL), the request's tokens kept."""
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
             "specfinops": {"num_drafts": 2, "num_draft_tokens": 3, "num_accepted_tokens": 9}}
    stub = stub_factory(chunks=3, chunk_s=0.01, fail_usage=usage)
    db_url = f"sqlite:///{tmp_path / 'odd.db'}"
    assert main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "0.3", "--mode", "spec",
                 "--max-tokens", "8", "--workload", "code", "--db", db_url]) == 1
    capsys.readouterr()
    with create_engine(db_url).connect() as c:
        rows = c.execute(text("select prompt_tokens, output_tokens, num_drafts, num_draft_tokens, "
                              "num_accepted_tokens from requests")).all()
    assert rows and {tuple(r) for r in rows} == {(5, 7, None, None, None)}, rows


def test_the_load_test_follows_no_redirect_and_takes_no_proxy(stub_factory, tmp_path, capsys, monkeypatch):
    """The SDK's client followed a server's 307 to another host and took HTTP_PROXY from the environment, so the
    workload, the API key and a shared store's client key left the loopback address the load test checks. Neither
    now: a redirecting server is refused naming where it points, and a proxy variable is not used."""
    real = stub_factory(chunks=2, chunk_s=0.01)
    hop = stub_factory(redirect_to=real.url)
    argv = ["loadtest", "--concurrency", "1", "--duration", "0.3", "--mode", "ar", "--max-tokens", "8",
            "--workload", "code", "--no-telemetry"]
    assert main([*argv, "--url", hop.url]) == 2
    err = capsys.readouterr().err
    assert f"redirects GET /v1/models (307) to {real.url}/v1/models" in err and "follows no redirect" in err, err
    assert real.num_chat == 0
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there: a used proxy fails every request
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert main([*argv, "--url", real.url]) == 0, capsys.readouterr().err
    assert real.num_chat > 0


def test_a_workload_file_is_one_workload_whatever_path_named_it(stub_factory, tmp_path, monkeypatch, capsys):
    """A file of `{"prompt": ...}` lines was refused (no id, no domain); run as `../my2.jsonl` it was recorded
    under that string, so `cost --workload my2.jsonl` (or its absolute path) found no runs, and the same file run
    from another folder was another workload. Its runs record its absolute path; any path to it selects them, and
    a run recorded before under a path as typed is still found by that spelling."""
    from sqlalchemy.orm import Session
    from synthetic import Req, make_run

    from telemetry.store import open_store

    stub = stub_factory(chunks=2, chunk_s=0.01)
    (tmp_path / "a").mkdir()
    (tmp_path / "my2.jsonl").write_text(json.dumps({"prompt": "Write a haiku about tea."}) + "\n")
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    for folder, spelling in ((tmp_path / "a", "../my2.jsonl"), (tmp_path, "my2.jsonl")):
        monkeypatch.chdir(folder)
        assert main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "0.3", "--mode", "spec",
                     "--max-tokens", "8", "--workload", spelling, "--db", db_url]) == 0, capsys.readouterr().err
    absolute = str((tmp_path / "my2.jsonl").resolve())
    with create_engine(db_url).connect() as c:
        assert c.execute(text("select distinct workload from runs")).scalars().all() == [absolute]
        assert set(c.execute(text("select external_id, domain from requests")).all()) == {("my2.jsonl:1", "custom")}
    engine = open_store(db_url)
    with Session(engine) as s:  # recorded before runs kept the absolute path: the string as typed, elsewhere
        old = make_run(s, "ar", workload="../my2.jsonl", requests=[Req(100, ttft_ms=100, e2e_ms=10_000)]).id
        s.commit()
    engine.dispose()
    capsys.readouterr()
    monkeypatch.chdir(tmp_path / "a")
    for spelling in ("../my2.jsonl", absolute, "~/my2.jsonl"):
        monkeypatch.setenv("HOME", str(tmp_path))
        assert main(["cost", "--db", db_url, "--workload", spelling, "--json"]) == 0, capsys.readouterr().err
        runs = json.loads(capsys.readouterr().out)["runs"]
        assert {r["workload"] for r in runs} == ({absolute, "../my2.jsonl"} if spelling == "../my2.jsonl"
                                                 else {absolute}), spelling
    monkeypatch.chdir(tmp_path)
    assert main(["cost", "--db", db_url, "--workload", "my2.jsonl", "--json"]) == 0, capsys.readouterr().err
    assert old not in {r["run_id"] for r in json.loads(capsys.readouterr().out)["runs"]}  # another file from here
    out = tmp_path / "requests.csv"
    assert main(["export", "--db", db_url, "--what", "requests", "--workload", "./my2.jsonl",
                 "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) > 1
    capsys.readouterr()
    assert main(["cost", "--db", db_url, "--workload", absolute]) == 0  # the table shows the file by its name
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["1"]]
    assert rows and rows[0][2] == "my2.jsonl", rows  # it showed the path's first 12 characters, '/tmp/pytest-'
    assert main(["cost", "--db", db_url, "--workload", "other.jsonl"]) != 0
    err = capsys.readouterr().err
    assert "no runs with workload 'other.jsonl' (workloads in the store: " in err and absolute in err, err

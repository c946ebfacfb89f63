"""`specfinops loadtest`: loopback only, token timing spread, and a short real load (8 streaming clients,
spec and AR) against the live server, stored as 'loadtest' runs the FinOps capacity uses."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import pytest
from serve_live import API_KEY, shared_live, start_server, stop_server
from sqlalchemy import create_engine, text

from app.cli import main
from serving.loadtest import base_url, token_rows
from telemetry.queries import run_summaries


@pytest.mark.parametrize("url", ["http://10.0.0.5:8000", "http://example.com", "http://192.168.1.2:80/v1",
                                 "ftp://127.0.0.1:8000", "127.0.0.1:8000"])
def test_non_loopback_urls_are_refused(url):
    with pytest.raises(ValueError, match="loopback|must look like"):
        base_url(url)


def test_loopback_urls_are_normalised():
    assert base_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert base_url("http://localhost:9/v1/") == "http://localhost:9/v1"
    assert base_url("http://[::1]:8000") == "http://[::1]:8000/v1"


def test_cli_refuses_remote_url_with_a_clear_error(capsys):
    assert main(["loadtest", "--url", "http://203.0.113.7:8000", "--duration", "1", "--no-telemetry"]) == 2
    assert "loopback" in capsys.readouterr().err


def test_a_load_test_is_a_pure_http_client_it_loads_no_torch():
    """LoadSpec.validate read the temperature limit from serving.server_schemas, which imports the sampler and so
    torch: 9 s to say a server cannot be reached. The limits are in a torch-free module now."""
    code = ("import sys; from app.cli import main; "
            "rc = main(['loadtest', '--url', 'http://127.0.0.1:1', '--concurrency', '1', '--duration', '1', "
            "'--no-telemetry']); "
            "print(rc, sorted(m for m in ('torch', 'serving.sampling', 'serving.server_schemas') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "2 []", (done.stdout, done.stderr)
    assert "cannot reach http://127.0.0.1:1" in done.stderr


def test_token_rows_spread_tokens_over_chunks():
    chunks = [(10.0, 5), (20.0, 1), (35.0, 10)]
    rows = token_rows(chunks, 9)
    assert [r.position for r in rows] == list(range(9))
    per_chunk = [sum(r.emit_offset_ms == t for r in rows) for t, _ in chunks]
    assert per_chunk[0] >= 1 and per_chunk[1] >= 1 and per_chunk[2] >= per_chunk[0] >= per_chunk[1]
    assert sum(per_chunk) == 9
    assert [r.emit_offset_ms for r in rows] == sorted(r.emit_offset_ms for r in rows)
    assert len(token_rows(chunks, 2)) == 2 and token_rows([], 3) == []


@pytest.mark.slow
def test_short_load_both_modes_is_stored_as_runs(request, tmp_path, capsys):
    live = shared_live(request.config)
    db_url = f"sqlite:///{tmp_path / 'load.db'}"
    out = tmp_path / "load.json"
    rc = main(["loadtest", "--url", live.url, "--concurrency", "8", "--duration", "3", "--mode", "both",
               "--max-tokens", "8", "--workload", "code", "--api-key", API_KEY, "--db", db_url,
               "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["levels"]
    assert [(r["mode"], r["concurrency"]) for r in rows] == [("ar", 8), ("spec", 8)]
    # a progress bar per level and mode, ticking while it runs and closed at 100% with what it did
    progress = capsys.readouterr().err.replace("\r", "\n")
    for r in rows:
        assert f"{r['mode']} c=8: 100%|" in progress and f"3/3 s, {r['requests_ok']} req, " in progress
    for r in rows:
        assert r["requests_ok"] >= 8 and r["requests_error"] == 0, r
        assert r["tokens_per_s"] > 0 and r["ttft_p95_ms"] >= r["ttft_p50_ms"] > 0
        assert r["tpot_p95_ms"] is not None
    engine = create_engine(db_url)
    with engine.connect() as c:
        runs = c.execute(text("select mode, kind, concurrency, status from runs order by id")).all()
        assert [tuple(r) for r in runs] == [("ar", "loadtest", 8, "completed"), ("spec", "loadtest", 8, "completed")]
        mismatched = c.execute(text(
            "select count(*) from requests r where r.status = 'ok' and r.output_tokens != "
            "(select count(*) from token_events t where t.request_id = r.id)")).scalar_one()
        assert mismatched == 0
    summaries = run_summaries(engine)
    assert all(s.stats.tokens_per_s and s.stats.tpot_p95_ms for s in summaries)
    # the tokens/s printed are the store's (`cost`): its requests' span, not the level's clock
    stored = {s.run_id: (s.stats.tokens_per_s, s.stats.wall_s) for s in summaries}
    for r in rows:
        assert (r["tokens_per_s"], r["wall_s"]) == pytest.approx(stored[r["run_id"]], rel=1e-6), r
    # the server saw every request: recorded in its own store, none failed
    live.flush()
    with create_engine(live.db_url).connect() as c:
        errors = c.execute(text("select count(*) from requests where status = 'error'")).scalar_one()
    assert errors == 0


@pytest.mark.slow
def test_a_load_test_into_the_servers_own_store_records_each_request_once(tmp_path):
    """Server and load test on one store (the default of both commands): the load test's runs hold the
    requests, with the server's speculation counts from the usage extension and the energy its power
    samples give them (estimated here, and labelled so); the server's 'serve' runs do not hold them a
    second time. The server's key comes from the store: a client that sends the store's fingerprint (what
    the header used to carry, computable by anyone) is recorded by the server as usual."""
    import httpx

    from serving.server_setup import ServeOptions
    from serving.server_telemetry import RECORDED_IN_HEADER
    from serving.worker import EngineSpec
    from tests.test_loadtest_stub import store_fingerprint

    db_url = f"sqlite:///{tmp_path / 'shared.db'}"
    live = start_server(ServeOptions(spec=EngineSpec(dtype="bfloat16", k="4", max_batch=2, max_len=512),
                                     db=db_url, power="estimate", tdp_w=65.0))
    try:
        forged = httpx.post(live.url + "/v1/completions", json={"model": live.model, "prompt": "Hello",
                                                                "max_tokens": 3, "temperature": 0},
                            headers={RECORDED_IN_HEADER: store_fingerprint(tmp_path / 'shared.db')}, timeout=120)
        assert forged.status_code == 200, forged.text
        rc = main(["loadtest", "--url", live.url, "--concurrency", "2", "--duration", "2", "--mode", "spec",
                   "--max-tokens", "8", "--workload", "code", "--db", str(tmp_path / "shared.db"),
                   "--json", str(tmp_path / "load.json")])
        assert rc == 0
        live.flush()
        left_to_client = live.state.telemetry.num_left_to_client
    finally:
        stop_server(live)
    with create_engine(db_url).connect() as c:
        by_kind = dict(c.execute(text("select u.kind, count(r.id) from runs u left join requests r "
                                      "on r.run_id = u.id group by u.kind")).all())
        serve_ids = c.execute(text("select r.external_id from requests r join runs u on u.id = r.run_id "
                                   "where u.kind = 'serve'")).scalars().all()
        rows = c.execute(text(
            "select r.status, r.num_drafts, r.num_draft_tokens, r.num_accepted_tokens, r.energy_j, u.power_source "
            "from requests r join runs u on u.id = r.run_id where u.kind = 'loadtest'")).all()
    ok = [r for r in rows if r.status == "ok"]
    assert len(ok) >= 2 and by_kind == {"serve": 1, "loadtest": len(rows)}  # each request once
    assert serve_ids == [forged.json()["id"]]  # the forged claim did not hide the request
    assert left_to_client == len(rows)
    assert all(r.num_drafts > 0 and r.num_draft_tokens >= r.num_drafts for r in ok)  # the server's counts
    assert all(0 <= r.num_accepted_tokens <= r.num_draft_tokens for r in ok)
    assert {r.power_source for r in rows} == {"estimate"}
    assert all(r.energy_j is not None and r.energy_j > 0 for r in ok)  # the server's power, shared by window
    summaries = [s for s in run_summaries(create_engine(db_url)) if s.kind == "loadtest"]
    assert summaries and all(s.stats.energy_j and s.stats.energy_complete and s.stats.energy_estimated
                             for s in summaries)
    # waiting for the server's power samples after the level is not the level's time: the tokens/s printed
    # are the store's (they were 1-3% lower, the wait counted)
    [level] = json.loads((tmp_path / "load.json").read_text())["levels"]
    [run] = summaries
    assert level["tokens_per_s"] == pytest.approx(run.stats.tokens_per_s, rel=1e-6)


@pytest.mark.parametrize("stop", [KeyboardInterrupt, asyncio.CancelledError])
def test_a_level_stopped_by_ctrl_c_ends_its_run_cancelled(stop, tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM, which the command turns into it) during a level: the run is 'cancelled', the
    store's word for a run stopped by its user, as bench's is, not 'failed'."""
    import serving.loadtest as lt
    from telemetry.recorder import Recorder
    from telemetry.store import open_store

    async def one_model(client, wanted):
        return {"id": "m", "root": "m", "specfinops": {"backend": "torch", "dtype": "bfloat16"}}

    async def stopped(*args, **kwargs):
        raise stop()

    monkeypatch.setattr(lt, "server_model", one_model)
    monkeypatch.setattr(lt, "run_level", stopped)
    db_url = f"sqlite:///{tmp_path / 'load.db'}"
    recorder = Recorder(open_store(db_url))
    spec = lt.LoadSpec(url="http://127.0.0.1:9", levels=(2,), duration_s=1, modes=("spec",))
    with pytest.raises(stop):
        asyncio.run(lt.run_loadtest(spec, [], workload="code", recorder=recorder))
    recorder.close()
    with create_engine(db_url).connect() as c:
        assert c.execute(text("select status from runs")).scalars().all() == ["cancelled"]


def _metric_sums(url: str) -> dict[str, float]:
    """The server's /metrics, each sample name summed over its labels (the `*_created` samples left out)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for s in family.samples:
            if not s.name.endswith("_created"):
                sums[s.name] = sums.get(s.name, 0.0) + s.value
    return sums


def _metrics_grown_by_loadtest(live, db, *options: str) -> dict[str, float]:
    """A load test of the code workload against `live` with `options`, recorded into `db` (the server's store):
    what each /metrics sum grew by, once the server wrote what it had; the server stopped after, whatever happened."""
    try:
        before = _metric_sums(live.url)
        assert main(["loadtest", "--url", live.url, *options, "--workload", "code", "--db", str(db)]) == 0
        live.flush()
        after = _metric_sums(live.url)
    finally:
        stop_server(live)
    return {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}


@pytest.mark.slow
def test_a_shared_stores_failed_requests_keep_the_tokens_metrics_counts(tmp_path):
    """A decode step fails under a load test that shares the server's store: the requests of that batch end
    'error' after streaming tokens. They were stored with 0 prompt and output tokens and 0 drafts, so the store
    no longer matched the server's /metrics (docs/serving.md: its sums equal the store's, the store holds each
    request once). Now the server sends a failed stream's usage before its error event and the load test keeps
    it; throughput still counts ok requests only."""
    from serving.server_setup import ServeOptions
    from serving.worker import EngineSpec

    db_url = f"sqlite:///{tmp_path / 'shared.db'}"
    live = start_server(ServeOptions(spec=EngineSpec(dtype="bfloat16", k="4", max_batch=2, max_len=512),
                                     db=db_url, power="none"))
    engine, steps = live.state.loop_engine.engine, [0]
    real_step = engine.step

    def failing_once():
        steps[0] += 1
        if steps[0] == 1:  # the first batch: its requests streamed the token of their prefill
            raise RuntimeError("injected step failure")
        return real_step()

    engine.step = failing_once
    grew = _metrics_grown_by_loadtest(live, tmp_path / "shared.db", "--concurrency", "2", "--duration", "3",
                                      "--mode", "spec", "--max-tokens", "8")
    with create_engine(db_url).connect() as c:
        rows = c.execute(text(
            "select r.status, r.prompt_tokens, r.output_tokens, r.num_drafts, r.num_draft_tokens, "
            "r.num_accepted_tokens, (select count(*) from token_events t where t.request_id = r.id) "
            "from requests r join runs u on u.id = r.run_id where u.kind = 'loadtest'")).all()
        serve_requests = c.execute(text("select count(*) from requests r join runs u on u.id = r.run_id "
                                        "where u.kind = 'serve'")).scalar_one()
    failed = [r for r in rows if r.status == "error"]
    assert failed and all(r[2] >= 1 and r[6] == r[2] for r in failed), failed  # streamed tokens, kept
    assert serve_requests == 0 and grew["specfinops:requests_total"] == len(rows)
    total = [sum(r[i] for r in rows) for i in range(1, 6)]
    assert [grew["vllm:prompt_tokens_total"], grew["vllm:generation_tokens_total"],
            grew["vllm:spec_decode_num_drafts_total"], grew["vllm:spec_decode_num_draft_tokens_total"],
            grew["vllm:spec_decode_num_accepted_tokens_total"]] == total, (grew, rows)
    [run] = [s for s in run_summaries(create_engine(db_url)) if s.kind == "loadtest"]
    assert run.stats.output_tokens == sum(r[2] for r in rows if r.status == "ok")  # ok requests' tokens only


@pytest.mark.slow
def test_requests_the_server_rejects_before_the_engine_are_error_rows_and_only_in_rejected_total(tmp_path):
    """`serve --max-batch 1 --max-waiting 1` under 4 clients: the surplus requests get 503 overloaded before the
    engine. The server counts them in specfinops:requests_rejected_total only (not requests_total, not its store);
    the load test stores them as 'error' rows whose error names the rejection (docs/serving.md). The requests
    that reached the engine match /metrics; the level is not failed for the 503s."""
    from serving.server_setup import ServeOptions
    from serving.worker import EngineSpec

    db_url = f"sqlite:///{tmp_path / 'shared.db'}"
    live = start_server(ServeOptions(spec=EngineSpec(dtype="bfloat16", k="4", max_batch=1, max_len=512),
                                     db=db_url, power="none", max_waiting=1))
    grew = _metrics_grown_by_loadtest(live, tmp_path / "shared.db", "--concurrency", "4", "--duration", "2",
                                      "--mode", "spec", "--max-tokens", "3")
    with create_engine(db_url).connect() as c:
        rows = c.execute(text("select r.status, r.error, r.output_tokens from requests r join runs u "
                              "on u.id = r.run_id where u.kind = 'loadtest'")).all()
    rejected = [r for r in rows if r.status == "error"
                and r.error.startswith("InternalServerError: Error code: 503 - the server is overloaded")]
    engine_rows = [r for r in rows if r not in rejected]
    assert rejected and all(r.output_tokens == 0 for r in rejected), rows
    assert grew["specfinops:requests_rejected_total"] == len(rejected)
    assert grew["specfinops:requests_total"] == len(engine_rows)
    assert grew["vllm:generation_tokens_total"] == sum(r.output_tokens for r in engine_rows)


@pytest.mark.slow
def test_max_tokens_that_fit_a_one_token_prompt_but_not_the_longest_prompt_are_refused_before_a_run(request,
                                                                                                  tmp_path, capsys):
    """--max-tokens was checked against a one-token prompt only: 1000 passed a 1024-token window, then every
    request with its 100-130-token prompt was refused 400 and a failed run was left in the store. The server is
    now asked how long the workload's longest prompts are (each refused at once: nothing runs), before any store."""
    from serving.workloads import load_workload

    live = shared_live(request.config)
    db = tmp_path / "long.db"
    rc = main(["loadtest", "--url", live.url, "--concurrency", "1", "--duration", "3", "--mode", "ar",
               "--max-tokens", "1000", "--workload", "code", "--api-key", API_KEY, "--db", f"sqlite:///{db}"])
    err = capsys.readouterr().err
    assert rc == 2 and "--max-tokens 1000 cannot fit the server's context window after this workload's longest " \
                      "prompt" in err, err
    assert not db.exists()
    said = re.search(r"longest prompt \((\S+), (\d+) tokens as the server counts it\): max_model_len 1024, at most "
                     r"(\d+) output tokens fit", err)
    prompts = {p.id: p for p in load_workload("code")}
    num_prompt = len(live.state.encode_chat(prompts[said[1]].as_messages()))
    assert int(said[2]) == num_prompt and int(said[3]) == 1024 - 1 - num_prompt < 1000
    assert all(len(live.state.encode_chat(p.as_messages())) <= num_prompt for p in prompts.values())

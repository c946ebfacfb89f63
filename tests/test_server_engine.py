"""The server's engine thread on a tiny random model (no HTTP): batching, cancellation, a failing step
fails its batch and the loop keeps serving, the waiting limit; and incremental detokenization with stop
strings."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime

import pytest

from serving.drafters import NgramDrafter
from serving.engine import Engine
from serving.lookahead import FixedK
from serving.sampling import SamplingParams
from serving.server_engine import EngineLoop, Finished, Job
from serving.server_metrics import ServeMetrics
from serving.server_schemas import APIError, Checked
from serving.server_text import TextStream
from tests.tiny import tiny_model

TARGET = tiny_model(0)


def _job(loop, i: int, max_new: int, speculate: bool = True) -> Job:
    c = Checked("completion", [1 + i, 5, 7, 9], SamplingParams(max_new_tokens=max_new), speculate, True, False)
    return Job(f"job-{i}", c, time.perf_counter(), datetime.now(UTC), loop)


async def _drain(job: Job) -> tuple[list[int], Finished]:
    ids: list[int] = []
    while True:
        item = await asyncio.wait_for(job.out.get(), 60)
        if isinstance(item, Finished):
            return ids, item
        ids.extend(item)


def _engine_loop(records, max_waiting: int = 1024):
    engine = Engine(TARGET, drafter=NgramDrafter(n_max=3), policy=FixedK(3), max_batch=2, max_len=200)
    return EngineLoop(engine, lambda job, rec, others: records.append((job.mode, rec)),
                      max_waiting=max_waiting).start()


async def _full_and_held(el: EngineLoop, loop) -> tuple[list[Job], threading.Event]:
    """Two jobs fill both slots, then the engine thread is held inside its next step until the returned
    event is set: whatever is submitted meanwhile stays in the queue."""
    held, release, real_step = threading.Event(), threading.Event(), el.engine.step

    def held_step():
        if len(el.engine.running) == 2:
            held.set()
            release.wait(60)
        return real_step()

    el.engine.step = held_step
    running = [_job(loop, i, 40) for i in (0, 1)]
    for j in running:
        el.submit(j)
    assert await asyncio.to_thread(held.wait, 60)
    return running, release


def test_jobs_share_the_batch_and_records_match_what_was_sent():
    records = []

    async def main():
        loop = asyncio.get_running_loop()
        el = _engine_loop(records)
        jobs = [_job(loop, i, 12, speculate=i % 2 == 0) for i in range(5)]  # more jobs than slots: some wait
        for j in jobs:
            el.submit(j)
        out = await asyncio.gather(*(_drain(j) for j in jobs))
        el.stop()
        return out

    out = asyncio.run(main())
    assert all(fin.finish_reason in ("length", "stop") and ids for ids, fin in out)
    by_id = {rec.external_id: (mode, rec) for mode, rec in records}
    for i, (ids, fin) in enumerate(out):
        mode, rec = by_id[f"job-{i}"]
        assert mode == ("spec" if i % 2 == 0 else "ar")
        assert rec.status == "ok" and rec.output_tokens == len(ids) == len(rec.tokens) == fin.num_output
        assert mode == "spec" or rec.num_drafts == 0
    assert max(s.batch_size for _, r in records for s in r.steps) == 2


def test_a_failing_step_fails_its_batch_and_the_loop_keeps_serving():
    records = []

    async def main():
        loop = asyncio.get_running_loop()
        el = _engine_loop(records)
        real_step, calls = el.engine.step, []

        def flaky_step():
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("boom")
            return real_step()

        el.engine.step = flaky_step
        first = _job(loop, 0, 30)
        el.submit(first)
        failed = await _drain(first)
        second = _job(loop, 1, 6)
        el.submit(second)
        ok = await _drain(second)
        el.stop()
        return failed, ok

    (ids1, fin1), (ids2, fin2) = asyncio.run(main())
    assert fin1.finish_reason == "error" and "boom" in fin1.error
    assert fin2.finish_reason in ("length", "stop") and ids2
    statuses = {r.external_id: r for _, r in records}
    assert statuses["job-0"].status == "error" and "boom" in statuses["job-0"].error
    assert statuses["job-0"].output_tokens == len(statuses["job-0"].tokens) == len(ids1)
    assert statuses["job-1"].status == "ok"


def test_cancel_and_stop_record_cancelled():
    records = []

    async def main():
        loop = asyncio.get_running_loop()
        el = _engine_loop(records)
        running = _job(loop, 0, 150)
        el.submit(running)
        await asyncio.wait_for(running.out.get(), 60)  # first token: it runs
        el.cancel(running)
        ids, fin = await _drain(running)
        left = [_job(loop, i, 150) for i in (1, 2, 3)]
        for j in left:
            el.submit(j)
        el.stop()  # cancels what runs and what waits
        return fin, [await _drain(j) for j in left]

    fin, rest = asyncio.run(main())
    assert fin.finish_reason == "cancelled"
    assert all(f.finish_reason == "cancelled" for _, f in rest)
    recs = {r.external_id: r for _, r in records}
    assert len(recs) == 4 and all(r.status == "cancelled" for r in recs.values())
    assert all(r.output_tokens == len(r.tokens) for r in recs.values())
    assert recs["job-0"].output_tokens < 150


def test_a_job_cancelled_while_it_waits_leaves_the_queue_at_once():
    """Clients that gave up while queued no longer count as waiting (/health, vllm:num_requests_waiting) nor
    against --max-waiting: before, they did until a slot freed, and the next request got 503 overloaded."""
    records = []

    async def main():
        loop = asyncio.get_running_loop()
        el = _engine_loop(records, max_waiting=3)
        running, release = await _full_and_held(el, loop)
        queued = [_job(loop, i, 4) for i in (2, 3, 4)]
        for j in queued:
            el.submit(j)
        assert el.num_waiting == 3
        with pytest.raises(APIError) as full:
            el.submit(_job(loop, 9, 4))
        assert full.value.status == 503 and full.value.code == "overloaded" and full.value.retry_after_s == 1
        for j in queued:
            el.cancel(j)
        waiting_after_cancel = el.num_waiting
        late = _job(loop, 5, 4)
        el.submit(late)  # raised 503 overloaded (3 requests waiting) before
        release.set()
        out = await asyncio.gather(*(_drain(j) for j in [*running, *queued, late]))
        el.stop()
        return waiting_after_cancel, out

    waiting_after_cancel, out = asyncio.run(main())
    assert waiting_after_cancel == 0
    assert [fin.finish_reason for _, fin in out[2:5]] == ["cancelled"] * 3
    assert out[5][1].finish_reason in ("length", "stop")
    recs = {r.external_id: r for _, r in records}
    assert all(recs[f"job-{i}"].status == "cancelled" and recs[f"job-{i}"].output_tokens == 0 for i in (2, 3, 4))


def test_energy_is_shared_from_admission_and_a_request_that_never_ran_takes_none():
    """A request's energy window began at its arrival, so its time in the queue took a share of the node's energy
    from the requests running then: one cancelled while queued kept joules (37.6 J beside 91 J in an audit) that
    J/token, summed over the completed requests, lost. Now the window begins at admission; a request that never
    ran is recorded without energy, and the running ones' shares add up to the node's energy of their time."""
    from serving.server_telemetry import ServeTelemetry
    from telemetry.power import EstimatePowerSource

    telemetry = ServeTelemetry(ServeMetrics("m"), EstimatePowerSource(100.0)).start()
    records, jobs = [], {}

    def on_finish(job, rec, others):
        jobs[job.id] = job
        records.append((job.mode, rec))
        telemetry.finish(job.mode, rec, others, window=job.ran)

    async def main():
        loop = asyncio.get_running_loop()
        engine = Engine(TARGET, drafter=NgramDrafter(n_max=3), policy=FixedK(3), max_batch=2, max_len=200)
        el = EngineLoop(engine, on_finish).start()
        running, release = await _full_and_held(el, loop)
        gives_up, waits = _job(loop, 2, 4), _job(loop, 3, 4)
        el.submit(gives_up)
        el.submit(waits)
        el.cancel(gives_up)
        released = datetime.now(UTC)
        release.set()
        await asyncio.gather(*(_drain(j) for j in [*running, gives_up, waits]))
        el.stop()
        return released

    try:
        released = asyncio.run(main())
        assert telemetry.flush(30)
    finally:
        telemetry.close()
    recs = {r.external_id: r for _, r in records}
    assert recs["job-2"].status == "cancelled" and jobs["job-2"].ran is None and recs["job-2"].energy_j is None
    waited = jobs["job-3"]
    assert waited.wall_start < released <= waited.ran[0]  # its window opens when it took a slot, not on arrival
    ran = sorted(jobs[f"job-{i}"].ran for i in (0, 1, 3))
    assert all(recs[f"job-{i}"].energy_j is not None for i in (0, 1, 3))
    # 100 W over the time any of them ran: all of it theirs (none to the request that never ran), none twice
    busy_s, reach = 0.0, ran[0][0]
    for start, end in ran:
        busy_s += max((end - max(start, reach)).total_seconds(), 0.0)
        reach = max(reach, end)
    assert sum(recs[f"job-{i}"].energy_j for i in (0, 1, 3)) == pytest.approx(100.0 * busy_s, rel=1e-6)


def test_the_usage_says_how_long_a_request_queued_before_it_ran():
    """A load test shared the server's energy over its requests' send-to-end windows, queueing included, while
    the server counts a request's energy from its admission. The server now says each request's wait, arrival
    to admission (`queue_ms` in the usage's "specfinops" extension), so the load test's window starts there too;
    a request that never ran says none, and the OpenAI fields are unchanged."""
    from serving.server import _usage

    records: list = []

    async def main():
        loop = asyncio.get_running_loop()
        el = _engine_loop(records)
        running, release = await _full_and_held(el, loop)
        gives_up, waits = _job(loop, 2, 4), _job(loop, 3, 4)
        el.submit(gives_up)
        el.submit(waits)
        el.cancel(gives_up)
        await asyncio.sleep(0.05)  # queued behind the held batch
        release.set()
        done = await asyncio.gather(*(_drain(j) for j in [*running, gives_up, waits]))
        el.stop()
        return [fin for _, fin in done], waits

    fins, waits = asyncio.run(main())
    assert all(f.queue_ms is not None and f.queue_ms >= 0 for f in fins[:2]) and fins[2].queue_ms is None
    assert fins[3].queue_ms == pytest.approx((waits.admitted_at - waits.wall_start).total_seconds() * 1000.0)
    assert fins[3].queue_ms >= 50.0
    usage = _usage(fins[3])
    assert usage["specfinops"]["queue_ms"] == pytest.approx(fins[3].queue_ms, abs=1e-3)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert "queue_ms" not in _usage(fins[2])["specfinops"]


def _hold_admissions(el):
    """Make the engine thread stop inside its first admission (`engine.add`, the prefill) until `release` is set:
    (adding, release), `adding` set once it is there."""
    adding, release, real_add = threading.Event(), threading.Event(), el.engine.add

    def held_add(*args, **kwargs):
        adding.set()
        release.wait(60)
        return real_add(*args, **kwargs)

    el.engine.add = held_add
    return adding, release


def test_a_burst_fills_the_free_slots_before_the_waiting_limit_counts():
    """--max-waiting bounds the requests beyond the free slots: a job the engine thread has not yet moved into
    a free slot does not count. Before, a burst of 4 at an idle server (batch 2, max waiting 2) got a 503 for
    the fourth whenever it came before the engine thread had admitted the first ones."""
    records = []

    async def main():
        loop = asyncio.get_running_loop()
        el = _engine_loop(records, max_waiting=2)
        adding, release = _hold_admissions(el)
        jobs = [_job(loop, i, 3) for i in range(4)]
        el.submit(jobs[0])
        assert await asyncio.to_thread(adding.wait, 60)
        for j in jobs[1:]:
            el.submit(j)  # one takes the free slot, two wait: within the limit (the fourth got 503 before)
        with pytest.raises(APIError) as full:  # a fifth would be the third beyond the slots
            el.submit(_job(loop, 4, 3))
        assert full.value.status == 503 and full.value.code == "overloaded"
        release.set()
        out = await asyncio.gather(*(_drain(j) for j in jobs))
        el.stop()
        return out

    out = asyncio.run(main())
    assert all(fin.finish_reason in ("length", "stop") and ids for ids, fin in out)


def test_a_request_being_admitted_counts_as_running():
    """A job taken from the queue is in neither the queue nor `engine.running` while `engine.add` prefills it:
    /health and vllm:num_requests_running said 0 running, 0 waiting for a request being prefilled (seconds for a
    long prompt), and the shutdown's "still in flight" count missed it. It counts as running, as vLLM counts
    prefilling sequences."""
    records = []

    async def main():
        loop = asyncio.get_running_loop()
        el = _engine_loop(records)
        metrics = ServeMetrics("m", running=lambda: el.num_running, waiting=lambda: el.num_waiting)
        adding, release = _hold_admissions(el)
        jobs = [_job(loop, i, 3) for i in range(3)]
        el.submit(jobs[0])
        assert await asyncio.to_thread(adding.wait, 60)
        el.submit(jobs[1])
        el.submit(jobs[2])
        counts = el.num_running, el.num_waiting
        gauge = {name: metrics.registry.get_sample_value(name, {"model_name": "m", "engine": "0"})
                 for name in ("vllm:num_requests_running", "vllm:num_requests_waiting")}
        release.set()
        await asyncio.gather(*(_drain(j) for j in jobs))
        after = el.num_running, el.num_waiting
        el.stop()
        return counts, gauge, after

    counts, gauge, after = asyncio.run(main())
    assert counts == (1, 2)  # was (0, 2): the request being prefilled was nowhere
    assert gauge == {"vllm:num_requests_running": 1, "vllm:num_requests_waiting": 2}
    assert after == (0, 0)


def test_an_engine_thread_crashing_while_it_admits_answers_every_job_and_counts_none_running(monkeypatch):
    """The engine thread failing in `_admit` outside its guard around `engine.add` left the jobs taken from the
    queue in neither the queue nor the admitted jobs: their clients waited forever, and num_running kept
    counting their slots (a SIGTERM drain then waited its whole --drain-s). Every job, wherever the crash left
    it, ends 'error' with its client answered, and nothing counts as running or waiting."""
    import serving.server_engine as se

    records, real_record, calls = [], se._record, []

    def record_failing_once(job):  # the second job's admission fails before it is among the admitted jobs
        calls.append(job.id)
        if len(calls) == 2:
            raise RuntimeError("bug in admission")
        return real_record(job)

    monkeypatch.setattr(se, "_record", record_failing_once)

    async def main():
        loop = asyncio.get_running_loop()
        el = _engine_loop(records)
        jobs = [_job(loop, i, 40) for i in range(3)]
        for j in jobs:
            el.submit(j)
        out = await asyncio.wait_for(asyncio.gather(*(_drain(j) for j in jobs)), 30)
        counts = el.num_running, el.num_waiting, el.alive
        el.stop()
        return out, counts

    out, counts = asyncio.run(main())
    assert [fin.finish_reason for _, fin in out] == ["error"] * 3, out
    assert all("engine thread failed: RuntimeError: bug in admission" in fin.error for _, fin in out), out
    assert counts == (0, 0, False)
    assert sorted(r.external_id for _, r in records) == ["job-0", "job-1", "job-2"]
    assert all(r.status == "error" for _, r in records)


def test_a_request_cancelled_while_queued_ends_when_the_client_left():
    """A request cancelled while it waited was recorded as ending when the engine thread got to the cancel (after
    the step it was in: 5045 ms in an audit where the client left after 3 s), not when the client left."""
    records = []

    async def main():
        loop = asyncio.get_running_loop()
        el = _engine_loop(records)
        running, release = await _full_and_held(el, loop)
        queued = _job(loop, 2, 4)
        el.submit(queued)
        before = time.perf_counter()
        el.cancel(queued)
        after = time.perf_counter()
        await asyncio.sleep(0.05)  # the engine thread is still in its step: it gets to the cancel later
        release.set()
        for j in [*running, queued]:
            await _drain(j)
        el.stop()
        return queued, before, after

    queued, before, after = asyncio.run(main())
    rec = {r.external_id: r for _, r in records}["job-2"]
    assert rec.status == "cancelled" and rec.ttft_ms is None
    assert (before - queued.t_start) * 1000.0 <= rec.e2e_ms <= (after - queued.t_start) * 1000.0


def test_prompts_never_prefilled_are_not_counted_as_prefilled():
    """A request cancelled while it waited keeps its prompt length in the store (the column is the prompt's
    size), but vllm:prompt_tokens_total ("tokens prefilled") counts only prompts that reached the engine."""
    records = []

    async def main():
        loop = asyncio.get_running_loop()
        el = _engine_loop(records)
        running, release = await _full_and_held(el, loop)
        queued = _job(loop, 2, 4)
        el.submit(queued)
        el.cancel(queued)
        release.set()
        for j in [*running, queued]:
            await _drain(j)
        el.stop()

    asyncio.run(main())
    recs = {r.external_id: r for _, r in records}
    assert recs["job-2"].status == "cancelled" and recs["job-2"].prompt_tokens == 4  # the prompt's length
    metrics = ServeMetrics("m")
    for mode, rec in records:
        metrics.observe_request(mode, rec)
    prefilled = metrics.registry.get_sample_value("vllm:prompt_tokens_total", {"model_name": "m", "engine": "0"})
    assert prefilled == recs["job-0"].prompt_tokens + recs["job-1"].prompt_tokens == 8


def test_text_stream_holds_back_stop_prefixes_and_partial_characters():
    vocab = {1: "Hello", 2: " wor", 3: "ld", 4: " EN", 5: "D here", 6: "\ufffd", 7: "é"}

    def decode(ids):
        text = "".join(vocab[i] for i in ids)
        return text.replace("\ufffdé", "é")  # a character split over two tokens

    ts = TextStream(decode, ("END",))
    sent = [ts.add([1]), ts.add([2]), ts.add([3]), ts.add([4])]
    assert "".join(sent) == "Hello world " and sent[-1] == " "  # "EN" may grow into "END": held back
    assert ts.add([5]) == "" and ts.flush() == ""  # it did: cut there
    assert ts.final([1, 2, 3, 4, 5]) == "Hello world "
    ts2 = TextStream(decode)
    assert ts2.add([1, 6]) == "Hello" and ts2.add([7]) == "é"


def test_the_first_token_goes_out_at_prefill_not_after_the_next_step():
    """The token sampled at prefill reached the client only after the batch's next decode step: every client's
    TTFT held one step too many, and its first inter-token gap was ~0 (a load test's TPOT and ITL were off)."""
    records = []

    async def main():
        loop = asyncio.get_running_loop()
        el = _engine_loop(records)
        stepping, release, real_step = threading.Event(), threading.Event(), el.engine.step

        def held_step():
            stepping.set()
            release.wait(60)
            return real_step()

        el.engine.step = held_step
        job = _job(loop, 0, 8)
        el.submit(job)
        assert await asyncio.to_thread(stepping.wait, 60)  # the engine thread sits in the first decode step
        try:
            first = await asyncio.wait_for(job.out.get(), 10)  # ... and the first token is already here
        finally:
            release.set()
        rest, fin = await _drain(job)
        el.stop()
        return first, rest, fin

    first, rest, fin = asyncio.run(main())
    assert isinstance(first, list) and len(first) == 1
    assert fin.num_output == 1 + len(rest)


@pytest.mark.parametrize("reason", ["error", "cancelled"])
def test_a_stream_that_fails_sends_its_usage_before_the_error_event(reason):
    """A streamed request that failed, or that the server cancelled, ended with the error event alone: a client
    asking for usage (a load test recording into the server's store) never learnt the tokens the server had made
    and counted in /metrics. Its usage chunk, with the speculation counts, now comes before the error event."""
    import json
    from types import SimpleNamespace

    from serving.server import _stream

    async def events(include_usage: bool) -> list:
        loop = asyncio.get_running_loop()
        c = Checked("chat", [1, 5, 7, 9], SamplingParams(max_new_tokens=8), True, True, include_usage)
        job = Job("job-0", c, 0.0, datetime.now(UTC), loop)
        for item in ([3, 4], [5], Finished(reason, 4, 3, "decode step failed: boom", 1, 3, 2)):
            job.out.put_nowait(item)
        state = SimpleNamespace(decode=lambda ids: "x" * len(ids), model_id="m", loop_engine=None)
        return [line[6:] async for line in _stream(job, state) for line in line.splitlines() if line]

    with_usage = asyncio.run(events(True))
    assert with_usage[-1] == "[DONE]" and "error" in json.loads(with_usage[-2]), with_usage
    usage = json.loads(with_usage[-3])
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7,
        "specfinops": {"num_drafts": 1, "num_draft_tokens": 3, "num_accepted_tokens": 2}}, with_usage
    without = asyncio.run(events(False))  # none asked for: none sent, as for a stream that ends well
    assert without[-1] == "[DONE]" and "error" in json.loads(without[-2])
    assert not any('"usage"' in e for e in without), without


def test_vllm_counters_count_a_cancelled_request_and_the_ok_series_equal_the_stores_figures(sqlite_url):
    """A stream its client cut, with drafts: the vllm: counters count its work, as vLLM's count aborted requests
    (15 drafted, 3 accepted: 20%, where the store's figures read 11 and 3: 27.3%), and the server_metrics docstring
    claimed /metrics agreed with the store. The specfinops: twins split the counts by status: their status="ok"
    series are what `queries.mode_summaries` (the dashboard, cost, the reports) gives per mode."""
    import random
    from dataclasses import replace

    from telemetry.queries import mode_summaries
    from telemetry.recorder import Recorder
    from telemetry.store import open_store
    from tests.recorder_child import run_info, synthetic_request

    rng = random.Random(3)
    spec_ok, spec_cut = synthetic_request(rng, 9), replace(synthetic_request(rng, 7), status="cancelled")
    ar_ok = replace(synthetic_request(rng, 5), num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0, steps=[])
    assert spec_cut.num_draft_tokens > 0
    engine = open_store(sqlite_url)
    metrics = ServeMetrics("m")
    with Recorder(engine) as recorder:
        runs = {mode: recorder.start_run(run_info(mode)) for mode in ("spec", "ar")}
        for mode, rec in (("spec", spec_ok), ("ar", ar_ok), ("spec", spec_cut)):
            recorder.record_request(runs[mode], rec)
            metrics.observe_request(mode, rec)
    summaries = {m.mode: m.stats for m in mode_summaries(engine)}
    engine.dispose()

    def value(name: str, **labels) -> float | None:
        return metrics.registry.get_sample_value(name, {"model_name": "m", "engine": "0", **labels})

    spec = summaries["spec"]
    for vllm_name, ours, attr in (("drafts", "drafts", "num_drafts"),
                                  ("draft_tokens", "draft_tokens", "num_draft_tokens"),
                                  ("accepted_tokens", "accepted_tokens", "num_accepted_tokens")):
        everything = getattr(spec_ok, attr) + getattr(spec_cut, attr)
        assert value(f"vllm:spec_decode_num_{vllm_name}_total") == everything  # vLLM's meaning: all work done
        assert value(f"specfinops:spec_decode_num_{ours}_total", status="ok") == getattr(spec, attr)
        assert value(f"specfinops:spec_decode_num_{ours}_total", status="cancelled") == getattr(spec_cut, attr)
    ok_rate = (value("specfinops:spec_decode_num_accepted_tokens_total", status="ok")
               / value("specfinops:spec_decode_num_draft_tokens_total", status="ok"))
    assert ok_rate == spec.acceptance_rate
    assert value("vllm:generation_tokens_total") == 9 + 5 + 7
    for mode, stats in summaries.items():
        assert value("specfinops:generation_tokens_total", status="ok", mode=mode) == stats.output_tokens
    assert value("specfinops:generation_tokens_total", status="cancelled", mode="spec") == 7

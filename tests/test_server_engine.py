"""The server's engine thread on a tiny random model (no HTTP): batching, cancellation, a failing step
fails its batch and the loop keeps serving; and incremental detokenization with stop strings."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from serving.drafters import NgramDrafter
from serving.engine import Engine
from serving.lookahead import FixedK
from serving.sampling import SamplingParams
from serving.server_engine import EngineLoop, Finished, Job
from serving.server_schemas import Checked
from serving.server_text import TextStream
from tests.tiny import tiny_model

TARGET = tiny_model(0)


def _job(loop, i: int, max_new: int, speculate: bool = True) -> Job:
    c = Checked("completion", [1 + i, 5, 7, 9], SamplingParams(max_new_tokens=max_new), speculate, True, False)
    return Job(f"job-{i}", c, 0.0, datetime.now(UTC), loop)


async def _drain(job: Job) -> tuple[list[int], Finished]:
    ids: list[int] = []
    while True:
        item = await asyncio.wait_for(job.out.get(), 60)
        if isinstance(item, Finished):
            return ids, item
        ids.extend(item)


def _engine_loop(records):
    engine = Engine(TARGET, drafter=NgramDrafter(n_max=3), policy=FixedK(3), max_batch=2, max_len=200)
    return EngineLoop(engine, lambda job, rec, others: records.append((job.mode, rec))).start()


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

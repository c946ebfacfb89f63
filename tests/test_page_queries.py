"""Dashboard page queries (app/dashboard/page_queries.py) on stores shaped as the bench records them.

The hand-computed checks of every page query on a small store are in test_dashboard_apptest.py
(test_page_queries_on_both_stores); here: how the ITL and along-the-answer samples choose requests.
"""

from __future__ import annotations

import pytest
from sqlalchemy import literal, select, text
from sqlalchemy.orm import Session
from synthetic import Req, make_run, spec_req

from app.dashboard import page_queries as pq
from telemetry.queries import Filters
from telemetry.store import open_store

TURNS = 400  # `bench --mode both` at concurrency 1: AR and spec take turns of 4 prompts, one run per turn
TURN_PROMPTS = 4


def _interleaved_store(url: str):
    """TURNS runs alternating AR, spec, AR, ... of 4 requests each, so request ids come in blocks of 4
    per mode (AR 1-4, spec 5-8, ...). AR requests emit 9 tokens (8 gaps). Spec prompts alternate between
    two kinds, as a workload whose domains take turns: 9 tokens in 2 steps accepting 3 each (acceptance
    rate 6 / 8), and 9 tokens in 8 steps accepting none (0 / 32)."""
    engine = open_store(url)
    easy, hard = spec_req(9, k=4, accepted=6, ttft_ms=50, e2e_ms=250), spec_req(9, k=4, accepted=0, ttft_ms=50,
                                                                               e2e_ms=450)
    with Session(engine) as s:
        for turn in range(TURNS):
            if turn % 2 == 0:
                make_run(s, "ar", requests=[Req(output_tokens=9, ttft_ms=50, e2e_ms=450)] * TURN_PROMPTS,
                         with_events=True)
            else:
                make_run(s, "spec", requests=[easy, hard] * (TURN_PROMPTS // 2), with_events=True)
        s.commit()
    return engine


def test_samples_keep_each_mode_and_kind_of_request_in_proportion_on_interleaved_turns(db_url):
    """ITL with a stride of 8: `id % 8 == 0` kept only ids 8, 16, ...: all in spec's turns, so the sample had
    no AR emissions at all and the Latency page showed AR's ITL as '—'. Along the answer with a stride of 2
    or 4 it kept the same slot of every spec turn: only the 'hard' prompts. The hash of the id keeps about
    1 in n of each mode's requests and of each kind's."""
    engine = _interleaved_store(db_url)
    f = Filters()
    exact = pq.itl_histogram(engine, f)
    assert exact.stride == 1
    true = exact.frame.groupby("mode")["count"].sum().to_dict()
    assert true == {"ar": TURNS // 2 * TURN_PROMPTS * 8, "spec": TURNS // 2 * (TURN_PROMPTS // 2) * (2 + 8)}
    sampled = pq.itl_histogram(engine, f, max_tokens=exact.total_tokens // 8 + 1)
    assert sampled.stride == 8
    got = sampled.frame.groupby("mode")["count"].sum().to_dict()
    assert set(got) == {"ar", "spec"}
    total_true, total_got = sum(true.values()), sum(got.values())
    for mode in ("ar", "spec"):
        assert got[mode] / total_got == pytest.approx(true[mode] / total_true, abs=0.04), (mode, got, true)
    assert total_got == pytest.approx(total_true / 8, rel=0.1)  # about 1 in 8 requests
    # the same sample every time: the page caches by filters, a rerun must not move the figures
    assert pq.itl_histogram(engine, f, max_tokens=exact.total_tokens // 8 + 1).frame.equals(sampled.frame)

    spans = pq.acceptance_along_answer(engine, f, width=4)
    assert spans.stride == 1 and spans.total_drafts == TURNS // 2 * (TURN_PROMPTS // 2) * (2 + 8)
    true_rate = spans.frame["accepted"].sum() / spans.frame["drafted"].sum()
    assert true_rate == pytest.approx(12 / 80)
    for stride in (2, 4):
        sampled = pq.acceptance_along_answer(engine, f, width=4, max_drafts=spans.total_drafts // stride)
        assert sampled.stride == stride
        frame = sampled.frame
        assert frame["steps"].sum() == pytest.approx(spans.total_drafts / stride, rel=0.1)
        assert frame["accepted"].sum() / frame["drafted"].sum() == pytest.approx(true_rate, abs=0.02), stride


@pytest.mark.parametrize("request_id", [1, 7, 2**31 - 1, 2**31, 2**32 + 5, 2**53 + 3, 2**63 - 1])
def test_request_hash_is_exact_and_does_not_overflow(db_url, request_id):
    """The same integer on both stores for ids up to bigint's maximum: SQLite turns an overflowing product
    into a float (a different sample), PostgreSQL raises 'bigint out of range'."""
    engine = open_store(db_url)
    with engine.connect() as c:
        got = c.scalar(select(pq.request_hash(literal(request_id))))
    assert isinstance(got, int) and got == (request_id % 2**31) * 2654435761 % 2**32


def _sqlite_plans(engine, call) -> list[str]:
    """EXPLAIN QUERY PLAN of every statement `call()` runs on a SQLite engine, one string per statement."""
    from sqlalchemy import event

    seen: list[tuple[str, object]] = []

    def capture(_conn, _cursor, statement, parameters, _context, _many):
        if not statement.startswith(("PRAGMA", "EXPLAIN")):
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        call()
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    with engine.connect() as c:
        return [" | ".join(r[3] for r in c.exec_driver_sql(f"EXPLAIN QUERY PLAN {s}", p)) for s, p in seen]


def test_step_queries_read_steps_from_the_covering_index(sqlite_url):
    """Acceptance by position, by domain and along the answer read steps through
    ix_steps_request_id_step_index alone (migration 0005): no table row per step, and the along-the-answer
    window needs no sort of each request's steps. Before, each step cost a lookup in the table (3.7 s on
    8.3M steps) and the window sorted them."""
    from telemetry import queries

    engine = _interleaved_store(sqlite_url)
    f = Filters()
    for name, call in (
        ("acceptance_by_position", lambda: pq.acceptance_by_position(engine, f)),
        ("acceptance_by_domain", lambda: queries.acceptance_by_domain(engine, f)),
        ("acceptance_along_answer", lambda: pq.acceptance_along_answer(engine, f)),
        ("sampled acceptance_along_answer", lambda: pq.acceptance_along_answer(engine, f, max_drafts=100)),
    ):
        on_steps = [p for p in _sqlite_plans(engine, call) if " steps " in f"{p} "]
        assert on_steps, name
        for plan in on_steps:
            assert "USING COVERING INDEX ix_steps_request_id_step_index" in plan, (name, plan)
            assert "RIGHT PART OF ORDER BY" not in plan, (name, plan)


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_latency_percentiles_are_the_overviews_exact_figures(db_url):
    """The Latency page read its percentiles off 0.1 ms bucket midpoints: AR TPOT p50 2654.0 where the Overview,
    the Runs page and bench said 2653.9. They are now the values the Overview interpolates, read from only the
    buckets that hold the ranks needed; a rank in a bucket shared with other values is found within it."""
    import random

    from telemetry import queries

    rng = random.Random(7)
    engine = open_store(db_url)
    with Session(engine) as s:
        for mode in ("ar", "spec"):
            reqs = []
            for i in range(41):
                ttft = round(rng.uniform(50, 400), 3)
                tpot = rng.choice([30.0123, 30.0377, 30.0611]) if i % 3 == 0 else rng.uniform(10, 60)
                e2e = ttft + 32 * tpot
                reqs.append(Req(33, ttft_ms=ttft, e2e_ms=e2e, start_s=i * 0.5) if mode == "ar"
                            else spec_req(33, 4, 20, ttft_ms=ttft, e2e_ms=e2e, start_s=i * 0.5))
            reqs.append(Req(33, ttft_ms=5.0, e2e_ms=9.0, status="error"))  # not ok: in neither figure
            make_run(s, mode, requests=reqs)
        s.commit()
    f = Filters()
    got = pq.latency_percentiles(engine, f, pq.latency_histograms(engine, f), qs=(50, 95, 99))
    pooled = {m.mode: m.stats for m in queries.mode_summaries(engine, f)}
    for mode, stats in pooled.items():
        assert got["ttft"][mode][50] == pytest.approx(stats.ttft_p50_ms, abs=1e-9)
        assert got["ttft"][mode][95] == pytest.approx(stats.ttft_p95_ms, abs=1e-9)
        assert got["tpot"][mode][50] == pytest.approx(stats.tpot_p50_ms, abs=1e-9)
        assert got["tpot"][mode][95] == pytest.approx(stats.tpot_p95_ms, abs=1e-9)
    # p99 by hand, numpy's linear rule over the ok requests' TPOT
    with engine.connect() as c:
        rows = c.execute(text("select r.ttft_ms, r.e2e_ms, r.output_tokens from requests r join runs u "
                              "on u.id = r.run_id where u.mode = 'ar' and r.status = 'ok'")).all()
    tpots = sorted((e2e - ttft) / (out - 1) for ttft, e2e, out in rows)
    pos = (len(tpots) - 1) * 0.99
    lo = int(pos)
    assert got["tpot"]["ar"][99] == pytest.approx(tpots[lo] + (tpots[lo + 1] - tpots[lo]) * (pos - lo), abs=1e-9)
    engine.dispose()

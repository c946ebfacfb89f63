"""SQL aggregations (telemetry/queries.py) on synthetic stores, SQLite and PostgreSQL, against hand computations.

The store (see `_fill`):
  run A  ar,   code, node-a, cpu, power 'estimate'
         r1 33 tokens ttft 100 e2e  900 at 0.0 s  50 J   TPOT 800/32  = 25
         r2 33 tokens ttft 200 e2e 1800 at 1.0 s  50 J   TPOT 1600/32 = 50
         r3 error (no times)          at 2.0 s
         r4  1 token  ttft  80 e2e   80 at 0.5 s  no J   (no TPOT)
         wall 0 -> 2.8 s, 67 tokens
  run B  spec, code, node-a, cpu, power 'nvml', K=4
         r1 33 tokens, 24 accepted (8 drafts, 32 drafted), code, ttft 100 e2e 500 at 0.0 s, 30 J  TPOT 12.5
         r2 17 tokens, 10 accepted (6 drafts, 24 drafted), chat, ttft 100 e2e 420 at 0.2 s, 20 J  TPOT 20
         wall 0 -> 0.62 s, 50 tokens
  run C  ar,   chat, node-b, one day later: 11 tokens ttft 50 e2e 550 at 0 s  TPOT 50, wall 0.55 s
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from synthetic import BASE_TIME, Req, make_run, spec_req

from telemetry.costing import costs, project_from_store, run_cost
from telemetry.db import Request, Step, TokenEvent
from telemetry.finops import HOURS_PER_YEAR
from telemetry.queries import (
    Filters,
    acceptance_by_domain,
    config_summaries,
    mode_summaries,
    percentile,
    run_summaries,
    speedups,
)
from telemetry.store import open_store

A_TPS = 67 / 2.8
B_TPS = 50 / 0.62


def _fill(url: str) -> tuple:
    engine = open_store(url)
    with Session(engine) as s:
        a = make_run(
            s,
            "ar",
            power_source="estimate",
            with_events=True,
            requests=[
                Req(33, ttft_ms=100, e2e_ms=900, start_s=0.0, energy_j=50.0),
                Req(33, ttft_ms=200, e2e_ms=1800, start_s=1.0, energy_j=50.0),
                Req(0, ttft_ms=None, e2e_ms=None, start_s=2.0, status="error"),
                Req(1, ttft_ms=80, e2e_ms=80, start_s=0.5),
            ],
        )
        b = make_run(
            s,
            "spec",
            power_source="nvml",
            with_events=True,
            requests=[
                spec_req(33, 4, 24, ttft_ms=100, e2e_ms=500, start_s=0.0, energy_j=30.0),
                spec_req(17, 4, 10, ttft_ms=100, e2e_ms=420, start_s=0.2, energy_j=20.0, domain="chat"),
            ],
        )
        c = make_run(
            s,
            "ar",
            workload="chat",
            node_id="node-b",
            started_at=BASE_TIME + timedelta(days=1),
            requests=[Req(11, ttft_ms=50, e2e_ms=550, domain="chat")],
        )
        s.commit()
        ids = a.id, b.id, c.id
    return engine, ids


@pytest.fixture
def store(db_url):
    return _fill(db_url)


def test_percentile_interpolates_like_numpy():
    assert percentile([80, 100, 200], 95) == pytest.approx(190.0)
    assert percentile([25, 50], 50) == pytest.approx(37.5)
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match="q"):
        percentile([1.0], 101)


def test_synthetic_events_agree_with_request_counts(sqlite_url):
    engine, (a, b, _) = _fill(sqlite_url)
    with Session(engine) as s:
        for req in s.scalars(select(Request).where(Request.status == "ok", Request.run_id.in_((a, b)))):
            n_tokens = s.scalar(select(func.count()).where(TokenEvent.request_id == req.id))
            accepted = s.scalar(
                select(func.coalesce(func.sum(Step.accepted), 0)).where(Step.request_id == req.id)
            )
            assert n_tokens == req.output_tokens
            assert accepted == req.num_accepted_tokens


def test_run_summaries_hand_computed(store):
    engine, (a, b, c) = store
    runs = {r.run_id: r for r in run_summaries(engine)}
    assert set(runs) == {a, b, c}

    ra = runs[a]
    assert (ra.mode, ra.drafter, ra.k_policy, ra.device) == ("ar", None, "none", "cpu (2 cores)")
    st = ra.stats
    assert (st.num_requests_ok, st.num_requests_failed, st.output_tokens) == (3, 1, 67)
    assert st.wall_s == pytest.approx(2.8)
    assert st.tokens_per_s == pytest.approx(A_TPS)
    assert st.acceptance_rate is None and st.mean_acceptance_length is None  # AR drafts nothing
    assert st.ttft_p50_ms == pytest.approx(100.0) and st.ttft_p95_ms == pytest.approx(190.0)
    assert st.tpot_p50_ms == pytest.approx(37.5) and st.tpot_p95_ms == pytest.approx(48.75)
    assert st.energy_j == pytest.approx(100.0) and not st.energy_complete
    assert st.j_per_token == pytest.approx(100 / 66)  # over the requests that have energy
    assert st.energy_estimated

    sb = runs[b].stats
    assert (runs[b].mode, runs[b].k_policy) == ("spec", "fixed:4")
    assert (sb.num_drafts, sb.num_draft_tokens, sb.num_accepted_tokens) == (14, 56, 34)
    assert sb.acceptance_rate == pytest.approx(34 / 56)
    assert sb.mean_acceptance_length == pytest.approx(1 + 34 / 14)
    assert sb.wall_s == pytest.approx(0.62)
    assert sb.tokens_per_s == pytest.approx(B_TPS)
    assert sb.tpot_p95_ms == pytest.approx(12.5 + 7.5 * 0.95)
    assert sb.energy_j == pytest.approx(50.0) and sb.energy_complete and not sb.energy_estimated
    assert sb.j_per_token == pytest.approx(1.0)

    sc = runs[c].stats
    assert sc.tokens_per_s == pytest.approx(11 / 0.55)
    assert sc.energy_j is None and sc.j_per_token is None  # unmeasured is None, never 0


def test_filters_select_runs_and_requests(store):
    engine, (a, b, c) = store
    assert [r.run_id for r in run_summaries(engine, Filters(workload="code"))] == [a, b]
    assert [r.run_id for r in run_summaries(engine, Filters(node_id="node-b"))] == [c]
    assert [r.run_id for r in run_summaries(engine, Filters(mode="spec"))] == [b]
    assert [r.run_id for r in run_summaries(engine, Filters(run_ids=(a, c)))] == [a, c]
    assert [r.run_id for r in run_summaries(engine, Filters(since=BASE_TIME + timedelta(hours=12)))] == [c]
    assert [r.run_id for r in run_summaries(engine, Filters(until=BASE_TIME + timedelta(hours=12)))] == [a, b]
    chat = {r.run_id: r.stats for r in run_summaries(engine, Filters(domain="chat"))}
    assert set(chat) == {b, c} and chat[b].output_tokens == 17
    assert run_summaries(engine, Filters(target="no/such-model")) == []


def test_domain_filter_counts_only_the_domains_own_time(sqlite_url):
    """A run that alternates domains one request at a time: a domain's tokens/s and cost are over the time
    its own requests ran (2 s of chat), not the span from its first to its last request (3 s)."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        run = make_run(s, "ar", requests=[
            Req(20, ttft_ms=50, e2e_ms=1000, start_s=0.0, domain="code"),
            Req(10, ttft_ms=50, e2e_ms=1000, start_s=1.0, domain="chat"),
            Req(20, ttft_ms=50, e2e_ms=1000, start_s=2.0, domain="code"),
            Req(10, ttft_ms=50, e2e_ms=1000, start_s=3.0, domain="chat"),
        ])
        s.commit()
        run_id = run.id
    everything = run_summaries(engine)[0].stats
    assert everything.wall_s == pytest.approx(4.0) and everything.tokens_per_s == pytest.approx(60 / 4.0)
    chat = run_summaries(engine, Filters(domain="chat"))[0].stats
    assert (chat.output_tokens, chat.wall_s) == (20, pytest.approx(2.0))
    assert chat.tokens_per_s == pytest.approx(10.0)
    code = mode_summaries(engine, Filters(domain="code"))[0].stats
    assert code.wall_s == pytest.approx(2.0) and code.tokens_per_s == pytest.approx(20.0)
    # overlapping requests count their shared time once; a run wholly of the domain is the run's own span, idle
    # time included (1.5 s to 3 s), as its unfiltered figure: its only domain runs at its pace
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(10, ttft_ms=50, e2e_ms=1000, start_s=0.0, domain="chat"),
                                    Req(10, ttft_ms=50, e2e_ms=1000, start_s=0.5, domain="chat"),
                                    Req(10, ttft_ms=50, e2e_ms=500, start_s=3.0, domain="chat")])
        s.commit()
    walls = {r.run_id: r.stats.wall_s for r in run_summaries(engine, Filters(domain="chat"))}
    assert walls[run_id] == pytest.approx(2.0) and walls[run_id + 1] == pytest.approx(3.5)
    assert run_summaries(engine)[1].stats.wall_s == pytest.approx(3.5)


def test_filters_validate():
    with pytest.raises(ValueError, match="mode"):
        Filters(mode="both")
    with pytest.raises(ValueError, match="since"):
        Filters(since=BASE_TIME, until=BASE_TIME)


def test_mode_summaries_pool_runs(store):
    engine, (a, b, c) = store
    modes = {m.mode: m for m in mode_summaries(engine)}
    assert list(modes) == ["spec", "ar"]
    ar = modes["ar"]
    assert ar.run_ids == (a, c) and ar.num_runs == 2
    assert ar.stats.output_tokens == 78
    assert ar.stats.wall_s == pytest.approx(2.8 + 0.55)
    assert ar.stats.tokens_per_s == pytest.approx(78 / 3.35)
    assert ar.stats.tpot_p50_ms == pytest.approx(50.0)  # TPOTs 25, 50, 50
    assert ar.stats.ttft_p50_ms == pytest.approx(90.0)  # TTFTs 50, 80, 100, 200
    assert ar.stats.energy_estimated
    assert modes["spec"].stats.acceptance_rate == pytest.approx(34 / 56)
    assert [m.mode for m in mode_summaries(engine, Filters(mode="ar"))] == ["ar"]


def test_a_pooled_figure_is_an_estimate_only_where_estimated_energy_is_in_it(sqlite_url):
    """A metered run pooled with an estimate-power run whose requests have no energy: the J/token is all
    metered, so it is not labelled an estimate; once the estimate run has energy, it is."""
    engine = open_store(sqlite_url)
    for estimated_j, expect in ((None, False), (20.0, True)):
        with Session(engine) as s:
            metered = make_run(s, "spec", power_source="nvml",
                               requests=[spec_req(output_tokens=33, k=4, accepted=24, energy_j=50.0)])
            guessed = make_run(s, "spec", power_source="estimate",
                               requests=[spec_req(output_tokens=33, k=4, accepted=24, energy_j=estimated_j)])
            s.commit()
            ids = (metered.id, guessed.id)
        pooled = mode_summaries(engine, Filters(run_ids=ids))[0].stats
        assert pooled.energy_estimated is expect
        assert pooled.j_per_token == pytest.approx((50.0 + (estimated_j or 0)) / (66 if estimated_j else 33))
        runs = {r.run_id: r.stats for r in run_summaries(engine, Filters(run_ids=ids))}
        assert runs[guessed.id].energy_estimated is expect and not runs[metered.id].energy_estimated


def test_acceptance_by_domain(store):
    engine, _ = store
    rows = {d.domain: d for d in acceptance_by_domain(engine)}
    assert set(rows) == {"chat", "code"}  # AR requests are not part of it
    assert rows["code"].acceptance_rate == pytest.approx(24 / 32)
    assert rows["code"].mean_acceptance_length == pytest.approx(1 + 24 / 8)
    assert rows["chat"].acceptance_rate == pytest.approx(10 / 24)
    assert rows["chat"].mean_acceptance_length == pytest.approx(1 + 10 / 6)
    assert rows["chat"].num_requests == 1
    # alpha from the steps: code accepts 3 of 4 in each of its 8 steps, chat 2, 2, 2, 2, 1, 1 of 4
    assert (rows["code"].num_tested_tokens, rows["code"].alpha) == (32, pytest.approx(24 / 32))
    assert (rows["chat"].num_tested_tokens, rows["chat"].alpha) == (16, pytest.approx(10 / 16))
    with Session(engine) as s:  # K = 2, steps accepting 2 (all: no rejected draft tested) and 1
        make_run(s, "spec", k=2, with_events=True, requests=[spec_req(6, 2, 3, domain="rewrite")])
        s.commit()
    rewrite = {d.domain: d for d in acceptance_by_domain(engine)}["rewrite"]
    assert (rewrite.num_tested_tokens, rewrite.alpha) == (4, pytest.approx(3 / 4))
    with Session(engine) as s:  # counts without steps (telemetry that recorded none): alpha is missing
        make_run(s, "spec", workload="x", requests=[spec_req(6, 2, 3, domain="summaries")])
        s.commit()
    summaries = {d.domain: d for d in acceptance_by_domain(engine)}["summaries"]
    assert summaries.acceptance_rate == pytest.approx(3 / 4) and summaries.alpha is None
    with Session(engine) as s:  # K = 2, steps accepting 2 and 1; an EOS then cuts the second inside its drafts
        run = make_run(s, "spec", k=2, with_events=True, requests=[spec_req(6, 2, 3, domain="cut")])
        step = s.scalars(select(Step).join(Request).where(Request.run_id == run.id, Step.step_index == 1)).one()
        step.num_emitted = step.accepted  # no correction token followed: the cut ended it, not a rejection
        s.commit()
    cut = {d.domain: d for d in acceptance_by_domain(engine)}["cut"]
    assert (cut.num_tested_tokens, cut.alpha) == (3, pytest.approx(1.0))  # was (4, 3 / 4): a rejection invented


def test_speedup_same_workload_only(store):
    engine, (a, b, _) = store
    [sp] = speedups(engine)
    assert (sp.workload, sp.spec_run_ids, sp.ar_run_ids) == ("code", (b,), (a,))
    assert sp.speedup == pytest.approx(B_TPS / A_TPS)


def test_speedup_keeps_precisions_apart(store):
    """An AR baseline measured in another precision is neither pooled with nor paired to the spec run."""
    engine, (a, b, _) = store
    with Session(engine) as s:
        bf = make_run(s, "ar", dtype="bfloat16", requests=[Req(33, ttft_ms=100, e2e_ms=500, start_s=0.0)]).id
        s.commit()
    [sp] = speedups(engine)
    assert (sp.dtype, sp.spec_run_ids, sp.ar_run_ids) == ("float32", (b,), (a,))
    assert sp.speedup == pytest.approx(B_TPS / A_TPS)  # unchanged by the faster bf16 baseline
    with Session(engine) as s:
        bs = make_run(s, "spec", dtype="bfloat16", requests=[spec_req(33, 4, 24, ttft_ms=100, e2e_ms=300)]).id
        s.commit()
    by_dtype = {sp.dtype: sp for sp in speedups(engine)}
    assert set(by_dtype) == {"float32", "bfloat16"}
    assert (by_dtype["bfloat16"].spec_run_ids, by_dtype["bfloat16"].ar_run_ids) == ((bs,), (bf,))
    assert by_dtype["float32"].ar_run_ids == (a,)


def test_speedups_keep_temperatures_and_run_kinds_apart(sqlite_url):
    """Spec at temperature 0 and 0.8 against AR at both pooled into one 'speedup' of neither (1.0x where 0 alone
    is 2x and 0.8 alone 0.5x), and a load test's client-side runs pooled with a bench's: each is its own row now,
    and says its temperature and run kind."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for t, spec_ms in ((0.0, 500.0), (0.8, 2000.0)):  # AR 1000 ms for 33 tokens at both
            make_run(s, "ar", temperature=t, requests=[Req(33, ttft_ms=100, e2e_ms=1000)])
            make_run(s, "spec", temperature=t, requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=spec_ms)])
        make_run(s, "ar", kind="loadtest", requests=[Req(33, ttft_ms=100, e2e_ms=3000)])
        make_run(s, "spec", kind="loadtest", requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=1000)])
        s.commit()
    rows = {(sp.temperature, sp.kind): sp for sp in speedups(engine)}
    assert set(rows) == {(0.0, "bench"), (0.8, "bench"), (0.0, "loadtest")}
    assert rows[(0.0, "bench")].speedup == pytest.approx(2.0)
    assert rows[(0.8, "bench")].speedup == pytest.approx(0.5)
    assert rows[(0.0, "loadtest")].speedup == pytest.approx(3.0)
    assert rows[(0.0, "bench")].ar_run_ids == (1,) and rows[(0.8, "bench")].ar_run_ids == (3,)
    assert rows[(0.8, "bench")].label == "temperature 0.8, bench runs, prompts not matched (the runs recorded no " \
                                          "prompt ids)"
    assert [sp.temperature for sp in speedups(engine, Filters(temperature=0.8))] == [0.8]
    assert [sp.kind for sp in speedups(engine, Filters(kind="loadtest"))] == ["loadtest"]


def test_speedups_compare_the_prompts_both_modes_ran(sqlite_url):
    """Where the runs recorded prompt ids and the modes ran different sets, both are restricted to the prompts
    both ran (each run's time then the time those requests were in flight); the same set is said so."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(30, ttft_ms=100, e2e_ms=1000, start_s=0.0, external_id="p1"),
                                    Req(30, ttft_ms=100, e2e_ms=1000, start_s=1.0, external_id="p2")])
        # spec ran p1 and p2 in 0.5 s each, and a long p3 the AR runs never ran
        make_run(s, "spec", requests=[spec_req(30, 4, 20, ttft_ms=50, e2e_ms=500, start_s=0.0, external_id="p1"),
                                      spec_req(30, 4, 20, ttft_ms=50, e2e_ms=500, start_s=0.5, external_id="p2"),
                                      spec_req(30, 4, 20, ttft_ms=50, e2e_ms=9000, start_s=1.0, external_id="p3")])
        make_run(s, "ar", workload="chat", requests=[Req(30, e2e_ms=1000, external_id="c1")])
        make_run(s, "spec", workload="chat", requests=[spec_req(30, 4, 20, e2e_ms=500, external_id="c1")])
        s.commit()
    rows = {sp.workload: sp for sp in speedups(engine)}
    code = rows["code"]
    assert code.speedup == pytest.approx((60 / 1.0) / (60 / 2.0))  # p3 left out: 2x, not 90 / 10 / 30 = 0.3x
    assert code.num_prompts == 2
    assert code.prompts == "restricted to the 2 prompts both modes ran (spec ran 1 more: left out)"
    assert (code.spec_tokens_per_s, code.ar_tokens_per_s) == (pytest.approx(60.0), pytest.approx(30.0))
    assert rows["chat"].prompts == "the same 1 prompt" and rows["chat"].speedup == pytest.approx(2.0)


def test_a_load_tests_speedup_is_its_throughput_over_all_requests(sqlite_url):
    """A load test sends the prompts round-robin for a fixed time: the faster mode gets further round the list.
    Restricted to the prompts both reached, the slower mode's long tail fell out (12.45x where the load test's
    own table said 3.4x); its speedup is over all requests, as the table's."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:  # in 4 s: AR served p1 (slow) and p2; spec p1, p2, p3, p4
        ar = make_run(s, "ar", kind="loadtest",
                      requests=[Req(30, ttft_ms=100, e2e_ms=3000, start_s=0.0, external_id="p1"),
                                Req(30, ttft_ms=100, e2e_ms=1000, start_s=3.0, external_id="p2")])
        spec = make_run(s, "spec", kind="loadtest", requests=[  # p1, p2 quick; p3, p4 long (AR never got there)
            spec_req(30, 4, 20, ttft_ms=50, e2e_ms=ms, start_s=t0, external_id=f"p{i + 1}")
            for i, (t0, ms) in enumerate(((0.0, 500), (0.5, 500), (1.0, 1500), (2.5, 1500)))])
        ar.invocation_id = spec.invocation_id = "lt1"
        s.commit()
    (sp,) = speedups(engine)
    assert sp.speedup == pytest.approx((120 / 4.0) / (60 / 4.0))  # 2x, as the load test's table (p1, p2 alone: 4x)
    assert sp.prompts.startswith("all requests") and sp.num_prompts is None
    assert sp.invocation_speedups == (pytest.approx(2.0),)


def test_speedups_order_concurrency_by_number(store):
    """A sweep's configurations read 1, 2, 4, 16, not 1, 16, 2, 4 (the Overview's table lists them in
    this order)."""
    engine, _ = store
    with Session(engine) as s:
        for level in (16, 2, 4):
            for mode in ("ar", "spec"):
                req = Req(33, ttft_ms=100, e2e_ms=900) if mode == "ar" else spec_req(33, 4, 24, ttft_ms=100, e2e_ms=500)
                make_run(s, mode, concurrency=level, requests=[req])
        s.commit()
    code = [sp.concurrency for sp in speedups(engine) if sp.workload == "code"]
    assert code == sorted(code) and set(code) == {1, 2, 4, 16}


def test_run_cost_hand_computed(store):
    engine, (a, b, _) = store
    rc = run_cost(engine, b, node_hourly_usd=3.6)
    # $3.6/h x 0.62 s / 3600 = $0.00062 over 50 tokens -> $12.40 per 1M
    assert rc.cost.hardware_usd_per_1m == pytest.approx(12.4)
    # 1 J/token: 1e6 J = 0.27778 kWh x PUE 1.2 x $0.13 (catalog defaults)
    assert rc.cost.energy_usd_per_1m == pytest.approx(1e6 / 3.6e6 * 1.2 * 0.13)
    assert rc.cost.total_usd_per_1m == pytest.approx(12.4 + 1e6 / 3.6e6 * 1.2 * 0.13)
    # a custom price is the measured hardware's (NodePrice.differs_from): its energy stays in
    assert not rc.cost.energy_estimated and not rc.priced_differs

    ra = run_cost(engine, a)  # catalog price of its device: cpu-2core
    assert ra.node_price.priced_as == "cpu-2core" and not ra.priced_differs
    assert ra.cost.hardware_usd_per_1m == pytest.approx(0.0832 * 2.8 / 3600 / 67 * 1e6)
    assert ra.cost.energy_usd_per_1m is None  # one ok request had no energy: not extrapolated
    assert not ra.cost.energy_estimated  # no estimated energy is in the total
    assert ra.cost.reason == "estimated energy for only some requests: hardware only"

    with pytest.raises(ValueError, match="run_id"):
        run_cost(engine, 999_999)


def test_run_cost_uses_price_snapshot_and_gpu_override(db_url):
    engine = open_store(db_url)
    with Session(engine) as s:
        run = make_run(
            s,
            "ar",
            device="NVIDIA H100 80GB HBM3",
            power_source="nvml",
            price_snapshot={"name": "H100", "node_hourly_usd": 5.0},
            requests=[Req(101, ttft_ms=100, e2e_ms=3600, energy_j=360.0)],
        )
        s.commit()
        rid = run.id
    rc = run_cost(engine, rid)
    assert rc.node_price.usd_per_hour == 5.0 and not rc.priced_differs
    assert rc.cost.hardware_usd_per_1m == pytest.approx(5.0 / 1000 / 101 * 1e6)  # 3.6 s = 1/1000 h
    rc = run_cost(engine, rid, gpu="a100-80gb")  # case-insensitive catalog name
    assert rc.node_price.usd_per_hour == 3.43 and rc.priced_differs
    with pytest.raises(ValueError, match="B200"):
        run_cost(engine, rid, gpu="B200")


def test_mode_costs_sum_dollars_over_runs(store):
    engine, (a, b, c) = store
    _, modes = costs(engine, node_hourly_usd=3.6)
    by = {m.mode: m for m in modes}
    ar = by["ar"]
    assert ar.output_tokens == 78 and ar.wall_s == pytest.approx(3.35)
    assert ar.cost.hardware_usd_per_1m == pytest.approx(3.6 * 3.35 / 3600 / 78 * 1e6)
    assert ar.cost.energy_usd_per_1m is None  # run C has no energy, run A only partly
    assert by["spec"].cost.total_usd_per_1m == pytest.approx(
        run_cost(engine, b, node_hourly_usd=3.6).cost.total_usd_per_1m
    )


def test_project_from_store(store):
    engine, (a, b, c) = store
    daily = 100 * 86_400  # 100 tokens/s on average
    sp = project_from_store(engine, daily_tokens=daily, peak_factor=1.0, sla_ms=60.0, node_hourly_usd=2.0)
    p = sp.projection
    assert p.capacity_tokens_per_s_ar == pytest.approx(A_TPS) and sp.capacity_run_ar == a
    assert p.capacity_tokens_per_s_spec == pytest.approx(B_TPS) and sp.capacity_run_spec == b
    assert (p.nodes_ar, p.nodes_spec) == (5, 2)  # ceil(100 / 23.9), ceil(100 / 80.6)
    assert p.annual_savings_usd == pytest.approx(3 * 2.0 * HOURS_PER_YEAR)
    d = sp.as_dict()
    assert d["nodes_ar"] == 5 and d["assumptions"]["node_hourly_usd"] == 2.0

    tight = project_from_store(engine, daily_tokens=daily, peak_factor=1.0, sla_ms=30.0, node_hourly_usd=2.0)
    assert tight.projection.nodes_ar is None and tight.projection.nodes_spec == 2
    assert any("not attainable" in n for n in tight.projection.notes)


def test_capacity_pools_the_turns_of_one_configuration(db_url):
    """An interleaved bench records each turn as a run: capacity is the configuration's pooled throughput
    and p95 TPOT over all of its requests, not its luckiest turn; another concurrency is another one."""
    engine = open_store(db_url)
    with Session(engine) as s:
        fast = make_run(s, "spec", requests=[spec_req(21, 4, 8, ttft_ms=100, e2e_ms=300)])  # TPOT 10, 70 tok/s
        slow = make_run(s, "spec", started_at=BASE_TIME + timedelta(seconds=10),
                        requests=[spec_req(21, 4, 8, ttft_ms=100, e2e_ms=1100)])  # TPOT 50, 19.1 tok/s
        s.commit()
        turns = (fast.id, slow.id)

    def project(sla_ms: float):
        return project_from_store(engine, daily_tokens=86_400 * 60, peak_factor=1.0, sla_ms=sla_ms,
                                  node_hourly_usd=1.0)

    sp = project(60.0)  # pooled: 42 tokens / 1.4 s = 30 tokens/s, p95 TPOT 10 + 0.95 x 40 = 48 ms
    assert sp.projection.capacity_tokens_per_s_spec == pytest.approx(30.0)
    assert sp.capacity_runs_spec == turns and sp.capacity_run_spec == fast.id
    assert sp.projection.nodes_spec == 2  # ceil(60 / 30); the fast turn alone (70 tokens/s) would say 1
    assert sp.as_dict()["assumptions"]["capacity_runs_spec"] == list(turns)
    assert project(20.0).projection.nodes_spec is None  # the fast turn alone meets 20 ms; the configuration does not

    with Session(engine) as s:
        wide = make_run(s, "spec", concurrency=4, started_at=BASE_TIME + timedelta(seconds=20),
                        requests=[spec_req(21, 4, 8, ttft_ms=100, e2e_ms=900, start_s=t) for t in (0.0, 0.0)])
        s.commit()
        wide_id = wide.id
    sp = project(60.0)  # concurrency 4: 42 tokens / 0.9 s, TPOT 40 ms, a configuration of its own
    assert sp.projection.capacity_tokens_per_s_spec == pytest.approx(42 / 0.9)
    assert sp.capacity_runs_spec == (wide_id,)
    assert {c.run_ids for c in config_summaries(engine)} == {turns, (wide_id,)}


def test_project_from_empty_store_says_how_to_fill_it(sqlite_url):
    with pytest.raises(ValueError, match="specfinops bench"):
        project_from_store(
            open_store(sqlite_url), daily_tokens=1e6, peak_factor=1.0, sla_ms=50.0, node_hourly_usd=1.0
        )


def test_reuse_collections_reads_the_requests_once_per_filter_and_only_inside_the_block(store):
    """A page asks for mode summaries, speedups and run summaries over one filter: inside
    `reuse_collections` the requests' latency values and the runs' wall spans are read once per distinct filter;
    outside, every call reads the store again, so a request recorded after the block is seen."""
    from sqlalchemy import event

    from telemetry.queries import reuse_collections

    engine = store[0]
    reads: list[str] = []

    def count(conn, cursor, statement, params, context, executemany):
        if "requests.ttft_ms" in statement:  # the per-request latency values
            reads.append("values")
        elif "requests.e2e_ms" in statement:  # the wall spans
            reads.append("spans")

    event.listen(engine, "before_cursor_execute", count)
    try:
        with reuse_collections():
            modes = mode_summaries(engine)
            speedups(engine)  # reads no percentile
            run_summaries(engine)
            config_summaries(engine)
            run_summaries(engine)
            assert sorted(reads) == ["spans", "values"]
            mode_summaries(engine, Filters(domain="code"))
            assert len(reads) == 4  # another filter is another read
            with reuse_collections():  # nested: shares the outer block's
                assert mode_summaries(engine) == modes
            assert len(reads) == 4
        mode_summaries(engine)
        mode_summaries(engine)
        assert len(reads) == 8  # outside the block nothing is kept
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_costs_read_the_price_catalog_once_not_per_run(store):
    """Pricing every run looked up its node price and the electricity price and PUE in the catalog, a few
    queries per run (12,291 statements for 2,048 runs); the catalog is now read once per call."""
    from sqlalchemy import event

    engine = store[0]
    reads: list[str] = []

    def count(conn, cursor, statement, params, context, executemany):
        if "FROM prices" in statement:
            reads.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        run_costs, _ = costs(engine)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(run_costs) == 3
    assert len(reads) == 1, reads


def test_a_time_window_prices_a_run_over_its_requests_inside_it_never_the_whole_run(db_url):
    """A window where a run has only a request that never ended (no E2E) fell back to the run's own start and
    end: a 2000 s report period was charged a server run's 10,000 s, and its mode's tokens/s fell 30-fold."""
    engine = open_store(db_url)
    with Session(engine) as s:  # a server-like run: ok at 0 s, a failed request at 5,000 s, ok at 9,990 s
        make_run(s, "ar", ended_at=BASE_TIME + timedelta(seconds=10_000),
                 requests=[Req(40, e2e_ms=5000, start_s=0), Req(0, ttft_ms=None, e2e_ms=None, start_s=5000,
                                                             status="error"), Req(40, e2e_ms=5000, start_s=9990)])
        make_run(s, "ar", requests=[Req(40, e2e_ms=1000, start_s=4000 + i) for i in range(30)])  # a bench
        s.commit()
    window = Filters(since=BASE_TIME + timedelta(seconds=3000), until=BASE_TIME + timedelta(seconds=6000))
    server, bench = run_summaries(engine, window)
    assert server.stats.wall_s is None  # no finished request inside: no time, not the run's 10,000 s
    assert bench.stats.wall_s == pytest.approx(30.0)
    [ar] = mode_summaries(engine, window)
    assert ar.stats.tokens_per_s == pytest.approx(1200 / 30.0)  # the bench's pace, not diluted by the server
    whole, _ = run_summaries(engine)
    assert whole.stats.wall_s == pytest.approx(10_000 - 10 + 5)  # unwindowed: its requests' span, as before
    early = Filters(until=BASE_TIME + timedelta(seconds=3000))
    assert run_summaries(engine, early)[0].stats.wall_s == pytest.approx(5.0)  # its request inside the window


def test_a_domain_of_a_concurrent_run_gets_its_share_of_the_runs_time(db_url):
    """Under a domain filter a run's wall time was the time the domain's requests were in flight: at concurrency
    2, a domain with half the requests was in flight all the time, and its tokens/s read half the run's. Each
    request now gets 1/n of the time n requests are in flight: the domains' times add up to the run's."""
    engine = open_store(db_url)
    with Session(engine) as s:  # two streams, 0-10 s each: a code and a chat request at a time
        make_run(s, "ar", concurrency=2, requests=[Req(100, e2e_ms=5000, start_s=t, domain=d)
                                                   for t in (0, 5) for d in ("code", "chat")])
        s.commit()
    whole, = run_summaries(engine)
    code, = run_summaries(engine, Filters(domain="code"))
    chat, = run_summaries(engine, Filters(domain="chat"))
    assert whole.stats.wall_s == pytest.approx(10.0) and whole.stats.tokens_per_s == pytest.approx(40.0)
    assert code.stats.wall_s == pytest.approx(5.0) and chat.stats.wall_s == pytest.approx(5.0)  # was 10 s each
    assert code.stats.tokens_per_s == pytest.approx(40.0)  # the run's pace, not half of it
    # one request at a time: the domain's own time, as before
    with Session(engine) as s:
        make_run(s, "spec", requests=[Req(50, e2e_ms=2000, start_s=t, domain=d)
                                      for t, d in ((0, "code"), (2, "chat"), (4, "code"))])
        s.commit()
    spec = next(r for r in run_summaries(engine, Filters(domain="code")) if r.mode == "spec")
    assert spec.stats.wall_s == pytest.approx(4.0)


def test_the_domains_of_a_run_with_idle_gaps_add_up_to_its_span(db_url):
    """A server run idle for 490 s between bursts is priced over its span; its domains' shares summed to its
    busy time only (27 s of 512 s), so each domain read 19 times the run's pace."""
    engine = open_store(db_url)
    with Session(engine) as s:
        make_run(s, "ar", kind="serve", concurrency=2, requests=[
            Req(100, e2e_ms=10_000, start_s=0, domain="code"), Req(50, e2e_ms=10_000, start_s=0, domain="chat"),
            Req(100, e2e_ms=10_000, start_s=500, domain="code")])  # idle from 10 s to 500 s
        s.commit()
    whole, = run_summaries(engine)
    parts = [run_summaries(engine, Filters(domain=d))[0] for d in ("code", "chat")]
    assert whole.stats.wall_s == pytest.approx(510.0)
    assert sum(p.stats.wall_s for p in parts) == pytest.approx(510.0)
    # busy: code 5 + 10 s, chat 5 s of 20 s; the span 510 s shared so: code 3/4, chat 1/4
    assert [p.stats.wall_s for p in parts] == pytest.approx([382.5, 127.5])
    # the whole run in one domain: the run's own span, not the union of its busy intervals
    assert run_summaries(engine, Filters(domain="code", since=BASE_TIME + timedelta(seconds=100)))[0].stats.wall_s \
        == pytest.approx(10.0)


def test_a_run_ending_while_it_is_read_is_read_whole_or_as_running(db_url, monkeypatch):
    """A writer ended a run (its last request, then its end) between the reader's request totals and its read of
    the run's status: `cost` showed the run 'completed' over 2 of its 3 requests, with no note (SQLite and
    PostgreSQL alike). The reads now see one moment of the store: the run is running over 2, or completed over 3."""
    from datetime import UTC, datetime

    from sqlalchemy import update

    import telemetry.queries as q
    from telemetry.db import Run

    engine = open_store(db_url)
    with Session(engine) as s:
        run = make_run(s, "ar", status="running", requests=[Req(10, start_s=0.0), Req(10, start_s=1.0)])
        run.ended_at = None
        s.commit()
        run_id = run.id
    writer = open_store(db_url)
    spans = q._span_bounds  # the run spans' read (between the totals and the status)

    def a_writer_ends_the_run_meanwhile(c, engine_, filters):
        with Session(writer) as s:
            s.add(Request(run_id=run_id, external_id="p3", domain="code", status="ok", prompt_tokens=16,
                          output_tokens=10, ttft_ms=50.0, e2e_ms=500.0, started_at=BASE_TIME + timedelta(seconds=2),
                          num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0))
            s.execute(update(Run).where(Run.id == run_id).values(status="completed", ended_at=datetime.now(UTC)))
            s.commit()
        return spans(c, engine_, filters)

    monkeypatch.setattr(q, "_span_bounds", a_writer_ends_the_run_meanwhile)
    (seen,) = q.run_summaries(engine, latency=False)
    assert (seen.status, seen.stats.output_tokens) == ("running", 20), (seen.status, seen.stats.output_tokens)
    monkeypatch.setattr(q, "_span_bounds", spans)
    (later,) = q.run_summaries(engine, latency=False)
    assert (later.status, later.stats.output_tokens) == ("completed", 30)
    writer.dispose()
    engine.dispose()

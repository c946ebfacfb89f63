"""Paired speedups (migration 0011, runs.invocation_id): every run one bench or load test records carries that
invocation's id, and `speedups` gives each invocation that ran both modes its own spec/AR ratio beside the
pooled figure, which mixes invocations made under different machine conditions (an AR-only bench on a loaded
machine, pooled with an idle bench's spec runs, read 2.36x where every paired invocation measured ~1.9x)."""

from __future__ import annotations

import csv
import json
import sys
from datetime import timedelta

import pytest
from alembic import command
from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.orm import Session
from synthetic import BASE_TIME, Req, make_run, spec_req

from app.cli import main
from telemetry import report_writer
from telemetry.queries import Speedup, paired_text, speedups
from telemetry.report import period_window
from telemetry.store import alembic_config, open_store
from tests.test_dashboard_apptest import PAGES, app_for, assert_clean, fill_store, open_page

HOUR = timedelta(hours=1)

# a run and its children as a store at 0010 holds them
OLD_ROWS = (
    "INSERT INTO runs (id, kind, mode, node_id, hostname, device, backend, dtype, target, k_policy, temperature, "
    "top_p, concurrency, workload, power_source, software_version, started_at, status, dropped_records, top_k, "
    "seed, max_new_tokens) VALUES (1, 'bench', 'spec', 'n', 'h', 'cpu', 'torch', 'float32', 't', 'fixed:4', 0, "
    "1, 1, 'code', 'none', 'v', '2026-12-02 00:00:00', 'completed', 0, 0, 0, 64)",
    "INSERT INTO requests (id, run_id, domain, started_at, prompt_tokens, output_tokens, num_drafts, "
    "num_draft_tokens, num_accepted_tokens, status) VALUES (1, 1, 'code', '2026-12-02 00:00:00', 5, 9, 2, 8, 6, 'ok')",
    "INSERT INTO steps (id, request_id, step_index, k, accepted, num_emitted, draft_ms, verify_ms, batch_size, "
    "t_offset_ms) VALUES (1, 1, 0, 4, 3, 4, 1.0, 20.0, 1, 21.0)",
    "INSERT INTO token_events (id, request_id, position, emit_offset_ms, step_index, source) "
    "VALUES (1, 1, 0, 21.0, 0, 'accepted')",
)


def _engine(url: str):
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def _run_columns_and_indexes(engine) -> tuple[set[str], set[str]]:
    insp = inspect(engine)
    return {c["name"] for c in insp.get_columns("runs")}, {i["name"] for i in insp.get_indexes("runs")}


# ---- migration 0011 -------------------------------------------------------------------------------------


def test_0011_adds_an_indexed_nullable_invocation_id_and_the_round_trip_keeps_the_data(db_url):
    cfg = alembic_config(db_url)
    command.upgrade(cfg, "0010")
    engine = _engine(db_url)
    try:
        assert "invocation_id" not in _run_columns_and_indexes(engine)[0]
        with engine.begin() as conn:
            for sql in OLD_ROWS:
                conn.execute(text(sql))
        command.upgrade(cfg, "0011")
        columns, indexes = _run_columns_and_indexes(engine)
        assert "invocation_id" in columns and "ix_runs_invocation_id" in indexes
        with engine.begin() as conn:
            assert conn.execute(text("SELECT invocation_id FROM runs")).scalar_one() is None  # old run: unknown
            conn.execute(text("UPDATE runs SET invocation_id = :i"), {"i": "0" * 32})
        command.downgrade(cfg, "0010")
        columns, indexes = _run_columns_and_indexes(engine)
        assert "invocation_id" not in columns and "ix_runs_invocation_id" not in indexes
        with engine.connect() as conn:  # nothing lost to SQLite's rebuild of runs (ON DELETE CASCADE)
            counts = [conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar_one()
                      for t in ("runs", "requests", "steps", "token_events")]
            assert counts == [1, 1, 1, 1]
            assert tuple(conn.execute(text("SELECT target, max_new_tokens FROM runs")).one()) == ("t", 64)
        command.upgrade(cfg, "head")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT invocation_id FROM runs")).scalar_one() is None  # dropped stays unknown
        command.check(cfg)
    finally:
        engine.dispose()


# ---- speedups: pooled and paired ------------------------------------------------------------------------


def _run(s, invocation: str | None, mode: str, start, requests, **kw):
    run = make_run(s, mode, started_at=start, requests=requests, **kw)
    run.invocation_id = invocation
    s.flush()
    return run


def _ar(s, invocation, start, e2e_ms: float, tokens: int = 100, **kw):
    return _run(s, invocation, "ar", start, [Req(tokens, ttft_ms=50, e2e_ms=e2e_ms, external_id="p1")], **kw)


def _spec(s, invocation, start, e2e_ms: float, tokens: int = 100, **kw):
    return _run(s, invocation, "spec", start, [spec_req(tokens, 4, 60, ttft_ms=50, e2e_ms=e2e_ms, external_id="p1")],
                **kw)


def two_invocations(url: str) -> None:
    """Invocation 'idle': AR 50 tokens/s and spec 100 tokens/s (2.0x, paired). Invocation 'loaded', an hour later:
    AR only, 25 tokens/s. Pooled: spec 100 / AR 200 tokens in 6 s = 3.0x."""
    engine = open_store(url)
    with Session(engine) as s:
        _ar(s, "idle", BASE_TIME, 2000)
        _spec(s, "idle", BASE_TIME + timedelta(seconds=3), 1000)
        _ar(s, "loaded", BASE_TIME + HOUR, 4000)
        s.commit()
    engine.dispose()


def test_an_ar_only_invocation_moves_the_pooled_figure_not_the_paired_one(db_url):
    two_invocations(db_url)
    engine = open_store(db_url)
    (sp,) = speedups(engine)
    engine.dispose()
    assert sp.speedup == pytest.approx(3.0)  # the pooled figure is kept as it was
    assert sp.invocation_speedups == pytest.approx((2.0,)) and sp.invocation_ids == ("idle",)
    assert sp.pooled_outside_paired
    assert paired_text(sp) == ("2.00x in 1 paired invocation; pooled 3.00x differs from the paired 2.00x: the modes "
                               "ran under different conditions in different invocations; trust the paired figure")
    assert paired_text(sp, flag=False) == "2.00x in 1 paired invocation"


def test_paired_figures_are_ordered_by_start_and_the_range_is_flagged(db_url):
    engine = open_store(db_url)
    with Session(engine) as s:
        # recorded in another order than they ran: 1.9x ran last, 2.0x first
        for inv, hours, ratio in (("c", 2, 1.9), ("a", 0, 2.0), ("b", 1, 2.1)):
            _ar(s, inv, BASE_TIME + hours * HOUR, 2000)
            _spec(s, inv, BASE_TIME + hours * HOUR + timedelta(seconds=5), 2000 / ratio)
        _ar(s, "slow", BASE_TIME + 3 * HOUR, 8000)  # AR only, on a loaded machine
        s.commit()
    (sp,) = speedups(engine)
    engine.dispose()
    assert sp.invocation_ids == ("a", "b", "c")
    assert sp.invocation_speedups == pytest.approx((2.0, 2.1, 1.9))
    assert sp.speedup == pytest.approx(3 * 100 / (2000 / 1.9 + 1000 + 2000 / 2.1) * 1000 / (400 / 14))
    assert paired_text(sp) == ("2.00x / 2.10x / 1.90x over 3 paired invocations; pooled 3.49x lies outside the "
                               "paired range (1.90-2.10x): the modes ran under different conditions in different "
                               "invocations; trust the paired figures")


def test_paired_text_in_words():
    base = dict(workload="code", target="t", device="cpu", dtype="float32", concurrency=1, drafter="d",
                k_policy="fixed:4", spec_tokens_per_s=100.0, ar_tokens_per_s=50.0, spec_run_ids=(2,), ar_run_ids=(1,))
    five = Speedup(speedup=1.95, invocation_speedups=(1.88, 2.0, 1.93, 1.9, 1.97), **base)
    assert paired_text(five) == "median 1.93x (1.88-2.00x) over 5 paired invocations"  # 1.95 is within: no flag
    assert not five.pooled_outside_paired
    # at the two decimals shown: 2.004 reads 2.00x, inside a range that ends at 2.00x
    assert not Speedup(speedup=2.004, invocation_speedups=(1.9, 2.0), **base).pooled_outside_paired
    none = Speedup(speedup=2.36, **base)
    assert paired_text(none).startswith("no paired invocation: no one bench or load test recorded both modes")
    assert "0.00x" not in paired_text(none) and not none.pooled_outside_paired
    assert paired_text(Speedup(speedup=None, **{**base, "ar_run_ids": ()})) == "no paired invocation (no AR runs)"
    serve = Speedup(speedup=1.5, kind="serve", **base)
    assert paired_text(serve).startswith("no paired invocation: a server's runs are not paired")


def test_runs_without_a_shared_invocation_give_no_paired_figure(db_url):
    engine = open_store(db_url)
    with Session(engine) as s:
        _ar(s, None, BASE_TIME, 2000)  # recorded before 0011: NULL
        _spec(s, None, BASE_TIME + timedelta(seconds=3), 1000)
        # the modes benched by separate commands (another workload, so another row)
        _ar(s, "ar-only", BASE_TIME + HOUR, 2000, workload="chat")
        _spec(s, "spec-only", BASE_TIME + 2 * HOUR, 1000, workload="chat")
        s.commit()
    rows = {sp.workload: sp for sp in speedups(engine)}
    engine.dispose()
    for sp in rows.values():
        assert sp.speedup == pytest.approx(2.0)
        assert sp.invocation_speedups == () and sp.invocation_ids == () and not sp.pooled_outside_paired
        assert paired_text(sp).startswith("no paired invocation")


def test_within_an_invocation_both_modes_are_restricted_to_the_prompts_both_ran(db_url):
    """Invocation 'partial': spec's second request failed, so spec ran p1 only; both modes are compared on p1
    (spec 50 tokens in 0.25 s, AR 50 in 1 s: 4.0x), as the pooled figure restricts them. Invocation 'whole' ran
    both prompts in both modes: over all its requests (2.0x)."""
    engine = open_store(db_url)
    with Session(engine) as s:
        t = BASE_TIME
        _run(s, "partial", "ar", t, [Req(50, ttft_ms=50, e2e_ms=1000, external_id="p1"),
                                    Req(50, ttft_ms=50, e2e_ms=1000, start_s=1.0, external_id="p2")])
        _run(s, "partial", "spec", t + timedelta(seconds=3), [
            spec_req(50, 4, 30, ttft_ms=50, e2e_ms=250, external_id="p1"),
            Req(0, ttft_ms=None, e2e_ms=500, start_s=0.5, status="error", external_id="p2")])
        s.commit()
        (alone,) = speedups(engine)
        assert alone.prompts.startswith("restricted to the 1 prompt both modes ran")
        assert alone.invocation_speedups == pytest.approx((4.0,)) and alone.speedup == pytest.approx(4.0)
        t = BASE_TIME + HOUR
        _run(s, "whole", "ar", t, [Req(50, ttft_ms=50, e2e_ms=1000, external_id="p1"),
                                  Req(50, ttft_ms=50, e2e_ms=1000, start_s=1.0, external_id="p2")])
        _run(s, "whole", "spec", t + timedelta(seconds=3), [
            spec_req(50, 4, 30, ttft_ms=50, e2e_ms=500, external_id="p1"),
            spec_req(50, 4, 30, ttft_ms=50, e2e_ms=500, start_s=0.5, external_id="p2")])
        s.commit()
    (sp,) = speedups(engine)
    engine.dispose()
    assert sp.invocation_ids == ("partial", "whole")
    assert sp.invocation_speedups == pytest.approx((4.0, 2.0))


def test_a_restriction_to_the_prompts_both_ran_times_both_modes_on_one_basis(db_url):
    """Every request takes 1 s for 10 tokens in both modes; spec ran p1 and p2 a second apart, AR p1, p2 and p3.
    Restricted to p1 and p2, AR was timed on the 2 s it served them and spec on its 3 s span, its idle second
    included: 0.67x for equal speeds. Both are the time they served the prompts: 1.00x."""
    engine = open_store(db_url)
    with Session(engine) as s:
        _run(s, "gap", "spec", BASE_TIME, [Req(10, ttft_ms=100, e2e_ms=1000, external_id="p1"),
                                          Req(10, ttft_ms=100, e2e_ms=1000, start_s=2.0, external_id="p2")])
        _run(s, "gap", "ar", BASE_TIME + timedelta(seconds=10), [
            Req(10, ttft_ms=100, e2e_ms=1000, start_s=2.0 * i, external_id=f"p{i + 1}") for i in range(3)])
        s.commit()
    (sp,) = speedups(engine)
    engine.dispose()
    assert sp.prompts.startswith("restricted to the 2 prompts both modes ran")
    assert sp.invocation_speedups == pytest.approx((1.0,)) and sp.speedup == pytest.approx(1.0)


def inflated_ar(url: str, invocation: str = "inflated") -> None:
    """One bench whose AR ran on a loaded machine: AR 100 tokens in 4 s, spec 100 tokens in 1 s (4.00x) with a mean
    acceptance length of 1 + 60 / 39 = 2.54 tokens a step: no spec run can beat AR by more than that."""
    engine = open_store(url)
    with Session(engine) as s:
        _ar(s, invocation, BASE_TIME, 4000)
        _spec(s, invocation, BASE_TIME + timedelta(seconds=5), 1000)
        s.commit()
    engine.dispose()


def test_a_speedup_above_its_mean_acceptance_length_is_flagged_with_both_figures(db_url):
    from telemetry.queries import above_acceptance_text

    inflated_ar(db_url)
    engine = open_store(db_url)
    (sp,) = speedups(engine)
    engine.dispose()
    assert sp.speedup == pytest.approx(4.0) and sp.mean_acceptance_length == pytest.approx(1 + 60 / 39)
    assert sp.invocation_acceptance_lengths == pytest.approx((1 + 60 / 39,))
    # the pooled figure is the one paired figure (the same runs): said once
    ((inv, x, mal),) = sp.above_acceptance
    assert inv == "inflated" and (x, mal) == pytest.approx((4.0, 1 + 60 / 39))
    assert above_acceptance_text(sp) == (
        "speedup invocation inflated: measured 4.00x is above the mean acceptance length 2.54 (by more than 10%): "
        "a speculative step emits 2.54 tokens on average for at least one target forward, so it cannot beat AR by "
        "more than that; the AR timing was inflated (likely a loaded machine or too few prompts): rerun on a quiet "
        "machine (bench --mode both takes AR and spec in turns at concurrency 1: a smaller --interleave has both "
        "modes share the load)")


def test_a_plausible_speedup_and_one_with_nothing_drafted_are_not_flagged(db_url):
    from telemetry.queries import above_acceptance_text

    two_invocations(db_url)  # paired 2.00x; pooled 3.00x over 2.54 tokens a step (1.1 x 2.54 = 2.79): flagged
    engine = open_store(db_url)
    with Session(engine) as s:  # a spec run that drafted nothing (a server's counts missing): nothing to judge
        _ar(s, "none", BASE_TIME + 2 * HOUR, 4000, workload="chat")
        _run(s, "none", "spec", BASE_TIME + 2 * HOUR, [Req(100, ttft_ms=50, e2e_ms=1000, external_id="p1")],
             workload="chat")
        s.commit()
    rows = {sp.workload: sp for sp in speedups(engine)}
    engine.dispose()
    code, chat = rows["code"], rows["chat"]
    ((inv, x, mal),) = code.above_acceptance
    assert inv is None and (x, mal) == pytest.approx((3.0, 1 + 60 / 39))
    assert above_acceptance_text(code).startswith("speedup pooled over every invocation in view: measured 3.00x is "
                                                  "above the mean acceptance length 2.54")
    assert chat.speedup == pytest.approx(4.0) and chat.mean_acceptance_length is None
    assert chat.above_acceptance == () and above_acceptance_text(chat) is None


def test_the_acceptance_length_is_over_the_prompts_the_speedup_is_over(db_url):
    """Spec ran p1 (30 accepted in 19 drafts) and p2 (36 in 13); AR ran p1 only: the speedup is over p1, and so is
    the mean acceptance length it is judged against (2.58, not 3.06 over both prompts), pooled and paired."""
    engine = open_store(db_url)
    with Session(engine) as s:
        _run(s, "one", "ar", BASE_TIME, [Req(50, ttft_ms=50, e2e_ms=1000, external_id="p1")])
        _run(s, "one", "spec", BASE_TIME + timedelta(seconds=3), [
            spec_req(50, 4, 30, ttft_ms=50, e2e_ms=250, external_id="p1"),
            spec_req(50, 4, 36, ttft_ms=50, e2e_ms=250, start_s=0.5, external_id="p2")])
        s.commit()
    (sp,) = speedups(engine)
    engine.dispose()
    assert sp.prompts.startswith("restricted to the 1 prompt both modes ran")
    assert sp.mean_acceptance_length == pytest.approx(1 + 30 / 19)
    assert sp.invocation_acceptance_lengths == pytest.approx((1 + 30 / 19,))
    ((inv, x, mal),) = sp.above_acceptance
    assert inv == "one" and (x, mal) == pytest.approx((4.0, 1 + 30 / 19))


def test_paired_figures_cost_no_query_per_invocation(sqlite_url):
    """Read from the run summaries already read; the invocations whose modes ran different prompts share one
    SELECT: 12 such invocations take as many statements as 1."""
    def statements(n: int) -> int:
        url = sqlite_url.replace("store.db", f"store{n}.db")
        engine = open_store(url)
        with Session(engine) as s:
            for i in range(n):
                t = BASE_TIME + i * HOUR
                _run(s, f"inv{i}", "ar", t, [Req(50, e2e_ms=1000, external_id="p1"),
                                             Req(50, e2e_ms=1000, start_s=1.0, external_id="p2")])
                _run(s, f"inv{i}", "spec", t + timedelta(seconds=3), [
                    spec_req(50, 4, 30, e2e_ms=250, external_id="p1"),
                    Req(0, ttft_ms=None, e2e_ms=500, start_s=0.5, status="error", external_id="p2")])
            s.commit()
        seen = []
        event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
        (sp,) = speedups(engine)
        engine.dispose()
        assert len(sp.invocation_speedups) == n and sp.invocation_speedups == pytest.approx((4.0,) * n)
        return len(seen)

    assert statements(12) == statements(1)


# ---- recording: a real bench, the vLLM backend, a load test ---------------------------------------------


@pytest.fixture(scope="module")
def target_dir():
    from serving import models

    return models.pull(say=lambda m: None, verify=False)


def _bench(db_url: str, tmp_path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert main(["bench", "--workload", "code", "--mode", "both", "--limit", "2", "--max-new-tokens", "8",
                 "--db", db_url, "--json", str(out), "--power", "estimate", "--tdp-w", "65", *extra]) == 0
    return json.loads(out.read_text())


@pytest.mark.slow
def test_a_bench_records_one_invocation_on_all_its_runs_and_two_benches_two(db_url, tmp_path, target_dir):
    first = _bench(db_url, tmp_path, "first", "--interleave", "1", "--concurrency", "1,2")
    second = _bench(db_url, tmp_path, "second")
    engine = _engine(db_url)
    with engine.connect() as c:
        runs = [tuple(r) for r in c.execute(text("SELECT id, mode, concurrency, invocation_id FROM runs ORDER BY id"))]
    # the first: AR and spec in turns of one prompt at concurrency 1, then both modes at 2; the second: one turn each
    assert [(m, n) for _, m, n, _ in runs] == [("ar", 1), ("spec", 1), ("ar", 1), ("spec", 1), ("ar", 2), ("spec", 2),
                                               ("ar", 1), ("spec", 1)]
    assert {i for *_, i in runs[:6]} == {first["invocation_id"]} and {i for *_, i in runs[6:]} == {second["invocation_id"]}
    assert len(first["invocation_id"]) == 32 and first["invocation_id"] != second["invocation_id"]
    by_level = {sp.concurrency: sp for sp in speedups(engine)}
    engine.dispose()
    assert by_level[1].invocation_ids == (first["invocation_id"], second["invocation_id"])
    assert by_level[2].invocation_ids == (first["invocation_id"],)
    assert all(x > 0 for sp in by_level.values() for x in sp.invocation_speedups)


def test_a_vllm_bench_records_one_invocation_on_all_its_runs(monkeypatch, tmp_path):
    from tests import fake_vllm
    from tests.fake_vllm import FakeNvml

    fake_vllm.install(monkeypatch)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    url = f"sqlite:///{tmp_path / 'store.db'}"
    ids = []
    for name in ("first", "second"):
        out = tmp_path / f"{name}.json"
        assert main(["bench", "--backend", "vllm", "--mode", "both", "--workload", "code", "--limit", "2", "--k", "3",
                     "--max-new-tokens", "8", "--power", "nvml", "--target", str(target), "--db", url,
                     "--concurrency", "1,2", "--json", str(out)]) == 0
        ids.append(json.loads(out.read_text())["invocation_id"])
    engine = create_engine(url)
    with engine.connect() as c:
        runs = [tuple(r) for r in c.execute(text("SELECT mode, concurrency, invocation_id FROM runs ORDER BY id"))]
    engine.dispose()
    assert [i for *_, i in runs] == [ids[0]] * 4 + [ids[1]] * 4 and ids[0] != ids[1]
    assert {(m, n) for m, n, _ in runs[:4]} == {("ar", 1), ("ar", 2), ("spec", 1), ("spec", 2)}


def test_a_load_test_records_one_invocation_on_all_its_levels_and_modes():
    import asyncio

    import serving.loadtest as lt
    from tests.test_loadtest_stub import Stub, _prompt

    class Recorder:
        def __init__(self):
            self.infos = []

        def start_run(self, info) -> int:
            self.infos.append(info)
            return len(self.infos)

        def end_run(self, run_id, status="completed"):
            pass

        def record_request(self, run_id, rec):
            pass

    stub = Stub(chunks=2, chunk_s=0.01)
    try:
        spec = lt.LoadSpec(url=stub.url, levels=(1, 2), duration_s=0.3, max_tokens=8)
        recorders = [Recorder(), Recorder()]
        for rec in recorders:
            asyncio.run(lt.run_loadtest(spec, [_prompt()], workload="code", recorder=rec))
    finally:
        stub.stop()
    for rec in recorders:
        assert [(i.mode, i.concurrency) for i in rec.infos] == [("ar", 1), ("spec", 1), ("ar", 2), ("spec", 2)]
        assert len({i.invocation_id for i in rec.infos}) == 1 and rec.infos[0].invocation_id
    assert recorders[0].infos[0].invocation_id != recorders[1].infos[0].invocation_id


# ---- where speedups are shown ---------------------------------------------------------------------------


def test_overview_shows_the_paired_figures_and_flags_the_pooled_one(sqlite_url, monkeypatch):
    two_invocations(sqlite_url)
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    assert [m.value for m in at.metric if m.label == "Speedup"] == ["3.00x"]  # the pooled figure, as before
    (speed,) = [m for m in at.metric if m.label == "Speedup"]
    assert "Paired (each invocation's own): 2.00x in 1 paired invocation" in speed.help
    # (the projection's warnings, of a small sample here, are test_dashboard_edge_stores' part)
    paired, above = [w.value for w in at.warning if not w.value.startswith("Projection:")]
    assert paired == (
        "Speedup: pooled 3.00x differs from the paired 2.00x: the modes ran under different conditions in different "
        "invocations; trust the paired figure (2.00x in 1 paired invocation).")
    # and 3.00x is more than 2.54 tokens a step allow: the loaded AR-only invocation inflated it
    assert above.startswith("Speedup: speedup pooled over every invocation in view: measured 3.00x is above the mean "
                            "acceptance length 2.54")
    table = at.dataframe[0].value
    assert list(table["paired invocations"]) == ["2.00x in 1 paired invocation"]
    assert list(table["pooled outside paired"]) == [True]


def test_overview_of_runs_without_invocations_says_there_is_no_pair(sqlite_url, monkeypatch):
    fill_store(sqlite_url)  # runs as recorded before 0011: no invocation
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    assert not [w.value for w in at.warning if not w.value.startswith("Projection:")]
    (cell,) = at.dataframe[0].value["paired invocations"]
    assert cell.startswith("no paired invocation") and "0.00x" not in cell


def test_report_json_csv_and_page_show_the_paired_figures(db_url, tmp_path):
    two_invocations(db_url)
    engine = open_store(db_url)
    result = report_writer.write_report(engine, period_window("daily", since=BASE_TIME.replace(hour=0)), tmp_path,
                                        now=BASE_TIME + timedelta(days=2))
    engine.dispose()
    (row,) = result.summary["speedups"]
    assert row["speedup"] == pytest.approx(3.0)  # kept
    assert row["invocation_speedups"] == pytest.approx([2.0]) and row["invocation_ids"] == ["idle"]
    assert row["pooled_outside_paired"] is True and row["paired"].startswith("2.00x in 1 paired invocation; pooled 3.00x")
    with open(result.csv_dir / "speedups.csv", encoding="utf-8", newline="") as fh:
        (line,) = csv.DictReader(fh)
    assert float(line["speedup"]) == pytest.approx(3.0) and float(line["paired speedups"]) == pytest.approx(2.0)
    assert line["paired invocations"] == row["paired"]
    page = result.html_path.read_text(encoding="utf-8")
    assert "<th>paired invocations</th>" in page and "2.00x in 1 paired invocation; pooled 3.00x differs" in page
    assert "paired: 2.00x in 1 paired invocation" in page  # the Speedup card


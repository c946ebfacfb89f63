"""A run's top_k, seed and max_new_tokens (migration 0008): recorded from the sampling used, NULL where unknown
(older records, a server's runs), and runs that differ only in top_k are two configurations, two comparable
groups and two speedups, never one pooled figure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from alembic import command
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.orm import Session
from synthetic import Req, make_run, spec_req

from telemetry.costing import comparable_group, project_from_store, run_groups
from telemetry.export import ExportWindow, export_rows
from telemetry.queries import config_summaries, run_summaries, speedups
from telemetry.recorder import Recorder
from telemetry.records import RequestRecord, RunInfo
from telemetry.store import alembic_config, open_store
from telemetry.sweeps import sweep_points

NEW_COLUMNS = {"top_k", "seed", "max_new_tokens"}
OLD_RUN = (
    "INSERT INTO runs (id, kind, mode, node_id, hostname, device, backend, dtype, target, k_policy, temperature, "
    "top_p, concurrency, workload, power_source, software_version, started_at, status, dropped_records) VALUES "
    "(1, 'bench', 'spec', 'n', 'h', 'cpu', 'torch', 'bfloat16', 't', 'fixed:4', 0.8, 1, 1, 'code', 'none', 'v', "
    "'2026-12-02 00:00:00', 'completed', 0)"
)
OLD_CHILDREN = (
    "INSERT INTO requests (id, run_id, domain, started_at, prompt_tokens, output_tokens, num_drafts, "
    "num_draft_tokens, num_accepted_tokens, status) VALUES (1, 1, 'code', '2026-12-02 00:00:00', 5, 9, 2, 8, 6, 'ok')",
    "INSERT INTO steps (id, request_id, step_index, k, accepted, num_emitted, draft_ms, verify_ms, batch_size, "
    "t_offset_ms) VALUES (1, 1, 0, 4, 3, 4, 1.0, 20.0, 1, 21.0)",
)


def _engine(url: str):
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def _run_columns(engine) -> set[str]:
    return {c["name"] for c in inspect(engine).get_columns("runs")}


# ---- (a) the migration -------------------------------------------------------------------------------------


def test_0008_adds_the_columns_keeps_old_runs_unknown_and_downgrades(db_url):
    cfg = alembic_config(db_url)
    command.upgrade(cfg, "0007")
    engine = _engine(db_url)
    try:
        assert not NEW_COLUMNS & _run_columns(engine)
        with engine.begin() as conn:
            for sql in (OLD_RUN, *OLD_CHILDREN):
                conn.execute(text(sql))
        command.upgrade(cfg, "0008")
        assert NEW_COLUMNS <= _run_columns(engine)
        with engine.begin() as conn:
            old = conn.execute(text("SELECT temperature, top_p, top_k, seed, max_new_tokens FROM runs")).one()
            assert tuple(old) == (0.8, 1.0, None, None, None)  # unknown, not a guessed 0 / 128
            # a new run holds every seed the recorder keeps: a signed 64-bit one
            conn.execute(text(OLD_RUN.replace("(1, 'bench'", "(2, 'bench'").replace(
                "dropped_records)", "dropped_records, top_k, seed, max_new_tokens)").replace(
                "'completed', 0)", f"'completed', 0, 40, {2**63 - 1}, 128)")))
            assert conn.execute(text("SELECT top_k, seed, max_new_tokens FROM runs WHERE id = 2")).one() == (
                40, 2**63 - 1, 128)
        command.downgrade(cfg, "0007")
        assert not NEW_COLUMNS & _run_columns(engine)
        with engine.connect() as conn:  # no record lost to the rebuild of runs (SQLite's cascade)
            counts = [conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar_one() for t in ("runs", "requests", "steps")]
            assert counts == [2, 1, 1]
        command.upgrade(cfg, "head")
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT top_k, seed, max_new_tokens FROM runs ORDER BY id")).all()
            assert [tuple(r) for r in rows] == [(None, None, None)] * 2  # what the downgrade dropped stays unknown
        command.check(cfg)
    finally:
        engine.dispose()


# ---- (b) top_k keeps configurations, groups and speedups apart ---------------------------------------------

T0 = datetime(2026, 12, 9, 12, 0, tzinfo=UTC)
PROMPTS = ("p1", "p2")


def _info(mode: str, top_k: int) -> RunInfo:
    """What `bench --temperature 0.8 --top-k K` records: the same everything but top_k."""
    return RunInfo(
        mode=mode, node_id="n", hostname="h", device="cpu", backend="torch", dtype="float32", target="t",
        drafter="d" if mode == "spec" else None, k_policy="fixed:4" if mode == "spec" else "none",
        temperature=0.8, workload="code", power_source="none", software_version="test", top_p=1.0,
        concurrency=1, kind="bench", top_k=top_k, seed=0, max_new_tokens=100,
    )  # fmt: skip


def _record_bench(engine, mode: str, top_k: int, e2e_ms: float, start: datetime) -> int:
    """One run of the two prompts, one after the other, 100 tokens each in `e2e_ms`."""
    with Recorder(engine, flush_interval_s=0.02) as rec:
        run_id = rec.start_run(_info(mode, top_k))
        for i, prompt in enumerate(PROMPTS):
            drafts = {"num_drafts": 25, "num_draft_tokens": 100, "num_accepted_tokens": 75} if mode == "spec" else {}
            rec.record_request(run_id, RequestRecord(
                started_at=start + timedelta(milliseconds=i * e2e_ms), domain="code", external_id=prompt,
                prompt_tokens=10, output_tokens=100, ttft_ms=10.0, e2e_ms=e2e_ms, temperature=0.8, top_p=1.0,
                **drafts))
        rec.end_run(run_id)
    return run_id


@pytest.fixture
def top_k_store(db_url):
    """top_k 0: spec no faster than AR (1.00x); top_k 40: spec 1.62x. Pooled, they would read 1.24x."""
    engine = open_store(db_url)
    ids = {}
    for n, (mode, top_k, e2e_ms) in enumerate(
            [("ar", 0, 1000.0), ("spec", 0, 1000.0), ("ar", 40, 1000.0), ("spec", 40, 1000.0 / 1.62)]):
        ids[(mode, top_k)] = _record_bench(engine, mode, top_k, e2e_ms, T0 + timedelta(minutes=n))
    yield engine, ids
    engine.dispose()


def test_runs_that_differ_in_top_k_are_two_configurations_and_two_speedups(top_k_store):
    engine, ids = top_k_store
    # first what the old key got wrong, in figures any version has: one 1.24x pooled from 1.00x and 1.62x
    assert sorted(s.speedup for s in speedups(engine)) == pytest.approx([1.00, 1.62], abs=1e-6)
    configs = config_summaries(engine)
    assert len(configs) == 4
    assert sorted((c.mode, c.top_k) for c in configs) == [("ar", 0), ("ar", 40), ("spec", 0), ("spec", 40)]
    assert {(c.mode, c.top_k): c.run_ids for c in configs} == {k: (v,) for k, v in ids.items()}
    assert all(c.top_p == 1.0 and c.temperature == 0.8 for c in configs)

    rows = {s.top_k: s for s in speedups(engine)}
    assert set(rows) == {0, 40}  # not one row pooling both
    assert rows[0].speedup == pytest.approx(1.00, abs=1e-6)
    assert rows[40].speedup == pytest.approx(1.62, abs=1e-6)
    assert (rows[40].spec_run_ids, rows[40].ar_run_ids) == ((ids[("spec", 40)],), (ids[("ar", 40)],))
    assert rows[40].label == "temperature 0.8, top_k 40, bench runs, the same 2 prompts"
    assert rows[0].label == "temperature 0.8, bench runs, the same 2 prompts"  # top_k 0: off, nothing cut

    comparison, chosen = comparable_group(configs)
    assert {c.top_k for c in chosen} == {comparison.top_k}  # spec and AR of one top_k only
    assert len(comparison.others) == 1 and comparison.as_dict()["top_k"] == comparison.top_k
    other = 40 if comparison.top_k == 0 else 0
    assert f"top_k {other}" in comparison.others[0]
    assert comparison.text().count("top_k 40") == 1  # named once: in the label or in the other group

    groups = run_groups(run_summaries(engine))
    assert groups == ["workload code, temperature 0.8, bench runs, top_k 0",
                      "workload code, temperature 0.8, top_k 40, bench runs"]

    # the projection sizes both modes within the chosen top_k: its spec capacity is that group's own
    sp = project_from_store(engine, daily_tokens=1e6, peak_factor=1.0, sla_ms=1e6, node_hourly_usd=1.0)
    assert sp.projection.capacity_tokens_per_s_spec / sp.projection.capacity_tokens_per_s_ar == pytest.approx(
        1.62 if comparison.top_k == 40 else 1.00, abs=1e-6)


def test_unknown_top_k_groups_only_with_unknown(sqlite_url):
    """Runs recorded before 0008 (top_k NULL) pool with each other, not with runs that recorded top_k 0."""
    engine = open_store(sqlite_url)
    with Session(engine) as s, s.begin():
        for top_k in (None, None, 0):
            make_run(s, "ar", temperature=0.8, top_k=top_k, requests=[Req(30, ttft_ms=10, e2e_ms=1000)])
    configs = config_summaries(engine)
    assert sorted((c.top_k is None, len(c.run_ids)) for c in configs) == [(False, 1), (True, 2)]
    assert run_groups(run_summaries(engine)) == ["workload code, temperature 0.8, top_k unknown, bench runs",
                                                 "workload code, temperature 0.8, bench runs, top_k 0"]


def test_at_temperature_0_cut_offs_change_nothing_so_they_split_nothing(sqlite_url):
    """Greedy decoding takes the argmax whatever top_p / top_k say: a greedy AR run recorded before 0008 (top_k
    unknown) and a greedy spec run recorded with top_k 0 (or top_p 0.9) are one comparable group and one
    speedup, as an upgraded store's old baseline must stay comparable with new runs."""
    engine = open_store(sqlite_url)
    with Session(engine) as s, s.begin():
        make_run(s, "ar", temperature=0.0, top_k=None, requests=[Req(30, ttft_ms=10, e2e_ms=1000)])
        make_run(s, "spec", temperature=0.0, top_k=0, top_p=0.9, requests=[spec_req(30, 4, 20, ttft_ms=10, e2e_ms=500)])
        make_run(s, "ar", temperature=0.8, top_k=None, requests=[Req(30, ttft_ms=10, e2e_ms=1000)])
        make_run(s, "ar", temperature=0.8, top_k=0, requests=[Req(30, ttft_ms=10, e2e_ms=1000)])
    greedy = [sp for sp in speedups(engine) if sp.temperature == 0]
    assert len(greedy) == 1 and greedy[0].speedup == pytest.approx(2.0, rel=1e-6)
    assert (greedy[0].top_p, greedy[0].top_k) == (1.0, 0)
    configs = config_summaries(engine)
    assert sorted((c.temperature, c.mode, c.top_k) for c in configs if c.temperature == 0) == [
        (0.0, "ar", 0), (0.0, "spec", 0)]
    # sampled runs still keep unknown apart from off
    assert sorted(c.top_k is None for c in configs if c.temperature == 0.8) == [False, True]
    assert run_groups(run_summaries(engine)) == ["workload code, temperature 0, bench runs",
                                                 "workload code, temperature 0.8, top_k unknown, bench runs",
                                                 "workload code, temperature 0.8, bench runs, top_k 0"]


def test_a_sweep_of_two_top_ks_is_refused_naming_them(sqlite_url):
    engine = open_store(sqlite_url)
    with Session(engine) as s, s.begin():
        ids = [make_run(s, mode, temperature=0.8, top_k=k, requests=[req]).id
               for k in (0, 40) for mode, req in (("ar", Req(30, ttft_ms=10, e2e_ms=1000)),
                                                  ("spec", spec_req(30, 4, 20, ttft_ms=10, e2e_ms=600)))]
    with pytest.raises(ValueError, match=r"2 groups \(top_k 0; top_k 40\)"):
        sweep_points(engine, ids)


# ---- (c) what each path records ----------------------------------------------------------------------------


def _stored(engine, run_id: int) -> tuple:
    with engine.connect() as conn:
        return tuple(conn.execute(text(
            f"SELECT temperature, top_p, top_k, seed, max_new_tokens FROM runs WHERE id = {run_id}")).one())


def _record_run(engine, info: RunInfo) -> int:
    with Recorder(engine) as rec:
        run_id = rec.start_run(info)
        rec.end_run(run_id)
    return run_id


def test_worker_run_info_records_the_sampling_used_and_a_server_none(db_url):
    from serving.sampling import SamplingParams
    from serving.worker import run_info

    loaded = SimpleNamespace(spec=SimpleNamespace(dtype="test-dtype"), target_dir="/models/t", drafter_label="d")
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.9, max_new_tokens=64, seed=2**40 + 3)
    engine = open_store(db_url)
    try:
        bench = run_info(loaded, "spec", workload="code", params=params, node_id="n", power_source="none",
                         concurrency=1, k_policy="fixed:4")
        assert (bench.top_k, bench.seed, bench.max_new_tokens) == (40, 2**40 + 3, 64)
        assert _stored(engine, _record_run(engine, bench)) == (0.7, 0.9, 40, 2**40 + 3, 64)
        # a seed the engine takes but BIGINT cannot hold is unknown, not a wrapped number
        wide = run_info(loaded, "ar", workload="code", params=SamplingParams(seed=2**64 - 1), node_id="n",
                        power_source="none", concurrency=1, k_policy="none")
        assert _stored(engine, _record_run(engine, wide)) == (0.0, 1.0, 0, None, 128)
        serve = run_info(loaded, "spec", workload="serve", params=None, node_id="n", power_source="none",
                         concurrency=8, kind="serve", k_policy="auto")
        assert _stored(engine, _record_run(engine, serve)) == (None, None, None, None, None)
    finally:
        engine.dispose()


def test_loadtest_and_vllm_run_infos_record_their_sampling():
    from serving.loadtest import loadtest_run_info
    from serving.sampling import SamplingParams
    from serving.vllm_backend import run_info as vllm_run_info

    card = {"id": "m", "root": "/models/t", "specfinops": {"backend": "torch", "dtype": "float32"}}
    info = loadtest_run_info(card, "ar", 4, "code", 0.5, "n", max_tokens=48)
    # the load test sends temperature and max_tokens only: top_p and top_k off, no seed
    assert (info.temperature, info.top_p, info.top_k, info.seed, info.max_new_tokens) == (0.5, 1.0, 0, None, 48)

    cfg = SimpleNamespace(tensor_parallel_size=1, gpus=1, engine_args={}, dtype="bfloat16", target="t", drafter_label=None)
    engine = SimpleNamespace(config=cfg, mode="ar", k_policy="none", vllm=SimpleNamespace(__version__="0"))
    info = vllm_run_info(engine, workload="code", params=SamplingParams(top_k=5, max_new_tokens=32, seed=9),
                         node_id="n", power_source="none", concurrency=2)
    assert (info.top_k, info.seed, info.max_new_tokens) == (5, 9, 32)


def test_requests_csv_shows_the_runs_sampling_and_unknown_as_empty(sqlite_url):
    engine = open_store(sqlite_url)
    with Session(engine) as s, s.begin():
        make_run(s, "ar", top_k=None, requests=[Req(30, ttft_ms=10, e2e_ms=1000)])  # recorded before 0008: unknown
        make_run(s, "ar", top_k=40, seed=7, max_new_tokens=64, requests=[Req(30, ttft_ms=10, e2e_ms=1000)])
    header, rows = export_rows(engine, "requests", ExportWindow())
    got = [dict(zip(header, row, strict=True)) for row in rows]
    assert [(r["top_k"], r["seed"], r["max_new_tokens"]) for r in got] == [(None, None, None), (40, 7, 64)]


def test_runs_page_lists_the_sampling_and_a_dash_where_unknown(sqlite_url, monkeypatch):
    from test_dashboard_apptest import PAGES, app_for, assert_clean, open_page

    engine = open_store(sqlite_url)
    with Session(engine) as s, s.begin():
        make_run(s, "ar", temperature=0.8, top_k=None, requests=[Req(30, ttft_ms=10, e2e_ms=1000)])  # before 0008: unknown
        make_run(s, "spec", temperature=0.8, top_k=40, seed=2**62 + 1, max_new_tokens=64,
                 requests=[spec_req(30, 4, 20, ttft_ms=10, e2e_ms=600)])
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Runs"])
    assert_clean(at)
    runs = at.dataframe[0].value.set_index("run")
    assert runs.loc[2, ["top_k", "seed", "max new tokens"]].tolist() == [40, str(2**62 + 1), 64]  # every digit
    assert runs.loc[1, ["top_k", "seed", "max new tokens"]].isna().all()  # missing (a dash), not 0
    compare = at.dataframe[1].value.set_index("figure")
    assert compare.loc[["top_k", "seed", "max new tokens"]].to_dict("list") == {
        "run #2": ["40", str(2**62 + 1), "64"], "run #1": ["—", "—", "—"]}

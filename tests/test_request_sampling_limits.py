"""A request's own top_k, seed and max_new_tokens (migration 0010): a server's requests each choose their
sampling, so each request records what it ran with; bench requests record their run's. NULL where unknown
(requests recorded before 0010) or unset (no seed asked for), never a guessed value."""

from __future__ import annotations

from datetime import UTC, datetime

from alembic import command
from sqlalchemy import create_engine, inspect, text

from telemetry.export import ExportWindow, export_rows
from telemetry.recorder import Recorder
from telemetry.records import RequestRecord, RunInfo
from telemetry.store import alembic_config, open_store

NEW_COLUMNS = {"top_k", "seed", "max_new_tokens"}
OLD_RUN = (
    "INSERT INTO runs (id, kind, mode, node_id, hostname, device, backend, dtype, target, k_policy, temperature, "
    "top_p, concurrency, workload, power_source, software_version, started_at, status, dropped_records, top_k, "
    "seed, max_new_tokens) VALUES (1, 'bench', 'spec', 'n', 'h', 'cpu', 'torch', 'bfloat16', 't', 'fixed:4', 0.8, "
    "1, 1, 'code', 'none', 'v', '2026-12-02 00:00:00', 'completed', 0, 40, 3, 128)"
)
OLD_CHILDREN = (
    "INSERT INTO requests (id, run_id, domain, started_at, prompt_tokens, output_tokens, num_drafts, "
    "num_draft_tokens, num_accepted_tokens, status) VALUES (1, 1, 'code', '2026-12-02 00:00:00', 5, 9, 2, 8, 6, 'ok')",
    "INSERT INTO steps (id, request_id, step_index, k, accepted, num_emitted, draft_ms, verify_ms, batch_size, "
    "t_offset_ms) VALUES (1, 1, 0, 4, 3, 4, 1.0, 20.0, 1, 21.0)",
    "INSERT INTO token_events (id, request_id, position, emit_offset_ms, step_index, source) "
    "VALUES (1, 1, 0, 21.0, 0, 'accepted')",
)


def _engine(url: str):
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def _request_columns(engine) -> set[str]:
    return {c["name"] for c in inspect(engine).get_columns("requests")}


def test_0010_adds_the_columns_keeps_old_requests_unknown_and_downgrades(db_url):
    cfg = alembic_config(db_url)
    command.upgrade(cfg, "0009")
    engine = _engine(db_url)
    try:
        assert not NEW_COLUMNS & _request_columns(engine)
        with engine.begin() as conn:
            for sql in (OLD_RUN, *OLD_CHILDREN):
                conn.execute(text(sql))
        command.upgrade(cfg, "0010")
        assert NEW_COLUMNS <= _request_columns(engine)
        with engine.begin() as conn:
            assert tuple(conn.execute(text("SELECT top_k, seed, max_new_tokens FROM requests")).one()) == (
                None, None, None)  # unknown, not a guessed value
            conn.execute(text("UPDATE requests SET top_k = 5, seed = :s, max_new_tokens = 16"), {"s": 2**63 - 1})
            assert tuple(conn.execute(text("SELECT top_k, seed, max_new_tokens FROM requests")).one()) == (
                5, 2**63 - 1, 16)
        command.downgrade(cfg, "0009")
        assert not NEW_COLUMNS & _request_columns(engine)
        with engine.connect() as conn:  # no step or token event lost to the rebuild of requests (SQLite's cascade)
            counts = [conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar_one()
                      for t in ("runs", "requests", "steps", "token_events")]
            assert counts == [1, 1, 1, 1]
        command.upgrade(cfg, "head")
        with engine.connect() as conn:
            assert tuple(conn.execute(text("SELECT top_k, seed, max_new_tokens FROM requests")).one()) == (
                None, None, None)  # what the downgrade dropped stays unknown
        command.check(cfg)
    finally:
        engine.dispose()


def _serve_run() -> RunInfo:
    """A server's run: no one sampling of its own (its requests choose theirs)."""
    return RunInfo(mode="spec", node_id="n", hostname="h", device="cpu", backend="torch", dtype="float32", target="t",
                   drafter="d", k_policy="fixed:4", temperature=None, workload="serve", power_source="none",
                   software_version="test", top_p=None, concurrency=8, kind="serve")


def test_requests_record_their_own_limits_and_the_csv_prefers_them_to_the_run(db_url):
    engine = open_store(db_url)
    t0 = datetime(2026, 12, 9, 12, 0, tzinfo=UTC)
    asked = {  # external id -> (top_k, seed, max_new_tokens) as the request ran
        "cut": (40, 7, 16),
        "open": (0, None, 256),  # no seed asked for: NULL, not 0
        "wide-seed": (0, 2**64 - 1, 4),  # the engine takes it; the column cannot hold it: unknown
        "neg-seed": (0, -(2**63), 4),
    }
    try:
        with Recorder(engine, flush_interval_s=0.02) as rec:
            run_id = rec.start_run(_serve_run())
            for ext, (top_k, seed, cap) in asked.items():
                rec.record_request(run_id, RequestRecord(
                    started_at=t0, domain="completion", external_id=ext, prompt_tokens=3, output_tokens=4,
                    ttft_ms=5.0, e2e_ms=20.0, temperature=0.7, top_p=0.9, top_k=top_k, seed=seed,
                    max_new_tokens=cap))
            rec.end_run(run_id)
        with engine.connect() as conn:
            stored = {r.external_id: (r.top_k, r.seed, r.max_new_tokens) for r in conn.execute(text(
                "SELECT external_id, top_k, seed, max_new_tokens FROM requests"))}
        assert stored == asked | {"wide-seed": (0, None, 4)}

        header, rows = export_rows(engine, "requests", ExportWindow(run_id=run_id))
        cols = [header.index(c) for c in ("external_id", "top_k", "seed", "max_new_tokens")]
        csv = {row[cols[0]]: tuple(row[i] for i in cols[1:]) for row in rows}
        assert csv == stored  # a server run has none of its own: each request's own
    finally:
        engine.dispose()


def test_the_csv_falls_back_to_the_run_for_requests_recorded_before_0010(db_url):
    """A bench request recorded before 0010 has no limits of its own; its run's (0008) are what it ran with."""
    cfg = alembic_config(db_url)
    command.upgrade(cfg, "0009")
    engine = _engine(db_url)
    try:
        with engine.begin() as conn:
            for sql in (OLD_RUN, OLD_CHILDREN[0]):
                conn.execute(text(sql))
        command.upgrade(cfg, "head")
        header, rows = export_rows(engine, "requests", ExportWindow())
        (row,) = list(rows)
        assert tuple(row[header.index(c)] for c in ("top_k", "seed", "max_new_tokens")) == (40, 3, 128)
    finally:
        engine.dispose()

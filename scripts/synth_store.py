"""Synthetic store generator for dashboard benchmarks: millions of token events in minutes.

Everything it writes is marked synthetic — workload 'synthetic', hostname 'synthetic-generator',
software_version 'synthetic', request external ids 'synthetic-*' — and the dashboard shows a banner
whenever such runs are in view. These rows are never measurements.

    python -m scripts.synth_store --db sqlite:///var/bench/synthetic.db --token-events 5000000

Rows go in through Core `insert()` executemany in big chunks with explicit ids (no RETURNING round trips).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import Connection, Engine

from telemetry.db import PowerSample, Request, Run, Step, TokenEvent
from telemetry.prices import load_catalog, price_snapshot
from telemetry.store import open_store

SYNTHETIC_WORKLOAD = "synthetic"
SYNTHETIC_HOSTNAME = "synthetic-generator"
DOMAINS = {"code": 0.82, "chat": 0.63, "math": 0.72, "summarization": 0.55}  # domain -> synthetic alpha
MODEL_PAIRS = [("synthetic/target-8b", "synthetic/draft-1b"), ("synthetic/target-70b", "synthetic/draft-8b")]
NODES = ["synthetic-node-a", "synthetic-node-b"]
# One GPU per synthetic node: each run records this device and the price snapshot the recorder would take for it
# (the catalog's one-GPU entry, `prices.price_snapshot`), so costs price what was "measured" and keep its energy
# (a whole-node price such as "H100 x8" on a one-GPU device is other hardware: its energy is left out).
DEVICE = "NVIDIA H100 80GB HBM3"
CHUNK = 200_000


def count_token_events(engine: Engine) -> int:
    with engine.connect() as c:
        return int(c.scalar(select(func.count()).select_from(TokenEvent)) or 0)


class _Buffers:
    """Rows waiting for the next executemany; flushed in parent-before-child order."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.requests: list[dict] = []
        self.steps: list[dict] = []
        self.tokens: list[dict] = []

    def maybe_flush(self) -> None:
        if len(self.tokens) >= CHUNK or len(self.steps) >= CHUNK:
            self.flush()

    def flush(self) -> None:
        for table, rows in ((Request.__table__, self.requests), (Step.__table__, self.steps), (TokenEvent.__table__, self.tokens)):
            if rows:
                self.conn.execute(insert(table), rows)
                rows.clear()


def _request_rows(buf: _Buffers, rng: random.Random, ids: dict, run_id: int, mode: str, domain: str,
                  started: datetime, k: int) -> tuple[int, float]:
    """One synthetic request with its steps and token events; returns (tokens, e2e_ms)."""
    rid = ids["request"] = ids["request"] + 1
    alpha = DOMAINS[domain]
    n_out = rng.randint(120, 280)
    ttft = rng.gauss(180.0, 40.0) if mode == "spec" else rng.gauss(160.0, 35.0)
    ttft = max(ttft, 20.0)
    t = ttft
    tokens = [(0, ttft, -1, "ar" if mode == "ar" else "bonus")]
    num_drafts = num_draft = num_acc = 0
    step_index = 0
    while len(tokens) < n_out:
        if mode == "spec":
            kk = k if k > 0 else rng.randint(2, 6)
            acc = 0
            while acc < kk and rng.random() < alpha:
                acc += 1
            draft_ms, verify_ms = kk * rng.uniform(1.2, 1.8), rng.uniform(30.0, 42.0)
            emitted = min(acc + 1, n_out - len(tokens))
            num_drafts += 1
            num_draft += kk
            num_acc += min(acc, emitted)
            sources = ["accepted"] * min(acc, emitted) + (["bonus" if acc == kk else "correction"] if emitted > acc else [])
        else:
            kk, acc, emitted = 0, 0, 1
            draft_ms, verify_ms = 0.0, rng.uniform(30.0, 40.0)
            sources = ["ar"]
        t += draft_ms + verify_ms
        ids["step"] += 1
        buf.steps.append({"id": ids["step"], "request_id": rid, "step_index": step_index, "k": kk, "accepted": acc,
                          "num_emitted": emitted, "draft_ms": draft_ms, "verify_ms": verify_ms, "batch_size": 8,
                          "k_reason": "synthetic", "t_offset_ms": t})
        for src in sources:
            tokens.append((len(tokens), t, step_index, src))
        step_index += 1
    for pos, off, si, src in tokens:
        ids["token"] += 1
        buf.tokens.append({"id": ids["token"], "request_id": rid, "position": pos, "emit_offset_ms": off,
                           "step_index": si, "source": src})
    buf.requests.append({
        "id": rid, "run_id": run_id, "external_id": f"synthetic-{rid}", "domain": domain, "started_at": started,
        "prompt_tokens": rng.randint(50, 800), "output_tokens": len(tokens), "num_drafts": num_drafts,
        "num_draft_tokens": num_draft, "num_accepted_tokens": num_acc, "ttft_ms": ttft, "e2e_ms": t,
        "energy_j": t / 1000.0 * 700.0 / 8, "status": "ok", "error": None,
    })
    return len(tokens), t


def generate(engine: Engine, token_events: int, seed: int = 7, days: int = 14, log=print) -> dict:
    """Fill `engine` with synthetic spec/AR run pairs until `token_events` token events exist."""
    rng = random.Random(seed)
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(days=days)
    with engine.connect() as c:
        ids = {
            "run": int(c.scalar(select(func.max(Run.id))) or 0),
            "request": int(c.scalar(select(func.max(Request.id))) or 0),
            "step": int(c.scalar(select(func.max(Step.id))) or 0),
            "token": int(c.scalar(select(func.max(TokenEvent.id))) or 0),
            "power": int(c.scalar(select(func.max(PowerSample.id))) or 0),
        }
    have = count_token_events(engine)
    catalog = load_catalog(engine)
    runs_planned = 48  # 24 spec/AR pairs spread over `days`
    per_run = max(1, (token_events - have) // runs_planned)
    made = {"runs": 0, "requests": 0, "token_events": 0}
    t0 = time.perf_counter()
    with engine.begin() as conn:
        buf = _Buffers(conn)
        for pair in range(runs_planned // 2):
            target, drafter = MODEL_PAIRS[pair % len(MODEL_PAIRS)]
            node = NODES[pair % len(NODES)]
            run_start = start + timedelta(seconds=(pair + rng.random() * 0.5) * days * 86_400 / (runs_planned // 2))
            power_source = "estimate" if pair % 3 == 2 else "nvml"
            for mode in ("spec", "ar"):
                ids["run"] += 1
                run_id = ids["run"]
                k = 4 if pair % 2 == 0 else 0  # fixed:4, or "auto" (K varies per step)
                conn.execute(insert(Run.__table__), [{
                    "id": run_id, "kind": "bench", "mode": mode, "node_id": node, "hostname": SYNTHETIC_HOSTNAME,
                    "device": DEVICE, "backend": "torch", "dtype": "bfloat16", "target": target,
                    "drafter": drafter if mode == "spec" else None,
                    "k_policy": ("fixed:4" if k else "auto") if mode == "spec" else "none",
                    "temperature": 0.0, "top_p": 1.0, "concurrency": 8, "workload": SYNTHETIC_WORKLOAD,
                    "power_source": power_source, "software_version": "synthetic",
                    "price_snapshot": price_snapshot(catalog, DEVICE, taken_at=run_start),
                    "started_at": run_start, "ended_at": None, "status": "completed", "dropped_records": 0,
                }])
                tokens = 0
                clock = run_start
                domains = list(DOMAINS)
                while tokens < per_run:
                    n, e2e = _request_rows(buf, rng, ids, run_id, mode, rng.choice(domains), clock, k)
                    tokens += n
                    clock += timedelta(milliseconds=e2e / 8)  # 8 concurrent streams
                    made["requests"] += 1
                    buf.maybe_flush()
                made["token_events"] += tokens
                made["runs"] += 1
                power = []
                t = run_start
                while t <= clock:
                    ids["power"] += 1  # the one GPU of DEVICE
                    watts = rng.gauss(620.0 if mode == "spec" else 580.0, 25.0)
                    power.append({"id": ids["power"], "run_id": run_id, "t": t, "device_index": 0,
                                  "power_w": watts, "energy_mj": None, "utilization_pct": rng.uniform(70, 99),
                                  "source": power_source if power_source != "none" else "estimate"})
                    t += timedelta(seconds=5)
                buf.flush()
                conn.execute(insert(PowerSample.__table__), power)
                conn.execute(Run.__table__.update().where(Run.__table__.c.id == run_id).values(ended_at=clock))
                log(f"synthetic run {run_id} ({mode}, {node}): {tokens:,} token events, "
                    f"{made['token_events']:,} in total, {time.perf_counter() - t0:.0f} s")
        buf.flush()
        _advance_sequences(conn)
    _analyze(engine)
    return made


def _advance_sequences(conn: Connection) -> None:
    """PostgreSQL: each table's id sequence past the ids inserted by hand, so the next bench, load test or server
    on the store gets a free id (it failed with a duplicate key on pk_runs, id 1). SQLite needs nothing."""
    if conn.dialect.name != "postgresql":
        return
    for table in (Run.__table__, Request.__table__, Step.__table__, TokenEvent.__table__, PowerSample.__table__):
        conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                          f"GREATEST((SELECT max(id) FROM {table.name}), 1))"))


def _analyze(engine: Engine) -> None:
    """PostgreSQL: statistics for the tables just filled. Autovacuum analyses them only some time after the bulk
    load; until then the planner takes each for a few pages, and the first queries measured chose plans for empty
    tables (an export of one run's token events read the whole table in id order: 21 s, 1.8 s once analysed).
    SQLite is left as a recorded store is (no ANALYZE: sqlite_stat1 would change the plans measured)."""
    if engine.dialect.name != "postgresql":
        return
    with engine.begin() as conn:
        for table in (Run.__table__, Request.__table__, Step.__table__, TokenEvent.__table__, PowerSample.__table__):
            conn.execute(text(f"ANALYZE {table.name}"))


def ensure_synthetic_store(url: str, token_events: int, log=print) -> Engine:
    """Reuse the store at `url` when it already holds >= `token_events` token events, else fill it."""
    engine = open_store(url)
    have = count_token_events(engine)
    if have >= token_events:
        log(f"reusing {url}: {have:,} token events")
        return engine
    generate(engine, token_events, log=log)
    return engine


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", default="sqlite:///var/bench/synthetic.db")
    p.add_argument("--token-events", type=int, default=5_000_000)
    args = p.parse_args(argv)
    ensure_synthetic_store(args.db, args.token_events)
    return 0


if __name__ == "__main__":
    sys.exit(main())

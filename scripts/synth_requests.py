"""Synthetic store of many requests (no token events or steps) for timing the run, mode and configuration
summaries: `scripts.synth_store` writes ~200 token events a request, so a store of 1M requests from it would
hold 200M token events; this one writes only runs and requests.

Marked synthetic like `scripts.synth_store` (workload 'synthetic', hostname 'synthetic-generator', software
version 'synthetic', external ids 'synthetic-*'). Each run serves its requests 8 at a time over 4 domains; 2%
fail (no times), 1% are one-token outputs.

    python -m scripts.synth_requests --db sqlite:///var/bench/requests-1m.db --requests 1000000
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, insert, select

from scripts.synth_store import DEVICE, DOMAINS, MODEL_PAIRS, NODES, SYNTHETIC_HOSTNAME, SYNTHETIC_WORKLOAD
from telemetry.db import Request, Run
from telemetry.prices import load_catalog, price_snapshot
from telemetry.store import open_store

CHUNK = 50_000


def _run_row(run_id: int, pair: int, mode: str, started: datetime, snapshot: dict | None) -> dict:
    target, drafter = MODEL_PAIRS[pair % len(MODEL_PAIRS)]
    return {
        "id": run_id, "kind": "bench", "mode": mode, "node_id": NODES[pair % len(NODES)],
        "hostname": SYNTHETIC_HOSTNAME, "device": DEVICE, "backend": "torch", "dtype": "bfloat16",
        "target": target, "drafter": drafter if mode == "spec" else None,
        "k_policy": "fixed:4" if mode == "spec" else "none", "temperature": 0.0, "top_p": 1.0,
        "concurrency": 8, "workload": SYNTHETIC_WORKLOAD, "power_source": "estimate" if pair % 3 == 2 else "nvml",
        # what the recorder takes for the device (synth_store's rule): a whole-node "H100 x8" price on a one-GPU
        # device is other hardware, and every run's energy was left out of its cost
        "software_version": "synthetic", "price_snapshot": snapshot,
        "started_at": started, "ended_at": None, "status": "completed", "dropped_records": 0,
    }


def generate(url: str, num_requests: int, num_runs: int = 48, seed: int = 11, log=print) -> None:
    rng = random.Random(seed)
    engine = open_store(url)
    with engine.connect() as c:
        if c.scalar(select(func.count()).select_from(Request)):
            raise SystemExit(f"{url} already holds requests: give a new store")
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(days=14)
    per_run = num_requests // num_runs
    rid, t0 = 0, time.perf_counter()
    domains = list(DOMAINS)
    catalog = load_catalog(engine)
    with engine.begin() as conn:
        rows: list[dict] = []
        for run_id in range(1, num_runs + 1):
            pair, mode = (run_id - 1) // 2, ("spec", "ar")[(run_id - 1) % 2]
            run_start = start + timedelta(hours=run_id * 6, microseconds=rng.randint(0, 999_999))
            conn.execute(insert(Run.__table__),
                         [_run_row(run_id, pair, mode, run_start, price_snapshot(catalog, DEVICE, taken_at=run_start))])
            clock, last_end = run_start, run_start
            for _ in range(per_run):
                rid += 1
                ok = rng.random() >= 0.02
                out = 1 if rng.random() < 0.01 else rng.randint(20, 400)
                ttft = max(5.0, rng.gauss(180.0 if mode == "spec" else 160.0, 40.0))
                tpot = rng.gauss(14.0 if mode == "spec" else 24.0, 3.0)
                e2e = ttft + max(0.0, tpot) * (out - 1)
                rows.append({
                    "id": rid, "run_id": run_id, "external_id": f"synthetic-{rid}", "domain": rng.choice(domains),
                    "started_at": clock, "prompt_tokens": rng.randint(50, 800), "output_tokens": out if ok else 0,
                    "num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                    "ttft_ms": ttft if ok else None, "e2e_ms": e2e if ok else None,
                    "energy_j": e2e / 1000.0 * 700.0 / 8 if ok else None, "status": "ok" if ok else "error",
                    "error": None if ok else "synthetic failure",
                })
                if ok:
                    last_end = max(last_end, clock + timedelta(milliseconds=e2e))
                clock += timedelta(microseconds=rng.randint(0, int(e2e * 1000 / 8) if ok else 1000))
                if len(rows) >= CHUNK:
                    conn.execute(insert(Request.__table__), rows)
                    rows.clear()
            conn.execute(Run.__table__.update().where(Run.__table__.c.id == run_id).values(ended_at=last_end))
            log(f"synthetic run {run_id}/{num_runs} ({mode}): {rid:,} requests, {time.perf_counter() - t0:.0f} s")
        if rows:
            conn.execute(insert(Request.__table__), rows)
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.exec_driver_sql("ANALYZE")  # a bulk load leaves no statistics (docs/benchmarks.md)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True, help="a new store (SQLite path or URL, or a PostgreSQL URL)")
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=48)
    args = p.parse_args(argv)
    generate(args.db, args.requests, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

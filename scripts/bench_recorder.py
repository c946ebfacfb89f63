"""Recorder throughput: token events per second written into SQLite and PostgreSQL.

Synthetic speculative requests (labelled as such in the run row) are built first, then enqueued as fast
as the caller can; the clock stops when the writer has committed everything. PostgreSQL uses a scratch
database created on the server in $SPECFINOPS_BENCH_PG_ADMIN (default postgres@127.0.0.1:5432/test) and
dropped afterwards; when no server answers it is skipped with the reason printed.

    .venv/bin/python -m scripts.bench_recorder [--requests 2000] [--tokens 256]
Writes bench-results/recorder.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, func, select, text

from telemetry.db import TokenEvent
from telemetry.recorder import Recorder
from telemetry.records import RunInfo
from telemetry.store import open_store
from telemetry.synthetic import synthetic_request

RESULT_PATH = Path("bench-results") / "recorder.json"
PG_ADMIN_URL = os.environ.get("SPECFINOPS_BENCH_PG_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def run_info() -> RunInfo:
    return RunInfo(
        mode="spec", node_id="bench", hostname=platform.node(), device="cpu", backend="none", dtype="none",
        target="synthetic", drafter="synthetic", k_policy="fixed:4", temperature=0.0,
        workload="synthetic recorder benchmark", power_source="none", software_version="bench", kind="bench",
    )  # fmt: skip


def measure(url: str, num_requests: int, num_tokens: int) -> dict:
    rng = random.Random(0)
    records = [synthetic_request(rng, num_tokens) for _ in range(num_requests)]
    expected = sum(r.output_tokens for r in records)
    engine = open_store(url)
    try:
        with Recorder(engine, max_buffered_requests=num_requests + 1) as rec:
            run_id = rec.start_run(run_info())
            t0 = time.perf_counter()
            for r in records:
                rec.record_request(run_id, r)
            t_enqueued = time.perf_counter()
            rec.end_run(run_id, timeout_s=600)
            t1 = time.perf_counter()
        with engine.connect() as c:
            n = c.execute(select(func.count()).select_from(TokenEvent)).scalar()
        if n != expected:
            raise RuntimeError(f"{url}: wrote {n} token events, expected {expected}")
    finally:
        engine.dispose()
    elapsed = t1 - t0
    return {
        "requests": num_requests,
        "token_events": expected,
        "seconds": round(elapsed, 3),
        "token_events_per_s": round(expected / elapsed),
        "enqueue_us_per_request": round((t_enqueued - t0) / num_requests * 1e6, 2),
    }


def _pg_scratch() -> tuple[str, object] | str:
    try:
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            name = f"specfinops_bench_{uuid.uuid4().hex[:8]}"
            c.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # noqa: BLE001 - any failure means: no usable server
        return f"PostgreSQL not reachable at {PG_ADMIN_URL}: {type(exc).__name__}: {exc}".splitlines()[0]
    return f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}", (admin, name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per request")
    args = ap.parse_args(argv)
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}

    with tempfile.TemporaryDirectory() as tmp:
        res = measure(f"sqlite:///{tmp}/bench.db", args.requests, args.tokens)
    results["sqlite"] = res
    print(f"recorder -> SQLite:     {res['token_events_per_s']:>10,} token events/s "
          f"({res['token_events']:,} in {res['seconds']} s; enqueue {res['enqueue_us_per_request']} us/request)")  # fmt: skip

    scratch = _pg_scratch()
    if isinstance(scratch, str):
        results["postgresql"] = {"skipped": scratch}
        print(f"recorder -> PostgreSQL: skipped ({scratch})")
    else:
        url, (admin, name) = scratch
        try:
            res = measure(url, args.requests, args.tokens)
        finally:
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()
        results["postgresql"] = res
        print(f"recorder -> PostgreSQL: {res['token_events_per_s']:>10,} token events/s "
              f"({res['token_events']:,} in {res['seconds']} s; enqueue {res['enqueue_us_per_request']} us/request)")  # fmt: skip

    RESULT_PATH.parent.mkdir(parents=True, exist_ok=True)
    RESULT_PATH.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULT_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

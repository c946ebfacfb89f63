"""Dashboard query benchmark: every page's queries against a store with 5 million token events.

    python -m scripts.bench_dashboard [--db sqlite:///var/bench/synthetic.db] [--token-events 5000000]

Generates (or reuses) a synthetic store (scripts/synth_store.py: runs marked workload 'synthetic', host
'synthetic-generator'), then calls each page's data functions directly — the uncached
`telemetry.queries` / `app.dashboard.page_queries` functions, exactly as the page calls them — and
prints seconds per page: the first (cold) round and the median of the later rounds. Goal: each page
under 2 s. Writes bench-results/dashboard.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import inspect
from sqlalchemy.engine import Engine

from app.dashboard import assumptions
from app.dashboard import page_queries as pq
from app.dashboard.filters import data_span_s
from scripts.synth_store import count_token_events, ensure_synthetic_store
from telemetry import costing, prices, queries
from telemetry.queries import Filters

GOAL_S = 2.0
RESULTS = Path("bench-results") / "dashboard.json"
# Indexes the page queries rely on (table -> index names from telemetry/db.py).
REQUIRED_INDEXES = {
    "requests": {"ix_requests_run_id", "ix_requests_started_at"},
    "steps": {"ix_steps_request_id_step_index"},
    "token_events": {"ix_token_events_request_id_position"},
    "power_samples": {"ix_power_samples_run_id_t"},
}


def missing_indexes(engine: Engine) -> list[str]:
    insp = inspect(engine)
    missing = []
    for table, names in REQUIRED_INDEXES.items():
        have = {ix["name"] for ix in insp.get_indexes(table)}
        missing += [f"{table}.{n}" for n in sorted(names - have)]
    return missing


def page_work(engine: Engine, f: Filters) -> dict[str, Callable[[], object]]:
    """What each page fetches, as the page fetches it (sidebar options included on every page)."""

    def sidebar():
        pq.count_runs(engine)
        opts = pq.filter_options(engine)
        return pq.nice_bucket_s(data_span_s(opts["runs"], f.since, f.until))

    def overview():
        sidebar()
        queries.mode_summaries(engine, f)
        costing.costs(engine, f)
        queries.speedups(engine, f)
        costing.project_from_store(engine, f, **assumptions.DEFAULTS)

    def latency():
        bucket = sidebar()
        hists = pq.latency_histograms(engine, f)
        itl = pq.itl_histogram(engine, f)
        pq.latency_percentiles(engine, f, hists)  # the exact TTFT and TPOT percentiles the page's table shows
        pq.histogram_percentiles(itl.frame, "itl_ms")
        pq.latency_over_time(engine, f, bucket)

    def speculation():
        bucket = sidebar()
        queries.acceptance_by_domain(engine, f)
        pq.acceptance_over_time(engine, f, bucket)
        pq.acceptance_by_position(engine, f)
        pq.acceptance_along_answer(engine, f)

    def energy():
        bucket = sidebar()
        queries.mode_summaries(engine, f)
        pq.power_over_time(engine, f, bucket)

    def cost():
        sidebar()
        costing.costs(engine, f)
        prices.list_prices(engine)
        costing.project_from_store(engine, f, **assumptions.DEFAULTS)

    def runs():
        sidebar()
        queries.run_summaries(engine, f)

    return {"overview": overview, "latency": latency, "speculation": speculation, "energy": energy,
            "cost": cost, "runs": runs}


def time_pages(engine: Engine, f: Filters, rounds: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, work in page_work(engine, f).items():
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            work()
            times.append(time.perf_counter() - t0)
        out[name] = {"cold_s": round(times[0], 3),
                     "warm_median_s": round(statistics.median(times[1:] or times), 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", default="sqlite:///var/bench/synthetic.db")
    p.add_argument("--token-events", type=int, default=5_000_000)
    p.add_argument("--rounds", type=int, default=3, help="rounds per page (first = cold)")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)

    engine = ensure_synthetic_store(args.db, args.token_events)
    n_tokens = count_token_events(engine)
    missing = missing_indexes(engine)
    if missing:
        print(f"WARNING: missing indexes: {', '.join(missing)}", file=sys.stderr)
    one_run = Filters(run_ids=(1, 2))
    scenarios = {"all runs": Filters(), "one spec/AR pair": one_run}
    results = {}
    for label, f in scenarios.items():
        results[label] = time_pages(engine, f, args.rounds)
        print(f"\n{label} ({n_tokens:,} token events in the store)")
        print(f"{'page':<12} {'cold s':>8} {'warm s':>8}  goal < {GOAL_S:g} s")
        for page, t in results[label].items():
            flag = "ok" if max(t.values()) < GOAL_S else "SLOW"
            print(f"{page:<12} {t['cold_s']:>8.3f} {t['warm_median_s']:>8.3f}  {flag}")
    worst = max(max(t.values()) for r in results.values() for t in r.values())
    report = {
        "benchmark": "dashboard page queries (uncached)",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "store": args.db,
        "token_events": n_tokens,
        "synthetic": True,
        "rounds": args.rounds,
        "goal_s": GOAL_S,
        "worst_page_s": round(worst, 3),
        "meets_goal": worst < GOAL_S,
        "missing_indexes": missing,
        "pages": results,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
                    "platform": platform.platform()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nworst page {worst:.3f} s ({'meets' if worst < GOAL_S else 'misses'} the {GOAL_S:g} s goal); wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

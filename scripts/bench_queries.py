"""Time the run, mode and configuration summaries (telemetry.queries) over a store, and optionally dump every
figure they return, so two versions of queries.py can be compared on the same store (same numbers, to the bit,
and their times). Run it from the checkout whose queries.py should be timed:

    python -m scripts.bench_queries --db sqlite:///var/bench/requests-1m.db --dump /tmp/new.json
    (cd /tmp/oldq && python -m scripts.bench_queries --db ... --dump /tmp/old.json)

On SQLite the query runs in this process, so its CPU time is the work done, whatever else the machine runs;
on PostgreSQL the server's work is not in it (compare wall times, repeated).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from telemetry import queries
from telemetry.queries import Filters, config_summaries, mode_summaries, run_summaries
from telemetry.store import open_store

FILTERS = {"all": Filters(), "domain=code": Filters(domain="code")}
CALLS = {"run_summaries": run_summaries, "mode_summaries": mode_summaries, "config_summaries": config_summaries}


def _figures(items) -> list:
    return [json.loads(json.dumps(asdict(i), default=str)) for i in items]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True)
    p.add_argument("--repeat", type=int, default=1, help="time each call this many times (the best is shown)")
    p.add_argument("--dump", default=None, help="write every figure returned here (JSON, floats as repr)")
    args = p.parse_args(argv)
    engine = open_store(args.db)
    print(f"queries from {queries.__file__}")
    dump = {}
    for fname, f in FILTERS.items():
        for cname, call in CALLS.items():
            best, best_cpu = None, None
            for _ in range(args.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                result = call(engine, f)
                took, cpu = time.perf_counter() - t0, time.process_time() - c0
                best = took if best is None else min(best, took)
                best_cpu = cpu if best_cpu is None else min(best_cpu, cpu)
            dump[f"{cname} {fname}"] = _figures(result)
            print(f"{cname:17s} {fname:12s} {len(result):4d} rows  {best:7.2f} s  (this process's CPU {best_cpu:6.2f} s)",
                  flush=True)
        t0, c0 = time.perf_counter(), time.process_time()
        with queries.reuse_collections():  # as the Overview page asks: modes, speedups, runs over one filter
            mode_summaries(engine, f)
            queries.speedups(engine, f)
            run_summaries(engine, f)
        print(f"{'overview (reused)':17s} {fname:12s}            {time.perf_counter() - t0:7.2f} s  "
              f"(this process's CPU {time.process_time() - c0:6.2f} s)", flush=True)
    if args.dump:
        with open(args.dump, "w") as fh:
            json.dump(dump, fh, indent=0, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Serving benchmark: start `specfinops serve` on a free loopback port, run `specfinops loadtest` at each
concurrency level (spec and AR), and report throughput, p95 TPOT and the server's error count.

    python -m scripts.bench_serve                      # 1,4,16,32 clients x 60 s each, spec and AR
    python -m scripts.bench_serve --levels 1,8,32 --duration 10 --max-tokens 48   # a short version

Writes bench-results/serve.json. Exit status 1 when the server recorded any failed request.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

from app.commands._common import DTYPE_HELP


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not become healthy")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,4,16,32")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per level and mode")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--workload", default="mixed")
    ap.add_argument("--dtype", default="auto", help="passed to serve: " + DTYPE_HELP)
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--k", default="4")
    ap.add_argument("--out", default="bench-results/serve.json")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    work = Path(tempfile.mkdtemp(prefix="specfinops-bench-serve-"))
    server_db, load_db = f"sqlite:///{work / 'server.db'}", f"sqlite:///{work / 'load.db'}"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cli = [sys.executable, "-m", "app.cli"]
    cmd = [*cli, "serve", "--port", str(port), "--db", server_db, "--max-batch", str(max(levels)),
           "--dtype", args.dtype, "--k", args.k, "--graceful-s", "10"]
    if args.drafter:
        cmd += ["--drafter", args.drafter]
    log = open(work / "server.log", "w")  # noqa: SIM115 - closed below
    print(f"starting server on {url} (log: {work / 'server.log'}) ...", file=sys.stderr)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _wait_healthy(url, proc)
        load_json = work / "load.json"
        rc = subprocess.call([*cli, "loadtest", "--url", url, "--concurrency", args.levels, "--duration",
                              str(args.duration), "--mode", "both", "--max-tokens", str(args.max_tokens),
                              "--workload", args.workload, "--db", load_db, "--json", str(load_json)])
        if rc != 0:
            raise RuntimeError(f"loadtest exited with {rc}")
        rows = json.loads(load_json.read_text())["levels"]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
    with create_engine(server_db).connect() as c:
        by_status = dict(c.execute(text("select status, count(*) from requests group by status")).all())
    server_errors = by_status.get("error", 0)
    client_errors = sum(r["requests_error"] for r in rows)
    report = {"levels": levels, "duration_s": args.duration, "max_tokens": args.max_tokens,
              "workload": args.workload, "dtype": args.dtype, "k": args.k, "server_requests_by_status": by_status,
              "server_errors": server_errors, "client_errors": client_errors, "runs": rows,
              "speedup_by_concurrency": {}}
    by = {(r["mode"], r["concurrency"]): r for r in rows}
    print(f"\n{'conc':>4} {'AR tok/s':>9} {'spec tok/s':>10} {'speedup':>8} {'AR TPOT p95':>12} "
          f"{'spec TPOT p95':>14} {'errors':>6}")
    for n in levels:
        ar, sp = by.get(("ar", n)), by.get(("spec", n))
        speed = (sp["tokens_per_s"] / ar["tokens_per_s"]) if ar and sp and ar["tokens_per_s"] else None
        report["speedup_by_concurrency"][str(n)] = speed
        errs = (ar["requests_error"] if ar else 0) + (sp["requests_error"] if sp else 0)

        def f(x, spec=".1f"):
            return "—" if x is None else format(x, spec)

        print(f"{n:>4} {f(ar and ar['tokens_per_s']):>9} {f(sp and sp['tokens_per_s']):>10} {f(speed, '.2f'):>8} "
              f"{f(ar and ar['tpot_p95_ms']):>12} {f(sp and sp['tpot_p95_ms']):>14} {errs:>6}")
    print(f"server: requests by status {by_status}; server errors: {server_errors}; client errors: {client_errors}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 1 if server_errors or client_errors else 0


if __name__ == "__main__":
    sys.exit(main())

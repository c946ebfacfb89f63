"""`specfinops invocations`: the benches and load tests the store holds, newest first, each with its own speedup."""

from __future__ import annotations

import json

from app.commands._common import add_command, add_db_option, positive_int

EXAMPLES = """  specfinops invocations                      # the 20 newest benches and load tests
  specfinops invocations --limit 100 --json
  specfinops cost --invocation latest         # then one invocation's costs, by 'latest' or the id shown
  specfinops project --daily-tokens 5e8 --peak-factor 2 --p95-tpot-sla-ms 50 --invocation ID  # ID as `invocations` shows it
  specfinops export --what requests --invocation latest --out one-bench.csv

Every run a bench (calibrate's included) or load test records carries that command's invocation id: its spec and
AR runs ran under the same machine conditions, so their ratio (the speedup column) is the paired figure; `cost`
and the dashboard pool every invocation in view. Runs a server records belong to no invocation.
"""


def register(sub) -> None:
    p = add_command(sub, "invocations", "List the benches and load tests in the store, newest first, with "
                    "their runs, requests and speedups.", EXAMPLES, run)
    add_db_option(p)
    p.add_argument("--limit", type=positive_int, default=20, metavar="N", help="how many, newest first")
    p.add_argument("--json", action="store_true", help="machine-readable output (whole ids)")


def _speedups(engine, invocation_id: str) -> list:
    """The invocation's speedups, one per spec configuration that has an AR baseline in it."""
    from telemetry.queries import Filters, speedups

    return [s for s in speedups(engine, Filters(invocation_id=invocation_id)) if s.speedup is not None]


ABOVE_MARK = "!"  # beside a speedup above its spec runs' mean acceptance length (said in full under the table)


def _speedup_text(found: list) -> str:
    if not found:
        return "-"
    xs = sorted(s.speedup for s in found)
    mark = ABOVE_MARK if any(_above_text(s) for s in found) else ""
    if len(xs) == 1:
        return f"{xs[0]:.2f}x{mark}"
    return f"{xs[0]:.2f}-{xs[-1]:.2f}x{mark} ({len(xs)} configs)"


def _above_text(s) -> str | None:
    """Why the invocation's speedup `s` cannot be, where it is above its spec runs' mean acceptance length (over
    one invocation's runs the pooled figure is the invocation's own); None where it can."""
    from telemetry.finops import speedup_over_acceptance_text

    return speedup_over_acceptance_text(s.speedup, s.mean_acceptance_length)


def _above_lines(found: list, per: dict) -> list[str]:
    """One warning per speedup above what its spec runs' mean acceptance length allows, naming its invocation."""
    return [f"warning: {i.short_id} {s.drafter} ({s.k_policy}), concurrency {s.concurrency}: {text}"
            for i in found for s in per[i.invocation_id] if (text := _above_text(s))]


def _ended_text(i) -> str:
    """' (running)', ' (stale)', ' (interrupted)', ' (failed)': how the invocation's runs that did not complete
    stand."""
    marks = [mark for mark, n in (("running", i.num_running), ("stale", i.num_stale),
                                  ("interrupted", i.num_cancelled), ("failed", i.num_failed)) if n]
    return f" ({', '.join(marks)})" if marks else ""


def _when(t) -> str:
    return f"{t:%Y-%m-%d %H:%M}"


def run(args) -> int:
    from telemetry.invocations import list_invocations
    from telemetry.labels import short_model, short_workload
    from telemetry.store import open_store

    engine = open_store(args.db, must_exist=True)
    found = list_invocations(engine, limit=args.limit)
    per = {i.invocation_id: _speedups(engine, i.invocation_id) for i in found}
    if args.json:
        print(json.dumps({"invocations": [
            {"invocation_id": i.invocation_id, "started_at": i.started_at.isoformat(),
             "last_run_started_at": i.last_started_at.isoformat(), "kinds": list(i.kinds),
             "workloads": list(i.workloads), "targets": list(i.targets), "nodes": list(i.nodes),
             "runs": i.num_runs, "spec_runs": i.num_spec_runs, "ar_runs": i.num_ar_runs, "requests": i.num_requests,
             "running_runs": i.num_running, "cancelled_runs": i.num_cancelled, "failed_runs": i.num_failed,
             # left 'running' by a process that is gone (killed or crashed): not counted in running_runs
             "stale_runs": i.num_stale,
             "speedups": [{"drafter": s.drafter, "k_policy": s.k_policy, "concurrency": s.concurrency,
                           "temperature": s.temperature, "speedup": s.speedup,
                           "spec_tokens_per_s": s.spec_tokens_per_s, "ar_tokens_per_s": s.ar_tokens_per_s,
                           "spec_run_ids": list(s.spec_run_ids), "ar_run_ids": list(s.ar_run_ids),
                           # the spec runs' 1 + accepted / drafts (null: nothing drafted); the speedup cannot
                           # exceed it, and where it does, why (the AR timing was inflated), else null
                           "mean_acceptance_length": s.mean_acceptance_length,
                           "speedup_warning": _above_text(s)}
                          for s in per[i.invocation_id]]}
            for i in found]}, indent=2))
        return 0
    if not found:
        print(f"no bench or load-test invocations in the store; {_why_none(engine)}")
        return 0
    rows = [(i.short_id, _when(i.started_at) + " UTC", ",".join(i.kinds),
             ",".join(str(short_workload(w)) for w in i.workloads),
             ",".join(str(short_model(t)) for t in i.targets), ",".join(i.nodes),
             f"{i.num_spec_runs}/{i.num_ar_runs}" + _ended_text(i), f"{i.num_requests:,}",
             _speedup_text(per[i.invocation_id]))
            for i in found]
    head = ("invocation", "started", "kind", "workload", "target", "node", "spec/ar runs", "requests", "speedup")
    widths = [max(len(h), *(len(r[n]) for r in rows)) for n, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip())
    print("-" * (sum(widths) + 2 * (len(widths) - 1)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    more = "" if len(found) < args.limit else f" (the newest {args.limit}; --limit N for more)"
    print(f"\nspeedup: spec tokens/s / AR tokens/s within the invocation, per spec configuration{more}")
    above = _above_lines(found, per)
    if above:
        print(f"{ABOVE_MARK}: above the spec runs' mean acceptance length, which no speedup can exceed:")
        for line in above:
            print(line)
    print("one invocation's costs and projection: specfinops cost --invocation ID (or latest: the newest whose "
          "runs have all ended and that completed a request)")
    if any(i.num_cancelled or i.num_failed for i in found):
        print("(interrupted): stopped by Ctrl-C or SIGTERM, or (failed): stopped by an error, while those runs ran: "
              "they measured fewer prompts than the command asked for (the requests they finished count)")
    if any(i.num_running for i in found):
        print("(running): runs not ended yet, a bench or load test under way (or one killed before it could end "
              "them); its figures are what it recorded so far")
    if any(i.num_stale for i in found):
        print("(stale): runs never ended, their process is gone (killed or crashed, e.g. SIGKILL, out of memory, the "
              "machine went down); the requests they finished count, as of an interrupted run")
    return 0


def _why_none(engine) -> str:
    """Why a store lists no invocation: it has no runs (and how to record some), or its runs belong to none (a
    server's; recorded before the store kept invocations, revision 0011)."""
    from sqlalchemy import func, select

    from telemetry.db import Run
    from telemetry.queries import empty_store_hint

    with engine.connect() as c:
        kinds = dict(c.execute(select(Run.kind, func.count(Run.id)).group_by(Run.kind)).all())
    if not kinds:
        return empty_store_hint(engine)
    served = kinds.pop("serve", 0)
    said = [f"{served} run{'s' if served != 1 else ''} of a server (a server's runs belong to none)"] if served else []
    other = sum(kinds.values())
    if other:
        said.append(f"{other} bench or load-test run{'s' if other != 1 else ''} recorded before the store kept "
                    "invocations (store revision 0011)")
    return "the store's runs: " + "; ".join(said) + ". `specfinops cost` reads them all"

"""`specfinops loadtest`: concurrent streaming clients against a local server, spec vs AR, stored as runs."""

from __future__ import annotations

import argparse
import sys
import uuid

from app.commands._common import (
    add_command,
    add_db_option,
    check_recording_options,
    check_writable,
    lost_records,
    open_db_option,
)
from app.commands._interrupt import (
    ctrl_c_once_async,
    interrupted_line,
    sigint_restored,
    table_file,
    write_json,
)
from app.commands.bench import WORKLOAD_ALL, WORKLOAD_EPILOG, WORKLOAD_HELP, node_id

EXAMPLES = """  specfinops loadtest --url http://127.0.0.1:8000 --concurrency 1,2,4,8 --duration 30
  specfinops loadtest --url http://127.0.0.1:8000 --concurrency 32 --duration 60 --mode spec --max-tokens 128
  specfinops loadtest --url http://127.0.0.1:8000 --workload chat --api-key secret --json bench-results/load.json
  specfinops loadtest --url http://127.0.0.1:8000 --concurrency 4 --duration 10 --json - | jq '.levels[].tokens_per_s'
"""


def register(sub) -> None:
    p = add_command(sub, "loadtest", "Bounded streaming load test (loopback only): TTFT / TPOT / ITL and "
                    "throughput per concurrency level, spec vs AR, recorded as runs.", EXAMPLES + WORKLOAD_EPILOG,
                    handle)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server on this machine (loopback only)")
    p.add_argument("--concurrency", default="1,2,4,8", help="clients in flight; a list runs one level after another")
    p.add_argument("--duration", type=float, default=30.0, help="seconds per level and mode")
    p.add_argument("--mode", choices=("spec", "ar", "both"), default="both",
                   help="speculative or not, per request (the 'speculative' extension field)")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens of each request (answer length cap)")
    p.add_argument("--temperature", type=float, default=0.0, help="temperature of each request (0 = greedy)")
    p.add_argument("--workload", default="mixed", help=f"{WORKLOAD_HELP}; {WORKLOAD_ALL}")
    p.add_argument("--model", default=None, help="model id (default: the first the server lists)")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    add_db_option(p)
    p.add_argument("--node-id", default=None, type=node_id, help="node id recorded with the runs (default: $SPECFINOPS_NODE_ID, else the host name)")
    p.add_argument("--no-telemetry", action="store_true",
                   help="print only; record nothing (refused beside --db or --node-id, which only shape the record)")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="write the per-level summary as JSON to PATH; '-': to stdout (the table then goes to stderr)")


def level_bars(duration_s: float):
    """`run_loadtest`'s progress: one bar per level and mode over the level's duration in seconds, with the
    requests done and the output tokens/s so far; it closes (and stays on screen) when the level ends."""
    from tqdm import tqdm

    from app.commands.bench import progress_refresh_s

    every = progress_refresh_s()  # into a pipe or a log file: not two redraws a second, each kept

    def start(mode: str, level: int):
        bar = tqdm(total=duration_s, desc=f"{mode} c={level}", file=sys.stderr, mininterval=every,
                   bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s{postfix}")  # ", N req, ..."
        shown = [0.0]  # elapsed seconds at the last redraw

        def tick(elapsed_s: float, requests_ok: int, tokens: int, final: bool) -> None:
            bar.n = min(elapsed_s, duration_s)
            rate = tokens / elapsed_s if elapsed_s > 0 else 0.0
            bar.set_postfix_str(f"{requests_ok} req, {rate:.1f} tok/s", refresh=False)
            if final:  # a level stopped early (its requests failing) shows where it stopped
                bar.close()
            elif elapsed_s - shown[0] >= every:
                shown[0] = elapsed_s
                bar.refresh()

        return tick

    return start


def _stored_note(shared, invocation_id: str) -> str:
    """Where the requests went, and whether the server left them to the load test (`SharedStore`)."""
    note = (f"recorded in the store as 'loadtest' runs of invocation {invocation_id}: its costs with `specfinops "
            f"cost --invocation {invocation_id[:8]}`, its capacity at an SLA with `specfinops project --invocation "
            f"{invocation_id[:8]} --daily-tokens 5e8 --peak-factor 2 --p95-tpot-sla-ms 50` (your traffic); ")
    if shared is None:
        return note + "the server records into another store, or none: it keeps its own record of them"
    note += "the server records into this store too and left these requests to the load test's runs"
    if shared.power_source == "estimate":
        return note + ", with the energy its power samples give them (estimated: a TDP power model)"
    if shared.power_source != "none":
        return note + f", with the energy its power samples give them (measured: {shared.power_source})"
    return note + " (it measures no power: no energy)"


def handle(args: argparse.Namespace) -> int:
    """The first Ctrl-C (or SIGTERM) stops the load test (`ctrl_c_once_async`): the level's run ends 'cancelled',
    the table and --json of what ran are written, marked interrupted; exit 130. SIGINT's handler is put back."""
    from app.commands._common import sigterm_as_ctrl_c

    with sigint_restored(), sigterm_as_ctrl_c("loadtest: SIGTERM: stopping as on Ctrl-C"):
        return _handle(args)


def _handle(args: argparse.Namespace) -> int:
    import asyncio

    from app.commands.bench import parse_concurrency
    from serving.loadtest import LoadSpec, format_table, run_loadtest, summarize
    from serving.workloads import load_workload

    check_recording_options(args.no_telemetry, [flag for flag, value in (("--db", args.db), ("--node-id", args.node_id))
                                                if value is not None])
    modes = ("ar", "spec") if args.mode == "both" else (args.mode,)
    spec = LoadSpec(url=args.url, levels=tuple(parse_concurrency(args.concurrency)), duration_s=args.duration,
                    modes=modes, max_tokens=args.max_tokens, temperature=args.temperature, api_key=args.api_key,
                    model=args.model)
    spec.validate()
    if args.json != "-":
        check_writable(args.json, "--json")
    from serving.workloads import canonical_workload

    args.workload = canonical_workload(args.workload)  # 'all' is recorded as 'mixed': the same prompts
    prompts = load_workload(args.workload)
    try:
        import openai  # noqa: F401
    except ImportError:
        raise ValueError("loadtest needs the official openai client: pip install openai") from None
    from serving.loadtest import LoadTestFailed, probe_server, shared_store

    # the server answers for the model, with this key, and --max-tokens fits (after the longest prompt): checked
    # before the store is opened, so a server that is not up, a wrong key or model create no store
    card = asyncio.run(probe_server(spec, prompts))
    recorder, shared = None, None
    if not args.no_telemetry:
        from serving.worker import default_node_id
        from telemetry.recorder import Recorder

        store = open_db_option(args.db)  # a read-only store refused now, not once the first level has run
        recorder = Recorder(store)
        try:
            shared = shared_store(store, card)
        except BaseException:
            recorder.close()
            raise
    failed, interrupted, results = None, False, []
    invocation_id = uuid.uuid4().hex  # on every run of this load test: its spec and AR levels are compared as a pair
    try:
        asyncio.run(ctrl_c_once_async(run_loadtest(
            spec, prompts, workload=args.workload, recorder=recorder, shared=shared, card=card,
            node_id=args.node_id or (default_node_id() if recorder else ""), say=lambda m: print(m, file=sys.stderr),
            progress=level_bars(spec.duration_s), results=results, invocation_id=invocation_id)))
    except LoadTestFailed as exc:  # what ran is still shown (and recorded), then the reason
        failed, results = exc, exc.results
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM: likewise, then the exit status 130 (app.cli)
        interrupted = True
    finally:
        if recorder is not None:
            recorder.close()
    rows = [summarize(r) for r in results]
    table = table_file(args.json)  # `--json -`: stdout holds the JSON alone
    if interrupted:
        done = sum(not r["interrupted"] for r in rows)
        print(interrupted_line(done, len(spec.levels) * len(spec.modes), "level runs"), file=table)
    print(format_table(rows), file=table)
    if recorder is not None:
        print(_stored_note(shared, invocation_id), file=table)
    lost, warning = lost_records(args.db, invocation_id if recorder is not None else None)
    if args.json:
        write_json(args.json, {"url": args.url, "levels": rows,
                               "invocation_id": invocation_id if recorder is not None else None,
                               **({"dropped_records": lost} if recorder is not None else {}),
                               **({"error": str(failed)} if failed else {}),
                               **({"interrupted": True} if interrupted else {})})
    if warning:  # never silent: the store holds less than the table, or cannot be read to tell
        print(warning, file=sys.stderr)
    if interrupted:
        raise KeyboardInterrupt
    if failed is not None:
        print(f"specfinops loadtest: error: the load test stopped at {failed}", file=sys.stderr)
        return 1
    return 1 if warning else 0

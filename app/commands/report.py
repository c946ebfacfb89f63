"""`specfinops report`: one self-contained HTML cost report of a period, its tables as CSV, and a record.

An empty store is an error (exit 2, with the command that fills it); a period without traffic is not: the
report is written and says there was no traffic.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from app.commands._common import (
    INVOCATION_FILTER_HELP,
    MAX_NEW_TOKENS_FILTER_HELP,
    TOP_K_FILTER_HELP,
    TOP_P_FILTER_HELP,
    add_command,
    add_db_option,
    invocation_filter,
    max_new_tokens_filter,
    number_option,
    removing_made_folders,
    sigterm_as_ctrl_c,
    top_k_filter,
    top_p_filter,
)
from app.commands.cost import add_pricing_options, check_gpu_entry, pricing_options
from app.errors import UsageError

RUN_KINDS = ("bench", "loadtest", "serve")  # telemetry.queries.RUN_KINDS (not imported: --help loads no SQL)
# report_options that choose the runs (report.Window's)
RUN_FILTERS = ("temperature", "kind", "top_p", "top_k", "max_new_tokens", "workload", "target")
# report_options that price the runs (report.Pricing's, as `specfinops project` takes them)
PRICING_OPTIONS = ("gpu", "gpus_per_node", "node_hourly_usd", "usd_per_kwh", "pue")

EXAMPLES = """  specfinops report --period daily --out reports/             # yesterday (UTC)
  specfinops report --period weekly --until 2026-11-09 --out reports/
  specfinops report --period monthly --out reports/           # last calendar month (UTC), against the months before
  specfinops report --period monthly --since 2026-10-01 --out reports/   # October 2026
  specfinops report --period custom --since 2026-11-01 --until 2026-11-08T12:00 --out reports/ --sla-ms 40
  specfinops report --period daily --out reports/ --daily-tokens 5e8 --peak-factor 2   # project at this traffic
  specfinops report --period weekly --out reports/ --temperature 0 --run-kind bench   # only these runs
  specfinops report --period weekly --out reports/ --temperature 0.8 --top-k 40       # only these runs
  specfinops report --period weekly --out reports/ --max-new-tokens 128               # answers capped at 128
  specfinops report --period weekly --out reports/ --workload code --target ~/models/llama-3.1-8b   # one model
  specfinops report --period custom --invocation latest --out reports/   # the last bench, over its own span
  specfinops report --period weekly --out reports/ --daily-tokens 5e8 --gpu H100 --gpus-per-node 8   # as project
  specfinops report --period weekly --out reports/ --node-hourly-usd 8.806   # our own node's price
"""


def add_report_options(p) -> None:
    """Options shared with `specfinops scheduler`."""
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the report files (created if missing)")
    p.add_argument("--sla-ms", "--p95-tpot-sla-ms", dest="sla_ms", metavar="X", default=None,
                   help="p95 TPOT SLA in ms (default 50; --p95-tpot-sla-ms: as `project` names it)")
    p.add_argument("--history", metavar="N", default=None,
                   help="previous periods for the anomaly bands (default 7; 3 with a value are needed)")  # fmt: skip
    p.add_argument("--daily-tokens", metavar="N", default=None,
                   help="traffic for the savings projection (default: the period's output tokens per day)")  # fmt: skip
    p.add_argument("--peak-factor", metavar="F", default=None, help="peak-to-average traffic (default 1)")
    p.add_argument("--temperature", metavar="T", default=None,
                   help="only runs recorded at this sampling temperature (default: every run)")  # fmt: skip
    p.add_argument("--top-p", metavar="P", default=None, help=TOP_P_FILTER_HELP)
    p.add_argument("--top-k", metavar="K", default=None, help=TOP_K_FILTER_HELP)
    p.add_argument("--max-new-tokens", metavar="N", default=None, help=MAX_NEW_TOKENS_FILTER_HELP)
    p.add_argument("--run-kind", choices=RUN_KINDS, default=None,
                   help="only runs of this kind (a bench times the engine, a load test its HTTP clients)")  # fmt: skip
    p.add_argument("--workload", metavar="NAME", default=None,
                   help="only runs of this workload (as `specfinops cost --workload`; default: every workload)")  # fmt: skip
    p.add_argument("--target", metavar="MODEL", default=None,
                   help="only runs of this target model: its folder's name or its path as the runs recorded it "
                        "(`specfinops cost --target`); "
                        "a name the store has never recorded is named with the ones it has: `report` refuses it, "
                        "`scheduler` warns and keeps it")  # fmt: skip
    # the prices of `specfinops project` (and `cost`): every run's cost and the projection at them
    add_pricing_options(p, gpus_per_node=True)


def register(sub) -> None:
    p = add_command(
        sub,
        "report",
        "Write a cost report of a period: one offline HTML page, CSV files of its tables, a record in the store.",
        EXAMPLES,
        run,
    )
    add_db_option(p)
    p.add_argument("--period", required=True, metavar="daily|weekly|monthly|custom",
                   help="the period to report on (monthly: a calendar month in UTC)")
    p.add_argument("--since", metavar="ISO", help="period start (custom; or anchors daily/weekly/monthly: a 1st)")
    p.add_argument("--until", metavar="ISO",
                   help="period end, exclusive (custom; or anchors daily/weekly/monthly: a 1st)")
    p.add_argument("--invocation", metavar="ID",
                   help=INVOCATION_FILTER_HELP + "; with --period custom, a --since / --until not given is the "
                        "bench's own: from its first run's start to its last run's end (report only: a schedule "
                        "reports the periods to come)")  # fmt: skip
    add_report_options(p)


def report_options(args) -> dict:
    """Validated keyword arguments of telemetry.report_writer.write_report (and the scheduled job)."""
    from telemetry.finops import MAX_DAILY_TOKENS, MAX_PEAK_FACTOR, MAX_SLA_MS, MIN_DAILY_TOKENS
    from telemetry.report import DEFAULT_HISTORY, DEFAULT_SLA_MS

    history = number_option("--history", args.history, DEFAULT_HISTORY, minimum=1, strict=False)
    if history != int(history) or history > 366:
        raise UsageError(f"--history must be a whole number of periods in 1..366, got {args.history!r}")
    return {
        "sla_ms": number_option("--sla-ms", args.sla_ms, DEFAULT_SLA_MS, minimum=0, strict=True, maximum=MAX_SLA_MS),
        "history": int(history),
        "daily_tokens": number_option("--daily-tokens", args.daily_tokens, None, minimum=MIN_DAILY_TOKENS,
                                      strict=False, maximum=MAX_DAILY_TOKENS),
        "peak_factor": number_option("--peak-factor", args.peak_factor, 1.0, minimum=1, strict=False,
                                     maximum=MAX_PEAK_FACTOR),
        "temperature": number_option("--temperature", args.temperature, None, minimum=0, strict=False),
        "kind": args.run_kind,
        "top_p": top_p_filter(args.top_p),
        "top_k": top_k_filter(args.top_k),
        "max_new_tokens": max_new_tokens_filter(args.max_new_tokens),
        "workload": name_filter("--workload", args.workload),
        "target": name_filter("--target", args.target),
        **pricing_options(args),  # PRICING_OPTIONS
    }


def name_filter(flag: str, value: str | None) -> str | None:
    """--workload / --target: a name as the runs record it (None: every run)."""
    if value is None:
        return None
    if not value.strip():
        raise UsageError(f"{flag} must name a {flag[2:]}, got {value!r}")
    if len(value) > 512:  # runs.target is VARCHAR(512), runs.workload shorter: no run records a longer one
        raise UsageError(f"{flag} is {len(value)} characters; no run records one longer than 512")
    return value


def unrecorded_names(engine, options: dict) -> str | None:
    """Why --workload / --target (and `report --invocation`: its invocation_id) name nothing the store has ever
    recorded together (most likely a typo: a report on such runs would say 'no traffic' for every period), with
    the names it has; None where runs of them exist."""
    from sqlalchemy import func, select

    from telemetry.costing import no_runs_reason
    from telemetry.db import Run
    from telemetry.queries import Filters

    chosen = Filters(workload=options.get("workload"), target=options.get("target"),
                     invocation_id=options.get("invocation_id"))
    if chosen.workload is None and chosen.target is None and chosen.invocation_id is None:
        return None
    with engine.connect() as c:
        if c.execute(select(func.count(Run.id)).where(*chosen.where())).scalar():
            return None
    return no_runs_reason(engine, chosen)


def run(args) -> int:
    from telemetry.export import parse_when
    from telemetry.invocations import invocation_span
    from telemetry.queries import empty_store_hint
    from telemetry.report import PERIODS, Pricing
    from telemetry.report_writer import check_out_dir, count_runs, write_report
    from telemetry.store import RECORDS_REPORTS, open_store

    if args.period not in PERIODS:
        raise UsageError(f"--period must be one of {', '.join(PERIODS)}, got {args.period!r}")
    options = report_options(args)
    runs = {k: options.pop(k) for k in RUN_FILTERS}  # the window's runs
    pricing = Pricing(**{k: options.pop(k) for k in PRICING_OPTIONS})
    since, until = parse_when(args.since, "--since"), parse_when(args.until, "--until")
    invocation_filter(None, args.invocation)  # its form, before the store is read
    # --period custom --invocation ID: what --since / --until leave open is the invocation's own span
    from_invocation = args.invocation is not None and args.period == "custom" and None in (since, until)
    window = None if from_invocation else _window(args.period, since, until, runs, options["history"])
    # before --out is made: a store that fails to open makes none; a report is recorded in it, so a read-only
    # store is named as such now (it said SQLite's 'attempt to write a readonly database' after the work)
    engine = open_store(args.db, must_exist=True, to_write=RECORDS_REPORTS)
    if count_runs(engine) == 0:
        raise UsageError(f"the store has no runs to report on; {empty_store_hint(engine)}")
    check_gpu_entry(engine, args)
    runs["invocation_id"] = invocation_filter(engine, args.invocation)
    if runs["invocation_id"] is not None:
        first, last = invocation_span(engine, runs["invocation_id"])
        spans = f"it ran from {first:%Y-%m-%d %H:%M:%S} to {last:%Y-%m-%d %H:%M:%S} UTC"
        if from_invocation and (since or first) >= (until or last):
            raise UsageError(f"--invocation {args.invocation}: {spans}; --{'since' if since else 'until'} "
                             f"{args.since or args.until} leaves no time of it to report")
        if from_invocation:
            window = _window(args.period, since or first, until or last, runs, options["history"])
        elif window.until <= first or window.since >= last:  # a report of nothing it recorded
            raise UsageError(f"--invocation {args.invocation}: {spans}, outside the period ({window.label()}); "
                             f"`--period custom --invocation {args.invocation}` reports it over its own span")
    window = replace(window, invocation_id=runs["invocation_id"])
    unknown = unrecorded_names(engine, runs)
    if unknown is not None:
        raise UsageError(unknown)
    # a store that opens but refuses the report's record (read-only), or a report that fails or is stopped, leaves
    # no empty --out either: write_report removes its own folder, and the folders made here go with it
    with removing_made_folders(args.out):
        out = check_out_dir(args.out)
        with sigterm_as_ctrl_c():  # killed by SIGTERM, write_report removes its claim and folder as on Ctrl-C
            result = write_report(engine, window, out, pricing=pricing, **options)
    if result is None:  # only scheduled reports (with a job id) can be refused as duplicates
        raise RuntimeError("report was refused as a duplicate without a job id")
    s = result.summary
    traffic = "" if s["traffic"] else " (no traffic in this period)"
    print(f"report #{result.report_id}: {window.label()}{traffic}")
    if result.synthetic is not None:  # said first, as the page and the dashboard say it
        print(f"warning: {result.synthetic}", file=sys.stderr)
    print(f"  html: {result.html_path}")
    print(f"  csv:  {result.csv_dir} ({len(result.csv_files)} files)")
    if s["priced_at"]:
        print(f"  priced at: {s['priced_at']} (every run's cost and the projection)")
    if result.name_taken:  # another store's report (ids are per store) or one from before a reset: kept
        print(f"note: {out} already holds {result.name_taken} (another store's report, one written before the "
              f"store was reset, or another file; left as it is): this report is in {result.csv_dir.name}",
              file=sys.stderr)  # fmt: skip
    flagged = [a["metric"] for a in s["anomalies"] if a["status"] == "anomaly"]
    if flagged:
        print(f"  anomalies: {', '.join(flagged)}")
    for sp in s["speedups"]:  # a speedup no machine can produce, and the savings on it: said as the page says it
        if sp["speedup_warning"]:
            print(f"warning: {sp['workload']}, concurrency {sp['concurrency']}, {sp['drafter']}: "
                  f"{sp['speedup_warning']}")
    if s["small_sample"]:  # as `cost` warns, and the page
        print(f"warning: {s['small_sample']}", file=sys.stderr)
    if not s["period_complete"]:  # written, not refused: said once here, and on the page and in the summary
        print(f"note: {result.incomplete_period}", file=sys.stderr)
    return 0


def _window(period: str, since, until, runs: dict, history: int):
    """The report's Window of `runs` (ValueError where the dates make none), checked to leave room for the
    `history` periods before it. Outside years 1-9999 the error names the option that went there: the period of
    --since 9999-12-31 itself ends past them (it blamed --history, which the default 7 is), the --history
    periods before the report's may start before year 1."""
    from telemetry.report import period_window, time_text

    try:
        window = replace(period_window(period, since=since, until=until), **runs)
    except OverflowError:
        flag, at, way = ("--since", since, "from") if since is not None else ("--until", until, "up to")
        raise UsageError(f"{flag} {time_text(at, '%Y-%m-%d %H:%M')} UTC: the {period} period {way} it reaches "
                         "outside the range of dates (years 1-9999)") from None
    try:
        window.shifted(history)  # the oldest period the trend compares with
    except OverflowError:
        many = f"the {history} {period} periods" if history > 1 else f"the {period} period"
        raise UsageError(f"--history {history}: {many} before the report's ({window.span_text()}) reach"
                         f"{'' if history > 1 else 'es'} outside the range of dates (years 1-9999); "
                         "give a smaller --history or a later --since / --until") from None
    return window

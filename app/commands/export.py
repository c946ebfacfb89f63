"""`specfinops export`: stream one table of the store to CSV (constant memory, formula-safe)."""

from __future__ import annotations

import sys
from pathlib import Path

from app.commands._common import add_command, add_db_option, run_id
from app.errors import UsageError

EXAMPLES = """  specfinops export --what requests --out requests.csv
  specfinops export --what tokens --run 3 --out - | head
  specfinops export --what cost --since 2025-01-01 --until 2025-02-01 --out cost-january.csv
  specfinops export --db postgresql://user@db/specfinops --what power --out power.csv
"""


def register(sub) -> None:
    from telemetry.export import EXPORT_KINDS

    p = add_command(sub, "export", "Export requests, steps, token events, power samples or cost to CSV.", EXAMPLES, run)
    add_db_option(p)
    p.add_argument("--what", required=True, metavar="|".join(EXPORT_KINDS), help="which table to export")
    p.add_argument("--out", required=True, metavar="FILE", help="output CSV file, '-' for stdout")
    p.add_argument("--since", metavar="ISO", help="only rows at or after this time (UTC unless an offset is given)")
    p.add_argument("--until", metavar="ISO", help="only rows before this time")
    p.add_argument("--run", type=run_id, metavar="ID", help="only this run")


def _progress(n: int) -> None:
    print(f"export: {n:,} rows...", file=sys.stderr, flush=True)


def run(args) -> int:
    from telemetry.export import EXPORT_KINDS, ExportWindow, export_rows, parse_when, write_csv
    from telemetry.store import open_store

    if args.what not in EXPORT_KINDS:
        raise UsageError(f"--what must be one of {', '.join(EXPORT_KINDS)}, got {args.what!r}")
    window = ExportWindow(since=parse_when(args.since, "--since"), until=parse_when(args.until, "--until"), run_id=args.run)
    if window.since and window.until and window.since >= window.until:
        raise UsageError(f"--since ({args.since}) must be before --until ({args.until})")

    engine = open_store(args.db, must_exist=True)  # before --out is opened: a bad store must not truncate an existing file
    if args.run is not None:
        from telemetry.queries import run_exists

        if not run_exists(engine, args.run):
            raise UsageError(f"no run {args.run} in the store (`specfinops cost` lists the runs)")
    if args.out == "-":
        header, rows = export_rows(engine, args.what, window)
        n = write_csv(sys.stdout, header, rows, progress=_progress)
    else:
        # rows go to FILE.part, renamed to FILE once all are written: an export that fails part-way (the
        # store gone, the disk full, Ctrl-C) leaves FILE as it was, never a CSV that silently stops short
        path = Path(args.out)
        part = path.with_name(path.name + ".part")
        try:
            out = part.open("w", encoding="utf-8", newline="")
        except OSError as exc:
            raise UsageError(f"cannot write --out {args.out}: {exc.strerror or exc}") from None
        try:
            with out:
                header, rows = export_rows(engine, args.what, window)
                n = write_csv(out, header, rows, progress=_progress)
            part.replace(path)
        except BaseException:
            part.unlink(missing_ok=True)
            raise
    if args.out != "-" or n >= 250_000:
        print(f"export: wrote {n:,} {args.what} rows to {args.out}", file=sys.stderr)
    return 0

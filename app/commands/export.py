"""`specfinops export`: stream one table of the store to CSV (constant memory, formula-safe)."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TextIO

from app.commands._common import (
    INVOCATION_FILTER_HELP,
    TARGET_FILTER_HELP,
    WORKLOAD_FILTER_HELP,
    add_command,
    add_db_option,
    invocation_filter,
    max_new_tokens_filter,
    number_option,
    removing_made_folders,
    run_id,
    sigterm_as_ctrl_c,
    top_k_filter,
    top_p_filter,
)
from app.errors import UsageError

EXAMPLES = """  specfinops export --what requests --out requests.csv
  specfinops export --what tokens --run 3 --out - | head
  specfinops export --what cost --since 2025-01-01 --until 2025-02-01 --out cost-january.csv
  specfinops export --db postgresql://user@db/specfinops --what power --out power.csv
  specfinops export --what requests --workload code --mode spec --out spec-code.csv
  specfinops export --what steps --temperature 0.8 --top-k 40 --max-new-tokens 128 --out sampled-steps.csv
  specfinops export --what requests --invocation latest --out last-bench.csv   # the last bench's requests

columns: every column of each --what, with its unit and meaning (offsets such as emit_offset_ms are from the
request's start; a missing value is an empty cell, never 0), is in docs/export.md
"""

SAMPLING_NOTE = ("requests, steps and tokens: each request's own sampling where it recorded one (a server's "
                 "requests choose theirs), else its run's; power and cost: the run's")


def register(sub) -> None:
    from telemetry.export import EXPORT_KINDS

    p = add_command(sub, "export", "Export requests, steps, token events, power samples or cost to CSV.", EXAMPLES, run)
    add_db_option(p)
    p.add_argument("--what", required=True, metavar="|".join(EXPORT_KINDS),
                   help="which table to export (its columns: docs/export.md)")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="output CSV file (its folders are made), '-' for stdout")
    p.add_argument("--since", metavar="ISO", help="only rows at or after this time (UTC unless an offset is given)")
    p.add_argument("--until", metavar="ISO", help="only rows before this time")
    p.add_argument("--run", type=run_id, metavar="ID", help="only this run")
    runs = p.add_argument_group("run selection (every option narrows; default: every run)")
    runs.add_argument("--workload", help=WORKLOAD_FILTER_HELP)
    runs.add_argument("--target", help=TARGET_FILTER_HELP)
    runs.add_argument("--node", help="only runs of this node id")
    runs.add_argument("--mode", choices=("spec", "ar"), help="only speculative or only autoregressive runs")
    runs.add_argument("--run-kind", choices=("bench", "loadtest", "serve"), help="only runs of this kind")
    runs.add_argument("--invocation", metavar="ID", help=INVOCATION_FILTER_HELP)
    sampling = p.add_argument_group("sampling selection", textwrap.fill(
        f"{SAMPLING_NOTE}. At temperature 0 top_p and top_k are off whatever was recorded (greedy rows match top_p "
        "1 and top_k 0 only); a value nothing in the store was sampled with is refused, as cost refuses it.", 78))
    sampling.add_argument("--temperature", metavar="T", help="only rows sampled at this temperature (e.g. 0)")
    sampling.add_argument("--top-p", metavar="P", help="only rows sampled with this top_p, in (0, 1]")
    sampling.add_argument("--top-k", metavar="K", help="only rows sampled with this top_k, a whole number >= 0")
    sampling.add_argument("--max-new-tokens", metavar="N",
                          help="only rows with this answer length cap, a whole number >= 1")


def _progress(n: int) -> None:
    print(f"export: {n:,} rows...", file=sys.stderr, flush=True)


def _check_out(out: str) -> None:
    """Refuse an --out that can never hold the CSV before any row is read: empty, or a directory."""
    if not out.strip():
        raise UsageError("--out must be a file name or '-' for stdout, got ''")
    if os.path.isdir(out):
        raise UsageError(f"--out {out} is a directory: give a file name")


def _refuse_the_store(out: str, db: str | None) -> None:
    """An --out that is the SQLite store itself (or its -wal / -shm / -journal file), by any path or link to it:
    renaming the CSV over it would replace the store with the export."""
    from telemetry.db import resolve_db_url, sqlite_file, sqlite_files

    path = sqlite_file(resolve_db_url(db))
    if path is None:
        return
    if os.path.realpath(out) in {str(f) for f in sqlite_files(path.resolve())}:
        raise UsageError(f"--out {out} is the store's own file ({path}): give another file name")


def _same_file_as(out: str, stream: TextIO | None) -> bool:
    """Whether --out names the file `stream` writes to (/dev/stdout, /proc/self/fd/1, or the file itself)."""
    try:
        mine, theirs = os.stat(out), os.fstat(stream.fileno())
    except (OSError, AttributeError, ValueError):  # no such file; no stream (closed); a stream with no descriptor
        return False
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


def _write_file(out: str, write: Callable[[TextIO], int]) -> int:
    """Run `write` on --out, returning its row count.

    A regular file (or a new one) is written to a fresh temporary file beside it and renamed over it once
    every row is in: an export that fails part-way (the store gone, the disk full, Ctrl-C) leaves the file as
    it was, never a CSV that silently stops short. A symlink is followed, so the file it points at is
    replaced and the link stays. Anything else (a FIFO, a device, a terminal) is written straight
    through: renaming over it would replace the device or pipe with a regular file. The file this process's
    stdout or stderr goes to (--out /dev/stdout with stdout redirected to a file) is written through that
    stream, as `--out -` is: reopened, or renamed over, it would lose what the shell appended before.
    """
    for stream in (sys.stdout, sys.stderr):
        if _same_file_as(out, stream):
            stream.flush()
            return write(stream)
    try:
        st = os.stat(out)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UsageError(f"cannot write --out {out}: {exc.strerror or exc}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        try:
            fh = open(out, "w", encoding="utf-8", newline="")  # noqa: SIM115 - closed by the with below
        except OSError as exc:
            raise UsageError(f"cannot write --out {out}: {exc.strerror or exc}") from None
        with fh:
            return write(fh)
    target = os.path.realpath(out)
    remove_stale_temporaries(target)
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=_temporary_prefix(target), suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"cannot write --out {out}: {exc.strerror or exc}") from None
    try:
        with open(fd, "w", encoding="utf-8", newline="") as fh:
            # mkstemp makes the file 0600: give it the mode the file had, or the one a new file gets (umask)
            os.fchmod(fh.fileno(), stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
            n = write(fh)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return n


def _temporary_prefix(target: str) -> str:
    """The hidden name the CSV is written under before it is renamed over `target`: '.<name>.<host>.<pid>.',
    so that a later export can tell one whose writer is gone (`remove_stale_temporaries`)."""
    return f".{os.path.basename(target)}.{_host()}.{os.getpid()}."


def _host() -> str:
    """This host's name as temporary names carry it: at most 32 characters (a long --out name still fits), no
    dots (the name's fields are split on them)."""
    return socket.gethostname().replace(".", "-")[:32]


# A temporary file untouched this long (a live export writes to it all along) whose writer's pid is gone: a
# container sharing this host's name has pids of its own, and one of its live exports must not be taken for dead
STALE_TEMPORARY_S = 600


def remove_stale_temporaries(target: str) -> list[str]:
    """Remove the temporary files of exports to `target` that were killed (SIGKILL, the OOM killer, `docker kill`
    leave no chance to clean up): those written on this host by a process that no longer runs, untouched for
    STALE_TEMPORARY_S. Another host's (a shared folder), a live writer's and a recent one are kept. Said on
    stderr; returns the paths removed."""
    folder, base = os.path.dirname(target), os.path.basename(target)
    host, now = _host(), time.time()
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed  # the write that follows says what is wrong with the folder
    for name in names:
        if not (name.startswith(f".{base}.") and name.endswith(".tmp")):
            continue
        parts = name[len(base) + 2:].rsplit(".", 3)  # host, pid, mkstemp's letters, 'tmp'
        if len(parts) != 4 or parts[0] != host or not parts[1].isdigit() or _alive(int(parts[1])):
            continue
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            if now - os.stat(path).st_mtime < STALE_TEMPORARY_S:
                continue
            os.unlink(path)
            removed.append(path)
            print(f"export: removed {path}, left by an export to {target} that was killed", file=sys.stderr)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it runs
        return True
    return True


def _umask() -> int:
    from serving.models import current_umask

    return current_umask()


def run(args) -> int:
    from telemetry.export import (
        EXPORT_KINDS,
        ExportWindow,
        empty_export_reason,
        export_rows,
        parse_when,
        unmatched_sampling_reason,
        unmatched_selection_reason,
        write_csv,
    )
    from telemetry.store import open_store

    if args.what not in EXPORT_KINDS:
        raise UsageError(f"--what must be one of {', '.join(EXPORT_KINDS)}, got {args.what!r}")
    since, until = parse_when(args.since, "--since"), parse_when(args.until, "--until")
    if since and until and since >= until:
        raise UsageError(f"--since ({args.since}) must be before --until ({args.until})")
    window = ExportWindow(
        since=since, until=until, run_id=args.run, workload=args.workload, target=args.target, node_id=args.node,
        mode=args.mode, kind=args.run_kind,
        temperature=number_option("--temperature", args.temperature, minimum=0, strict=False),
        top_p=top_p_filter(args.top_p), top_k=top_k_filter(args.top_k),
        max_new_tokens=max_new_tokens_filter(args.max_new_tokens),
    )

    invocation_filter(None, args.invocation)  # its form, before the store is opened
    if sys.stdout is not None and hasattr(sys.stdout, "reconfigure"):
        # rows written to stdout are data: a value its encoding cannot hold fails the export, as ever, and is never
        # written escaped (app.cli.main escapes what other commands print there, for people to read)
        sys.stdout.reconfigure(errors="strict")
    if args.out != "-":  # `--out=~/x.csv`: the shell expands no ~ after '=' (--db and report --out expand it too)
        args.out = os.path.expanduser(args.out)
        _check_out(args.out)
        _refuse_the_store(args.out, args.db)
    elif sys.stdout is None:  # started with stdout closed (`>&-`)
        raise UsageError("--out -: stdout is closed; give a file name")
    engine = open_store(args.db, must_exist=True)  # before --out is opened: a bad store must not truncate an existing file
    if args.invocation is not None:
        window = replace(window, invocation_id=invocation_filter(engine, args.invocation))
    if args.run is not None:
        from telemetry.queries import run_exists

        if not run_exists(engine, args.run):
            raise UsageError(f"no run {args.run} in the store (`specfinops cost` lists the runs)")
    # a run selector that no run in the store has (a typo, a workload never run) fails as `cost` does, before
    # --out is opened; one that matches runs but no rows (the time window, power of runs that measured none) is
    # a note below
    unmatched = unmatched_selection_reason(engine, window) or unmatched_sampling_reason(engine, window)
    if unmatched is not None:
        raise UsageError(unmatched)
    # SIGTERM (`timeout`, `docker stop`, `kill`) stops the export as Ctrl-C does: the temporary file beside --out
    # is removed and the file left as it was (SIGTERM's default exit left the half-written temporary file behind)
    with sigterm_as_ctrl_c("export: SIGTERM: stopping as on Ctrl-C"):
        try:
            if args.out == "-":
                header, rows = export_rows(engine, args.what, window)
                n = write_csv(sys.stdout, header, rows, progress=_progress)
            else:  # its folders made, as report --out and bench --json make theirs; removed again if it fails
                folder = os.path.dirname(os.path.abspath(args.out))
                with removing_made_folders(folder):
                    try:
                        os.makedirs(folder, exist_ok=True)
                    except OSError as exc:
                        raise UsageError(f"--out {args.out}: cannot make its directory: {exc.strerror or exc}"
                                         ) from None
                    n = _write_file(args.out, lambda out: write_csv(out, *export_rows(engine, args.what, window),
                                                                    progress=_progress))
        except BrokenPipeError:
            raise  # `| head`: the CLI's own quiet exit
        except OSError as exc:  # the disk full, the device gone: written part-way (a file is left as it was)
            where = "stdout" if args.out == "-" else args.out
            raise UsageError(f"cannot write --out {where}: {exc.strerror or exc}") from None
    if args.out != "-" or n >= 250_000:
        print(f"export: wrote {n:,} {args.what} rows to {args.out}", file=sys.stderr)
    reason = empty_export_reason(engine, args.what, window) if n == 0 else None
    if reason is not None:  # --run outside the other selectors, or power from runs that measured none
        print(f"export: no {args.what} rows: {reason}", file=sys.stderr)
    elif n == 0 and window.run_id is not None:  # the run is in the store (a missing one is refused before)
        print(f"export: run {window.run_id} recorded no {args.what} rows; the CSV holds the header row alone",
              file=sys.stderr)
    elif n == 0 and window.selects_runs():
        print(f"export: no {args.what} rows match the selection (`specfinops cost --json` lists the runs with "
              "their workload, mode and sampling)", file=sys.stderr)
    elif n == 0:  # no selection: the store holds none at all (exit 0 all the same: docs/export.md)
        print(f"export: no {args.what} rows in the store: {_none_recorded(engine)}; the CSV holds the header row "
              "alone", file=sys.stderr)
    return 0


def _none_recorded(engine) -> str:
    """Why an export of every row wrote none: the store has no runs (and how to record some, as `cost` says it),
    or its runs recorded none of these rows."""
    from sqlalchemy import func, select

    from telemetry.costing import no_runs_reason
    from telemetry.db import Run

    with engine.connect() as c:
        if c.execute(select(func.count(Run.id))).scalar():
            return "its runs recorded none"
    return no_runs_reason(engine)

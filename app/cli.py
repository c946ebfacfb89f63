"""`specfinops` command line. Each sub-command lives in its own module under `app/commands/`.

A command module defines `register(subparsers)`; heavy imports (torch, the engine) happen inside the
command's handler so `specfinops --help` and the dashboard stay light.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sqlite3
import sys

from app.errors import UsageError

COMMAND_MODULES = [
    "app.commands.models",
    "app.commands.bench",
    "app.commands.db",
    "app.commands.cost",
    "app.commands.invocations",
    "app.commands.dashboard",
    "app.commands.export",
    "app.commands.serve",
    "app.commands.loadtest",
    "app.commands.report",
    "app.commands.scheduler",
    "app.commands.calibrate",
    "app.commands.distill",
]

EPILOG = """examples:
  specfinops models pull
  specfinops bench --workload code --mode both --limit 4
  specfinops cost --json
  specfinops project --daily-tokens 5e8 --peak-factor 2 --p95-tpot-sla-ms 50 --gpu H100 --gpus-per-node 8
  specfinops dashboard
"""


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors suggest the nearest name for a misspelt option, sub-command or choice
    (Python 3.11's argparse suggests none): `unrecognized arguments: --limt 2 (--limt: did you mean --limit?)`,
    and a required option reported missing names the near miss that was given instead. Sub-parsers are of this
    class too (add_subparsers makes its parsers of the parent's class)."""

    _given: list[str] | None = None  # the words this parser's latest parse was given (`parse_known_args`)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, remembering the words given to this call: what a required option reported missing is
        compared with (`_suggestion`), not sys.argv or an earlier call's words (a parser built and used outside
        `main`, in a test run or another program, suggested from the words the process started with)."""
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        hint = self._suggestion(message)
        super().error(f"{message} ({hint})" if hint else message)

    def _suggestion(self, message: str) -> str:
        import re

        options = [o for o in self._option_string_actions if o.startswith("--")]
        if message.startswith("unrecognized arguments: "):
            tips = []
            for word in message.removeprefix("unrecognized arguments: ").split():
                name = word.split("=", 1)[0]
                if name.startswith("--") and name not in self._option_string_actions:
                    if (tip := _option_tip(name, options)) is not None:
                        tips.append(f"{name}: {tip}")
            return "; ".join(tips)
        if message.startswith("the following arguments are required: "):
            missing = [m for m in message.removeprefix("the following arguments are required: ").split(", ")
                       if m.startswith("-")]
            tips = []
            for word in self._given or []:
                name = word.split("=", 1)[0]
                if name.startswith("--") and name not in self._option_string_actions:
                    if (tip := _option_tip(name, missing)) is not None:
                        tips.append(f"{name} was given: {tip}")
            return "; ".join(tips)
        choice = re.search(r"invalid choice: '(.*)' \(choose from (.*)\)$", message)
        if choice:
            choices = [c.strip().strip("'") for c in choice.group(2).split(",")]
            match = _near(choice.group(1), choices)
            return f"did you mean {match}?" if match else ""
        return ""


SUGGESTION_CUTOFF = 0.75  # difflib's ratio a name's nearest must reach, compared without leading dashes


def _near(name: str, names: list[str]) -> str | None:
    """The closest of `names` to a misspelt `name`, compared without their leading dashes (the `--` every option
    shares lifted `--nope` to 0.6 of `--pue`); never a longer one that `name` cuts short (`_option_tip`)."""
    import difflib

    bare = {n.lstrip("-"): n for n in names if not n.startswith(name)}
    found = difflib.get_close_matches(name.lstrip("-"), list(bare), n=1, cutoff=SUGGESTION_CUTOFF)
    return bare[found[0]] if found else None


def _option_tip(name: str, options: list[str]) -> str | None:
    """What to say of an unknown option `name` given `options`: one that it cuts short within a word
    (`--no-telem` of `--no-telemetry`) is named as the option to write in full (options are not abbreviated);
    one it names whole words of (`--run` of `--run-kind`) is another option, not named (an error naming an option
    the user never gave misleads); else the nearest spelling (`_near`), if any is near."""
    cut = [o for o in options if len(o) > len(name) and o.startswith(name) and o[len(name)] != "-"]
    if cut:
        return f"options are written in full: {' or '.join(sorted(cut))}?"
    match = _near(name, options)
    return f"did you mean {match}?" if match else None


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="specfinops",
        description="Measure whether speculative decoding pays on your models, traffic and hardware.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # an option is named in full, as every command's (`--verb` is not `--verbose`)
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    from serving import package_version  # serving's package alone, no torch: app imports serving lazily

    parser.add_argument("-V", "--version", action="version", version=package_version(),
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # a command not built yet
                continue
            raise
        module.register(sub)
    _say_defaults(parser)
    return parser


def _say_defaults(parser: argparse.ArgumentParser) -> None:
    """Sub-commands' --help states every option's default (the shared formatter of `add_command`), those a
    command module added with `add_parser` itself (`models pull|list|path`) included."""
    from app.commands._common import HelpFormatter

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in action.choices.values():
                if p.formatter_class is argparse.RawDescriptionHelpFormatter:
                    p.formatter_class = HelpFormatter
                _say_defaults(p)


# commands that read the store once and end; not the scheduler, server or dashboard, which keep reading it
ONE_SHOT_REPORTS = frozenset({"cost", "project", "report", "export", "invocations"})


def main(argv: list[str] | None = None) -> int:
    """The command line's entry point. A Ctrl-C at any point, the parser's build (every command module imported)
    and the options' parsing included, ends with the line "interrupted" and exit 130, never a traceback."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a path or name the terminal's encoding cannot show (LC_ALL=C, a
        # non-ASCII --out): escaped, as stderr's are by default; `report` wrote its report, then failed on the line
        # naming it, and a rerun recorded it twice
        if stream is not None and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    words = sys.argv[1:] if argv is None else list(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named under the usage of the command they follow, not the top level's (argparse's default)
        after_command = args.command in words and words.index(unknown[0]) > words.index(args.command)
        which = getattr(args, "command_parser", parser) if after_command else parser
        which.error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        if args.command in ONE_SHOT_REPORTS:  # one unit of work: its summaries read the store once per filter
            from telemetry.queries import reuse_collections

            with reuse_collections():
                return int(args.handler(args) or 0)
        return int(args.handler(args) or 0)
    except (UsageError, ValueError, FileNotFoundError) as exc:
        print(f"{_prog(args)}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`specfinops export ... | head`): stop quietly, as other Unix tools do
        _silence_stdout()
        return 0
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, the traceback on --verbose
        expected = _is_environment_problem(exc)
        if args.verbose and not expected:
            raise  # a bug: its traceback
        if args.verbose and not _is_our_own_error(exc):
            logging.getLogger(__name__).debug("what failed underneath:", exc_info=exc)
        said = describe_failure(exc, _store_file(args), args.command, server=_store_server(args))
        print(f"{_prog(args)}: error: {said}", file=sys.stderr)
        return 2 if expected else 1


def _prog(args: argparse.Namespace) -> str:
    """The command as its errors name it: as argparse names it in its own ('specfinops models verify', 'specfinops
    db upgrade'), where 'specfinops models' named a refused `models verify /nonexistent` and 'specfinops models
    verify' the checksums it found wrong."""
    parser = getattr(args, "command_parser", None)
    return parser.prog if parser is not None else f"specfinops {args.command}"


def _store_server(args: argparse.Namespace) -> str | None:
    """The server's store a command's --db (or SPECFINOPS_DB_URL) names, as shown (its password masked); None for
    a command without --db, a SQLite store, or a URL that does not resolve."""
    if "db" not in vars(args):
        return None
    from telemetry.db import resolve_db_url, shown_db_url

    try:
        url = resolve_db_url(args.db)
        return None if url.startswith("sqlite") else shown_db_url(url)
    except Exception:  # noqa: BLE001 - its own error is the one being described
        return None


def _store_file(args: argparse.Namespace):
    """The SQLite store file a command's --db (or SPECFINOPS_DB_URL, or the default) names; None for a command
    without --db, a server's database, or a URL that does not resolve."""
    if "db" not in vars(args):
        return None
    from telemetry.db import resolve_db_url, sqlite_file

    try:
        return sqlite_file(resolve_db_url(args.db))
    except Exception:  # noqa: BLE001 - its own error is the one being described
        return None


def describe_failure(exc: BaseException, store=None, command: str = "COMMAND", server: str | None = None) -> str:
    """One line for an exception that escaped a command: what it was about, never a traceback. `store`: the
    SQLite file the command used, named where its device is full (SQLite's words name no file). `command`: the
    command that failed, shown in the hint, since --verbose goes before it (`specfinops bench ... --verbose` is
    an unrecognized argument). `server`: the server's store the command used, as shown (password masked), named
    where another session held a lock it needed past the lock timeout."""
    import errno

    from sqlalchemy.exc import DBAPIError, NoSuchModuleError

    from telemetry.db import (
        SQLITE_BUSY_TIMEOUT_MS,
        StoreLockedError,
        is_locked,
        session_lock_timeout,
        store_full_error,
    )

    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:  # not a bug: no traceback to offer
        return (f"no space left on the device holding {exc.filename}: free some space there" if exc.filename
                is not None else "no space left on device: a disk this command writes to is full")
    full = store_full_error(store, exc) if isinstance(exc, DBAPIError | sqlite3.Error) else None
    if full is not None:
        return str(full)
    if isinstance(exc, DBAPIError) and is_locked(exc):  # a statement no retry covers: name the store and the holder
        if getattr(exc.orig, "sqlstate", None) is not None:  # PostgreSQL's lock_timeout ran out
            return str(StoreLockedError(server, None, server=True, lock_timeout=session_lock_timeout(server)))
        return str(StoreLockedError(store, SQLITE_BUSY_TIMEOUT_MS / 1000))
    if isinstance(exc, DBAPIError):
        text = str(exc.orig or exc).strip()
        return f"cannot use the database: {text.splitlines()[0] if text else type(exc).__name__}"
    if isinstance(exc, NoSuchModuleError):
        return f"cannot use the database: {exc}"
    if isinstance(exc, ModuleNotFoundError):
        return f"a module this needs is not installed: {exc.name} ({exc})"
    first = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.strerror or first}: {exc.filename}"
    if type(exc).__module__.startswith(("telemetry", "serving", "app")):
        return first or type(exc).__name__  # our own errors say what was wrong in their message
    return f"{type(exc).__name__}: {first}" + f" (run `specfinops --verbose {command} ...` for the traceback)"


def _is_environment_problem(exc: BaseException) -> bool:
    """Input or environment (a file, a database, a port, a missing extra) rather than a bug: exit 2."""
    from sqlalchemy.exc import DBAPIError, NoSuchModuleError

    from telemetry.db import StoreLockedError
    from telemetry.power import PowerSourceError
    from telemetry.store import StoreError

    return isinstance(exc, OSError | DBAPIError | NoSuchModuleError | ModuleNotFoundError | StoreError
                      | PowerSourceError | OverflowError | StoreLockedError)


def _is_our_own_error(exc: BaseException) -> bool:
    """An error of ours that says in its message all there is to say (a missing store, an unusable power
    source): no traceback, even on --verbose."""
    from telemetry.db import StoreLockedError
    from telemetry.power import PowerSourceError
    from telemetry.store import StoreError

    return isinstance(exc, StoreError | PowerSourceError | StoreLockedError)


def _silence_stdout() -> None:
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())

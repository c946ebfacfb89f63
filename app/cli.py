"""`specfinops` command line. Each sub-command lives in its own module under `app/commands/`.

A command module defines `register(subparsers)`; heavy imports (torch, the engine) happen inside the
command's handler so `specfinops --help` and the dashboard stay light.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from app.errors import UsageError

COMMAND_MODULES = [
    "app.commands.models",
    "app.commands.bench",
    "app.commands.db",
    "app.commands.cost",
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specfinops",
        description="Measure whether speculative decoding pays on your models, traffic and hardware.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # a command not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except (UsageError, ValueError, FileNotFoundError) as exc:
        print(f"specfinops {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from sqlalchemy.exc import OperationalError

        if not isinstance(exc, OperationalError):
            raise
        # the database is unreachable or refused us: say which and why, without a traceback
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        print(f"specfinops {args.command}: error: cannot use the database: {reason}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

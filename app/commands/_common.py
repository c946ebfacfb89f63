"""Helpers shared by the command modules."""

from __future__ import annotations

import argparse
import contextlib
import copy
import errno
import functools
import re
import signal
import socket
import sys
import threading

from app.errors import UsageError

DB_HELP = ("database URL or SQLite file path (default: $SPECFINOPS_DB_URL, checked as --db is, an empty one counting "
           "as unset; else sqlite:///var/specfinops.db)")


def run_id(text: str) -> int:
    """argparse type of --run: a run id is a positive integer (a SQL BIGINT)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a run id (a positive integer), got {text!r}") from None
    if not 1 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be a run id (a positive integer), got {text!r}")
    return value


def printable_name(text: str) -> str:
    """argparse type of a name the store keeps and commands print back (--node-id, --job-id, --served-model-name,
    --webhook-env): no control character (Unicode category C*: a newline, a tab, the ESC of a terminal escape
    sequence, DEL, an invisible format character), which `cost --node` echoed into the terminal, CSV exports and
    reports carried raw, and a table broke into rows on. Letters of any script stay allowed (a node named in
    Unicode is a name), as price names are printable too (telemetry.prices.check_price)."""
    import unicodedata

    if any(unicodedata.category(c).startswith("C") for c in text):
        raise argparse.ArgumentTypeError(f"must not contain control characters (a newline, a tab, a terminal "
                                         f"escape sequence), got {text!r}")
    return text


def _int_at_least(text: str, minimum: int, not_int: str, too_small: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{not_int}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{too_small}, got {text!r}")
    if value > MAX_COUNT:  # a count no SQL INTEGER (LIMIT, a column) or thread pool takes
        raise argparse.ArgumentTypeError(f"must be at most {MAX_COUNT}, got {text!r}")
    return value


MAX_COUNT = 2**31 - 1


def positive_int(text: str) -> int:
    """argparse type of a count that must be at least 1."""
    return _int_at_least(text, 1, "must be a positive integer", "must be a positive integer")


def context_len(text: str) -> int:
    """argparse type of --max-len: room for at least a one-token prompt and one new token (the engine keeps
    a prompt shorter than max_len - 1)."""
    return _int_at_least(text, 3, "must be a whole number of tokens", "must be >= 3 tokens")


def number_option(flag: str, text: str | None, default: float | None = None, *, minimum: float,
                  strict: bool = True, maximum: float | None = None) -> float | None:
    """A numeric option: a finite number above `minimum` (`strict`) or at least it, and at most `maximum` where
    given; `default` where not given."""
    import math

    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{flag} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise UsageError(f"{flag} must be a finite number, got {text!r}")
    if value <= minimum if strict else value < minimum:
        raise UsageError(f"{flag} must be {'>' if strict else '>='} {minimum:g}, got {text!r}")
    if maximum is not None and value > maximum:
        raise UsageError(f"{flag} must be at most {maximum:g}, got {text!r}")
    return value


# The run filters --top-p and --top-k of cost, project, report and scheduler (telemetry.queries.Filters): a run
# matches where its cut-off acts as the value given; a greedy run (temperature 0) as top_p 1 and top_k 0.
TOP_P_FILTER_HELP = ("only runs sampled with this top_p, in (0, 1]; greedy runs (temperature 0) count as 1, "
                     "off (default: every run)")
TOP_K_FILTER_HELP = ("only runs sampled with this top_k, a whole number >= 0; greedy runs (temperature 0) count "
                     "as 0, off (default: every run)")


def top_p_filter(text: str | None) -> float | None:
    """--top-p of a run filter: a number in (0, 1] (None: not given)."""
    import math

    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--top-p must be a number in (0, 1], got {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= 1):
        raise UsageError(f"--top-p must be a number in (0, 1], got {text!r}")
    return value


def _whole_filter(text: str | None, option: str, minimum: int) -> int | None:
    """A whole-number run filter option (a 32-bit INTEGER column): None when not given."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{option} must be a whole number >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise UsageError(f"{option} must be a whole number >= {minimum}, got {text!r}")
    if value >= 2**31:  # the column is a 32-bit INTEGER: no run records more
        raise UsageError(f"{option} must be at most {2**31 - 1}, got {text!r}")
    return value


def top_k_filter(text: str | None) -> int | None:
    """--top-k of a run filter: a whole number >= 0 (None: not given)."""
    return _whole_filter(text, "--top-k", 0)


# The run filter --max-new-tokens of cost, project, report and scheduler (telemetry.queries.Filters): the runs
# recorded with this answer length cap (bench --max-new-tokens, loadtest --max-tokens); a server's runs record
# none.
MAX_NEW_TOKENS_FILTER_HELP = ("only runs recorded with this answer length cap (bench --max-new-tokens, loadtest "
                              "--max-tokens), a whole number >= 1; runs that recorded none (a server's, or recorded "
                              "before the store kept it) match no value (default: every run)")


def max_new_tokens_filter(text: str | None) -> int | None:
    """--max-new-tokens of a run filter: a whole number >= 1 (None: not given)."""
    return _whole_filter(text, "--max-new-tokens", 1)


# The run filter --invocation of cost, project and export: one bench's or load test's runs (runs.invocation_id),
# named as bench and loadtest print it, by its first characters, or 'latest'.
INVOCATION_FILTER_HELP = ("only the runs of one bench or load test: 'latest' (the newest whose runs have all ended "
                          "and that completed a request), "
                          "its invocation id as bench / loadtest print it, or the id's first 4+ characters "
                          "(`specfinops invocations` lists them)")


# The run filter --target of cost, project and export (report's says the same, and how it refuses): a name
# selects every folder of that model (queries.target_matches)
TARGET_FILTER_HELP = ("only runs of this target model: its folder's name (every folder of that name, on any node) "
                      "or its path as the runs recorded it")


# The run filter --workload of cost, project and export (report's says the same): a workload file by any path to it
# (queries.workload_names)
WORKLOAD_FILTER_HELP = ("only runs of this workload: a builtin name (code, chat, rewrite, mixed) or a workload file by "
                        "any path to it (relative or absolute, as bench ran it or not)")


def invocation_filter(engine, text: str | None) -> str | None:
    """--invocation of a run filter, resolved in the store to one whole id (None: not given). With engine None
    only its form is checked (before the store is opened), and None returned."""
    if text is None:
        return None
    from telemetry.invocations import invocation_text, resolve_invocation

    try:
        if engine is None:
            invocation_text(text)
            return None
        return resolve_invocation(engine, text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def lost_records(db: str | None, invocation_id: str | None) -> tuple[int | None, str | None]:
    """The records a recording command's runs could not write to the store `db` (runs.dropped_records: a full
    recorder buffer, or rows the database refused), and the warning its last line gives: (0, None) where nothing
    was lost or nothing recorded (`invocation_id` None). The store is read again for the count, which the runs'
    ends wrote; where it cannot be read now (the database gone, often why records were lost), (None, a warning
    saying so): the command still writes its table and JSON, and fails."""
    if invocation_id is None:
        return 0, None
    from telemetry.invocations import dropped_records
    from telemetry.store import open_store

    engine = None
    try:
        engine = open_store(db, must_exist=True)
        lost = dropped_records(engine, invocation_id)
    except Exception as exc:  # noqa: BLE001 - said, not raised: what ran must still be reported
        return None, (f"warning: could not read the store to check that invocation {invocation_id[:8]}'s records "
                      f"were all written ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): "
                      "`specfinops invocations` shows what it holds once it can be read")
    finally:
        if engine is not None:
            engine.dispose()
    if not lost:
        return 0, None
    return lost, (f"warning: {lost} record{'' if lost == 1 else 's'} of invocation {invocation_id[:8]} could not be "
                  "written to the store (the log above says why): its runs' figures there fall short of this "
                  "table's (runs.dropped_records counts them per run)")


def check_power_options(power: str, tdp_w: float | None) -> None:
    """--power and --tdp-w, before any model loads: what `detect_power_source` and its TDP estimate would
    refuse only once the run starts, and a --tdp-w that the chosen source would silently ignore."""
    import math

    from telemetry.power import PREFERENCES

    if power not in PREFERENCES:
        raise UsageError(f"--power must be one of {' | '.join(PREFERENCES)}, got {power!r}")
    if tdp_w is not None and not (math.isfinite(tdp_w) and tdp_w > 0):
        raise UsageError(f"--tdp-w must be > 0 watts, got {tdp_w:g}")
    if power == "estimate" and tdp_w is None:
        raise UsageError("--power estimate needs --tdp-w (the device's TDP in watts)")
    if tdp_w is not None and power not in ("estimate", "auto"):  # auto: the estimate where no meter opens
        raise UsageError("--tdp-w applies to --power estimate or auto (its fallback when neither NVML nor RAPL "
                         f"can be read); --power {power} does not use it: drop --tdp-w or change --power")


# the largest lookahead K a command drafts, measures or bounds (bench, serve, calibrate): far past where any
# draft's speedup bound peaks, so a larger one only spins (calibrate --k-max 1e8 spun for minutes; bench --k 1000
# loaded the model to draft 1000 tokens a step)
MAX_K = 64


def check_max_k(flags: str, got: str, *ks: int) -> None:
    """The lookahead options `flags` (as the error names them, e.g. '--k and --k-max'), given as `got`, whose
    numbers `ks` must each be at most MAX_K: refused before any model loads."""
    if any(k > MAX_K for k in ks):
        raise UsageError(f"{flags} must be at most {MAX_K}, got {got}: a K beyond any draft's reach only spins "
                         "(a draft's speedup bound peaks far below it)")


def check_recording_options(no_telemetry: bool, given: list[str]) -> None:
    """With --no-telemetry, the options `given` that only shape what is recorded (--db, --node-id, a power
    meter's): refused, before any model loads, as `bench.check_combinations` refuses every other option a run
    would silently ignore; a user who gave --db meant to record, and got nothing. SPECFINOPS_DB_URL is no
    option given: --no-telemetry beside it records nothing, as asked."""
    if no_telemetry and given:
        one = len(given) == 1
        raise UsageError(f"{', '.join(given)} {'shapes' if one else 'shape'} what is recorded, and --no-telemetry "
                         f"records nothing: drop {'it' if one else 'them'}, or drop --no-telemetry to record")


def _exists(path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long to look up: not there (mkdir says why it cannot be made)
        return False


@contextlib.contextmanager
def removing_made_folders(folder, *, always: bool = False):
    """Within the block, `folder` and the folders above it that do not exist yet are noted; those of them the
    block made are removed again, deepest first, when it raises (`always`: however it ends): an output folder
    made for a command that then failed (a read-only store refusing the report's record, Ctrl-C) is not left
    behind, empty. Only empty folders go: one something else put a file in meanwhile is kept, with those above
    it. A folder that was there before the block is never touched."""
    import os
    from pathlib import Path

    path = Path(os.path.abspath(Path(folder).expanduser()))  # ".." folded: each folder made is one to remove
    made = [d for d in (path, *path.parents) if not _exists(d)]  # deepest first
    done = False
    try:
        yield
        done = True
    finally:
        if always or not done:
            for d in made:  # those a failed mkdir made too
                if not _exists(d):
                    continue
                try:
                    d.rmdir()
                except OSError:
                    break  # something else put a file there meanwhile: keep it


def check_writable(path: str | None, flag: str) -> None:
    """Refuse an output path that cannot be written, before the work whose result it is to hold: a
    directory, or a parent that cannot be made. Tried as the end will write it (its folders made, the file
    opened), then left as it was: no file and no folder stays behind from a command refused later (the
    writer makes them again)."""
    if not path:
        return
    import os
    from pathlib import Path

    p = Path(os.path.abspath(Path(path).expanduser()))
    if _exists(p) and p.is_dir():
        raise UsageError(f"{flag} {path} is a directory: give a file name")
    with removing_made_folders(p.parent, always=True):
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"{flag} {path}: cannot make its directory: {exc.strerror or exc}") from None
        if not os.access(p.parent, os.W_OK) or (_exists(p) and not os.access(p, os.W_OK)):
            raise UsageError(f"{flag} {path}: not writable")
        # os.access answers yes to root almost everywhere (/proc too): open it as the end will, leave no file
        existed = _exists(p)
        try:
            with p.open("a"):
                pass
        except OSError as exc:
            raise UsageError(f"{flag} {path}: not writable: {exc.strerror or exc}") from None
        if not existed:
            p.unlink(missing_ok=True)


def open_db_option(url: str | None):
    """The store --db names, opened (created or upgraded) for a command that records into it (bench, loadtest,
    serve), now rather than after its model loads or its load starts: what is wrong with it named under --db
    ('[Errno 2] No such file or directory: /proc/x' did not say which option), a store that refuses writes
    (read-only, or a role without INSERT) included: it opens fine, and its first insert failed only after the
    work (telemetry.store.NotWritableError). The caller disposes of the Engine."""
    from telemetry.db import DeviceFullError
    from telemetry.store import StoreError, open_store

    try:
        return open_store(url, to_write=True)
    except (StoreError, UsageError, ValueError, DeviceFullError):
        raise  # these name the database already
    except OSError as exc:
        raise UsageError(f"--db {url}: cannot create the store: {exc.strerror or exc}"
                         + (f": {exc.filename}" if exc.filename else "")) from None


@contextlib.contextmanager
def store_opened_for(db: str | None, no_telemetry: bool):
    """With telemetry on, the --db store opened now (`open_db_option`: an unusable or read-only one refused before
    any model loads), and a SQLite file this creates (with the folders made for it) removed again where the block
    raises before a run was recorded in it: a command refused, failed or stopped (Ctrl-C, SIGTERM) while its models
    loaded or warmed up (bench, calibrate: the block holds the whole measurement) leaves no store behind. Once it
    holds a run, it stays (the run stopped 'cancelled', or 'failed'), as it does where another process wrote a row
    there meanwhile (remove_unused_store). The engines opened on that file in the block are disposed of first
    (`engines_made`): one left open (a store read and dropped, a recorder made before what raised, the exception's
    traceback holding it alive) kept the new store 'in use', and it stayed."""
    from telemetry.db import dispose_engines_on, engines_made

    made = []
    if not no_telemetry:
        from telemetry.db import new_store_paths, resolve_db_url, sqlite_file

        made = new_store_paths(sqlite_file(resolve_db_url(db)))
        open_db_option(db).dispose()
    with engines_made() as engines:
        try:
            yield
        except BaseException:
            from telemetry.db import remove_unused_store

            if made:  # an engine on it the block left open (the exception's traceback holds it) keeps it in use
                dispose_engines_on(engines, made[-1])
            remove_unused_store(made)
            raise


def bindable_port(host: str, port: int) -> int:
    """`port` (0: a free one) if this process could listen on host:port now; a clear error otherwise."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host!r} is not an address this machine can listen on: {exc.strerror}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            what = "is in use (another dashboard or server?); pick another --port" if exc.errno == errno.EADDRINUSE \
                else f"cannot be listened on: {exc.strerror}"
            raise UsageError(f"{host}:{port} {what}") from None
        return s.getsockname()[1]


def default_text(value) -> str | None:
    """An option's default as its --help says it; None where there is none to say (None, a flag's False, an
    empty list, argparse.SUPPRESS)."""
    if value is None or isinstance(value, bool) or value == argparse.SUPPRESS:
        return None
    if isinstance(value, list | tuple):
        return ",".join(map(str, value)) if value else None
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


_STATES_DEFAULT = re.compile(r"\bdefault\b", re.IGNORECASE)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option with a default says it: "(default: X)" after its help, or as its help where it has none,
    unless the help already speaks of its default ("(default 1)", "auto (the default: ...)")."""

    def _format_action(self, action):
        shown = default_text(action.default)
        if shown is not None and action.help is not argparse.SUPPRESS \
                and not _STATES_DEFAULT.search(action.help or ""):
            said = f"(default: {shown})".replace("%", "%%")  # the help is %-expanded
            action = copy.copy(action)  # the parser's own action keeps its help
            action.help = f"{action.help} {said}" if action.help else said
        return super()._format_action(action)

    def _format_action_invocation(self, action):
        """An option with an alias (`report --sla-ms` and `project --p95-tpot-sla-ms` name one thing) names its
        value once, `--sla-ms, --p95-tpot-sla-ms X` (Python 3.13's form), not after each spelling."""
        if len(action.option_strings) < 2 or action.nargs == 0:
            return super()._format_action_invocation(action)
        value = self._format_args(action, self._get_default_metavar_for_optional(action))
        return f"{', '.join(action.option_strings)} {value}"


def add_command(sub, name: str, help_: str, examples: str, handler) -> argparse.ArgumentParser:
    """Add a sub-command whose --help ends with examples and states every option's default."""
    p = sub.add_parser(
        name,
        help=help_,
        description=help_,
        epilog="examples:\n" + examples,
        formatter_class=HelpFormatter,
        allow_abbrev=False,  # `project --run 3` is not `--run-kind 3`: an option is named in full
    )
    p.set_defaults(handler=handler, command_parser=p)  # app.cli names unknown options under this usage
    return p


def usage_shows_required(p: argparse.ArgumentParser, *dests: str) -> None:
    """The usage line shows the options `dests` as required (no brackets), while the command's handler, not
    argparse, checks them: its error stays one line (`specfinops CMD: error: missing --X`, exit 2) where
    argparse's would print the usage and exit from inside the parsing. Call once every option is added."""
    actions = [a for a in p._actions if a.dest in dests]
    assert len(actions) == len(dests), f"no option for some of {dests}"
    for a in actions:
        a.required = True
    try:
        usage = p.format_usage().removeprefix("usage: ").rstrip("\n")
    finally:
        for a in actions:
            a.required = False
    p.usage = usage.replace("%", "%%")  # argparse %-expands a usage (%(prog)s)


def db_url(text: str) -> str:
    """argparse type of --db: refuse what names no store before anything opens one (an empty value would
    silently mean the default store), name a port that is no number or a host in brackets that does not parse,
    and take libpq's `postgres://` (telemetry.db.checked_db_url, which SPECFINOPS_DB_URL passes too)."""
    from telemetry.db import checked_db_url

    try:
        return checked_db_url(text)
    except ValueError as exc:  # argparse said only "invalid db_url value"; the URL is not repeated (a password)
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_db_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="URL", type=db_url, default=None, help=DB_HELP)


DTYPE_HELP = ("auto (the default: bfloat16 where the CPU multiplies bf16 in hardware, AVX512-BF16 or AMX, and on "
              "a GPU; on a CPU that emulates bf16, bfloat16 up to 8 sequences at a time, where the C bf16 kernel "
              "streams half the bytes, else float32, whose packed kernels are faster there), bfloat16 or float32 "
              "(the exactness reference). Records keep the precision chosen")


def stopped_as_on_ctrl_c(name: str, handler):
    """`handler` run within `sigterm_as_ctrl_c`, saying '<name>: SIGTERM: stopping as on Ctrl-C' (a command
    whose work is one transaction: SIGTERM's default exit said nothing, with status 143)."""

    @functools.wraps(handler)
    def run(args):
        with sigterm_as_ctrl_c(f"{name}: SIGTERM: stopping as on Ctrl-C"):
            return handler(args)

    return run


@contextlib.contextmanager
def sigterm_as_ctrl_c(say: str | None = None):
    """Within the block, SIGTERM (`kill`, `timeout`, `docker stop`) ends the command as Ctrl-C does: `say` goes
    to stderr, then the SIGINT handler runs where one is set (asyncio.run's cancels its main task), else
    KeyboardInterrupt is raised in the main thread. So cleanups run (a bench's run ends 'cancelled', a report
    removes its claim and temporary folder) and the exit status is 130, where SIGTERM's default exit left a
    run 'running' for good. Once: the handler disarms itself and further SIGTERMs are ignored until the
    process exits (`timeout` signals the process and then its group; the second must not interrupt the
    cleanup). Where SIGINT was ignored before the block (a background job of a script inherits that), SIGTERM
    raises KeyboardInterrupt all the same: it printed "stopping" and did nothing, and only SIGKILL ended the
    command, leaving its run 'running'. Not fired: the previous handler is put back. Off the main thread
    nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # SIGINT ignored from the start: inherited (a job started with `&` by a script, nohup), not a first Ctrl-C
    # handled; no Ctrl-C can reach the command then, and SIGTERM is what stops it
    ignored_from_start = signal.getsignal(signal.SIGINT) is signal.SIG_IGN

    def interrupt(_signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # first: a second one must not interrupt the stopping
        if say:
            print(say, file=sys.stderr, flush=True)
        on_int = signal.getsignal(signal.SIGINT)
        if on_int is signal.SIG_IGN and not ignored_from_start:  # a first Ctrl-C already started the stopping
            return
        if callable(on_int) and on_int is not signal.default_int_handler:
            on_int(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is interrupt:  # not fired: put back (fired: ignored from now on)
            signal.signal(signal.SIGTERM, previous)


def model_option(flag: str, value: str | None, role: str, draft_flag: str | None = "--draft-model"):
    """The model directory a model option (--target, --draft-model, --draft) names, resolved before any model
    loads: a path that does not exist, or a directory without config.json, refused under `flag` (loading the
    target first took half a minute, then said only "unknown model '/no/such/dir'"). None: the option not
    given (the command's default model). `draft_flag`: the command's option for a draft, named where a draft is
    given as the target (None: the command takes no draft, as distill)."""
    if value is None:
        return None
    from serving.models import resolve_model

    try:
        path = resolve_model(value, role, flag)
    except ValueError as exc:
        raise UsageError(f"{flag} {value}: {exc}") from None
    if role == "target":
        _refuse_draft_as_target(flag, value, path, f"give it as the draft ({draft_flag}), with the model it was "
                                "distilled for as --target" if draft_flag else "give the target model it was "
                                "distilled for as --target")
    return path


def local_target_option(flag: str, value: str | None) -> None:
    """A --target a backend that also takes hub ids (vLLM) gets: a local folder or bundled name holding a feature
    draft is refused as `model_option` refuses it, and one that names no model (a folder without config.json, the
    bundled draft's name with none installed) under `flag` as there; a hub id (a path with '/' that is not there)
    is the backend's."""
    if value is None:
        return
    from pathlib import Path

    from serving.models import resolve_model

    try:
        path = resolve_model(value, "target")
    except ValueError as exc:
        if "/" in value and not Path(value).expanduser().exists():
            return  # e.g. meta-llama/Llama-3.1-8B-Instruct: vLLM fetches it
        raise UsageError(f"{flag} {value}: {exc}") from None
    _refuse_draft_as_target(flag, value, path, "give the model it was distilled for as --target (vLLM cannot "
                            "load a feature draft as the draft either)")


def _refuse_draft_as_target(flag: str, value: str, path, fix: str) -> None:
    if path is not None and _is_feature_draft(path):
        # it would load as a target only to fail with transformers' warnings and a tokenizer error
        raise UsageError(f"{flag} {value}: a draft made by `specfinops distill` (a feature draft), not a target "
                         f"model: {fix}")


def _is_feature_draft(path) -> bool:
    """Whether a model directory holds a specfinops feature draft; a config.json that does not read is left to
    loading, which names what is wrong with it."""
    from serving.eagle import is_eagle_dir

    try:
        return is_eagle_dir(path)
    except ValueError:
        return False

"""What `bench` and `loadtest` share about being stopped: Ctrl-C handled once (a second one must not interrupt
the stopping), the JSON and the table of what ran (`--json -`: the JSON alone on stdout, the table on stderr),
and the line that says a result is partial."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from pathlib import Path


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def once(handler):
    """A SIGINT handler that first ignores SIGINT from then on, then runs `handler`: a second Ctrl-C pressed while
    the first is being handled (the recorder's flush, the run's end) must not interrupt that cleanup."""

    def first(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # first: a second Ctrl-C must not interrupt the stopping
        return handler(signum, frame)

    return first


@contextlib.contextmanager
def sigint_restored():
    """Within the block SIGINT's handler may change (set `once`, or ignored after it fired); afterwards the one
    found on entry is put back. Off the main thread, where no handler can be set, nothing is done."""
    if not _on_main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is not before:
            signal.signal(signal.SIGINT, before)


@contextlib.contextmanager
def ctrl_c_once():
    """Within the block, the first Ctrl-C raises KeyboardInterrupt and further ones are ignored until the block
    ends, when Python's default handler is back. Off the main thread, or where SIGINT is not Python's default
    handler, nothing is installed."""
    if not _on_main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    with sigint_restored():
        signal.signal(signal.SIGINT, once(interrupt))
        yield


async def ctrl_c_once_async(coro):
    """Await `coro` (inside asyncio.run) with asyncio.run's Ctrl-C handler, which cancels the main task, made to
    ignore further Ctrl-Cs; the caller puts the previous handler back (`sigint_restored`) after asyncio.run."""
    on_int = signal.getsignal(signal.SIGINT)
    if _on_main_thread() and callable(on_int) and on_int is not signal.default_int_handler:
        signal.signal(signal.SIGINT, once(on_int))
    return await coro


def table_file(json_path: str | None):
    """Where the table goes: stdout, unless the JSON goes there (`--json -`): then stderr, beside the progress."""
    return sys.stderr if json_path == "-" else sys.stdout


def write_json(json_path: str | None, doc: dict, *, say_wrote: bool = False) -> None:
    """`--json PATH`: `doc` to PATH (its folders made), 'wrote PATH' on stderr where `say_wrote`; '-': to stdout.
    None: nothing."""
    text = json.dumps(doc, indent=1) + "\n"
    if json_path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    elif json_path:
        path = Path(json_path).expanduser()  # as check_writable read it (`--json=~/x.json` has no shell expansion)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if say_wrote:
            print(f"wrote {json_path}", file=sys.stderr)


def interrupted_line(num_done: int, num_planned: int, unit: str) -> str:
    """The first line of a partial table: 'interrupted (Ctrl-C or SIGTERM): 5 of 8 requests done; partial
    results'."""
    return f"interrupted (Ctrl-C or SIGTERM): {num_done} of {num_planned} {unit} done; partial results"

"""What the server's log says about requests: refusals (503) and cancellations, at most one line per kind per
window with the count; and `serve --access-log` for uvicorn's access log (it was hard-coded off). No model."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from serving.server import RequestLog
from serving.server_setup import ServeOptions, graceful_server


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "serving.server"]


def test_a_flood_of_rejections_is_said_once_then_counted_per_window(caplog):
    """The first refusal is said at once with its detail; the next ones within the window are one line at its
    end with their count; a window that saw none closes, and the next refusal is said at once again."""
    caplog.set_level(logging.INFO, logger="serving.server")

    async def main():
        said = RequestLog(every_s=0.01)
        for _ in range(192):
            said.note(logging.WARNING, "rejected", "overloaded", "the server is overloaded (3 requests waiting)")
        said.note(logging.INFO, "cancelled", "the client went away", "cmpl-1")
        assert _lines(caplog) == ["rejected a request (overloaded): the server is overloaded (3 requests waiting)",
                                  "cancelled a request (the client went away): cmpl-1"]
        await asyncio.sleep(0.1)  # (timers run in order of their deadlines: both windows ended before this one)
        assert len(_lines(caplog)) == 3 and _lines(caplog)[2].startswith("rejected 191 more requests (overloaded) "
                                                                         "in the last ")
        await asyncio.sleep(0.1)  # a window without a refusal: closed
        said.note(logging.WARNING, "rejected", "overloaded", "again")
        assert _lines(caplog)[3:] == ["rejected a request (overloaded): again"]

    asyncio.run(main())
    levels = {r.getMessage().split(" ")[0]: r.levelno for r in caplog.records}
    assert levels == {"rejected": logging.WARNING, "cancelled": logging.INFO}


def test_the_counts_not_said_yet_are_said_when_the_server_stops(caplog):
    caplog.set_level(logging.INFO, logger="serving.server")

    async def main():
        said = RequestLog(every_s=3600)
        for i in range(3):
            said.note(logging.INFO, "cancelled", "the client went away", f"cmpl-{i}")
        said.close()

    asyncio.run(main())
    assert _lines(caplog) == ["cancelled a request (the client went away): cmpl-0",
                              "cancelled 2 more requests (the client went away) in the last 0 s"]


def test_access_log_is_an_option_off_by_default(capsys):
    from app.cli import build_parser

    assert graceful_server(SimpleNamespace(), ServeOptions()).config.access_log is False
    assert graceful_server(SimpleNamespace(), ServeOptions(access_log=True)).config.access_log is True
    parser = build_parser()
    assert parser.parse_args(["serve", "--access-log"]).access_log is True
    assert parser.parse_args(["serve"]).access_log is False


def test_serve_hands_access_log_to_the_server(monkeypatch):
    import app.commands.serve as command
    import serving.server_setup as setup
    from app.cli import main

    seen = []
    monkeypatch.setattr(command, "bindable_port", lambda host, port: None)
    monkeypatch.setattr(setup, "serve", lambda opts, **kw: seen.append(opts))  # no model, no uvicorn
    for argv, expected in ((["--access-log"], True), ([], False)):
        assert main(["serve", *argv, "--no-telemetry", "--power", "none"]) == 0
        assert seen.pop().access_log is expected

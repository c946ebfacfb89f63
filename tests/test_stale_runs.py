"""A run whose process was killed outright (SIGKILL: nothing ends its run) reads 'stale', not 'running': in
`specfinops invocations` (text and JSON), in the run summaries that cost, export and the dashboard read, and in
the line cost says of runs that did not complete (telemetry.liveness). A live one still reads 'running'."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from app.cli import main
from telemetry.costing import incomplete_runs_text
from telemetry.invocations import list_invocations
from telemetry.liveness import STALE, process_gone, process_key
from telemetry.queries import run_summaries
from telemetry.store import open_store

REPO = Path(__file__).resolve().parents[1]
INVOCATION = "5555eeee" + "0" * 24

CHILD = textwrap.dedent("""
    import sys, time, random
    sys.path.insert(0, "tests")
    from dataclasses import replace
    from recorder_child import run_info
    from telemetry.recorder import Recorder
    from telemetry.store import open_store
    from telemetry.synthetic import synthetic_request

    engine = open_store(sys.argv[1], to_write=True)
    rec = Recorder(engine, flush_interval_s=0.02)
    run_id = rec.start_run(replace(run_info(), invocation_id=sys.argv[2]))
    rng = random.Random(1)
    for _ in range(3):
        rec.record_request(run_id, synthetic_request(rng, 20))
    assert rec.flush(timeout=30)
    print(f"run {run_id}", flush=True)
    while True:  # until killed: the run is never ended
        time.sleep(1)
""")


def _statuses(url: str) -> tuple[list[str], tuple[int, int]]:
    engine = open_store(url, must_exist=True)
    try:
        (inv,) = list_invocations(engine)
        return [r.status for r in run_summaries(engine)], (inv.num_running, inv.num_stale)
    finally:
        engine.dispose()


def test_a_run_whose_process_was_killed_reads_stale_not_running(sqlite_url, capsys):
    child = subprocess.Popen([sys.executable, "-c", CHILD, sqlite_url, INVOCATION], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        line = child.stdout.readline()
        assert line.startswith("run "), line
        assert _statuses(sqlite_url) == (["running"], (1, 0))  # its process is there: under way
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()  # reaped: its pid is free for the kernel to hand out again
        child.stdout.close()

    statuses, counts = _statuses(sqlite_url)
    assert statuses == [STALE]
    assert counts == (0, 1)
    engine = open_store(sqlite_url, must_exist=True)
    try:  # cost says so, and counts its finished requests
        said = incomplete_runs_text(run_summaries(engine))
        assert "run 1 stale (its process is gone" in said and "finished requests are counted" in said
    finally:
        engine.dispose()

    assert main(["invocations", "--db", sqlite_url, "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["invocations"]
    assert (listed["running_runs"], listed["stale_runs"]) == (0, 1)
    assert main(["invocations", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert "(stale)" in out and "(running)" not in out


def test_a_pid_now_another_process_or_a_reboot_is_gone_and_what_cannot_be_checked_is_not():
    me = os.getpid()
    key = process_key()
    version, host, machine, boot, namespace, start = key.split("|")
    assert not process_gone(me, key)  # this very process
    assert process_gone(me, "|".join((version, host, machine, boot, namespace, str(int(start or 0) + 1))))  # reused
    if machine:  # the same machine booted since: every process of the old boot is gone
        assert process_gone(me, "|".join((version, host, machine, "another-boot", namespace, start)))
        assert not process_gone(me, "|".join((version, host, "another-machine", "another-boot", namespace, start)))
    assert not process_gone(me, "|".join((version, "another-host", machine, boot, namespace, start)))
    assert not process_gone(me, "|".join((version, host, machine, boot, "pid:[1]", start)))  # another container
    assert not process_gone(None, None) and not process_gone(me, None)  # recorded before 0014: unknown

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
from datetime import UTC, datetime
from pathlib import Path

import pytest

import telemetry.liveness as liveness
from app.cli import main
from telemetry.costing import incomplete_runs_text
from telemetry.invocations import list_invocations
from telemetry.liveness import STALE, process_gone, process_key, shown_status, stale_ids
from telemetry.queries import run_summaries
from telemetry.store import open_store

REPO = Path(__file__).resolve().parents[1]
INVOCATION = "5555eeee" + "0" * 24
BEFORE_BOOT = datetime(2000, 1, 1)  # a run's started_at (naive UTC, as SQLite keeps it) before any boot of this machine

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
    _, host, machine, boot, namespace, _time_ns, start = key.split("|")
    version = "1"  # keys recorded before they named the time namespace: read as they were
    assert not process_gone(me, key)  # this very process
    assert process_gone(me, "|".join((version, host, machine, boot, namespace, str(int(start or 0) + 1))))  # reused
    if machine:  # the same machine booted since, the run started before that boot: every process of it is gone
        assert process_gone(me, "|".join((version, host, machine, "another-boot", namespace, start)), BEFORE_BOOT)
        assert not process_gone(me, "|".join((version, host, "another-machine", "another-boot", namespace, start)),
                                BEFORE_BOOT)
    assert not process_gone(me, "|".join((version, "another-host", machine, boot, namespace, start)))
    assert not process_gone(me, "|".join((version, host, machine, boot, "pid:[1]", start)))  # another container
    assert not process_gone(None, None) and not process_gone(me, None)  # recorded before 0014: unknown


def test_a_reboot_makes_stale_only_a_run_that_started_before_it():
    """Machines cloned from one image share host name and /etc/machine-id, each with its own boot id: a run another
    one started (sharing a PostgreSQL store) read 'stale' here, as if this machine had rebooted since. A run that
    started after this machine booted cannot be one of an earlier boot's processes: it keeps 'running'."""
    _, host, machine, _boot, namespace, time_ns, start = process_key().split("|")
    if not machine or liveness._boot_time() is None:
        pytest.skip("no machine id or boot time to tell a reboot by")
    other_boot = "|".join(("2", host, machine, "another-boot", namespace, time_ns, start))
    now = datetime.now(UTC)
    assert not process_gone(os.getpid(), other_boot, now)  # a clone's run, started since this machine booted
    assert not process_gone(os.getpid(), other_boot, now.replace(tzinfo=None).isoformat())  # as text, naive UTC
    assert not process_gone(os.getpid(), other_boot)  # when it started not known: cannot tell
    assert process_gone(os.getpid(), other_boot, BEFORE_BOOT)  # started before this boot: its process is gone
    assert process_gone(os.getpid(), other_boot, BEFORE_BOOT.isoformat(sep=" "))
    assert shown_status("running", os.getpid(), other_boot, now) == "running"
    assert shown_status("running", os.getpid(), other_boot, BEFORE_BOOT) == STALE
    assert stale_ids([(1, "running", os.getpid(), other_boot, now),
                      (2, "running", os.getpid(), other_boot, BEFORE_BOOT)]) == {2}


def test_a_process_in_another_time_namespace_is_not_checked():
    """/proc/<pid>/stat's start time is shifted by the reader's time namespace: a live run recorded in another one
    read as another process (another start time), 'stale'. The key names the time namespace; another one keeps
    'running', as another pid namespace does. Keys recorded before it was named are read as they were."""
    me = os.getpid()
    _, host, machine, boot, namespace, time_ns, start = process_key().split("|")
    if not boot or not start:
        pytest.skip("no /proc to read start times from")
    shifted = str(int(start) + 1)  # what the same process's start reads as from another time namespace
    assert process_gone(me, "|".join(("2", host, machine, boot, namespace, time_ns, shifted)))  # here: reused pid
    assert not process_gone(me, "|".join(("2", host, machine, boot, namespace, "time:[4026531834x]", shifted)))
    assert process_gone(me, "|".join(("1", host, machine, boot, namespace, shifted)))  # an old key: as before
    assert not process_gone(me, "|".join(("1", host, machine, boot, namespace, start)))
    assert not process_gone(me, "|".join(("2", host, machine, boot, namespace, time_ns)))  # a field short: unread


def test_time_namespace_is_in_the_key():
    try:
        mine = os.readlink("/proc/self/ns/time")
    except OSError:
        mine = ""
    assert process_key().split("|")[0] == "2" and process_key().split("|")[5] == mine


def test_windows_never_signals_a_pid_to_probe_it(monkeypatch):
    """Without /proc the pid was probed with os.kill(pid, 0); on Windows signal 0 is CTRL_C_EVENT, and CPython
    sends a console Ctrl-C (GenerateConsoleCtrlEvent) to the process group: it cannot be checked there, and the
    run keeps 'running'. Elsewhere (a BSD, macOS) signal 0 only probes."""
    killed = []

    def kill(pid, sig):
        killed.append((pid, sig))
        raise ProcessLookupError

    host = "a-host"
    monkeypatch.setattr(liveness, "_machine", lambda: (host, "", "", "", ""))  # no /proc: no boot id, namespaces
    monkeypatch.setattr(os, "kill", kill)
    key = "|".join(("2", host, "", "", "", "", ""))
    monkeypatch.setattr(os, "name", "nt")
    gone = process_gone(424242, key)
    status = shown_status("running", 424242, key)
    monkeypatch.setattr(os, "name", "posix")
    assert killed == []
    assert not gone and status == "running"
    assert process_gone(424242, key) and killed == [(424242, 0)]  # elsewhere: probed with signal 0, and gone

"""A command started with SIGINT ignored (a background job of a script, `nohup`: the child inherits SIG_IGN)
can be stopped by no Ctrl-C; SIGTERM is what stops it. `sigterm_as_ctrl_c` read that inherited SIG_IGN as "a
first Ctrl-C is already stopping us", printed "stopping" and did nothing: only SIGKILL ended the scheduler, and a
bench killed so left its run 'running' for good."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_sigterm_raises_where_sigint_was_ignored_from_the_start(capsys):
    from app.commands._common import sigterm_as_ctrl_c

    original_term, original_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited: before the block
        with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c("x: SIGTERM: stopping"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises in here
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # fired once: ignored until the process exits
    finally:
        signal.signal(signal.SIGTERM, original_term)
        signal.signal(signal.SIGINT, original_int)
    assert capsys.readouterr().err.count("SIGTERM: stopping") == 1


def test_a_scheduler_started_with_sigint_ignored_stops_on_sigterm(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    from telemetry.store import open_store

    open_store(url).dispose()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "scheduler", "--db", url, "--cron", "0 6 * * *", "--out",
         str(tmp_path / "reports")], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # what `cmd &` in a script does
    try:
        deadline = time.monotonic() + 120
        line = ""
        while "SIGTERM to stop" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert "SIGTERM to stop" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)  # it printed "stopping" and ran on, until SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    assert rc == 130, err
    assert "scheduler: SIGTERM: stopping" in err

"""Commands started in separate processes and released at one moment: races on one store.

    race(tmp_path, [["prices", "set", ...], ["db", "upgrade", ...]]) -> [CompletedProcess, ...]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RACER = """
import sys, time
from pathlib import Path
from app.cli import main
import telemetry.prices, telemetry.store  # loaded before the start, so the processes meet at the store
go = Path(sys.argv[2])
Path(sys.argv[3]).touch()  # ready
while not go.exists():
    time.sleep(0.001)
sys.exit(main(sys.argv[4:]))
"""


def race(tmp_path: Path, commands: list[list[str]]) -> list[subprocess.CompletedProcess]:
    """Start every command in its own process, all released at the same moment once they have imported."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    go = tmp_path / "go"
    procs = []
    for i, argv in enumerate(commands):
        procs.append(subprocess.Popen(
            [sys.executable, "-c", RACER, "", str(go), str(tmp_path / f"ready{i}"), *argv], cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(len(commands))) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    results = []
    for p, argv in zip(procs, commands, strict=True):
        out, err = p.communicate(timeout=180)
        results.append(subprocess.CompletedProcess(argv, p.returncode, out, err))
    return results

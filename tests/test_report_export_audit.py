"""Audit of `specfinops report`, `scheduler`, `export` and `db` as a FinOps engineer uses them: the defects found."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy.orm import Session
from synthetic import Req, make_run

from telemetry.store import open_store

ROOT = Path(__file__).resolve().parents[1]

# an export whose rows stop coming after the first: the process is stopped part-way through its file
SLOW_EXPORT = """
import sys, time
import telemetry.export
real = telemetry.export.export_rows
def slow(engine, what, window):
    header, rows = real(engine, what, window)
    def some_then_wait():
        yield next(iter(rows))
        print("writing", flush=True)
        time.sleep(120)
        yield from rows
    return header, some_then_wait()
telemetry.export.export_rows = slow
from app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _fill(url: str) -> None:
    engine = open_store(url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(output_tokens=5, ttft_ms=10, e2e_ms=50, start_s=i) for i in range(3)])
        s.commit()
    engine.dispose()


def test_sigterm_during_an_export_leaves_no_partial_file(sqlite_url, tmp_path):
    """`timeout`/`docker stop`/`kill` send SIGTERM: the export stops as on Ctrl-C (exit 130, 'interrupted'),
    the earlier file untouched and no hidden temporary file left beside it (it was left, half-written)."""
    _fill(sqlite_url)
    out = tmp_path / "out"
    out.mkdir()
    target = out / "requests.csv"
    target.write_text("the previous export\n")
    proc = subprocess.Popen([sys.executable, "-c", SLOW_EXPORT, "export", "--db", sqlite_url, "--what", "requests",
                             "--out", str(target)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "writing", proc.communicate()
        assert any(p.name.endswith(".tmp") for p in out.iterdir())  # what the cleanup has to remove
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert sorted(p.name for p in out.iterdir()) == ["requests.csv"]
    assert target.read_text() == "the previous export\n"

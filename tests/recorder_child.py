"""Synthetic requests for recorder tests, and a child process that records them until it is killed.

    python tests/recorder_child.py sqlite:///path/store.db
(run with the repository root on PYTHONPATH) prints "run <id>" once the run exists, then records requests continuously (never returns by itself).
"""

from __future__ import annotations

import random
import sys

from telemetry.records import RunInfo
from telemetry.synthetic import synthetic_request  # noqa: F401 - re-exported for the tests


def run_info(mode: str = "spec") -> RunInfo:
    return RunInfo(
        mode=mode, node_id="test-node", hostname="test-host", device="cpu", backend="torch", dtype="float32",
        target="synthetic-target", drafter="synthetic-draft" if mode == "spec" else None,
        k_policy="fixed:4" if mode == "spec" else "none", temperature=0.0, workload="synthetic",
        power_source="none", software_version="test",
    )  # fmt: skip


def main(url: str) -> None:
    from telemetry.recorder import Recorder
    from telemetry.store import open_store

    engine = open_store(url)
    rec = Recorder(engine, max_buffered_requests=2_000, flush_interval_s=0.02)
    run_id = rec.start_run(run_info())
    print(f"run {run_id}", flush=True)
    rng = random.Random(1)
    while True:  # until SIGKILL
        for _ in range(50):
            rec.record_request(run_id, synthetic_request(rng, rng.randint(1, 400)))
        rec.flush(timeout=5.0)  # keep the buffer from overflowing; batches are still large


if __name__ == "__main__":
    main(sys.argv[1])

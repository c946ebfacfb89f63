"""Synthetic requests for recorder tests, and a child process that records them until it is killed.

    python tests/recorder_child.py sqlite:///path/store.db
(run with the repository root on PYTHONPATH) prints "run <id>" once the run exists, then records requests continuously (never returns by itself).
"""

from __future__ import annotations

import random
import sys
from datetime import UTC, datetime

from telemetry.records import RequestRecord, RunInfo, StepRow, TokenRow


def run_info(mode: str = "spec") -> RunInfo:
    return RunInfo(
        mode=mode, node_id="test-node", hostname="test-host", device="cpu", backend="torch", dtype="float32",
        target="synthetic-target", drafter="synthetic-draft" if mode == "spec" else None,
        k_policy="fixed:4" if mode == "spec" else "none", temperature=0.0, workload="synthetic",
        power_source="none", software_version="test",
    )  # fmt: skip


def synthetic_request(rng: random.Random, num_tokens: int, k: int = 4) -> RequestRecord:
    """A speculative request: one prefill token, then steps of K drafts emitting accepted + 1 tokens.
    num_drafts equals the number of steps; output_tokens equals the number of token rows."""
    tokens = [TokenRow(position=0, emit_offset_ms=10.0, step_index=-1, source="ar")]
    steps: list[StepRow] = []
    t_ms = 10.0
    while len(tokens) < num_tokens:
        accepted = rng.randint(0, k)
        emit = min(accepted + 1, num_tokens - len(tokens))
        t_ms += 3.0
        step = len(steps)
        steps.append(StepRow(step, k, accepted, emit, draft_ms=1.0, verify_ms=2.0, t_offset_ms=t_ms))
        for i in range(emit):
            source = "accepted" if i < accepted else ("bonus" if accepted == k else "correction")
            tokens.append(TokenRow(len(tokens), t_ms, step, source))
    return RequestRecord(
        started_at=datetime.now(UTC),
        domain="code",
        prompt_tokens=32,
        output_tokens=len(tokens),
        num_drafts=len(steps),
        num_draft_tokens=k * len(steps),
        num_accepted_tokens=sum(s.accepted for s in steps),
        ttft_ms=10.0,
        e2e_ms=t_ms,
        steps=steps,
        tokens=tokens,
    )


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

"""Two nodes, one store: two `specfinops bench` processes with different node ids write into the same
PostgreSQL database at the same time; every run and request of both is there, and the totals the dashboard
and cost figures read (telemetry.queries) equal the sum of the per-node totals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from serving import models
from telemetry.queries import Filters, mode_summaries, run_summaries

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

NODES = ("node-a", "node-b")
SUMMED = ("num_requests_ok", "output_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens")


def _bench(node: str, db_url: str, out: Path) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("specfinops")
    cmd = [str(exe), "bench", "--workload", "code", "--mode", "both", "--limit", "1", "--max-new-tokens", "8",
           "--dtype", "bfloat16", "--power", "estimate", "--tdp-w", "65", "--db", db_url, "--node-id", node,
           "--json", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "SPECFINOPS_DB_URL"} | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_nodes_write_one_store_concurrently_and_totals_add_up(pg_url, tmp_path):
    models.pull(say=lambda m: None, verify=False)
    t0 = time.monotonic()
    procs = {node: _bench(node, pg_url, tmp_path / f"{node}.json") for node in NODES}  # both start now
    for node, proc in procs.items():
        output, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, f"{node}:\n{output}"
    assert time.monotonic() - t0 < 240

    engine = create_engine(pg_url)
    try:
        with engine.connect() as c:
            runs = c.execute(text("select node_id, mode, status, backend from runs order by id")).all()
            assert sorted((r.node_id, r.mode) for r in runs) == sorted((n, m) for n in NODES for m in ("ar", "spec"))
            assert {(r.status, r.backend) for r in runs} == {("completed", "torch")}
            per_node = dict(c.execute(text("select r.node_id, count(*) from requests q join runs r on r.id = q.run_id "
                                           "group by r.node_id")).all())
            assert per_node == {"node-a": 2, "node-b": 2}  # 1 prompt x 2 modes per node, none lost
            tokens = c.execute(text("select sum(output_tokens) from requests")).scalar()
            assert c.execute(text("select count(*) from token_events")).scalar() == tokens > 0
        for node in NODES:  # what each process reported is what the store holds for its node
            report = json.loads((tmp_path / f"{node}.json").read_text())
            ids = {r["run_id"] for r in report["runs"]}
            assert {s.run_id for s in run_summaries(engine, Filters(node_id=node))} == ids
            assert sum(r["output_tokens"] for r in report["runs"]) == sum(
                s.stats.output_tokens for s in run_summaries(engine, Filters(node_id=node)))

        everything = {m.mode: m for m in mode_summaries(engine)}
        by_node = [{m.mode: m for m in mode_summaries(engine, Filters(node_id=n))} for n in NODES]
        assert set(everything) == {"spec", "ar"}
        for mode, total in everything.items():
            parts = [nodes[mode] for nodes in by_node]
            assert total.num_runs == sum(p.num_runs for p in parts) == 2
            for name in SUMMED:
                assert getattr(total.stats, name) == sum(getattr(p.stats, name) for p in parts), (mode, name)
            assert total.stats.wall_s == pytest.approx(sum(p.stats.wall_s for p in parts))
            assert total.stats.energy_j == pytest.approx(sum(p.stats.energy_j for p in parts))
        all_runs = run_summaries(engine)
        assert sorted(r.run_id for r in all_runs) == sorted(
            r.run_id for n in NODES for r in run_summaries(engine, Filters(node_id=n)))
    finally:
        engine.dispose()

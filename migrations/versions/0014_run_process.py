"""run process: which process recorded each run (runs.pid, runs.process_key).

A bench, load test or server killed outright (SIGKILL, the OOM killer, a crash, the machine going down) never
ends its runs: they stayed 'running' for good, and `invocations`, `cost`, the dashboard and the exports could not
tell them from runs still under way. Each run now records the process that started it: its pid, and
process_key, which names that process instance ('1|host|machine id|boot id|pid namespace|start ticks',
telemetry.liveness.process_key), so that a pid reused by another process since is not taken for it. A run left
'running' whose process is known to be gone reads 'stale' where the store is read (telemetry.liveness): derived,
never written. Nullable: a run recorded before this revision keeps NULL (unknown: it keeps reading 'running').

Upgrade adds the columns in place (ALTER TABLE ADD COLUMN, no table rebuild on SQLite). Downgrade drops them (the
processes recorded since are lost); on SQLite dropping a column rebuilds runs, so it checks foreign keys are off
first (0004, 0008, 0011).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("pid", "process_key")

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
DOWNGRADE_DROPS: dict = {"columns": {"runs": COLUMNS}}


def _no_cascade() -> None:
    """On SQLite the batch rebuild of runs drops the table; with foreign keys on, that deletes every request
    and step through ON DELETE CASCADE. migrations/env.py and telemetry.store turn them off first."""
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError("revision 0014's downgrade rebuilds the runs table: run it with SQLite foreign keys off "
                           "(`specfinops db downgrade` does), or its requests and steps would be deleted")


def upgrade() -> None:
    # op.add_column, not batch: SQLite adds a nullable column in place, so runs is not rebuilt
    op.add_column("runs", sa.Column("pid", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("process_key", sa.String(length=255), nullable=True))


def downgrade() -> None:
    _no_cascade()
    with op.batch_alter_table("runs") as batch:
        for column in reversed(COLUMNS):
            batch.drop_column(column)

"""run invocation: which command invocation recorded each run (runs.invocation_id, indexed).

One `specfinops bench --mode both` interleaves AR and spec in blocks of prompts, each block its own run, so both
modes see the same machine conditions; its concurrency levels and sweep levels are runs too. Nothing said which
runs came from one invocation, so speedups pooled every run of a configuration across invocations: an AR-only
bench made while the machine was loaded, pooled with the spec runs of an idle one, read 2.36x where every paired
invocation measured about 1.9x. Every run a bench, vLLM bench or load-test invocation records now carries that
invocation's id (a fresh uuid4, 32 hex digits), and telemetry.queries.speedups reports each invocation's own
spec/AR ratio beside the pooled figure. Nullable: a run recorded before this revision keeps NULL (unknown, no
invocation is guessed from start times), and so does a server's run (`specfinops serve` records one run per
mode for its lifetime, each serving whatever requests clients send it: not the same prompts in turns, so
nothing pairs them). String(36) holds a uuid in either form (hex or hyphenated). ix_runs_invocation_id: the runs of one invocation are found without a scan.

Upgrade adds the column in place (ALTER TABLE ADD COLUMN, no table rebuild on SQLite) and builds the index.
Downgrade drops both (the ids recorded since are lost); on SQLite dropping the column rebuilds runs, so it checks
foreign keys are off first (0004, 0008).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMN = "invocation_id"
INDEX = "ix_runs_invocation_id"

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
DOWNGRADE_DROPS: dict = {"columns": {"runs": (COLUMN,)}}


def _no_cascade() -> None:
    """On SQLite the batch rebuild of runs drops the table; with foreign keys on, that deletes every request
    and step through ON DELETE CASCADE. migrations/env.py and telemetry.store turn them off first."""
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError("revision 0011's downgrade rebuilds the runs table: run it with SQLite foreign keys off "
                           "(`specfinops db downgrade` does), or its requests and steps would be deleted")


def upgrade() -> None:
    # op.add_column, not batch: SQLite adds a nullable column in place, so runs is not rebuilt
    op.add_column("runs", sa.Column(COLUMN, sa.String(length=36), nullable=True))
    op.create_index(INDEX, "runs", [COLUMN], unique=False)


def downgrade() -> None:
    _no_cascade()
    op.drop_index(INDEX, table_name="runs")  # before the rebuild: batch mode would copy it to the new table
    with op.batch_alter_table("runs") as batch:
        batch.drop_column(COLUMN)

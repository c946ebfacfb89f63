"""run sampling limits: each run's top_k, seed and max_new_tokens.

Runs recorded temperature and top_p only, so sampled runs that differed in `--top-k` (or in the answer length
cap, or the seed) read as one configuration, and their speedups were pooled into one. Runs now record the
top_k (0 = off), seed and max_new_tokens of the sampling they ran with (telemetry.queries keys configurations
and comparable groups on top_p and top_k too). All three are nullable: a record written before this revision
keeps NULL (unknown: nothing is guessed for it), and so does a server's run (`specfinops serve`), whose
requests each choose their own, as its temperature and top_p already are (0004). seed is a BIGINT: the engine
takes 64-bit seeds; one past a signed 64-bit integer is recorded as NULL.

No per-request columns: requests.temperature / top_p (0004) exist because a server's requests choose their
own; their top_k, seed and max_tokens stay unrecorded for now. Recording them means changing the bench
worker's and the server engine's request records as well, and a bench or load-test request shares its run's
values anyway, which the run now records.

Upgrade adds the columns in place (ALTER TABLE ADD COLUMN, no table rebuild on SQLite). Downgrade drops them
(the values recorded since are lost); on SQLite that rebuilds runs, so it checks foreign keys are off (0004).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("top_k", "seed", "max_new_tokens")

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
DOWNGRADE_DROPS: dict = {"columns": {"runs": COLUMNS}}


def _no_cascade() -> None:
    """On SQLite the batch rebuild of runs drops the table; with foreign keys on, that deletes every request
    and step through ON DELETE CASCADE. migrations/env.py and telemetry.store turn them off first."""
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError("revision 0008's downgrade rebuilds the runs table: run it with SQLite foreign keys off "
                           "(`specfinops db downgrade` does), or its requests and steps would be deleted")


def upgrade() -> None:
    # op.add_column, not batch: SQLite adds a nullable column in place, so runs is not rebuilt
    op.add_column("runs", sa.Column("top_k", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("seed", sa.BigInteger(), nullable=True))
    op.add_column("runs", sa.Column("max_new_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    _no_cascade()
    with op.batch_alter_table("runs") as batch:
        for col in reversed(COLUMNS):
            batch.drop_column(col)

"""request sampling limits: each request's top_k, seed and max_new_tokens.

A server's requests each choose their own sampling, so its run records none (0004, 0008), and the requests
recorded only their temperature and top_p: two requests of one server run that asked for top_k 40 and top_k 0,
or for 16 and 1,024 new tokens, read alike in the requests CSV. Requests now record the top_k (0 = off), seed
and max_new_tokens (the answer length cap actually applied) of the sampling they ran with; bench and vLLM
bench requests record their run's. All three are nullable: a request recorded before this revision keeps NULL
(unknown), and so does one that asked for no seed. seed is a BIGINT, as runs.seed: a seed past a signed
64-bit integer is recorded as NULL.

Upgrade adds the columns in place (ALTER TABLE ADD COLUMN, no table rebuild on SQLite). Downgrade drops them
(the values recorded since are lost); on SQLite that rebuilds requests, whose steps and token events go with
it through ON DELETE CASCADE unless foreign keys are off, so it checks that first.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("top_k", "seed", "max_new_tokens")

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
DOWNGRADE_DROPS: dict = {"columns": {"requests": COLUMNS}}


def _no_cascade() -> None:
    """On SQLite the batch rebuild of requests drops the table; with foreign keys on, that deletes every step
    and token event through ON DELETE CASCADE. migrations/env.py and telemetry.store turn them off first."""
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError("revision 0010's downgrade rebuilds the requests table: run it with SQLite foreign keys "
                           "off (`specfinops db downgrade` does), or its steps and token events would be deleted")


def upgrade() -> None:
    # op.add_column, not batch: SQLite adds a nullable column in place, so requests is not rebuilt
    op.add_column("requests", sa.Column("top_k", sa.Integer(), nullable=True))
    op.add_column("requests", sa.Column("seed", sa.BigInteger(), nullable=True))
    op.add_column("requests", sa.Column("max_new_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    _no_cascade()
    with op.batch_alter_table("requests") as batch:
        for col in reversed(COLUMNS):
            batch.drop_column(col)

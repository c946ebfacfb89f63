"""request counts nullable: prompt tokens and speculation counts a load test could not know are NULL, not 0.

A load-test request learns its prompt tokens and speculation counts from the usage the server sends at the end
of the stream. A stream the load test cuts itself (its drain deadline, Ctrl-C) or whose connection is lost ends
without usage: the client then knows the tokens it received, but not the prompt tokens nor how many drafts the
server made for it. Those were stored as 0 (the columns were NOT NULL), and a CSV export read "0 prompt tokens,
0 drafts" for a request that had both. They are now NULL (unknown). Sums skip NULL, so every aggregate is as
before; nothing recorded before this revision changes.

Upgrade drops NOT NULL from requests.prompt_tokens, num_drafts, num_draft_tokens and num_accepted_tokens
(PostgreSQL: ALTER COLUMN; SQLite: a rebuild of requests, with foreign keys off, as 0009). Downgrade writes 0
where they are NULL, as the recorder did before, and restores NOT NULL.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("prompt_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens")

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
# values: (what is lost, {rows} the rows it is lost of; the SQL condition that finds them)
DOWNGRADE_DROPS: dict = {"values": {"requests": (
    ("the unknown (NULL) prompt and speculation counts of {rows}, written as 0",
     " OR ".join(f"{c} IS NULL" for c in COLUMNS)),
)}}


def _no_cascade() -> None:
    """On SQLite the batch rebuild of requests drops the table; with foreign keys on, that deletes every step
    and token event through ON DELETE CASCADE. migrations/env.py and telemetry.store turn them off first."""
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError("revision 0012 rebuilds the requests table: run it with SQLite foreign keys off "
                           "(`specfinops db upgrade` does), or its steps and token events would be deleted")


def _set_nullable(nullable: bool) -> None:
    _no_cascade()
    with op.batch_alter_table("requests") as batch:
        for col in COLUMNS:
            batch.alter_column(col, existing_type=sa.Integer(), nullable=nullable)


def upgrade() -> None:
    _set_nullable(True)


def downgrade() -> None:
    for col in COLUMNS:
        op.execute(f"UPDATE requests SET {col} = 0 WHERE {col} IS NULL")
    _set_nullable(False)

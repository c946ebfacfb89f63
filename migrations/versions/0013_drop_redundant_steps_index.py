"""steps: drop ix_steps_request_id, which ix_steps_request_id_step_index (0005) leads with the same column.

Every lookup of a request's steps (a join on request_id, the export of a run's or a time window's steps, and the
ON DELETE CASCADE from requests) uses the covering index's first column as well as it used the one-column index:
SQLite and PostgreSQL both pick ix_steps_request_id_step_index for `request_id = ?` once the other is gone. The
one-column index only cost room (7 MB per million steps on PostgreSQL) and one more B-tree to update on every step
inserted; it was kept in 0005 only because scripts/bench_dashboard.py checked for it by name.

An index only: no table is rebuilt, so SQLite's foreign keys need not be off. Downgrade builds it again (seconds
per few million steps; on PostgreSQL it holds writes to steps for that long).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "ix_steps_request_id"

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
DOWNGRADE_DROPS: dict = {}  # an index only (0005's, put back)


def upgrade() -> None:
    op.drop_index(NAME, table_name="steps")


def downgrade() -> None:
    op.create_index(NAME, "steps", ["request_id"], unique=False)

"""token_events: index (request_id, position) in place of ix_token_events_request_id.

The ITL histogram (app/dashboard/page_queries.py `itl_histogram`) takes LAG(emit_offset_ms) OVER (PARTITION BY
request_id ORDER BY position). With only the one-column index PostgreSQL sorted the selected token events by
(request_id, position) first, on disk past work_mem (2M events: an external merge of 9.5 MB); with this index,
over events stored in the order they were recorded (each request's together), it reads them in that order from the
index and the sort is gone. The new index leads with request_id, so every lookup of a request's events (joins,
exports, the ON DELETE CASCADE from requests) uses it as it used the one-column index, which is dropped (as 0013
dropped steps' one-column index): one B-tree per token event written, not two.

An index only: no table is rebuilt, so SQLite's foreign keys need not be off. Building it reads token_events once
(seconds per few million rows; on PostgreSQL it holds writes to token_events for that long); downgrade builds the
one-column index again.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "ix_token_events_request_id_position"
OLD = "ix_token_events_request_id"

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
DOWNGRADE_DROPS: dict = {}  # an index only (0001's, put back)


def upgrade() -> None:
    op.create_index(NAME, "token_events", ["request_id", "position"], unique=False)
    op.drop_index(OLD, table_name="token_events")


def downgrade() -> None:
    op.create_index(OLD, "token_events", ["request_id"], unique=False)
    op.drop_index(NAME, table_name="token_events")

"""requests: an index on (run_id, started_at), for the node time of a run that a time window cuts.

A run's node time is the span of its requests (first start to last end). Priced over a time window (a daily
report, `cost --since/--until`, `export --what cost` of a month) the span was that of the run's requests that
started inside the window, so where the window cut through a run serving requests concurrently, each side was
charged for the requests in flight at the cut: two halves of one run summed to 1.6x its node time. The window
now takes its share of the run's span: it starts at `since` where the run had requests before it, and ends at
`until` where the run has requests after it. Telling that is one EXISTS per run and edge, which this index
answers with a seek instead of a scan of the run's requests (a server's run holds every request it ever
served).

An index only: no table is rebuilt. Building it takes seconds per few million requests and, on PostgreSQL,
holds writes to requests for that long. ix_requests_run_id stays (the foreign key's index, as before).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "ix_requests_run_id_started_at"
COLUMNS = ["run_id", "started_at"]


def upgrade() -> None:
    op.create_index(NAME, "requests", COLUMNS, unique=False)


def downgrade() -> None:
    op.drop_index(NAME, table_name="requests")

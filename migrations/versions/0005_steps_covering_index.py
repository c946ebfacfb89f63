"""steps: a covering index for the acceptance queries, (request_id, step_index, k, accepted, num_emitted).

The Speculation page and the reports read steps per request: acceptance by position and by domain (k,
accepted, joined on request_id) and acceptance along the answer (a window over each request's steps in
step_index order, summing num_emitted). With only ix_steps_request_id every step found through the index
cost a lookup of its table row, and SQLite's window sorted each request's steps again. With this index
they read steps from the index alone (SQLite: COVERING INDEX; PostgreSQL: Index Only Scan where it does not
scan the whole table in parallel anyway). Synthetic store of 4.1M steps on SQLite: 1.2-1.4x less CPU per
query (acceptance by position 0.86 -> 0.67 s), up to 2x less wall time when the machine is loaded; on
PostgreSQL (2.1M steps) acceptance by position for one domain 0.16 -> 0.06 s. ix_steps_request_id stays
(scripts/bench_dashboard.py names it).

token_events gets no such index: (request_id, position, emit_offset_ms) removed the ITL window's sort too,
but the ITL histogram runs over a sample of at most 300k token events, so it gained nothing measurable, and
the index would have been 70% of the largest table's size.

An index only: no table is rebuilt, so SQLite's foreign keys need not be off (unlike 0004). Building it
takes seconds per few million steps and, on PostgreSQL, holds writes to steps for that long.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "ix_steps_request_id_step_index"
COLUMNS = ["request_id", "step_index", "k", "accepted", "num_emitted"]

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
DOWNGRADE_DROPS: dict = {}  # an index only


def upgrade() -> None:
    op.create_index(NAME, "steps", COLUMNS, unique=False)


def downgrade() -> None:
    op.drop_index(NAME, table_name="steps")

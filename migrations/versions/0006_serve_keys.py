"""serve_keys: the key a server shares with the clients that record its requests in the same store.

A load test recording into the server's own store tells the server so (header X-Specfinops-Recorded-In),
and the server leaves those requests out of its 'serve' runs. The header used to carry the store's
fingerprint (a hash of its path or address), which any HTTP client could compute and so keep its usage out
of the store. Now it carries a random key the server makes when it starts and keeps here, with its run:
only who can read the store learns it.

A new table only: nothing is rebuilt. Downgrade drops it (a server of the older schema needs none).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
DOWNGRADE_DROPS: dict = {"tables": ("serve_keys",)}


def upgrade() -> None:
    op.create_table(
        "serve_keys",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_serve_keys_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_serve_keys")),
    )


def downgrade() -> None:
    op.drop_table("serve_keys")

"""sweeps: concurrency sweeps and the crossover where speculation stops paying.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
DOWNGRADE_DROPS: dict = {"tables": ("sweeps",)}


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node_id", sa.String(length=128), nullable=False),
        sa.Column("device", sa.String(length=128), nullable=False),
        sa.Column("target", sa.String(length=512), nullable=False),
        sa.Column("drafter", sa.String(length=512), nullable=False),
        sa.Column("k_policy", sa.String(length=32), nullable=False),
        sa.Column("workload", sa.String(length=255), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("levels", sa.JSON(), nullable=False),
        sa.Column("run_ids", sa.JSON(), nullable=False),
        sa.Column("crossover_concurrency", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
    )


def downgrade() -> None:
    op.drop_table("sweeps")

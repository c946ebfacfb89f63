"""reports.job_id: the scheduled job that made a report; unique with `since` (one report per job and period).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
DOWNGRADE_DROPS: dict = {"columns": {"reports": ("job_id",)}}


def upgrade() -> None:
    with op.batch_alter_table("reports") as batch:
        batch.add_column(sa.Column("job_id", sa.String(length=128), nullable=True))
        batch.create_unique_constraint(batch.f("uq_reports_job_id"), ["job_id", "since"])


def downgrade() -> None:
    with op.batch_alter_table("reports") as batch:
        batch.drop_constraint(batch.f("uq_reports_job_id"), type_="unique")
        batch.drop_column("job_id")

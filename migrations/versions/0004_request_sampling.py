"""request sampling: each request's temperature and top_p; a run's may be None (set per request).

A server's requests each choose their own sampling, so its run has no one temperature: recording the
default (0.0) labelled sampled traffic as greedy. Requests now carry their own temperature and top_p, and
runs.temperature / runs.top_p are None where the run had none (`specfinops serve`). Records written before
this revision keep their run's figures and have no per-request ones.

Downgrade: the older schema needs a run temperature; a run without one gets the highest temperature its
requests used (exact where they all used one), else 0.0 and top_p 1.0 as that schema recorded them.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
# values: (what is lost, {rows} the rows it is lost of; the SQL condition that finds them)
DOWNGRADE_DROPS: dict = {
    "columns": {"requests": ("temperature", "top_p")},
    "values": {"runs": (("the unknown (NULL) temperature, top_p of {rows}, written as their requests' highest, "
                         "else as greedy (0.0, 1.0)", "temperature IS NULL OR top_p IS NULL"),)},
}


def _no_cascade() -> None:
    """On SQLite the batch rebuild of runs drops the table; with foreign keys on, that deletes every request
    and step through ON DELETE CASCADE. migrations/env.py and telemetry.store turn them off first."""
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError("revision 0004 rebuilds the runs table: run it with SQLite foreign keys off "
                           "(`specfinops db upgrade` does), or its requests and steps would be deleted")


def upgrade() -> None:
    _no_cascade()
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("temperature", sa.Float(), nullable=True))
        batch.add_column(sa.Column("top_p", sa.Float(), nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("temperature", existing_type=sa.Float(), nullable=True)
        batch.alter_column("top_p", existing_type=sa.Float(), nullable=True)


def downgrade() -> None:
    _no_cascade()
    for col, default in (("temperature", 0.0), ("top_p", 1.0)):
        op.execute(
            f"UPDATE runs SET {col} = COALESCE((SELECT MAX(requests.{col}) FROM requests "
            f"WHERE requests.run_id = runs.id), {default}) WHERE {col} IS NULL"
        )
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("temperature", existing_type=sa.Float(), nullable=False)
        batch.alter_column("top_p", existing_type=sa.Float(), nullable=False)
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("top_p")
        batch.drop_column("temperature")

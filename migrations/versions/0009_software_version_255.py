"""runs.software_version holds 255 characters (was 64).

A run records the package and torch versions and the CPU kernels measured fastest on its machine
(serving.worker.software_version), cut to the column's 64 characters. Since attention at decode widths is
chosen per query width and per call form (serving.kernels.decode_attention), a machine's choice reads e.g.
`packed+fused-f32@1,fused@2+/mask-matmul/tree-fused-f32@1-8,fused@9+`: after the 36 characters of versions,
64 kept the one-sequence plan at best, so two machines with different batch or tree kernels recorded the same
string. 255 holds every label the kernels give.

Upgrade widens the column (PostgreSQL: ALTER COLUMN TYPE; SQLite: a rebuild of runs, with foreign keys off, as
0004). Downgrade cuts longer values to 64 characters first, as the recorder did before.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
# values: (what is lost, {rows} the rows it is lost of; the SQL condition that finds them)
DOWNGRADE_DROPS: dict = {"values": {"runs": (("the characters past 64 of software_version in {rows}",
                                                "length(software_version) > 64"),)}}


def _no_cascade() -> None:
    """On SQLite the batch rebuild of runs drops the table; with foreign keys on, that deletes every request
    and step through ON DELETE CASCADE. migrations/env.py and telemetry.store turn them off first."""
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError("revision 0009 rebuilds the runs table: run it with SQLite foreign keys off "
                           "(`specfinops db upgrade` does), or its requests and steps would be deleted")


def upgrade() -> None:
    _no_cascade()
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("software_version", existing_type=sa.String(64), type_=sa.String(255),
                           existing_nullable=False)


def downgrade() -> None:
    _no_cascade()
    op.execute("UPDATE runs SET software_version = substr(software_version, 1, 64) "
               "WHERE length(software_version) > 64")
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("software_version", existing_type=sa.String(255), type_=sa.String(64),
                           existing_nullable=False)

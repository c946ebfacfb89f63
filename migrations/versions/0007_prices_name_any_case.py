"""prices: names unique in any case (a unique index on lower(name)).

Price names are looked up case-insensitively, but only `name` itself was unique: two `specfinops prices set`
at once of mynode3 and MyNode3 left two rows that differ only in case, and a look-up then picked either.
This index makes the second insert fail like an exact duplicate does, and set_price retries it as an update.

A store that already holds such duplicates is merged, deterministically: of the rows whose lower(name) is the
same, the one set last is kept (latest updated_at, then highest id) and the others are deleted; a warning names each kept and removed row. Runs are not affected: they keep the
prices they recorded (runs.price_snapshot), not a reference to a row.

Downgrade drops the index; the rows merged away are not brought back.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-08
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "uq_prices_name_lower"
logger = logging.getLogger("migrations.versions.0007")  # the file is loaded by path: no module name


# The merge as one statement, for offline mode (`alembic upgrade --sql`), which has no database to read the
# duplicates from: a row goes where another of its lower(name) was set later (a later updated_at, or the same
# one and a higher id), the rows _merge_case_duplicates removes. It cannot name them: no warning is logged.
MERGE_SQL = (
    "DELETE FROM prices WHERE EXISTS (SELECT 1 FROM prices later WHERE lower(later.name) = lower(prices.name) "
    "AND (later.updated_at > prices.updated_at OR (later.updated_at = prices.updated_at AND later.id > prices.id)))"
)

# What this revision's downgrade destroys of recorded data: `specfinops db downgrade` counts it and refuses
# without --yes where there is any (tests/test_migrations.py checks the tables and columns against what it drops)
DOWNGRADE_DROPS: dict = {}  # an index only


def _merge_case_duplicates() -> None:
    if context.is_offline_mode():  # op.get_bind() is None: emit the merge as SQL instead of running it
        op.execute(MERGE_SQL)
        return
    bind = op.get_bind()
    keys = bind.execute(sa.text("SELECT lower(name) FROM prices GROUP BY lower(name) HAVING COUNT(*) > 1")).scalars()
    for key in list(keys):
        rows = bind.execute(sa.text(
            "SELECT id, name, value, updated_at FROM prices WHERE lower(name) = :k "
            "ORDER BY updated_at DESC, id DESC"), {"k": key}).all()
        kept, removed = rows[0], rows[1:]
        bind.execute(sa.text("DELETE FROM prices WHERE lower(name) = :k AND id <> :id"), {"k": key, "id": kept.id})
        logger.warning("prices: names differing only in case merged: kept %r = %s (set last), removed %s", kept.name,
                       kept.value, ", ".join(f"{r.name!r} = {r.value}" for r in removed))


def upgrade() -> None:
    _merge_case_duplicates()
    op.create_index(NAME, "prices", [sa.text("lower(name)")], unique=True)


def downgrade() -> None:
    op.drop_index(NAME, table_name="prices")

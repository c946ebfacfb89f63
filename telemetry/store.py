"""Opening the store: an Engine whose schema is at the newest revision."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from telemetry.db import Base, make_engine


def open_store(url: str | None = None) -> Engine:
    """Engine for `url` (see `telemetry.db.resolve_db_url`), schema created/upgraded on first open."""
    engine = make_engine(url)
    Base.metadata.create_all(engine)  # replaced by an Alembic upgrade once migrations exist
    return engine

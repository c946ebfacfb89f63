"""Alembic environment and versions of the specfinops store, bound to `telemetry.db.Base.metadata`.

`alembic upgrade head` from the repository root uses `alembic.ini`; installed code finds this directory
through `telemetry.store.alembic_config`, independent of the working directory.
"""

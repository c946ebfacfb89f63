"""Alembic environment: target metadata from the models, URL from the application's settings.

The URL is, in order: a connection handed in by `telemetry.store` (`config.attributes["connection"]`),
a URL handed in programmatically (`config.attributes["db_url"]`), `alembic -x db=URL`, then
`telemetry.db.resolve_db_url()` (`SPECFINOPS_DB_URL`, else the default SQLite file).
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from telemetry.db import (
    JOBS_TABLE,
    Base,
    make_engine,
    migration_transaction,
    quiet_expression_index_warnings,
    resolve_db_url,
)

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)  # `alembic` command line only
target_metadata = Base.metadata
# Tables that live in the store but are not ours: APScheduler's job store (telemetry/scheduler.py) creates
# and owns its table; `alembic check` and autogenerate must not propose to drop it.
FOREIGN_TABLES = frozenset({JOBS_TABLE})


def _include_name(name, type_, _parent_names) -> bool:
    return not (type_ == "table" and name in FOREIGN_TABLES)


def _url() -> str:
    url = config.attributes.get("db_url") or context.get_x_argument(as_dictionary=True).get("db")
    return resolve_db_url(url)


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place: batch mode copies the table, drops it and renames the
        # copy. Beware on a parent table (runs, requests): with `PRAGMA foreign_keys=ON` (telemetry.db) the
        # DROP deletes every child row through ON DELETE CASCADE. A trial widening runs.software_version
        # that way emptied requests and steps. So migrations run on SQLite with foreign keys off, set before
        # the transaction (inside one, SQLite ignores the pragma): telemetry.db.migration_transaction does,
        # here and for telemetry.store.upgrade_to_head; a revision that rebuilds a parent table checks it (0004)
        # (tests/test_migrations.py::test_upgrading_from_every_revision_keeps_the_records catches it).
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        include_name=_include_name,
    )


def run_migrations_offline() -> None:
    url = _url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=url.startswith("sqlite"),
        include_name=_include_name,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:  # telemetry.store: already in its migration transaction, its lock held
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    if config.attributes.get("read_only"):  # `specfinops db check`: reads the schema, changes nothing, locks nothing
        try:
            with engine.connect() as conn:
                _configure(conn)
                with context.begin_transaction():
                    context.run_migrations()
        finally:
            engine.dispose()
        return
    try:
        # one transaction for the whole command, rolled back whole on an error or a kill; SQLite's write lock or
        # PostgreSQL's advisory lock (the key open_store takes) held throughout, so a second `db upgrade` (or
        # a command opening the store) waits, then finds nothing to do
        with migration_transaction(engine) as conn:
            _configure(conn)
            with context.begin_transaction():  # a no-op inside the transaction above: it commits at its end
                context.run_migrations()
    finally:
        engine.dispose()


with quiet_expression_index_warnings():  # SQLite's comparison skips uq_prices_name_lower: nothing to say
    if context.is_offline_mode():
        run_migrations_offline()
    else:
        run_migrations_online()

"""Opening the store: an Engine whose schema is at the newest Alembic revision.

`open_store` upgrades an empty or older database automatically; another application's it refuses. When the
database is already at head it costs one `SELECT version_num FROM alembic_version` (a SQLite file's table names
are read before, without the store's pragmas, which would switch another application's file to WAL); Alembic
itself is loaded only when there is work.
The migrations directory is found through the installed `migrations` package, never the working directory.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, make_url, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from telemetry.db import (
    ENV_DB_URL,
    JOBS_TABLE,
    Base,
    file_in_path,
    folder_error,
    is_locked,
    make_engine,
    migration_transaction,
    new_store_paths,
    quiet_expression_index_warnings,
    remove_new_store,
    resolve_db_url,
    shown_db_url,
    sqlite_file,
    store_full_error,
)

logger = logging.getLogger(__name__)

VERSION_TABLE = "alembic_version"


class StoreError(RuntimeError):
    """The database cannot be brought to the schema this version of specfinops expects."""


def migrations_dir() -> Path:
    spec = importlib.util.find_spec("migrations")
    if spec is None or not spec.submodule_search_locations:
        raise StoreError("the 'migrations' package is not installed next to 'telemetry'; reinstall specfinops")
    return Path(next(iter(spec.submodule_search_locations)))


def alembic_config(url: str | None = None, connection: Connection | None = None) -> Config:
    """An Alembic Config built in code (no alembic.ini needed); the URL goes to migrations/env.py."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["db_url"] = resolve_db_url(url)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()
    if len(heads) != 1:
        raise StoreError(f"migrations must have exactly one head, found {sorted(heads)}")
    return heads[0]


@functools.cache
def known_revisions() -> frozenset[str]:
    """Every revision this version's migrations know (a store at another one was written by a newer one)."""
    return frozenset(s.revision for s in ScriptDirectory.from_config(alembic_config("sqlite://")).walk_revisions())


def newer_revision_error(current: str, doing: str = "") -> StoreError:
    """A store stamped with a revision this version's migrations do not know: a newer specfinops wrote it."""
    return StoreError(
        f"{doing}database is at revision {current!r}, unknown to this specfinops (head {head_revision()!r}); "
        "it was written by a newer version"
    )


def current_revision(conn: Connection) -> str | None:
    """The revision stamped in the database, or None when it has no version table (empty or pre-Alembic)."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def _at_head(engine: Engine) -> bool:
    try:
        with engine.connect() as conn:
            return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == head_revision()
    except DBAPIError:
        return False  # no version table yet (or no server: the upgrade then reports the real error)


def stamp_if_created_without_alembic(conn: Connection, cfg: Config) -> bool:
    """A store made by `create_all` before migrations existed: stamp it when it matches the models."""
    if not refuse_unless_models_match(conn):
        return False
    command.stamp(cfg, "head")
    logger.warning("store had the current schema without an Alembic version; stamped it at %s", head_revision())
    return True


def refuse_unless_models_match(conn: Connection) -> bool:
    """Whether a database without an Alembic revision has specfinops tables; a StoreError naming the tables that
    differ where their schema is not the models' (a hand-made store, one made without Alembic by an older version),
    or saying it is no specfinops store where its only tables named like specfinops's are not as the models have
    them and the others are missing (another application's `prices`: partial_tables_text). Only reads:
    open_store runs it before a SQLite file is switched to WAL, so a file it refuses is left as it was."""
    present = set(Base.metadata.tables) & set(inspect(conn).get_table_names())
    if not present:
        return False
    diffs = _model_diffs(conn)
    if diffs:
        partial = partial_tables_text(present, diffs)
        if partial is not None:
            raise StoreError(f"{shown_url(conn.engine.url.render_as_string(hide_password=False))}: not a "
                             f"specfinops store: {partial}; {NOT_A_STORE_ADVICE}")
        raise StoreError(
            f"database has specfinops tables {sorted(present)} but no {VERSION_TABLE} table and its schema "
            f"differs from the models ({len(diffs)} differences: {_diff_tables(diffs)}); "
            "migrate it by hand or start from an empty database"
        )
    return True


def _model_diffs(conn: Connection) -> list:
    """Alembic's differences between the database's schema and the models'."""
    with quiet_expression_index_warnings():
        return compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)


# what to do about a database that is no store (partial_tables_text), as each command says it
NOT_A_STORE_ADVICE = "check --db / SPECFINOPS_DB_URL, or give specfinops a database of its own"


def not_a_store_text(conn: Connection) -> str | None:
    """partial_tables_text for the database `conn` reads (without an Alembic revision): `db current` and `db check`
    say what opening it says."""
    present = set(Base.metadata.tables) & set(inspect(conn).get_table_names())
    if not present or present == set(Base.metadata.tables):
        return None
    return partial_tables_text(present, _model_diffs(conn))


def partial_tables_text(present, diffs: list) -> str | None:
    """For a database without an Alembic version that holds some tables named like specfinops's, each of them not
    as the models have it, and none of its others (another application's `prices`): "only its table prices is
    named like one of specfinops's, and not as specfinops makes it; its other 8 tables (power_samples, reports,
    ...) are missing", said after "not a specfinops store: " by `db current`, `db check` and every command that
    opens it. None where it holds none of them, all of them, or one as the models have it (a store made without
    Alembic by an older version: its differences are named instead). `diffs`: Alembic's (_model_diffs)."""
    ours = set(Base.metadata.tables)
    have, missing = sorted(set(present) & ours), sorted(ours - set(present))
    if not have or not missing or not set(have) <= _diff_sets(diffs)[2]:
        return None

    def names(tables: list[str]) -> str:
        return ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")

    has = (f"only its table {have[0]} is named like one of specfinops's, and not as specfinops makes it"
           if len(have) == 1 else
           f"only its {len(have)} tables ({names(have)}) are named like specfinops's, and not as specfinops makes "
           "them")
    return f"{has}; its other {len(missing)} tables ({names(missing)}) are missing"


def _diff_tables(diffs: list) -> str:
    """Alembic's schema differences as the tables they are in ("missing tables: sweeps, serve_keys; tables that
    differ: runs"), not their reprs (a Table's runs to a thousand characters)."""
    missing, extra, differ = _diff_sets(diffs)
    parts = [f"{what}: {', '.join(sorted(names))}" for what, names in
             (("missing tables", missing), ("tables not in the models", extra), ("tables that differ", differ))
             if names]  # fmt: skip
    return "; ".join(parts)


def _diff_sets(diffs: list) -> tuple[set[str], set[str], set[str]]:
    """Alembic's schema differences as (tables missing, tables not in the models, tables that differ)."""
    missing, extra, differ = set(), set(), set()
    for diff in diffs:
        op, *rest = diff[0] if isinstance(diff, list) else diff  # a column's modifications come as a list
        if op in ("add_table", "remove_table"):
            (missing if op == "add_table" else extra).add(rest[0].name)
        elif op.startswith("modify_") or op.endswith("_column"):
            differ.add(rest[1])  # (schema, table, ...)
        else:  # an index, constraint or foreign key
            item = rest[0]
            table = getattr(item, "table", None) if not op.endswith("_fk") else getattr(item, "parent", None)
            differ.add(getattr(table, "name", "?"))
    return missing, extra, differ


def upgrade_to_head(engine: Engine) -> str | None:
    """Bring the schema to head in one transaction that a failure or a kill rolls back whole: SQLite under its
    write lock (BEGIN IMMEDIATE), PostgreSQL under an advisory lock (telemetry.db.migration_transaction). A
    second process waits for the first, then finds the store at head. Returns the revision a store was upgraded
    from; None where no older schema was upgraded (a new store given its schema, one already at head)."""
    head = head_revision()
    with migration_transaction(engine) as conn:
        return _upgrade(engine, conn, head)


def _upgrade(engine: Engine, conn: Connection, head: str) -> str | None:
    """The upgrade itself, inside the caller's transaction (its lock held)."""
    current = current_revision(conn)
    if current == head:
        return None  # another process upgraded while we waited
    if current is not None and current not in known_revisions():
        raise newer_revision_error(current)
    cfg = alembic_config(engine.url.render_as_string(hide_password=False), connection=conn)
    if current is None and stamp_if_created_without_alembic(conn, cfg):
        return None
    logger.info("upgrading store from %s to %s", current or "empty", head)
    command.upgrade(cfg, "head")
    return current


def say_upgraded(url: str, was: str) -> None:
    """One line on stderr for a store a command upgraded as it opened it: every process of this version does
    (README), and a store upgraded so is one older versions refuse, so it is said, not done silently."""
    print(f"upgraded the store {shown_url(url)} from revision {was} to {head_revision()} (every process of this "
          "version upgrades an older store; older specfinops versions will refuse it)", file=sys.stderr)


class NoStoreError(StoreError):
    """A command that only reads was pointed at a SQLite file (`path`) that does not exist."""

    def __init__(self, path: Path):
        # a relative path (the default var/specfinops.db) is named as found from the working folder too: that
        # folder decides which store a command reads, and a `cost` run in another folder than the bench's found none
        where = "" if path.is_absolute() else f" ({path.absolute()}, from the working folder)"
        super().__init__(
            f"no store at {path}{where}: the file does not exist. Check --db / SPECFINOPS_DB_URL, or record runs "
            f"into it first: specfinops bench --workload code --mode both --db {path}"
        )
        self.path = path


def foreign_tables_text(tables: list[str]) -> str:
    """'its table foo is not specfinops's' / 'its 3 tables (a, b, c) are not specfinops's' (five named at most)."""
    names = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
    return (f"its table {names} is not specfinops's" if len(tables) == 1
            else f"its {len(tables)} tables ({names}) are not specfinops's")


class NotAStoreError(NoStoreError):
    """A database that holds no specfinops store: refused, not given the specfinops tables. Every command refuses
    another application's (its tables, none of specfinops's; open_store); a command that only reads refuses an
    empty one too. `path` is the database as shown (a SQLite file, or the URL with its password masked).
    `stamped`: the revision in its version table, another Alembic-managed application's."""

    def __init__(self, shown: str, other_tables: list[str], *, server: bool = False, emptied: bool = False,
                 stamped: str | None = None):  # fmt: skip
        none = ("it has no specfinops tables (only an empty version table, as `specfinops db downgrade base` "
                "leaves)" if emptied else "it has no tables")  # fmt: skip
        others = foreign_tables_text(other_tables) if other_tables else none
        # a server's URL as the user writes it, its password masked (`shown_db_url`): said so where it has one
        db = shown + (" (*** is its password)" if server and ":***@" in shown else "")
        if stamped is not None:  # its version table is the other application's: no store can go beside it
            then = (f", and its {VERSION_TABLE} table (at revision {stamped!r}) is another Alembic-managed "
                    "application's. Check --db / SPECFINOPS_DB_URL: a store needs a database of its own")
        elif other_tables:  # `db upgrade` adds the store beside them, where that is really wanted
            then = f". Check --db / SPECFINOPS_DB_URL; to add a store to it anyway: specfinops db upgrade --db {db}"
        else:
            then = (f". Check --db / SPECFINOPS_DB_URL; to make it a store: specfinops db upgrade --db {db}, or "
                    f"record runs into it: specfinops bench --workload code --mode both --db {db}")
        StoreError.__init__(self, f"no store in {shown}: {others}{then}")
        self.path = shown
        # another application's database (its tables, or its version table), not an empty one that a store could
        # start in: `prices` lists the defaults a new store starts with for the latter only
        self.foreign = stamped is not None or bool(set(other_tables) - {JOBS_TABLE})


def shown_url(url: str) -> str:
    """A store URL as it may be printed: a SQLite file's path, a server's URL with its password masked; a URL
    SQLAlchemy cannot parse shows as "(the configured store)", nothing of it (it may hold a password)."""
    try:
        path = sqlite_file(url)
        return str(path) if path is not None else shown_db_url(url)
    except Exception:  # noqa: BLE001 - any parse error: show nothing of it
        return "(the configured store)"


def _refuse_unless_a_store(engine: Engine, url: str, *, must_exist: bool) -> None:
    """NotAStoreError for another application's database: tables, none of them specfinops's (beside, maybe, a
    version table: another Alembic-managed application's, whatever revision it names); with `must_exist` (a
    command that only reads), for one without any table but a version table that names no revision too (empty,
    or as `db downgrade base` leaves). A version table alone that names a revision is left to the upgrade (a
    known one is upgraded, an unknown one was written by a newer version). Specfinops tables without a revision
    whose schema is not the models' are refused here too (refuse_unless_models_match). Only reads: nothing is
    created, and a SQLite file is read without make_engine's pragmas (the caller's `engine`)."""
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        revision = current_revision(conn) if VERSION_TABLE in tables else None
        if tables & set(Base.metadata.tables):
            if revision is None:
                refuse_unless_models_match(conn)
            return
    others = sorted(tables - {VERSION_TABLE})
    foreign = set(others) - {JOBS_TABLE}  # the scheduler's jobs alone (an older `db downgrade base` kept them)
    if not foreign and (revision is not None or not must_exist):
        return
    raise NotAStoreError(shown_url(url), others, server=sqlite_file(url) is None, emptied=VERSION_TABLE in tables,
                         stamped=revision if foreign else None)  # fmt: skip


class CannotCreateStoreError(StoreError):
    """A new SQLite store that cannot be made where it was asked for: its folder takes no new file (permissions, a
    read-only file system, /proc) or cannot itself be made. SQLite says only 'unable to open database file', and
    a folder that cannot be made '[Errno 2] No such file or directory: /proc/sub', naming neither the store nor
    the option that chose it."""


def cannot_create_error(url: str | None, path: Path | None, exc: BaseException) -> CannotCreateStoreError | None:
    """The clear error for `exc`, raised while the SQLite store at `path`, which did not exist, was being made
    (`url` as the user gave it: --db, SPECFINOPS_DB_URL or the default): its folder, or the nearest folder above
    it that exists, tried by creating a file in it and taking it away again. None where that works (`exc` then
    has another cause, said as it is), for a server's database, or for an error that is not about opening the
    file or making its folder."""
    import errno
    import tempfile

    if path is None:
        return None
    orig = getattr(exc, "orig", None) or exc
    cannot_open = getattr(orig, "sqlite_errorname", "") == "SQLITE_CANTOPEN" or "unable to open database file" \
        in str(orig)
    if not (cannot_open and isinstance(orig, sqlite3.Error) or isinstance(orig, OSError)):
        return None
    folder = path.absolute().parent
    existing = next((f for f in (folder, *folder.parents) if f.is_dir()), None)
    if existing is None:
        return None
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=f".{path.name}."):
            return None  # it takes a new file: something else is wrong, said as it is
    except OSError as probe:
        why = {errno.EACCES: "permission denied", errno.EPERM: "permission denied",
               errno.EROFS: "a read-only file system"}.get(probe.errno, "it takes no new files")
    place = (f"its folder {folder} is not writable" if existing == folder
             else f"its folder {folder} cannot be made: {existing} is not writable")
    return CannotCreateStoreError(f"{_given(url)}: cannot create the store: {place} ({why}); give a store "
                                  "in a folder this user can write")


def refuse_unusable_sqlite_file(url: str | None = None) -> None:
    """A SQLite store (`url` as given to --db; None: SPECFINOPS_DB_URL or the default) that names a directory, or a
    file that is not a SQLite database, or is held in memory: a StoreError naming it (SQLite says only 'unable to open database file' and
    'file is not a database', naming neither the file nor the option). The file is read through SQLite, read-only:
    a plain open() and close() of it would drop the locks this process's connections hold on it. A missing file,
    or one SQLite cannot open for another reason (busy, a folder it cannot write), is left to the caller."""
    resolved = resolve_db_url(url)
    path = sqlite_file(resolved)
    if path is None and make_url(resolved).get_backend_name() == "sqlite":
        # `sqlite://`, `sqlite:///` (a template's unset variable), `:memory:`: `prices set` said it saved a price
        # and kept none, a bench ran to its end and then lost every record
        raise StoreError(f"{resolved} is an in-memory SQLite database: nothing written there outlives the command, "
                         "and no other command sees it; give a file, e.g. --db sqlite:///var/specfinops.db")
    if path is None:
        return
    if path.is_dir():
        raise StoreError(f"{_given(url)} is a directory: give a SQLite file path or a database URL")
    file_on_the_way = file_in_path(path)
    if file_on_the_way is not None:  # making the store's folder failed with "File exists: ...", nothing more
        raise StoreError(f"{_given(url)}: {file_on_the_way} is a file, not a directory, so the store cannot "
                         "be in it: give a SQLite file path or a database URL")
    if not path.is_file():
        return
    try:
        probe = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return
    try:
        probe.execute("PRAGMA schema_version").fetchone()  # reads the header: 'file is not a database' if it is not
    except sqlite3.DatabaseError as exc:
        if "file is not a database" in str(exc):
            raise StoreError(f"{_given(url)}: not a SQLite database (cannot use the database: {exc})") from None
    finally:
        probe.close()


def open_store(url: str | None = None, *, must_exist: bool = False, to_write: bool | Writes = False) -> Engine:
    """Engine for `url` (see `telemetry.db.resolve_db_url`), schema upgraded to head on open.

    `to_write`: a command that records into the store (bench, loadtest, serve) learns now, before any model loads
    or load starts, that the store refuses writes (NotWritableError): a read-only store already at head opens
    fine, and its first insert failed only after the work whose records it was to hold (refuse_unless_writable).
    Commands that only read leave it off: a read-only store serves them. True: a recording command's runs; a
    `Writes` names what another command writes (RECORDS_REPORTS, KEEPS_PRICES).

    A SQLite file that does not exist is created, with its directory, unless `must_exist`: commands that only
    read (cost, project, export, report, scheduler, dashboard) pass it, so a mistyped `--db` is named as such instead of
    turning into a new, empty store that has "no runs". Another application's database (tables, none of them
    specfinops's) is refused (NotAStoreError) by every command, not given the schema beside its tables
    (`specfinops db upgrade` does that, where it is wanted); with `must_exist` an empty one is refused too. A
    SQLite file is checked before make_engine's engine connects: its pragmas would switch the file to WAL. A store
    at an older revision is upgraded as always. A SQLite path that is a directory, or a file that is not a SQLite
    database, is refused naming it (refuse_unusable_sqlite_file)."""
    engine = _open_store(url, must_exist=must_exist)
    if to_write:
        try:
            refuse_unless_writable(engine, url, RECORDS_RUNS if to_write is True else to_write)
        except BaseException:
            engine.dispose()
            raise
    return engine


def _open_store(url: str | None, *, must_exist: bool) -> Engine:
    """open_store's work. A new SQLite file (and the folders made for it) that could not be given its schema (the
    disk full meanwhile, Ctrl-C) is removed again, not left behind as a 0-byte store; a full device is named
    with the store's path (SQLite says 'database or disk is full' or 'disk I/O error', naming neither)."""
    refuse_unusable_sqlite_file(url)
    given, url = url, resolve_db_url(url)
    path = sqlite_file(url)
    created = [] if must_exist else new_store_paths(path)
    try:
        return _open_existing_or_new(url, path, must_exist=must_exist)
    except BaseException as exc:
        remove_new_store(created)
        clear = store_full_error(path, exc) or (cannot_create_error(given, path, exc) if created else None)
        if clear is not None:
            raise clear from None
        raise


def _open_existing_or_new(url: str, path: Path | None, *, must_exist: bool) -> Engine:
    if path is not None and (must_exist or path.exists()):
        if not path.exists():
            raise NoStoreError(path)
        probe = create_engine(url)
        try:
            _refuse_unless_a_store(probe, url, must_exist=must_exist)
        except DBAPIError as exc:
            clear = folder_error(path, exc.orig)
            if clear is None:
                raise
            raise clear from None
        finally:
            probe.dispose()
    engine = make_engine(url)
    if _at_head(engine):
        return engine
    try:
        if not url.startswith("sqlite"):  # a server's database: no WAL to keep off, so its engine reads it
            _refuse_unless_a_store(engine, url, must_exist=must_exist)
        was = upgrade_to_head(engine)
    except NotAStoreError:
        engine.dispose()
        raise
    except Exception as exc:
        if _at_head(engine):  # SQLite: a concurrent opener created the schema first
            return engine
        try:
            refused = _why_not_upgraded(exc)
            said = _cannot_upgrade(engine, url, refused) if refused else None
        finally:
            engine.dispose()
        if said is not None:
            raise said from None
        raise
    except BaseException:  # Ctrl-C, SIGTERM: its connection closed, so the new file can be removed (remove_new_store)
        engine.dispose()
        raise
    if was is not None:  # a new store given its schema is not said: nothing older was there to change
        say_upgraded(url, was)
    return engine


class NotWritableError(StoreError):
    """A store that opens but refuses writes (a SQLite file opened with mode=ro or one this user cannot write, a
    PostgreSQL session or server whose transactions are read-only, a role without INSERT on it), found before a
    command that records into it does its work."""

    def __init__(self, named: str, reason: str, why: str):
        super().__init__(f"{named}: not writable: {reason}; this command {why}")
        self.reason = reason


@dataclass(frozen=True)
class Writes:
    """What a command writes first (a table and a column it fills) and what it is told to do instead where the
    store refuses that write: the probe is an insert of no row into that table, so a role granted only the table
    it writes (a reporting account: reports; a FinOps editor: prices) passes, and one without it does not."""

    table: str
    column: str
    why: str

    def probe(self):
        return text(f"INSERT INTO {self.table} ({self.column}) SELECT {self.column} FROM {self.table} WHERE 1 = 0")


RECORDS_RUNS = Writes("runs", "kind", "records its runs there: give a store it may write, or --no-telemetry "
                      "(without --db) to record nothing")  # bench, loadtest, serve: a run's row first
RECORDS_REPORTS = Writes("reports", "period", "records each report there: give a store it may write")
SCHEDULES_REPORTS = Writes("reports", "period", "keeps its job and records each report there: give a store it may "
                           "write")  # scheduler: its job, then a report's record each period
KEEPS_PRICES = Writes("prices", "name", "keeps the price catalog there: give a store it may write (or price runs "
                      "with cost --gpu / --node-hourly-usd)")


def refuse_unless_writable(engine: Engine, url: str | None = None, writes: Writes = RECORDS_RUNS) -> None:
    """NotWritableError, naming the store as `url` was given (--db, SPECFINOPS_DB_URL or the default), where it
    refuses a write; the database's own words say why ('attempt to write a readonly database', 'cannot execute
    INSERT in a read-only transaction', 'permission denied for table runs'). A SQLite store another process is
    writing just now (still locked after the busy timeout) is writable: its lock is not refusal. Any other
    failure is raised as it is. The write tried is `writes`'s first one, of no row (Writes.probe): the database
    checks it as any other (a read-only transaction or file, the role's INSERT privilege) and it changes nothing;
    rolled back all the same."""
    try:
        with engine.connect() as conn:
            try:
                conn.execute(writes.probe())
            finally:
                conn.rollback()
    except DBAPIError as exc:
        clear = not_writable_error(exc, url, writes)
        if clear is None:
            if is_locked(exc):  # another writer's lock (SQLite's busy, PostgreSQL's lock_timeout): no refusal
                return
            raise
        raise clear from None


def not_writable_error(exc: BaseException, url: str | None, writes: Writes) -> NotWritableError | None:
    """The NotWritableError for a write the store refused (`exc`: read-only, no privilege; _why_not_upgraded),
    naming the store as `url` was given and saying what to do (`writes.why`); None for any other failure."""
    if _why_not_upgraded(exc) is None:
        return None
    orig = getattr(exc, "orig", None) or exc
    return NotWritableError(_given(url), (str(orig).strip().splitlines() or [type(orig).__name__])[0], writes.why)


def _given(url: str | None) -> str:
    """The store as the user named it: `--db X` (a server's password hidden), SPECFINOPS_DB_URL, or the default."""
    def hidden(given: str) -> str:  # a SQLite file as it was given, a server's URL as shown_url masks it
        return given if sqlite_file(resolve_db_url(given)) is not None else shown_url(given)

    if url:
        return f"--db {hidden(url)}"
    if os.environ.get(ENV_DB_URL):
        return f"{ENV_DB_URL} {hidden(os.environ[ENV_DB_URL])}"
    return f"the default store {shown_url(resolve_db_url(None))}"


def _why_not_upgraded(exc: BaseException) -> str | None:
    """Why the database refused the upgrade's writes, where that is a state of the database or of the role and no
    fault: "read-only" (a SQLite file opened with mode=ro or one this user cannot write, a PostgreSQL session or
    server whose transactions are read-only), "privilege" (a PostgreSQL role that may read the store but not
    change its schema: "must be owner of table runs", SQLSTATE 42501), or None."""
    orig = getattr(exc, "orig", None) or exc
    name = getattr(orig, "sqlite_errorname", "") or ""
    if name.startswith("SQLITE_READONLY") and name != "SQLITE_READONLY_DIRECTORY":  # a folder: folder_error's
        return "read-only"
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate == "25006" or "read-only transaction" in str(orig):
        return "read-only"
    return "privilege" if sqlstate == "42501" else None


def _cannot_upgrade(engine: Engine, url: str, why: str) -> StoreError | None:
    """A store that needs an upgrade that `why` (_why_not_upgraded) forbids: which revision it is at and which one
    is needed (the upgrade said only 'attempt to write a readonly database' or 'must be owner of table runs').
    None where the store cannot even be read (a role without SELECT on it): its own error says that."""
    rev, tables, unread = None, False, False
    # read without the store engine's pragmas: switching a file that is not WAL yet to WAL is itself a write
    reader = create_engine(engine.url) if engine.url.get_backend_name() == "sqlite" else engine
    try:
        with reader.connect() as conn:
            tables = bool(set(inspect(conn).get_table_names()) & set(Base.metadata.tables))
            rev = current_revision(conn)
    except DBAPIError:
        unread = True
    finally:
        if reader is not engine:
            reader.dispose()
    if unread and why == "privilege":
        return None
    # tables without a version: made by create_all, they need only a stamp (which writes too)
    at = (f"at revision {rev}" if rev else "without an Alembic version (its tables were made without Alembic)"
          if tables else "without a schema")
    needs = f"the store {shown_url(url)} is {at} and this specfinops needs revision {head_revision()}"
    if why == "privilege":
        role = f"the role {engine.url.username}" if engine.url.username else "this role"
        return StoreError(
            f"{needs}, but {role} may not change its schema, so it cannot be upgraded: run `specfinops db upgrade "
            "--db URL` as a role that may (the owner of its tables), then use it again"
        )
    if sqlite_file(url) is None:  # a server's database: no file to copy; a session or role that may write can
        return StoreError(
            f"{needs}, but it is open read-only (a read-only session, transaction or server), so it cannot be "
            "upgraded: run `specfinops db upgrade --db URL` with a role and session that can write (without "
            "default_transaction_read_only, on the primary), then use it again"
        )
    return StoreError(
        f"{needs}, but it is open read-only, so it cannot be upgraded: run `specfinops db upgrade --db COPY` on a "
        "writable copy of it (or open it writable) and use that"
    )

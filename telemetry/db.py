"""The SQL store: typed SQLAlchemy 2 models of the public schema, engine construction.

The schema is public (users query it from other tools). Raw counts are stored; rates such as the
acceptance rate, tokens/s or J/token are computed in queries, never stored pre-averaged.

Tables: runs, requests, steps, token_events, power_samples, prices, reports, sweeps, serve_keys.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import re
import sqlite3
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
)
from sqlalchemy import text as sql_text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

logger = logging.getLogger(__name__)

DEFAULT_DB_PATH = Path("var") / "specfinops.db"
SUPPORTED_BACKENDS = ("sqlite", "postgresql")
ENV_DB_URL = "SPECFINOPS_DB_URL"
# APScheduler's job store (telemetry/scheduler.py): a table in the store that Alembic leaves alone
# (migrations/env.py) and that does not make a database another application's (telemetry/store.py)
JOBS_TABLE = "apscheduler_jobs"

# Stable constraint names, so Alembic migrations (and batch mode on SQLite) can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# BIGINT on PostgreSQL, INTEGER on SQLite (so it stays the rowid alias and autoincrements).
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Run(Base):
    """One invocation of the worker (a bench mode, a server lifetime, a load-test level)."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), default="bench")  # bench | serve | loadtest
    mode: Mapped[str] = mapped_column(String(8))  # spec | ar
    node_id: Mapped[str] = mapped_column(String(128))
    hostname: Mapped[str] = mapped_column(String(255))
    device: Mapped[str] = mapped_column(String(128))  # e.g. "cpu (2 cores)", "NVIDIA H100 80GB HBM3"
    backend: Mapped[str] = mapped_column(String(16))  # torch | vllm
    dtype: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(String(512))
    drafter: Mapped[str | None] = mapped_column(String(512))  # None in AR mode
    k_policy: Mapped[str] = mapped_column(String(32))  # "fixed:4", "auto", ... ; "none" in AR
    # None where each request chose its own (a server's run): the requests carry theirs
    temperature: Mapped[float | None] = mapped_column(Float)
    top_p: Mapped[float | None] = mapped_column(Float, default=1.0)
    # the rest of the run's sampling (migration 0008); None where unknown: recorded before 0008, or each request
    # chose its own (a server's run). top_k 0 = off; seed as given (None: none given, or past a signed 64-bit)
    top_k: Mapped[int | None] = mapped_column(Integer)
    seed: Mapped[int | None] = mapped_column(BigInteger)
    max_new_tokens: Mapped[int | None] = mapped_column(Integer)  # the answer length cap per request
    concurrency: Mapped[int] = mapped_column(Integer, default=1)
    workload: Mapped[str] = mapped_column(String(255))
    power_source: Mapped[str] = mapped_column(String(16))  # nvml | rapl | estimate | none
    software_version: Mapped[str] = mapped_column(String(255))  # versions and the kernels measured fastest (0009: was 64)
    price_snapshot: Mapped[dict | None] = mapped_column(JSON)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # running | completed | failed | cancelled; a 'running' run whose process is gone reads 'stale' (derived)
    status: Mapped[str] = mapped_column(String(16), default="running")
    dropped_records: Mapped[int] = mapped_column(Integer, default=0)
    # the command invocation that recorded the run (migration 0011): every run of one bench (all modes, turns,
    # concurrency and sweep levels) or load test shares one uuid4 hex, so its spec and AR runs can be compared
    # as a pair. None: recorded before 0011, or a server's run (one per mode for the server's lifetime, each
    # serving whatever requests arrive: nothing pairs them)
    invocation_id: Mapped[str | None] = mapped_column(String(36))
    # the process that recorded the run (migration 0014): its pid, and which process instance that pid was (its
    # host, machine, boot, pid and time namespaces, start time: telemetry.liveness.process_key), so that a run left
    # 'running' by a process killed outright reads 'stale' (telemetry.liveness). None: recorded before 0014
    pid: Mapped[int | None] = mapped_column(Integer)
    process_key: Mapped[str | None] = mapped_column(String(255))

    __table_args__ = (Index("ix_runs_started_at", "started_at"), Index("ix_runs_node_id", "node_id"),
                      Index("ix_runs_invocation_id", "invocation_id"))


class Request(Base):
    """One generation request. Counts are raw; TPOT is derived: (e2e - ttft) / (output_tokens - 1)."""

    __tablename__ = "requests"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    external_id: Mapped[str | None] = mapped_column(String(128))  # workload prompt id / API request id
    domain: Mapped[str] = mapped_column(String(64), default="")
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # None (migration 0012): unknown, a load-test stream that ended without the server's usage
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    num_drafts: Mapped[int | None] = mapped_column(Integer, default=0)
    num_draft_tokens: Mapped[int | None] = mapped_column(Integer, default=0)
    num_accepted_tokens: Mapped[int | None] = mapped_column(Integer, default=0)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    e2e_ms: Mapped[float | None] = mapped_column(Float)
    energy_j: Mapped[float | None] = mapped_column(Float)  # None when no power source measured it
    temperature: Mapped[float | None] = mapped_column(Float)  # the request's sampling; None in older records
    top_p: Mapped[float | None] = mapped_column(Float)
    # the rest of the request's sampling (migration 0010); None where unknown (recorded before 0010) or unset
    top_k: Mapped[int | None] = mapped_column(Integer)  # 0 = off
    seed: Mapped[int | None] = mapped_column(BigInteger)  # None: no seed asked for
    max_new_tokens: Mapped[int | None] = mapped_column(Integer)  # the answer length cap applied
    status: Mapped[str] = mapped_column(String(16), default="ok")  # ok | error | cancelled
    error: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index("ix_requests_run_id", "run_id"),
        Index("ix_requests_started_at", "started_at"),
        Index("ix_requests_domain", "domain"),
    )


class Step(Base):
    """One decode step of one request: K proposed, how many were accepted, and what it cost."""

    __tablename__ = "steps"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    request_id: Mapped[int] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"))
    step_index: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer)  # draft tokens proposed (0 = AR step)
    accepted: Mapped[int] = mapped_column(Integer)
    num_emitted: Mapped[int] = mapped_column(Integer)
    draft_ms: Mapped[float] = mapped_column(Float)
    verify_ms: Mapped[float] = mapped_column(Float)
    batch_size: Mapped[int] = mapped_column(Integer, default=1)
    k_reason: Mapped[str | None] = mapped_column(String(32))  # why the lookahead policy chose/stopped K
    t_offset_ms: Mapped[float] = mapped_column(Float)  # step end, from request start

    __table_args__ = (
        # covers the acceptance queries (by position, by domain, along the answer) in step order: no table
        # lookup per step, no sort per request (migration 0005); its first column serves every lookup by request
        # (joins, exports, the cascade from requests), so no index on request_id alone (dropped in 0013)
        Index("ix_steps_request_id_step_index", "request_id", "step_index", "k", "accepted", "num_emitted"),
    )


class TokenEvent(Base):
    """One emitted output token: where, when (from request start), which step, and its source."""

    __tablename__ = "token_events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    request_id: Mapped[int] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)  # 0-based index in the output
    emit_offset_ms: Mapped[float] = mapped_column(Float)
    step_index: Mapped[int] = mapped_column(Integer)  # -1 for the token sampled at prefill
    source: Mapped[str] = mapped_column(String(12))  # accepted | bonus | correction | ar

    # (request_id, position): the ITL window (LAG over each request's events in position order) reads it in
    # order, with no sort; lookups by request use its first column (migration 0015)
    __table_args__ = (Index("ix_token_events_request_id_position", "request_id", "position"),)


class PowerSample(Base):
    """A power reading. An estimate is always labelled `source='estimate'`."""

    __tablename__ = "power_samples"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    t: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    device_index: Mapped[int] = mapped_column(Integer, default=0)
    power_w: Mapped[float | None] = mapped_column(Float)
    energy_mj: Mapped[float | None] = mapped_column(Float)  # cumulative hardware counter, if any
    utilization_pct: Mapped[float | None] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(12))  # nvml | rapl | estimate

    __table_args__ = (Index("ix_power_samples_run_id_t", "run_id", "t"),)


class Price(Base):
    """Price catalog entry: an hourly node/GPU price, electricity per kWh, or PUE."""

    __tablename__ = "prices"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(16))  # gpu | node | electricity | pue
    value: Mapped[float] = mapped_column(Float)  # $/hour, $/kWh or a PUE factor
    unit: Mapped[str] = mapped_column(String(16))  # usd_per_hour | usd_per_kwh | ratio
    source: Mapped[str] = mapped_column(Text, default="")
    as_of: Mapped[str] = mapped_column(String(32), default="")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


# Names are looked up in any case, so they are unique in any case too: two `prices set` of mynode3 and MyNode3
# at once left two rows (migration 0007). The database's lower(), the one the look-ups use.
Index("uq_prices_name_lower", func.lower(Price.name), unique=True)


@contextmanager
def quiet_expression_index_warnings() -> Iterator[None]:
    """SQLite cannot reflect an index on an expression, so schema comparisons there (`db check`, the stamp of a
    store made without Alembic) skip uq_prices_name_lower and would say so in two warnings every time; what they
    could do they did (PostgreSQL compares it). Silences those two warnings only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*expression-based index '?uq_prices_name_lower\b")
        yield


class Report(Base):
    """A generated cost report and where its files are."""

    __tablename__ = "reports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    period: Mapped[str] = mapped_column(String(16))
    since: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    until: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    html_path: Mapped[str] = mapped_column(Text)
    csv_dir: Mapped[str] = mapped_column(Text)
    summary: Mapped[dict | None] = mapped_column(JSON)
    delivery_status: Mapped[str | None] = mapped_column(String(32))
    delivery_error: Mapped[str | None] = mapped_column(Text)
    # Scheduled reports: the APScheduler job id. Unique with `since`, so when two schedulers fire the same
    # job for the same period only the first INSERT wins (NULL for reports made by hand: never unique).
    job_id: Mapped[str | None] = mapped_column(String(128))

    __table_args__ = (UniqueConstraint("job_id", "since"),)


class Sweep(Base):
    """A concurrency sweep: the same prompts at several concurrency levels in both modes.

    `crossover_concurrency` is the smallest measured level at which speculative tokens/s no longer
    beats AR tokens/s (from the runs' SQL summaries); None when speculation paid at every level."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    node_id: Mapped[str] = mapped_column(String(128))
    device: Mapped[str] = mapped_column(String(128))
    target: Mapped[str] = mapped_column(String(512))
    drafter: Mapped[str] = mapped_column(String(512))
    k_policy: Mapped[str] = mapped_column(String(32))
    workload: Mapped[str] = mapped_column(String(255))
    dtype: Mapped[str] = mapped_column(String(16))
    levels: Mapped[list] = mapped_column(JSON)
    run_ids: Mapped[list] = mapped_column(JSON)
    crossover_concurrency: Mapped[int | None] = mapped_column(Integer)


class ServeKey(Base):
    """The key a server recording into this store shares with the clients that record its requests in the
    same store themselves (`specfinops loadtest`, header X-Specfinops-Recorded-In): random per server start,
    kept with its 'serve' run, so only who can read the store can keep a request out of the server's runs."""

    __tablename__ = "serve_keys"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(64))


# The host and port of a URL as SQLAlchemy's make_url reads them (sqlalchemy.engine.url._parse_url): after an
# optional "user[:password]@" whose user name holds no ':' or '/' and whose password runs to the first '@'.
_MAKE_URL_HOSTPORT = re.compile(r"[\w+]+://(?:[^:/]*(?::[^@]*)?@)?([^/?]*)")


def checked_db_url(text: str) -> str:
    """A store as given (--db, SPECFINOPS_DB_URL), checked before anything opens it: a ValueError saying what is
    wrong, never repeating the URL (it may hold a password), where it is blank (it would silently mean the default
    store, or a SQLite file named by its spaces), has a port that is no number 1-65535 (the driver said only
    "invalid literal for int() with base 10"), a host in brackets that does not parse, or an '@' in the user name or
    password not written %40 (the host was read from after it: the driver named a part of the password; this
    includes an '@' after a '/', '?' or '#' in the password, where urlsplit's netloc ends but make_url's password
    does not), or an '@' after the host that moves the user, host or port make_url reads from those of the netloc
    (`_reads_the_netloc`: `postgresql://u@h:5432/db?application_name=a@b` read host 'b'). libpq's
    `postgres://` is taken as `postgresql://`. A value without `://` is a SQLite file path, returned as it is."""
    if not text.strip():
        raise ValueError(f"must be a database URL or a SQLite file path, got {text!r}")
    if text.startswith("postgres://"):  # libpq's spelling (psql, Heroku): SQLAlchemy knows only postgresql
        text = "postgresql://" + text.removeprefix("postgres://")
    if "://" not in text:
        return text  # a SQLite file path
    from urllib.parse import urlsplit

    try:
        netloc = urlsplit(text).netloc
    except ValueError as exc:  # urlsplit's: "Invalid IPv6 URL" (a bracket left open or never opened), a [host]
        # that is no address
        why = ("a '[' without its ']' or a ']' without its '[' around the host (an IPv6 host is written "
               "[::1], a port after it: [::1]:5432)" if "Invalid IPv6 URL" in str(exc) else str(exc))
        raise ValueError(f"malformed URL: {why}") from None
    at_in_userinfo = ValueError("the user name or password in the URL holds an '@': write each '@' in them as %40 "
                                "(postgresql://user:p%40ss@host/db)")
    if netloc.count("@") > 1:  # the host was taken from after the first: the driver named a part of the password
        raise at_in_userinfo
    # The host and port as make_url reads them (its password runs to the first '@', where urlsplit's netloc ends at
    # the first '/', '?' or '#'): a password holding one of those and an '@' leaves a part of it in this host.
    hostport = _MAKE_URL_HOSTPORT.match(text)
    hostport = hostport.group(1) if hostport else ""
    if "@" in hostport:
        raise at_in_userinfo
    port = hostport.rpartition(":")[2] if ":" in hostport.rpartition("]")[2] else None
    try:
        url = make_url(text)
    except ArgumentError:
        return text  # resolving the URL says what is wrong with it
    except ValueError:
        raise ValueError(f"the port must be a number 1-65535, got {port!r}") from None
    if url.host and "@" in url.host:  # as above, should make_url read the URL otherwise than the pattern
        raise at_in_userinfo
    if not _reads_the_netloc(url, netloc):
        raise ValueError("an '@' after the host (in the URL's path, query or fragment) made the driver read the user "
                         "name, password and host from the start of the URL to it, the host from after it: write each "
                         "'@' there as %40 (?application_name=a%40b)")
    if url.port is not None and not 1 <= url.port <= 65535:
        raise ValueError(f"the port must be a number 1-65535, got {port!r}")
    return text


def _reads_the_netloc(url, netloc: str) -> bool:
    """Whether make_url's user, host and port (`url`) are those of the URL's netloc as urlsplit reads it (up to the
    first '/', '?' or '#'). Without a password, make_url reads a user name up to a ':' and a password up to the next
    '@', wherever that is: `postgresql://u@h:5432/db?application_name=a@b` is user 'u@h', host 'b'. Not asked
    where urlsplit's netloc ends inside a password (a '/', '?' or '#' in it: its "port" is then no number), where
    make_url reads the URL as meant."""
    userinfo, at, hostport = netloc.rpartition("@")
    host, colon, port = hostport.rpartition(":") if ":" in hostport.rpartition("]")[2] else (hostport, "", "")
    if colon and not port.isdigit():
        return True  # a password holding '/', '?' or '#' (or a port no number: said elsewhere)
    host = unquote(host.removeprefix("[").removesuffix("]")).lower()
    user = unquote(userinfo.partition(":")[0]) if at else None
    return ((url.username or None) == (user or None) and unquote(url.host or "").lower() == host
            and url.port == (int(port) if port else None))


def env_db_url() -> str | None:
    """SPECFINOPS_DB_URL, checked as --db is (checked_db_url), a ValueError naming the variable where it names no
    store; None where it is unset or empty (an empty value counts as unset: a shell's `SPECFINOPS_DB_URL=` or a
    compose file's `${SPECFINOPS_DB_URL:-}` means the default store)."""
    value = os.environ.get(ENV_DB_URL)
    if not value:
        return None
    try:
        return checked_db_url(value)
    except ValueError as exc:
        blank = "" if value.strip() else f" (unset it, or set it empty, for the default store {DEFAULT_DB_PATH})"
        raise ValueError(f"{ENV_DB_URL}: {exc}{blank}") from None


def resolve_db_url(url: str | None = None) -> str:
    """`--db` beats `SPECFINOPS_DB_URL` (where set and not empty; checked by env_db_url) beats the default SQLite
    file `var/specfinops.db`. A value without `://` is a SQLite file path (`--db runs.db`); anything else must be
    a URL SQLAlchemy can parse."""
    url = url or env_db_url()
    if not url:  # its folder is made by make_engine, when a command opens the store
        url = f"sqlite:///{DEFAULT_DB_PATH}"
    elif "://" not in url:
        url = f"sqlite:///{url}"
    if url.startswith("sqlite:///~"):
        url = f"sqlite:///{Path(url.removeprefix('sqlite:///')).expanduser()}"
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    try:
        u = make_url(url)
    except ArgumentError as exc:
        raise ValueError(f"database URL {url!r} cannot be parsed (expected e.g. sqlite:///var/specfinops.db or "
                         "postgresql://user@host:5432/db)") from exc
    uri_args = sorted(set(u.query) & SQLITE_URI_ARGS)
    if u.get_backend_name() == "sqlite" and uri_args and str(u.query.get("uri", "")).lower() not in ("true", "1"):
        # the driver ignores them (a warning at most): `?mode=ro` opened the store writable, and `prices set` wrote
        raise ValueError(f"database URL {url!r}: SQLite takes {', '.join(uri_args)} only in a URI, and without it "
                         "ignores them (mode=ro would not be read-only): write it as sqlite:///file:/path/store.db?"
                         f"{'&'.join(f'{k}={u.query[k]}' for k in uri_args)}&uri=true")
    return url


def secret_query_keys(url) -> list[str]:
    """The query parameters of `url` (a SQLAlchemy URL) that carry a secret: every one naming a password, in any
    case (libpq's `password` and `sslpassword`, a key's passphrase; `PGPASSWORD=` as some write it), masked as
    the user-info password is."""
    return [key for key in url.query if "password" in key.lower()]


def masked_url_text(url) -> str:
    """A URL (a str or a SQLAlchemy URL) as text with every password masked as ***: the user info's and each
    query parameter naming one (`secret_query_keys`). What names a store wherever one is shown or written
    (`shown_db_url`, a report claim's marker): no password is said or lands in a file."""
    u = make_url(url) if isinstance(url, str) else url
    secret = secret_query_keys(u)
    shown = (u.update_query_dict({key: "***" for key in secret}) if secret else u).render_as_string(hide_password=True)
    for key in secret:  # render_as_string writes the mask %2A%2A%2A
        shown = shown.replace(f"{key}=%2A%2A%2A", f"{key}=***")
    return shown


def shown_db_url(url) -> str:
    """A server's URL (a str or a SQLAlchemy URL) as the user writes it, its password masked, in the user info or
    the query string (`?password=`, `?sslpassword=`, any key naming a password: `masked_url_text`):
    postgresql://..., not the postgresql+psycopg:// driver `resolve_db_url` names for SQLAlchemy (which no user
    gave)."""
    u = make_url(url) if isinstance(url, str) else url
    if u.drivername == "postgresql+psycopg":
        u = u.set(drivername="postgresql")
    return masked_url_text(u)


def masked_password_note(url) -> str:
    """' (*** is its password)' after a suggested command whose --db is a URL shown with its password masked
    (`shown_db_url`), which does not run as written; '' for one without a password."""
    u = make_url(url) if isinstance(url, str) else url
    return " (*** is its password)" if u.password or secret_query_keys(u) else ""


# SQLite's URI parameters: the driver takes them only with uri=true (sqlite:///file:/path.db?mode=ro&uri=true)
SQLITE_URI_ARGS = frozenset({"mode", "cache", "immutable", "nolock", "psow", "vfs"})
SQLITE_BUSY_TIMEOUT_MS = 5000
# How long a command's own write (a run's start, `prices set`) waits, in tries of SQLITE_BUSY_TIMEOUT_MS, while
# another process holds the store's write lock, before it says so and gives up (`retry_while_locked`).
SQLITE_LOCK_WAIT_S = 60.0
T = TypeVar("T")
# How long a schema change waits for the write lock another process holds (another opener creating or
# upgrading the same store): an upgrade of a big store rebuilds tables for minutes.
SQLITE_MIGRATION_WAIT_MS = 30 * 60 * 1000
MIGRATION_TRY_MS = 250  # ... in waits this long, so that a Ctrl-C between them stops it (`_begin_immediate`)
PG_MIGRATION_LOCK_KEY = 0x5EC_F1A0  # pg_advisory_xact_lock key: one process changes the schema at a time
# How long one PostgreSQL statement waits for a lock another session holds (lock_timeout, set on every session by
# `make_engine`) before it fails with lock_not_available, which `retry_while_locked` waits on as on SQLite's busy
# error; without it a row or table another session kept locked made any command wait forever, silently.
PG_LOCK_TIMEOUT_MS = SQLITE_BUSY_TIMEOUT_MS
PG_LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE lock_not_available
PG_INSUFFICIENT_PRIVILEGE = "42501"  # SQLSTATE insufficient_privilege: "permission denied for table ..."


class StoreLockedError(RuntimeError):
    """A write to a store that another process (another session of a PostgreSQL server) kept locked for longer
    than this one waited: SQLite says only 'database is locked', naming neither the file nor who holds it;
    PostgreSQL, without a lock timeout, waited forever and said nothing. `path`: a SQLite file, or a server's URL
    as shown (`shown_db_url`, its password masked) with `server` set."""

    def __init__(self, path: Path | str | None, waited_s: float | None, *, server: bool = False,
                 lock_timeout: str | None = None, migration_bound_s: float | None = None):
        """`waited_s`: how long this waited, where it is known (a write retried, a migration's lock); None for a
        PostgreSQL statement its session's lock_timeout ended (`lock_timeout`, as PostgreSQL shows it, where it
        was read back): only that statement's transaction is known to be rolled back, a read's as well as a
        write's, so no 'nothing was written' is said. `migration_bound_s`: the most a schema change waits
        (SQLITE_MIGRATION_WAIT_MS), said where a migration gave up: its own bound, not the session's."""
        store = f"the store {path}" if path is not None else "the store"
        holder = "another session holds a lock on what this needs" if server else \
            "another process holds a write lock on it"
        if waited_s is not None:
            waited, outcome = f"still after {waited_s:.0f} s of waiting", "nothing was written"
            if migration_bound_s is not None:
                waited += f"; a schema change waits up to {_span(migration_bound_s)}"
        else:
            waited = "still after waiting the session's lock_timeout" + (f", {lock_timeout}" if lock_timeout else "")
            outcome = "the statement's transaction was rolled back"
        super().__init__(f"{store} is locked: {holder} ({waited}); {outcome}. Retry once it is done")
        self.path = path


# The lock_timeout each PostgreSQL store's sessions got (`_pg_session`), as PostgreSQL shows it ('5s',
# '1234ms'), by the store's URL as shown (`shown_db_url`): what a command that failed on it waited.
_PG_LOCK_TIMEOUTS: dict[str, str] = {}


def session_lock_timeout(shown_url: str | None) -> str | None:
    """The lock_timeout the sessions of the PostgreSQL store `shown_url` (as `shown_db_url` shows it) were found
    with when this process connected to it; None where it has not."""
    return _PG_LOCK_TIMEOUTS.get(shown_url) if shown_url is not None else None


def is_locked(exc: BaseException) -> bool:
    """Whether `exc` (a DBAPIError or its driver's error) says the store is locked by another writer: SQLite's
    'database is locked' (another process holds the write lock longer than the busy timeout), PostgreSQL's
    lock_not_available (SQLSTATE 55P03: a lock another session holds, waited for longer than lock_timeout)."""
    orig = getattr(exc, "orig", None) or exc
    if getattr(orig, "sqlstate", None) == PG_LOCK_NOT_AVAILABLE:
        return True
    name = getattr(orig, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "database is locked" in str(orig)


def locked_store(engine: Engine) -> tuple[Path | str | None, bool]:
    """(the store as a locked-store message names it, whether it is a server's): a SQLite file, or a server's URL
    with its password masked."""
    if engine.dialect.name == "sqlite":
        return sqlite_file(engine.url.render_as_string()), False
    return shown_db_url(engine.url), True


def retry_while_locked(engine: Engine, write: Callable[[], T]) -> T:
    """`write()` (one whole transaction: a failed try leaves nothing written), tried again with backoff while the
    store stays locked by another process (SQLite) or session (PostgreSQL, whose each wait for a lock ends after
    PG_LOCK_TIMEOUT_MS: `make_engine` sets lock_timeout), up to SQLITE_LOCK_WAIT_S; said once on stderr after the
    first try (itself SQLITE_BUSY_TIMEOUT_MS or PG_LOCK_TIMEOUT_MS long), then StoreLockedError naming the store.
    A bench that had loaded its model died on the first 5 s lock another writer held; on PostgreSQL a row another
    session held locked (`SELECT ... FOR UPDATE` left open) made `prices set` wait forever, silently."""
    started = time.monotonic()
    delay, said = 0.1, False
    while True:
        try:
            return write()
        except DBAPIError as exc:
            if not is_locked(exc):
                raise
            waited = time.monotonic() - started
            if waited >= SQLITE_LOCK_WAIT_S:
                store, server = locked_store(engine)
                raise StoreLockedError(store, waited, server=server) from None
        if not said:
            store, server = locked_store(engine)
            logger.warning("the store %s is locked by another %s: waiting up to %.0f s for it", store or "",
                           "session" if server else "process (writing to it)", SQLITE_LOCK_WAIT_S)
            said = True
        time.sleep(min(delay, max(0.0, SQLITE_LOCK_WAIT_S - (time.monotonic() - started))))
        delay = min(2 * delay, 2.0)


class StoreFolderError(PermissionError):
    """A SQLite store in a folder this process cannot write: SQLite cannot make the files WAL mode keeps next
    to the store, so it cannot even be read."""


def folder_error(path: Path | None, exc: BaseException) -> StoreFolderError | None:
    """The clear error for a sqlite3 error `exc` on the store at `path` when its folder is what is not writable
    ('attempt to write a readonly database' says only that the database is; on a read-only file system, a
    container's :ro volume, SQLite says only 'unable to open database file'), else None."""
    if path is None or ("readonly" not in str(exc) and "unable to open database file" not in str(exc)):
        return None
    folder = path.absolute().parent
    if getattr(exc, "sqlite_errorname", "") != "SQLITE_READONLY_DIRECTORY" and os.access(folder, os.W_OK):
        return None
    return StoreFolderError(
        f"cannot use the store {path}: its folder {folder} is not writable (permissions, or a read-only file "
        f"system), and SQLite must create {path.name}-wal and {path.name}-shm there to open a store in WAL mode, "
        f"even to read it: make {folder} writable for this user, or copy the store into a folder that is"
    )


class DeviceFullError(OSError):
    """A write that failed because the device holding `path` has no space left. What the system said (ENOSPC,
    SQLite's 'database or disk is full' or 'disk I/O error') names neither the file nor the cause."""

    def __init__(self, what: str, path: Path | str):
        super().__init__(f"no space left on the device holding {what} {path}: free some space there, or use "
                         "another device")
        self.path = path


def device_full(path: Path) -> bool:
    """Whether the filesystem holding `path` (or the nearest folder above it that exists) has no block left that
    this user may write (statvfs's f_bavail); no where it cannot be asked."""
    for where in (path.absolute(), *path.absolute().parents):
        if where.exists():
            try:
                return os.statvfs(where).f_bavail == 0
            except OSError:
                return False
    return False


def store_full_error(path: Path | None, exc: BaseException) -> DeviceFullError | None:
    """The clear error for `exc` on the SQLite store at `path` (a DBAPIError, its sqlite3 error, or an OSError of
    making its folder) when its device is full: SQLITE_FULL ('database or disk is full'), ENOSPC, or a 'disk I/O
    error' (what SQLite says where its -shm file cannot grow) while statvfs finds no free space there. Else
    None; None for a server's store (`path` None), whose own error names its disk."""
    if path is None:
        return None
    orig = getattr(exc, "orig", None) or exc
    name = getattr(orig, "sqlite_errorname", "") or ""
    if isinstance(orig, OSError) and orig.errno == errno.ENOSPC \
            or name == "SQLITE_FULL" or "database or disk is full" in str(orig) \
            or (name.startswith("SQLITE_IOERR") or "disk I/O error" in str(orig)) and device_full(path):
        return DeviceFullError("the store", path)
    return None


def _sqlite_pragmas(dbapi_conn, _record, path: Path | None = None) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA journal_mode=WAL")
    except sqlite3.OperationalError as exc:
        clear = folder_error(path, exc)
        if clear is not None:
            raise clear from None
        raise
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.close()


def _pg_session(dbapi_conn, _record, shown: str | None = None) -> None:
    """Every PostgreSQL session, as it connects, in one transaction (one commit):

    in UTC, whatever the database's default zone or PGTZ say: timestamptz values come back as UTC datetimes (as
    SQLite's naive ones are), so every reader that shows a time labelled UTC (reports, the dashboard, exports)
    shows UTC, and SQL date functions cut days at UTC midnight;

    and it waits at most PG_LOCK_TIMEOUT_MS for a lock another session holds, where nothing
    set its lock_timeout (pg_settings.source 'default': PostgreSQL's 0, wait forever): the statement then fails
    with lock_not_available (its transaction rolled back, nothing of it written), which `retry_while_locked` waits
    on, saying so, and the command's error names (app.cli.describe_failure). One set elsewhere is kept, 0 (wait
    forever) too: the URL's `options`, PGOPTIONS, the database's or the role's settings (ALTER DATABASE/ROLE ...
    SET lock_timeout), postgresql.conf. (Decided by the value's source, not by its being 0: a deliberate 0 got
    the default.)"""
    cur = dbapi_conn.cursor()
    cur.execute("SET TIME ZONE 'UTC'")
    cur.execute("SELECT CASE WHEN source = 'default' "
                f"THEN set_config('lock_timeout', '{int(PG_LOCK_TIMEOUT_MS)}', false) "
                "ELSE current_setting('lock_timeout') END FROM pg_settings WHERE name = 'lock_timeout'")
    row = cur.fetchone()
    cur.close()
    if shown is not None and row:
        _PG_LOCK_TIMEOUTS[shown] = str(row[0])  # what a locked-store error names (app.cli.describe_failure)
    dbapi_conn.commit()


def sqlite_file(url: str) -> Path | None:
    """The file a resolved SQLite URL names; None for an in-memory database or a database server. A SQLite URI
    (`sqlite:///file:/path/store.db?mode=ro&uri=true`, read-only) names /path/store.db."""
    if not url.startswith("sqlite"):
        return None
    u = make_url(url)  # the file as the driver opens it: without the query (`?timeout=30`, `?mode=ro`)
    path = u.database or ""
    if str(u.query.get("uri", "")).lower() in ("true", "1") and (u.database or "").startswith("file:"):
        if u.query.get("mode") == "memory":
            return None
        path = unquote(u.database.removeprefix("file:").split("?", 1)[0])
        if path.startswith("//"):  # file://localhost/path or file:///path
            path = "/" + path[2:].split("/", 1)[-1]
    return Path(path) if path and path != ":memory:" else None


SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")  # what SQLite writes beside a store file, named after it


def sqlite_files(path: Path) -> tuple[Path, ...]:
    """A SQLite store file and the files SQLite keeps beside it (SQLITE_SIDE_FILES), whether there or not."""
    return (path, *(path.with_name(path.name + end) for end in SQLITE_SIDE_FILES))


def new_store_paths(path: Path | None) -> list[Path]:
    """What opening a SQLite store at `path` that does not exist yet creates: the folders missing above it (the
    outermost first), then the file. Empty for a server's database (None) or a file already there."""
    if path is None or path.exists() or path.is_symlink():
        return []
    folders = []
    folder = path.absolute().parent
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        folders.append(folder)
        folder = folder.parent
    return [*reversed(folders), path]


def remove_new_store(created: list[Path]) -> None:
    """Undo new_store_paths after its store could not be made (a disk full while the schema was created, a failed
    upgrade): the file with SQLite's -wal, -shm and -journal files, then the folders made, innermost first, each
    only while empty. A file that holds tables by now is another process's store (a bench that opened it
    meanwhile) and stays, as does one another connection has open (`_remove_unless`)."""
    if created:
        _remove_unless(created, _holds_tables_on, unreadable=False)


def remove_unused_store(created: list[Path]) -> None:
    """Undo new_store_paths for a store that a recording command (bench, calibrate) made and then recorded nothing
    in: refused, failed or stopped (Ctrl-C, SIGTERM) before its first run, while the models loaded or warmed up.
    Removed as remove_new_store removes a store that could not be made, its schema and all; a store that holds a
    row by now stays: a run (this command's, 'cancelled' where it was stopped, or another process's), or what
    another process wrote there meanwhile (a `prices set --db` price, serve's keys, a report), as does one that
    cannot be read to tell, and one another connection has open (a bench that opened it, about to start its run:
    `_remove_unless`). A new store holds no row but its alembic_version (no migration inserts one)."""
    if created:
        _remove_unless(created, _holds_rows_on, unreadable=True)


def _remove_unless(created: list[Path], in_use: Callable[[sqlite3.Connection], bool], *, unreadable: bool) -> None:
    """_remove(created) unless `in_use` says its store file holds what is to be kept, the check and the removal
    under one exclusive lock on the file: a process that opened the store, or wrote a run into it, between a
    check and a removal made apart, had the file (its run with it) deleted from under it. Exclusive locking mode
    takes SQLite's EXCLUSIVE lock on the database file, which it cannot get while any other connection (of any
    process) has the store open (in WAL mode each holds a SHARED lock on it until it closes), and which keeps
    every other connection out until this one closes: an open store is in use, and stays. Under the lock the
    file leaves WAL mode (its WAL checkpointed and deleted while the path still names this file, not by name
    after another process may have made a new store there), then the files are removed, and only then is the
    lock let go; a process that had opened the file just before and writes after is refused by SQLite ('attempt
    to write a readonly database'), not let write into a deleted file. A file SQLite cannot read (not a database):
    `unreadable` says whether that keeps it."""
    path = created[-1]
    if not path.is_file():
        _remove(created)
        return
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=rw", uri=True, timeout=0.1, isolation_level=None)
    except sqlite3.Error:
        if not unreadable:
            _remove(created)
        return
    try:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        conn.execute("BEGIN EXCLUSIVE")  # SQLITE_BUSY where another connection has it open: kept
        if in_use(conn):
            return
        conn.execute("ROLLBACK")  # the lock stays: exclusive locking mode keeps it until the connection closes
        conn.execute("PRAGMA journal_mode=DELETE")
        _remove(created)
    except sqlite3.Error as exc:
        if not unreadable and not _busy(exc):
            _remove(created)  # not a database: nothing of anyone's to keep
    finally:
        conn.close()


def _busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite said another connection holds the file locked."""
    return getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) \
        or "locked" in str(exc)


def _holds_tables_on(conn: sqlite3.Connection) -> bool:
    """Whether the SQLite database on `conn` holds any table."""
    return conn.execute("select count(*) from sqlite_master where type = 'table'").fetchone()[0] > 0


def _holds_rows_on(conn: sqlite3.Connection) -> bool:
    """Whether the SQLite store on `conn` holds a row in a table other than alembic_version (and SQLite's own); no
    runs table to read (not a specfinops store, or its schema not made yet): yes, it is not to be removed on a
    guess."""
    tables = [name for (name,) in conn.execute("select name from sqlite_master where type = 'table'")]
    if "runs" not in tables:
        return True
    data = [name.replace('"', '""') for name in tables
            if name != "alembic_version" and not name.startswith("sqlite_")]  # sqlite_sequence: SQLite's
    return any(conn.execute(f'select exists (select 1 from "{name}")').fetchone()[0] == 1 for name in data)


def _remove(created: list[Path]) -> None:
    """The store file of new_store_paths with SQLite's files beside it, then the folders made for it, innermost
    first, each only while empty."""
    path = created[-1]
    for leftover in sqlite_files(path):
        try:
            leftover.unlink(missing_ok=True)
        except OSError:  # left as it is: the error that made the store fail is the one to say
            pass
    for folder in reversed(created[:-1]):
        try:
            folder.rmdir()
        except FileNotFoundError:  # never made (its mkdir failed): those above may have been
            continue
        except OSError:  # not empty (something else wrote there meanwhile): leave it and those above
            break


def file_in_path(path: Path) -> Path | None:
    """The first of the store's folders (`/tmp/x/file.db` of `/tmp/x/file.db/store.db`) that is not a folder but
    a file; None when every one that exists is a folder."""
    for folder in reversed(path.absolute().parents):
        if folder.exists() and not folder.is_dir():
            return folder
        if not folder.exists():
            return None
    return None


_WATCHES: list[weakref.WeakSet] = []  # the open `engines_made` blocks' engines (every thread's)
_WATCH_LOCK = threading.Lock()


@contextmanager
def engines_made() -> Iterator[weakref.WeakSet]:
    """The SQLite file engines make_engine makes (in any thread) while the block runs, held weakly: what a block
    that removes the store it created again (app.commands._common.store_opened_for) disposes first. An engine left
    open by the code in the block (a store read and dropped, an engine made before what raised, held alive by the
    exception's traceback) keeps a connection on the file, which then reads as in use and stays
    (`remove_unused_store`)."""
    made: weakref.WeakSet = weakref.WeakSet()
    with _WATCH_LOCK:
        _WATCHES.append(made)
    try:
        yield made
    finally:
        with _WATCH_LOCK:  # by identity: two watches holding the same engines are equal (WeakSet's ==), and
            # list.remove took an enclosing or another thread's block's watch for this one
            _WATCHES[:] = [watch for watch in _WATCHES if watch is not made]


def dispose_engines_on(engines: weakref.WeakSet, path: Path) -> None:
    """Dispose of the engines (engines_made) on the SQLite file `path`: their pooled connections closed. An engine
    disposed of connects again if it is used after, so one still in use elsewhere is not broken, only reopened."""
    target = path.absolute()
    for engine in list(engines):
        file = sqlite_file(engine.url.render_as_string(hide_password=False))
        if file is not None and file.absolute() == target:
            engine.dispose()


def make_engine(url: str | None = None) -> Engine:
    """An Engine for the URL; SQLite gets WAL, foreign keys and a busy timeout, PostgreSQL sessions in UTC with a
    lock timeout (PG_LOCK_TIMEOUT_MS, where nothing set one: `_pg_session`)."""
    url = resolve_db_url(url)
    if url.startswith("sqlite"):
        path = sqlite_file(url)
        if path is not None:
            if path.is_dir():
                raise ValueError(f"database {url!r} is a directory: give a SQLite file path or a database URL")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):  # a file where a folder of the path should be
                file = file_in_path(path) or path.parent
                raise ValueError(f"database {url!r}: {file} is a file, not a directory") from None
        engine = create_engine(url, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", functools.partial(_sqlite_pragmas, path=path))
        if path is not None:
            with _WATCH_LOCK:
                for watch in _WATCHES:
                    watch.add(engine)
        return engine
    u = make_url(url)
    # checked before any driver is imported: a MySQL URL is refused as such, not as "MySQLdb is not installed"
    unsupported = ValueError(f"database URL {u.render_as_string(hide_password=True)!r}: unknown database kind "
                             f"{u.drivername!r}: only sqlite:/// and postgresql:// stores are supported")
    if u.get_backend_name() not in SUPPORTED_BACKENDS:
        raise unsupported
    try:
        engine = create_engine(url, pool_pre_ping=True)
    except NoSuchModuleError as exc:  # postgresql+nosuchdriver://
        raise unsupported from exc
    if engine.dialect.name == "postgresql":
        event.listen(engine, "connect", functools.partial(_pg_session, shown=shown_db_url(engine.url)))
    return engine


@contextmanager
def read_snapshot(engine: Engine) -> Iterator[Connection]:
    """A connection whose reads all see one state of the store, whatever other processes commit meanwhile: a run
    read as completed is read with every request it recorded (its totals read first, then its status, showed a run
    'completed' over some of its requests while a writer ended it between the two).

    PostgreSQL: one REPEATABLE READ transaction. SQLite (WAL): one deferred transaction opened by hand (the driver
    opens none before a SELECT, so each statement read the store as it was then); it takes no write lock, so
    writers go on meanwhile. Nothing is written: the transaction is rolled back at the end."""
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        if conn.dialect.name != "sqlite":
            with conn.begin() as tx:
                yield conn
                tx.rollback()
            return
        dbapi = conn.connection.driver_connection
        dbapi.isolation_level = None  # the driver issues no BEGIN/COMMIT of its own: ours below
        try:
            dbapi.execute("BEGIN")
            yield conn
        finally:
            if dbapi.in_transaction:
                dbapi.execute("ROLLBACK")
            dbapi.isolation_level = ""  # the driver's default again, for whoever gets this pooled connection


@contextmanager
def migration_transaction(engine: Engine) -> Iterator[Connection]:
    """A connection inside the one transaction a schema change runs in: committed when the block ends, rolled
    back on an error, and a killed process leaves the schema it found (nothing half-migrated).

    PostgreSQL runs DDL in transactions anyway; here the transaction first takes an advisory lock, so a second
    migrator waits, then finds the work done. SQLite needs more: Python's sqlite3 driver opens no transaction
    before CREATE/ALTER/DROP, so each would commit on its own. The connection is switched to driver
    autocommit and the transaction opened by hand (SQLAlchemy's pysqlite recipe) with BEGIN IMMEDIATE: it takes
    the write lock at once, so a second migrator (or opener of a new store) waits for it, then reads the
    revision the first one committed. Foreign keys are off meanwhile (set outside the transaction: inside one
    SQLite ignores the pragma), so a batch rebuild of a parent table (copy, DROP, rename) does not delete its
    children through ON DELETE CASCADE; the connection gets them back afterwards."""
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            with conn.begin():
                started = time.monotonic()
                left_s = _pg_migration_lock(conn, engine)
                try:
                    with _said_while_blocked(engine, conn, left_s):
                        yield conn
                except DBAPIError as exc:  # a lock the schema change needed, waited for up to its own bound (the
                    # SET LOCAL lock_timeout), not the session's that a plain statement's error names
                    if not is_locked(exc):
                        raise
                    raise StoreLockedError(shown_db_url(engine.url), time.monotonic() - started, server=True,
                                           migration_bound_s=SQLITE_MIGRATION_WAIT_MS / 1000) from None
            return
        if conn.dialect.name != "sqlite":
            with conn.begin():
                yield conn
            return
        dbapi = conn.connection.driver_connection
        dbapi.execute("PRAGMA foreign_keys=OFF")
        dbapi.isolation_level = None  # the driver issues no BEGIN/COMMIT of its own: ours below
        try:
            with conn.begin():  # a no-op at the driver here; its commit/rollback end the transaction below
                _begin_immediate(dbapi, engine.url.database or "")
                yield conn
        finally:
            dbapi.isolation_level = ""  # the driver's default again, for whoever gets this pooled connection
            dbapi.execute("PRAGMA foreign_keys=ON")


def _pg_migration_lock(conn: Connection, engine: Engine) -> float:
    """The advisory lock one PostgreSQL migrator holds at a time, as `_begin_immediate` takes SQLite's write lock:
    when another session holds it for more than a second, say so and wait, up to SQLITE_MIGRATION_WAIT_MS, in tries
    of MIGRATION_TRY_MS (a Ctrl-C stops it between them), then StoreLockedError (pg_advisory_xact_lock waited
    forever, silently). The locks the migration then needs are waited for up to the rest of that bound."""
    started = time.monotonic()
    said = False
    while not conn.execute(sql_text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": PG_MIGRATION_LOCK_KEY}).scalar():
        waited = time.monotonic() - started
        if waited >= SQLITE_MIGRATION_WAIT_MS / 1000:
            raise StoreLockedError(shown_db_url(engine.url), waited, server=True,
                                   migration_bound_s=SQLITE_MIGRATION_WAIT_MS / 1000)
        if not said and waited >= 1.0:
            logger.warning("the store %s is being written by another session (creating or upgrading the store?): "
                           "waiting up to %.0f min for it to finish", shown_db_url(engine.url),
                           SQLITE_MIGRATION_WAIT_MS / 60_000)
            said = True
        time.sleep(MIGRATION_TRY_MS / 1000)
    # The schema change itself waits for the locks it needs (ALTER TABLE's ACCESS EXCLUSIVE behind a reader's open
    # transaction) for the rest of the migration's bound, not the session's PG_LOCK_TIMEOUT_MS: with that, an
    # upgrade failed 'locked' after 5 s whenever a dashboard or report was reading. SET LOCAL: the pooled session
    # gets its own lock_timeout back when this transaction ends. (Not retried in short tries instead, which would
    # keep the readers that queue behind the waiting DDL from waiting long: the migration's body, Alembic's run and
    # the counting and prompts of `db downgrade`, is its callers', run once inside this transaction; a failed try
    # would have to run all of it again. Those readers wait at most their own lock_timeout, then say the store is
    # locked; a write retries for up to SQLITE_LOCK_WAIT_S.)
    left_ms = max(1, int(SQLITE_MIGRATION_WAIT_MS - (time.monotonic() - started) * 1000))
    conn.execute(sql_text(f"SET LOCAL lock_timeout = {left_ms}"))
    return left_ms / 1000


def _span(seconds: float) -> str:
    """A bound as a waiting line says it: '30 min', '1.5 s'."""
    return f"{round(seconds / 60, 1):g} min" if seconds >= 60 else f"{round(seconds, 1):g} s"


@contextmanager
def _said_while_blocked(engine: Engine, conn: Connection, left_s: float) -> Iterator[None]:
    """While the migration on `conn` runs: from a second after it starts, a look each second (from another
    session of `engine`) whether its session waits for a lock another session holds (pg_blocking_pids: a reader
    of a table its ALTER changes); the first time it does, say so once, as SQLite's and a retried write's waiting
    lines are (the wait, up to `left_s`, was silent). A migration that waits for nothing, however long, says
    nothing, and opens no second session where it ends within the second. (A watch, not a short lock_timeout
    first: the failed statement would abort the transaction, and the migration's body is its callers', run once.)"""
    pid = conn.execute(sql_text("SELECT pg_backend_pid()")).scalar()
    done = threading.Event()

    def watch() -> None:
        if done.wait(1.0):
            return
        try:
            with engine.connect() as probe:
                while not done.is_set():
                    blocked = probe.execute(sql_text("SELECT cardinality(pg_blocking_pids(:pid)) > 0"),
                                            {"pid": pid}).scalar()
                    probe.rollback()
                    if blocked and not done.is_set():
                        logger.warning("the store %s is locked by another session (reading or writing a table the "
                                       "schema change alters): waiting up to %s for it; Ctrl-C stops it",
                                       shown_db_url(engine.url), _span(left_s))
                        return
                    done.wait(1.0)
        except Exception:  # noqa: BLE001 - a look that failed (no connection left) only leaves the wait unsaid
            logger.debug("could not look whether the migration waits for a lock", exc_info=True)

    watcher = threading.Thread(target=watch, name="migration-lock-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(5)


def _begin_immediate(dbapi: sqlite3.Connection, path: str) -> None:
    """BEGIN IMMEDIATE; when another process holds the write lock for more than a second, say so and wait, up
    to SQLITE_MIGRATION_WAIT_MS, in tries of MIGRATION_TRY_MS: Python runs a signal handler only between C calls,
    and one wait of 30 minutes inside SQLite's busy handler left Ctrl-C dead until the other writer let go."""
    deadline = time.monotonic() + SQLITE_MIGRATION_WAIT_MS / 1000
    said = False
    try:
        dbapi.execute("PRAGMA busy_timeout=1000")
        while True:
            tried = time.monotonic()
            try:
                dbapi.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() >= deadline:
                    raise
            # an error back at once, without SQLite's busy wait (a table lock, a busy snapshot), must not spin
            time.sleep(max(0.0, MIGRATION_TRY_MS / 1000 - (time.monotonic() - tried)))
            if not said:
                logger.warning("%s is being written by another process (creating or upgrading the store?): waiting "
                               "for it to finish", path or "the store")
                dbapi.execute(f"PRAGMA busy_timeout={MIGRATION_TRY_MS}")
                said = True
    finally:
        dbapi.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")

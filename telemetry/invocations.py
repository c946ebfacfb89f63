"""Command invocations in the store: one bench or load test each (runs.invocation_id, migration 0011).

Every run a bench or load test records carries that command's uuid4 hex, so its spec and AR runs, measured
under the same machine conditions, can be read together. This module lists the invocations and resolves what a
user types (`--invocation latest`, an id, or its first characters as bench printed them) to one id; the figures
themselves come from `telemetry.queries` with `Filters(invocation_id=...)`.

Public API:
    list_invocations(engine, limit=20) -> list[Invocation]  (newest first)
    invocation_text(text) -> str  (checked before the store is read)
    resolve_invocation(engine, text) -> str
    invocation_span(engine, invocation_id) -> (since, until)  (whole seconds around its requests)
    dropped_records(engine, invocation_id) -> int  (records its runs lost: runs.dropped_records summed)
    overlapping_runs(engine, invocation_id) -> list of rows (id, kind, node_id, started_at, ended_at, status)
    one_mode_text(engine, invocation_id) -> str | None  (said where it holds runs of one mode only)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import case, exists, func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import aliased

from telemetry.db import Request, Run
from telemetry.liveness import RUNNING, STALE, shown_status
from telemetry.queries import as_utc

LATEST = "latest"
MIN_PREFIX = 4  # characters of an id that a prefix must give (git's habit: short, still unambiguous in practice)
_HEX = re.compile(r"[0-9a-f]+")


@dataclass(frozen=True, slots=True)
class Invocation:
    """One command invocation's runs, summarised: when, what and how much it measured."""

    invocation_id: str
    started_at: datetime  # its first run's start
    last_started_at: datetime  # its last run's start
    num_runs: int
    num_spec_runs: int
    num_ar_runs: int
    num_requests: int
    # runs still 'running': the command is under way (or was killed, on a machine this one cannot look at,
    # without ending them); those whose process is known to be gone are num_stale instead (telemetry.liveness)
    num_running: int
    kinds: tuple[str, ...]  # bench | loadtest (one, in practice)
    workloads: tuple[str, ...]
    targets: tuple[str, ...]
    nodes: tuple[str, ...]
    num_cancelled: int = 0  # runs ended 'cancelled': the command was stopped (Ctrl-C, SIGTERM) while they ran
    num_failed: int = 0  # runs ended 'failed': the command raised while they ran
    num_stale: int = 0  # runs left 'running' whose process is gone: killed or crashed before it could end them

    @property
    def short_id(self) -> str:
        return self.invocation_id[:8]


def list_invocations(engine: Engine, limit: int | None = 20, *, finished: bool = False,
                     with_requests: bool = False) -> list[Invocation]:
    """The store's invocations, newest first (by their first run's start); at most `limit` (None: all); with
    `finished`, only those none of whose runs is still 'running'; with `with_requests`, only those that completed a
    request (status 'ok' with a token: what cost counts; not a bench whose runs failed or were stopped before
    their first ended, which records that request 'error'/'cancelled' with no token). Runs with no invocation (a
    server's; recorded before 0011) are in none. Two SELECTs: the invocations' run counts, then the listed ones' distinct labels and
    request counts."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit!r}")
    first = func.min(Run.started_at)
    running = func.sum(case((Run.status == "running", 1), else_=0))
    q = (select(Run.invocation_id, first, func.max(Run.started_at), func.count(Run.id),
                func.sum(case((Run.mode == "spec", 1), else_=0)), func.sum(case((Run.mode == "ar", 1), else_=0)),
                running, func.sum(case((Run.status == "cancelled", 1), else_=0)),
                func.sum(case((Run.status == "failed", 1), else_=0)))
         .where(Run.invocation_id.is_not(None))
         .group_by(Run.invocation_id)
         .order_by(first.desc(), Run.invocation_id))
    if finished:
        q = q.having(running == 0)
    if with_requests:  # an invocation one of whose runs completed a request (ix_requests_run_id: one probe per run)
        asked = aliased(Run)
        q = q.where(Run.invocation_id.in_(
            select(asked.invocation_id).where(exists().where(Request.run_id == asked.id, Request.status == "ok",
                                                             Request.output_tokens > 0))))
    if limit is not None:
        q = q.limit(limit)
    with engine.connect() as c:
        heads = c.execute(q).all()
        ids = [h[0] for h in heads]
        labels: dict[str, dict[str, set]] = {i: {"kind": set(), "workload": set(), "target": set(), "node_id": set()}
                                             for i in ids}
        requests: dict[str, int] = dict.fromkeys(ids, 0)
        stale: dict[str, int] = {}  # the 'running' runs whose process is gone, by invocation
        if ids:
            for inv, kind, workload, target, node in c.execute(
                    select(Run.invocation_id, Run.kind, Run.workload, Run.target, Run.node_id).distinct()
                    .where(Run.invocation_id.in_(ids))):
                for name, value in (("kind", kind), ("workload", workload), ("target", target), ("node_id", node)):
                    if value is not None:
                        labels[inv][name].add(value)
            for inv, n in c.execute(select(Run.invocation_id, func.count(Request.id))
                                    .join(Request, Request.run_id == Run.id)
                                    .where(Run.invocation_id.in_(ids)).group_by(Run.invocation_id)):
                requests[inv] = int(n)
            for inv, *row in c.execute(select(Run.invocation_id, Run.id, Run.status, Run.pid, Run.process_key,
                                              Run.started_at)
                                       .where(Run.invocation_id.in_(ids), Run.status == RUNNING)):
                if shown_status(*row[1:]) == STALE:
                    stale[inv] = stale.get(inv, 0) + 1
    return [
        Invocation(invocation_id=inv, started_at=_utc(start), last_started_at=_utc(last), num_runs=int(n),
                   num_spec_runs=int(spec or 0), num_ar_runs=int(ar or 0), num_requests=requests[inv],
                   num_running=int(busy or 0) - stale.get(inv, 0), num_cancelled=int(cancelled or 0),
                   num_failed=int(failed or 0), num_stale=stale.get(inv, 0),
                   kinds=tuple(sorted(labels[inv]["kind"])), workloads=tuple(sorted(labels[inv]["workload"])),
                   targets=tuple(sorted(labels[inv]["target"])), nodes=tuple(sorted(labels[inv]["node_id"])))
        for inv, start, last, n, spec, ar, busy, cancelled, failed in heads
    ]


def _utc(when: datetime) -> datetime:
    """A store time as an aware UTC time (SQLite hands back naive UTC; PostgreSQL the session's zone)."""
    return as_utc(when, "a store time")


def invocation_text(text: str) -> str:
    """What `--invocation` gave, normalised ('latest', or lower-case hex without dashes), before the store is
    read: ValueError naming `text` where it can name no invocation."""
    norm = text.strip().lower().replace("-", "")  # str(uuid) with dashes reads as its hex
    if norm == LATEST:
        return norm
    if not norm or not _HEX.fullmatch(norm):
        raise ValueError(f"--invocation must be 'latest' or an invocation id (hexadecimal, as bench and loadtest "
                         f"print it), got {text!r}")
    if len(norm) < MIN_PREFIX:
        raise ValueError(f"--invocation {text}: give at least {MIN_PREFIX} characters of the id")
    if len(norm) > 32:
        raise ValueError(f"--invocation {text}: an invocation id has 32 hexadecimal digits, this has {len(norm)}")
    return norm


def resolve_invocation(engine: Engine, text: str) -> str:
    """The one invocation id that `text` names: 'latest' (of the invocations whose runs have all ended and that
    completed a request, the one whose first run started last: a bench still under way has no figures to read yet,
    nor has one none of whose requests ended ok with output tokens: a bench that failed or was stopped during its
    first, a load test whose requests all came back an error or empty), a whole id, or its first
    characters (at least MIN_PREFIX, as bench prints it). ValueError naming `text` otherwise: empty, not
    hexadecimal, too short, matching none (with the newest ids) or several (with them)."""
    norm = invocation_text(text)
    if norm == LATEST:
        newest = list_invocations(engine, limit=1, finished=True, with_requests=True)
        empty = [] if newest else list_invocations(engine, limit=1, finished=True)
        if empty:
            # no finished one completed a request: a running one that did is the one to read (by its id)
            busy = list_invocations(engine, limit=1, with_requests=True)
            running = f"{busy[0].short_id} {_unended_text(busy[0])}: give its id to read what it recorded so far; " \
                if busy else ""
            raise ValueError(
                f"--invocation {text}: no finished bench or load test in the store completed a request (the newest "
                f"finished, {empty[0].short_id}, completed no request: none ended ok with output tokens); {running}"
                "`specfinops invocations` lists them")
        if not newest:
            busy = list_invocations(engine, limit=1)
            raise ValueError(f"--invocation {text}: " + (
                ("the store's only invocations are still running "
                 if busy[0].num_running or not busy[0].num_stale else "the store's only invocations never ended ")
                + f"({busy[0].short_id}: {_unended_text(busy[0], its=True)}); give its id to read what it recorded "
                "so far" if busy else
                "the store has no bench or load-test invocations (runs recorded by a server, or before the store "
                "kept invocations, belong to none)"))
        return newest[0].invocation_id
    with engine.connect() as c:
        found = list(c.execute(select(Run.invocation_id).distinct()
                               .where(Run.invocation_id.like(norm + "%")).limit(6)).scalars())
    if len(found) == 1:
        return found[0]
    if not found:
        newest = [i.short_id for i in list_invocations(engine, limit=5)]
        have = (f"the newest: {', '.join(newest)}; `specfinops invocations` lists them" if newest
                else "the store has none")
        raise ValueError(f"--invocation {text}: no invocation id starts with {norm!r} ({have})")
    shown = ", ".join(sorted(found)[:5]) + (", ..." if len(found) > 5 else "")
    raise ValueError(f"--invocation {text}: {'more than 5' if len(found) > 5 else len(found)} invocations start "
                     f"with {norm!r} ({shown}): give more characters")


def _unended_text(i: Invocation, *, its: bool = False) -> str:
    """How an invocation whose runs have not all ended stands: still running, or its process gone (`its`: said
    of its runs)."""
    if i.num_stale and not i.num_running:
        return ("its process is gone, killed or crashed before it could end its runs" if its
                else "was killed or crashed before it could end its runs (its process is gone)")
    return "its runs have not ended" if its else "is still running"


def invocation_span(engine: Engine, invocation_id: str) -> tuple[datetime, datetime]:
    """[since, until) in whole UTC seconds that holds every request one invocation recorded (filters bound
    requests.started_at): from its first run's start to past its last run's end or its last request's start,
    whichever is later. A run that never ended (a bench still going, or killed before it could end it) adds
    only its requests: not the time since. ValueError where no run has that id."""
    first, last = _span(engine, invocation_id)
    if first is None:
        raise ValueError(f"no run has invocation id {invocation_id!r}")
    return _utc(first).replace(microsecond=0), _utc(last).replace(microsecond=0) + timedelta(seconds=1)


def _span(engine: Engine, invocation_id: str) -> tuple[datetime | None, datetime | None]:
    """(its first run's start, the later of its last run's end and its last request's start), as the store holds
    them; (None, None) where no run has that id. A run that never ended adds only its requests."""
    last_request = (select(func.max(Request.started_at)).join(Run, Request.run_id == Run.id)
                    .where(Run.invocation_id == invocation_id).scalar_subquery())
    with engine.connect() as c:
        first, ended, requested = c.execute(
            select(func.min(Run.started_at), func.max(Run.ended_at), last_request)
            .where(Run.invocation_id == invocation_id)).one()
    if first is None:
        return None, None
    return first, max(x for x in (first, ended, requested) if x is not None)


def overlapping_runs(engine: Engine, invocation_id: str) -> list:
    """Runs that other commands recorded on the invocation's node (runs.node_id) while it measured, oldest first:
    two measurements at once slow each other, and each is priced at the whole node. A run overlaps when it started
    before the invocation's last run ended (or its last request started) and ended after its first run began; one
    that never ended (still going, or its process killed) overlaps only where it started, or recorded a request,
    inside that span, so a run killed long ago is not taken for a neighbour. [] where no run has that id."""
    since, until = _span(engine, invocation_id)  # exact: invocation_span's whole seconds took in a run just before
    if since is None:
        return []
    mine = select(Run.node_id).where(Run.invocation_id == invocation_id).distinct()
    # runs with a request inside the span, read off the requests' started_at index (a correlated EXISTS walked
    # every request of each never-ended run, a killed server's million included, after every bench)
    active = select(Request.run_id).where(Request.started_at >= since, Request.started_at < until)
    q = (select(Run.id, Run.kind, Run.node_id, Run.started_at, Run.ended_at, Run.status)
         .where(Run.node_id.in_(mine), Run.started_at < until,
                (Run.invocation_id != invocation_id) | Run.invocation_id.is_(None),
                (Run.ended_at > since) | (Run.ended_at.is_(None) & ((Run.started_at >= since) | Run.id.in_(active))))
         .order_by(Run.started_at, Run.id))
    with engine.connect() as c:
        return list(c.execute(q))


def overlap_text(runs: list) -> str | None:
    """One line naming the runs `overlapping_runs` found, and what they cost the figures; None where none."""
    if not runs:
        return None
    ids = ", ".join(str(r.id) for r in runs[:5]) + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")
    kinds = "/".join(sorted({r.kind for r in runs}))
    return (f"run{'s' if len(runs) > 1 else ''} {ids} ({kinds}) recorded on this node ({runs[0].node_id}) while this "
            "ran: measurements at once slow each other, and each is priced at the whole node; rerun alone for "
            "timings and costs to trust")


def dropped_records(engine: Engine, invocation_id: str) -> int:
    """The records the invocation's runs could not write (a full recorder buffer, or rows the database refused),
    as the runs' ends counted them (runs.dropped_records): 0 where every record reached the store."""
    with engine.connect() as c:
        total = c.execute(select(func.sum(Run.dropped_records)).where(Run.invocation_id == invocation_id)).scalar()
    return int(total or 0)


def one_mode_text(engine: Engine, invocation_id: str) -> str | None:
    """What `cost --invocation` says of an invocation whose runs are all of one mode: a bench or load test of one
    --mode, or one of both that stopped before the second (a disk that filled, a crash: its first mode's runs
    read 'completed', and the store holds nothing of the rest), so no speedup is read from it. None where it
    holds both (or none)."""
    with engine.connect() as c:
        modes = set(c.execute(select(Run.mode).distinct().where(Run.invocation_id == invocation_id)).scalars())
    if len(modes) != 1:
        return None
    (mode,) = modes
    other = "spec" if mode == "ar" else "AR"
    return (f"invocation {invocation_id[:8]} holds {'AR' if mode == 'ar' else mode} runs only, no {other} run: "
            f"a bench or load test of one --mode, or one that stopped before its {other} runs (the store has "
            "nothing of them); no speedup to read from it")

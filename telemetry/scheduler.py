"""Scheduled reports: APScheduler 3 with its SQLAlchemy job store in the specfinops database.

- Job store: table `apscheduler_jobs` in the same database (APScheduler creates and owns it; migrations/env.py
  keeps Alembic from touching it). The job survives restarts: on start, a persisted job with the same id and
  the same configuration is kept as stored (its next run time included, so runs missed while down follow the
  misfire policy); a changed configuration replaces it, its next run time kept where it is past (the runs
  missed while down follow the misfire policy too, with the new options). A changed --cron decides them alone:
  they are the new schedule's times from halfway between the last run made and the stored one on (a cron moved
  earlier catches up the time it moved to; none where the first is still to come): `_catch_up`.
- Misfire policy: coalesce=True (a backlog of missed run times runs once), misfire_grace_time (a run later
  than this is skipped, not run), max_instances=1 (a run still going when the next is due: the next is skipped).
- Two schedulers on one database: APScheduler 3 does not coordinate them, so both may fire a due job. The job
  claims its report by inserting the record first; `reports` has a unique (job_id, since) constraint
  (migration 0002), so exactly one INSERT per job and period succeeds, on SQLite and PostgreSQL alike. The
  other run logs "already reported" and does nothing: no second file, record or delivery. A report left
  undelivered, or whose delivery failed, is taken for its (re)delivery the same way (`take_delivery`: a lease in
  one UPDATE), so it is sent once. A scheduler whose job another start removed (no --keep-other-jobs) stops
  and says so (`app.commands.scheduler._watch_own_job`).
- The job is the module-level `run_report_job`, called with serialisable keyword arguments only (the store
  pickles a reference to it and its arguments, including the database URL; SMTP settings, and the webhook URL
  with --webhook-env NAME, are read from the environment at run time, never stored).
- Stopping: SIGTERM is handled as Ctrl-C (`docker compose stop`): the scheduler stops, a run in progress
  finishes (its report written, its delivery made and recorded), exit status 130. A run killed outright
  (SIGKILL, a crash) leaves its record "generating" or "pending": `recover_reports` rewrites or redelivers it,
  on start and before each run, once it is older than STALE_AFTER_S (claims record no owner; age tells). The
  claims of reports made by hand that a killed `specfinops report` left are released by every write_report
  (report_writer.release_stale_claims), the scheduler's runs included.
- A delivery that failed (every channel, after its attempts: "failed") is made again by the job's later runs
  (after the run's own report and delivery, skipped while that delivery fails too) and at the scheduler's
  start, while the report is younger than REDELIVER_FAILED_FOR_S (a monthly job's: REDELIVER_FAILED_MONTHLY_S);
  the report is not written again, only its summary re-sent. `--list` shows the reports whose delivery failed,
  and those left "generating" or "pending" with when their job takes them (`unfinished_deliveries`); a start
  that leaves a too young one alone says so and when (`left_alone`). A "pending" one of a job that delivers
  nothing stays so (said as "left pending: no delivery configured"); one whose job is gone from the job table
  is finished by nothing (said, with the `specfinops report` command that writes it again); one of those left
  "generating" (a killed run's claim) is released once stale by any report written to the store and by a
  scheduler's start (report_writer.release_stale_claims), its temporary folder removed, said with that command.
  "partially delivered" is not retried (the channel that succeeded would get it twice).
- Every write to the store (the job table and its jobs: LockWaitingJobStore; report records, delivery leases and
  outcomes) waits while another process holds a SQLite store's write lock (telemetry.db.retry_while_locked), then
  fails with StoreLockedError, having written nothing: a run says so in one ERROR line, the command in one line
  (as it starts); the scheduler's loop, storing a job's next run time, in one ERROR line, and it keeps running.
- One scheduler runs every job in its job table, so on start `specfinops scheduler` removes the persisted jobs
  other than the one on its command line (unless --keep-other-jobs); `--list` shows them. Each job's name
  carries its id ("specfinops daily report report-daily"), so the log lines say which job ran.

Public API:
    parse_cron(expr) -> CronTrigger | OrTrigger           # 5-field crontab, UTC; ValueError naming --cron
    make_scheduler(engine, *, blocking=False) -> BaseScheduler
    ReportJob(...)                                        # the job's configuration
    schedule_report_job(scheduler, engine, job, trigger) -> "added" | "kept" | "replaced"
    persisted_jobs(engine) -> list[Job]; describe_job(job) -> str  # `scheduler --list`
    remove_other_jobs(engine, keep_id) -> list[Job]       # on start, unless --keep-other-jobs
    recover_reports(engine, job) -> list[str]             # on start and each run: a killed run's leftovers
    redeliver_failed(engine, job) -> list[str]            # on start and each run: failed deliveries, again
    failed_deliveries(engine) -> list[str]                # `scheduler --list`: reports whose delivery failed
    unfinished_deliveries(engine) -> list[str]            # `scheduler --list`: reports left generating / pending
    left_alone(engine, job) -> list[str]                  # on start: those too young to recover yet, and when
    run_report_job(**ReportJob.kwargs()) -> int | None    # the job: report id, None when already reported or failed
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.job import Job
from apscheduler.jobstores.base import BaseJobStore
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_STOPPED, BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger
from sqlalchemy.engine import Engine

from telemetry.db import JOBS_TABLE, StoreLockedError, retry_while_locked
from telemetry.report import (
    DEFAULT_HISTORY,
    DEFAULT_SLA_MS,
    SCHEDULED_PERIODS,
    Pricing,
    Window,
    period_window,
    runs_covered_text,
)
from telemetry.report_writer import DELIVERY_LEASE, GENERATING, STALE_AFTER_S

logger = logging.getLogger(__name__)

JOB_FUNC = "telemetry.scheduler:run_report_job"
DEFAULT_MISFIRE_GRACE_S = 3600
# A scheduled report whose delivery failed is delivered again by its job's later runs (and at the scheduler's
# start) while it is younger than this: 8 days covers a weekly job's next run (7 days on) and a daily job's next
# seven. By then newer reports have superseded its summary, and a receiver down for over a week needs a person
# (`scheduler --list` names the report, retried or not); each retry makes the job's --attempts tries again.
REDELIVER_FAILED_FOR_S = 8 * 24 * 3600
# A monthly job's next run is 28 to 31 days on: within 8 days no later run of it ever came, so its failed
# delivery was retried only by a restart. 32 days covers the next run after the longest month, and a day late.
REDELIVER_FAILED_MONTHLY_S = 32 * 24 * 3600


def redeliver_failed_for_s(period: str | None) -> int:
    """How long a scheduled report of `period` whose delivery failed is retried (REDELIVER_FAILED_FOR_S; a
    month's REDELIVER_FAILED_MONTHLY_S, so that the job's next run is within it)."""
    return REDELIVER_FAILED_MONTHLY_S if period == "monthly" else REDELIVER_FAILED_FOR_S


# --misfire-grace-s at most a year: APScheduler adds it to the run time as a timedelta at every firing (a larger
# one overflowed there and failed every run, the job kept as accepted)
MAX_MISFIRE_GRACE_S = 366 * 24 * 3600


def absolute_db_url(url: str) -> str:
    """`url` (resolved, see telemetry.db.resolve_db_url) with a relative SQLite file made absolute. A job stores
    its database URL and may run in a scheduler started from another folder (--keep-other-jobs): a relative
    path would name another file there (a new, empty store). A server's URL and an absolute path are unchanged."""
    from sqlalchemy import make_url

    from telemetry.db import sqlite_file

    path = sqlite_file(url)
    if path is None or path.is_absolute():
        return url
    u = make_url(url)
    database = u.database or ""
    if Path(database.removeprefix("file:")).is_absolute():
        return url
    _, sep, query = url.partition("?")  # the query (?timeout=5, ?mode=ro&uri=true) as written
    file = f"file:{Path(database.removeprefix('file:')).resolve()}" if database.startswith("file:") else (
        str(Path(database).resolve()))  # fmt: skip
    return f"{u.drivername}:///{file}{sep}{query}"


def _clock() -> datetime:
    """The time a run reports from (its period is the last full one before it). Tests replace it."""
    return datetime.now(UTC)


def parse_cron(expr: str) -> BaseTrigger:
    """A standard 5-field crontab expression (minute hour day month weekday), evaluated in UTC.

    The weekday numbers are crontab's (0 or 7 = Sunday, 1 = Monday), not APScheduler's (0 = Monday): they are
    translated to day names first. Where both the day of month and the day of week are restricted, crontab
    runs on the days either matches ("0 6 1 * 1": every 1st and every Monday), where APScheduler's CronTrigger
    wants both: that is an OrTrigger of two CronTriggers, one per day field. A day field that starts with `*`
    (`*`, `*/2`) is unrestricted, as in cron (Vixie cron, cronie): the days must then match both fields.
    An expression no date matches (31 February) is refused.
    """
    if not isinstance(expr, str) or len(expr.split()) != 5:
        raise ValueError(f"--cron must have 5 fields (minute hour day month weekday), got {expr!r}")
    fields = expr.split()
    try:
        fields[4] = crontab_weekdays(fields[4])
        minute, hour, day, month, weekday = fields
        if day.startswith("*") or weekday.startswith("*"):
            trigger: BaseTrigger = CronTrigger.from_crontab(" ".join(fields), timezone=UTC)
        else:
            by_day = CronTrigger.from_crontab(f"{minute} {hour} {day} {month} *", timezone=UTC)
            by_weekday = CronTrigger.from_crontab(f"{minute} {hour} * {month} {weekday}", timezone=UTC)
            trigger = OrTrigger([by_day, by_weekday])
    except ValueError as exc:
        raise ValueError(f"--cron {expr!r} is not a valid crontab expression: {exc}") from None
    if trigger.get_next_fire_time(None, datetime.now(UTC)) is None:
        raise ValueError(f"--cron {expr!r} never fires: no date matches its day and month")
    return trigger


CRONTAB_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun")  # crontab's numbers 0-7
_NUMERIC_WEEKDAYS = re.compile(r"(?P<base>\*|(?P<first>\d+)(?:-(?P<last>\d+))?)(?:/(?P<step>\d+))?")


def crontab_weekdays(field: str) -> str:
    """Crontab's day-of-week field with every number as a day name, which APScheduler reads as crontab does.

    Numbers, names, lists, ranges and steps (`1`, `MON`, `1,3`, `1-5`, `sun-thu`, `fri-sun`, `*/2`, `1-5/2`, `7`)
    become a list of names, read as crontab reads them (Sunday 0 or 7: APScheduler's own ranges start at Monday,
    so it refused `sun-thu`); a bare `*` passes through.
    """
    if field == "*":
        return field
    days: set[int] = set()
    for item in field.split(","):
        m = _NUMERIC_WEEKDAYS.fullmatch(_weekday_numbers(item))
        if m is None:
            raise ValueError(f"day of week {item!r} is not a number 0-7 or a day name (sun-sat), a range or a step")
        step = int(m["step"]) if m["step"] else 1
        if m["base"] == "*":
            first, last = 0, 6
        else:
            first = int(m["first"])
            last = int(m["last"]) if m["last"] else (7 if m["step"] else first)  # `1/2`: from Monday on
        if not (0 <= first <= last <= 7) or step < 1:
            raise ValueError(f"day of week {item!r} must be within 0-7 (0 and 7 = Sunday), low to high, step >= 1")
        days.update(d % 7 for d in range(first, last + 1, step))
    return ",".join(CRONTAB_WEEKDAYS[d] for d in sorted(days))


def _weekday_numbers(item: str) -> str:
    """A day-of-week item with its day names as crontab's numbers (`sun-thu` -> `0-4`); a range ending at Sunday
    ends at 7 (`fri-sun` -> `5-7`). Anything else is left as it is (refused by the caller)."""
    def number(m: re.Match) -> str:
        name = m.group(0).lower()
        if name not in CRONTAB_WEEKDAYS:
            return m.group(0)
        ends_range = m.start() > 0 and item[m.start() - 1] == "-"
        return "7" if name == "sun" and ends_range else str(CRONTAB_WEEKDAYS.index(name))

    return re.sub(r"[A-Za-z]+", number, item)


@dataclass(frozen=True, slots=True)
class ReportJob:
    """Everything a scheduled report run needs, as plain values (they are pickled into the job store)."""

    job_id: str
    db_url: str
    out_dir: str
    period: str = "daily"
    sla_ms: float = DEFAULT_SLA_MS
    history: int = DEFAULT_HISTORY
    daily_tokens: float | None = None
    peak_factor: float = 1.0
    webhook_url: str | None = None
    smtp: bool = False
    delivery_attempts: int = 3
    delivery_backoff_s: float = 2.0
    misfire_grace_s: int = DEFAULT_MISFIRE_GRACE_S
    webhook_env: str | None = None  # the variable holding the webhook URL, read at run time (not stored)
    temperature: float | None = None  # only runs at this temperature / of this kind (None: every run)
    kind: str | None = None
    top_p: float | None = None  # only runs sampled with this top_p / top_k (None: every run; queries.Filters)
    top_k: int | None = None
    max_new_tokens: int | None = None  # only runs capped at this many new tokens (None: every run)
    workload: str | None = None  # only runs of this workload / target model (None: every run)
    target: str | None = None
    # the prices every run's cost and the projection are at (report.Pricing; None, 1: each run's recorded price)
    gpu: str | None = None
    gpus_per_node: int = 1
    node_hourly_usd: float | None = None
    usd_per_kwh: float | None = None
    pue: float | None = None

    def __post_init__(self) -> None:
        if self.period not in SCHEDULED_PERIODS:
            raise ValueError(f"--period for a schedule must be one of {', '.join(SCHEDULED_PERIODS)}, "
                             f"got {self.period!r}")  # fmt: skip
        if not self.job_id or len(self.job_id) > 128:
            raise ValueError(f"--job-id must be 1-128 characters, got {self.job_id!r}")
        if not isinstance(self.misfire_grace_s, int) or not 1 <= self.misfire_grace_s <= MAX_MISFIRE_GRACE_S:
            raise ValueError(f"--misfire-grace-s must be a whole number of seconds from 1 to {MAX_MISFIRE_GRACE_S} "
                             f"(366 days), got {self.misfire_grace_s!r}")

    def runs_of(self, window: Window) -> Window:
        """`window` narrowed to the job's runs (--temperature, --run-kind, --top-p, --top-k, --max-new-tokens,
        --workload, --target)."""
        return replace(window, temperature=self.temperature, kind=self.kind, top_p=self.top_p, top_k=self.top_k,
                       max_new_tokens=self.max_new_tokens, workload=self.workload, target=self.target)  # fmt: skip

    def pricing(self) -> Pricing:
        """The prices the job's reports are at (--gpu, --gpus-per-node, --node-hourly-usd, --usd-per-kwh, --pue)."""
        return Pricing(gpu=self.gpu, gpus_per_node=self.gpus_per_node, node_hourly_usd=self.node_hourly_usd,
                       usd_per_kwh=self.usd_per_kwh, pue=self.pue)

    @property
    def delivering(self) -> bool:
        return bool(self.webhook_url or self.webhook_env or self.smtp)

    def kwargs(self) -> dict:
        return {
            "db_url": self.db_url, "out_dir": self.out_dir, "period": self.period, "job_id": self.job_id,
            "sla_ms": self.sla_ms, "history": self.history, "daily_tokens": self.daily_tokens,
            "peak_factor": self.peak_factor, "webhook_url": self.webhook_url, "smtp": self.smtp,
            "delivery_attempts": self.delivery_attempts, "delivery_backoff_s": self.delivery_backoff_s,
            # only when set: a job stored before --webhook-env existed compares equal and is kept
            **({"webhook_env": self.webhook_env} if self.webhook_env else {}),
            # the same for the runs' filters (--temperature, --run-kind, --top-p, --top-k, --max-new-tokens,
            # --workload, --target)
            **({"temperature": self.temperature} if self.temperature is not None else {}),
            **({"kind": self.kind} if self.kind is not None else {}),
            **({"top_p": self.top_p} if self.top_p is not None else {}),
            **({"top_k": self.top_k} if self.top_k is not None else {}),
            **({"max_new_tokens": self.max_new_tokens} if self.max_new_tokens is not None else {}),
            **({"workload": self.workload} if self.workload is not None else {}),
            **({"target": self.target} if self.target is not None else {}),
            # and for its prices (--gpu, --gpus-per-node, --node-hourly-usd, --usd-per-kwh, --pue): a job stored
            # without them is kept as it is; stored in the job's kwargs, they need no column of their own
            **{k: v for k, v in self.pricing().as_dict().items() if v != PRICING_UNSET[k]},
        }  # fmt: skip


# A job's prices as a job stored without them reads (ReportJob.kwargs leaves these out)
PRICING_UNSET = Pricing().as_dict()


class LockWaitingJobStore(SQLAlchemyJobStore):
    """APScheduler's SQLAlchemy job store whose writes wait while another process holds a SQLite store's write
    lock (telemetry.db.retry_while_locked), then say so (StoreLockedError): the job table's creation, a job added,
    replaced, updated (its next run time, after each run) or removed. Each is one transaction of APScheduler's, so
    a try the lock kept out wrote nothing. They failed on SQLite's first 'database is locked' (after its 5 s busy
    timeout): the scheduler's loop died on a next run time it could not store."""

    def start(self, scheduler, alias):
        BaseJobStore.start(self, scheduler, alias)  # its own start's CREATE, waited for below
        create_jobs_table(self)

    def add_job(self, job):
        write = super().add_job
        retry_while_locked(self.engine, lambda: write(job))

    def update_job(self, job):
        write = super().update_job
        retry_while_locked(self.engine, lambda: write(job))

    def remove_job(self, job_id):
        write = super().remove_job
        retry_while_locked(self.engine, lambda: write(job_id))

    def remove_all_jobs(self):
        retry_while_locked(self.engine, super().remove_all_jobs)


def create_jobs_table(store: SQLAlchemyJobStore) -> None:
    """The job table and its index, where missing, waited for while another process holds the store locked. Each
    is checked for on its own: SQLite commits each CREATE by itself, so a try the lock stopped between the two
    leaves the table without its index, and the next try makes the index."""
    def write() -> None:
        store.jobs_t.create(store.engine, checkfirst=True)
        for index in store.jobs_t.indexes:
            index.create(store.engine, checkfirst=True)

    retry_while_locked(store.engine, write)


class _KeepsRunningWhileLocked:
    """A scheduler whose loop outlives a store kept locked past the wait of its job store's writes: APScheduler
    stores a job's next run time (update_job) after submitting a run, or removes a finished job (remove_job), with
    no try around them, so a StoreLockedError ended the loop (`specfinops scheduler` exited; a background
    scheduler's thread died). Said in one ERROR line instead, and looked at again after jobstore_retry_interval:
    the job table still holds the run time just submitted, so the job is due again; a run of it still going is
    skipped (max_instances), one that ended runs again and finds its period already reported (its claim) or
    reports it now (the lock kept the first one out too), within misfire_grace_time. Everything else that fails
    in the loop ends it as before; a StoreLockedError of the writes made as it starts ends `start` (the command
    says so in one line)."""

    def _process_jobs(self):
        try:
            return super()._process_jobs()
        except StoreLockedError as exc:
            logger.error("scheduler: the job table was not updated: %s; looked at again in %s s", exc,
                         self.jobstore_retry_interval)
            return self.jobstore_retry_interval


class _BlockingScheduler(_KeepsRunningWhileLocked, BlockingScheduler):
    pass


class _BackgroundScheduler(_KeepsRunningWhileLocked, BackgroundScheduler):
    pass


def make_scheduler(engine: Engine, *, blocking: bool = False) -> BaseScheduler:
    """A scheduler whose jobs persist in `engine`'s database; UTC; coalescing, one instance at a time; its loop
    kept going while the store stays locked (_KeepsRunningWhileLocked)."""
    cls = _BlockingScheduler if blocking else _BackgroundScheduler
    return cls(
        jobstores={"default": LockWaitingJobStore(engine=engine, tablename=JOBS_TABLE)},
        executors={"default": ThreadPoolExecutor(max_workers=2)},
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": DEFAULT_MISFIRE_GRACE_S},
        timezone=UTC,
    )


def job_name(job: ReportJob) -> str:
    """The job's name, as APScheduler's log lines show it ("Running job ...")."""
    return f"specfinops {job.period} report {job.job_id}"


def _job_store(engine: Engine) -> SQLAlchemyJobStore:
    store = LockWaitingJobStore(engine=engine, tablename=JOBS_TABLE)
    create_jobs_table(store)
    return store


def _jobs_table_exists(engine: Engine) -> bool:
    from sqlalchemy import inspect

    return inspect(engine).has_table(JOBS_TABLE)


def _persisted(engine: Engine, job_id: str):
    return _job_store(engine).lookup_job(job_id)


def job_in_store(engine: Engine, job_id: str) -> bool:
    """Whether the store's job table holds `job_id` (a running scheduler looks: another started on the store
    without --keep-other-jobs removes it)."""
    return _jobs_table_exists(engine) and SQLAlchemyJobStore(engine=engine, tablename=JOBS_TABLE).lookup_job(
        job_id) is not None


def persisted_jobs(engine: Engine) -> list[Job]:
    """Every job in the store's job table, soonest next run first (paused ones last); none where no scheduler
    made the table yet (a listing writes nothing: a read-only store lists too)."""
    if not _jobs_table_exists(engine):
        return []
    return SQLAlchemyJobStore(engine=engine, tablename=JOBS_TABLE).get_all_jobs()


def remove_other_jobs(engine: Engine, keep_id: str) -> list[Job]:
    """Remove every persisted job but `keep_id` (a scheduler runs every job in its store, not only the one
    on its command line); the jobs removed."""
    store = _job_store(engine)
    removed = [j for j in store.get_all_jobs() if j.id != keep_id]
    for j in removed:
        store.remove_job(j.id)
    return removed


def cron_text(trigger: BaseTrigger) -> str:
    """A trigger of parse_cron as the 5-field crontab expression (weekdays as names), else its own text."""
    if isinstance(trigger, CronTrigger):
        f = {field.name: str(field) for field in trigger.fields}
        if f.get("second") == "0" and f.get("year") == "*" and f.get("week") == "*":
            return " ".join(f[n] for n in ("minute", "hour", "day", "month", "day_of_week"))
    if isinstance(trigger, OrTrigger) and len(trigger.triggers) == 2:  # day of month OR day of week
        texts = [cron_text(t).split() for t in trigger.triggers]
        by_day, by_weekday = texts
        if (all(len(t) == 5 for t in texts) and by_day[:2] == by_weekday[:2] and by_day[3] == by_weekday[3]
                and by_day[4] == "*" and by_weekday[2] == "*"):  # fmt: skip
            return " ".join([*by_day[:4], by_weekday[4]])
    return str(trigger)


def job_runs_text(kwargs: dict) -> str:
    """Which runs a job's reports cover, in words, from its stored arguments (ReportJob.kwargs()); "" for every
    run."""
    return runs_covered_text(kwargs.get("temperature"), kwargs.get("kind"), kwargs.get("top_p"), kwargs.get("top_k"),
                             kwargs.get("max_new_tokens"), kwargs.get("workload"), kwargs.get("target"))


def job_pricing(kwargs: dict) -> Pricing:
    """The prices of a job's reports, from its stored arguments (ReportJob.kwargs())."""
    return Pricing(**{k: kwargs.get(k, unset) for k, unset in PRICING_UNSET.items()})


def describe_job(job: Job) -> str:
    """One line: id, cron, period, output folder, delivery targets (webhook URL masked), next run."""
    from telemetry.delivery import mask_url

    when = job.next_run_time
    next_run = "paused" if when is None else f"next run {when.astimezone(UTC):%a %Y-%m-%d %H:%M} UTC"
    if job.func_ref != JOB_FUNC:
        return f"{job.id}: {job.func_ref} on {job.trigger}, {next_run}"
    kw = job.kwargs
    targets = []
    if kw.get("webhook_url"):
        targets.append(f"webhook {mask_url(kw['webhook_url'])}")
    if kw.get("webhook_env"):
        targets.append(f"webhook from ${kw['webhook_env']}")
    if kw.get("smtp"):
        targets.append("smtp")
    delivery = " + ".join(targets) or "none"
    runs = job_runs_text(kw)
    priced = job_pricing(kw).text()
    return (f"{job.id}: cron {cron_text(job.trigger)!r} (UTC), {kw.get('period')} reports"
            f"{f' of {runs} only' if runs else ''}{f' priced at {priced}' if priced else ''} into "
            f"{kw.get('out_dir')}, delivery {delivery}, {next_run}")  # fmt: skip


def _same(stored, job: ReportJob, trigger: BaseTrigger) -> bool:
    return (
        stored.func_ref == JOB_FUNC
        and repr(stored.trigger) == repr(trigger)
        and stored.kwargs == job.kwargs()
        and stored.misfire_grace_time == job.misfire_grace_s
        and stored.coalesce is True
        and stored.max_instances == 1
    )


def schedule_report_job(scheduler: BaseScheduler, engine: Engine, job: ReportJob, trigger: BaseTrigger, *,
                        now: datetime | None = None) -> str:
    """Before `scheduler.start()`: keep the persisted job when its configuration is unchanged ("kept"), else
    add or replace it under the same id ("added" | "replaced"), written to the store now (`_store_pending_jobs`):
    a store that refuses it fails here, not at the start, after the caller said the job was scheduled.

    A replaced job whose stored next run time is past (runs missed while the scheduler was stopped) keeps that
    time, as a kept job does: its missed runs follow the misfire policy (with the new options: coalesced into one
    run at start within --misfire-grace-s, else skipped, and said either way). Replaced from now on, the missed
    period was never reported and nothing said so. With another --cron, the missed runs are the new schedule's
    from that time on (`_catch_up`), never the old schedule's."""
    stored = _persisted(engine, job.job_id)
    if stored is not None and _same(stored, job, trigger):
        if stored.name != job_name(job):  # stored by an earlier version: renamed, its next run time kept
            stored._modify(name=job_name(job))
            _job_store(engine).update_job(stored)
        return "kept"
    catch_up = _catch_up(stored, trigger, now or datetime.now(UTC))
    scheduler.add_job(
        JOB_FUNC,
        trigger,
        id=job.job_id,
        name=job_name(job),
        kwargs=job.kwargs(),
        replace_existing=True,
        coalesce=True,
        max_instances=1,
        misfire_grace_time=job.misfire_grace_s,
        **catch_up,
    )
    wrote = _store_pending_jobs(scheduler, what=f"the job {job.job_id}")
    if scheduler.state == STATE_STOPPED:
        if job.job_id not in wrote:
            # APScheduler's private steps (_store_pending_jobs) did not write it: it would be written (or refused)
            # only at the start, after the caller said it was scheduled
            raise RuntimeError(f"the job {job.job_id} was not written to the store when scheduled: "
                               f"{_apscheduler_changed()}")
        written = _persisted(engine, job.job_id)
        if written is None or not _same(written, job, trigger):
            # written, then gone or other than this one's by the time it was read back: another process's doing
            # (another `specfinops scheduler` on this store, scheduling the same id or removing the jobs not its own)
            verb = "removed" if written is None else "changed"
            raise RuntimeError(f"the job {job.job_id} was {verb} by another process while this one scheduled it "
                               "(another `specfinops scheduler` on this store?): a store's scheduler runs every job "
                               "in it, so run one scheduler per store, then schedule this job again")
    return "added" if stored is None else "replaced"


def _catch_up(stored, trigger: BaseTrigger, now: datetime) -> dict:
    """add_job's next_run_time for a job replacing `stored`: {} (from now, by `trigger`) unless `stored` missed
    runs while the scheduler was stopped (its next run time past). Those are caught up by the schedule the job
    has now: with the trigger unchanged, from the stored time. With another --cron, by the new schedule's times
    alone (a daily job made weekly caught up the day's run, at the old hour): its first time nearer the missed
    run than the last real one (the old schedule's time before it, `_previous_fire`: from halfway between them
    on), where that is past. So a cron moved earlier catches up the time it moved to (weekly `0 6 * * 1` made
    `0 5 * * 1`, stopped over Monday 05:00 to 07:00: Monday 05:00, which a search from the missed time on
    passed over: that week went unreported, and nothing said so), one moved later its own time once past, and
    not the moved time of the last real run (a later hour the week before: that run was made). Where that time
    is still to come: from now. A last run not found (none within PREVIOUS_FIRE_LOOKBACK): from the missed time."""
    missed = stored.next_run_time if stored is not None else None
    if missed is None or missed > now:
        return {}
    if repr(stored.trigger) != repr(trigger):
        last_run = _previous_fire(stored.trigger, missed)
        since = missed if last_run is None else last_run + (missed - last_run) / 2
        missed = trigger.get_next_fire_time(None, since)
        if missed is None or missed > now:
            return {}
    return {"next_run_time": missed}


# How far back _previous_fire looks for a trigger's time before another (a yearly cron's is a year back)
PREVIOUS_FIRE_LOOKBACK = timedelta(days=800)


def _previous_fire(trigger: BaseTrigger, before: datetime) -> datetime | None:
    """`trigger`'s last fire time before `before` (APScheduler's triggers tell only the next one): looked for in
    windows doubling back from `before` (a minute, two, ...) up to PREVIOUS_FIRE_LOOKBACK, then walked forward
    in the first window holding one; None where it has none there (or the trigger cannot say)."""
    back = timedelta(minutes=1)
    while True:
        try:
            fire = trigger.get_next_fire_time(None, before - back)
        except (TypeError, ValueError, AttributeError):  # a trigger that cannot be asked so: no time known
            return None
        if fire is not None and fire < before:
            for _ in range(10_000):  # the window is at most twice the gap to `before`: a few fires in it
                following = trigger.get_next_fire_time(fire, fire + timedelta(seconds=1))
                if following is None or following >= before or following <= fire:
                    return fire
                fire = following
            return fire
        if back >= PREVIOUS_FIRE_LOOKBACK:
            return None
        back = min(2 * back, PREVIOUS_FIRE_LOOKBACK)


def _apscheduler_changed() -> str:
    import apscheduler

    version = getattr(apscheduler, "__version__", "(version unknown)")
    written_for = version.startswith(("3.10.", "3.11."))
    return (f"APScheduler {version}'s private job-store steps, which telemetry.scheduler._store_pending_jobs uses, "
            + ("did not write it: report it" if written_for else
               "are not those of the 3.10-3.11 it was written for: install one of those "
               "(pip install 'apscheduler>=3.10,<3.12') or report it"))


def _store_pending_jobs(scheduler: BaseScheduler, what: str = "the scheduled jobs") -> set[str]:
    """Write the jobs `add_job` queued on a scheduler not started yet into its job stores now, as its start would
    (APScheduler's own steps: each store started, each queued job added, or replaced where its id is stored; the
    start then finds none queued, and starting a store again is harmless). APScheduler writes them only at the
    start: a store that refused the write (read-only, a role without the right) failed there, after `specfinops
    scheduler` had said "job J1 replaced" and outside the block that removes the --out folder it made.

    Returns the ids of the jobs a store's add_job or update_job was called with and returned from, seen in this
    process: what APScheduler's steps did write, whatever another process did to the table since."""
    if scheduler.state != STATE_STOPPED:  # a started scheduler's add_job wrote it already
        return set()
    try:
        lock, stores, pending, real_add_job = (scheduler._jobstores_lock, scheduler._jobstores,
                                               scheduler._pending_jobs, scheduler._real_add_job)
    except AttributeError as exc:  # APScheduler's private names changed: say so, not a traceback
        raise RuntimeError(f"cannot write {what} to the store ({exc}): {_apscheduler_changed()}") \
            from None
    wrote: set[str] = set()

    def seen(write):
        def call(job):
            write(job)
            wrote.add(job.id)
        return call

    with lock:
        for alias, store in stores.items():
            store.start(scheduler, alias)
        watched = [(store, name, vars(store).get(name)) for store in stores.values()
                   for name in ("add_job", "update_job")]
        for store, name, _ in watched:  # on the instance, for this call only
            setattr(store, name, seen(getattr(store, name)))
        try:
            while pending:
                job, alias, replace_existing = pending[0]
                real_add_job(job, alias, replace_existing)
                del pending[0]
        finally:
            for store, name, own in watched:
                if own is None:
                    delattr(store, name)
                else:
                    setattr(store, name, own)
    return wrote


def recover_reports(engine: Engine, job: ReportJob, *, stale_after_s: float | None = None,
                    now: datetime | None = None) -> list[str]:
    """Finish what a killed run of `job` left behind (SIGKILL, a crash, an old version without SIGTERM
    handling); one line per record recovered.

    - "generating": the process died while writing. The claim (and any half-written folder) is released and
      the period is written again (and delivered, when delivery is configured).
    - "pending": the report was written but its delivery never recorded. It is delivered again when delivery
      is configured now; otherwise left pending (and named in the log).

    Stale means: created more than `stale_after_s` (STALE_AFTER_S, 15 minutes) ago. A claim records no owner,
    so age is the test: a live run writes its report in seconds and delivers it within attempts x 10 s timeouts
    plus the backoff, far below that, so a record this old is not in anyone's hands (another scheduler's
    included). Called when the scheduler starts and before each run, so a record too young at start is
    recovered by the next run.
    """
    from telemetry.db import Report
    from telemetry.report_writer import GENERATING, PENDING, release_claim, stale_reports

    job_id = job.job_id
    done: list[str] = []
    for stale in stale_reports(engine, Report.job_id == job_id, (GENERATING, PENDING), stale_after_s=stale_after_s,
                               now=now):
        report_id, window, status, summary = stale.report_id, stale.window, stale.status, stale.summary
        if status == GENERATING:
            if not release_claim(engine, report_id, window, job.out_dir):
                continue
            result = _write(engine, job, window)
            if result is None:
                continue
            report_id, summary = result.report_id, result.summary
            line = f"report job {job_id}: {window.label()}: an interrupted run's claim released, rewritten as #{report_id}"
        elif job.delivering:
            if not take_delivery(engine, report_id, now=now):  # another scheduler is delivering it
                logger.info("report job %s: report #%d (%s) is being delivered by another process; left to it",
                            job_id, report_id, window.label())  # fmt: skip
                continue
            line = f"report job {job_id}: {window.label()}: report #{report_id} left undelivered, delivering it now"
        else:
            logger.warning("report job %s: report #%d (%s) was never delivered and no delivery is configured now",
                           job_id, report_id, window.label())  # fmt: skip
            continue
        if job.delivering:
            line += f" ({_deliver(engine, job, report_id, summary)})"
        logger.info("%s", line)
        done.append(line)
    return done


def unfinished_reports(engine: Engine, job_id: str | None = None, *, now: datetime | None = None) -> list[tuple]:
    """Scheduled reports (of `job_id`, else of every job) left "generating" or "pending", oldest first, each with
    the time from which recover_reports takes it: STALE_AFTER_S after its claim, or after its delivery lease where
    that is later (till then it may be another scheduler's, at work). A list of (Report, datetime)."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from telemetry.db import Report
    from telemetry.report_writer import GENERATING, PENDING

    owner = Report.job_id.is_not(None) if job_id is None else Report.job_id == job_id
    with Session(engine) as s:
        rows = list(s.scalars(select(Report).where(owner, Report.delivery_status.in_((GENERATING, PENDING)))
                              .order_by(Report.id)))  # fmt: skip
        s.expunge_all()
    out = []
    for r in rows:
        began = r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=UTC)
        held = r.delivery_error or ""
        if r.delivery_status == PENDING and held.startswith(DELIVERY_LEASE):
            with contextlib.suppress(ValueError):
                lease = datetime.fromisoformat(held.removeprefix(DELIVERY_LEASE))
                began = max(began, lease if lease.tzinfo else lease.replace(tzinfo=UTC))
        out.append((r, began + timedelta(seconds=STALE_AFTER_S)))
    return out


def _unfinished_what(status: str) -> str:
    from telemetry.report_writer import GENERATING

    return "being written (its claim)" if status == GENERATING else "written, its delivery not made"


def left_alone(engine: Engine, job: ReportJob, *, now: datetime | None = None) -> list[str]:
    """At start, after recover_reports: one line per report of `job` left "generating" or "pending" that is too
    young to recover yet (another scheduler may be at it), saying when the job finishes it, or that it stays
    pending (a "pending" one of a job with no delivery configured: recover_reports never finishes it). A second
    Ctrl-C leaves such a record; the start right after it did nothing and said nothing."""
    now = now or datetime.now(UTC)
    lines = []
    for r, ready in unfinished_reports(engine, job.job_id, now=now):
        if ready <= now:  # recover_reports left it for another reason (and said so), or another process took it
            continue
        said = f"report job {job.job_id}: report #{r.id} ({_label(r)}) is {_unfinished_what(r.delivery_status)}"
        if _stays_pending(r, job.delivering):
            lines.append(f"{said}: {NO_DELIVERY}")
            continue
        lines.append(f"{said}, begun under {STALE_AFTER_S // 60} minutes ago: left alone (another scheduler may be "
                     f"at it); this job's first run, or scheduler start, from {ready:%Y-%m-%d %H:%M} UTC finishes "
                     "it")  # fmt: skip
    return lines


# What a "pending" report of a job that delivers nothing stays (recover_reports delivers only with a delivery)
NO_DELIVERY = "left pending: no delivery configured (the job has no --webhook, --webhook-env or --smtp)"


def _stays_pending(r, delivering: bool) -> bool:
    from telemetry.report_writer import PENDING

    return r.delivery_status == PENDING and not delivering


def _delivers(job: Job) -> bool:
    """Whether a persisted report job delivers its reports (ReportJob.delivering, from its stored arguments)."""
    kw = job.kwargs
    return bool(kw.get("webhook_url") or kw.get("webhook_env") or kw.get("smtp"))


def _write_again(engine: Engine, r) -> str:
    """write_again_command for a report record."""
    return write_again_command(engine, r.period, r.since, r.csv_dir)


def write_again_command(engine: Engine, period: str, since: datetime, csv_dir: str | None) -> str:
    """The `specfinops report` command that writes a scheduled report's period again, by hand (its job is gone:
    nothing else finishes it), with the store's password masked; the job's run filters and prices went with it."""
    import shlex

    from telemetry.db import masked_password_note, shown_db_url

    out = str(Path(csv_dir).parent) if csv_dir else "DIR"
    argv = ["specfinops", "report", "--db", shown_db_url(engine.url), "--period", period, "--since",
            f"{since:%Y-%m-%dT%H:%M}", "--out", out]  # fmt: skip
    return f"`{shlex.join(argv)}`{masked_password_note(engine.url)}"


def unfinished_deliveries(engine: Engine, *, now: datetime | None = None, jobs: list[Job] | None = None) -> list[str]:
    """`scheduler --list`: one line per scheduled report left "generating" or "pending" (a run in progress, or
    one a stop or a kill left), with when its job finishes it; or that nothing does: a "pending" one of a job that
    delivers nothing stays so, and one whose job is gone from the job table (`jobs`: persisted_jobs) is finished
    by nobody (the command that writes it again is said; a claim left "generating" is released, and said so)."""
    now = now or datetime.now(UTC)
    by_id = {j.id: j for j in (persisted_jobs(engine) if jobs is None else jobs) if j.func_ref == JOB_FUNC}
    lines = []
    for r, ready in unfinished_reports(engine, now=now):
        job = by_id.get(r.job_id)
        if job is None:
            when = f"its job is gone ({_write_again(engine, r)} to write it again)" + (
                f"; till {ready:%Y-%m-%d %H:%M} UTC it may be a run at work" if ready > now else "")
            if r.delivery_status == GENERATING:  # release_stale_claims: any report written, or a scheduler's start
                when += ("; its claim is released by the next report written to this store or scheduler started on "
                         "it" + (f" from {ready:%Y-%m-%d %H:%M} UTC" if ready > now else ""))
        elif _stays_pending(r, _delivers(job)):
            when = NO_DELIVERY
        elif ready > now:
            when = (f"finished by the job's first run, or scheduler start, from {ready:%Y-%m-%d %H:%M} UTC (till "
                    "then it may be a run at work)")
        else:
            when = "finished by the job's next run or scheduler start"
        lines.append(f"report #{r.id} ({_label(r)}), job {r.job_id}: {r.delivery_status}, "
                     f"{_unfinished_what(r.delivery_status)}; {when}")  # fmt: skip
    return lines


def take_delivery(engine: Engine, report_id: int, *, now: datetime | None = None) -> bool:
    """Take a "pending" report's delivery for this process: its delivery_error becomes a DELIVERY_LEASE in one
    UPDATE that expects the value read, so of two schedulers recovering it only one gets True. A lease younger
    than STALE_AFTER_S is another process's delivery under way; an older one, a killed process's, is taken over.
    `record_delivery` replaces the lease with the outcome."""
    from sqlalchemy import select, update

    from telemetry.db import Report
    from telemetry.report_writer import PENDING, STALE_AFTER_S, age_s

    def take() -> bool:  # one transaction, read again on each try: waited for while another process holds the lock
        at = now or datetime.now(UTC)  # each try's own time: a lease taken after a wait for the lock is that young
        with engine.begin() as c:
            row = c.execute(select(Report.delivery_error).where(Report.id == report_id,
                                                                Report.delivery_status == PENDING)).first()
            if row is None:
                return False
            held = row[0]
            if held and held.startswith(DELIVERY_LEASE):
                try:
                    since = datetime.fromisoformat(held.removeprefix(DELIVERY_LEASE))
                except ValueError:
                    since = None
                if since is not None and age_s(since, at) < STALE_AFTER_S:
                    return False
            same = Report.delivery_error.is_(None) if held is None else Report.delivery_error == held
            taken = c.execute(update(Report).where(Report.id == report_id, Report.delivery_status == PENDING, same)
                              .values(delivery_error=f"{DELIVERY_LEASE}{at.isoformat()}"))  # fmt: skip
            return taken.rowcount == 1

    return retry_while_locked(engine, take)


def redeliver_failed(engine: Engine, job: ReportJob, *, now: datetime | None = None) -> list[str]:
    """Deliver again the summaries of `job`'s reports whose delivery failed, younger than REDELIVER_FAILED_FOR_S,
    oldest first; one line per report. Nothing is written again. Each is taken by turning "failed" into
    "pending" with a DELIVERY_LEASE in one UPDATE, so of two schedulers on one store only one re-sends it, and
    another's recover_reports leaves it to this one; a run killed meanwhile leaves it "pending", which
    recover_reports delivers once the lease is older than STALE_AFTER_S."""
    from sqlalchemy import select, update
    from sqlalchemy.orm import Session

    from telemetry.db import Report
    from telemetry.delivery import FAILED
    from telemetry.report_writer import PENDING, age_s

    if not job.delivering:
        return []
    now = now or datetime.now(UTC)
    with Session(engine) as s:
        rows = list(s.scalars(select(Report).where(Report.job_id == job.job_id,
                                                   Report.delivery_status == FAILED).order_by(Report.id)))
        s.expunge_all()

    def take(report_id: int) -> bool:  # one UPDATE, waited for while another process holds the store locked
        with engine.begin() as c:
            taken = c.execute(update(Report).where(Report.id == report_id, Report.delivery_status == FAILED)
                              .values(delivery_status=PENDING,  # the lease from now: deliveries before took time
                                      delivery_error=f"{DELIVERY_LEASE}{datetime.now(UTC).isoformat()}"))  # fmt: skip
            return taken.rowcount == 1

    done: list[str] = []
    for r in rows:
        if r.summary is None or age_s(r.created_at, now) >= redeliver_failed_for_s(r.period):
            continue
        if not retry_while_locked(engine, lambda rid=r.id: take(rid)):  # another scheduler took it
            continue
        status = _deliver(engine, job, r.id, r.summary)
        line = (f"report job {job.job_id}: report #{r.id} ({_label(r)}): its failed delivery made again "
                f"({status})")  # fmt: skip
        logger.info("%s", line)
        done.append(line)
    return done


def _failed_before(engine: Engine, job: ReportJob, report_id: int, *, now: datetime | None = None) -> int:
    """How many of the job's reports before `report_id` have a failed delivery its next runs retry (younger than
    redeliver_failed_for_s)."""
    from sqlalchemy import select

    from telemetry.db import Report
    from telemetry.delivery import FAILED
    from telemetry.report_writer import age_s

    now = now or datetime.now(UTC)
    with engine.connect() as c:
        rows = c.execute(select(Report.created_at, Report.period).where(
            Report.job_id == job.job_id, Report.id < report_id, Report.delivery_status == FAILED)).all()
    return sum(age_s(created, now) < redeliver_failed_for_s(period) for created, period in rows)


def _label(r) -> str:
    return Window(r.period, r.since, r.until).label()  # naive (SQLite's) times are UTC to Window


def resend_text(job_id: str, period: str, until: datetime) -> str:
    """How a failed delivery whose job no longer retries it is sent again: a scheduler started with its job id and
    a delivery re-sends it at its start (redeliver_failed), till `until`."""
    return (f"to re-send it, start `specfinops scheduler --job-id {job_id} --period {period}` with --webhook, "
            f"--webhook-env or --smtp (and its --cron and --out; --keep-other-jobs keeps the store's other jobs) "
            f"before {until:%Y-%m-%d %H:%M} UTC: its start sends it")


def failed_deliveries(engine: Engine, *, now: datetime | None = None, limit: int = 50,
                      jobs: list[Job] | None = None) -> list[str]:
    """One line per scheduled report whose delivery failed (or partly failed), newest first: whether a later
    run of its job retries it, and the recorded error's first line. Retried only where its job (`jobs`:
    persisted_jobs) is still in the job table and delivers; else why not, and how to send it again."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from telemetry.db import Report
    from telemetry.delivery import FAILED, PARTIAL
    from telemetry.report_writer import age_s

    now = now or datetime.now(UTC)
    by_id = {j.id: j for j in (persisted_jobs(engine) if jobs is None else jobs) if j.func_ref == JOB_FUNC}
    with Session(engine) as s:
        rows = list(s.scalars(select(Report).where(Report.job_id.is_not(None),
                                                   Report.delivery_status.in_((FAILED, PARTIAL)))
                              .order_by(Report.created_at.desc(), Report.id.desc()).limit(limit)))  # fmt: skip
    lines = []
    for r in rows:
        error = (r.delivery_error or "").splitlines()[0] if r.delivery_error else "no error recorded"
        if r.delivery_status == PARTIAL:
            retry = "not retried (a channel that succeeded would get it twice)"
        elif age_s(r.created_at, now) < (retried_s := redeliver_failed_for_s(r.period)):
            created = r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=UTC)
            until = created + timedelta(seconds=retried_s)
            job = by_id.get(r.job_id)
            if job is None:
                retry = f"not retried: its job is gone from the job table; {resend_text(r.job_id, r.period, until)}"
            elif not _delivers(job):
                retry = (f"not retried: its job delivers nothing now (no --webhook, --webhook-env or --smtp); "
                         f"{resend_text(r.job_id, r.period, until)}")
            else:
                retry = f"retried by the job's next run (until {until:%Y-%m-%d %H:%M} UTC)"
        else:
            retry = f"no longer retried (older than {redeliver_failed_for_s(r.period) // 86400} days)"
        lines.append(f"report #{r.id} ({_label(r)}), job {r.job_id}: delivery {r.delivery_status}, {retry}: "
                     f"{error}; report: {r.html_path}")  # fmt: skip
    return lines


def run_report_job(
    *,
    db_url: str,
    out_dir: str,
    period: str,
    job_id: str,
    sla_ms: float = DEFAULT_SLA_MS,
    history: int = DEFAULT_HISTORY,
    daily_tokens: float | None = None,
    peak_factor: float = 1.0,
    webhook_url: str | None = None,
    smtp: bool = False,
    delivery_attempts: int = 3,
    delivery_backoff_s: float = 2.0,
    webhook_env: str | None = None,
    temperature: float | None = None,
    kind: str | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    max_new_tokens: int | None = None,
    workload: str | None = None,
    target: str | None = None,
    gpu: str | None = None,
    gpus_per_node: int = 1,
    node_hourly_usd: float | None = None,
    usd_per_kwh: float | None = None,
    pue: float | None = None,
) -> int | None:
    """One scheduled run: report the last full period (empty periods too), then deliver the summary. The
    keywords are ReportJob.kwargs(), as the job store holds them.

    A run that fails on its input or its environment (the output folder replaced by a file, the database gone,
    a disk full: ValueError, OSError, SQLAlchemy and store errors) logs one ERROR line naming the job and the
    problem, leaves nothing half-written (write_report's cleanup) and returns None: APScheduler prints no
    traceback and the next run tries again. Any other exception is a bug and goes to APScheduler, which logs it
    with its traceback."""
    from telemetry.delivery import FAILED
    from telemetry.store import open_store

    with _counted_run():  # counted: a stopping scheduler waits for it
        expected = _run_errors()
        try:
            job = ReportJob(job_id=job_id, db_url=db_url, out_dir=out_dir, period=period, sla_ms=sla_ms,
                            history=history, daily_tokens=daily_tokens, peak_factor=peak_factor,
                            webhook_url=webhook_url, smtp=smtp, delivery_attempts=delivery_attempts,
                            delivery_backoff_s=delivery_backoff_s, webhook_env=webhook_env, temperature=temperature,
                            kind=kind, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens, workload=workload,
                            target=target, gpu=gpu, gpus_per_node=gpus_per_node, node_hourly_usd=node_hourly_usd,
                            usd_per_kwh=usd_per_kwh, pue=pue)  # fmt: skip
            # an existing store only: a store gone (or a relative path stored by an earlier version, resolved
            # from another folder) is one ERROR line, never a new, empty store reported on every period
            engine = open_store(db_url, must_exist=True)
            try:
                recover_reports(engine, job)
                window = job.runs_of(period_window(period, now=_clock()))
                result = _write(engine, job, window)
                status = None
                if result is not None:
                    logger.info("report job %s: wrote report #%d (%s)", job_id, result.report_id, window.label())
                    if job.delivering:
                        status = _deliver(engine, job, result.report_id, result.summary)
                if status == FAILED:  # the receiver is still down: the earlier ones wait for the next run
                    # "failed again" only where earlier deliveries failed too: a first failure said so read as a retry
                    earlier = _failed_before(engine, job, result.report_id)
                    logger.info("report job %s: delivery of report #%d failed%s; the job's next run delivers %s again",
                                job_id, result.report_id, f", as {earlier} earlier one{'s' if earlier > 1 else ''} did"
                                if earlier else "", "them" if earlier else "it")  # fmt: skip
                else:
                    redeliver_failed(engine, job)
                return None if result is None else result.report_id
            finally:
                engine.dispose()
        except expected as exc:
            logger.error("report job %s: run failed: %s", job_id, run_problem(exc))
            return None


# Report runs in progress in this process (the executor's threads): a scheduler stopped by Ctrl-C or SIGTERM
# waits for them to finish (report written, delivery made and recorded) before it exits
_runs_lock = threading.Lock()
_runs_in_progress = 0


@contextlib.contextmanager
def _counted_run():
    global _runs_in_progress
    with _runs_lock:
        _runs_in_progress += 1
    try:
        yield
    finally:
        with _runs_lock:
            _runs_in_progress -= 1


def runs_in_progress() -> int:
    """How many report runs this process is running now."""
    with _runs_lock:
        return _runs_in_progress


def wait_for_runs(poll_s: float = 0.1) -> None:
    """Return once no report run is in progress in this process. In the main thread, so Ctrl-C reaches the
    caller (KeyboardInterrupt) while it waits."""
    while runs_in_progress():
        time.sleep(poll_s)


def _run_errors() -> tuple[type[BaseException], ...]:
    """What a run's input or environment raises; anything else is a bug."""
    from sqlalchemy.exc import SQLAlchemyError

    from telemetry.db import StoreLockedError
    from telemetry.store import StoreError

    return (ValueError, OSError, OverflowError, SQLAlchemyError, StoreError, StoreLockedError)


def run_problem(exc: BaseException) -> str:
    """A failed run's problem on one line: a database error's own first line (not the SQL), a file error with
    its file, else the exception's message (our own name the option and the value)."""
    from sqlalchemy.exc import DBAPIError

    if isinstance(exc, DBAPIError) and exc.orig is not None:
        text = f"database error: {exc.orig}"
    elif isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.strerror or exc}: {exc.filename}"
    else:
        text = str(exc)
    lines = text.strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _write(engine: Engine, job: ReportJob, window):
    """The job's report of `window` (write_report's result; None when the period is already claimed)."""
    from telemetry.report_writer import write_report

    return write_report(engine, job.runs_of(window), job.out_dir, sla_ms=job.sla_ms, history=job.history,
                        daily_tokens=job.daily_tokens, peak_factor=job.peak_factor, pricing=job.pricing(),
                        job_id=job.job_id, delivery_requested=job.delivering)  # fmt: skip


def _deliver(engine: Engine, job: ReportJob, report_id: int, summary: dict) -> str:
    """Deliver a report's summary as the job says and record the outcome; its status."""
    from telemetry.delivery import deliver, record_delivery

    outcome = deliver(summary, webhook_url=job.webhook_url, smtp=job.smtp, attempts=job.delivery_attempts,
                      backoff_s=job.delivery_backoff_s, webhook_env=job.webhook_env)  # fmt: skip
    record_delivery(engine, report_id, outcome)
    return outcome.status

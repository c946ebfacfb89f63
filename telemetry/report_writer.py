"""Writing a report: claim its record, write the HTML page and the CSV files, fill the record in.

The record is inserted first (delivery_status "generating") and committed. Scheduled reports carry their job
id, and (job_id, since) is unique in the `reports` table (migration 0002): when two schedulers fire the same
job for the same period, the second INSERT fails and that scheduler skips the run. Reports made by hand have
job_id NULL and are never refused. Files go into a hidden temporary folder that is renamed into place at the
end; on any failure that folder and the claimed record are removed: nothing half-written is left behind.
A process killed outright (SIGKILL, a crash) runs no cleanup: its claim stays "generating" (`specfinops report`
turns SIGTERM into Ctrl-C, so only those). `release_claim` removes such a claim and its folders once it is older
than any report takes to write (STALE_AFTER_S): the scheduler for its job's claims, writing that period again
(telemetry/scheduler.py); every write_report (and a scheduler's start) for the claims of reports made by hand
and of jobs gone from the job table (`release_stale_claims`), which are not written again (the person who ran
the command saw it killed; a job gone has no run to write it: the line says the command that does). A claim records its folder in
`csv_dir` from the start, so its temporary folder is found wherever it was written.

Layout: OUT/report-<id>-<period>-<since>/report.html plus one CSV per table (formula-safe, telemetry.export);
a calendar month's <since> is its month (report-9-monthly-2026-10).
Report ids are numbered per store, so two stores writing into one folder (staging and prod, a store rebuilt
after a reset) reach the same name: a name already taken in OUT (its folder, or its temporary folder) gets a
short random suffix (report-<id>-<period>-<since>-<6 hex>), chosen when the claim is made and recorded in it;
the other folder is left as it is. Cleanup only ever removes folders the claim created: its temporary folder,
and a final folder only while it still carries the claim's marker file (CLAIM_MARKER, naming the claim's store,
id and folder), written into the temporary folder and removed once the record points at the finished folder.
The marker names the store by its URL with no password in it (user info or query string); a marker an earlier
version wrote (its `?password=` left in) is still read as its claim's.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import delete, func, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from telemetry.db import PG_INSUFFICIENT_PRIVILEGE, DeviceFullError, Report, Run, retry_while_locked
from telemetry.delivery import new_idempotency_key
from telemetry.export import write_csv
from telemetry.report import (
    DEFAULT_HISTORY,
    DEFAULT_SLA_MS,
    Pricing,
    Window,
    build_report,
    report_tables,
    summary_dict,
    time_text,
)
from telemetry.report_html import incomplete_period_text, period_complete, render_html

logger = logging.getLogger(__name__)

GENERATING = "generating"
NOT_REQUESTED = "not requested"
PENDING = "pending"
HTML_NAME = "report.html"
# In a folder being written: which claim made it (store, report id, folder); a folder without it (or with
# another claim's) is never removed by cleanup. Removed once the record points at the finished folder.
CLAIM_MARKER = ".specfinops-claim"
# A claim older than this has no live process behind it: claims record no owner, but a live run writes its
# report in seconds (and a scheduled one delivers it within attempts x 10 s timeouts plus the backoff).
STALE_AFTER_S = 900


@dataclass(frozen=True, slots=True)
class ReportResult:
    report_id: int
    html_path: Path
    csv_dir: Path
    csv_files: tuple[Path, ...]
    summary: dict
    incomplete_period: str | None = None  # why the figures are partial: the period had not ended (None: it had)
    name_taken: str | None = None  # the usual folder name, already taken in --out (written under csv_dir instead)
    synthetic: str | None = None  # some runs are the synthetic data generator's: not measurements (None: none is)


def check_out_dir(out_dir: str | os.PathLike) -> Path:
    """Create `out_dir` if needed and prove a file can be written there; ValueError naming it otherwise."""
    if not str(out_dir).strip():  # Path('') is '.': a job would write into whatever folder it was started from
        raise ValueError(f"--out must name a folder, got {str(out_dir)!r}")
    path = Path(out_dir).expanduser()
    if path.exists() and not path.is_dir():  # mkdir said only 'File exists'
        raise ValueError(f"--out {out_dir} is a file, not a directory: give a folder, made if missing (a file is "
                         "not a writable directory)")
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:  # mkdir said only 'Not a directory'
        raise ValueError(f"--out {out_dir} is not a writable directory: {blocker} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".specfinops-write-test-"):
            pass
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise DeviceFullError("the --out folder", path) from None
        raise ValueError(f"--out {str(out_dir)!r} is not a writable directory: {exc.strerror or exc}") from None
    return path.resolve()


def count_runs(engine: Engine) -> int:
    with engine.connect() as c:
        return int(c.execute(select(func.count(Run.id))).scalar() or 0)


def _claim_token(engine: Engine, report_id: int, folder: Path) -> str:
    """What CLAIM_MARKER holds for one claim: its store (no password: `_store_text`), its id and its folder. The
    marker is removed once the record points at the folder, so a marked folder is always an unrecorded one."""
    return f"{_store_text(engine.url)} report {report_id} {folder}"


def _store_text(url) -> str:
    """A store's URL as a claim's marker names it: every password masked, the user info's and each query
    parameter naming one (telemetry.db.masked_url_text, as commands show a store): a file never holds one."""
    from telemetry.db import masked_url_text

    return masked_url_text(url)


def _name_taken(out: Path, name: str) -> bool:
    return os.path.lexists(out / name) or os.path.lexists(out / f".{name}.tmp")


def free_dir_name(out: Path, report_id: int, window: Window) -> str:
    """report_dir_name, or that name with a short random suffix when `out` already holds a folder (or a
    temporary folder) of that name: another store's report (ids are per store) or one from before a reset."""
    name = report_dir_name(report_id, window)
    candidate = name
    while _name_taken(out, candidate):
        candidate = f"{name}-{secrets.token_hex(3)}"
    return candidate


def _claim(engine: Engine, window: Window, job_id: str | None, out: Path) -> int | None:
    """Insert the report's record ("generating"), its folder (a free name in `out`) recorded from the start;
    its id, None when the job already has a report of this period. One transaction, waited for while another
    process holds the store locked: a try the lock kept out inserted nothing."""
    def write() -> int | None:
        with Session(engine) as s:
            row = Report(period=window.period, since=window.since, until=window.until, html_path="", csv_dir="",
                         delivery_status=GENERATING, job_id=job_id)  # fmt: skip
            s.add(row)
            try:
                s.flush()  # the id names the folder, recorded with the claim: a killed run's leftovers can be found
                row.csv_dir = str(out / free_dir_name(out, row.id, window))
                s.commit()
            except IntegrityError:
                s.rollback()
                return None
            return row.id

    return retry_while_locked(engine, write)


def _drop_claim(engine: Engine, report_id: int) -> None:
    """Delete the claim of a report that failed or was stopped: one try (SQLite's busy timeout), not waited for
    while another process holds the store locked, its error left unsaid. The report's own error (or Ctrl-C) is
    the one to say, at once; a claim left "generating" is released later (release_stale_claims, the scheduler's
    recover_reports)."""
    with contextlib.suppress(DBAPIError):
        with engine.begin() as c:
            c.execute(delete(Report).where(Report.id == report_id))


def _delete_generating(engine: Engine, report_id: int) -> bool:
    """Delete the record `report_id` if it is still "generating" (one transaction, waited for while another
    process holds the store locked); whether it was."""
    def write() -> bool:
        with engine.begin() as c:
            gone = c.execute(delete(Report).where(Report.id == report_id, Report.delivery_status == GENERATING))
            return gone.rowcount == 1

    return retry_while_locked(engine, write)


def report_dir_name(report_id: int, window: Window) -> str:
    """'report-7-daily-20261102T0000Z'; a calendar month's by its month, 'report-9-monthly-2026-10'."""
    when = time_text(window.since, "%Y-%m" if window.month_text() else "%Y%m%dT%H%MZ")
    return f"report-{report_id}-{window.period}-{when}"


def _claimed_by(folder: Path, token: str | None) -> bool:
    """Whether `folder` carries the marker of the claim `token` (_claim_token), as this version writes it or as an
    earlier one did (`_marker_token`)."""
    if token is None:
        return False
    try:
        held = (folder / CLAIM_MARKER).read_text(encoding="utf-8").strip()
    except OSError:
        return False
    return held == token or _marker_token(held) == token


def _marker_token(held: str) -> str | None:
    """A marker's text read as _claim_token writes it now: an earlier version wrote the store's URL with only its
    user-info password hidden (a `?password=` left in): the same store, its password masked here. None when the
    text is no "URL report ID FOLDER" (a URL holds no space)."""
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    url, sep, rest = held.partition(" report ")
    if not sep:
        return None
    try:
        return f"{_store_text(make_url(url))}{sep}{rest}"
    except (ArgumentError, ValueError):
        return None


def _remove_claimed(folder: Path, token: str | None, *, unmarked_too: bool = False) -> bool:
    """Remove `folder` if it carries the claim's marker (a temporary folder: also when it has no marker at all,
    `unmarked_too`: an older version's, or one killed before its marker was written); never anyone else's."""
    if not folder.is_dir() or folder.is_symlink():
        return False
    if _claimed_by(folder, token) or (unmarked_too and not os.path.lexists(folder / CLAIM_MARKER)):
        shutil.rmtree(folder, ignore_errors=True)
        return True
    return False


def release_claim(engine: Engine, report_id: int, window: Window, out_dir: str | os.PathLike) -> bool:
    """Remove a claim left "generating" by a process that died while writing (SIGKILL, a crash: write_report's
    own cleanup never ran) and its half-written folders, so the period can be reported again. Only a record
    still "generating" is removed; False when there was none (another process finished or released it).

    The folders are the ones the claim recorded (csv_dir; report_dir_name in `out_dir` for a claim recorded
    without one): its temporary folder, and the final folder only if it still carries this claim's marker (the
    process died between renaming it into place and recording it). A folder of the same name written by another
    store, or before a reset, is never touched."""
    with Session(engine) as s:
        row = s.get(Report, report_id)
        if row is None or row.delivery_status != GENERATING:
            return False
        recorded = row.csv_dir
    if not _delete_generating(engine, report_id):
        return False
    final = Path(recorded) if recorded else Path(out_dir).expanduser() / report_dir_name(report_id, window)
    token = _claim_token(engine, report_id, final)
    _remove_claimed(final.parent / f".{final.name}.tmp", token, unmarked_too=True)
    _remove_claimed(final, token)
    return True


# A "pending" report a scheduler is delivering (again) carries this lease in delivery_error until the outcome is
# recorded: taken in one UPDATE that expects the column as read, so of two schedulers only one sends it; a lease
# older than STALE_AFTER_S (its process was killed) may be taken over (telemetry.scheduler.take_delivery).
DELIVERY_LEASE = "delivery under way since "


def delivery_note(status: str | None, error: str | None, now: datetime) -> str | None:
    """A report's delivery_error as a person reads it. A scheduler's lease says when its delivery began; one
    older than STALE_AFTER_S is a delivery whose scheduler stopped mid-way (the raw lease read as if it were
    still under way, hours later): the next scheduler start or run of its job delivers it."""
    if status != PENDING or not error or not error.startswith(DELIVERY_LEASE):
        return error
    try:
        since = datetime.fromisoformat(error.removeprefix(DELIVERY_LEASE))
    except ValueError:
        return error
    shown = f"{since:%Y-%m-%d %H:%M:%S} UTC" if since.utcoffset() in (None, timedelta(0)) else since.isoformat()
    if age_s(since, now) < STALE_AFTER_S:
        return f"delivery under way since {shown}"
    return (f"delivery stopped mid-way (began {shown}; its scheduler was stopped): the next scheduler start or "
            "run of its job delivers it")


def age_s(created_at: datetime, now: datetime) -> float:
    """Seconds since a record's created_at (SQLite hands back naive UTC)."""
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)
    return (now - created_at).total_seconds()


@dataclass(frozen=True, slots=True)
class StaleReport:
    report_id: int
    window: Window
    status: str
    summary: dict | None
    csv_dir: str | None
    job_id: str | None = None


def stale_reports(engine: Engine, owner, statuses: tuple[str, ...], *, stale_after_s: float | None = None,
                  now: datetime | None = None) -> list[StaleReport]:
    """Reports matching `owner` (a condition on Report.job_id) in one of `statuses`, created more than
    `stale_after_s` (STALE_AFTER_S) before `now`, oldest first: what a killed process left behind."""
    now = now or datetime.now(UTC)
    stale_after_s = STALE_AFTER_S if stale_after_s is None else stale_after_s
    with Session(engine) as s:
        rows = list(s.scalars(select(Report).where(owner, Report.delivery_status.in_(statuses)).order_by(Report.id)))
        s.expunge_all()
    out = []
    for r in rows:
        if age_s(r.created_at, now) < stale_after_s:
            continue
        out.append(StaleReport(r.id, Window(r.period, r.since, r.until), r.delivery_status, r.summary, r.csv_dir,
                               r.job_id))  # fmt: skip
    return out


def _gone_jobs_claims(engine: Engine, kept_jobs: Collection[str] = ()):
    """A condition on Report.job_id: a scheduled report whose job is gone from the store's job table (removed by
    another job's start), but for `kept_jobs`. Nothing finishes such a claim: recover_reports is its job's, run
    only by a scheduler holding that job. A store without the table (no scheduler made it here) tells nothing:
    none is taken; nor where this role may not read the table (a PostgreSQL role granted the report tables
    only, SQLSTATE 42501): the report is written all the same, the gone jobs' claims left to a role that may."""
    from sqlalchemy import column, false, inspect, table

    from telemetry.db import JOBS_TABLE

    if not inspect(engine).has_table(JOBS_TABLE):
        return false()
    jobs = table(JOBS_TABLE, column("id"))
    try:
        with engine.connect() as c:  # a connection of its own: a refused statement aborts no other transaction
            c.execute(select(jobs.c.id).limit(1))
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != PG_INSUFFICIENT_PRIVILEGE:
            raise
        logger.debug("gone jobs' claims not looked for: the job table %s cannot be read (%s)", JOBS_TABLE,
                     str(exc.orig).splitlines()[0])
        return false()
    gone = Report.job_id.is_not(None) & Report.job_id.not_in(select(jobs.c.id))
    return gone & Report.job_id.not_in(list(kept_jobs)) if kept_jobs else gone


def release_stale_claims(engine: Engine, out_dir: str | os.PathLike | None = None, *,
                         stale_after_s: float | None = None, now: datetime | None = None,
                         kept_jobs: Collection[str] = ()) -> list[str]:
    """Release the claims left "generating" for more than `stale_after_s` (STALE_AFTER_S) that nothing else
    releases, with their folders; one line per claim released: those of reports made by hand (no job id), by a
    `specfinops report` killed outright, and those of scheduled reports whose job is gone from the job table (a
    run killed, then its job removed: no scheduler runs it to recover them). They are not written again (said
    with the command that writes such a period again). The folder is the one the claim recorded; a claim from
    before it was recorded (csv_dir empty) has only its unmarked temporary folder looked for in `out_dir`.
    The claims of jobs still in the job table are their scheduler's (recover_reports rewrites them), and so are
    those of `kept_jobs`: the jobs a scheduler's start has just removed (remove_other_jobs). That start is what
    stops their scheduler, telling its user to start it again with --keep-other-jobs, whose recover_reports
    rewrites the killed run's report: released by that same start, it had nothing left to rewrite. A job still
    gone at a later report or scheduler start was not started again: its claim is released then."""
    done = []
    owner = Report.job_id.is_(None) | _gone_jobs_claims(engine, kept_jobs)
    for stale in stale_reports(engine, owner, (GENERATING,), stale_after_s=stale_after_s, now=now):
        report_id, window, csv_dir = stale.report_id, stale.window, stale.csv_dir
        if csv_dir:
            released = release_claim(engine, report_id, window, Path(csv_dir).parent)
        else:  # recorded by an older version: no folder known; only a temporary one in `out_dir` is safe to remove
            released = _delete_generating(engine, report_id)
            if released and out_dir is not None:  # an unmarked one only: a marked one is another claim's
                _remove_claimed(Path(out_dir).expanduser() / f".{report_dir_name(report_id, window)}.tmp", None,
                                unmarked_too=True)  # fmt: skip
        if not released:
            continue
        if stale.job_id is None:
            line = (f"report #{report_id} ({window.label()}) was left '{GENERATING}' by a `specfinops report` that "
                    "was killed; its record and temporary folder are removed")
        else:
            from telemetry.scheduler import write_again_command

            line = (f"report #{report_id} ({window.label()}) of job {stale.job_id} was left '{GENERATING}' by a run "
                    "that was killed, and its job is gone from the store's job table (nothing would finish it): its "
                    f"record and temporary folder are removed; {write_again_command(engine, window.period, window.since, csv_dir)} writes that "
                    "period again")  # fmt: skip
        logger.warning("%s", line)
        done.append(line)
    return done


def write_report(
    engine: Engine,
    window: Window,
    out_dir: str | os.PathLike,
    *,
    sla_ms: float = DEFAULT_SLA_MS,
    history: int = DEFAULT_HISTORY,
    daily_tokens: float | None = None,
    peak_factor: float = 1.0,
    pricing: Pricing = Pricing(),
    job_id: str | None = None,
    delivery_requested: bool = False,
    now: datetime | None = None,
) -> ReportResult | None:
    """Build, write and record one report of `window` (its period, and its runs: Window.temperature / kind),
    costed at `pricing`. None when `job_id` already has a report for this period."""
    out = check_out_dir(out_dir)
    release_stale_claims(engine, out)  # what a killed `specfinops report` left (by the real clock, not `now`)
    report_id = _claim(engine, window, job_id, out)
    if report_id is None:
        logger.info("report job %s: %s already reported (another scheduler or an earlier run)", job_id,
                    window.label())
        return None
    usual = report_dir_name(report_id, window)
    final = out / usual
    made: list[Path] = []  # the folders this call created: the only ones its cleanup removes
    try:
        final = _make_tmp(engine, report_id, window, out, made)
        tmp = made[0]
        data = build_report(engine, window, sla_ms=sla_ms, history=history, daily_tokens=daily_tokens,
                            peak_factor=peak_factor, pricing=pricing, now=now)  # fmt: skip
        tables = report_tables(data, engine)
        names = [f"{t.name}.csv" for t in tables]
        for t, name in zip(tables, names, strict=True):
            with (tmp / name).open("w", encoding="utf-8", newline="") as fh:
                write_csv(fh, t.header, t.rows)
        (tmp / HTML_NAME).write_text(render_html(data, tables, report_id=report_id, csv_names=names),
                                     encoding="utf-8")  # fmt: skip
        if os.path.lexists(final):  # taken since the claim chose it (not by specfinops: it avoids our .tmp)
            raise FileExistsError(f"report folder {final} appeared while report #{report_id} was being written "
                                  "(it is left as it is); run the report again")  # fmt: skip
        os.replace(tmp, final)  # onto no existing path: checked just above
        made[0] = final
        summary = {
            "report_id": report_id,
            **summary_dict(data),
            # False: the period had not ended when the report was generated; its figures cover only part of it
            "period_complete": period_complete(data),
            "html_path": str(final / HTML_NAME),
            "csv_files": [str(final / n) for n in names],
            # what its webhook POSTs carry as Idempotency-Key, stored so every re-delivery carries it again
            "idempotency_key": new_idempotency_key(report_id),
        }
        _set_report(engine, report_id, html_path=str(final / HTML_NAME), csv_dir=str(final), summary=summary,
                    delivery_status=PENDING if delivery_requested else NOT_REQUESTED)  # fmt: skip
    except BaseException as exc:
        for folder in made:  # this call's folder only (temporary, or renamed into place): never another's
            shutil.rmtree(folder, ignore_errors=True)
        _drop_claim(engine, report_id)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:  # a write said only "No space left on device"
            raise DeviceFullError("the --out folder", out) from exc
        raise
    with contextlib.suppress(OSError):  # recorded: the folder is the record's now, not a claim's
        (final / CLAIM_MARKER).unlink()
    name_taken = usual if final.name != usual else None
    if name_taken:
        logger.warning("report #%d: %s already holds %s (another store's report, one from before a reset, or "
                       "another file; left as it is): written to %s", report_id, out, usual, final.name)  # fmt: skip
    return ReportResult(report_id, final / HTML_NAME, final, tuple(final / n for n in names), summary,
                        incomplete_period_text(data), name_taken, data.synthetic_text())


def _set_report(engine: Engine, report_id: int, **values) -> None:
    """Set columns of the record `report_id`: one UPDATE in its own transaction, waited for while another process
    holds the store locked."""
    def write() -> None:
        with engine.begin() as c:
            c.execute(update(Report).where(Report.id == report_id).values(**values))

    retry_while_locked(engine, write)


def _make_tmp(engine: Engine, report_id: int, window: Window, out: Path, made: list[Path]) -> Path:
    """Create the claim's temporary folder (exclusively: never one that exists) with its marker, appended to
    `made`; the final folder it becomes. When another writer took the recorded name meanwhile, a new free name
    is chosen and recorded in the claim."""
    with engine.connect() as c:
        recorded = c.execute(select(Report.csv_dir).where(Report.id == report_id)).scalar()
    final = Path(recorded) if recorded else out / free_dir_name(out, report_id, window)
    for _ in range(20):
        tmp = final.parent / f".{final.name}.tmp"
        if not os.path.lexists(final):
            try:
                tmp.mkdir()
            except FileExistsError:
                pass
            else:
                made.append(tmp)
                (tmp / CLAIM_MARKER).write_text(_claim_token(engine, report_id, final) + "\n", encoding="utf-8")
                if str(final) != recorded:
                    _set_report(engine, report_id, csv_dir=str(final))
                return final
        final = out / free_dir_name(out, report_id, window)
    raise FileExistsError(f"no free folder name for report #{report_id} in {out}")


def list_reports(engine: Engine, limit: int = 200) -> list[Report]:
    """The newest reports first (detached rows)."""
    with Session(engine) as s:
        rows = list(s.scalars(select(Report).order_by(Report.created_at.desc(), Report.id.desc()).limit(limit)))
        s.expunge_all()
    return rows

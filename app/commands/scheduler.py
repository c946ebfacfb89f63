"""`specfinops scheduler`: run report jobs on a cron schedule, persisted in the store's database.

Runs in the foreground until interrupted (Ctrl-C, or SIGTERM, handled the same: a run in progress finishes
first). On start it finishes what a killed run of its job left (see telemetry/scheduler.py, recover_reports).
Restarting with the same options continues the persisted
job (runs missed while it was down follow the misfire policy: coalesced into one, skipped beyond the grace
time); restarting with options changed replaces it, and the runs it missed follow the same policy. Two
schedulers on one database never write the same report twice (see telemetry/scheduler.py).
A scheduler runs every job in its store, so the store's other persisted jobs are removed on start (one line
each) unless --keep-other-jobs; --list shows the persisted jobs, the reports not finished (being written or
delivered, or left so by a scheduler stopped mid-way: finished once STALE_AFTER_S old, when the start says it
leaves a younger one alone) and the reports whose delivery failed (each
later run, and the start, delivers those again for telemetry.scheduler.REDELIVER_FAILED_FOR_S, a monthly job's
for REDELIVER_FAILED_MONTHLY_S).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager, suppress
from pathlib import Path

from app.commands._common import (
    add_command,
    add_db_option,
    printable_name,
    removing_made_folders,
    sigterm_as_ctrl_c,
)
from app.commands.cost import check_gpu_entry
from app.commands.report import add_report_options, report_options, unrecorded_names
from app.errors import UsageError

EXAMPLES = """  specfinops scheduler --cron "0 6 * * *" --period daily --out reports/          # every day, 06:00 UTC
  specfinops scheduler --cron "0 7 * * 1" --period weekly --out reports/ --webhook https://hooks.example/finops
  specfinops scheduler --cron "0 6 1 * *" --period monthly --out reports/   # the 1st, 06:00 UTC: last month
  SPECFINOPS_WEBHOOK_URL=https://hooks.slack.com/services/... \\
    specfinops scheduler --cron "0 6 * * *" --out reports/ --webhook-env SPECFINOPS_WEBHOOK_URL   # URL not stored
  specfinops scheduler --list                                                      # the jobs in the store
  specfinops scheduler --cron "0 6 * * *" --out reports/ --temperature 0.8 --top-k 40   # only the runs sampled so
  specfinops scheduler --cron "0 6 * * *" --out reports/ --max-new-tokens 128     # only answers capped at 128
  specfinops scheduler --cron "0 6 * * 1" --period weekly --out reports/code --workload code --job-id code-weekly
  SPECFINOPS_SMTP_HOST=smtp.example SPECFINOPS_SMTP_FROM=finops@example SPECFINOPS_SMTP_TO=cfo@example \\
    specfinops scheduler --cron "0 6 * * *" --out reports/ --smtp
"""


def register(sub) -> None:
    p = add_command(
        sub,
        "scheduler",
        "Write cost reports on a cron schedule (jobs persist in the database) and deliver their summaries.",
        EXAMPLES,
        run,
    )
    add_db_option(p)
    p.add_argument("--cron", metavar="EXPR", help="5-field crontab expression, in UTC (required unless --list)")
    p.add_argument("--period", default="daily", metavar="daily|weekly|monthly",
                   help="period each run reports on (the last full one; monthly: the calendar month before)")
    add_report_options(p)
    for action in p._actions:  # --out is required to schedule, not to --list
        if action.dest == "out":
            action.required = False
            action.help += " (required unless --list)"
    p.add_argument("--webhook", metavar="URL", help="POST each report's JSON summary to this URL (stored in the job)")
    p.add_argument("--webhook-env", metavar="NAME", type=printable_name,
                   help="as --webhook, the URL read from this environment variable at each run (not stored)")  # fmt: skip
    p.add_argument("--smtp", action="store_true", help="e-mail each summary (settings: SPECFINOPS_SMTP_* env)")
    p.add_argument("--job-id", metavar="ID", type=printable_name,
                   help="job id in the job store (default report-PERIOD)")
    p.add_argument("--misfire-grace-s", metavar="S", default="3600",
                   help="a run later than this is skipped (1 s to 366 days; default 3600)")  # fmt: skip
    p.add_argument("--keep-other-jobs", action="store_true",
                   help="keep (and run) the store's other persisted jobs; by default they are removed on start")  # fmt: skip
    p.add_argument("--list", action="store_true",
                   help="list the jobs persisted in the store, the reports whose delivery failed and those not "
                        "finished, then exit")  # fmt: skip


def _say_next_run(scheduler, now=None) -> None:
    """Once the scheduler has started: when each job runs next. A kept job's may be runs missed while the
    scheduler was down: coalesced into one run at once where the latest missed time is within the job's
    --misfire-grace-s, else skipped (APScheduler's rule, which judges the latest); said either way, with the
    periods the missed times would have reported that no run now reports, and the command that writes one."""
    from datetime import UTC, datetime

    from telemetry.report import period_window

    now = now or datetime.now(UTC)
    fmt = "%a %Y-%m-%d %H:%M"
    for job in scheduler.get_jobs():
        when = job.next_run_time
        if when is None:
            print(f"scheduler: job {job.id} is paused", flush=True)
            continue
        if when > now:
            print(f"scheduler: job {job.id} next runs {when:{fmt}} UTC", flush=True)
            continue
        missed = job._get_run_times(now) or [when]  # every missed run time, oldest first (APScheduler 3.x)
        latest, n = missed[-1], len(missed)
        grace = job.misfire_grace_time
        period = job.kwargs.get("period", "daily")
        skipped = grace is not None and (now - latest).total_seconds() > grace
        nxt = job.trigger.get_next_fire_time(latest, now) if skipped else None
        # a run reports the last full period before it runs: the coalesced one now's, a skip leaves it to the next
        runs_at = nxt if skipped else now
        reported = period_window(period, now=runs_at) if runs_at is not None else None
        lost = sorted({w.since: w for w in (period_window(period, now=t) for t in missed)
                       if reported is None or w.since != reported.since}.values(), key=lambda w: w.since)
        times = f"{n} run{'s' if n > 1 else ''}" + (f" (from {missed[0]:{fmt}} UTC)" if n > 1 else "")
        if skipped:
            head = (f"scheduler: job {job.id} missed {times} while stopped, the last ({latest:{fmt}} UTC) later "
                    f"than --misfire-grace-s {grace:g}: skipped" + (f"; next runs {nxt:{fmt}} UTC" if nxt else ""))
        else:
            head = f"scheduler: job {job.id} runs now, for {times} missed while stopped (the last {latest:{fmt}} UTC)"
        print(head + _unreported_text(lost, job.kwargs), flush=True)


def _unreported_text(lost: list, kwargs: dict) -> str:
    """'; 2 periods no run reports (daily from Wed 2026-12-02 00:00 UTC): `specfinops report ...` writes the
    first' for the periods missed runs would have reported, with the job's own store, folder, run filters and
    prices."""
    import shlex

    from telemetry.scheduler import job_pricing

    if not lost:
        return ""
    first = lost[0]
    from telemetry.db import masked_password_note, shown_db_url

    try:  # the command goes to the log: the store's password masked, as the dashboard shows a URL
        db, note = shown_db_url(kwargs.get("db_url")), masked_password_note(kwargs.get("db_url"))
    except Exception:  # noqa: BLE001 - a plain file path, not a URL
        db, note = kwargs.get("db_url"), ""
    argv = ["specfinops", "report", "--db", db, "--period", first.period, "--since",
            f"{first.since:%Y-%m-%dT%H:%M}", "--out", kwargs.get("out_dir")]
    for flag, key in (("--sla-ms", "sla_ms"), ("--history", "history"), ("--daily-tokens", "daily_tokens"),
                      ("--peak-factor", "peak_factor"), ("--temperature", "temperature"), ("--run-kind", "kind"),
                      ("--top-p", "top_p"), ("--top-k", "top_k"), ("--max-new-tokens", "max_new_tokens"),
                      ("--workload", "workload"), ("--target", "target")):
        value = kwargs.get(key)
        if value is not None:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]  # every digit the job has
    argv += job_pricing(kwargs).flags()
    if first.period == "monthly":  # '2 months from September 2026', not from 'Tue 2026-09-01 00:00 UTC'
        what = (f"the month {first.period_text()}" if len(lost) == 1
                else f"{len(lost)} months from {first.month_text() or first.span_text()}")
    else:
        what = (f"the period {first.span_text()}" if len(lost) == 1
                else f"{len(lost)} periods from {first.since:%a %Y-%m-%d %H:%M} UTC")
    return (f"; no run reports {what}: `{shlex.join(str(a) for a in argv)}`{note} writes "
            + ("it" if len(lost) == 1 else "the first (the others: --since of each)"))


def scheduled_workload(workload: str | None) -> str | None:
    """--workload as the job stores it: a workload file by its absolute path, resolved now from the folder the
    scheduler is started in (telemetry.queries.workload_file, as bench and loadtest record the file: its runs
    match). Stored as typed, `my_prompts.jsonl` was resolved at each run, from wherever the scheduler ran then
    (another folder after a restart, or another scheduler's with --keep-other-jobs): another file, or none.
    A builtin workload's name (code, chat, mixed) stays a name."""
    from serving.workloads import FILE_SUFFIXES
    from telemetry.queries import workload_file

    if workload is None or Path(workload).suffix not in FILE_SUFFIXES:
        return workload
    return workload_file(workload)


def _list_jobs(args) -> int:
    from telemetry.scheduler import describe_job, failed_deliveries, persisted_jobs, unfinished_deliveries
    from telemetry.store import open_store

    engine = open_store(args.db, must_exist=True)
    try:
        jobs = persisted_jobs(engine)
        failed = failed_deliveries(engine, jobs=jobs)
        unfinished = unfinished_deliveries(engine, jobs=jobs)
    finally:
        engine.dispose()
    if not jobs:
        print("scheduler: no jobs in the store")
    for job in jobs:
        print(describe_job(job))
    if failed:
        print("scheduled reports whose delivery failed:")
    for line in failed:
        print(f"  {line}")
    if unfinished:
        print("scheduled reports not finished (being written or delivered, or left so by a stopped scheduler):")
    for line in unfinished:
        print(f"  {line}")
    return 0


# How often a running scheduler looks that its job is still in the store's job table (`_watch_own_job`)
WATCH_S = 30.0


def _watch_own_job(scheduler, engine, job_id: str, stop: threading.Event, lost: threading.Event) -> None:
    """Every WATCH_S, until `stop`: is the job still stored? Another `specfinops scheduler` started on the store
    without --keep-other-jobs removes it, and this one then ran that one's job, none of its own, looking healthy.
    Gone: `lost` is set and the scheduler stopped (`run` says why and exits 1)."""
    from telemetry.scheduler import job_in_store

    while not stop.wait(WATCH_S):
        if not scheduler.running:  # a job just added is written to the store as the scheduler starts
            continue
        try:
            if job_in_store(engine, job_id):
                continue
        except Exception:  # noqa: BLE001 - the store out of reach a moment: its runs say so; looked at again later
            continue
        lost.set()
        _stop(scheduler)
        return


def _stop(scheduler) -> None:
    """Shut the scheduler down without waiting for a run in progress, if it still runs (the watcher and a Ctrl-C
    may both stop it: the second found it stopped between its check and its call)."""
    from apscheduler.schedulers import SchedulerNotRunningError

    with suppress(SchedulerNotRunningError):
        scheduler.shutdown(wait=False)


@contextmanager
def _signals_held():
    """Ctrl-C and SIGTERM ignored for the block: the store's connections closing as the scheduler stops (a second
    Ctrl-C there printed SQLAlchemy's traceback of a KeyboardInterrupt inside a connection's close)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _finish_runs_in_progress(again: str = "again") -> None:
    """After Ctrl-C or SIGTERM: wait, in the main thread, for a report run in progress to finish (its report
    written, its delivery made and recorded). A second Ctrl-C stops at once: the process exits without waiting
    (a normal exit would join the run's thread again, and Python printed a traceback when that was interrupted);
    what the run leaves, a claimed period or a pending delivery, this job's first run or start once it is older
    than report_writer.STALE_AFTER_S finishes (a younger one may be another scheduler's at work: left alone)."""
    from datetime import UTC, datetime, timedelta

    from telemetry.report_writer import STALE_AFTER_S
    from telemetry.scheduler import runs_in_progress, wait_for_runs

    if not runs_in_progress():
        return
    print(f"scheduler: waiting for the report run in progress to finish (Ctrl-C{' ' + again if again else ''} stops "
          f"now; what it leaves, this job's first run or start {STALE_AFTER_S // 60} minutes on finishes)",
          file=sys.stderr, flush=True)  # fmt: skip
    try:
        wait_for_runs()
    except KeyboardInterrupt:
        # a record this young may be another scheduler's at work: recover_reports leaves it STALE_AFTER_S
        ready = datetime.now(UTC) + timedelta(seconds=STALE_AFTER_S)
        print(f"scheduler: stopped without waiting; the report and delivery it left are finished by this job's first "
              f"run, or `specfinops scheduler` start, from {ready:%Y-%m-%d %H:%M} UTC ({STALE_AFTER_S // 60} minutes "
              "on: till then they are left to whoever may be at them); `specfinops scheduler --list` shows them",
              file=sys.stderr, flush=True)  # fmt: skip
        logging.shutdown()
        sys.stdout.flush()
        os._exit(130)


def run(args) -> int:
    from dataclasses import replace

    from apscheduler.events import EVENT_SCHEDULER_STARTED
    from sqlalchemy.exc import DBAPIError

    from telemetry.db import resolve_db_url
    from telemetry.delivery import SmtpSettings, check_webhook_url, webhook_from_env
    from telemetry.report import SCHEDULED_PERIODS
    from telemetry.report_writer import check_out_dir, release_stale_claims
    from telemetry.scheduler import (
        ReportJob,
        absolute_db_url,
        describe_job,
        job_runs_text,
        left_alone,
        make_scheduler,
        parse_cron,
        recover_reports,
        redeliver_failed,
        remove_other_jobs,
        schedule_report_job,
    )
    from telemetry.store import SCHEDULES_REPORTS, not_writable_error, open_store, refuse_unless_writable

    if args.list:
        # --list schedules nothing: a --cron or --out beside it was dropped unsaid
        given = [a.option_strings[0] for a in args.command_parser._actions
                 if a.option_strings and a.dest not in ("help", "db", "list") and getattr(args, a.dest) != a.default]
        if given:
            raise UsageError(f"--list lists the persisted jobs and takes no {', '.join(given)} (drop --list to "
                             "schedule a job)")
        return _list_jobs(args)
    missing = [flag for flag, value in (("--cron", args.cron), ("--out", args.out)) if value is None]
    if missing:
        args.command_parser.error(f"the following arguments are required: {', '.join(missing)} (or --list)")
    trigger = parse_cron(args.cron)
    if args.period not in SCHEDULED_PERIODS:
        raise UsageError(f"--period for a schedule must be one of {', '.join(SCHEDULED_PERIODS)}, got {args.period!r}")
    options = report_options(args)
    options["workload"] = scheduled_workload(options["workload"])
    try:
        grace = int(args.misfire_grace_s)
    except ValueError:
        raise UsageError(f"--misfire-grace-s must be a whole number of seconds, got {args.misfire_grace_s!r}") from None
    if args.webhook is not None and args.webhook_env is not None:
        raise UsageError("give --webhook URL or --webhook-env NAME, not both")
    if args.webhook is not None:
        check_webhook_url(args.webhook)
    if args.webhook_env is not None:
        webhook_from_env(args.webhook_env)
    if args.smtp:
        SmtpSettings.from_env()
    db_url = absolute_db_url(resolve_db_url(args.db))  # stored in the job: the same file from any folder
    # every option checked (--job-id, --misfire-grace-s: ReportJob's own checks) before the store is opened and
    # --out is made: bad input leaves no empty folder
    job = ReportJob(job_id=f"report-{args.period}" if args.job_id is None else args.job_id, db_url=db_url,
                    out_dir=args.out, period=args.period, webhook_url=args.webhook, smtp=args.smtp,
                    misfire_grace_s=grace, webhook_env=args.webhook_env, **options)  # fmt: skip
    # An existing store only (as `report`): a mistyped --db is refused, not taken for a new, empty store that
    # would get a "no traffic" report every period. Opened before --out is made: a bad store leaves no folder.
    engine = open_store(db_url, must_exist=True)
    try:
        # a store it may not write is named as `report` names one (`--db X: not writable: ...`), before --out is
        # made (it said SQLite's 'attempt to write a readonly database' after "job ... replaced")
        refuse_unless_writable(engine, args.db, SCHEDULES_REPORTS)
        check_gpu_entry(engine, args)  # a --gpu typo is refused now, not said as 'cost n/a' by every run
        unknown = unrecorded_names(engine, options)
        if unknown is not None:  # said, not refused: a job may be set up before its model's first runs
            print(f"scheduler: warning: {unknown}; until such runs are recorded its reports say 'no traffic'",
                  file=sys.stderr, flush=True)  # fmt: skip
        # a store that opens but refuses the job (read-only) leaves no empty --out either: the folders made
        # here are removed unless the job is saved
        with removing_made_folders(args.out):
            out = check_out_dir(args.out)
            job = replace(job, out_dir=str(out))
            scheduler = make_scheduler(engine, blocking=True)
            try:  # the job written here (not at the start): a refusal removes the folders made, says no "replaced"
                how = schedule_report_job(scheduler, engine, job, trigger)
            except DBAPIError as exc:  # the job table refused where the probe above passed (a role's grants)
                clear = not_writable_error(exc, args.db, SCHEDULES_REPORTS)
                if clear is None:
                    raise
                raise clear from None
    except BaseException:
        engine.dispose()
        raise
    removed: list[str] = []
    if not args.keep_other_jobs:  # a scheduler runs every job in its store: only this one is meant to run
        for other in remove_other_jobs(engine, job.job_id):
            removed.append(other.id)
            print(f"scheduler: removed job {describe_job(other)} (--keep-other-jobs keeps such jobs)", flush=True)
    logging.getLogger("apscheduler").setLevel(logging.INFO)
    logging.getLogger("telemetry").setLevel(logging.INFO)
    scheduler.add_listener(lambda _event: _say_next_run(scheduler), EVENT_SCHEDULER_STARTED)
    # SIGTERM stops the scheduler as Ctrl-C does: KeyboardInterrupt in the main thread, so a run in progress
    # finishes in its worker thread (report written, delivery made and recorded) before the process exits with
    # status 130; further SIGTERMs are ignored meanwhile
    with sigterm_as_ctrl_c("scheduler: SIGTERM: stopping (a run in progress finishes first)"):
        # said once SIGTERM is handled: a SIGTERM sent on reading this line met the default action (exit -15)
        runs = job_runs_text(job.kwargs())  # the runs it covers, as --list and a removal say them
        priced = job.pricing().text()
        print(f"scheduler: job {job.job_id} {how}: cron {args.cron!r} (UTC), {job.period} reports"
              f"{f' of {runs} only' if runs else ''}{f' priced at {priced}' if priced else ''} into {out}; Ctrl-C "
              "or SIGTERM to stop", flush=True)  # fmt: skip
        stop, lost = threading.Event(), threading.Event()
        try:
            for line in recover_reports(engine, job):  # what a killed run of this job left behind
                print(f"scheduler: {line}", flush=True)
            # claims nothing else finishes: a killed `specfinops report`'s, and those of jobs gone from the job
            # table (removed by an earlier start): a monthly job's first run may be weeks off. Not those of the
            # jobs this start removed: their scheduler, stopped by it, is told to start again with
            # --keep-other-jobs, and its recover_reports rewrites them then
            for line in release_stale_claims(engine, job.out_dir, kept_jobs=removed):
                print(f"scheduler: {line}", flush=True)
            for line in redeliver_failed(engine, job):  # deliveries that failed (a receiver that was down)
                print(f"scheduler: {line}", flush=True)
            for line in left_alone(engine, job):  # too young to recover: when they will be
                print(f"scheduler: {line}", flush=True)
            threading.Thread(target=_watch_own_job, args=(scheduler, engine, job.job_id, stop, lost), daemon=True,
                             name="specfinops-scheduler-watch").start()
            scheduler.start()
            if lost.is_set():  # another scheduler removed this one's job (`_watch_own_job`)
                _finish_runs_in_progress(again="")
                print(f"scheduler: error: job {job.job_id} is gone from the store's job table: another "
                      "`specfinops scheduler` started on this store without --keep-other-jobs removed it (a "
                      "scheduler runs every job in its store). Stopped. Run each job with --keep-other-jobs, or "
                      "each in its own store", file=sys.stderr, flush=True)
                return 1
        except KeyboardInterrupt:
            _stop(scheduler)  # no new run starts
            _finish_runs_in_progress()
            raise
        finally:
            stop.set()
            _stop(scheduler)
            with _signals_held():
                engine.dispose()
    return 0

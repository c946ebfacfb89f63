"""Writing a report: claim its record, write the HTML page and the CSV files, fill the record in.

The record is inserted first (delivery_status "generating") and committed. Scheduled reports carry their job
id, and (job_id, since) is unique in the `reports` table (migration 0002): when two schedulers fire the same
job for the same period, the second INSERT fails and that scheduler skips the run. Reports made by hand have
job_id NULL and are never refused. Files go into a hidden temporary folder that is renamed into place at the
end; on any failure that folder and the claimed record are removed: nothing half-written is left behind.
A process killed outright (SIGKILL, a crash) runs no cleanup: its claim stays "generating". `release_claim`
removes such a claim; the scheduler calls it for its job's claims older than any report takes to write
(telemetry/scheduler.py, STALE_AFTER_S) and writes that period again.

Layout: OUT/report-<id>-<period>-<since>/report.html plus one CSV per table (formula-safe, telemetry.export).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import delete, func, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from telemetry.db import Report, Run
from telemetry.export import write_csv
from telemetry.report import (
    DEFAULT_HISTORY,
    DEFAULT_SLA_MS,
    Window,
    build_report,
    report_tables,
    summary_dict,
)
from telemetry.report_html import render_html

logger = logging.getLogger(__name__)

GENERATING = "generating"
NOT_REQUESTED = "not requested"
PENDING = "pending"
HTML_NAME = "report.html"


@dataclass(frozen=True, slots=True)
class ReportResult:
    report_id: int
    html_path: Path
    csv_dir: Path
    csv_files: tuple[Path, ...]
    summary: dict


def check_out_dir(out_dir: str | os.PathLike) -> Path:
    """Create `out_dir` if needed and prove a file can be written there; ValueError naming it otherwise."""
    path = Path(out_dir).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".specfinops-write-test-"):
            pass
    except OSError as exc:
        raise ValueError(f"--out {str(out_dir)!r} is not a writable directory: {exc.strerror or exc}") from None
    return path.resolve()


def count_runs(engine: Engine) -> int:
    with engine.connect() as c:
        return int(c.execute(select(func.count(Run.id))).scalar() or 0)


def _claim(engine: Engine, window: Window, job_id: str | None) -> int | None:
    with Session(engine) as s:
        row = Report(period=window.period, since=window.since, until=window.until, html_path="", csv_dir="",
                     delivery_status=GENERATING, job_id=job_id)  # fmt: skip
        s.add(row)
        try:
            s.commit()
        except IntegrityError:
            s.rollback()
            return None
        return row.id


def _drop_claim(engine: Engine, report_id: int) -> None:
    with engine.begin() as c:
        c.execute(delete(Report).where(Report.id == report_id))


def report_dir_name(report_id: int, window: Window) -> str:
    return f"report-{report_id}-{window.period}-{window.since:%Y%m%dT%H%MZ}"


def release_claim(engine: Engine, report_id: int, window: Window, out_dir: str | os.PathLike) -> bool:
    """Remove a claim left "generating" by a process that died while writing (SIGKILL, a crash: write_report's
    own cleanup never ran) and its half-written folders, so the period can be reported again. Only a record
    still "generating" is removed; False when there was none (another process finished or released it)."""
    with engine.begin() as c:
        gone = c.execute(delete(Report).where(Report.id == report_id, Report.delivery_status == GENERATING))
    if gone.rowcount != 1:
        return False
    out = Path(out_dir).expanduser()
    name = report_dir_name(report_id, window)
    shutil.rmtree(out / f".{name}.tmp", ignore_errors=True)
    shutil.rmtree(out / name, ignore_errors=True)
    return True


def write_report(
    engine: Engine,
    window: Window,
    out_dir: str | os.PathLike,
    *,
    sla_ms: float = DEFAULT_SLA_MS,
    history: int = DEFAULT_HISTORY,
    daily_tokens: float | None = None,
    peak_factor: float = 1.0,
    job_id: str | None = None,
    delivery_requested: bool = False,
    now: datetime | None = None,
) -> ReportResult | None:
    """Build, write and record one report. None when `job_id` already has a report for this period."""
    out = check_out_dir(out_dir)
    report_id = _claim(engine, window, job_id)
    if report_id is None:
        logger.info("report job %s: %s already reported (another scheduler or an earlier run)", job_id,
                    window.label())
        return None
    final = out / report_dir_name(report_id, window)
    tmp = out / f".{final.name}.tmp"
    try:
        data = build_report(engine, window, sla_ms=sla_ms, history=history, daily_tokens=daily_tokens,
                            peak_factor=peak_factor, now=now)  # fmt: skip
        tables = report_tables(data, engine)
        tmp.mkdir()
        names = [f"{t.name}.csv" for t in tables]
        for t, name in zip(tables, names, strict=True):
            with (tmp / name).open("w", encoding="utf-8", newline="") as fh:
                write_csv(fh, t.header, t.rows)
        (tmp / HTML_NAME).write_text(render_html(data, tables, report_id=report_id, csv_names=names),
                                     encoding="utf-8")  # fmt: skip
        os.replace(tmp, final)
        summary = {
            "report_id": report_id,
            **summary_dict(data),
            "html_path": str(final / HTML_NAME),
            "csv_files": [str(final / n) for n in names],
        }
        with engine.begin() as c:
            c.execute(
                update(Report)
                .where(Report.id == report_id)
                .values(html_path=str(final / HTML_NAME), csv_dir=str(final), summary=summary,
                        delivery_status=PENDING if delivery_requested else NOT_REQUESTED)  # fmt: skip
            )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        _drop_claim(engine, report_id)
        raise
    return ReportResult(report_id, final / HTML_NAME, final, tuple(final / n for n in names), summary)


def list_reports(engine: Engine, limit: int = 200) -> list[Report]:
    """The newest reports first (detached rows)."""
    with Session(engine) as s:
        rows = list(s.scalars(select(Report).order_by(Report.created_at.desc(), Report.id.desc()).limit(limit)))
        s.expunge_all()
    return rows

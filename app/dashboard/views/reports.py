"""Reports: the cost reports written by `specfinops report` and the scheduler, with their downloads.

The list is the `reports` table (not the sidebar filters); figures in it are the ones stored with each report.
A file that is not on this machine (the report was written elsewhere) is said so, not hidden.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pandas as pd
import streamlit as st

from app.dashboard import data
from app.dashboard.common import Context, md_safe, on_store, run_page, show_table
from telemetry.queries import SYNTHETIC_HOSTNAME, SYNTHETIC_WORKLOAD

# shown with `--db <the store in view>` (on_store): without it they would write to the default store
REPORT_COMMAND = "specfinops report --period daily --out reports/"
SCHEDULE_COMMAND = 'specfinops scheduler --cron "0 6 * * *" --period daily --out reports/'


@st.cache_data(ttl=data.TTL_S, show_spinner=False)
def reports(url: str) -> list[dict]:
    from datetime import UTC, datetime

    from telemetry.report import runs_covered_text
    from telemetry.report_writer import delivery_note, list_reports

    out, now = [], datetime.now(UTC)
    for r in list_reports(data.engine(url)):
        s = r.summary or {}
        modes = s.get("modes", {})
        anomalies = s.get("anomalies")
        flagged = [a["metric"] for a in anomalies or [] if a.get("status") == "anomaly"]
        notes = report_notes(s, r.since, r.until, r.created_at)
        out.append({
            "id": r.id, "created": r.created_at, "period": period_name(r.period, r.since, r.until),
            # what the HTML report's notices say of its figures: not final, not measurements, too few requests
            "caveats": ", ".join(notes) or None, "notes": notes,
            "since": r.since, "until": r.until,
            # `report --temperature / --run-kind / --top-p / --top-k / --max-new-tokens / --workload / --target /
            # --invocation`: the runs the figures cover
            "runs": runs_covered_text(s.get("temperature"), s.get("run_kind"), s.get("top_p"), s.get("top_k"),
                                      s.get("max_new_tokens"), s.get("workload"), s.get("target"),
                                      s.get("invocation_id")) or "all",
            "output tokens": s.get("output_tokens"), "spec $/1M": modes.get("spec", {}).get("total_usd_per_1m"),
            "spec energy": energy_basis(modes.get("spec")),
            "AR $/1M": modes.get("ar", {}).get("total_usd_per_1m"), "AR energy": energy_basis(modes.get("ar")),
            # none found is a finding ("none"); a summary without the check is missing (None -> "—")
            # a period that had not ended judges its rates, not its totals (report.NOT_CHECKED): no all-clear
            # where no band was checked
            "anomalies": ", ".join(flagged) or (None if anomalies is None else "not checked" if any(
                a.get("status") == "not checked" for a in anomalies) and not any(
                a.get("status") in ("anomaly", "within band") for a in anomalies) else "none"),
            "job": "manual" if r.job_id is None else f"job {r.job_id}",  # `specfinops report` has no job
            "delivery": r.delivery_status, "delivery error": delivery_note(r.delivery_status, r.delivery_error, now),
            "html_path": r.html_path, "csv_dir": r.csv_dir,
        })  # fmt: skip
    return out


PARTIAL_PERIOD = "partial period"
SYNTHETIC_DATA = "synthetic data"
SMALL_SAMPLE = "small sample"
SPEEDUP_ABOVE = "speedup above acceptance length"


def report_notes(summary: dict, since=None, until=None, created_at=None) -> dict[str, str]:
    """The marks the report's summary calls for, each with what it means, as the HTML report's notices say them
    (telemetry.report_html.render_html): its period had not ended when it was written (`period_complete` False,
    or for a summary written before it held the flag, the report row's `created_at` before `until`: its figures
    cover part of it, or, written before the period began (`since`), what was recorded for it before it began),
    some of its runs are the synthetic data generator's (`synthetic`: not measurements), too few requests for
    stable figures (`small_sample`, `cost`'s caveat), a speedup above its mean acceptance length (`speedups[i]`'s
    `speedup_warning`: the AR timing was inflated); a summary without those flags is marked for none."""
    from telemetry.queries import as_utc

    def utc(value):  # the row's times: naive on SQLite (UTC); the summary's: ISO text with its offset
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value)
            except ValueError:
                return None
        return as_utc(value, "time") if isinstance(value, datetime) else None

    notes = {}
    written = utc(summary.get("generated_at")) or utc(created_at)
    complete = summary.get("period_complete")
    if complete is None and written is not None and utc(until) is not None:
        complete = utc(until) <= written  # as report.period_complete
    if complete is False:
        started = written is None or utc(since) is None or written > utc(since)
        notes[PARTIAL_PERIOD] = (f"written before its period {'ended' if started else 'began'}: its figures cover "
                                 + ("only the part that had passed" if started else
                                    "only what was recorded for it before it began")
                                 + "; written again after the period ends, the report gives other numbers")
    if summary.get("synthetic"):
        notes[SYNTHETIC_DATA] = (f"{summary['synthetic']} of its runs were made by the benchmark generator "
                                 f"(workload '{SYNTHETIC_WORKLOAD}', host '{SYNTHETIC_HOSTNAME}'); their figures "
                                 "are not measurements")
    if summary.get("small_sample"):
        notes[SMALL_SAMPLE] = str(summary["small_sample"])
    # a speedup above its spec runs' mean acceptance length (`speedups[i]["speedup_warning"]`, as `report` warns and
    # its page says above the tiles): the speedup and the savings resting on it cannot be, the AR timing was inflated
    speedups = summary.get("speedups") or []
    above = [sp for sp in speedups if sp.get("above_acceptance_length") or sp.get("speedup_warning")]
    if above:
        several = len(speedups) > 1
        notes[SPEEDUP_ABOVE] = "; ".join(
            (f"{sp.get('workload')}, concurrency {sp.get('concurrency')}, {sp.get('drafter')}: " if several else "")
            + (sp.get("speedup_warning") or "its speedup is above its spec runs' mean acceptance length, which no "
                                            "speedup can exceed")
            for sp in above) + ("; the projected node counts and savings rest on it"
                                 if ((summary.get("projection") or {}).get("assumptions") or {})
                                 .get("speedup_above_acceptance_length") else "")
    return notes


def period_name(period: str, since, until) -> str:
    """The report's period as the list shows it: 'monthly October 2026' for a calendar month, else its name."""
    from telemetry.report import Window

    month = Window(period, since, until).month_text() if period == "monthly" else None  # naive times: UTC
    return period if month is None else f"{period} {month}"


def energy_basis(mode: dict | None) -> str | None:
    """What a report's $/1M of one mode holds of energy, beside the figure (an estimate is said wherever it
    shows): 'measured', 'estimated', 'partly estimated', or 'hardware only' (no energy in it); None where the
    summary does not say (a mode without runs, a summary written before it did)."""
    if not mode or mode.get("total_usd_per_1m") is None or "energy_included" not in mode:
        return None
    if not mode["energy_included"]:
        return "hardware only"
    return mode.get("energy_source") or ("estimated" if mode.get("energy_estimated") else "measured")


def _downloads(r: dict) -> None:
    """The report's page and its CSV files, each offered where it is on this machine (one missing file
    does not hide the others)."""
    html = Path(r["html_path"]) if r["html_path"] else None
    if html is None or not html.is_file():
        where = r["html_path"] or "(still being written)"
        st.warning(md_safe(f"The report page is not on this machine: {where}"))
    else:
        st.download_button("Download report (HTML, opens offline)", data=lambda: html.read_bytes(),
                           file_name=f"specfinops-report-{r['id']}.html", mime="text/html",
                           key=f"dl_report_{r['id']}", on_click="ignore")  # fmt: skip
    csv_dir = Path(r["csv_dir"]) if r["csv_dir"] else None
    csvs = sorted(csv_dir.glob("*.csv")) if csv_dir is not None and csv_dir.is_dir() else []
    if not csvs:
        where = r["csv_dir"] or "(none recorded)"
        st.warning(md_safe(f"The report's CSV files are not on this machine: {where}"))
        return
    cols = st.columns(4)
    for i, path in enumerate(csvs):
        with cols[i % 4]:
            st.download_button(path.name, data=lambda p=path: p.read_bytes(), mime="text/csv",
                               file_name=f"report-{r['id']}-{path.name}", key=f"dl_report_{r['id']}_{path.stem}",
                               on_click="ignore")  # fmt: skip


def _pick_text(r: dict) -> str:
    """'#3 daily from 2026-11-02 00:00'; a month by its name alone, '#9 monthly October 2026'."""
    month = r["period"].startswith("monthly ")
    return f"#{r['id']} {r['period']}" + ("" if month else f" from {r['since']:%Y-%m-%d %H:%M}")


def body(ctx: Context) -> None:
    rows = reports(ctx.url)
    if not rows:
        st.info("No reports yet. Write one for yesterday, or schedule them (every day at 06:00 UTC here):")
        st.code(f"{on_store(REPORT_COMMAND, ctx.url)}\n{on_store(SCHEDULE_COMMAND, ctx.url)}", language="bash")
        return
    table = pd.DataFrame([{k: v for k, v in r.items() if k not in ("html_path", "csv_dir", "notes")} for r in rows])
    st.subheader(f"Reports ({len(rows)})")
    show_table(table, money=("spec $/1M", "AR $/1M"))
    by_id = {r["id"]: r for r in rows}
    rid = st.selectbox("Report", list(by_id), key="report_pick",
                       format_func=lambda i: _pick_text(by_id[i]))
    r = by_id[rid]
    for mark, meaning in r["notes"].items():
        st.warning(md_safe(f"Report #{r['id']}: {mark}: {meaning}."))
    if r["delivery"] in ("failed", "partially delivered"):
        st.error(md_safe(f"Delivery {r['delivery']}: {r['delivery error']}"))
    _downloads(r)
    st.caption("Reports are written by `specfinops report` and `specfinops scheduler`; their figures come from the "
               "same queries as this dashboard and `specfinops cost`.")  # fmt: skip


run_page("Reports", body, "Cost reports (HTML + CSV) of past periods, with their delivery status. The sidebar "
                          "filters do not apply here: each report holds the figures of its own period.",
         filtered=False)

"""Latency: TTFT, TPOT and inter-token latency distributions and percentiles, over time, spec vs AR."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.dashboard import charts, data
from app.dashboard.common import Context, download_csv, fmt, run_page, show_left_out, show_table
from app.dashboard.page_queries import bucket_label, histogram_percentiles

PCT_COLUMNS = tuple(f"p{q} (ms)" for q in (50, 95, 99))


def _percentile_table(ttft: dict, tpot: dict, itl: dict) -> pd.DataFrame:
    """The percentiles as numbers (None where a mode has none): the CSV's figures."""
    rows = []
    for metric, table in (("TTFT", ttft), ("TPOT", tpot), ("ITL", itl)):
        for mode in ("spec", "ar"):
            p = table.get(mode)
            rows.append({"metric": metric, "mode": charts.MODE_NAMES[mode],
                         **{col: (p.get(q) if p else None) for col, q in zip(PCT_COLUMNS, (50, 95, 99),
                                                                             strict=True)}})
    return pd.DataFrame(rows)


def _shown(table: pd.DataFrame) -> pd.DataFrame:
    """The table as the page shows it: 0.1 ms, "—" where missing."""
    return table.assign(**{c: [fmt(v, ".1f") for v in table[c]] for c in PCT_COLUMNS})


def body(ctx: Context) -> None:
    f = ctx.sel.filters
    show_left_out(ctx)  # a mode's figures read "—" below: say where its runs are, as the Overview does
    hists = data.latency_histograms(ctx.url, f)
    itl = data.itl_histogram(ctx.url, f)
    ttft_h, tpot_h = hists[hists["metric"] == "ttft"], hists[hists["metric"] == "tpot"]
    exact = data.latency_percentiles(ctx.url, f)
    table = _percentile_table(exact.get("ttft", {}), exact.get("tpot", {}), histogram_percentiles(itl.frame, "itl_ms"))

    st.subheader("Percentiles")
    show_table(_shown(table))
    notes = ["TTFT and TPOT over requests, ITL over emissions (tokens of one decode step arrive together and "
             "count once, so a speculative step's gap covers all the tokens it emitted: per token, read TPOT); "
             "TTFT and TPOT percentiles are the Overview's (interpolated over the requests' values); ITL's are "
             "read from 0.1 ms buckets (within 0.05 ms)."]
    if itl.stride > 1:
        notes.append(f"ITL from a deterministic sample: 1 request in {itl.stride} "
                     f"({itl.total_tokens:,} output tokens in view).")
    st.caption(" ".join(notes))
    download_csv("Download percentiles (CSV)", table, "latency-percentiles.csv", "dl_lat_pct")

    c1, c2, c3 = st.columns(3)
    c1.plotly_chart(charts.histogram(ttft_h, "value_ms", "TTFT distribution", "TTFT (ms)"), width="stretch")
    c2.plotly_chart(charts.histogram(tpot_h, "value_ms", "TPOT distribution", "TPOT (ms)"), width="stretch")
    c3.plotly_chart(charts.histogram(itl.frame, "itl_ms", "Inter-token latency, per emission", "ITL (ms)"),
                    width="stretch")

    st.subheader("Over time")
    over = data.latency_over_time(ctx.url, f, ctx.sel.bucket_s)
    if over.empty:
        st.info("No requests with latency figures in view.")
        return
    bucket = bucket_label(ctx.sel.bucket_s)
    c1, c2 = st.columns(2)
    gap = ctx.sel.bucket_s
    c1.plotly_chart(charts.lines_by_mode(over, "ttft_mean_ms", f"Mean TTFT per {bucket}", "TTFT (ms)", gap),
                    width="stretch")
    c2.plotly_chart(charts.lines_by_mode(over, "tpot_mean_ms", f"Mean TPOT per {bucket}", "TPOT (ms)", gap),
                    width="stretch")
    download_csv("Download latency over time (CSV)", over, "latency-over-time.csv", "dl_lat_time")


run_page("Latency", body, "Time to first token, time per output token and inter-token latency: spec vs AR baseline.")

"""Energy: power per device over time (measured solid, estimated dashed), J/token per mode."""

from __future__ import annotations

import streamlit as st

from app.dashboard import charts, data
from app.dashboard.common import SHOWN_RUN_IDS, Context, download_csv, run_page, show_left_out
from telemetry.costing import PARTLY_ESTIMATED, energy_source, energy_sources_text
from telemetry.labels import j_per_token_text


def body(ctx: Context) -> None:
    f = ctx.sel.filters
    show_left_out(ctx)  # a mode's figures read "—" below: say where its runs are, as the Overview does
    modes = {m.mode: m.stats for m in data.mode_summaries(ctx.url, f)}
    runs = data.run_summaries(ctx.url, f)
    cols = st.columns(2)
    for col, mode in zip(cols, ("spec", "ar"), strict=True):
        s = modes.get(mode)
        est = bool(s and s.energy_estimated)
        # in the Overview's words: partly estimated where runs of both kinds are pooled, and which they are
        mine = [r for r in runs if r.mode == mode]
        partly = est and energy_source(mine) == PARTLY_ESTIMATED
        col.metric(f"J/token — {charts.MODE_NAMES[mode]}"
                   + (" (partly estimated)" if partly else " (estimate)" if est else ""),
                   j_per_token_text(s.j_per_token if s else None),
                   help="Energy attributed to requests / their output tokens."
                        + (f" Power partly estimated: {energy_sources_text(mine, SHOWN_RUN_IDS)}." if partly
                           else " Estimated from a power model, not a meter." if est else ""))
        if s and s.energy_j is not None and not s.energy_complete:
            col.caption("Some requests have no energy figure; J/token covers those that do.")

    power = data.power_over_time(ctx.url, f, ctx.sel.bucket_s)
    if power.empty:
        st.info("No power samples in view. A run records power only where a source was open: `--power auto` "
                "(the default) tries NVML, then RAPL, and records none where neither can be read (as on most "
                "VMs). Record with `--power nvml` on a GPU node, `--power rapl` where /sys/class/powercap is "
                "readable, or `--power estimate --tdp-w W` for a TDP figure that every view labels as an "
                "estimate (`bench` and `serve` take these options).")
        return
    st.plotly_chart(charts.power(power, ctx.sel.bucket_s), width="stretch")
    if (power["source"] == "estimate").any():
        st.caption("Estimated power (TDP-based power model, no meter) is drawn dashed with hollow markers and named "
                   "'estimate' in the legend: treat it as approximate.")
    download_csv("Download power over time (CSV)", power, "power-over-time.csv", "dl_power")


run_page("Energy", body, "Power per device and energy per output token. Estimated power is always marked as an estimate.")

"""Speculation: acceptance per domain (rate and alpha vs 0.65), over time, by draft position and along the answer; K."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.dashboard import charts, data
from app.dashboard.common import Context, download_csv, fmt, left_out_text, md_safe, run_page
from app.dashboard.page_queries import bucket_label, with_rates
from telemetry.calibration import ANSWER_SPAN


def _no_acceptance_text(ctx: Context) -> str:
    """Why there is no acceptance to show: the speculative runs in view drafted nothing the sidebar keeps, its
    filters leave out the store's speculative runs (as the Overview says it), or the store has none."""
    if (ctx.sel.runs["mode"] == "spec").any():
        return ("No drafting steps in view: the speculative runs in view have no requests in the sidebar's domain "
                "and time range, or completed none (the Runs page shows their status).")
    left_out = left_out_text(ctx, "spec")
    if left_out:
        return f"No speculative runs in view: {left_out} to see their acceptance."
    return "No speculative runs in view: acceptance needs `--mode spec` or `--mode both` runs."


def body(ctx: Context) -> None:
    f = ctx.sel.filters
    domains = data.acceptance_by_domain(ctx.url, f)
    over = data.acceptance_over_time(ctx.url, f, ctx.sel.bucket_s)
    if over.empty and not domains:
        st.info(md_safe(_no_acceptance_text(ctx)))
        return

    total = with_rates(pd.DataFrame([over[["drafts", "drafted", "accepted"]].sum()]))
    m = st.columns(3)
    m[0].metric("Acceptance rate", fmt(total["acceptance_rate"].iloc[0], ".1%"), help="accepted / drafted tokens")
    m[1].metric("Mean acceptance length", fmt(total["mean_acceptance_length"].iloc[0], ".2f"),
                help="1 + accepted / drafts: tokens emitted per target forward, bonus included")
    m[2].metric("Mean K proposed", fmt(total["mean_k"].iloc[0], ".2f"), help="drafted tokens / drafts")

    st.subheader("Acceptance per domain")
    names = [d.domain or "(none)" for d in domains]
    st.plotly_chart(charts.alpha_by_domain(names, [d.acceptance_rate for d in domains],
                                           [d.num_requests for d in domains], [d.alpha for d in domains]),
                    width="stretch")
    below = [f"{n} ({d.go_figure_name} {charts.go_text(d.go_figure)})" for n, d in zip(names, domains, strict=True)
             if d.meets_go_line(charts.GO_NO_GO_ALPHA) is False]
    if below:
        st.caption(f"Below the {charts.GO_NO_GO_ALPHA} go/no-go line: {md_safe(', '.join(below))}. The line judges "
                   "alpha where steps were recorded, as `specfinops calibrate` does; it is the usual rule of thumb for "
                   "choosing a draft. Whether speculation pays here is the measured speedup on the Overview, "
                   "which the cost figures use.")
    if any(d.alpha is not None for d in domains):
        st.caption("Bars: acceptance rate = accepted / drafted tokens. Diamonds: alpha = accepted / tested, "
                   "where a step tests its accepted drafts and the first rejected one (the drafts after a "
                   "rejection are never tested): the per-token acceptance `specfinops calibrate` reports and "
                   "its speedup bound uses. Alpha is the higher of the two whenever steps stop at a rejection "
                   "before K.")
    table = pd.DataFrame([{"domain": n, "requests": d.num_requests, "drafts": d.num_drafts,
                           "drafted": d.num_draft_tokens, "accepted": d.num_accepted_tokens,
                           "acceptance rate": d.acceptance_rate, "tested": d.num_tested_tokens, "alpha": d.alpha,
                           "mean acceptance length": d.mean_acceptance_length}
                          for n, d in zip(names, domains, strict=True)])
    download_csv("Download acceptance per domain (CSV)", table, "acceptance-by-domain.csv", "dl_spec_domain")

    st.subheader("Over time")
    pooled = with_rates(over.groupby("t", as_index=False)[["drafts", "drafted", "accepted"]].sum())
    bucket = bucket_label(ctx.sel.bucket_s)  # named in each title, as the Latency page's charts name theirs
    c1, c2 = st.columns(2)
    # no go/no-go line here: it judges alpha (accepted / tested, the chart per domain above), and accepted /
    # drafted sits below alpha wherever a step stops at a rejection before K: every point read "NO-GO"
    c1.plotly_chart(charts.lines_by(pooled.assign(series="acceptance rate"), "acceptance_rate", "series",
                                    f"Acceptance rate per {bucket}", "accepted / drafted", bucket_s=ctx.sel.bucket_s,
                                    colour=charts.MODE_COLOURS["spec"], percent=True),
                    width="stretch")
    c2.plotly_chart(charts.lines_by(pooled.assign(series="mean acceptance length"), "mean_acceptance_length",
                                    "series", f"Mean acceptance length per {bucket}", "tokens per target forward",
                                    bucket_s=ctx.sel.bucket_s, colour=charts.MODE_COLOURS["spec"]),
                    width="stretch")
    st.plotly_chart(charts.lines_by(over, "mean_k", "k_policy", f"Mean K proposed per {bucket} (per drafting step)",
                                    "K", bucket_s=ctx.sel.bucket_s), width="stretch")

    st.subheader("Acceptance by draft position")
    pos = data.acceptance_by_position(ctx.url, f)
    if pos.empty:
        st.info("No speculative decode steps recorded in view.")
    else:
        st.plotly_chart(charts.acceptance_by_position(pos), width="stretch")
        st.caption("Position i is accepted when the step accepted at least i drafts; counted among steps that "
                   "proposed K >= i.")
        download_csv("Download acceptance by position (CSV)", pos, "acceptance-by-position.csv", "dl_spec_pos")

    st.subheader("Acceptance along the answer")
    spans = data.acceptance_along_answer(ctx.url, f)
    along = spans.frame
    if along.empty:
        st.info("No speculative decode steps recorded in view.")
    else:
        st.plotly_chart(charts.acceptance_along_answer(along), width="stretch")
        sampled = (f" Sampled: one request in {spans.stride} of those with {spans.total_drafts:,} drafting steps."
                   if spans.stride > 1 else "")
        st.caption(f"Drafting steps grouped by the output token they started at, {ANSWER_SPAN} tokens a span. "
                   "Acceptance that climbs along the answer usually means the answers repeat text (copies of "
                   "the prompt, or a small target looping), which prompt lookup accepts whatever the draft: "
                   "longer answers then measure more. `specfinops calibrate` shows the repeated share per span."
                   + sampled)
        download_csv("Download acceptance along the answer (CSV)", along, "acceptance-along-answer.csv",
                     "dl_spec_along")


run_page("Speculation", body, "How often the target accepts the drafter's tokens, where in the draft, and which K was used.")

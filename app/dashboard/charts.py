"""Plotly figures for the dashboard. Pure functions: small frames in, figures out.

Spec and AR always have the same colours; anything estimated (power, energy) is dashed or hatched and
says "estimate" in its legend name.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from app.dashboard.page_queries import bucket_label
from telemetry.finops import sla_steps, step_starts
from telemetry.labels import chart_text, clear_of_line, line_in_legend, usd_amount
from telemetry.labels import go_text as labels_go_text
from telemetry.palette import ENERGY_COLOUR, HARDWARE_COLOUR, MODE_COLOURS
from telemetry.queries import GO_LINE

MODE_NAMES = {"spec": "speculative", "ar": "AR baseline"}
GO_NO_GO_ALPHA = GO_LINE
HEIGHT = 340
COST_HEADROOM = 1.12  # the cost chart's y axis runs to this times its tallest bar: room for the labels above it


def go_text(value: float | None, line: float = GO_NO_GO_ALPHA, decimals: int = 2) -> str:
    """labels.go_text against the go/no-go line: 81/125 = 0.648 reads "0.648", not "0.65"."""
    return labels_go_text(value, line, decimals)


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    fig.update_layout(
        title=title, xaxis_title=x, yaxis_title=y, height=HEIGHT, margin=dict(l=10, r=10, t=50, b=10),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0), template="plotly_white",
    )
    return fig


def _nice_width(span: float, bins: int = 50) -> float:
    raw = max(span, 0.1) / bins
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def histogram(hist: pd.DataFrame, value_col: str, title: str, x_title: str) -> go.Figure:
    """Bars per mode from a fine-bucketed (mode, value, count) frame, rebinned to about 50 bins up to p99.5."""
    fig = go.Figure()
    if hist.empty:  # no axes running from -1 to 4 over nothing: say so where the bars would be
        fig.add_annotation(text="no requests with this figure in view", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper", font=dict(color="#6b7280"))
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        return _layout(fig, title, None, None)
    ordered = hist.sort_values(value_col)
    cum = ordered["count"].cumsum()
    hi = float(ordered.loc[cum >= 0.995 * cum.iloc[-1], value_col].iloc[0])
    lo = float(ordered[value_col].iloc[0])
    width = _nice_width(hi - lo)
    for mode in ("spec", "ar"):
        part = hist[hist["mode"] == mode]
        if part.empty:
            continue
        edges = (part[value_col].clip(upper=hi) // width) * width
        binned = part.groupby(edges)["count"].sum()
        fig.add_bar(x=binned.index + width / 2, y=binned / binned.sum(), width=width, name=MODE_NAMES[mode],
                    marker_color=MODE_COLOURS[mode], opacity=0.6)
    fig.update_layout(barmode="overlay")
    fig.update_yaxes(tickformat=".0%")
    return _layout(fig, title, x_title + " (last bar: p99.5 and above)", "share")


def broken_at_gaps(part: pd.DataFrame, y: str, bucket_s: float | None) -> tuple[list, list]:
    """x (the buckets' `t`) and y of one series, with a missing point after every bucket whose next one is
    more than `bucket_s` later: plotly breaks the line there instead of drawing a straight line across a
    stretch with no requests (which reads as data). None: no breaks."""
    part = part.sort_values("t")
    xs, ys = list(part["t"]), list(part[y])
    if bucket_s is None or len(xs) < 2:
        return xs, ys
    step = pd.Timedelta(seconds=bucket_s)
    out_x, out_y = [xs[0]], [ys[0]]
    for prev, x, v in zip(xs[:-1], xs[1:], ys[1:], strict=True):
        if pd.Timestamp(x) - pd.Timestamp(prev) > step:
            out_x.append(pd.Timestamp(prev) + step)
            out_y.append(None)
        out_x.append(x)
        out_y.append(v)
    return out_x, out_y


def lines_by_mode(frame: pd.DataFrame, y: str, title: str, y_title: str, bucket_s: float | None = None) -> go.Figure:
    """One line per mode over time buckets of `bucket_s` seconds (broken where buckets are empty)."""
    fig = go.Figure()
    for mode in ("spec", "ar"):
        part = frame[frame["mode"] == mode]
        if not part.empty:
            xs, ys = broken_at_gaps(part, y, bucket_s)
            fig.add_scatter(x=xs, y=ys, mode="lines+markers", name=MODE_NAMES[mode],
                            line=dict(color=MODE_COLOURS[mode]))
    return _layout(fig, title, "time (UTC)", y_title)


def lines_by(frame: pd.DataFrame, y: str, group: str, title: str, y_title: str, hline: float | None = None,
             hline_label: str = "", bucket_s: float | None = None, colour: str | None = None,
             percent: bool = False) -> go.Figure:
    """One line per value of `group` over time buckets of `bucket_s` seconds (broken where buckets are empty).
    `colour` for a single series that belongs to one mode; `percent` for a share on the y axis."""
    fig = go.Figure()
    for key, part in frame.groupby(group, sort=True):
        xs, ys = broken_at_gaps(part, y, bucket_s)
        fig.add_scatter(x=xs, y=ys, mode="lines+markers", name=chart_text(key),
                        line={"color": colour} if colour else None)
    if hline is not None:
        fig.add_hline(y=hline, line_dash="dot", line_color="#dc2626", annotation_text=hline_label)
    if percent:
        fig.update_yaxes(tickformat=".0%")
    return _layout(fig, title, "time (UTC)", y_title)


def paired_speedups(frame: pd.DataFrame) -> go.Figure:
    """Each bench's or load test's own speedup (spec tokens/s / AR tokens/s within it) at its start, one line per
    configuration (`frame`: started_at, speedup, configuration, invocation), with the configuration's pooled
    figure dashed in the same colour and break-even (1x) dotted: drift, or a slow invocation, shows where the
    pooled figure alone would hide it."""
    fig = go.Figure()
    palette = ["#2563eb", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#65a30d", "#475569"]
    for i, (config, part) in enumerate(frame.sort_values("started_at").groupby("configuration", sort=True)):
        colour = palette[i % len(palette)]
        pooled = part["pooled"].iloc[0]
        known = pooled is not None and pooled == pooled
        # the pooled figure in the legend, not as a label on its line: two configurations' labels at 2.07x and
        # 2.04x were drawn over each other
        fig.add_scatter(x=part["started_at"], y=part["speedup"], mode="lines+markers",
                        name=f"{chart_text(config)} (pooled {pooled:.2f}x)" if known else chart_text(config),
                        line=dict(color=colour), customdata=part["invocation"],
                        hovertemplate="invocation %{customdata}<br>%{x|%Y-%m-%d %H:%M} UTC<br>%{y:.2f}x"
                                      "<extra></extra>")
        if known:  # the pooled figure of every run of the configuration in view
            fig.add_hline(y=pooled, line_dash="dash", line_color=colour, opacity=0.5)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#6b7280", annotation_text="break-even",
                  annotation_position="bottom right")
    fig.update_yaxes(rangemode="tozero", ticksuffix="x")
    _layout(fig, "Speedup per invocation (each bench or load test's own; dashed: pooled)", "invocation start (UTC)",
            "spec / AR tokens/s")
    # configurations' names are long: the legend goes under the chart, where it covers neither the title nor
    # the lines, one entry a row
    fig.update_layout(legend=dict(orientation="v", yanchor="top", y=-0.25, xanchor="left", x=0.0),
                      height=HEIGHT + 40 * frame["configuration"].nunique(), margin=dict(b=40))
    return fig


def acceptance_by_position(frame: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    # labels above the bars, so a position where nothing was accepted still reads 0% (inside a bar of height
    # zero it was not drawn); each tick says how many drafts reached the position: deep positions rest on few
    fig.add_bar(x=frame["position"], y=frame["rate"], marker_color=MODE_COLOURS["spec"],
                text=[f"{r:.0%}" if r == r and r is not None else "—" for r in frame["rate"]],
                textposition="outside", cliponaxis=False,
                customdata=frame["offered"], hovertemplate="position %{x}: %{y:.1%} of %{customdata:,} drafts")
    fig.update_yaxes(tickformat=".0%", range=[0, 1.08])
    fig.update_xaxes(tickvals=list(frame["position"]),
                     ticktext=[f"{p}<br>n={n:,}" for p, n in zip(frame["position"], frame["offered"], strict=True)])
    return _layout(fig, "Acceptance by draft position", "draft position i (accepted when accepted >= i)",
                   "accepted share")


def acceptance_along_answer(frame: pd.DataFrame) -> go.Figure:
    """Acceptance rate per span of the answer where the drafting steps started."""
    spans = [f"{int(a)}-{int(b) - 1}" for a, b in zip(frame["start"], frame["end"], strict=True)]
    labels = [f"{span}<br>n={int(n):,}" for span, n in zip(spans, frame["steps"], strict=True)]  # n: drafting steps
    fig = go.Figure()
    fig.add_bar(x=labels, y=frame["acceptance_rate"], marker_color=MODE_COLOURS["spec"],
                text=[f"{r:.0%}" for r in frame["acceptance_rate"]], textposition="outside", cliponaxis=False,
                customdata=list(zip(frame["steps"], frame["mean_acceptance_length"], frame["alpha"], spans,
                                    strict=True)),
                hovertemplate="output tokens %{customdata[3]}: acceptance %{y:.1%} over %{customdata[0]:,} steps, "
                              "mean acceptance length %{customdata[1]:.2f}, alpha (accepted / tested) "
                              "%{customdata[2]:.3f}<extra></extra>")
    fig.update_yaxes(tickformat=".0%", range=[0, 1.08])  # room for a label above a full bar
    return _layout(fig, "Acceptance along the answer", "output tokens where the step started", "accepted share")


def alpha_by_domain(domains: list[str], rates: list[float | None], requests: list[int],
                    alphas: list[float | None] | None = None) -> go.Figure:
    """Acceptance rate bars per domain against the 0.65 go/no-go line (a domain without drafts is shown as
    missing), with alpha (accepted / tested, calibrate's per-token figure) as a marker where steps exist.
    A bar is green or red by what the line judges: the domain's alpha where it has one, as calibrate."""
    domains = [chart_text(d) for d in domains]
    judged = [r if alphas is None or alphas[i] is None else alphas[i] for i, r in enumerate(rates)]
    colors = ["#9ca3af" if a is None else ("#16a34a" if a >= GO_NO_GO_ALPHA else "#dc2626") for a in judged]
    fig = go.Figure()
    # the rate at the foot of its bar, the alpha above or below its diamond away from the line, and the line
    # named in the legend: at the top of a bar, beside a diamond or on the line they were struck through by it
    fig.add_bar(x=domains, y=rates, marker_color=colors, name="acceptance rate (accepted / drafted)",
                text=[go_text(a) for a in rates], insidetextanchor="start", customdata=requests,
                hovertemplate="%{x}: acceptance rate %{text} over %{customdata:,} requests<extra></extra>")
    if alphas is not None and any(a is not None for a in alphas):
        fig.add_scatter(x=domains, y=alphas, mode="markers+text", name="alpha (accepted / tested)",
                        marker=dict(symbol="diamond", size=13, color="#111827"),
                        text=["" if a is None else go_text(a) for a in alphas],
                        textposition=clear_of_line(alphas, GO_NO_GO_ALPHA), cliponaxis=False,
                        customdata=["" if a is None else go_text(a, decimals=3) for a in alphas],
                        hovertemplate="%{x}: alpha %{customdata} (accepted / tested, as calibrate)<extra></extra>")
    line_in_legend(fig, GO_NO_GO_ALPHA, f"go/no-go line {GO_NO_GO_ALPHA}", "#111827")
    _mark_missing(fig, domains, rates, "— no drafts")
    fig.update_yaxes(range=[0, 1.1], tickvals=[0, 0.2, 0.4, 0.6, 0.8, 1])  # headroom: a label over 1
    return _layout(fig, "Acceptance per domain", "domain", "share of drafted tokens accepted")


def _mark_missing(fig: go.Figure, xs: list, ys: list, text: str) -> None:
    """A missing value is not a zero bar: say it is missing where its bar would be."""
    for x, y in zip(xs, ys, strict=True):
        if y is None:
            fig.add_annotation(x=x, y=0, yref="y", text=text, showarrow=False, yshift=12, font=dict(color="#6b7280"))


def power(frame: pd.DataFrame, bucket_s: float | None = None) -> go.Figure:
    """Power per node/device over time: measured solid and named by its source (nvml, rapl), estimated dashed
    and named 'estimate' (once); broken where buckets of `bucket_s` seconds hold no sample (no run was
    sampling)."""
    fig = go.Figure()
    for (node, dev, source), part in frame.groupby(["node_id", "device_index", "source"], sort=True):
        estimated = source == "estimate"
        name = f"{chart_text(node)} · device {dev} · {'estimate' if estimated else chart_text(source)}"
        xs, ys = broken_at_gaps(part, "power_w", bucket_s)
        fig.add_scatter(x=xs, y=ys, mode="lines+markers", name=name,
                        line=dict(dash="dash" if estimated else "solid", width=2 if estimated else 1.5),
                        marker=dict(symbol="circle-open" if estimated else "circle", size=7),
                        opacity=0.8 if estimated else 1.0)
    # the bucket named as the other pages' charts over time name theirs ("per 5 min"), not "per time bucket"
    per = bucket_label(int(bucket_s)) if bucket_s else "time bucket"
    _layout(fig, f"Power per device (mean per {per})", "time (UTC)", "power (W)")
    # the legend even for one line (plotly hides a lone trace's): it is where an estimate says it is one
    fig.update_layout(height=HEIGHT + 80, legend=dict(orientation="h", yanchor="top", y=-0.25, xanchor="left", x=0),
                      showlegend=True)
    return fig


def cost_split(modes: list[str], hardware: list[float | None], energy: list[float | None],
               energy_estimated: list[bool], partly: list[bool] | None = None) -> go.Figure:
    """Cost per 1M tokens stacked: hardware, then energy (hatched and labelled when estimated; `partly`: a mode
    whose energy pools estimated and metered runs, labelled so, as the Overview's tiles say it)."""
    names = [MODE_NAMES.get(m, m) for m in modes]
    partly = partly or [False] * len(modes)
    kinds = ["estimate" if est and not part else "partly estimated" if est else "measured"
             for est, part in zip(energy_estimated, partly, strict=True)]
    fig = go.Figure()
    fig.add_bar(x=names, y=hardware, name="hardware (node $/h x hours)", marker_color=HARDWARE_COLOUR,
                text=[usd_amount(h) for h in hardware])
    for kind in ("measured", "partly estimated", "estimate"):
        ys = [e if (e is not None and k == kind) else None for e, k in zip(energy, kinds, strict=True)]
        if all(y is None for y in ys):
            continue
        fig.add_bar(x=names, y=ys, name=f"energy ({kind})",
                    marker=dict(color=ENERGY_COLOUR, pattern_shape="" if kind == "measured" else "/"),
                    text=[None if y is None else usd_amount(y) for y in ys])
    # the legend names the parts even when hardware is the only one (plotly hides a lone trace's legend)
    fig.update_layout(barmode="stack", showlegend=True)
    # headroom over the tallest bar: a thin energy part's label sits above its bar, and plotly's own range
    # ends at the bar's top, where the plot edge and the legend clipped the label
    tops = [(h or 0) + (e or 0) for h, e in zip(hardware, energy, strict=True)]
    if max(tops, default=0) > 0:
        fig.update_yaxes(range=[0, COST_HEADROOM * max(tops)])
    _mark_missing(fig, names, hardware, "— no cost (no tokens or wall time)")
    return _layout(fig, "Cost per 1M output tokens", "", "USD per 1M tokens")


def nodes_bar(nodes_ar: int | None, nodes_spec: int | None, modes_in_view: set[str] | None = None,
              sla_ms: float | None = None) -> go.Figure:
    """Nodes per mode. A missing bar says why: no run of that mode in view, or none meets the SLA (`sla_ms`);
    where no mode has a node count, the chart says so across it. The axis counts whole nodes from 0 (with no
    bar at all plotly ran it from -1 to 1 in steps of 0.5)."""
    fig = go.Figure()
    unattainable = []
    for mode, n in (("ar", nodes_ar), ("spec", nodes_spec)):
        fig.add_bar(x=[MODE_NAMES[mode]], y=[n], name=MODE_NAMES[mode], marker_color=MODE_COLOURS[mode],
                    text=[None if n is None else str(n)])
        measured = modes_in_view is None or mode in modes_in_view
        if n is None and measured:
            unattainable.append(MODE_NAMES[mode])
        _mark_missing(fig, [MODE_NAMES[mode]], [n], "— not attainable at this SLA" if measured
                      else "— no runs of this mode in view")
    known = [n for n in (nodes_ar, nodes_spec) if n is not None]
    if not known and unattainable:
        sla = "the SLA" if sla_ms is None else f"the {sla_ms:g} ms p95 TPOT SLA"
        which = "configuration of either mode" if len(unattainable) > 1 else f"{unattainable[0]} configuration"
        fig.add_annotation(text=f"{sla[0].upper()}{sla[1:]} is not attainable:<br>no measured {which} meets it",
                           x=0.5, y=0.6, xref="paper", yref="paper", showarrow=False,
                           font=dict(size=14, color="#b91c1c"))
    top = max(known, default=0)
    fig.update_yaxes(rangemode="nonnegative", tickformat=",d")  # whole nodes: no 0.5 tick
    if top <= 5:  # plotly's own ticks on a short axis fall on halves
        fig.update_yaxes(range=[0, max(top, 1) * 1.15], dtick=1)
    return _layout(fig, "Nodes needed at peak", "", "nodes")


def sweep(points: list[tuple], crossover: int | None, title: str) -> go.Figure:
    """Aggregate tokens/s against concurrency for both modes; the crossover marked."""
    fig = go.Figure()
    levels = [p[0] for p in points]
    for mode, col in (("ar", 1), ("spec", 2)):
        fig.add_trace(go.Scatter(x=levels, y=[p[col] for p in points], mode="lines+markers",
                                 name=MODE_NAMES[mode], line={"color": MODE_COLOURS[mode]}))
    if crossover is not None:
        fig.add_vline(x=crossover, line_dash="dot", line_color="#6b7280")
        # an annotation's x on a log axis is log10 of the value: add_vline's own label landed at 10^crossover,
        # over the legend, and stretched the axis far past the last level. Top left of the line, inside the
        # plot: throughput grows with concurrency, so the curves run low there
        fig.add_annotation(x=math.log10(crossover), y=1, yref="paper", text=f"crossover: {crossover}",
                           showarrow=False, xanchor="right", yanchor="top", xshift=-4, font={"color": "#6b7280"})
    fig.update_xaxes(type="log", tickvals=levels, ticktext=[str(v) for v in levels])
    return _layout(fig, title, "concurrent sequences", "tokens/s (all sequences)")


def nodes_by_sla(curve: list, chosen_sla: float) -> go.Figure:
    """Nodes per mode against the p95 TPOT SLA (finops.sla_curve's steps); the SLA in use marked. A gap
    means no measured configuration of that mode meets the SLA there. The last step is drawn on past the SLA
    in use (it holds for every looser SLA), without a marker: a mode's markers are where one of its measured
    configurations starts to meet the SLA (`step_starts`), not every point of the shared curve. The
    node axis starts at zero, so the gap between the modes reads in proportion."""
    fig = go.Figure()
    through = max(chosen_sla, curve[-1].sla_ms) * 1.1 if curve else chosen_sla
    steps = sla_steps(curve, through)
    slas = [p.sla_ms for p in steps]
    for mode in ("ar", "spec"):
        sizes = [8 if start else 0 for start in step_starts(steps, mode)]  # the extension repeats: no marker
        fig.add_trace(go.Scatter(x=slas, y=[getattr(p, f"nodes_{mode}") for p in steps], mode="lines+markers",
                                 line_shape="hv", name=MODE_NAMES[mode], line={"color": MODE_COLOURS[mode]},
                                 marker={"size": sizes}, connectgaps=False))
    # at the bottom, inside the plot: at the top the label ran into the legend when the SLA sat at the right
    fig.add_vline(x=chosen_sla, line_dash="dot", line_color="#6b7280",
                  annotation_text=f"SLA in use: {chosen_sla:g} ms", annotation_position="bottom left")
    fig.update_yaxes(rangemode="tozero")
    return _layout(fig, "Nodes needed by SLA", "p95 TPOT SLA (ms)", "nodes at peak")

"""One self-contained HTML page for a report: KPI cards, Plotly charts (plotly.js inlined once, no remote
scripts: the file opens offline), and the same tables the CSV files hold.

A missing figure reads "—", never 0; energy and J/token from an estimated power source say "(estimated)".
Every text that comes from the store is HTML-escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import plotly.graph_objects as go
import plotly.io as pio

from telemetry.costing import (
    ESTIMATED,
    FLEET_COST_FORMULA,
    FLEET_COST_LABEL,
    MEASURED,
    PARTLY_ESTIMATED,
    cost_basis_text,
    energy_sources_text,
    estimated_energy_modes,
    fleet_energy_text,
    incomplete_runs_text,
    runs_text,
)
from telemetry.finops import ms_apart, sla_steps, step_starts
from telemetry.labels import (
    chart_text,
    clear_of_line,
    go_text,
    j_per_token_text,
    line_in_legend,
    node_price_text,
    usd_amount,
)
from telemetry.palette import ENERGY_COLOUR, HARDWARE_COLOUR, MODE_COLOURS
from telemetry.queries import above_acceptance_lines, paired_text
from telemetry.report import (
    ALPHA_GO,
    NOT_CHECKED,
    NOT_ENDED,
    RATE_SO_FAR,
    TOTAL_BASIS,
    CostMetric,
    ReportData,
    Table,
    comparable_costs,
    cost_note,
    estimate_sources,
    lift_common,
    meets_sla,
    partial_energy,
    period_complete,
    projection_tpot,
    report_choose,
    time_text,
)

MISSING = "—"
SPEC_COLOUR, AR_COLOUR = MODE_COLOURS["spec"], MODE_COLOURS["ar"]  # the dashboard's too

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1180px;color:#111827}
h1{font-size:1.5rem;margin-bottom:.2rem} h2{font-size:1.15rem;margin-top:2rem}
.muted{color:#6b7280;font-size:.9rem} .cards{display:grid;grid-template-columns:repeat(4,1fr);gap:.8rem}
.card{border:1px solid #e5e7eb;border-radius:8px;padding:.7rem .9rem} .card .v{font-size:1.3rem;font-weight:600}
.card .k{color:#6b7280;font-size:.8rem} .card .s{color:#374151;font-size:.8rem}
table{border-collapse:collapse;font-size:.85rem;margin:.4rem 0} td,th{border:1px solid #e5e7eb;padding:.25rem .5rem}
th{background:#f9fafb;text-align:left} td.n{text-align:right;font-variant-numeric:tabular-nums}
.notice{background:#fef3c7;border:1px solid #f59e0b;border-radius:8px;padding:.7rem 1rem}
.bad{color:#b91c1c;font-weight:600} .ok{color:#15803d}
.charts{display:grid;grid-template-columns:1fr 1fr;gap:1rem}
.scroll{overflow-x:auto;max-width:100%}
@media print { .scroll { overflow: visible } }
"""


def fmt(value, spec: str = ",.3g") -> str:
    if value is None or (isinstance(value, float) and value != value):
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return format(value, spec)
    return str(value)


def usd(value: float | None) -> str:
    return usd_amount(value, MISSING)


def number(value: int | float) -> str:
    """A table's number, never in e-notation where a reader expects digits: 93,290 and 500,000,000, not
    9.329e+04 and 5e+08; four significant digits below 10,000."""
    if isinstance(value, int):
        return f"{value:,d}"
    if value != value:
        return MISSING
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:,.4g}"


def _esc(text) -> str:
    return html.escape(fmt(text), quote=True)


def _is_money(name) -> bool:
    text = str(name)
    return "$" in text or "usd" in text.lower()


def _is_id(name) -> bool:
    return str(name).lower() in ("id", "run", "run_id", "run id") or str(name).lower().endswith("_id")


# columns of a (figure, value)-shaped table whose number is in the unit its row names
_ROW_UNIT_COLUMNS = frozenset({"value", "this period", "previous period", "change", "band low", "band high"})


def _is_j_per_token(name) -> bool:
    """A J/token column, or a row's figure that is one ('spec J/token' in the change table)."""
    return str(name) == "J/token" or str(name).endswith(" J/token")


def _cell(value, *, money: bool = False, ident: bool = False, joules: bool = False, title: str | None = None) -> str:
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if not numeric:
        tip = "" if title is None else f' title="{html.escape(title, quote=True)}"'
        return f"<td{tip}>{html.escape(fmt(value))}</td>"
    # J/token as the card and the dashboard write it (labels.j_per_token_text: '1.50', not '1.5')
    text = (str(value) if ident else usd(value) if money else j_per_token_text(value, MISSING) if joules
            else number(value))
    return f'<td class="n">{html.escape(text)}</td>'


def _row_html(header: Sequence[str], row: Sequence, titles: Sequence[str | None] = ()) -> str:
    """Money as $93,290, counts with thousands separators: a column named in USD is money, and so is the
    value of a row whose figure (its first cell) is named in USD; J/token likewise, in three significant digits.
    `titles`: a cell's full text (hover)."""
    row_money = bool(row) and isinstance(row[0], str) and _is_money(row[0])
    row_joules = bool(row) and isinstance(row[0], str) and _is_j_per_token(row[0])
    cells = []
    for i, (name, value) in enumerate(zip(header, row, strict=False)):
        money = _is_money(name) or (row_money and name in _ROW_UNIT_COLUMNS)
        joules = _is_j_per_token(name) or (row_joules and name in _ROW_UNIT_COLUMNS)
        title = titles[i] if i < len(titles) else None
        cells.append(_cell(value, money=money, ident=_is_id(name), joules=joules, title=title))
    return "<tr>" + "".join(cells) + "</tr>"


def _html_view(t: Table) -> tuple[tuple[str, ...], list[tuple], list[tuple]]:
    """(header, rows, full texts) as the page shows them: `t.html_columns` in their order, each value through
    its `show`; the full text of a shortened value goes in its cell's title."""
    if not t.html_columns:
        return t.header, list(t.rows), [(None,) * len(t.header)] * len(t.rows)
    at = {name: i for i, name in enumerate(t.header)}
    rows, titles = [], []
    for row in t.rows:
        values = [row[at[c.source]] for c in t.html_columns]
        shown = [v if c.show is None else c.show(v) for c, v in zip(t.html_columns, values, strict=True)]
        rows.append(tuple(shown))
        titles.append(tuple(str(v) if isinstance(v, str) and v != s else None
                            for v, s in zip(values, shown, strict=True)))
    return tuple(c.header for c in t.html_columns), rows, titles


def table_html(t: Table) -> str:
    if not t.rows:
        return f"<h3>{html.escape(t.title)}</h3><p class='muted'>No rows in this period.</p>"
    t, common = lift_common(t)
    header, rows, titles = _html_view(t)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(_row_html(header, row, title) for row, title in zip(rows, titles, strict=True))
    # a table wider than the page (cost per run has ~20 columns) scrolls in its own box, not the whole page
    out = f"<h3>{html.escape(t.title)}</h3><div class='scroll'><table><tr>{head}</tr>{body}</table></div>"
    if common:  # the columns every row shares, said once (the CSV keeps them in every row)
        said = "; ".join(f"{name}: {fmt(value)}" for name, value in common)
        out += f"<p class='muted common'>In every row: {html.escape(said)}.</p>"
    return out


def _card(key: str, value: str, sub: str = "") -> str:
    return (f'<div class="card"><div class="k">{html.escape(key)}</div><div class="v">{html.escape(value)}</div>'
            f'<div class="s">{html.escape(sub)}</div></div>')  # fmt: skip


def _name(mode: str) -> str:
    return "AR" if mode == "ar" else "spec"


def _cost_text(data: ReportData, mode: str) -> tuple[str, str]:
    """The mode's cost per 1M tokens and what it holds (costing.cost_basis_text, which the e-mail writes too)."""
    mc = data.current.mode_costs.get(mode)
    if mc is None:  # no run of the mode, or none of its runs has a price (the note names them)
        return MISSING, cost_note(data.current, mode) if mode in data.current.modes else "no runs"
    c = mc.cost
    # the note is the cost's own reason, in the words of the Spec vs AR table and its CSV ("measured energy left
    # out: priced as other hardware than measured", "estimated energy for 1 of 2 runs: hardware only", ...)
    return usd(c.total_usd_per_1m), cost_basis_text(
        c.total_usd_per_1m, energy_included=c.energy_included, source=data.current.energy_source(mode),
        partial=partial_energy(data.current, mode), note=cost_note(data.current, mode),
        priced_over=data.current.priced_over(mode))


def _j_text(data: ReportData, mode: str) -> str:
    j = data.current.stat(mode, "j_per_token")
    if j is None:
        return f"{_name(mode)} {MISSING}"
    source = data.current.j_source(mode)
    labels = [source] if source in (ESTIMATED, PARTLY_ESTIMATED) else []
    if partial_energy(data.current, mode):
        labels.append("some requests only")
    return f"{_name(mode)} {j_per_token_text(j)} J" + (f" ({', '.join(labels)})" if labels else "")


def _ms(value: float | None) -> str:
    """'12.3 ms', or the missing mark alone (not '— ms')."""
    return MISSING if value is None else f"{value:.1f} ms"


def _tpot_text(data: ReportData, mode: str) -> str:
    """The p95 TPOT the projection judged against the SLA (its capacity configuration's, or the best of the
    compared group's where none meets it), as the savings beside it use; the pooled p95 without a projection."""
    if data.projection.projection is None:
        p95 = data.current.stat(mode, "tpot_p95_ms")
        verdict = {None: "", True: " (meets)", False: " (misses)"}[meets_sla(p95, data.sla_ms)]
        return f"{_name(mode)} {_ms(p95) if p95 is None else ms_apart(p95, data.sla_ms) + ' ms'}{verdict}"
    t = projection_tpot(data, mode)
    if t["projection_tpot_p95_ms"] is None:
        return f"{_name(mode)} {MISSING}"
    # to as many decimals as keep it on its side of the SLA: "misses (best 21.0 ms)" beside an SLA of 21 ms did not
    p95 = ms_apart(t["projection_tpot_p95_ms"], data.sla_ms)
    if not t["projection_meets_sla"]:
        return f"{_name(mode)} misses (best {p95} ms)"
    return f"{_name(mode)} {p95} ms (meets)"


def _tpot_sub(data: ReportData) -> str:
    """What the p95 TPOT card judges: the configurations the projection sizes (and which), with the p95 of all
    of each mode's requests pooled beside them where that is what the card shows otherwise."""
    pooled = " / ".join(f"{_name(m)} {_ms(data.current.stat(m, 'tpot_p95_ms'))}" for m in ("spec", "ar"))
    sp = data.projection.projection
    if sp is None:
        return "p95 over all of each mode's requests in the period"
    runs = "; ".join(f"{_name(m)} {runs_text(getattr(sp, f'capacity_runs_{m}'))}" for m in ("spec", "ar")
                     if getattr(sp, f"capacity_runs_{m}"))
    where = f" at {sp.comparison.label}" if sp.comparison is not None else ""
    return (f"p95 of the configuration the projected savings size each mode on{where}"
            + (f" ({runs})" if runs else "") + f"; all requests of the period pooled: {pooled}")


def _nodes(n: int) -> str:
    return f"{n:,} node" + ("" if n == 1 else "s")


def _savings_text(pr) -> str:
    """The savings tile's subtitle. On the period's own traffic (no --daily-tokens) it says so: a bench-filled
    store's few hundred tokens a day fit on one node in either mode, so the savings read $0 next to a 1.8x
    speedup."""
    formula = "nodes AR - nodes spec, x node $/h x 8,760 h"
    if not pr.measured_traffic:
        return formula
    p = pr.projection.projection
    if p.nodes_ar is not None and p.nodes_ar == p.nodes_spec:
        nodes = f"both modes fit on {_nodes(p.nodes_ar)}"
    else:
        nodes = (f"AR needs {MISSING if p.nodes_ar is None else _nodes(p.nodes_ar)}, "
                 f"spec {MISSING if p.nodes_spec is None else _nodes(p.nodes_spec)}")
    return (f"at {pr.daily_tokens:,.0f} output tokens/day, the period's own traffic, {nodes}; pass "
            "--daily-tokens for your traffic")


def _previous_text(data: ReportData, value: int) -> str:
    """A count tile's previous-period subtitle. A report on one invocation compares nothing (change_rows): the
    period before it holds none of its runs, so its count is missing there, not 0."""
    if data.current.window.invocation_id is not None:
        return f"previous period {MISSING} (not compared: one invocation's runs)"
    return f"previous period {value:,}"


def cards_html(data: ReportData) -> str:
    cur = data.current
    spec_cost, spec_sub = _cost_text(data, "spec")
    ar_cost, ar_sub = _cost_text(data, "ar")
    if len(data.speedups) == 1:
        (s,) = data.speedups
        speedup, speedup_sub = (MISSING if s.speedup is None else f"{s.speedup:.2f}x",
                                f"spec tokens/s / AR tokens/s at {s.label}; paired: {paired_text(s)}")
    else:
        outside = sum(s.pooled_outside_paired for s in data.speedups)
        speedup, speedup_sub = (MISSING, "no spec/AR pair") if not data.speedups else (
            f"{len(data.speedups)} configurations", "see the speedup table" + (
                f"; {outside} pooled outside the range of their paired invocations" if outside else ""))
    above = sum(bool(s.above_acceptance) for s in data.speedups)
    if above:
        speedup_sub = (f"{'above' if len(data.speedups) == 1 else f'{above} above'} the mean acceptance length of "
                       f"the spec runs, which no speedup can exceed: the AR timing was inflated (see the warning "
                       f"above); {speedup_sub}")
    alpha = cur.stat("spec", "acceptance_rate")
    pr = data.projection
    savings = usd(pr.projection.projection.annual_savings_usd) if pr.projection else MISSING
    savings_sub = _savings_text(pr) if pr.projection else (pr.reason or "")
    if pr.projection is not None and pr.projection.speedup_above_acceptance:
        savings_sub = ("overstated: rests on a speedup above the mean acceptance length (the AR timing was "
                       f"inflated; see the assumptions); {savings_sub}")
    cards = [
        _card("Output tokens", f"{cur.output_tokens():,}", _previous_text(data, data.previous.output_tokens())),
        _card("Requests", f"{cur.requests():,}", _previous_text(data, data.previous.requests())),
        _card("Cost per 1M tokens, spec (measured runs)", spec_cost, spec_sub),
        _card("Cost per 1M tokens, AR (measured runs)", ar_cost, ar_sub),
        _card("Speedup", speedup, speedup_sub),
        _card("Acceptance rate (spec)", fmt(alpha, ".1%"),
              f"accepted / drafted; the go/no-go line {ALPHA_GO:.2f} judges alpha per domain"),
        _card("J/token", " / ".join(_j_text(data, m) for m in ("spec", "ar")), "energy per output token"),
        _card(f"p95 TPOT vs SLA {data.sla_ms:g} ms", " / ".join(_tpot_text(data, m) for m in ("spec", "ar")),
              _tpot_sub(data)),
        _card("Projected annual savings", savings, savings_sub),
    ]  # fmt: skip
    return '<div class="cards">' + "".join(cards) + "</div>"


def energy_sources_html(data: ReportData) -> str:
    """Where the energy figures come from, when any of them was estimated: all from an estimated power source,
    or by mode, naming the runs of a mode that pools estimated and metered energy."""
    sources = {m: data.current.j_source(m) for m in ("spec", "ar")}
    known = {s for s in sources.values() if s is not None}
    if not known & {ESTIMATED, PARTLY_ESTIMATED}:
        return ""
    if known == {ESTIMATED}:
        return ("<p class='muted'>Energy (J/token and the energy part of the cost) comes from an "
                "<b>estimated</b> power source, not a power meter.</p>")
    by_mode = []
    for mode, source in sources.items():
        if source is None:
            continue
        runs = data.current.all_runs(mode)  # the J/token's runs, priced or not
        text = {ESTIMATED: "estimated (a power model, not a power meter)", MEASURED: "measured by a power meter",
                PARTLY_ESTIMATED: f"<b>partly estimated</b>: {html.escape(energy_sources_text(runs))}"}[source]
        by_mode.append(f"{_name(mode)} {text}")
    return ("<p class='muted'>Energy (J/token and the energy part of the cost) by mode: " + "; ".join(by_mode)
            + ". A partly estimated figure pools estimated and metered energy.</p>")


def pricing_html(data: ReportData) -> str:
    """What the report is priced at where prices were given (as `specfinops project` takes them), not the prices
    the runs recorded: said once at the top, as the figures of every section rest on them."""
    given = data.pricing.text()
    if given is None:
        return ""
    node = (" (--node-hourly-usd: the measured hardware's price per node-hour, its measured energy kept)"
            if data.pricing.node_hourly_usd is not None else "")
    per_node = (f"; the projection's node holds {data.pricing.gpus_per_node} GPUs, a run's cost is priced per GPU "
                "it ran on" if data.pricing.gpus_per_node != 1 else "")
    return (f"<p class='notice' id='priced-at'>Priced at <code>{html.escape(given)}</code>, not at the prices the "
            "runs recorded: every run's cost (this period's and those it is compared with) and the projection"
            f"{html.escape(node + per_node)}.</p>")


def assumptions_html(data: ReportData) -> str:
    pr = data.projection
    items = [
        (f"traffic: {pr.daily_tokens:,.0f} output tokens per day" if pr.daily_tokens is not None else "traffic: none")
        + f" ({pr.daily_tokens_basis})",
        f"peak-to-average factor {pr.peak_factor:g}",
        f"p95 TPOT SLA {pr.sla_ms:g} ms",
    ]
    if pr.projection is None:
        items.append(f"projection not computed: {pr.reason}")
    else:
        a = pr.projection.as_dict()["assumptions"]
        p = pr.projection.projection
        items += [
            "priced as " + node_price_text(a["priced_as"], a["node_hourly_usd"], pr.projection.node_price.origin == "flag")
            + (f" (given: {data.pricing.text()})" if data.pricing.text() else "")
            + (f", measured on {', '.join(a['measured_on'])}" if a["priced_differs_from_measured"] else ""),
            *([pr.projection.replica_note] if pr.projection.replica_note else []),
            *([pr.projection.comparison.text(report_choose(pr.projection.comparison))] if pr.projection.comparison is not None else []),
            f"capacity per node: {a['capacity_basis']}",
            f"{FLEET_COST_LABEL}: AR {usd(p.cost_per_1m_tokens_ar_usd)} ({fleet_energy_text(pr.projection, 'ar')}), "
            f"spec {usd(p.cost_per_1m_tokens_spec_usd)} ({fleet_energy_text(pr.projection, 'spec')}) "
            f"({FLEET_COST_FORMULA}); the cost per 1M tokens of the tiles and the Spec vs AR table is the "
            "measured one",
            f"energy: PUE {a['pue']:g}, ${a['usd_per_kwh']:g}/kWh ({a['energy_prices_from']})"
            + (f" (estimated power: {estimated})" if (estimated := estimated_energy_modes(pr.projection)) else ""),
            f"{a['hours_per_year']:,} hours a year",
            *a["notes"],
        ]
    return "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>"


# ---- charts ---------------------------------------------------------------------------------------------


# Characters per line of a chart's title and subtitle: Plotly never wraps a title, and a chart is as narrow as
# half a 820 px page (two per row): a longer line was cut at its edge
TITLE_CHARS = 48
SUBTITLE_CHARS = 64


def chart_title(title: str, sub: str | None = None) -> tuple[str, int]:
    """A chart's title with its subtitle under it in small type, each wrapped at TITLE_CHARS / SUBTITLE_CHARS
    (<br>), and the top margin that holds its lines."""
    import textwrap

    head = textwrap.wrap(title, TITLE_CHARS) or [""]
    small = textwrap.wrap(sub, SUBTITLE_CHARS) if sub else []
    text = "<br>".join(head) + "".join(f"<br><sub>{line}</sub>" for line in small)
    return text, 30 + 22 * len(head) + 16 * len(small)


def _layout(fig: go.Figure, title: str, y: str, sub: str | None = None) -> go.Figure:
    text, top = chart_title(title, sub)
    fig.update_layout(title={"text": text, "x": 0, "xanchor": "left"}, yaxis_title=y, height=340 + top - 50,
                      margin={"l": 50, "r": 20, "t": top, "b": 40}, template="plotly_white",
                      legend={"orientation": "h", "y": -0.15})  # fmt: skip
    return fig


def cost_chart(data: ReportData) -> go.Figure:
    modes = [m for m in ("spec", "ar") if m in data.current.mode_costs]
    costs = [data.current.mode_costs[m].cost for m in modes]
    # a mode's bar over only some of its runs (the others have no price) says so: 'AR (over 1 of 2 runs)'
    names = [_name(m) + (f" ({share.split(';')[0]})" if (share := data.current.priced_over(m)) else "")
             for m in modes]
    fig = go.Figure()
    # the parts of a cost in their own colours (the modes' would say "spec" on the AR bar)
    fig.add_bar(x=names, y=[c.hardware_usd_per_1m for c in costs], name="hardware", marker_color=HARDWARE_COLOUR)
    for est in (False, True):  # an estimate is hatched and named so; energy never measured draws nothing
        ys = [c.energy_usd_per_1m if c.energy_usd_per_1m is not None and bool(c.energy_estimated) == est else None
              for c in costs]
        if any(y is not None for y in ys):
            fig.add_bar(x=names, y=ys, name="energy (estimated)" if est else "energy (measured)",
                        marker={"color": ENERGY_COLOUR, "pattern_shape": "/" if est else ""})
    fig.update_layout(barmode="stack", showlegend=True)
    return _layout(fig, "Cost per 1M tokens: spec vs AR", "USD per 1M output tokens", "the measured runs")


def acceptance_chart(data: ReportData) -> go.Figure:
    fig = go.Figure()
    names = [chart_text(d.domain or "(none)") for d in data.domains]
    fig.add_bar(x=names, y=[d.acceptance_rate for d in data.domains], marker_color=SPEC_COLOUR,
                name="acceptance rate (accepted / drafted)")
    alphas = [d.alpha for d in data.domains]
    if any(a is not None for a in alphas):  # each label away from the line, which the legend names (as the dashboard)
        fig.add_scatter(x=names, y=alphas, mode="markers+text", name="alpha (accepted / tested; the go/no-go)",
                        marker={"symbol": "diamond", "size": 12, "color": "#111827"},
                        textposition=clear_of_line(alphas, ALPHA_GO), cliponaxis=False,
                        text=["" if a is None else go_text(a, ALPHA_GO) for a in alphas])
    line_in_legend(fig, ALPHA_GO, f"go/no-go {ALPHA_GO}", "#b91c1c")
    fig.update_yaxes(range=[0, 1.1], tickvals=[0, 0.2, 0.4, 0.6, 0.8, 1])  # headroom: a label over 1
    fig.update_layout(showlegend=True)
    return _layout(fig, "Acceptance per domain", "share of draft tokens")


def tpot_chart(data: ReportData) -> go.Figure:
    modes = [m for m in ("spec", "ar") if m in data.current.modes]
    fig = go.Figure()
    fig.add_bar(x=[_name(m) for m in modes],
                y=[data.current.stat(m, "tpot_p95_ms") for m in modes],
                marker_color=[SPEC_COLOUR if m == "spec" else AR_COLOUR for m in modes], name="p95 TPOT, all requests")  # fmt: skip
    projected = {m: projection_tpot(data, m)["projection_tpot_p95_ms"] for m in modes}
    if any(v is not None for v in projected.values()):
        fig.add_scatter(x=[_name(m) for m in modes], y=[projected[m] for m in modes], mode="markers",
                        name="the projection's configuration", marker={"symbol": "diamond", "size": 12,
                                                                      "color": "#111827"})
    fig.add_hline(y=data.sla_ms, line_dash="dash", line_color="#b91c1c", annotation_text=f"SLA {data.sla_ms:g} ms")
    fig.update_layout(showlegend=True)
    return _layout(fig, "p95 TPOT against the SLA", "ms per output token", "bars: all requests pooled")


def trend_chart(data: ReportData) -> go.Figure:
    periods = [*reversed(data.history), data.current]
    x = [p.window.point_text() for p in periods]
    fig = go.Figure()
    hardware_only = []
    for mode, colour in (("spec", SPEC_COLOUR), ("ar", AR_COLOUR)):
        # totals only where every period has the same energy basis; else each period's hardware part
        # (in the report's order, this period first: the basis in words names "this period")
        ys, basis = comparable_costs([data.current, *data.history], mode)
        ys = ys[::-1]
        name = _name(mode) if basis == TOTAL_BASIS else f"{_name(mode)} (hardware part)"
        if basis != TOTAL_BASIS:
            hardware_only.append(f"{_name(mode)}: {basis.removeprefix('hardware part only: ')}")
        elif any(estimate_sources(CostMetric(mode), periods, basis)):
            name += " (incl. estimated energy)"
        fig.add_scatter(x=x, y=ys, mode="lines+markers", name=name, line_color=colour)
    sub = "the last point is this period"
    if hardware_only:
        sub += f"; hardware part only, the periods' energy is not on one basis ({'; '.join(hardware_only)})"
    return _layout(fig, "Cost per 1M tokens by period", "USD per 1M output tokens", sub)


def sla_chart(data: ReportData, curve: Sequence) -> go.Figure:
    """Nodes per mode against the p95 TPOT SLA along `curve` (finops.sla_curve), the report's SLA marked.
    The last step goes on past the report's SLA without a marker (it holds for every looser SLA); a mode's
    markers are where one of its measured configurations starts to meet the SLA (`step_starts`); the node
    axis starts at zero."""
    fig = go.Figure()
    curve = list(curve)
    steps = sla_steps(curve, max(data.sla_ms, curve[-1].sla_ms) * 1.1) if curve else curve
    for mode, colour in (("spec", SPEC_COLOUR), ("ar", AR_COLOUR)):
        sizes = [8 if start else 0 for start in step_starts(steps, mode)]  # the extension repeats: no marker
        fig.add_scatter(x=[c.sla_ms for c in steps], y=[getattr(c, f"nodes_{mode}") for c in steps],
                        mode="lines+markers", line_shape="hv", name=_name(mode), line_color=colour,
                        marker_size=sizes)
    fig.add_vline(x=data.sla_ms, line_dash="dash", line_color="#b91c1c", annotation_text=f"SLA {data.sla_ms:g} ms",
                  annotation_position="bottom left")
    fig.update_yaxes(rangemode="tozero")
    fig.update_xaxes(title="p95 TPOT SLA (ms)")
    _layout(fig, "Nodes needed by SLA", "nodes at peak", "the projection's traffic and node price")
    # the only chart here with an x-axis title: the legend goes below it, not over it
    return fig.update_layout(legend_y=-0.32, margin_b=70)


# No mode bar: drawn over the chart's title (a report's chart is read, not edited); no Plotly logo
CHART_CONFIG = {"displaylogo": False, "displayModeBar": False}


def charts_html(figures: Sequence[tuple[str, go.Figure]]) -> str:
    """plotly.js is inlined with the first chart only; the others reuse it."""
    parts = []
    for i, (name, fig) in enumerate(figures):
        parts.append(pio.to_html(fig, full_html=False, include_plotlyjs=(i == 0), div_id=f"chart-{name}",
                                 config=CHART_CONFIG))  # fmt: skip
    return '<div class="charts">' + "".join(f"<div>{p}</div>" for p in parts) + "</div>"


def _band_note(b) -> str:
    return b.note + (f"; estimated power in {b.estimated}" if b.estimated else "")


# ---- the page -------------------------------------------------------------------------------------------


def incomplete_period_text(data: ReportData) -> str | None:
    """Why the figures of a period that had not ended are partial (None once it had ended): they cover only the
    part that had passed, and a projection on the period's own traffic divides that part's tokens by the whole
    period; a report generated after it ends gives other numbers."""
    if period_complete(data):
        return None
    w, at = data.window, data.generated_at
    started = at > w.since
    text = (f"the period had not {'ended' if started else 'begun'} when this report was generated "
            f"({time_text(at, '%Y-%m-%d %H:%M')} UTC; it ends {time_text(w.until, '%Y-%m-%d %H:%M')} UTC): its "
            "figures cover only "
            + ("the part that had passed" if started else "what was recorded for it before it began"))
    if data.projection.measured_traffic:
        text += ", and the projection's traffic per day divides that part's output tokens by the whole period"
    return text + "; generated again after the period ends, the report will give other numbers"




def render_html(data: ReportData, tables: Sequence[Table], *, report_id: int, csv_names: Sequence[str]) -> str:
    w = data.window
    title = f"specfinops cost report #{report_id}: {w.label()}"
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='muted'>generated {data.generated_at:%Y-%m-%d %H:%M:%S} UTC; previous period "
        f"{data.previous.window.period_text()}; "
        "figures from the same queries as <code>specfinops cost</code> and the dashboard.</p>",
    ]
    parts.append(pricing_html(data))
    synthetic = data.synthetic_text()
    if synthetic is not None:  # as the dashboard's banner says it
        parts.append(f"<p class='notice' id='synthetic'>{html.escape(synthetic[0].upper() + synthetic[1:])}.</p>")
    small = data.small_sample_text()
    if small is not None:  # as `cost` warns; not only inside the projection's assumptions
        parts.append(f"<p class='notice' id='small-sample'>{html.escape(small[0].upper() + small[1:])}.</p>")
    if data.window_overlap is not None:  # adjacent periods' costs price the same node time twice
        parts.append(f"<p class='notice' id='window-overlap'>Period edges: {html.escape(data.window_overlap)}.</p>")
    unfinished = incomplete_period_text(data)
    if unfinished is not None:
        parts.append(f"<p class='notice' id='period-incomplete'>{html.escape(unfinished[0].upper() + unfinished[1:])}"
                     ".</p>")
    if not data.has_traffic:
        runs = w.runs_text()
        parts.append("<p class='notice'>No traffic in this period: the store has no requests between "
                     f"{time_text(w.since, '%Y-%m-%d %H:%M')} and {time_text(w.until, '%Y-%m-%d %H:%M')} UTC"
                     f"{html.escape(f' from {runs} only') if runs else ''}. Figures that need traffic "
                     "are shown as —.</p>")  # fmt: skip
    # a speedup above its mean acceptance length: said above the tiles, whose speedup and savings rest on it
    parts.extend(f"<p class='notice'>{html.escape(text[0].upper() + text[1:])}</p>"
                 for text in above_acceptance_lines(data.speedups))
    parts.append(cards_html(data))
    parts.append(energy_sources_html(data))
    partial = [_name(m) for m in ("spec", "ar") if partial_energy(data.current, m)]
    if partial:
        parts.append(f"<p class='muted'>Some {' and '.join(partial)} requests have no energy figure; J/token covers "
                     f"those that do, and the cost per 1M tokens of {'that mode' if len(partial) == 1 else 'both'} is "
                     "hardware only.</p>")
    incomplete = incomplete_runs_text(rc.run for rc in data.current.run_costs)
    if incomplete:
        parts.append(f"<p class='notice'>{html.escape(incomplete[0].upper() + incomplete[1:])}</p>")
    parts.append("<h2>Projected annual savings: assumptions</h2>" + assumptions_html(data))
    anomalies = [b for b in data.bands if b.status == "anomaly"]
    checked = [b for b in data.bands if b.status in ("anomaly", "within band")]
    parts.append("<h2>Anomalies</h2>")
    if anomalies:
        parts.append("<ul>" + "".join(
            f"<li class='bad'>{html.escape(b.metric)}: {fmt(b.value, ',.4g')} is outside its band "
            f"{fmt(b.low, ',.4g')} to {fmt(b.high, ',.4g')} ({html.escape(_band_note(b))})</li>" for b in anomalies
        ) + "</ul>")  # fmt: skip
    elif not checked and any(b.status == NOT_CHECKED for b in data.bands):  # a part of a period: no all-clear
        parts.append(f"<p class='muted'>Not checked against their bands ({html.escape(NOT_ENDED)}).</p>")
    elif all(b.value is None for b in data.bands):  # nothing was checked: no all-clear
        why = "no traffic in this period" if not data.has_traffic else "no checked figure has a value this period"
        parts.append(f"<p class='muted'>Nothing to check: {why}.</p>")
    else:
        so_far = "" if period_complete(data) else f" ({html.escape(RATE_SO_FAR)})"
        parts.append(f"<p class='ok'>No figure outside its band{so_far}.</p>")
    short = [b for b in data.bands if b.status == "not enough history"]
    if short:
        parts.append("<p class='muted'>Not enough history to judge: " + "; ".join(
            html.escape(f"{b.metric} ({_band_note(b)})") for b in short) + ".</p>")  # fmt: skip
    if data.has_traffic:
        figures = [("cost", cost_chart(data)), ("tpot", tpot_chart(data)), ("trend", trend_chart(data))]
        if data.domains:
            figures.insert(1, ("acceptance", acceptance_chart(data)))
        curve = data.projection.sla_curve
        if len({(c.nodes_ar, c.nodes_spec) for c in curve}) > 1:  # drawn where the SLA changes the answer
            figures.append(("sla", sla_chart(data, curve)))
        parts.append("<h2>Charts</h2>" + charts_html(figures))
    parts.append("<h2>Tables</h2>" + "".join(table_html(t) for t in tables))
    parts.append("<p class='muted'>CSV files next to this page: "
                 + ", ".join(html.escape(n) for n in csv_names) + ".</p></body></html>")  # fmt: skip
    return "".join(parts)


"""Cost & capacity: cost per 1M tokens (hardware vs energy), the node projection with live inputs, savings."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import streamlit as st

from app.dashboard import assumptions, charts, data, filters
from app.dashboard.common import (
    Context,
    comparison_text,
    download_csv,
    fmt,
    in_page_words,
    md_safe,
    node_price,
    priced_costs,
    prices_text,
    projection_notes,
    run_page,
    show_left_out,
    show_projection_caveats,
    show_table,
    sla_ms_text,
    throughput,
    usd_amount,
    usd_rate,
    warn_pooled,
)
from telemetry import finops, prices
from telemetry.costing import (
    FLEET_COST_LABEL,
    PARTLY_ESTIMATED,
    energy_source,
    fleet_energy_text,
    mode_runs,
    partial_energy_text,
    runs_text,
)
from telemetry.queries import COMPARED_FIELDS, bench_command, bench_settings, bench_workload, key_of

SNAPSHOT = "runs' recorded price"
CUSTOM = "custom $/h per node"
PRICE_SHOWN = {SNAPSHOT: "recorded", CUSTOM: "custom $/h"}  # as the Node price box shows them: ~12 letters fit
# the inputs' upper bounds: far above any real service or price, yet finite figures that fit their tiles (left
# unbounded, a node at $1e308/h made every cost infinite and both this page and the Overview an error line)
MAX_DAILY_M = finops.MAX_DAILY_TOKENS / 1e6  # 1e14 output tokens a day
MAX_NODE_USD = 10_000.0  # $/h per node
DEFAULT_NODE_USD = 10.0  # the custom $/h box before anything is typed in it
MAX_USD_PER_KWH = 10.0
MAX_PUE = 5.0
# each number input's bounds, by its key: checked by the page (`_Inputs`), not the widget, so a refusal is said
BOUNDS = {"w_daily": (0.001, MAX_DAILY_M), "w_peak": (1.0, 20.0), "w_sla": (0.1, finops.MAX_SLA_MS),
          "w_gpus": (1, 64), "w_node_usd": (0.01, MAX_NODE_USD), "w_kwh": (0.0, MAX_USD_PER_KWH),
          "w_pue": (0.0, MAX_PUE)}


def _cost_section(ctx: Context, values: dict) -> None:
    """Priced with the page's inputs (`values`, as the projection below): an input left at its default keeps
    each run's recorded price (else the catalog's)."""
    priced = priced_costs(ctx.url, ctx.sel.filters, values)
    run_costs, mode_costs, unpriced = priced.run_costs, priced.mode_costs, priced.unpriced
    if not run_costs and priced.note:  # nothing priced: no figure to show
        st.warning(f"No cost per 1M tokens: {md_safe(priced.note)}.")
        return
    if unpriced:  # the priced runs' costs stand; the others are named, with how to price them
        st.warning(f"Cost per 1M tokens over the priced runs only: {md_safe(priced.note)}. Their costs are "
                   "missing (—), and each mode's figure below is over its priced runs.")
    if not mode_costs:
        st.info("No runs with output tokens in view.")
        return
    warn_pooled(priced.runs(), "the speculative and AR bars below")
    st.plotly_chart(charts.cost_split([m.mode for m in mode_costs], [m.cost.hardware_usd_per_1m for m in mode_costs],
                                      [m.cost.energy_usd_per_1m for m in mode_costs],
                                      [m.cost.energy_estimated for m in mode_costs],
                                      [energy_source(mode_runs(m, run_costs)) == PARTLY_ESTIMATED for m in mode_costs]),
                    width="stretch")
    st.caption(f"Prices: {md_safe(prices_text(run_costs, values))}. The inputs under Node projection price this "
               "part too; one left at 0 (node price: the runs' recorded price) keeps each run's own.")
    for mode in dict.fromkeys([*(m.mode for m in mode_costs), *(r.mode for r in unpriced)]):
        m = next((x for x in mode_costs if x.mode == mode), None)
        share = priced.share(mode)  # a figure over only some of the mode's runs says so
        if share:
            st.caption(f"{charts.MODE_NAMES[mode]}: " + (f"cost {md_safe(share)}." if m else
                                                         f"no cost: {md_safe(share)}."))
        if m is None:
            continue
        # only some runs with energy: say how many, in the CLI's words (the total is hardware only)
        partial = partial_energy_text(m, run_costs)
        if partial:
            st.caption(f"{charts.MODE_NAMES[m.mode]}: {md_safe(partial)}: hardware only.")
        elif m.cost.reason:
            st.caption(f"{charts.MODE_NAMES[m.mode]}: {md_safe(m.cost.reason)}.")
    rows = [{
        "run": rc.run.run_id, "mode": rc.run.mode, "workload": rc.run.workload, "node": rc.run.node_id,
        "measured on": rc.measured_on, "priced as": rc.node_price.priced_as, "node $/h": rc.node_price.usd_per_hour,
        "output tokens": rc.run.stats.output_tokens, "tokens/s": rc.run.stats.tokens_per_s,
        "hardware $/1M": rc.cost.hardware_usd_per_1m, "energy $/1M": rc.cost.energy_usd_per_1m,
        "total $/1M": rc.cost.total_usd_per_1m,
        "energy estimated": rc.cost.energy_estimated if rc.cost.energy_usd_per_1m is not None else None,
    } for rc in run_costs]
    rows += [{  # a run no price covers: its costs missing (—), never 0
        "run": r.run_id, "mode": r.mode, "workload": r.workload, "node": r.node_id, "measured on": r.device,
        "priced as": "no price", "node $/h": None, "output tokens": r.stats.output_tokens,
        "tokens/s": r.stats.tokens_per_s, "hardware $/1M": None, "energy $/1M": None, "total $/1M": None,
        "energy estimated": None,
    } for r in unpriced]
    table = pd.DataFrame(sorted(rows, key=lambda row: row["run"]))
    with st.expander("Cost per run"):
        show_table(table, money=("hardware $/1M", "energy $/1M", "total $/1M"))
        download_csv("Download cost per run (CSV)", table, "cost-per-run.csv", "dl_cost_runs")


def _number(v: float) -> str:
    """An input's value as typed: 99,999,999 and -5, not 1e+08 and -5.0."""
    return format(v, ",.10g")


# each input's last accepted value, by its key: the shared assumptions hold none for an input that prices nothing
# (no node $/h unless the price is custom, 1 GPU per node for a whole node's price), so a refusal after the price
# was switched away and back fell back to the default while it said "the last value accepted"
ACCEPTED = "_specfinops_accepted_inputs"


class _Inputs:
    """The page's number inputs, bounded here, not by the widget: a browser refuses a number typed outside a
    widget's own bounds without telling the script (the box turns red, the figures keep the value before it,
    silently; AppTest's and a URL's values are reset to the default instead). Unbounded widgets send what was
    typed; a value outside [lo, hi] is refused here, with a warning naming the input and the value the figures
    use instead: the input's last accepted value (kept per input in ACCEPTED), or its default, said as such."""

    def __init__(self) -> None:
        self.refused: list[str] = []
        self.accepted: dict = st.session_state.setdefault(ACCEPTED, {})

    def get(self, col, label: str, key: str, seed: float, default: float, shown: Callable[[float], str],
            **kwargs) -> float:
        """The widget `key`'s value, or the last one accepted (`seed`, from the shared assumptions, before any)
        where it is outside BOUNDS[key] or empty; `shown` writes a value in words for the warning, which calls it
        "the default" where it is `default`. A disabled box is not read (what it holds prices nothing): the last
        value, nothing refused."""
        lo, hi = BOUNDS[key]
        last = self.accepted.get(key, seed)
        v = col.number_input(label, value=last, key=key, **kwargs)
        if kwargs.get("disabled"):
            return last
        if v is not None and lo <= v <= hi:
            self.accepted[key] = v
            return v
        typed = "an empty box" if v is None else _number(v)
        used = f"the default {shown(last)}" if last == default else f"{shown(last)}, the last value accepted"
        self.refused.append(f"{label}: {typed} refused (it takes {_number(lo)} to {_number(hi)}); the figures use "
                            f"{used}.")
        return last

    def warn(self) -> None:
        for text in self.refused:
            st.warning(md_safe(text))


def _inputs(ctx: Context) -> dict:
    """Projection inputs as widgets, seeded from the shared assumptions, then each input's last value accepted;
    returns project_from_store kwargs. A value outside an input's bounds is refused, said so, and the last one
    accepted (else the default) kept."""
    a, d = assumptions.get(), assumptions.DEFAULTS
    catalog = data.price_catalog(ctx.url)
    gpus = [p.name for p in catalog if p.unit == "usd_per_hour"]
    ins = _Inputs()
    c = st.columns(4)
    # short labels, the detail in help: at 1024 px a column is ~130 px wide, and a label that wrapped put its
    # input lower than its neighbours' (and "500.000" and "runs' recorded price" were cut off in their boxes)
    daily_m = ins.get(c[0], "Tokens/day (M)", "w_daily", min(a["daily_tokens"] / 1e6, MAX_DAILY_M),
                      d["daily_tokens"] / 1e6, lambda v: f"{_number(v)}M tokens a day", step=50.0, format="%g",
                      help="Daily output tokens the fleet serves, in millions (on average: the peak factor sizes it "
                           "for the peak).")
    peak = ins.get(c[1], "Peak factor", "w_peak", float(a["peak_factor"]), float(d["peak_factor"]),
                   lambda v: f"x{_number(v)}", step=0.5,
                   help="Peak-to-average traffic: the fleet is sized for the average tokens/s times this.")
    sla = ins.get(c[2], "p95 TPOT SLA (ms)", "w_sla", min(float(a["sla_ms"]), finops.MAX_SLA_MS),
                  float(d["sla_ms"]), lambda v: f"{_number(v)} ms", step=5.0)
    choices = [SNAPSHOT, *gpus, CUSTOM]
    current = CUSTOM if a["node_hourly_usd"] else (a["gpu"] if a["gpu"] in gpus else SNAPSHOT)
    price = c[3].selectbox("Node price", choices, index=choices.index(current), key="w_price",
                           format_func=lambda choice: PRICE_SHOWN.get(choice, choice),
                           help="recorded: the runs' recorded price (else the catalog price of the measured "
                                "device); a catalog GPU x GPUs per node; or custom: your own $/h per node.")
    c = st.columns(4)
    # a GPU's price is per GPU: a node holds N of them; a node's price (cpu-2core) is a whole node already, and N
    # of it was refused by the projection ("applies to GPU prices"), which then left this page and the Overview
    per_node = price in (SNAPSHOT, CUSTOM) or price in {p.name for p in catalog if p.kind != "gpu"}
    gpus_per_node = int(ins.get(c[0], "GPUs per node", "w_gpus", int(a["gpus_per_node"]), int(d["gpus_per_node"]),
                                lambda v: str(int(v)), disabled=per_node,
                                help="For a catalog GPU's price (per GPU): how many a node holds. A node's price "
                                     "covers the whole node."))
    node_usd = ins.get(c[1], "Custom node $/h", "w_node_usd", min(float(a["node_hourly_usd"] or DEFAULT_NODE_USD),
                                                                  MAX_NODE_USD),
                       DEFAULT_NODE_USD, lambda v: f"{usd_rate(v)}/h", disabled=price != CUSTOM)
    # the entries energy is priced at (prices.energy_prices): by name, not the first of their kind
    kwh_cat = next((p.value for p in catalog if p.name.lower() == prices.ELECTRICITY), None)
    pue_cat = next((p.value for p in catalog if p.name.lower() == prices.PUE), None)
    kwh = ins.get(c[2], f"$/kWh (0: {fmt(kwh_cat, 'g', prefix='$')})", "w_kwh",
                  min(float(a["usd_per_kwh"] or 0.0), MAX_USD_PER_KWH), 0.0,
                  lambda v: f"{usd_rate(v)}/kWh" if v else "0 (each run's recorded $/kWh, else the catalog's)",
                  step=0.01, format="%.3f",
                  help="Electricity price. Prices the measured energy (kWh x PUE x $/kWh) of the runs at the top of "
                       "the page and of the fleet; 0 keeps each run's recorded price (else the catalog's, which "
                       "`specfinops prices set electricity ...` changes) and the catalog's for the fleet.")
    pue = ins.get(c[3], f"PUE (0: {fmt(pue_cat, 'g')})", "w_pue", min(float(a["pue"] or 0.0), MAX_PUE), 0.0,
                  lambda v: _number(v) if v else "0 (each run's recorded PUE, else the catalog's)", step=0.05,
                  help="0 keeps each run's recorded PUE (else the catalog's) and the catalog's for the fleet.")
    ins.warn()
    if 0 < pue < 1:
        st.warning("PUE is at least 1; using the catalog PUE.")
        pue = 0.0
    values = {
        "daily_tokens": daily_m * 1e6, "peak_factor": peak, "sla_ms": sla,
        "gpu": price if price not in (SNAPSHOT, CUSTOM) else None,
        "gpus_per_node": 1 if per_node else gpus_per_node,
        "node_hourly_usd": node_usd if price == CUSTOM else None,
        "usd_per_kwh": kwh or None, "pue": pue or None,
    }
    assumptions.put(values)
    return values


def _projection_section(ctx: Context, values: dict) -> None:
    try:
        sp = data.projection(ctx.url, ctx.sel.filters, values)
    except ValueError as exc:
        st.warning(f"No projection: {md_safe(in_page_words(str(exc)))}")
        return
    p = sp.projection
    compared = comparison_text(sp)
    if compared:
        st.caption(md_safe(f"{compared[0].upper()}{compared[1:]}."))
    m = st.columns(4)
    m[0].metric("Nodes (AR baseline)", fmt(p.nodes_ar, ",d"))
    m[1].metric("Nodes (speculative)", fmt(p.nodes_spec, ",d"))
    m[2].metric("Projected annual savings", usd_amount(p.annual_savings_usd),
                help="(nodes AR - nodes spec) x node $/h x 8,760: node-hours only, the energy not in it (the "
                     "fleet cost per 1M tokens below includes it)")
    m[3].metric("Node price", usd_rate(p.node_hourly_usd) + "/h",
                help=md_safe(f"priced as {node_price(sp.node_price)}"))
    m = st.columns(4)
    # 3.02 tokens/s, not "3": the node count comes from the unrounded figure
    for col, mode, cap, cap_runs, p95 in (
            (m[0], "AR", p.capacity_tokens_per_s_ar, sp.capacity_runs_ar, sp.capacity_tpot_p95_ms_ar),
            (m[1], "spec", p.capacity_tokens_per_s_spec, sp.capacity_runs_spec, sp.capacity_tpot_p95_ms_spec)):
        col.metric(f"Capacity {mode} (tokens/s per node)", throughput(cap),
                   help=f"best configuration meeting the SLA: {runs_text(cap_runs)}, p95 TPOT "
                        f"{sla_ms_text(p95, p.sla_ms)} (SLA {p.sla_ms:g} ms)" if cap_runs else None)
    monthly = f"{finops.MONTHLY_COST_FORMULA}: node-hours only, the energy not in it"
    m[2].metric("Monthly cost AR", usd_amount(p.monthly_cost_ar_usd), help=monthly)
    m[3].metric("Monthly cost spec", usd_amount(p.monthly_cost_spec_usd), help=monthly)
    m = st.columns(4)
    # the p95 of the configuration each mode is sized on, not of every request in view pooled
    m[0].metric("p95 TPOT at capacity (AR)", sla_ms_text(sp.capacity_tpot_p95_ms_ar, p.sla_ms),
                help="p95 TPOT of the AR configuration the projection sizes the fleet on "
                     f"(SLA {p.sla_ms:g} ms); the Latency page pools every request in view")
    m[1].metric("p95 TPOT at capacity (spec)", sla_ms_text(sp.capacity_tpot_p95_ms_spec, p.sla_ms),
                help="p95 TPOT of the speculative configuration the projection sizes the fleet on "
                     f"(SLA {p.sla_ms:g} ms); the Latency page pools every request in view")
    if p.cost_per_1m_tokens_ar_usd is not None or p.cost_per_1m_tokens_spec_usd is not None:
        energy = ""
        if p.energy_included_ar or p.energy_included_spec:
            def whose(key: str, name: str) -> str:
                """An input left at 0 keeps the price every run recorded where they all agree, else the
                catalog's (costing says which in `energy_prices_from`)."""
                if values.get(key):
                    return "your input"
                return "recorded with the runs" if f"{name} recorded by the runs" in sp.energy_prices_from \
                    else "the catalog's"

            energy = (f", energy at {usd_rate(sp.usd_per_kwh)}/kWh ({whose('usd_per_kwh', '$/kWh')}) x PUE "
                      f"{sp.pue:g} ({whose('pue', 'PUE')})")
        def fleet(mode: str) -> str:
            """The mode's figure, and why it is missing where it is (not attainable, no runs of the mode)."""
            value = getattr(p, f"cost_per_1m_tokens_{mode}_usd")
            return usd_amount(value) + (f" ({fleet_energy_text(sp, mode)})" if value is None else "")

        st.caption(f"{FLEET_COST_LABEL[0].upper()}{FLEET_COST_LABEL[1:]}: AR {fleet('ar')}, spec {fleet('spec')} "
                   f"(node {usd_rate(p.node_hourly_usd)}/h{energy}). "
                   "Above the measured cost per 1M at the top of the page: the fleet is sized for the peak, in "
                   "whole nodes, and paid for around the clock."
                   + (" The monthly costs and the annual savings above are node-hours only; the energy is in this "
                      "figure." if energy else ""))
    in_view = set(ctx.sel.runs["mode"])
    st.plotly_chart(charts.nodes_bar(p.nodes_ar, p.nodes_spec, in_view, p.sla_ms), width="stretch")
    _sla_section(sp)
    notes = projection_notes(sp)
    energy = energy_note(sp, data.run_summaries(ctx.url, ctx.sel.filters))
    if energy:
        notes.append(energy)
    for note in notes:
        st.caption(f"Note: {md_safe(note)}.")
    show_projection_caveats(sp, ctx)
    proj_table = pd.DataFrame([
        {"figure": FLEET_COST_LABEL, "AR": p.cost_per_1m_tokens_ar_usd,
         "spec": p.cost_per_1m_tokens_spec_usd},
        {"figure": "nodes", "AR": p.nodes_ar, "spec": p.nodes_spec},
        {"figure": "monthly cost (USD)", "AR": p.monthly_cost_ar_usd, "spec": p.monthly_cost_spec_usd},
        {"figure": "capacity (tokens/s per node)", "AR": p.capacity_tokens_per_s_ar,
         "spec": p.capacity_tokens_per_s_spec},
        # what the fleet cost above holds: energy or the node price only, and whether that energy was estimated
        {"figure": "energy included (fleet cost)", "AR": p.energy_included_ar, "spec": p.energy_included_spec},
        {"figure": "energy estimated (fleet cost)", "AR": sp.energy_estimated_ar, "spec": sp.energy_estimated_spec},
    ])
    download_csv("Download projection (CSV)", proj_table, "projection.csv", "dl_projection")


def energy_note(sp, runs) -> str | None:
    """Why the energy part is missing from a mode's fleet cost, where it is: the runs in view have no energy
    figure at all (then the electricity price and PUE change nothing), no configuration of the mode meets the
    SLA, or the configuration that sets its capacity lacks energy for some of its requests. None where energy is
    in both, or where `projection_notes` says why already (priced as other hardware than measured)."""
    p = sp.projection
    if p.energy_included_ar and p.energy_included_spec:
        return None
    if not any(r.stats.energy_j is not None for r in runs):
        return "no energy measured for these runs: the electricity price and PUE do not change the figures"
    if sp.priced_differs:
        return None
    by_id = {r.run_id: r for r in runs}
    reasons = []
    for mode, nodes, included, cap_runs in (("AR", p.nodes_ar, p.energy_included_ar, sp.capacity_runs_ar),
                                            ("speculative", p.nodes_spec, p.energy_included_spec,
                                             sp.capacity_runs_spec)):
        if included:
            continue
        if nodes is None:
            measured = sp.points_ar if mode == "AR" else sp.points_spec
            reasons.append(f"no {mode} configuration meets the {p.sla_ms:g} ms SLA" if measured
                           else f"no {mode} runs in view")
            continue
        cap = [by_id[i] for i in cap_runs if i in by_id]
        some = any(r.stats.energy_j is not None for r in cap)
        reasons.append(f"the {mode} configuration that sets the capacity ({runs_text(cap_runs)}) has "
                       + ("energy figures for only some of its requests" if some else "no energy figure"))
    if not reasons:
        return None
    return "energy is not in the fleet cost: " + "; ".join(reasons)


def _sla_section(sp) -> None:
    """The same traffic and price at every SLA where the answer can change: where speculation pays."""
    curve = sp.sla_curve()
    if len(curve) < 2:
        return
    st.plotly_chart(charts.nodes_by_sla(curve, sp.projection.sla_ms), width="stretch")
    st.caption(f"Where the SLA matters: {finops.sla_verdict(curve)}. Each step is a measured configuration "
               "starting to meet the SLA (the same traffic and node price as above); tight SLAs favour the mode "
               "with the lower TPOT, loose ones the mode that batches best.")
    table = pd.DataFrame([{"p95 TPOT SLA (ms)": c.sla_ms, "AR tokens/s per node": c.capacity_ar,
                           "spec tokens/s per node": c.capacity_spec, "nodes AR": c.nodes_ar,
                           "nodes spec": c.nodes_spec, "annual savings (USD)": c.annual_savings_usd} for c in curve])
    for column in ("nodes AR", "nodes spec"):  # whole nodes, empty where not attainable (not "338.0")
        table[column] = pd.array(table[column], dtype="Int64")
    download_csv("Download nodes by SLA (CSV)", table, "nodes_by_sla.csv", "dl_sla")


SWEEPS_SHOWN = 20  # in the sweep picker: the newest of those the sidebar's filters keep


SWEEP_LEVELS = "1,2,4,8,16,32"


def _sweep_command(ctx: Context) -> str:
    """The bench that records a concurrency sweep into this store, on the sidebar's workload (else the one
    workload of the runs in view, else `mixed`; `mixed` too for one bench does not take: `bench_workload`), with
    the settings of the runs in view where they form one comparable group (`queries.bench_settings`, as the
    Overview's hint), so the sweep's runs are kept by the same filters: `queries.bench_command`."""
    runs = data.run_summaries(ctx.url, ctx.sel.filters)
    group = runs[0] if runs and len({key_of(r, COMPARED_FIELDS) for r in runs}) == 1 else None
    workloads = set(ctx.sel.runs["workload"].dropna())
    workload = (ctx.sel.filters.workload or (group.workload if group is not None else None)
                or (next(iter(workloads)) if len(workloads) == 1 else "mixed"))
    options = [("--concurrency", SWEEP_LEVELS), *(bench_settings(group) if group is not None else ())]
    return bench_command(data.engine(ctx.url), bench_workload(workload), always_db=True, options=options)


def _sweep_section(ctx: Context) -> None:
    recorded = data.sweeps(ctx.url)
    matching = filters.sweeps_in_view(recorded, ctx.sel.filters)
    sweeps = matching[:SWEEPS_SHOWN]
    if recorded and not sweeps:
        st.info(f"None of the {len(recorded)} recorded concurrency sweeps matches the sidebar's node, workload "
                "or run filters.")
        return
    if not sweeps:
        st.info(f"Concurrency sweeps appear here once measured: `{_sweep_command(ctx)}`.")
        return
    labels = {f"#{s['id']} {s['drafter']} on {s['workload']} ({s['node']}, {s['created_at']:%Y-%m-%d %H:%M})": s
              for s in sweeps}
    sw = labels[st.selectbox("Sweep", list(labels), key="w_sweep",
                             help=None if len(matching) <= SWEEPS_SHOWN else
                             f"the newest {SWEEPS_SHOWN} of the {len(matching)} sweeps the sidebar's filters keep")]
    points = data.sweep_points(ctx.url, sw["run_ids"])  # the picked sweep's only
    cross = sw["crossover"]
    st.metric("Crossover concurrency", fmt(cross, "d") if cross else "none measured",
              help="smallest measured concurrency at which speculative tokens/s no longer beats AR; "
                   "`bench --spec-max-batch auto` speculates only below it")
    st.plotly_chart(charts.sweep(points, cross, "Throughput by concurrency"), width="stretch")
    table = pd.DataFrame([{"concurrency": c, "AR tokens/s": a, "spec tokens/s": s_, "AR p95 TPOT ms": ta,
                           "spec p95 TPOT ms": ts, "speedup": (s_ / a) if a and s_ is not None else None,
                           "spec mean acc len": mal}
                          for c, a, s_, ta, ts, mal in points])
    for c, x, mal in zip(table["concurrency"], table["speedup"], table["spec mean acc len"], strict=True):
        above = finops.speedup_over_acceptance_text(None if pd.isna(x) else x, None if pd.isna(mal) else mal)
        if above:
            st.warning(md_safe(f"Sweep, concurrency {c}: {above}."))
    show_table(table)
    download_csv("Download sweep (CSV)", table, f"sweep-{sw['id']}.csv", "dl_sweep")


def body(ctx: Context) -> None:
    show_left_out(ctx)  # a mode's costs and nodes read "—" below: say where its runs are, as the Overview does
    st.subheader("Measured cost per 1M output tokens")
    measured = st.container()  # drawn here, filled once the inputs below are read: they price it too
    st.subheader("Node projection")
    st.caption("Capacity per node = the highest measured tokens/s whose p95 TPOT meets the SLA; "
               "nodes = ceil(daily tokens / 86,400 x peak / capacity). Recomputed as you change the inputs.")
    values = _inputs(ctx)
    _projection_section(ctx, values)
    with measured:
        _cost_section(ctx, values)
    st.subheader("Concurrency sweeps")
    st.caption("Speculation's advantage shrinks as batches grow: the best AR configuration against the best "
               "speculative one at the same SLA is what the projection above uses.")
    _sweep_section(ctx)


run_page("Cost & capacity", body, "What the measured runs cost, and how many nodes your traffic needs with and without speculation.")

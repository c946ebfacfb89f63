"""Overview: speculative vs AR side by side — cost per 1M tokens, speedup, acceptance, TPOT, J/token, savings."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.dashboard import assumptions, charts, data
from app.dashboard.charts import MODE_NAMES
from app.dashboard.common import (
    MISSING,
    PICK_ONE_GROUP,
    SHOWN_RUN_IDS,
    Context,
    comparison_text,
    cost_vs_savings_note,
    fmt,
    in_page_words,
    left_out_text,
    md_safe,
    node_price,
    priced_costs,
    prices_text,
    projection_notes,
    run_page,
    show_projection_caveats,
    show_table,
    sla_ms_text,
    throughput,
    usd_amount,
    warn_pooled,
)
from app.dashboard.filters import short_model, short_workload
from app.dashboard.page_queries import as_utc
from telemetry.costing import (
    PARTLY_ESTIMATED,
    energy_source,
    energy_sources_text,
    incomplete_runs_text,
    partial_energy_text,
    temperature_text,
)
from telemetry.labels import j_per_token_text
from telemetry.queries import (
    COMPARED_FIELDS,
    above_acceptance_lines,
    cutoffs_text,
    key_of,
    max_new_tokens_text,
    paired_text,
    pooled_outside_text,
    record_both,
)

# A speedup row's configuration: (Speedup field, table column), in the order the table shows those that differ
SPEEDUP_CONFIG = (("workload", "workload"), ("target", "target"), ("drafter", "drafter"), ("k_policy", "K policy"),
                  ("device", "device"), ("dtype", "dtype"), ("concurrency", "concurrency"),
                  ("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                  ("max_new_tokens", "max new tokens"), ("kind", "run kind"))


def differing_columns(speedups) -> list[str]:
    """The table columns of SPEEDUP_CONFIG in which the rows of `speedups` differ, in that order: where the
    rows that otherwise look alike differ (a target, a drafter, a device)."""
    return [column for field, column in SPEEDUP_CONFIG if len({getattr(s, field) for s in speedups}) > 1]


def speedup_table(speedups) -> pd.DataFrame:
    """The Speedup by configuration table: the configuration columns in which the rows differ first (two rows
    read alike where they differed in a column off-screen at the end), then the speedup and its figures, then
    the configuration the rows share. A model or workload whose short name two rows share is shown whole."""
    def label(short, values: list) -> list:
        return [short(v) for v in values] if len({short(v) for v in values}) == len(set(values)) else values

    config = {
        "workload": label(short_workload, [s.workload for s in speedups]),
        "target": label(short_model, [s.target for s in speedups]),
        "drafter": [s.drafter for s in speedups], "K policy": [s.k_policy for s in speedups],
        "device": [s.device for s in speedups], "dtype": [s.dtype for s in speedups],
        "concurrency": [s.concurrency for s in speedups],
        "temperature": [temperature_text(s.temperature).removeprefix("temperature ") for s in speedups],
        "top_p": [s.top_p for s in speedups], "top_k": [s.top_k for s in speedups],
        # a cap is a whole number; a missing one (unknown) an empty cell, not NaN beside floats
        "max new tokens": pd.array([s.max_new_tokens for s in speedups], dtype="Int64"),
        "run kind": [s.kind for s in speedups],
    }
    results = pd.DataFrame({
        "speedup": [s.speedup for s in speedups],
        # each invocation that ran both modes, its own ratio: the pooled speedup mixes invocations
        "paired invocations": [paired_text(s, flag=False) for s in speedups],
        "pooled outside paired": [s.pooled_outside_paired for s in speedups],
        # what no figure of the row can exceed, and whether one does (the warnings above say why)
        "spec mean acc len": [s.mean_acceptance_length for s in speedups],
        "above acc len": [bool(s.above_acceptance) for s in speedups],
        "prompts": [s.prompts for s in speedups],
        "spec tokens/s": [s.spec_tokens_per_s for s in speedups], "AR tokens/s": [s.ar_tokens_per_s for s in speedups],
    })
    differ = differing_columns(speedups) or ["workload"]
    lead = pd.DataFrame({c: config[c] for c in differ})
    rest = pd.DataFrame({c: v for c, v in config.items() if c not in differ})
    return pd.concat([lead, results, rest], axis=1)


def _speedup_text(speedups) -> tuple[str, str]:
    """The Speedup tile's value and help: one row names its temperature, run kind and prompts; several rows
    are a range, never one figure pooled across temperatures or run kinds (greedy verification at 0 accepts
    far more than sampling at 0.8; a load test times its HTTP clients, a bench the engine)."""
    rows = [s for s in speedups if s.speedup is not None]
    if not rows:
        return MISSING, ("Needs a speculative and an AR run of the same workload, target, device, precision, "
                         "concurrency, sampling (temperature, top_p, top_k), answer length cap (max new tokens) and "
                         "run kind.")
    if len(rows) == 1:
        (s,) = rows
        return (f"{s.speedup:.2f}x", f"Spec tokens/s / AR tokens/s at {s.label}; same workload, hardware, "
                                     f"precision and concurrency, every run in view pooled. Paired (each "
                                     f"invocation's own): {paired_text(s)}.")
    values = [s.speedup for s in rows]
    caps = len({s.max_new_tokens for s in rows}) > 1  # the cap named where the rows differ in it
    temps = sorted({temperature_text(s.temperature) + cutoffs_text(s.top_p, s.top_k, s.temperature)
                    + (f", {max_new_tokens_text(s.max_new_tokens)}" if caps else "") for s in rows})
    kinds = sorted({s.kind for s in rows})
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"  # a range whose ends read alike is one figure ("3.42–3.42x")
    differ = differing_columns(rows)
    return (f"{lo}x" if lo == hi else f"{lo}–{hi}x",
            f"{len(rows)} configurations (range), differing in {', '.join(differ)}; each spec against AR at one "
            f"sampling (temperature, top_p, top_k), answer length cap and run kind: not pooled across temperatures "
            f"or run kinds ({'; '.join(temps)}; {', '.join(kinds)} runs), nor across top_p, top_k or max new tokens. "
            "See the table below for each row's prompts and paired invocations. Spec tokens/s / AR tokens/s.")


def paired_over_time(speedups, runs: pd.DataFrame) -> pd.DataFrame | None:
    """The paired speedups as points in time (each invocation's first run's start, from the sidebar's `runs`),
    one configuration label per speedup row; None where no configuration has two paired invocations (a single
    point is the figure the table already gives)."""
    if not any(len(s.invocation_speedups) >= 2 for s in speedups):
        return None
    have = runs[runs["invocation_id"].notna()]
    starts = {str(k): as_utc(v) for k, v in have.groupby("invocation_id")["started_at"].min().items()}
    many = len(speedups) > 1
    rows = []
    for s in speedups:
        label = (f"{s.workload} · c={s.concurrency} · {temperature_text(s.temperature)}"
                 + cutoffs_text(s.top_p, s.top_k, s.temperature) + f" · {s.kind} · {s.drafter}") if many else (
                 f"{s.workload} · {s.drafter}")
        rows += [{"started_at": starts[i], "speedup": x, "configuration": label, "invocation": i[:8],
                  "pooled": s.speedup}
                 for i, x in zip(s.invocation_ids, s.invocation_speedups, strict=True) if i in starts]
    return pd.DataFrame(rows) if rows else None


def _paired_warnings(speedups) -> list[str]:
    """One line per speedup whose pooled figure lies outside the range of its paired invocations' own: the
    tiles and the table show the pooled figure, which then mixes runs made under different conditions."""
    several = len(speedups) > 1
    return [(f"{s.workload}, concurrency {s.concurrency}, {s.drafter} ({s.k_policy}), {s.label}: " if several else "")
            + f"{pooled_outside_text(s)} ({paired_text(s, flag=False)})."
            for s in speedups if s.pooled_outside_paired]


def _tokens_vs_ar(speedups) -> tuple[dict, str]:
    """The spec Tokens/s tile's delta and what it compares. The tiles pool every run of a mode in view, which
    may mix temperatures and run kinds; the delta is the Speedup's one comparison (spec against AR at one
    temperature and run kind, over the prompts both ran) where there is exactly one, and none otherwise."""
    rows = [s for s in speedups if s.speedup is not None]
    pooled = "Tokens/s: output tokens / wall time over every run of the mode in view."
    if len(rows) != 1:
        why = ("several speedup rows (temperatures, run kinds or configurations) are in view: see the Speedup "
               "table" if rows else "no speculative and AR runs to compare like for like")
        return {}, f"{pooled} No change against AR shown: {why}."
    (s,) = rows
    delta = _vs_ar(s.spec_tokens_per_s, s.ar_tokens_per_s)
    if "delta" in delta:
        delta["delta"] += f" ({temperature_text(s.temperature)}{cutoffs_text(s.top_p, s.top_k, s.temperature)}, {s.kind})"
    return delta, (f"{pooled} Against AR: the Speedup's comparison ({s.label}), not these pooled figures.")


def _no_runs_text(ctx: Context, mode: str, proj, runs) -> str:
    """Why a mode's column is empty, and what to do: its runs in view completed no request (the Runs page shows
    them), the sidebar's filters leave out the store's runs of it (widen them), or the store has none (record both
    modes into this store, on the workload and with the settings of the runs in view, `runs`: the projection's
    comparable group, else the one group they form; `queries.record_both`, as the projection's caveat says it)."""
    name = MODE_NAMES[mode]
    if (ctx.sel.runs["mode"] == mode).any():
        return f"No completed {name} requests in view: the Runs page shows the status of its runs."
    left_out = left_out_text(ctx, mode)
    if left_out:
        return f"No {name} runs in view: {left_out} to compare."
    group = proj.comparison if proj is not None and proj.comparison is not None else None
    if group is None and len({key_of(r, COMPARED_FIELDS) for r in runs}) == 1:
        group = runs[0]  # one comparable group in view: its settings are the runs'
    workloads = set(ctx.sel.runs["workload"].dropna())
    workload = (group.workload if group is not None else next(iter(workloads)) if len(workloads) == 1 else "code")
    kinds = {r.kind for r in runs}  # runs of several groups, all of one kind: recorded as that kind's are
    _, how = record_both(data.engine(ctx.url), group, workload, always_db=True,
                         kind=next(iter(kinds)) if len(kinds) == 1 else None)
    return f"No {name} runs in view: the store has none. {how[0].upper()}{how[1:]}."


def _projection(ctx: Context, speedups):
    """The projection at the assumptions; `speedups`: the page's own (`data.speedups` of the same url and
    filters), which the projection's impossible-speedup caveat takes instead of querying them again."""
    a = assumptions.get()
    try:
        return data.projection(ctx.url, ctx.sel.filters, a, tuple(speedups)), a, None
    except ValueError as exc:  # nothing to project from, or no price for the device
        return None, a, in_page_words(str(exc))


def _vs_ar(spec: float | None, ar: float | None, compare: bool = True, what: str = "") -> dict:
    """st.metric's delta arguments for spec against AR: a whole percent, or one decimal below half a
    percent (a whole percent printed "-0%" with an arrow); an equal figure gets no arrow. `what`: the part
    compared, where it is not the figure shown (" (hardware parts)")."""
    if not compare or spec is None or ar is None or not ar:
        return {}
    change = (spec - ar) / ar
    for text in (f"{change:+.0%}", f"{change:+.1%}"):
        if text[1:].strip("0.%"):  # a digit other than zero: the change shows at this precision
            return {"delta": f"{text} vs AR{what}"}
    return {"delta": f"same as AR{what}", "delta_arrow": "off"}


def _cost_vs_ar(spec, ar, spec_source: str | None, ar_source: str | None) -> dict:
    """The spec cost tile's delta: totals where both modes' totals have one energy basis (none, or energy from
    the same kind of source), else their hardware parts, said so: estimated energy against metered energy
    (or against none) would show up as a difference in cost (as the report compares periods)."""
    if spec is None or ar is None:
        return {}
    basis = [src if c.energy_included else None for c, src in ((spec, spec_source), (ar, ar_source))]
    if basis[0] == basis[1]:
        return _vs_ar(spec.total_usd_per_1m, ar.total_usd_per_1m)
    return _vs_ar(spec.hardware_usd_per_1m, ar.hardware_usd_per_1m, what=" (hardware parts)")


def body(ctx: Context) -> None:
    f = ctx.sel.filters
    modes = {m.mode: m.stats for m in data.mode_summaries(ctx.url, f)}
    # priced as the Cost & capacity page prices them: its inputs where set, else the runs' own prices
    priced = priced_costs(ctx.url, f, assumptions.get())
    run_costs, mode_costs, unpriced = priced.run_costs, priced.mode_costs, priced.note
    # the runs in view (as costed or named unpriced, or as summarised where the prices were refused)
    runs = priced.runs() if not priced.error else data.run_summaries(ctx.url, f)
    # a mode's cost over only some of its runs (the others have no price) says so wherever it shows
    share = {m: priced.share(m) for m in modes}
    cost = {m.mode: m.cost for m in mode_costs}
    by_mode = {m.mode: m for m in mode_costs}
    # where each mode's energy comes from: measured | estimated | partly estimated (runs of both pooled)
    source = {m: energy_source(r for r in runs if r.mode == m) for m in modes}
    # and of the energy in each mode's cost: its priced runs' (an unpriced run's energy is in no cost)
    cost_source = {m: energy_source(rc.run for rc in run_costs if rc.run.mode == m) for m in modes}
    speedups = data.speedups(ctx.url, f)
    proj, a, proj_error = _projection(ctx, speedups)

    speed_value, speed_help = _speedup_text(speedups)
    spec = modes.get("spec")
    top = st.columns(3)
    top[0].metric("Speedup", speed_value, help=speed_help)
    for line in _paired_warnings(speedups):
        st.warning(f"Speedup: {md_safe(line)}")
    for line in above_acceptance_lines(speedups):  # the AR timing inflated: the tile and the savings rest on it
        st.warning(f"Speedup: {md_safe(line)}.")
    top[1].metric("Acceptance rate", fmt(spec.acceptance_rate if spec else None, ".1%"),
                  help="Accepted draft tokens / drafted tokens over the speculative runs in view. The "
                       "Speculation page shows it per domain beside alpha (accepted / tested), the per-token "
                       "figure `specfinops calibrate` reports, which the 0.65 go/no-go line judges.")
    savings = proj.projection.annual_savings_usd if proj else None
    top[2].metric("Projected annual savings", usd_amount(savings),
                  help=f"(nodes AR - nodes spec) x node $/h x 8,760 at {md_safe(assumptions.describe(a))}. "
                       "Change the assumptions on the Cost & capacity page."
                       + (" Overstated: it rests on a speedup above the mean acceptance length, where the AR timing "
                          "was inflated (see the warnings)." if proj and proj.speedup_above_acceptance else ""))
    if proj_error:
        st.caption(f"Projection: {md_safe(proj_error)}")
    elif proj:
        priced = f"priced as {node_price(proj.node_price)}"
        compared = comparison_text(proj)
        said = [*([compared] if compared else []), priced, *projection_notes(proj)]
        st.caption(md_safe("Projection: " + "; ".join(said) + "."))
        show_projection_caveats(proj, ctx)
    # the costs' disagreement with the savings: not where a mode's cost leaves runs out (no price)
    disagree = None if any(share.values()) else cost_vs_savings_note(cost.get("spec"), cost.get("ar"),
                                                                      proj.projection if proj else None)
    if disagree:
        st.caption(disagree)
    if unpriced:
        st.warning(f"Cost per 1M tokens: {md_safe(unpriced)}."
                   + (" The priced runs' costs are shown, each mode's over its priced runs only (said beside it)."
                      if run_costs else ""))
    incomplete = incomplete_runs_text(runs, SHOWN_RUN_IDS)
    if incomplete:
        st.caption(f"Note: {md_safe(incomplete)} The Runs page shows each run's status.")

    # the mode tiles pool every run in view: against AR only where those runs are one comparable group, and
    # said above them where they are not (in a tile's help alone it went unseen)
    groups = warn_pooled(runs, "the speculative and AR tiles below")
    mixed = len(groups) > 1
    mixed_help = (f" No change against AR shown: the runs in view span {len(groups)} comparable groups "
                  f"({md_safe('; '.join(groups))}), and each mode's figure pools them; {PICK_ONE_GROUP}."
                  if mixed else "")
    columns = st.columns(2, border=True)
    for col, mode in zip(columns, ("spec", "ar"), strict=True):
        s, c = modes.get(mode), cost.get(mode)
        mine = [rc for rc in run_costs if rc.run.mode == mode]  # this mode's runs as priced
        other_s, other_c = modes.get("ar"), cost.get("ar")
        with col:
            st.subheader(MODE_NAMES[mode])
            if s is None:
                st.info(md_safe(_no_runs_text(ctx, mode, proj, runs)))
                continue
            compare = mode == "spec" and not mixed
            said_mixed = mixed_help if mode == "spec" else ""
            # against AR only where both costs are over all of their mode's runs: a mode priced over some of its
            # runs against the other over all of them is no like-for-like change
            partly_priced = [f"{'AR' if m == 'ar' else 'spec'} {share[m]}" for m in ("spec", "ar")
                             if share.get(m) and m in cost]
            cost_compare = compare and not partly_priced
            # some requests have energy and some not: J/token covers those that do, the cost holds no energy
            partial = s.energy_j is not None and not s.energy_complete
            # only some runs have energy: how many, in the CLI's words
            some_runs = partial_energy_text(by_mode[mode], run_costs) if mode in by_mode else None
            no_energy = (f"{some_runs}; J/token covers the requests with energy" if some_runs
                         else "energy for only some requests; J/token covers those that do" if partial
                         else c.reason if c and c.reason  # e.g. measured energy left out: other hardware
                         else "energy not measured")
            # two tiles a row: at three a row in half the page, values such as "2653.9 ms" and the Tokens/s
            # delta were cut short with "..." on a 1400 px wide window
            rows = [st.columns(2) for _ in range(3)]
            cost_tile, tokens_tile = rows[0]
            p50_tile, p95_tile = rows[1]
            j_tile, length_tile = rows[2]
            total = c.total_usd_per_1m if c else None
            # a total whose energy part was estimated is labelled on the tile, as the J/token beside it
            estimated = bool(c and c.energy_included and c.energy_estimated)
            partly = source[mode] == PARTLY_ESTIMATED
            cost_delta = _cost_vs_ar(c, other_c, cost_source[mode], cost_source.get("ar")) if cost_compare else {}
            on_hardware = "(hardware parts)" in cost_delta.get("delta", "")
            cost_partly = cost_source[mode] == PARTLY_ESTIMATED
            cost_tile.metric("Cost per 1M tokens" + (f" (incl. {'partly ' if cost_partly else ''}estimated energy)"
                                                 if estimated else ""), usd_amount(total),
                         **cost_delta,
                         delta_color="inverse",
                         # each part a sentence of its own: "... x 1e6 Energy part is an estimate." ran them on
                         help="(node $/h x node hours + kWh x PUE x $/kWh) / output tokens x 1e6."
                              + ("" if total is None or c.energy_included
                                 else f" Hardware only: {md_safe(no_energy)}.")
                              + (f" No cost: {c.reason}." if total is None and c and c.reason else "")
                              + ((" Energy part is partly an estimate." if cost_partly
                                  else " Energy part is an estimate.") if estimated else "")
                              + (f" Prices: {md_safe(prices_text(mine, a))}." if c
                                 else f" No cost: {md_safe(unpriced)}." if unpriced else "")
                              + (f" Over the priced runs only: {md_safe(share[mode])}; {md_safe(unpriced)}."
                                 if c and share.get(mode) else "")
                              + (" No change against AR shown: "
                                 f"{md_safe('; '.join(partly_priced))} (no like-for-like comparison)."
                                 if compare and partly_priced else "")
                              + (" Against AR: the hardware parts, as the two totals' energy is not on one basis "
                                 "(estimated in one, metered or absent in the other)." if on_hardware else "")
                              + said_mixed)
            p50_tile.metric("TPOT p50", fmt(s.tpot_p50_ms, ".1f", suffix=" ms"),
                         **_vs_ar(s.tpot_p50_ms, other_s.tpot_p50_ms if other_s else None, compare),
                         delta_color="inverse",
                         help="p50 over every request of the mode in view." + said_mixed)
            cap_p95 = (proj.capacity_tpot_p95_ms_spec if mode == "spec" else proj.capacity_tpot_p95_ms_ar) \
                if proj else None
            p95_tile.metric("TPOT p95", fmt(s.tpot_p95_ms, ".1f", suffix=" ms"),
                         **_vs_ar(s.tpot_p95_ms, other_s.tpot_p95_ms if other_s else None, compare),
                         delta_color="inverse",
                         help="p95 over every request of the mode in view."
                              + (f" The projection sizes this mode on a configuration with p95 TPOT "
                                 f"{sla_ms_text(cap_p95, proj.projection.sla_ms)} (SLA "
                                 f"{proj.projection.sla_ms:g} ms; Cost & capacity)." if cap_p95 is not None
                                 else "")
                              + said_mixed)
            j_label = "J/token (partly estimated)" if partly else "J/token (estimate)" if s.energy_estimated \
                else "J/token"
            j_tile.metric(j_label, j_per_token_text(s.j_per_token),
                         help="Energy attributed to the requests / output tokens."
                              + (" Power partly estimated (see below)." if partly
                                 else " Power was estimated (no power meter)." if s.energy_estimated else ""))
            tokens_delta, tokens_help = _tokens_vs_ar(speedups) if mode == "spec" else ({}, None)
            # three significant digits (1.03 and 0.471, not 1.0 and 0.5 beside a +118% delta)
            tokens_tile.metric("Tokens/s", throughput(s.tokens_per_s), **tokens_delta, help=tokens_help)
            length_tile.metric("Accept. length", fmt(s.mean_acceptance_length, ".2f") if mode == "spec" else MISSING,
                         help="1 + accepted / drafts: tokens per target forward (bonus included).")
            # the tiles' labels are cut short in a narrow column: the estimate is said where it shows in full
            runs_text = (energy_sources_text((r for r in runs if r.mode == mode), SHOWN_RUN_IDS)
                         if partly else "")
            said = []
            if estimated:
                said.append(f"cost includes partly estimated energy ({runs_text})" if partly
                            else "cost includes estimated energy")
            if s.energy_estimated and s.j_per_token is not None:
                said.append("J/token partly estimated" + ("" if estimated else f" ({runs_text})") if partly
                            else "J/token is an estimate")
            # a client that disconnected is no failure: cancelled requests are said apart
            st.caption(f"{s.num_requests_ok:,} request{'' if s.num_requests_ok == 1 else 's'} ok, "
                       f"{s.num_requests_errored:,} failed, "
                       + (f"{s.num_requests_cancelled:,} cancelled, " if s.num_requests_cancelled else "")
                       + f"{s.output_tokens:,} output "
                       f"token{'' if s.output_tokens == 1 else 's'}"
                       + (f" · cost is hardware only ({md_safe(no_energy)})"
                          if total is not None and not c.energy_included
                          else f" · no cost ({md_safe(c.reason)})" if total is None and c and c.reason else "")
                       + (f" · cost {md_safe(share[mode])}" if c and share.get(mode) else "")
                       + "".join(f" · {md_safe(x)}" for x in said))

    if speedups:
        with st.expander("Speedup by configuration", expanded=len(speedups) > 1):
            # what differs first (a target, a drafter, a concurrency) and the result; then what the rows share
            if len(speedups) > 1:
                st.caption("One row per configuration: spec against AR at one sampling, answer length cap and run "
                           "kind, over the prompts both ran where they recorded prompt ids (a load test's over all "
                           "its requests: it sends the prompts round-robin for a fixed time); rows are not pooled.")
            st.caption("speedup pools every run of the row's configuration in view; paired invocations: the ratio "
                       "within each bench or load test that ran both modes (one machine's conditions for both).")
            show_table(speedup_table(speedups))
        over = paired_over_time(speedups, ctx.sel.runs)
        if over is not None:
            st.plotly_chart(charts.paired_speedups(over), width="stretch")
            st.caption("Each point is one bench or load test that ran both modes: its own spec / AR tokens/s, "
                       "measured under one machine's conditions. The dashed line is the configuration's pooled "
                       "figure over every run in view; the sidebar's Invocation picks one.")


run_page("Overview", body, "What speculative decoding buys on your runs: spec vs the AR baseline, same prompts and hardware.")

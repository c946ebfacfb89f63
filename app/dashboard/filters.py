"""Sidebar filters, rendered once in the entry file so their values hold across pages.

Time range, node, model pair (target <- drafter), workload, temperature, top_p, top_k, max new tokens (the answer
length cap), run kind, domain, concurrency, invocation (one bench or load test) and runs become one
`telemetry.queries.Filters`. A model pair keeps the AR baseline runs of the same target (they have no
drafter), so spec and AR stay side by side; it is resolved to run ids here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

import pandas as pd
import streamlit as st

from app.dashboard.page_queries import as_utc, nice_bucket_s
from telemetry.labels import short_model, short_workload
from telemetry.queries import MAX_NEW_TOKENS, MAX_TOP_K, SYNTHETIC_HOSTNAME, SYNTHETIC_WORKLOAD, Filters

ALL = "All"


@dataclass(frozen=True, slots=True)
class Selection:
    """What the sidebar selected: the Filters for the queries and the matching runs for labels."""

    filters: Filters
    runs: pd.DataFrame  # filter_options()["runs"] rows of the selected runs
    bucket_s: int  # time-bucket size for charts over time
    synthetic: bool  # some selected runs are synthetic (generator output, not measurements)


def pair_label(target: str, drafter: str) -> str:
    return f"{short_model(target)} ← {drafter}"


def _day(value) -> date | None:
    """The UTC date of a store time (naive = UTC on SQLite; aware in the session's zone on PostgreSQL)."""
    if value is None or pd.isna(value):
        return None
    return as_utc(value).date()


def data_span_s(runs: pd.DataFrame, since: datetime | None, until: datetime | None) -> float:
    """Seconds between the first and last request in view: sizes the time buckets of the charts."""
    firsts = [as_utc(v) for v in runs["first_request"] if not pd.isna(v)]
    lasts = [as_utc(v) for v in runs["last_request"] if not pd.isna(v)]
    if not firsts or not lasts:
        return 3600.0
    lo, hi = min(firsts), max(lasts)
    lo, hi = max(lo, since) if since else lo, min(hi, until) if until else hi
    return max((hi - lo).total_seconds(), 1.0)


def in_range(runs: pd.DataFrame, since: datetime, until: datetime) -> pd.Series:
    """Which runs had a request start in [since, until) or span it (a run without requests has none)."""
    first = pd.to_datetime(runs["first_request"], utc=True)
    last = pd.to_datetime(runs["last_request"], utc=True)
    return (last >= since) & (first < until)


def sweeps_in_view(sweeps: list[dict], f: Filters) -> list[dict]:
    """The sweeps the sidebar's node, workload and run filters keep (a sweep is kept when any of its runs is
    among the picked ones)."""
    keep = []
    for sw in sweeps:
        if f.node_id is not None and sw["node"] != f.node_id:
            continue
        if f.workload is not None and sw["workload"] != f.workload:
            continue
        if f.run_ids is not None and not set(sw["run_ids"]) & set(f.run_ids):
            continue
        keep.append(sw)
    return keep


def effective_cutoffs(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run, its top_p and top_k as they act on decoding (queries.effective_cutoffs, as Filters match them): a
    greedy run's (temperature 0) are off, 1 and 0, whatever it recorded; an unknown one stays missing."""
    greedy = runs["temperature"] == 0
    return pd.DataFrame({"top_p": runs["top_p"].astype("Float64").mask(greedy, 1.0),
                         "top_k": runs["top_k"].astype("Int64").mask(greedy, 0)}, index=runs.index)


def _cutoff_choices(values: pd.Series, valid) -> list:
    """The values of a cut-off the runs hold that Filters takes (`valid`), as plain numbers (missing, unknown,
    left out: no filter picks it); none where picking one would narrow nothing (one value and no unknown)."""
    known = sorted({x for x in (v.item() if hasattr(v, "item") else v for v in values.dropna()) if valid(x)})
    return known if known and (len(known) > 1 or values.isna().any()) else []


def invocation_choices(runs: pd.DataFrame) -> dict[str, str]:
    """The runs' invocations, newest first (by their first run's start): id -> '1a2b3c4d · 2026-12-06 01:23 ·
    bench · code · 14 runs'."""
    have = runs[runs["invocation_id"].notna()]
    if have.empty:
        return {}
    out = {}
    for inv, group in sorted(have.groupby("invocation_id"), key=lambda kv: as_utc(kv[1]["started_at"].min()),
                             reverse=True):
        start = as_utc(group["started_at"].min())
        what = " · ".join(",".join(sorted(group[c].dropna().unique())) for c in ("kind", "workload"))
        out[str(inv)] = f"{str(inv)[:8]} · {start:%Y-%m-%d %H:%M} · {what} · {len(group)} runs"
    return out


TIME_KEY = "f_time"
TIME_BOUNDS_KEY = "_f_time_bounds"  # the store's first and last request day when the range was last drawn


def _follow_store_days(lo: date, hi: date) -> None:
    """Keep the time range in step with the store's days [lo, hi] before its widget is drawn. A range left
    whole follows the store: runs recorded on a later day while the page stays open are in view (the widget
    kept the old last day, and that range then counted as narrowed: the new runs were left out, silently). A
    narrowed range is kept, cut to the days the store still holds."""
    state = st.session_state
    before, picked = state.get(TIME_BOUNDS_KEY), state.get(TIME_KEY)
    state[TIME_BOUNDS_KEY] = (lo, hi)
    if picked is None or before is None:
        state[TIME_KEY] = (lo, hi)
        return
    if before == (lo, hi):
        return
    picked = tuple(picked)
    if len(picked) != 2 or picked == tuple(before):
        state[TIME_KEY] = (lo, hi)
        return
    start, end = max(picked[0], lo), min(picked[1], hi)
    state[TIME_KEY] = (start, end) if start <= end else (lo, hi)


def time_range_refused(picked) -> str | None:
    """Why the time range picked (the date input's value) cannot be used, in words; None where it can: only its
    start day is picked (a range is picked in two clicks, and the figures kept the whole range after the first,
    silently), none is, or it ends before it starts."""
    days = tuple(picked) if isinstance(picked, tuple | list) else (picked,) if picked else ()
    if len(days) == 2:
        return None if days[0] <= days[1] else (f"it ends ({days[1]:%Y-%m-%d}) before it starts "
                                                f"({days[0]:%Y-%m-%d}), refused")
    if len(days) == 1:
        return f"only its start day ({days[0]:%Y-%m-%d}) is picked: pick its last day too"
    return "no day is picked"


def sidebar(options: dict) -> Selection:
    """Render the filters in the sidebar and return the selection."""
    runs: pd.DataFrame = options["runs"]
    sb = st.sidebar
    sb.header("Filters")

    firsts = [d for d in (_day(v) for v in runs["first_request"]) if d is not None]
    lasts = [d for d in (_day(v) for v in runs["last_request"]) if d is not None]
    today = datetime.now(UTC).date()
    lo, hi = (min(firsts), max(lasts)) if firsts and lasts else (today, today)
    _follow_store_days(lo, hi)
    picked = sb.date_input("Time range (UTC)", min_value=lo, max_value=hi, key=TIME_KEY)
    since = until = None
    refused = time_range_refused(picked)
    if refused:  # the whole range, said so: it read as if the range picked were in view
        sb.warning(f"Time range: {refused}; the figures use the store's whole range, {lo:%Y-%m-%d} to {hi:%Y-%m-%d}.")
    elif isinstance(picked, tuple | list) and len(picked) == 2:
        since = datetime.combine(picked[0], time.min, tzinfo=UTC)
        until = datetime.combine(picked[1], time.min, tzinfo=UTC) + timedelta(days=1)

    node = sb.selectbox("Node", [ALL, *sorted(runs["node_id"].dropna().unique())], key="f_node")
    spec = runs[runs["mode"] == "spec"]
    pairs = sorted({(t, d) for t, d in zip(spec["target"], spec["drafter"], strict=True) if d})
    pair_labels = [pair_label(t, d) for t, d in pairs]
    if len(set(pair_labels)) < len(pair_labels):  # two targets in directories of the same name: whole paths
        pair_labels = [f"{t} ← {d}" for t, d in pairs]
    pair = sb.selectbox("Model pair (target ← drafter)", [ALL, *pair_labels], key="f_pair")
    workloads = sorted(runs["workload"].dropna().unique())
    # a workload file by its name (runs record its absolute path); whole paths where two files share a name
    names = {w: short_workload(w) for w in workloads}
    shown = names if len(set(names.values())) == len(names) else {}
    workload = sb.selectbox("Workload", [ALL, *workloads], format_func=lambda w: shown.get(w, w), key="f_workload")
    # spec and AR compare only at one temperature and run kind: offered where the runs hold several
    temps = sorted({float(t) for t in runs["temperature"].dropna()})
    temperature = sb.selectbox(
        "Temperature", [ALL, *temps], format_func=lambda t: t if t == ALL else f"{t:g}", key="f_temperature",
        help="Sampling temperature the runs were recorded at. Speedups are per temperature; the projection "
             "compares one temperature (and run kind) and says which.") if len(temps) > 1 else ALL
    # and at one top_p and top_k (greedy runs count as off: 1 and 0); offered where picking one narrows the runs
    cutoffs = effective_cutoffs(runs)
    top_ps = _cutoff_choices(cutoffs["top_p"], lambda p: 0 < p <= 1)
    top_p = sb.selectbox(
        "top_p", [ALL, *top_ps], format_func=lambda v: v if v == ALL else f"{v:g}", key="f_top_p",
        help="Nucleus cut-off the runs sampled with (1 = off; greedy runs count as 1). Speedups are per top_p; "
             "the projection compares one and says which.") if top_ps else ALL
    top_ks = _cutoff_choices(cutoffs["top_k"], lambda k: 0 <= k <= MAX_TOP_K)
    top_k = sb.selectbox(
        "top_k", [ALL, *top_ks], format_func=lambda v: v if v == ALL else str(v), key="f_top_k",
        help="Top-k cut-off the runs sampled with (0 = off; greedy runs count as 0). Speedups are per top_k; "
             "the projection compares one and says which.") if top_ks else ALL
    # and at one answer length cap (a server's runs, and runs recorded before the store kept it, have none: unknown)
    caps = _cutoff_choices(runs["max_new_tokens"].astype("Int64"), lambda n: 1 <= n <= MAX_NEW_TOKENS)
    max_new_tokens = sb.selectbox(
        "Max new tokens", [ALL, *caps], format_func=lambda v: v if v == ALL else str(v), key="f_max_new_tokens",
        help="Answer length cap the runs were recorded with (bench --max-new-tokens, loadtest --max-tokens). "
             "Per-token latency and acceptance change along an answer: speedups are per cap; the projection "
             "compares one and says which.") if caps else ALL
    kinds = sorted(runs["kind"].dropna().unique())
    kind = sb.selectbox(
        "Run kind", [ALL, *kinds], key="f_kind",
        help="bench: the engine timed; loadtest: its HTTP clients; serve: the server. Not compared across "
             "kinds.") if len(kinds) > 1 else ALL
    domain = sb.selectbox("Domain", [ALL, *options["domains"]], key="f_domain")
    levels = sorted({int(c) for c in runs["concurrency"].dropna()})
    concurrency = sb.selectbox(
        "Concurrency", [ALL, *levels], key="f_concurrency",
        help="Sequences in flight when the runs were measured. Latency and throughput depend on it: a sweep "
             "(bench --concurrency 1,2,4,...) pools every level unless one is picked.") if len(levels) > 1 else ALL
    # one bench or load test: its spec and AR runs ran under the same machine conditions (offered where the runs
    # hold several invocations, or one beside runs of none: a server's)
    invocations = invocation_choices(runs)
    invocation = sb.selectbox(
        "Invocation", [ALL, *invocations], format_func=lambda i: invocations.get(i, i), key="f_invocation",
        help="One bench or load test (newest first; `specfinops invocations` lists them with their speedups). "
             "All pools every invocation in view; the Overview gives each one's paired speedup beside the "
             "pooled figure.") if len(invocations) > 1 or (invocations and runs["invocation_id"].isna().any()) \
        else ALL

    chosen = runs
    if since is not None and (picked[0], picked[1]) != (lo, hi):  # a narrowed range: only the runs it overlaps
        chosen = chosen[in_range(chosen, since, until)]
    else:  # the whole store's days: no time filter, so the queries read the store as `cost` and `project` do
        since = until = None  # (a window would cut a run's wall time to its requests' span, or drop it)
    if node != ALL:
        chosen = chosen[chosen["node_id"] == node]
    if workload != ALL:
        chosen = chosen[chosen["workload"] == workload]
    if temperature != ALL:
        chosen = chosen[chosen["temperature"] == temperature]
    if top_p != ALL:
        chosen = chosen[(effective_cutoffs(chosen)["top_p"] == top_p).fillna(False)]
    if top_k != ALL:
        chosen = chosen[(effective_cutoffs(chosen)["top_k"] == top_k).fillna(False)]
    if max_new_tokens != ALL:
        chosen = chosen[(chosen["max_new_tokens"].astype("Int64") == max_new_tokens).fillna(False)]
    if kind != ALL:
        chosen = chosen[chosen["kind"] == kind]
    if pair != ALL:
        target, drafter = pairs[pair_labels.index(pair)]
        chosen = chosen[(chosen["target"] == target) & ((chosen["drafter"] == drafter) | (chosen["mode"] == "ar"))]
    if concurrency != ALL:
        chosen = chosen[chosen["concurrency"] == concurrency]
    if invocation != ALL:
        chosen = chosen[chosen["invocation_id"] == invocation]

    run_label = {int(r.run_id): f"#{r.run_id} {r.mode} · {short_workload(r.workload)} · c={r.concurrency} · {r.node_id}"
                 for r in chosen.itertuples()}
    run_pick = sb.multiselect("Runs", list(run_label), format_func=lambda i: run_label.get(i, f"#{i}"), key="f_runs",
                              help="Empty: every run matching the filters above.")
    if run_pick:
        chosen = chosen[chosen["run_id"].isin(run_pick)]

    filters = Filters(
        since=since,
        until=until,
        node_id=None if node == ALL else node,
        workload=None if workload == ALL else workload,
        domain=None if domain == ALL else domain,
        temperature=None if temperature == ALL else temperature,
        kind=None if kind == ALL else kind,
        top_p=None if top_p == ALL else float(top_p),
        top_k=None if top_k == ALL else int(top_k),
        max_new_tokens=None if max_new_tokens == ALL else int(max_new_tokens),
        invocation_id=None if invocation == ALL else invocation,
        # resolved to run ids where a filter the queries cannot express is set; a temperature, cut-off, answer
        # length cap or run kind too, so that the recorded sweeps (kept by their runs) follow it
        run_ids=tuple(int(i) for i in chosen["run_id"])
        if (pair != ALL or concurrency != ALL or run_pick or temperature != ALL or kind != ALL or top_p != ALL
            or top_k != ALL or max_new_tokens != ALL or invocation != ALL) else None,
    )
    span_s = data_span_s(chosen, since, until)
    synthetic = bool(((chosen["workload"] == SYNTHETIC_WORKLOAD) | (chosen["hostname"] == SYNTHETIC_HOSTNAME)).any())
    return Selection(filters=filters, runs=chosen, bucket_s=nice_bucket_s(span_s), synthetic=synthetic)

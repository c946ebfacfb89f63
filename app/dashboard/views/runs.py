"""Runs: the run table, two runs side by side, and CSV downloads (tables and raw records)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.dashboard import data
from app.dashboard.common import (
    MISSING,
    Context,
    download_csv,
    fmt,
    run_page,
    show_table,
    table_height,
    throughput,
)
from app.dashboard.filters import short_model, short_workload
from app.dashboard.page_queries import as_utc
from telemetry.labels import j_per_token_text

RAW_KINDS = ("requests", "steps", "tokens", "power")


# the run's sampling; a missing one (a server's run: its requests chose theirs; a run recorded before the store
# kept it) is a dash, never 0. Whole numbers stay whole: built as nullable integers, not through floats (a seed
# past 2**53 would lose digits).
SAMPLING_INTS = {"top_k": "top_k", "seed": "seed", "max new tokens": "max_new_tokens"}


def run_table(runs) -> pd.DataFrame:
    table = pd.DataFrame([{
        "run": r.run_id, "mode": r.mode, "kind": r.kind, "invocation": r.invocation_id,
        "started (UTC)": as_utc(r.started_at), "status": r.status,
        "node": r.node_id, "device": r.device, "target": r.target, "drafter": r.drafter, "K policy": r.k_policy,
        "workload": r.workload, "concurrency": r.concurrency, "temperature": r.temperature, "top_p": r.top_p,
        "top_k": r.top_k, "seed": r.seed, "max new tokens": r.max_new_tokens, "power source": r.power_source,
        "requests ok": r.stats.num_requests_ok, "failed": r.stats.num_requests_errored,
        "cancelled": r.stats.num_requests_cancelled,
        "output tokens": r.stats.output_tokens, "tokens/s": r.stats.tokens_per_s,
        "acceptance rate": r.stats.acceptance_rate, "mean acceptance length": r.stats.mean_acceptance_length,
        "TTFT p50 (ms)": r.stats.ttft_p50_ms, "TTFT p95 (ms)": r.stats.ttft_p95_ms,
        "TPOT p50 (ms)": r.stats.tpot_p50_ms, "TPOT p95 (ms)": r.stats.tpot_p95_ms,
        "J/token": r.stats.j_per_token, "energy estimated": r.stats.energy_estimated if r.stats.energy_j is not None else None,
    } for r in runs])
    for column, attr in SAMPLING_INTS.items():
        table[column] = pd.array([getattr(r, attr) for r in runs], dtype="Int64")
    return table


def _whole(value) -> str:
    return MISSING if value is None else str(value)


COMPARE_ROWS = [
    ("mode", lambda r: r.mode), ("status", lambda r: r.status), ("invocation", lambda r: (r.invocation_id or MISSING)[:8]),
    ("workload", lambda r: short_workload(r.workload)), ("node", lambda r: r.node_id),
    ("device", lambda r: r.device), ("target", lambda r: short_model(r.target)), ("drafter", lambda r: r.drafter or MISSING),
    ("K policy", lambda r: r.k_policy), ("concurrency", lambda r: str(r.concurrency)),
    ("temperature", lambda r: fmt(r.temperature, "g")), ("top_p", lambda r: fmt(r.top_p, "g")),
    ("top_k", lambda r: _whole(r.top_k)), ("seed", lambda r: _whole(r.seed)),
    ("max new tokens", lambda r: _whole(r.max_new_tokens)),
    ("requests ok", lambda r: f"{r.stats.num_requests_ok:,}"),
    ("output tokens", lambda r: f"{r.stats.output_tokens:,}"),
    ("tokens/s", lambda r: throughput(r.stats.tokens_per_s)),
    ("acceptance rate", lambda r: fmt(r.stats.acceptance_rate, ".1%")),
    ("mean acceptance length", lambda r: fmt(r.stats.mean_acceptance_length, ".2f")),
    ("TTFT p50 / p95 (ms)", lambda r: f"{fmt(r.stats.ttft_p50_ms, '.1f')} / {fmt(r.stats.ttft_p95_ms, '.1f')}"),
    ("TPOT p50 / p95 (ms)", lambda r: f"{fmt(r.stats.tpot_p50_ms, '.1f')} / {fmt(r.stats.tpot_p95_ms, '.1f')}"),
    # a missing J/token is a dash, with no estimate label on nothing
    ("J/token", lambda r: j_per_token_text(r.stats.j_per_token)
     + (" (estimate)" if r.stats.energy_estimated and r.stats.j_per_token is not None else "")),
]


def _ready(r) -> tuple[bool, bool]:
    """How fit a run is to compare: it produced tokens (a failed or empty run compares as nothing), it completed
    (a cancelled, failed or killed one, still 'running', measured part of its prompts)."""
    return bool(r.stats.output_tokens), r.status == "completed"


def default_pair(runs) -> tuple[int, int] | None:
    """The comparison's default (spec, AR) run ids: a spec and an AR run of one comparable group (COMPARED_FIELDS
    and concurrency: the same workload, sampling, answer length cap, run kind, target and hardware), both with
    tokens, then both completed, then of one invocation (one bench: one machine's conditions), then the newest.
    None where no group holds both modes."""
    from collections import defaultdict

    from telemetry.queries import COMPARED_FIELDS, key_of

    def best(rs):
        return max(rs, key=lambda r: (_ready(r), r.run_id))

    # each group's runs of each mode, and of each invocation of it: one pass (filtering a group's runs per
    # invocation took a time quadratic in the runs: 12 s for 16,000 runs, on every rerun of the page)
    groups: dict[tuple, dict[str, list]] = defaultdict(lambda: {"spec": [], "ar": []})
    invocations: dict[tuple, dict[str, dict[str, list]]] = defaultdict(lambda: {"spec": {}, "ar": {}})
    for r in runs:
        if r.mode in ("spec", "ar"):
            key = (*key_of(r, COMPARED_FIELDS), r.concurrency)
            groups[key][r.mode].append(r)
            inv = r.invocation_id
            if inv is not None:
                invocations[key][r.mode].setdefault(inv, []).append(r)
    pairs = []
    for key, g in groups.items():
        if not g["spec"] or not g["ar"]:
            continue
        pairs.append((best(g["spec"]), best(g["ar"])))
        by_inv = invocations[key]
        for inv in by_inv["spec"].keys() & by_inv["ar"].keys():
            pairs.append((best(by_inv["spec"][inv]), best(by_inv["ar"][inv])))

    def rank(pair) -> tuple:
        spec, ar = pair
        ready = tuple(x and y for x, y in zip(_ready(spec), _ready(ar), strict=True))
        together = spec.invocation_id is not None and spec.invocation_id == ar.invocation_id
        return (*ready, together, max(spec.run_id, ar.run_id), min(spec.run_id, ar.run_id))

    if not pairs:
        return None
    spec, ar = max(pairs, key=rank)
    return spec.run_id, ar.run_id


def _raw_csv(url: str, what: str, run_id: int) -> bytes:
    from telemetry.export import ExportWindow, export_rows, iter_csv_chunks

    header, rows = export_rows(data.engine(url), what, ExportWindow(run_id=run_id))
    return "".join(iter_csv_chunks(header, rows)).encode("utf-8")


def body(ctx: Context) -> None:
    runs = data.run_summaries(ctx.url, ctx.sel.filters)
    if not runs:
        st.info("No runs with requests in view.")
        return
    table = run_table(runs)
    st.subheader(f"Runs ({len(runs)})")
    # the model and a workload file by their names on the page (the whole paths in the CSV); every row without an
    # inner scrollbar up to 25 runs
    # a seed is an identifier: shown without thousands separators (the CSV keeps the number); an invocation by
    # its first 8 digits, as bench prints it for `--invocation` (the CSV keeps the whole id)
    show_table(table.assign(target=table["target"].map(short_model), workload=table["workload"].map(short_workload),
                            seed=table["seed"].astype("string"),
                            invocation=table["invocation"].str[:8]),
               table_height(min(len(table), 25)))
    download_csv("Download run table (CSV)", table, "runs.csv", "dl_runs")

    st.subheader("Compare two runs")
    by_id = {r.run_id: r for r in runs}
    ids = list(by_id)
    # a comparable spec and AR pair (default_pair); where none, the fittest and newest run of each mode
    # (_ready: a failed or empty run compares as nothing), else any
    pair = default_pair(runs)
    if pair is None:
        spec = sorted((r for r in runs if r.mode == "spec"), key=lambda r: (_ready(r), r.run_id))
        ar = sorted((r for r in runs if r.mode == "ar"), key=lambda r: (_ready(r), r.run_id))
        pair = (spec[-1].run_id if spec else ids[0], ar[-1].run_id if ar else ids[-1])
    default_a, default_b = pair
    label = {i: f"#{i} {by_id[i].mode} · {by_id[i].workload} · {by_id[i].node_id}" for i in ids}
    c1, c2 = st.columns(2)
    a = c1.selectbox("Run A", ids, index=ids.index(default_a), format_func=label.get, key="cmp_a")
    b = c2.selectbox("Run B", ids, index=ids.index(default_b), format_func=label.get, key="cmp_b")
    compare = pd.DataFrame({"figure": [n for n, _ in COMPARE_ROWS],
                            f"run #{a}": [get(by_id[a]) for _, get in COMPARE_ROWS],
                            f"run #{b}": [get(by_id[b]) for _, get in COMPARE_ROWS]})
    show_table(compare, table_height(len(compare)))
    # the CSV holds the run table's numbers, one column a run (the page's "36.9%" and "—" are for reading)
    raw = table.set_index("run").loc[[a, b]].T.reset_index(names="figure")
    raw.columns = ["figure", f"run #{a}", f"run #{b}"]
    download_csv("Download comparison (CSV)", raw, f"compare-{a}-{b}.csv", "dl_compare")

    st.subheader("Raw records of one run")
    c1, c2, c3 = st.columns([2, 2, 3])
    rid = c1.selectbox("Run", ids, format_func=label.get, key="raw_run")
    what = c2.selectbox("Records", RAW_KINDS, key="raw_what")
    # the download is built in memory when clicked: past the cap, the command that streams it instead
    cap = data.RAW_DOWNLOAD_MAX_ROWS
    too_many = data.raw_rows(ctx.url, what, rid, cap) > cap
    file_name = f"run-{rid}-{what}.csv"
    with c3:
        st.download_button(f"Download {what} of run #{rid} (CSV)", data=lambda: _raw_csv(ctx.url, what, rid),
                           file_name=file_name, mime="text/csv", key="dl_raw", on_click="ignore", disabled=too_many)
    if too_many:
        st.info(f"Run #{rid}'s {what} CSV would have more than {cap:,} rows: too many to build in the dashboard. "
                f"Export it with `specfinops export --what {what} --run {rid} --out {file_name}` (add `--db URL` "
                "where the store is not the default), which streams in constant memory.")
    st.caption("Large exports: `specfinops export --what tokens --run ID --out FILE` streams in constant memory. "
               "Text cells that a spreadsheet would run as formulas are escaped.")


run_page("Runs", body, "Every run in view, two runs side by side, and CSV downloads of any table.")

"""Cached data access for the dashboard pages.

Every function is cached with a ttl and keyed by its arguments: the store URL and the filter values
(`Filters` is a frozen dataclass; Streamlit hashes it by value). The uncached work lives in
`telemetry.queries` (the shared figures) and `app.dashboard.page_queries` (page-specific SQL), which the
benchmark calls directly.
"""

from __future__ import annotations

import sys

import streamlit as st
from sqlalchemy.engine import Engine

from app.dashboard import page_queries as pq
from telemetry import costing, prices, queries
from telemetry.queries import Filters
from telemetry.store import open_store

TTL_S = 60


def db_url() -> str:
    """The store URL: `--db URL` after `--` on the streamlit command line, else $SPECFINOPS_DB_URL (the URL
    `specfinops dashboard` resolved; checked as every command checks it: a ValueError naming the variable where it
    names no store), else the default SQLite file (resolved by telemetry.db)."""
    argv = sys.argv[1:]
    if "--db" in argv and argv.index("--db") + 1 < len(argv):
        return argv[argv.index("--db") + 1]
    from telemetry.db import resolve_db_url

    return resolve_db_url(None)


@st.cache_resource(show_spinner=False)
def engine(url: str) -> Engine:
    # must_exist: however the dashboard was started (`specfinops dashboard` checks at launch, `streamlit run` does
    # not), a mistyped path or another application's database is named, not given the store's tables
    return open_store(url, must_exist=True)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def count_runs(url: str) -> int:
    return pq.count_runs(engine(url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def filter_options(url: str) -> dict:
    return pq.filter_options(engine(url))


@st.cache_data(ttl=TTL_S, show_spinner="Summarising runs...")
def run_summaries(url: str, f: Filters) -> list[queries.RunSummary]:
    return queries.run_summaries(engine(url), f)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def mode_summaries(url: str, f: Filters) -> list[queries.ModeSummary]:
    return queries.mode_summaries(engine(url), f)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def speedups(url: str, f: Filters) -> list[queries.Speedup]:
    return queries.speedups(engine(url), f)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def acceptance_by_domain(url: str, f: Filters) -> list[queries.DomainAcceptance]:
    return queries.acceptance_by_domain(engine(url), f)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def costs(url: str, f: Filters, gpu: str | None = None, node_hourly_usd: float | None = None,
          usd_per_kwh: float | None = None, pue: float | None = None,
          ) -> tuple[list[costing.RunCost], list[costing.ModeCost], list[queries.RunSummary]]:
    """`costing.costs_and_unpriced` at these prices (one left None keeps each run's recorded price, else the
    catalog's): the priced runs' costs, each mode's over its priced runs, and the runs no price covers."""
    return costing.costs_and_unpriced(engine(url), f, gpu=gpu, node_hourly_usd=node_hourly_usd,
                                      usd_per_kwh=usd_per_kwh, pue=pue)


# how the dashboard prices runs no catalog entry covers: its own inputs, not `cost`'s flags
UNPRICED_HERE = ("or leave them out with the sidebar's filters, or price every run in view as one device: pick a "
                 "catalog GPU or a custom $/h as the Node price on the Cost & capacity page")


@st.cache_data(ttl=TTL_S, show_spinner=False)
def projection(url: str, f: Filters, inputs: dict,
               _speedups: tuple[queries.Speedup, ...] | None = None) -> costing.StoreProjection:
    """`costing.project_from_store` (which runs `finops.project` on the measured capacities). `_speedups`: the
    page's `speedups(url, f)` where it has them already (the Overview), taken for the projection's
    impossible-speedup caveat instead of querying them again; not part of the cache key (Streamlit hashes no
    argument named with a leading underscore): they are a function of `url` and `f`, which are. A bench its
    caveats suggest names this store with --db (the default of this process is not the user's shell's)."""
    return costing.project_from_store(engine(url), f, **inputs, speedups_in_view=_speedups, name_store=True)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def price_catalog(url: str) -> list[prices.PriceEntry]:
    return prices.list_prices(engine(url))


@st.cache_data(ttl=TTL_S, show_spinner="Computing inter-token latency...")
def itl_histogram(url: str, f: Filters) -> pq.ItlHistogram:
    return pq.itl_histogram(engine(url), f)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def latency_histograms(url: str, f: Filters):
    return pq.latency_histograms(engine(url), f)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def latency_percentiles(url: str, f: Filters):
    return pq.latency_percentiles(engine(url), f, latency_histograms(url, f))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def latency_over_time(url: str, f: Filters, bucket_s: int):
    return pq.latency_over_time(engine(url), f, bucket_s)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def acceptance_over_time(url: str, f: Filters, bucket_s: int):
    return pq.acceptance_over_time(engine(url), f, bucket_s)


@st.cache_data(ttl=TTL_S, show_spinner="Reading decode steps...")
def acceptance_by_position(url: str, f: Filters):
    return pq.acceptance_by_position(engine(url), f)


@st.cache_data(ttl=TTL_S, show_spinner="Reading decode steps...")
def acceptance_along_answer(url: str, f: Filters):
    return pq.acceptance_along_answer(engine(url), f)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def power_over_time(url: str, f: Filters, bucket_s: int):
    return pq.power_over_time(engine(url), f, bucket_s)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def sweeps(url: str) -> list[dict]:
    """Every recorded concurrency sweep, newest first, without its points (`sweep_points`): the sidebar's filters
    pick among all of them (a page that read only the newest 20 said none of them matched a node whose sweeps
    were older)."""
    from telemetry.sweeps import list_sweeps

    return [{"id": sw.id, "created_at": sw.created_at, "drafter": sw.drafter, "workload": sw.workload,
             "node": sw.node_id, "crossover": sw.crossover_concurrency, "run_ids": tuple(sw.run_ids)}
            for sw in list_sweeps(engine(url), limit=None)]


@st.cache_data(ttl=TTL_S, show_spinner=False)
def sweep_points(url: str, run_ids: tuple[int, ...]) -> list[tuple]:
    """One sweep's per-level throughput and p95 TPOT, AR and spec, and spec's mean acceptance length (from SQL
    summaries of its runs)."""
    from telemetry.sweeps import sweep_points as points_of

    return [(p.concurrency, p.ar_tokens_per_s, p.spec_tokens_per_s, p.ar_tpot_p95_ms, p.spec_tpot_p95_ms,
             p.spec_mean_acceptance_length)
            for p in points_of(engine(url), list(run_ids))]


# The Runs page builds a raw-records download in memory (Streamlit serves a download as one bytes object): about
# 150 bytes of CSV a token event, and a multiple of that while it is built (752k token events: 15 s and +112 MB
# per click; a weeks-long server's run of 5M would need about 750 MB). Past this many rows the page shows the
# `specfinops export` command instead, which streams in constant memory.
RAW_DOWNLOAD_MAX_ROWS = 200_000


@st.cache_data(ttl=TTL_S, show_spinner=False)
def raw_rows(url: str, what: str, run_id: int, at_most: int) -> int:
    """How many `what` records run `run_id` has, counted no further than at_most + 1 (`export.count_rows`)."""
    from telemetry.export import ExportWindow, count_rows

    return count_rows(engine(url), what, ExportWindow(run_id=run_id), at_most=at_most)

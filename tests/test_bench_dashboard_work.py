"""scripts/bench_dashboard.py times each page's work as the page fetches it."""

from __future__ import annotations

from scripts import bench_dashboard
from telemetry.queries import Filters
from telemetry.store import open_store


def test_latency_page_work_reads_the_exact_percentiles_the_page_shows(one_run_store, monkeypatch):
    """The Latency page's table takes its TTFT and TPOT percentiles from `latency_percentiles`
    (app/dashboard/views/latency.py): the benchmark of the page runs it too, over the page's histograms."""
    calls = []
    real = bench_dashboard.pq.latency_percentiles

    def recorded(engine, f, hist, *a, **kw):
        calls.append(f)
        return real(engine, f, hist, *a, **kw)

    monkeypatch.setattr(bench_dashboard.pq, "latency_percentiles", recorded)
    engine = open_store(one_run_store)
    try:
        bench_dashboard.page_work(engine, Filters())["latency"]()
    finally:
        engine.dispose()
    assert calls == [Filters()]


def test_required_indexes_are_the_models():
    """The indexes the benchmark checks for exist in the models (telemetry/db.py), under those names."""
    from telemetry.db import Base

    for table, names in bench_dashboard.REQUIRED_INDEXES.items():
        assert names <= {ix.name for ix in Base.metadata.tables[table].indexes}, table

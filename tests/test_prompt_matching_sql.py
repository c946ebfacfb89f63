"""speedups' prompt matching counts the prompts each mode ran in SQL: a store whose every request has its own
prompt id (the synthetic stores, a load of unique prompts) brings no request's id into Python."""

from __future__ import annotations

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session
from synthetic import Req, make_run, spec_req

from telemetry.queries import Filters, speedups
from telemetry.store import open_store


def _store(url: str, spec_ids, ar_ids, workload: str = "code", **kw) -> None:
    engine = open_store(url)
    with Session(engine) as s:
        make_run(s, "ar", workload=workload, requests=[
            Req(30, ttft_ms=100, e2e_ms=1000, start_s=i, external_id=p) for i, p in enumerate(ar_ids)], **kw)
        make_run(s, "spec", workload=workload, requests=[
            spec_req(30, 4, 20, ttft_ms=50, e2e_ms=500, start_s=i / 2, external_id=p) for i, p in enumerate(spec_ids)],
            **kw)
        s.commit()
    engine.dispose()


@pytest.mark.parametrize(("spec_ids", "ar_ids", "prompts", "n"), [
    (["p1", "p2"], ["p2", "p1", "p1"], "the same 2 prompts", 2),
    (["p1", "p2", "p3"], ["p1", "p2", "p4"],
     "restricted to the 2 prompts both modes ran (spec ran 1 more, AR ran 1 more: left out)", 2),
    (["p1"], ["p2"], "different prompts (none shared): not matched", None),
    (["p1", None], ["p1"], "prompts not matched (the runs recorded no prompt ids)", None),
])
def test_prompt_matching_reads_as_before(db_url, spec_ids, ar_ids, prompts, n):
    """The words and the count of prompts compared, on both stores, as the per-run sets of prompt ids gave them."""
    _store(db_url, spec_ids, ar_ids)
    engine = open_store(db_url)
    try:
        (sp,) = speedups(engine)
        assert (sp.prompts, sp.num_prompts) == (prompts, n)
        if n == 2 and prompts.startswith("restricted"):  # both modes over p1, p2 only: 60 tokens in 1 s / 2 s
            assert sp.speedup == pytest.approx(2.0)
    finally:
        engine.dispose()


def test_unique_prompt_ids_stay_in_the_database(db_url):
    """Two runs of 40 requests, each request its own prompt id: the queries reading prompt ids return a row per
    comparison, not one per request (the per-run sets read every request's id: 80 rows here, 1M at scale)."""
    _store(db_url, [f"s{i}" for i in range(40)], [f"a{i}" for i in range(40)])
    engine = open_store(db_url)
    seen: list[tuple[str, object]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def record(conn, cursor, statement, parameters, context, executemany):
        if "external_id" in statement and statement.lstrip().upper().startswith(("SELECT", "WITH")):
            seen.append((statement, parameters))

    try:
        (sp,) = speedups(engine, Filters())
        assert sp.prompts == "different prompts (none shared): not matched"
        event.remove(engine, "before_cursor_execute", record)
        assert seen
        with engine.connect() as conn:  # the same statements again, counting what they return
            rows = [len(conn.exec_driver_sql(statement, parameters).all()) for statement, parameters in seen]
        assert max(rows) <= 2, rows
    finally:
        engine.dispose()

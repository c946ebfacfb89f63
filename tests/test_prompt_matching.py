"""speedups' prompt matching on both backends: the same prompt set, restricted to the common prompts where each
side ran extras, none shared, and a missing prompt id (the labels and figures a change of its query must keep)."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session
from synthetic import Req, make_run, spec_req

from telemetry.queries import speedups
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



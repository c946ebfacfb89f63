"""The HTML report in Chromium (playwright, /usr/bin/chromium; skipped without them): the cost columns of the
per-run table are in view without scrolling sideways, the speedup table fits the page, and printing shows
whole tables."""

from __future__ import annotations

import re

import pytest
from sqlalchemy.orm import Session
from synthetic import Req, make_run, spec_req

from app.cli import main
from telemetry.store import open_store
from tests.test_dashboard_browser import _skip_reason, report_page
from tests.test_report import D0

# what a real `bench --mode both` on the CPU records: a local model directory and a CPU brand string
TARGET = "/root/.cache/specfinops/models/smollm2-135m-instruct"
DRAFTER = "/root/.cache/specfinops/models/smollm2-135m-instruct-draft"
DEVICE = "cpu: Intel(R) Xeon(R) Processor (2 threads)"


def _report_of(url: str, out, configs: list[dict]):
    """An AR and a spec run (what a real CPU bench records: 250 tokens, 1.73x) per entry of `configs` (extra
    make_run keywords), then a daily report of their day into `out`."""
    engine = open_store(url)
    with Session(engine) as s:
        for kw in configs:
            kw = dict(started_at=D0.replace(hour=9), target=TARGET, drafter=DRAFTER, device=DEVICE, **kw)
            make_run(s, "ar", requests=[Req(250, ttft_ms=100, e2e_ms=6400)], **kw)
            make_run(s, "spec", requests=[spec_req(250, 4, 150, ttft_ms=100, e2e_ms=3700)], **kw)
        s.commit()
    engine.dispose()
    assert main(["report", "--db", url, "--out", str(out), "--period", "daily", "--since", D0.date().isoformat()]) == 0
    return out


def test_report_tables_show_their_figures_first_and_print_whole(sqlite_url, tmp_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)

    [page_file] = _report_of(sqlite_url, tmp_path / "reports", [{}, {}]).glob("*/report.html")
    measure = """title => {
        const h = [...document.querySelectorAll('h3')].find(e => e.textContent.startsWith(title));
        const box = h.nextElementSibling, table = box.querySelector('table');
        const heads = [...table.rows[0].cells];
        const boxRight = box.getBoundingClientRect().right;
        return {heads: heads.map(c => c.textContent), width: table.scrollWidth, box: box.clientWidth,
                inView: heads.filter(c => c.getBoundingClientRect().right <= boxRight + 0.5).map(c => c.textContent),
                cells: [...table.rows[1].cells].map(c => c.textContent),
                titles: [...table.rows[1].cells].map(c => c.title)};
    }"""
    with report_page(page_file) as page:
        runs = page.evaluate(measure, "Cost per run")
        speedups = page.evaluate(measure, "Speedup")
        page_width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
        page.emulate_media(media="print")
        printed = page.evaluate("() => [...document.querySelectorAll('.scroll')].map("
                                "e => getComputedStyle(e).overflowX)")
    assert page_width[0] <= page_width[1]
    # the figures lead, under readable headers, in view without scrolling the table's box sideways
    first = ["run", "mode", "output tokens", "tokens/s", "hardware $/1M", "energy $/1M", "total $/1M"]
    assert runs["heads"][:7] == first and set(first) <= set(runs["inView"])
    assert not [h for h in runs["heads"] if "_" in h]  # no snake_case
    assert runs["heads"][-2:] == ["device", "target"]
    row = dict(zip(runs["heads"], runs["cells"], strict=True))
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row["started (UTC)"])  # to the second
    assert row["target"] == "smollm2-135m-instruct" and row["device"] == "cpu: Intel Xeon (2 threads)"
    assert TARGET in runs["titles"]  # the full path on hover
    # the speedup table fits its box (it overflowed by a wrapped device name and the model path)
    assert speedups["width"] <= speedups["box"], speedups
    assert printed and set(printed) == {"visible"}


def test_a_sampled_stores_speedup_table_keeps_to_its_box_and_names_what_every_row_shares(sqlite_url, tmp_path):
    """Three sampling configurations (two sampled, one greedy; two answer caps): the speedup table has three
    rows with top_p, top_k and max new tokens shown, and ran 170 px past its box with the workload, drafter,
    K policy, dtype, device, target and prompt text repeated in every row; those are said once under it."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)

    out = _report_of(sqlite_url, tmp_path / "reports", [
        dict(temperature=t, top_p=p, top_k=k, max_new_tokens=cap)
        for t, p, k, cap in ((0.8, 0.9, 40, 128), (0.0, 1.0, 0, 128), (0.7, 0.95, 50, 256))])
    [page_file] = out.glob("*/report.html")
    measure = """() => {
        const h = [...document.querySelectorAll('h3')].find(e => e.textContent.startsWith('Speedup'));
        const box = h.nextElementSibling, table = box.querySelector('table');
        return {heads: [...table.rows[0].cells].map(c => c.textContent), rows: table.rows.length - 1,
                width: table.scrollWidth, box: box.clientWidth, note: box.nextElementSibling.textContent};
    }"""
    with report_page(page_file) as page:
        speedups = page.evaluate(measure)
    assert speedups["width"] <= speedups["box"], speedups
    assert speedups["rows"] == 3
    assert speedups["heads"] == ["speedup", "spec tokens/s", "AR tokens/s", "paired invocations", "temperature",
                                 "top_p", "top_k", "max new tokens"]
    assert speedups["note"] == (
        "In every row: run kind: bench; prompts: prompts not matched (the runs recorded no prompt ids); workload: "
        "code; concurrency: 1; drafter: smollm2-135m-instruct-draft; K policy: fixed:4; dtype: float32; device: "
        "cpu: Intel Xeon (2 threads); target: smollm2-135m-instruct.")
    with open(next(out.glob("*/speedups.csv")), encoding="utf-8") as fh:
        header = fh.readline()
    assert "workload" in header and "device" in header and "target" in header  # the CSV keeps every column

"""The dashboard on the stores and inputs a demanding user brings: a store that grows while the page is open,
prices typed far out of range, and the like (AppTest; small synthetic stores from tests/synthetic.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session
from streamlit.testing.v1 import AppTest
from synthetic import BASE_TIME, Req, make_run, spec_req

from telemetry import costing
from telemetry.store import open_store

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "app" / "dashboard" / "main.py"
BROWSER_MAX = 1.7976931348623157e308  # JavaScript's Number.MAX_VALUE: the largest a number input can be typed


def add_pair(url: str, *, started_at=BASE_TIME, energy: bool = False, ar_e2e_ms=(900, 1800), **kw) -> None:
    """A spec and an AR run of the same workload, target and device (tests/synthetic.py); with `energy`, 50 J an
    AR request and 30 J / 20 J a spec one, from an estimated power source. `ar_e2e_ms`: the two AR requests'
    end-to-end times (TTFT 100 and 200 ms, 33 tokens each)."""
    engine = open_store(url)
    e = (lambda j: j) if energy else (lambda j: None)
    if energy:
        kw.setdefault("power_source", "estimate")
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(33, 100, ar_e2e_ms[0], energy_j=e(50.0)),
                                    Req(33, 200, ar_e2e_ms[1], start_s=1.0, energy_j=e(50.0))],
                 started_at=started_at, **kw)
        make_run(s, "spec", requests=[spec_req(33, k=4, accepted=24, ttft_ms=100, e2e_ms=500, energy_j=e(30.0)),
                                      spec_req(17, k=4, accepted=10, ttft_ms=100, e2e_ms=420, start_s=0.2,
                                               energy_j=e(20.0))],
                 started_at=started_at, **kw)
        s.commit()
    engine.dispose()


def app_for(url: str, monkeypatch) -> AppTest:
    monkeypatch.setenv("SPECFINOPS_DB_URL", url)
    monkeypatch.syspath_prepend(str(ROOT))
    return AppTest.from_file(str(MAIN), default_timeout=120)


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


SMALL_SAMPLE = "Projection: based on 2 spec and 2 AR requests: too few"  # add_pair's runs, as `project` warns


def refusals(at: AppTest) -> list[str]:
    """The page's warnings but the projection's caveats (`add_pair`'s two requests a mode are a small sample)."""
    return [w.value for w in at.warning if not w.value.startswith("Projection:")]


def forget_cached_store_reads() -> None:
    """What the dashboard's 60 s cache expiry does: the next run reads the store again."""
    from app.dashboard import data

    for cached in (data.count_runs, data.filter_options, data.run_summaries, data.mode_summaries, data.costs,
                   data.speedups, data.projection):
        cached.clear()


def test_a_whole_time_range_follows_runs_recorded_on_a_later_day(sqlite_url, monkeypatch):
    add_pair(sqlite_url)
    at = app_for(sqlite_url, monkeypatch).run()
    at.switch_page("views/runs.py").run()
    assert [s.value for s in at.subheader][0] == "Runs (2)"
    # a bench two days later, while the page stays open
    add_pair(sqlite_url, started_at=BASE_TIME + timedelta(days=2))
    forget_cached_store_reads()
    at.run()
    assert_clean(at)
    day = BASE_TIME.date()
    assert at.sidebar.date_input(key="f_time").value == (day, day + timedelta(days=2))
    assert [s.value for s in at.subheader][0] == "Runs (4)"  # the old last day had left the new runs out


def test_a_narrowed_time_range_stays_narrowed_as_the_store_grows(sqlite_url, monkeypatch):
    add_pair(sqlite_url)
    add_pair(sqlite_url, started_at=BASE_TIME + timedelta(days=1))
    at = app_for(sqlite_url, monkeypatch).run()
    day = BASE_TIME.date()
    at.sidebar.date_input(key="f_time").set_value((day, day)).run()
    at.switch_page("views/runs.py").run()
    assert [s.value for s in at.subheader][0] == "Runs (2)"
    add_pair(sqlite_url, started_at=BASE_TIME + timedelta(days=3))
    forget_cached_store_reads()
    at.run()
    assert_clean(at)
    assert at.sidebar.date_input(key="f_time").value == (day, day)
    assert [s.value for s in at.subheader][0] == "Runs (2)"


@pytest.mark.parametrize("key", ["w_daily", "w_node_usd", "w_kwh", "w_pue"])
def test_a_price_or_traffic_input_at_its_largest_keeps_both_pages_readable(sqlite_url, monkeypatch, key):
    """Each input of the Cost & capacity page typed as large as it takes: both pages still draw their figures,
    finite and short enough for a tile (a node at $1e308/h made every cost infinite: "$inf" tiles and an error
    line in place of both pages; $1e308/kWh a cost per 1M tokens 300 digits long)."""
    add_pair(sqlite_url, energy=True)
    at = app_for(sqlite_url, monkeypatch).run()
    at.switch_page("views/cost.py").run()
    if key == "w_node_usd":
        at.selectbox(key="w_price").set_value("custom $/h per node").run()
    from app.dashboard.views import cost as view  # noqa: PLC0415 - streamlit only for this test

    # the page bounds its inputs itself (the widgets take whatever a browser's number holds): its largest, and a
    # browser's largest, which it refuses (said so, the last value kept)
    for value in (view.BOUNDS[key][1], BROWSER_MAX):
        at.switch_page("views/cost.py").run()
        at.number_input(key=key).set_value(value).run()
        assert any("refused" in w.value for w in at.warning) == (value == BROWSER_MAX), [w.value for w in at.warning]
        for page in ("views/cost.py", "views/overview.py"):
            at.switch_page(page).run()
            assert_clean(at)
            shown = {m.label: m.value for m in at.metric}
            assert shown, page
            assert not [v for v in shown.values() if "inf" in v or "nan" in v or len(v) > 24], shown


def test_speedups_of_several_configurations_that_read_alike_are_one_figure(sqlite_url, monkeypatch):
    """Two answer length caps with the same measured speedup: the tile says 3.42x, not "3.42–3.42x"; its help
    still says it covers two configurations."""
    add_pair(sqlite_url, max_new_tokens=32)
    add_pair(sqlite_url, max_new_tokens=64, started_at=BASE_TIME + timedelta(hours=1))
    at = app_for(sqlite_url, monkeypatch).run()
    assert_clean(at)
    (tile,) = [m for m in at.metric if m.label == "Speedup"]
    assert tile.value.endswith("x") and "–" not in tile.value, tile.value
    assert tile.proto.help.startswith("2 configurations"), tile.proto.help


def test_a_store_whose_requests_all_failed_says_so_not_that_it_is_empty(sqlite_url, monkeypatch):
    """Only failed and cancelled requests: every figure is missing, the projection says what became of the
    requests (not only "run a bench"), and a cost that is not there is not called "hardware only"."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(0, None, None, status="error"),
                                    Req(0, None, None, status="cancelled", start_s=1.0)])
        make_run(s, "spec", requests=[Req(0, None, None, status="error")], status="failed")
        s.commit()
    engine.dispose()
    at = app_for(sqlite_url, monkeypatch).run()
    assert_clean(at)
    assert {m.value for m in at.metric} == {"—"}
    captions = [c.value for c in at.caption]
    assert any(c.startswith("Projection: no measured runs with output tokens: all 3 of their requests failed or "
                            "were cancelled") for c in captions), captions
    ar, spec = (c for c in captions if " requests ok, " in c)
    # a cancelled request (a client that disconnected) is said apart, not counted as a failure
    said = sorted(c.split(" · ")[0] for c in (ar, spec))  # AR: an error and a cancel; spec: an error
    assert said == ["0 requests ok, 1 failed, 0 output tokens",
                    "0 requests ok, 1 failed, 1 cancelled, 0 output tokens"], said
    assert "hardware only" not in ar + spec, (ar, spec)
    assert ar.endswith("· no cost (no output tokens)"), ar
    cost_help = [m.proto.help for m in at.metric if m.label.startswith("Cost per 1M tokens")]
    assert cost_help and not [h for h in cost_help if "Hardware only" in h], cost_help
    at.switch_page("views/runs.py").run()  # the run table says them apart too
    assert_clean(at)
    (table,) = [d.value for d in at.dataframe if "cancelled" in d.value.columns]
    assert sorted(zip(table["mode"], table["failed"], table["cancelled"], strict=True)) == [("ar", 1, 1), ("spec", 1, 0)]


def test_many_runs_are_counted_not_listed_one_by_one(sqlite_url, monkeypatch):
    """Forty runs of each mode, every other one's power metered and the rest estimated, a few cancelled: the
    Overview's lines name a few runs and the count, not eighty run ids (a caption of a hundred ids on a store
    of hundreds of runs)."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for i in range(40):
            for mode in ("ar", "spec"):
                req = Req(33, 100, 900, energy_j=40.0) if mode == "ar" else spec_req(33, k=4, accepted=24,
                                                                                     ttft_ms=100, e2e_ms=500,
                                                                                     energy_j=30.0)
                make_run(s, mode, requests=[req], power_source="estimate" if i % 2 else "nvml",
                         status="cancelled" if i % 3 == 0 else "completed",
                         started_at=BASE_TIME + timedelta(minutes=i))
        s.commit()
    engine.dispose()
    at = app_for(sqlite_url, monkeypatch).run()
    assert_clean(at)
    lines = [c.value for c in at.caption if "partly estimated" in c.value or "not every run completed" in c.value]
    assert len(lines) == 3, [c.value for c in at.caption]
    for line in lines:
        assert line.count(",") < 20, line
    (incomplete,) = [x for x in lines if "not every run completed" in x]
    assert "28 runs (1-2, 7-8, " in incomplete, incomplete  # runs 1, 2, 7, 8, ... (i = 0, 3, 6, ...: 14 of each mode)
    at.switch_page("views/energy.py").run()
    assert_clean(at)
    helps = [m.proto.help for m in at.metric if "partly estimated" in m.label]
    assert len(helps) == 2 and all(h.count(",") < 20 for h in helps), helps


@contextmanager
def dashboard_in_chromium(url: str, tmp_path: Path, width: int):
    """`specfinops dashboard --db URL` as a subprocess and a headless Chromium page `width` px wide; yields
    (page, base URL). Skipped where Chromium or playwright is missing (as tests/test_dashboard_browser.py)."""
    from test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS, _free_port, _skip_reason, _wait_healthy

    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    port, log = _free_port(), tmp_path / "dashboard.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("SPECFINOPS_DB_URL", None)
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "dashboard", "--db", url, "--port", str(port)],
                                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, proc, log)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                yield browser.new_page(viewport={"width": width, "height": 1400}), base
            finally:
                browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


RUN_DONE = """() => !document.querySelector('[data-testid="stStatusWidget"]')"""  # the script run has ended
CUT_TILES = """() => [...document.querySelectorAll(
    '[data-testid="stMetricValue"], [data-testid="stMetricLabel"], [data-testid="stMetricDelta"]')]
  .filter(m => [m, ...m.querySelectorAll('*')].some(e => e.scrollWidth > e.clientWidth + 1)).map(m => m.innerText)"""


@pytest.mark.browser
@pytest.mark.parametrize("width", [1024, 1440])
def test_tiles_are_not_cut_short_in_1024_and_1440_px_windows(sqlite_url, tmp_path, width):
    """At 1024 px beside the sidebar, the Overview's half-page tiles and the Cost & capacity page's quarter-page
    ones showed "16.2 ..." for 16.2 ms, "$0.0832/..." for the node price and "Cost per 1M t..." for a cost that
    includes estimated energy; a four-digit TPOT read "1539.2 ..." and the change against AR "+100% vs AR
    (temperature 0, b..." (at 1440 px too): every figure, label and change is whole now."""
    # AR at 1,5xx ms a token: four-digit TPOT tiles
    add_pair(sqlite_url, energy=True, ar_e2e_ms=(50_000, 51_000))
    with dashboard_in_chromium(sqlite_url, tmp_path, width) as (page, base):
        for path in ("", "cost"):
            page.goto(f"{base}/{path}")
            page.wait_for_selector('[data-testid="stMetric"]', timeout=60_000)
            page.wait_for_function(RUN_DONE, timeout=60_000)
            page.wait_for_timeout(500)
            assert page.locator('[data-testid="stException"]').count() == 0
            labels = page.locator('[data-testid="stMetricLabel"]').all_inner_texts()
            assert "Cost per 1M tokens (incl. estimated energy)" in labels or path, labels
            if not path:
                values = page.locator('[data-testid="stMetricValue"]').all_inner_texts()
                assert [v for v in values if v.endswith(" ms") and len(v.split(".")[0]) == 4], values
                assert page.locator('[data-testid="stMetricDelta"]').count(), "no change against AR shown"
            assert page.evaluate(CUT_TILES) == [], path or "overview"


@pytest.mark.browser
def test_recorded_names_are_shown_letter_for_letter_not_as_markdown(sqlite_url, tmp_path):
    """A workload, node and domain whose names hold asterisks and underscores: the lines that name them show
    them as recorded (Streamlit's markdown made 'prompts/*star*_v2_' read 'prompts/starv2' in italics)."""
    workload, domain = "prompts/*star*_v2_", "_chat_ *b*"
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", workload=workload, requests=[Req(33, 100, 900, domain=domain)])
        make_run(s, "spec", workload=workload,
                 requests=[spec_req(17, k=4, accepted=10, ttft_ms=100, e2e_ms=420, domain=domain)],
                 with_events=True)
        s.commit()
    engine.dispose()
    with dashboard_in_chromium(sqlite_url, tmp_path, 1400) as (page, base):
        for path, name in (("", workload), ("speculation", domain), ("cost", workload)):
            page.goto(f"{base}/{path}")
            page.wait_for_selector('[data-testid="stMetric"]', timeout=60_000)
            page.wait_for_function(RUN_DONE, timeout=60_000)
            page.wait_for_timeout(500)
            captions = page.locator('[data-testid="stCaptionContainer"]').all_inner_texts()
            assert any(name in c for c in captions), (path, captions)
            assert page.locator('[data-testid="stCaptionContainer"] em').count() == 0, path or "overview"


@pytest.mark.browser
def test_one_device_of_estimated_power_is_labelled_an_estimate_on_the_chart(sqlite_url, tmp_path):
    """The Energy page's power chart with a single line (one device, its power a TDP estimate): plotly hid the
    legend of a lone trace, so the line named 'estimate' was drawn with no label at all."""
    add_pair(sqlite_url, energy=True, power_w=[100.0, 120.0, 110.0])
    with dashboard_in_chromium(sqlite_url, tmp_path, 1400) as (page, base):
        page.goto(f"{base}/energy")
        page.wait_for_selector(".js-plotly-plot", timeout=60_000)
        page.wait_for_function(RUN_DONE, timeout=60_000)
        page.wait_for_timeout(500)
        legend = page.locator(".js-plotly-plot .legendtext").all_text_contents()
        assert legend == ["node-a · device 0 · estimate"], legend


def test_a_node_price_from_the_catalog_is_one_node_whatever_gpus_per_node_said(sqlite_url, monkeypatch):
    """GPUs per node set to 4 for a GPU's price, then a node's price (cpu-2core) picked: the projection prices one
    node (the input is off for it) instead of refusing it in the CLI's words ("--gpus-per-node applies to GPU
    prices"), which left no projection on this page or the Overview."""
    add_pair(sqlite_url)
    at = app_for(sqlite_url, monkeypatch).run()
    at.switch_page("views/cost.py").run()
    at.selectbox(key="w_price").set_value("H100").run()
    at.number_input(key="w_gpus").set_value(4).run()
    at.selectbox(key="w_price").set_value("cpu-2core").run()
    assert_clean(at)
    assert not refusals(at) and [w.value for w in at.warning if w.value.startswith(SMALL_SAMPLE)]
    assert at.number_input(key="w_gpus").proto.disabled
    shown = {m.label: m.value for m in at.metric}
    assert shown["Node price"] == "$0.0832/h" and shown["Nodes (speculative)"] != "—", shown
    at.switch_page("views/overview.py").run()
    assert_clean(at)
    (projection,) = [c.value for c in at.caption if c.value.startswith("Projection")]
    assert "priced as cpu-2core at $0.0832/h" in projection and "--gpus-per-node" not in projection, projection


def test_a_device_the_catalog_does_not_know_leaves_every_figure_but_the_cost(sqlite_url, monkeypatch):
    """Runs measured on a device the price catalog does not know, with no price recorded: the Overview and the
    Cost & capacity page were one error line each ("no catalog price matches device ...; pass --gpu NAME or
    --node-hourly-usd X"). Now every other figure shows, the cost is missing and says how to price it here; a
    custom node price prices it."""
    add_pair(sqlite_url, device="Mystery Accelerator 9000")
    at = app_for(sqlite_url, monkeypatch).run()
    assert_clean(at)
    shown = {m.label: m.value for m in at.metric}
    assert shown["Speedup"] != "—" and shown["Acceptance rate"] != "—" and shown["Cost per 1M tokens"] == "—", shown
    (warning,) = [w.value for w in at.warning]
    assert "'Mystery Accelerator 9000'" in warning and "Node price on the Cost & capacity page" in warning, warning
    assert not [t for t in [warning, *(c.value for c in at.caption)]
                if "--gpu" in t or "--node-hourly-usd" in t or "--invocation" in t]
    at.switch_page("views/cost.py").run()
    assert_clean(at)
    assert len(at.warning) == 2 and all("Node price" in w.value for w in at.warning), [w.value for w in at.warning]
    at.selectbox(key="w_price").set_value("custom $/h per node").run()
    at.number_input(key="w_node_usd").set_value(5.0).run()
    assert_clean(at)
    assert not refusals(at) and [w.value for w in at.warning if w.value.startswith(SMALL_SAMPLE)]
    assert {m.label: m.value for m in at.metric}["Node price"] == "$5/h"
    at.switch_page("views/overview.py").run()
    assert_clean(at)
    _, priced = costing.costs(open_store(sqlite_url), node_hourly_usd=5.0)
    by_mode = {m.mode: f"${m.cost.total_usd_per_1m:,.2f}" for m in priced}
    assert [m.value for m in at.metric if m.label == "Cost per 1M tokens"] == [by_mode["spec"], by_mode["ar"]]


def test_one_unpriced_run_leaves_the_priced_runs_costs_and_names_it_on_both_pages(sqlite_url, monkeypatch):
    """A priced spec and AR pair beside one AR run no price covers (its device unknown to the catalog, no price
    recorded with it): the Overview and the Cost & capacity page dropped every cost ("No cost per 1M tokens:
    ..."). As `cost` does, the priced runs keep their costs, the unpriced run's are missing (—) and it is named
    with how to price it here; the AR figure, over 1 of its 2 runs, says so, and the spec tile sets no change
    against it."""
    # the pair priced by the price it recorded; the third run, on the same device, recorded none: one
    # comparable group, so only the partly priced AR figure keeps the spec tile from a change against it
    add_pair(sqlite_url, device="Mystery Accelerator 9000",
             price_snapshot={"name": "mystery", "units": 1, "node_hourly_usd": 3.0})
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        odd = make_run(s, "ar", device="Mystery Accelerator 9000", requests=[Req(33, 100, 900)])
        s.commit()
        odd = odd.id
    priced, modes, unpriced = costing.costs_and_unpriced(engine)
    engine.dispose()
    assert [r.run_id for r in unpriced] == [odd] and {m.mode for m in modes} == {"spec", "ar"}
    from app.dashboard.common import usd_amount

    by_mode = {m.mode: usd_amount(m.cost.total_usd_per_1m) for m in modes}  # the priced runs' only
    said = f"over 1 of 2 runs; run {odd} (device 'Mystery Accelerator 9000') has no price"
    at = app_for(sqlite_url, monkeypatch).run()
    assert_clean(at)
    tiles = [m for m in at.metric if m.label == "Cost per 1M tokens"]
    assert [m.value for m in tiles] == [by_mode["spec"], by_mode["ar"]]
    assert not tiles[0].proto.delta  # spec over all its runs against AR over 1 of 2: no change shown
    assert said in tiles[1].help and "AR " + said in tiles[0].help
    (warning,) = refusals(at)
    assert "'Mystery Accelerator 9000'" in warning and "Node price on the Cost & capacity page" in warning, warning
    assert [c.value for c in at.caption if "cost " + said in c.value], [c.value for c in at.caption]
    at.switch_page("views/cost.py").run()
    assert_clean(at)
    (warning,) = [w for w in refusals(at) if not w.startswith("No projection")]
    assert warning.startswith("Cost per 1M tokens over the priced runs only: no price for run") and \
        "Node price" in warning, warning
    assert [c.value for c in at.caption if c.value.startswith("AR") and said in c.value], \
        [c.value for c in at.caption]
    table = at.dataframe[0].value  # Cost per run
    rows = {r["run"]: r for r in table.to_dict("records")}
    assert set(rows) == {rc.run.run_id for rc in priced} | {odd}
    assert rows[odd]["priced as"] == "no price" and rows[odd]["total $/1M"] != rows[odd]["total $/1M"]  # NaN: —
    assert all(rows[rc.run.run_id]["total $/1M"] == pytest.approx(rc.cost.total_usd_per_1m) for rc in priced)


def test_the_projection_warns_of_a_small_sample_and_of_other_hardware_as_project_does(sqlite_url, monkeypatch):
    """`project` warns that two requests a mode make no stable capacity, and that a CPU's throughput priced as an
    H100 is no H100's node count; both pages showed the same projection (and $ savings) without a word of it."""
    from app.dashboard.assumptions import DEFAULTS
    from app.dashboard.common import in_page_words, md_safe

    add_pair(sqlite_url)
    engine = open_store(sqlite_url)
    at = app_for(sqlite_url, monkeypatch).run()
    assert_clean(at)
    small = costing.project_from_store(engine, **DEFAULTS).caveats
    assert len(small) == 1 and small[0].startswith(SMALL_SAMPLE.removeprefix("Projection: "))
    assert [w.value for w in at.warning] == [f"Projection: {small[0]}."]
    at.switch_page("views/cost.py").run()
    at.selectbox(key="w_price").set_value("H100").run()
    assert_clean(at)
    caveats = costing.project_from_store(engine, **{**DEFAULTS, "gpu": "H100"}).caveats
    assert len(caveats) == 2 and "not H100's" in caveats[1], caveats
    # on the page in its own words: the measured device is priced through the Node price box, not CLI flags
    shown = [md_safe(f"Projection: {in_page_words(c)}.") for c in caveats]
    assert "--node-hourly-usd" not in shown[1] and "Node price" in shown[1], shown
    assert [w.value for w in at.warning] == shown
    at.switch_page("views/overview.py").run()
    assert [w.value for w in at.warning] == shown


def test_the_whole_time_range_sizes_capacity_as_project_does(sqlite_url, monkeypatch):
    """A spec run whose requests have tokens but no end-to-end time has no request span: over the whole store its
    own start to end is its wall time, as `project` counts it. The dashboard's untouched time range was a window
    all the same, which left that run's 30 s out of the pooled capacity and kept its tokens (a larger figure
    than `project`'s)."""
    from app.dashboard.assumptions import DEFAULTS
    from app.dashboard.common import throughput

    add_pair(sqlite_url)
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "spec", requests=[Req(33, None, None)], started_at=BASE_TIME + timedelta(minutes=5),
                 ended_at=BASE_TIME + timedelta(minutes=5, seconds=30))
        s.commit()
    whole = costing.project_from_store(engine, **DEFAULTS).projection
    at = app_for(sqlite_url, monkeypatch).run()
    at.switch_page("views/cost.py").run()
    assert_clean(at)
    shown = {m.label: m.value for m in at.metric}
    assert shown["Capacity spec (tokens/s per node)"] == throughput(whole.capacity_tokens_per_s_spec), shown
    assert shown["Nodes (speculative)"] == f"{whole.nodes_spec:,}", shown


def test_the_dashboard_reads_the_url_it_was_started_with_and_checks_the_variable_as_commands_do(tmp_path,
                                                                                               monkeypatch):
    """The page reads the store from SPECFINOPS_DB_URL, set by `specfinops dashboard` to the URL it resolved: that
    URL is read as it is. The variable was read as if it were --db, without the checks every command makes: a
    malformed port said only "invalid literal for int()", a blank one named a SQLite file of spaces."""
    from app.dashboard import data
    from telemetry.db import resolve_db_url

    monkeypatch.setattr(sys, "argv", [str(MAIN)])
    for given in (str(tmp_path / "s.db"), "postgresql://u:p%40ss@db.example:5432/specfinops",
                  f"sqlite:///file:{tmp_path / 's.db'}?mode=ro&uri=true"):
        url = resolve_db_url(given)  # what `specfinops dashboard` passes the page
        monkeypatch.setenv("SPECFINOPS_DB_URL", url)
        assert data.db_url() == url
    monkeypatch.setenv("SPECFINOPS_DB_URL", "postgresql://h:abc/x")
    with pytest.raises(ValueError, match="^SPECFINOPS_DB_URL: the port must be a number 1-65535, got 'abc'"):
        data.db_url()
    monkeypatch.setenv("SPECFINOPS_DB_URL", "  ")
    with pytest.raises(ValueError, match="^SPECFINOPS_DB_URL: must be a database URL or a SQLite file path"):
        data.db_url()

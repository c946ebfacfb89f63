"""Streamlit AppTest of every dashboard page against small synthetic stores (tests/synthetic.py).

The store (`fill_store`):
  run 1 ar,   workload code, cpu, power nvml:  33 tokens (code) + 33 tokens (chat), 50 J each
  run 2 spec, workload code, cpu, power estimate, K=4:
        33 tokens, 24 accepted of 32 drafted (code); 17 tokens, 10 accepted of 24 drafted (chat)
  -> acceptance rate 34 / 56 = 60.7%; chat alone 10 / 24 = 41.7%
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy.orm import Session
from streamlit.testing.v1 import AppTest
from synthetic import Req, make_run, spec_req

from telemetry import costing, queries
from telemetry.labels import usd_amount
from telemetry.store import open_store

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "app" / "dashboard" / "main.py"
PAGES = {
    "Overview": "views/overview.py",
    "Latency": "views/latency.py",
    "Speculation": "views/speculation.py",
    "Energy": "views/energy.py",
    "Cost & capacity": "views/cost.py",
    "Runs": "views/runs.py",
}
FILL_COMMAND = "specfinops bench --workload code --mode both --limit 4"


def fill_store(url: str, *, energy: bool = True) -> str:
    """A spec and an AR run of the same workload/target/device, with steps, token events and power."""
    engine = open_store(url)
    j = 50.0 if energy else None
    with Session(engine) as s:
        make_run(s, "ar", requests=[
            Req(output_tokens=33, ttft_ms=100, e2e_ms=900, energy_j=j, domain="code"),
            Req(output_tokens=33, ttft_ms=200, e2e_ms=1800, start_s=1.0, energy_j=j, domain="chat"),
        ], with_events=True, power_source="nvml", power_w=[250.0, 262.0, 255.0])
        make_run(s, "spec", requests=[
            spec_req(33, k=4, accepted=24, ttft_ms=100, e2e_ms=500, energy_j=30.0 if energy else None, domain="code"),
            spec_req(17, k=4, accepted=10, ttft_ms=100, e2e_ms=420, start_s=0.2, energy_j=20.0 if energy else None,
                     domain="chat"),
        ], with_events=True, power_source="estimate", power_w=[300.0, 310.0])
        s.commit()
    engine.dispose()
    return url


def app_for(url: str, monkeypatch) -> AppTest:
    monkeypatch.setenv("SPECFINOPS_DB_URL", url)
    monkeypatch.syspath_prepend(str(ROOT))
    return AppTest.from_file(str(MAIN), default_timeout=120)


def open_page(at: AppTest, page: str) -> AppTest:
    """A fresh app: one run through the entry file (so the navigation knows its pages), then the page."""
    return at.run().switch_page(page).run()


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def metrics(at: AppTest) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for m in at.metric:
        out.setdefault(m.label, []).append(m.value)
    return out


@pytest.fixture
def filled(sqlite_url) -> str:
    return fill_store(sqlite_url)


@pytest.mark.parametrize("title", list(PAGES))
def test_every_page_renders_without_error(filled, monkeypatch, title):
    at = open_page(app_for(filled, monkeypatch), PAGES[title])
    assert_clean(at)
    assert [t.value for t in at.title] == [title]
    assert not at.info or all("No " not in i.value for i in at.info), [i.value for i in at.info]


def test_overview_shows_the_kpis_from_the_shared_queries(filled, monkeypatch):
    at = open_page(app_for(filled, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    m = metrics(at)
    for label in ("Cost per 1M tokens", "Speedup", "Acceptance rate", "TPOT p50", "TPOT p95",
                  "Projected annual savings"):
        assert label in m, sorted(m)
    assert m["Acceptance rate"] == ["60.7%"]
    engine = open_store(filled)
    (speedup,) = queries.speedups(engine)
    assert m["Speedup"] == [f"{speedup.speedup:.2f}x"]
    _, mode_costs = costing.costs(engine)
    by_mode = {c.mode: c.cost.total_usd_per_1m for c in mode_costs}
    # the spec run's power was estimated: its total includes estimated energy and says so; the AR run's was measured
    # as `cost` and the report write it (usd_amount), not to the cent whatever its size ($0.00 for $0.0004)
    assert m["Cost per 1M tokens (incl. estimated energy)"] == [usd_amount(by_mode['spec'])]
    assert m["Cost per 1M tokens"] == [usd_amount(by_mode['ar'])]
    assert "J/token (estimate)" in m  # the spec run's power was estimated: labelled as such
    assert "J/token" in m  # the AR run's was measured
    assert all(v != "—" for v in m["Cost per 1M tokens"] + m["Cost per 1M tokens (incl. estimated energy)"]
               + m["Speedup"])


@pytest.mark.parametrize(("spec_e2e_ms", "delta"), [
    (900.0, "same as AR"),  # TPOT 25 ms both: no arrow, not "-0%"
    (901.6, "+0.2% vs AR"),  # 25.05 ms: a whole percent would print "+0%"
    (1100.0, "+25% vs AR"),  # 31.25 ms
])
def test_overview_tpot_against_ar_at_the_precision_that_shows_it(sqlite_url, monkeypatch, spec_e2e_ms, delta):
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(output_tokens=33, ttft_ms=100, e2e_ms=900)])
        make_run(s, "spec", requests=[spec_req(33, k=4, accepted=24, ttft_ms=100, e2e_ms=spec_e2e_ms)])
        s.commit()
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    tpot = [m for m in at.metric if m.label in ("TPOT p50", "TPOT p95")]
    assert len(tpot) == 4  # spec's pair with deltas, AR's without
    assert [m.delta for m in tpot[:2]] == [delta, delta]
    arrow = "NONE" if delta == "same as AR" else "UP"  # no arrow for an equal figure
    assert all(f"direction: {arrow}" in str(m.proto) for m in tpot[:2])
    assert tpot[2].delta == tpot[3].delta == ""


def test_missing_energy_is_a_dash_not_zero(sqlite_url, monkeypatch):
    at = open_page(app_for(fill_store(sqlite_url, energy=False), monkeypatch), PAGES["Overview"])
    assert_clean(at)
    values = metrics(at)
    j = values.get("J/token", []) + values.get("J/token (estimate)", [])
    assert j and all(v == "—" for v in j), values


def test_domain_filter_narrows_the_figures(filled, monkeypatch):
    at = open_page(app_for(filled, monkeypatch), PAGES["Overview"])
    at.selectbox(key="f_domain").set_value("chat").run()
    assert_clean(at)
    assert metrics(at)["Acceptance rate"] == ["41.7%"]


def test_concurrency_filter_narrows_a_sweep_to_one_level(filled, monkeypatch):
    """With runs at two concurrency levels the sidebar offers them; one level leaves only its runs in
    every figure (run 3: 8 of 8 drafted tokens accepted at concurrency 4)."""
    engine = open_store(filled)
    with Session(engine) as s:
        make_run(s, "spec", concurrency=4, requests=[spec_req(11, k=4, accepted=8, ttft_ms=100, e2e_ms=300)])
        s.commit()
    engine.dispose()
    at = open_page(app_for(filled, monkeypatch), PAGES["Overview"])
    assert at.selectbox(key="f_concurrency").options == ["All", "1", "4"]
    assert metrics(at)["Acceptance rate"] == [f"{(34 + 8) / (56 + 8):.1%}"]
    at.selectbox(key="f_concurrency").set_value(4).run()
    assert_clean(at)
    assert metrics(at)["Acceptance rate"] == ["100.0%"]
    at.selectbox(key="f_concurrency").set_value(1).run()
    assert metrics(at)["Acceptance rate"] == ["60.7%"]


def test_the_sweep_picker_chooses_among_every_sweep_the_filters_keep(filled, monkeypatch):
    """25 sweeps, the 5 oldest on node-b: picking node-b shows those 5 (the page read only the newest 20
    sweeps, then filtered them, and said none of the 20 recorded sweeps matched); all nodes: the newest 20."""
    from telemetry.sweeps import record_sweep

    engine = open_store(filled)
    with Session(engine) as s:
        ids = {}
        for node in ("node-b", "node-a"):
            runs = [make_run(s, mode, node_id=node, concurrency=c, requests=[Req(output_tokens=9, e2e_ms=300)])
                    for c in (1, 2) for mode in ("ar", "spec")]
            s.commit()
            ids[node] = [r.id for r in runs]
    for node, count in (("node-b", 5), ("node-a", 20)):
        for _ in range(count):
            record_sweep(engine, node_id=node, device="cpu (2 cores)", target="demo/target-tiny",
                         drafter="demo/draft-tiny", k_policy="fixed:4", workload="code", dtype="float32",
                         run_ids=ids[node])
    engine.dispose()
    at = open_page(app_for(filled, monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)
    assert [o.split()[0] for o in at.selectbox(key="w_sweep").options] == [f"#{i}" for i in range(25, 5, -1)]
    at.selectbox(key="f_node").set_value("node-b").run()
    assert_clean(at)
    assert [o.split()[0] for o in at.selectbox(key="w_sweep").options] == [f"#{i}" for i in range(5, 0, -1)]
    assert at.get("plotly_chart")  # the picked sweep's points are drawn


def test_one_concurrency_level_offers_no_filter(filled, monkeypatch):
    at = open_page(app_for(filled, monkeypatch), PAGES["Overview"])
    assert not [sb for sb in at.selectbox if sb.key == "f_concurrency"]


@pytest.mark.parametrize("title", list(PAGES))
def test_empty_store_shows_the_command_that_fills_it(sqlite_url, monkeypatch, title):
    open_store(sqlite_url).dispose()  # schema, no runs
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES[title])
    assert_clean(at)
    assert any("no runs yet" in i.value and sqlite_url in i.value for i in at.info)
    assert f"{FILL_COMMAND} --db {sqlite_url}" in [c.value for c in at.code]  # fills the store in view


def test_unreadable_store_is_one_error_line_not_a_traceback(tmp_path, monkeypatch):
    bad = tmp_path / "not-a-db.db"
    bad.write_bytes(b"this is not a sqlite database" * 100)
    at = open_page(app_for(f"sqlite:///{bad}", monkeypatch), PAGES["Latency"])
    assert not at.exception
    assert len(at.error) == 1 and "could not be shown" in at.error[0].value


def test_latency_percentiles_include_itl(filled, monkeypatch):
    at = open_page(app_for(filled, monkeypatch), PAGES["Latency"])
    assert_clean(at)
    table = at.dataframe[0].value
    itl = table[table["metric"] == "ITL"].set_index("mode")
    # AR: 32 steps over 800 ms and 1600 ms -> gaps 25 ms and 50 ms; no "—" for either mode
    assert (itl != "—").all().all(), itl
    assert itl.loc["AR baseline", "p50 (ms)"] == "37.5"  # halfway between the 32nd and 33rd gap, as numpy


def test_cost_page_recomputes_projection_from_widgets(filled, monkeypatch):
    at = open_page(app_for(filled, monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)
    before = metrics(at)
    assert before["Nodes (speculative)"] != ["—"]
    at.number_input(key="w_sla").set_value(0.1).run()  # no run meets a 0.1 ms p95 TPOT
    assert_clean(at)
    after = metrics(at)
    assert after["Nodes (speculative)"] == ["—"] and after["Nodes (AR baseline)"] == ["—"]
    assert after["Projected annual savings"] == ["—"]
    # the Overview uses the same assumptions
    at.switch_page(PAGES["Overview"]).run()
    assert metrics(at)["Projected annual savings"] == ["—"]


def test_cost_page_says_why_a_fleet_cost_is_missing(filled, monkeypatch):
    """At an SLA between spec's p95 TPOT (~20 ms) and AR's (~49 ms) AR has no fleet cost: the caption says why
    (as `project` does), not just "—"."""
    at = open_page(app_for(filled, monkeypatch), PAGES["Cost & capacity"])
    at.number_input(key="w_sla").set_value(30.0).run()
    assert_clean(at)
    [line] = [c.value for c in at.caption if c.value.startswith("Fleet cost per 1M served tokens")]
    assert "AR — (not attainable: no AR run meets the SLA), spec $" in line, line


def test_money_tiles_read_as_the_cost_command_writes_them(filled, monkeypatch):
    """The savings and monthly-cost tiles had their own format (",.0f": "$730" where `project` printed "$730.00",
    "$0" for a saving of $0.40): every money figure of the dashboard goes through usd_amount."""
    from app.dashboard import charts
    from app.dashboard.common import table_style

    at = open_page(app_for(filled, monkeypatch), PAGES["Cost & capacity"])
    at.selectbox(key="w_price").set_value("custom $/h per node").run()
    at.number_input(key="w_node_usd").set_value(0.05).run()
    at.number_input(key="w_daily").set_value(1.0).run()  # 1M tokens a day: a fleet of a few $ a month
    assert_clean(at)
    m = metrics(at)
    p = costing.project_from_store(open_store(filled), daily_tokens=1e6, peak_factor=2.0, sla_ms=50.0,
                                   node_hourly_usd=0.05).projection
    assert p.monthly_cost_ar_usd < 1000  # where ",.0f" and usd_amount differ
    assert m["Monthly cost AR"] == [usd_amount(p.monthly_cost_ar_usd)]
    assert m["Monthly cost spec"] == [usd_amount(p.monthly_cost_spec_usd)]
    assert m["Projected annual savings"] == [usd_amount(p.annual_savings_usd)]
    at.switch_page(PAGES["Overview"]).run()
    assert metrics(at)["Projected annual savings"] == [usd_amount(p.annual_savings_usd)]
    # the cost chart's labels and the tables' money columns: no "$0.000" for $0.000042, no "4.2e-05"
    fig = charts.cost_split(["spec"], [0.3412], [0.000042], [False])
    assert [list(t.text) for t in fig.data] == [["$0.3412"], ["$0.000042"]]
    html = table_style(pd.DataFrame({"total $/1M": [0.000042, 12.5, None]}), money=["total $/1M"]).to_html()
    assert all(f">{v}<" in html for v in ("$0.000042", "$12.50", "—")), html


def test_cost_page_draws_nodes_by_sla_from_the_same_configurations(filled, monkeypatch):
    """The projection at every SLA where it can change: the spec run (p95 TPOT ~20 ms) meets SLAs the AR
    run (p95 ~49 ms) does not, and delivers more tokens/s, so speculation needs fewer nodes from its p95 on."""
    at = open_page(app_for(filled, monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)
    engine = open_store(filled)
    sp = costing.project_from_store(engine, daily_tokens=5e8, peak_factor=2.0, sla_ms=50.0, node_hourly_usd=1.0)
    (spec_p95,), (ar_p95,) = [p95 for _, p95 in sp.points_spec], [p95 for _, p95 in sp.points_ar]
    assert spec_p95 < ar_p95
    [line] = [c.value for c in at.caption if c.value.startswith("Where the SLA matters")]
    # the threshold rounds up: an SLA of spec's p95 shown to one decimal must be met
    assert f"SLAs of {math.ceil(spec_p95 * 10) / 10:.1f} ms and looser" in line, line


def test_speculation_page_shows_acceptance_and_go_no_go(filled, monkeypatch):
    at = open_page(app_for(filled, monkeypatch), PAGES["Speculation"])
    assert_clean(at)
    assert metrics(at)["Acceptance rate"] == ["60.7%"]
    assert any("Below the 0.65 go/no-go line: chat (alpha 0.62)." in c.value for c in at.caption)  # code 0.75 is above
    assert any("alpha = accepted / tested" in c.value for c in at.caption)
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)  # Acceptance per domain: bars, then alpha diamonds
    bars, diamonds = spec["data"][:2]
    assert bars["x"] == ["chat", "code"] and bars["y"] == pytest.approx([10 / 24, 24 / 32])
    assert diamonds["y"] == pytest.approx([10 / 16, 24 / 32])  # chat's steps all stop at a rejection
    assert bars["marker"]["color"] == ["#dc2626", "#16a34a"]  # chat's alpha 0.625 is below the line, code's above
    over_time = json.loads(at.get("plotly_chart")[1].proto.spec)  # the acceptance rate, not alpha, over time
    assert over_time["layout"]["title"]["text"].startswith("Acceptance rate per ")  # the bucket named
    assert over_time["layout"]["yaxis"]["title"]["text"] == "accepted / drafted"
    assert over_time["layout"]["yaxis"]["tickformat"] == ".0%"  # a share, as the metric above it
    # no 0.65 line over accepted / drafted: the line judges alpha, and code's 0.75 alpha passes it while its
    # acceptance rate reads lower wherever steps stop at a rejection
    assert not over_time["layout"].get("shapes") and not over_time["layout"].get("annotations")
    from telemetry.palette import MODE_COLOURS

    assert over_time["data"][0]["line"]["color"] == MODE_COLOURS["spec"]  # spec's colour on every page
    assert "Acceptance along the answer" in [h.value for h in at.subheader]
    assert any("32 tokens a span" in c.value for c in at.caption)


def test_runs_page_compares_two_runs(filled, monkeypatch):
    at = open_page(app_for(filled, monkeypatch), PAGES["Runs"])
    assert_clean(at)
    compare = at.dataframe[1].value
    assert list(compare.columns)[1:] == ["run #2", "run #1"]  # latest spec vs latest AR
    row = compare.set_index("figure").loc["mode"]
    assert list(row) == ["spec", "ar"]


def test_the_runs_comparison_csv_holds_numbers_not_the_pages_text(filled, monkeypatch):
    """The comparison's CSV was the page's table: "36.9%", "58.0", "—". It now holds the run table's values."""
    import app.dashboard.common as common
    from telemetry.queries import run_summaries
    from telemetry.store import open_store

    frames = {}
    monkeypatch.setattr(common, "download_csv", lambda label, frame, name, key: frames.__setitem__(key, frame))
    at = open_page(app_for(filled, monkeypatch), PAGES["Runs"])
    assert_clean(at)
    raw = frames["dl_compare"].set_index("figure")
    assert list(raw.columns) == ["run #2", "run #1"]
    runs = {r.run_id: r for r in run_summaries(open_store(filled))}
    assert raw.loc["tokens/s", "run #2"] == pytest.approx(runs[2].stats.tokens_per_s)
    assert raw.loc["acceptance rate", "run #2"] == pytest.approx(runs[2].stats.acceptance_rate)
    assert raw.loc["mean acceptance length", "run #2"] == pytest.approx(runs[2].stats.mean_acceptance_length)
    assert pd.isna(raw.loc["acceptance rate", "run #1"])  # AR: missing, not "—" or 0
    assert raw.loc["mode"].tolist() == ["spec", "ar"]


def test_a_raw_download_past_the_cap_shows_the_export_command_instead(filled, monkeypatch):
    """The raw records of one run were built whole in memory on a click (752k token events: 15 s and +112 MB;
    a weeks-long server's run would need about 750 MB). Past the cap the button is off and the page gives the
    `specfinops export` command, which streams; the count stops past the cap."""
    import app.dashboard.data as data

    monkeypatch.setattr(data, "RAW_DOWNLOAD_MAX_ROWS", 20)  # run 1: 2 requests, 66 token events
    at = open_page(app_for(filled, monkeypatch), PAGES["Runs"])
    assert_clean(at)
    assert at.selectbox(key="raw_run").value == 1

    def raw_button():
        (button,) = [b.proto for b in at.get("download_button") if "of run #" in b.proto.label]
        return button

    assert raw_button().label == "Download requests of run #1 (CSV)" and not raw_button().disabled
    assert not at.info
    at.selectbox(key="raw_what").select("tokens").run()
    assert_clean(at)
    assert raw_button().label == "Download tokens of run #1 (CSV)" and raw_button().disabled
    (note,) = [i.value for i in at.info]
    assert "more than 20 rows" in note
    assert "`specfinops export --what tokens --run 1 --out run-1-tokens.csv`" in note
    assert data.raw_rows(filled, "tokens", 1, 20) == 21 and data.raw_rows(filled, "tokens", 1, 100) == 66


def test_dashboard_never_imports_torch(filled):
    code = (
        "import sys, os\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        f"os.environ['SPECFINOPS_DB_URL'] = {filled!r}\n"
        "from streamlit.testing.v1 import AppTest\n"
        f"at = AppTest.from_file({str(MAIN)!r}, default_timeout=120).run()\n"
        f"for p in {list(PAGES.values())!r}:\n"
        "    at.switch_page(p).run()\n"
        "    assert not at.exception, p\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'vllm'))\n"
        "print('HEAVY', bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "HEAVY []" in out.stdout, out.stdout[-2000:]


def test_time_buckets_are_named_in_their_own_unit():
    """Chart titles say "per 30 s", not "per 0 min" (buckets below a minute are nice_bucket_s's first five)."""
    from app.dashboard.page_queries import NICE_BUCKETS_S, bucket_label

    assert [bucket_label(b) for b in NICE_BUCKETS_S] == [
        "1 s", "5 s", "10 s", "30 s", "1 min", "5 min", "15 min", "30 min", "1 h", "3 h", "6 h", "12 h",
        "1 day", "7 days",
    ]  # fmt: skip
    assert bucket_label(90) == "90 s" and bucket_label(7200) == "2 h"


def test_overview_explains_a_cheaper_token_with_negative_savings():
    """Spec's pooled cost per 1M tokens below AR's while the projection at the SLA needs more spec nodes
    (AR's best configuration meeting the SLA is faster): the Overview says why, naming both capacities;
    nothing is said when the two agree or a figure is missing."""
    from types import SimpleNamespace as NS

    from app.dashboard.common import cost_vs_savings_note

    proj = NS(annual_savings_usd=-17492.0, sla_ms=50.0, capacity_tokens_per_s_ar=88.49,
              capacity_tokens_per_s_spec=74.87)
    cheap, dear = NS(total_usd_per_1m=0.27), NS(total_usd_per_1m=0.34)
    note = cost_vs_savings_note(cheap, dear, proj)
    assert note and "50 ms SLA" in note and "AR 88.5" in note and "speculative 74.9" in note
    # AR cheaper per token but speculation saves: also explained
    assert cost_vs_savings_note(dear, cheap, NS(**{**vars(proj), "annual_savings_usd": 1000.0}))
    # agreeing signs, zero savings, missing figures: nothing to explain
    assert cost_vs_savings_note(cheap, dear, NS(**{**vars(proj), "annual_savings_usd": 1000.0})) is None
    assert cost_vs_savings_note(cheap, dear, NS(**{**vars(proj), "annual_savings_usd": 0.0})) is None
    assert cost_vs_savings_note(cheap, NS(total_usd_per_1m=None), proj) is None
    assert cost_vs_savings_note(cheap, dear, None) is None and cost_vs_savings_note(None, dear, proj) is None


def test_page_queries_on_both_stores(db_url):
    """ITL, acceptance by position and over-time buckets in SQL, checked by hand on SQLite and PostgreSQL."""
    from app.dashboard import page_queries as pq

    engine = open_store(fill_store(db_url))
    f = queries.Filters()
    itl = pq.itl_histogram(engine, f)
    assert itl.stride == 1 and itl.total_tokens == 33 + 33 + 33 + 17
    got = {(r.mode, r.itl_ms): r.count for r in itl.frame.itertuples()}
    # AR: 32 steps over 800 ms and over 1600 ms; spec: 8 steps over 400 ms, 6 steps over 320 ms
    assert got == {("ar", 25.0): 32, ("ar", 50.0): 32, ("spec", 50.0): 8, ("spec", 53.3): 6}
    pct = pq.histogram_percentiles(itl.frame, "itl_ms")
    # numpy's linear percentile, as queries.percentile (the Overview's): 32 gaps of 25 ms and 32 of 50 ms have
    # their median halfway, 37.5 ms (+ the 0.05 ms to each bucket's midpoint)
    assert pct["ar"][50] == pytest.approx(37.55) and pct["ar"][95] == pytest.approx(50.05)
    spec_gaps = [50.05] * 8 + [53.35] * 6
    for q in (50, 95, 99):
        assert pct["spec"][q] == pytest.approx(queries.percentile(spec_gaps, q))

    sampled = pq.itl_histogram(engine, f, max_tokens=40)  # about 1 request in 3, by a hash of the id (only id 2)
    assert sampled.stride == 3 and sampled.frame["count"].sum() < itl.frame["count"].sum()

    pos = pq.acceptance_by_position(engine, f)
    # spec steps: 8 accepting 3, 4 accepting 2, 2 accepting 1 (K = 4)
    assert list(pos["offered"]) == [14, 14, 14, 14]
    assert list(pos["accepted"]) == [14, 12, 8, 0]

    # along the answer, spans of 8 output tokens: code's 8 steps accept 3 (emit 4) from token 1 on, so
    # they start at 1, 5 | 9, 13 | 17, 21 | 25, 29; chat's 6 steps accept 2, 2, 2, 2, 1, 1 (emit 3, 3, 3,
    # 3, 2, 2) and start at 1, 4, 7 | 10, 13, 15. Every step rejects one token (accepted < K = 4).
    spans = pq.acceptance_along_answer(engine, f, width=8)
    assert spans.stride == 1 and spans.total_drafts == 14
    along = spans.frame
    assert list(along["start"]) == [0, 8, 16, 24] and list(along["end"]) == [8, 16, 24, 32]
    assert list(along["steps"]) == [5, 5, 2, 2]
    assert list(along["accepted"]) == [3 + 3 + 2 + 2 + 2, 3 + 3 + 2 + 1 + 1, 6, 6]
    assert list(along["tested"]) == [12 + 5, 10 + 5, 8, 8] and list(along["drafted"]) == [20, 20, 8, 8]
    assert list(along["alpha"]) == pytest.approx([12 / 17, 10 / 15, 6 / 8, 6 / 8])
    assert list(along["acceptance_rate"]) == pytest.approx([12 / 20, 10 / 20, 6 / 8, 6 / 8])
    assert along["accepted"].sum() == 34  # every spec step once
    whole = pq.acceptance_along_answer(engine, f).frame  # 32-token spans: one span ends at token 31
    assert list(whole["start"]) == [0] and int(whole["steps"].iloc[0]) == 14
    code = pq.acceptance_along_answer(engine, queries.Filters(domain="code"), width=8).frame
    assert list(code["steps"]) == [2, 2, 2, 2] and list(code["alpha"]) == pytest.approx([0.75] * 4)
    assert pq.acceptance_along_answer(engine, queries.Filters(domain="rewrite")).frame.empty
    # over the cap the window runs on about 1 in n requests, by a hash of the id (page_queries.request_hash):
    # spec's requests are ids 3 (code) and 4 (chat), and a stride of 2 keeps the chat one alone
    sampled = pq.acceptance_along_answer(engine, f, width=8, max_drafts=10)
    assert sampled.stride == 2 and sampled.total_drafts == 14
    assert int(sampled.frame["steps"].sum()) == 6 and int(sampled.frame["accepted"].sum()) == 10
    with pytest.raises(ValueError, match="width"):
        pq.acceptance_along_answer(engine, f, width=0)

    over = pq.acceptance_over_time(engine, f, 3600)
    assert len(over) == 1 and over["accepted"].iloc[0] == 34 and over["drafted"].iloc[0] == 56
    assert over["mean_k"].iloc[0] == pytest.approx(4.0)
    lat = pq.latency_over_time(engine, f, 3600)
    assert set(lat["mode"]) == {"spec", "ar"} and lat["requests"].sum() == 4
    power = pq.power_over_time(engine, f, 1)
    assert set(power["source"]) == {"nvml", "estimate"}
    hists = pq.latency_histograms(engine, f)
    ttft = hists[(hists["metric"] == "ttft") & (hists["mode"] == "ar")]
    assert dict(zip(ttft["value_ms"], ttft["count"], strict=True)) == {100.0: 1, 200.0: 1}

    # an EOS cuts chat's last step inside its accepted draft (1 kept, no correction after it): the request ended
    # there, no rejection; positions 2-4 of that step are not offered, and its span tests 1 token, not 2
    from sqlalchemy import text

    with engine.begin() as c:
        last = c.execute(text("SELECT max(s.id) FROM steps s JOIN requests q ON q.id = s.request_id "
                              "WHERE q.domain = 'chat' AND s.k > 0")).scalar_one()
        c.execute(text("UPDATE steps SET num_emitted = accepted WHERE id = :i"), {"i": last})
    pos = pq.acceptance_by_position(engine, f)
    assert list(pos["offered"]) == [14, 13, 13, 13] and list(pos["accepted"]) == [14, 12, 8, 0]
    along = pq.acceptance_along_answer(engine, f, width=8).frame
    assert list(along["tested"]) == [12 + 5, 10 + 4, 8, 8]


def test_dashboard_command_is_local_and_headless(tmp_path, capsys):
    from app.cli import main
    from app.commands.dashboard import main_script, streamlit_argv

    argv = streamlit_argv(main_script(), "127.0.0.1", 8601, headless=True)
    options = argv[argv.index(str(main_script())) + 1:]
    pairs = dict(zip(options[::2], options[1::2], strict=True))
    assert pairs["--server.address"] == "127.0.0.1" and pairs["--server.headless"] == "true"
    assert pairs["--browser.gatherUsageStats"] == "false" and main_script() == MAIN
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"not a database" * 200)
    assert main(["dashboard", "--db", f"sqlite:///{bad}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot open the store" in err and len(err.splitlines()) == 1
    # a server store that cannot be opened: its password was printed with the URL as given
    assert main(["dashboard", "--db", "postgresql://u:SECRETPW1@127.0.0.1:9/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot open the store postgresql://u:***@127.0.0.1:9/x" in err and "SECRETPW1" not in err, err
    with pytest.raises(SystemExit):
        main(["dashboard", "--help"])
    assert "examples:" in capsys.readouterr().out


def _two_sessions(url: str, apart) -> None:
    """An AR and a spec run at BASE_TIME and again `apart` later."""
    from synthetic import BASE_TIME

    engine = open_store(url)
    with Session(engine) as s:
        for start in (BASE_TIME, BASE_TIME + apart):
            make_run(s, "ar", started_at=start, requests=[Req(output_tokens=33, ttft_ms=100, e2e_ms=900)])
            make_run(s, "spec", started_at=start, requests=[spec_req(33, k=4, accepted=24, ttft_ms=100, e2e_ms=500)])
        s.commit()
    engine.dispose()


def test_over_time_lines_break_where_no_request_ran(sqlite_url, monkeypatch):
    """Two sessions ten minutes apart: the over-time lines stop at the last bucket of the first and start
    again at the second, instead of a straight line across ten minutes with no requests (read as data)."""
    from datetime import timedelta

    _two_sessions(sqlite_url, timedelta(minutes=10))
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Latency"])
    assert_clean(at)
    figures = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    [tpot] = [f for f in figures if f["layout"]["title"]["text"].startswith("Mean TPOT per")]
    for trace in tpot["data"]:
        ys = trace["y"]
        assert len(trace["x"]) == len(ys) and ys.count(None) == 1, trace  # one break, between the sessions
        assert ys[0] is not None and ys[-1] is not None
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Speculation"])
    assert_clean(at)
    over_time = json.loads(at.get("plotly_chart")[1].proto.spec)
    assert over_time["data"][0]["y"].count(None) == 1


def test_broken_at_gaps_inserts_one_missing_point_per_gap():
    import pandas as pd

    from app.dashboard.charts import broken_at_gaps

    t0 = pd.Timestamp("2026-11-02 09:00:00")
    part = pd.DataFrame({"t": [t0 + pd.Timedelta(seconds=s) for s in (10, 0, 5, 60)], "v": [2.0, 1.0, 1.5, 3.0]})
    xs, ys = broken_at_gaps(part, "v", 5)
    assert ys == [1.0, 1.5, 2.0, None, 3.0]  # sorted by time; 10 s -> 60 s skips empty buckets
    assert xs[3] == t0 + pd.Timedelta(seconds=15)  # the break sits in the first empty bucket
    assert broken_at_gaps(part, "v", None)[1] == [1.0, 1.5, 2.0, 3.0]
    assert broken_at_gaps(part, "v", 60)[1] == [1.0, 1.5, 2.0, 3.0]  # no bucket of a minute is empty


def test_energy_page_without_power_says_how_to_record_it(sqlite_url, monkeypatch):
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(output_tokens=33, ttft_ms=100, e2e_ms=900)])
        s.commit()
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Energy"])
    assert_clean(at)
    [info] = [i.value for i in at.info if i.value.startswith("No power samples in view")]
    assert "--power nvml" in info and "--power rapl" in info and "--power estimate --tdp-w W" in info


def test_tables_show_times_to_the_second_and_missing_as_a_dash():
    import pandas as pd

    from app.dashboard.common import MISSING, table_style

    frame = pd.DataFrame({"started (UTC)": pd.to_datetime(["2026-12-04 23:41:27.786169", None]),
                          "tokens/s": [75.6312, None]})
    html = table_style(frame).to_html()
    assert ">2026-12-04 23:41:27<" in html and ".786169" not in html
    assert ">75.63<" in html and html.count(f">{MISSING}<") == 2
    priced = table_style(pd.DataFrame({"node $/h": [0.0832, 12.5], "energy $/1M": [0.00042, 93290.4]})).to_html()
    assert all(f">{v}<" in priced for v in ("0.0832", "12.5", "0.00042", "93,290")), priced


def test_acceptance_by_position_labels_zero_and_counts():
    """A position where no draft was accepted still reads 0% (the label sat inside a bar of height zero and
    was not drawn), and each position says how many drafts reached it."""
    import pandas as pd

    from app.dashboard import charts

    frame = pd.DataFrame({"position": [1, 2, 3], "offered": [1145, 580, 3], "accepted": [584, 365, 0],
                          "rate": [584 / 1145, 365 / 580, 0.0]})
    [bar] = charts.acceptance_by_position(frame).data
    assert list(bar.text) == ["51%", "63%", "0%"] and bar.textposition == "outside" and bar.cliponaxis is False
    fig = charts.acceptance_by_position(frame)
    assert list(fig.layout.xaxis.ticktext) == ["1<br>n=1,145", "2<br>n=580", "3<br>n=3"]


def test_tables_give_the_grid_the_missing_placeholder():
    """The grid draws a null cell itself ("None", whatever the Styler's na_rep says) unless given a
    placeholder: every table of the dashboard passes "—"."""
    from app.dashboard.common import MISSING

    def page():
        import pandas as pd

        from app.dashboard.common import show_table

        show_table(pd.DataFrame({"speedup": [1.8, None], "job": ["job 1", None]}))

    at = AppTest.from_function(page).run()
    assert_clean(at)
    [table] = at.dataframe
    assert table.proto.placeholder == MISSING


def test_acceptance_along_the_answer_labels_zero_and_counts():
    import pandas as pd

    from app.dashboard import charts

    frame = pd.DataFrame({"start": [0, 32], "end": [32, 64], "steps": [148, 5], "acceptance_rate": [0.44, 0.0],
                          "mean_acceptance_length": [2.4, 1.0], "alpha": [0.6, 0.0]})
    [bar] = charts.acceptance_along_answer(frame).data
    assert list(bar.x) == ["0-31<br>n=148", "32-63<br>n=5"] and list(bar.text) == ["44%", "0%"]
    assert bar.textposition == "outside" and "%{customdata[3]}" in bar.hovertemplate
    assert [c[3] for c in bar.customdata] == ["0-31", "32-63"]


def test_a_time_range_without_requests_says_so_on_every_page(sqlite_url, monkeypatch):
    """Runs on the 2nd and the 4th: picking the 3rd leaves no runs in view, so each page says no runs match
    (not "nothing in the store", not an empty chart), and the run picker offers none."""
    from datetime import timedelta

    from synthetic import BASE_TIME

    _two_sessions(sqlite_url, timedelta(days=2))
    gap = (BASE_TIME + timedelta(days=1)).date()
    for title in ("Cost & capacity", "Latency", "Speculation"):
        at = open_page(app_for(sqlite_url, monkeypatch), PAGES[title])
        assert len(at.multiselect(key="f_runs").options) == 4
        at.date_input(key="f_time").set_value((gap, gap)).run()
        assert_clean(at)
        assert any("No runs match these filters" in i.value for i in at.info), title
        assert not at.get("plotly_chart") and at.multiselect(key="f_runs").options == []
        at.date_input(key="f_time").set_value((gap, gap + timedelta(days=1))).run()  # the 3rd and the 4th
        assert len(at.multiselect(key="f_runs").options) == 2


def test_reports_page_offers_the_csv_files_when_the_page_is_gone(filled, tmp_path, monkeypatch):
    """A report whose HTML was deleted still offers its CSV files, with a warning for the page."""
    from pathlib import Path

    import streamlit

    from app.cli import main

    assert main(["report", "--db", filled, "--out", str(tmp_path / "out"), "--period", "daily",
                 "--since", "2026-11-02"]) == 0
    [html] = list((tmp_path / "out").glob("report-*/*.html"))
    Path(html).unlink()
    streamlit.cache_data.clear()  # the page caches the list for a minute
    at = open_page(app_for(filled, monkeypatch), "views/reports.py")
    assert_clean(at)
    assert any("report page is not on this machine" in w.value for w in at.warning)
    labels = [b.proto.label for b in at.get("download_button")]
    assert "modes.csv" in labels and not any(lbl.startswith("Download report (HTML") for lbl in labels)


def test_reports_page_says_a_delivery_whose_scheduler_stopped_is_not_under_way(filled, tmp_path, monkeypatch):
    """A scheduler stopped mid-delivery leaves its lease in delivery_error: the page showed "delivery under way
    since ..." days later. A lease past STALE_AFTER_S reads as stopped mid-way, a fresh one as under way."""
    from datetime import UTC, datetime, timedelta

    import streamlit
    from sqlalchemy import text

    from app.cli import main
    from telemetry.report_writer import DELIVERY_LEASE, STALE_AFTER_S

    assert main(["report", "--db", filled, "--out", str(tmp_path / "out"), "--period", "daily",
                 "--since", "2026-11-02"]) == 0
    engine = open_store(filled)
    for age_s, says in ((STALE_AFTER_S + 60, "delivery stopped mid-way (began "), (30, "delivery under way since ")):
        lease = f"{DELIVERY_LEASE}{(datetime.now(UTC) - timedelta(seconds=age_s)).isoformat()}"
        with engine.begin() as c:
            c.execute(text("UPDATE reports SET delivery_status = 'pending', delivery_error = :e"), {"e": lease})
        streamlit.cache_data.clear()  # the page caches the list for a minute
        at = open_page(app_for(filled, monkeypatch), "views/reports.py")
        assert_clean(at)
        [shown] = list(at.dataframe[0].value["delivery error"])
        assert shown.startswith(says) and "+00:00" not in shown, shown
    engine.dispose()


def test_cost_page_names_the_catalog_energy_prices_and_when_they_do_not_count(sqlite_url, monkeypatch):
    at = open_page(app_for(fill_store(sqlite_url, energy=False), monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)
    from telemetry.prices import energy_prices

    kwh, pue = energy_prices(open_store(sqlite_url))
    assert at.number_input(key="w_kwh").label == f"$/kWh (0: ${kwh:g})"
    assert at.number_input(key="w_pue").label == f"PUE (0: {pue:g})"
    assert any("no energy measured for these runs" in c.value for c in at.caption)
    # the projection's own cost per 1M is on the page too, named as the fleet's
    assert any(c.value.startswith("Fleet cost per 1M served tokens (sized for peak, whole nodes): AR $")
               for c in at.caption)
    at = open_page(app_for(fill_store(sqlite_url.replace(".db", "-e.db")), monkeypatch), PAGES["Cost & capacity"])
    assert not any("no energy measured for these runs" in c.value for c in at.caption)


def test_overview_notes_the_runs_that_did_not_complete(sqlite_url, monkeypatch):
    """A killed bench leaves its run 'running' and an interrupted one 'cancelled': the Overview's figures
    still count their finished requests, and a caption says which runs were cut short."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        make_run(s, "spec", status="cancelled", requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500)])
        s.commit()
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    notes = [c.value for c in at.caption if "not every run completed" in c.value]
    assert notes and "run 2 cancelled" in notes[0], [c.value for c in at.caption]


def test_overview_of_completed_runs_has_no_incomplete_note(filled, monkeypatch):
    at = open_page(app_for(filled, monkeypatch), PAGES["Overview"])
    assert not [c.value for c in at.caption if "not every run completed" in c.value]


def test_weekly_chart_points_are_the_weeks_of_the_weekly_reports(db_url):
    """With 7-day buckets the over-time charts' weeks start on Mondays 00:00 UTC, as `report --period weekly`'s do:
    floored from the epoch (a Thursday) they ran Thursday to Thursday, and no point matched a weekly report."""
    from datetime import UTC, datetime

    from app.dashboard import page_queries as pq

    engine = open_store(db_url)
    sunday = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
    # Sun 1 Nov 09:00 | Mon 2 Nov 00:00, Wed 4 Nov, Sun 8 Nov 23:59 | Mon 9 Nov 09:00
    starts_h = [0, 15, 3 * 24, 7 * 24 + 14.98, 8 * 24]
    with Session(engine) as s:
        make_run(s, "ar", started_at=sunday, requests=[Req(5, e2e_ms=50, start_s=h * 3600) for h in starts_h])
        make_run(s, "spec", started_at=sunday, requests=[spec_req(9, 4, 4, e2e_ms=50, start_s=h * 3600)
                                                         for h in starts_h])
        s.commit()
    f = queries.Filters()
    lat = pq.latency_over_time(engine, f, pq.WEEK_S)
    ar = lat[lat["mode"] == "ar"]
    assert [t.strftime("%a %Y-%m-%d %H:%M") for t in ar["t"]] == [
        "Mon 2026-10-26 00:00", "Mon 2026-11-02 00:00", "Mon 2026-11-09 00:00"]
    assert list(ar["requests"]) == [1, 3, 1]
    over = pq.acceptance_over_time(engine, f, pq.WEEK_S)
    per_request = over["drafts"].iloc[0]  # the one request of the first week's
    assert [t.day for t in over["t"]] == [26, 2, 9] and list(over["drafts"]) == [per_request, 3 * per_request,
                                                                                 per_request]
    daily = pq.latency_over_time(engine, f, 86_400)  # days still start at midnight UTC
    assert [t.strftime("%d %H:%M") for t in daily[daily["mode"] == "ar"]["t"]] == [
        "01 00:00", "02 00:00", "04 00:00", "08 00:00", "09 00:00"]


def test_the_dashboard_imports_its_own_app_package_from_a_folder_holding_another(tmp_path):
    """Started from a project with an `app/` package of its own, the dashboard's interpreter must import
    specfinops's `app`: `python -m` puts the working folder first on the import path, and an installed specfinops
    (its folder on the path after it) imported the project's `app` and showed a blank page. The interpreter
    options of the dashboard's command line, run from such a folder with specfinops on PYTHONPATH as an install
    puts it, import specfinops's."""
    import os
    import subprocess
    import sys

    from app.commands.dashboard import main_script, streamlit_argv

    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("# a web project's own app package\n")
    argv = streamlit_argv(main_script(), "127.0.0.1", 8601, headless=True)
    interpreter = argv[:argv.index("-m")]  # the python and its options, before `-m streamlit`
    root = Path(__file__).resolve().parents[1]
    # -S: without site's editable-install finder, specfinops is found on a path entry, as a wheel's install is
    found = subprocess.run([*interpreter, "-S", "-c", "import app; print(app.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    assert found.returncode == 0 and found.stdout.strip() == str(root / "app" / "__init__.py"), found
    assert interpreter[0] == sys.executable


def test_the_dashboard_of_a_checkout_finds_its_app_package_by_name(tmp_path, monkeypatch):
    """Streamlit runs with -P (the working folder off the path): a checkout run as `python -m app.cli dashboard`
    from its own folder had `app` there only, so the child is given the checkout's folder on PYTHONPATH (an
    installed wheel's package is on the path already, and is left so)."""
    import os

    from app.cli import main

    store = f"sqlite:///{tmp_path / 'store.db'}"
    open_store(store).dispose()
    started = {}

    def execve(path, argv, env):
        started.update(argv=argv, env=env)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    with pytest.raises(SystemExit):
        main(["dashboard", "--db", store, "--port", "0"])
    root = str(Path(__file__).resolve().parents[1])
    assert started["env"]["PYTHONPATH"].split(os.pathsep) == [root, "/elsewhere"]
    assert "-P" in started["argv"]


def test_the_sweep_hint_records_into_this_store_on_the_sidebars_workload(filled, monkeypatch):
    """No sweep recorded: the hint's bench named no --db (it filled the default store, not the one in view) and
    was `--workload mixed` whatever the sidebar's workload."""
    engine = open_store(filled)
    with Session(engine) as s:
        make_run(s, "ar", workload="chat", requests=[Req(output_tokens=9, e2e_ms=300)])
        s.commit()
    engine.dispose()
    store = filled.removeprefix("sqlite:///")  # --db names a SQLite store by its path
    at = open_page(app_for(filled, monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)

    def hint() -> str:
        (said,) = [i.value for i in at.info if i.value.startswith("Concurrency sweeps appear here")]
        return said

    assert f"`specfinops bench --workload mixed --mode both --concurrency 1,2,4,8,16,32 --db {store}`" in hint()
    for workload in ("chat", "code"):
        at.sidebar.selectbox(key="f_workload").set_value(workload).run()
        assert_clean(at)
        # with the runs' settings between where they form one group (the next test)
        [command] = [c for c in hint().split("`") if c.startswith("specfinops bench")]
        assert command.startswith(f"specfinops bench --workload {workload} --mode both --concurrency 1,2,4,8,16,32 "), \
            command
        assert command.endswith(f" --db {store}"), command


def test_the_sweep_hint_names_a_workload_bench_takes_and_the_runs_settings(sqlite_url, monkeypatch):
    """The generator's runs (workload 'synthetic'), picked in the sidebar or alone in view: the hint said
    `--workload synthetic`, which bench refuses (unknown workload), and none of the runs' settings, so the sweep
    it recorded was not kept by the filters that kept them. Now a workload bench takes, and the settings of the
    runs in view where they form one comparable group, checked by bench's own parser."""
    import shlex

    from app.cli import build_parser

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for mode in ("ar", "spec"):
            make_run(s, mode, workload="synthetic", temperature=0.7, top_p=0.9, top_k=40, max_new_tokens=64,
                     requests=[Req(output_tokens=9, e2e_ms=300) if mode == "ar" else
                               spec_req(9, k=4, accepted=6, ttft_ms=50, e2e_ms=200)])
        s.commit()
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)

    def hint() -> str:
        (said,) = [i.value for i in at.info if i.value.startswith("Concurrency sweeps appear here")]
        return said

    for pick in (None, "synthetic"):
        if pick is not None:
            at.sidebar.selectbox(key="f_workload").set_value(pick).run()
            assert_clean(at)
        [command] = [c for c in hint().split("`") if c.startswith("specfinops bench")]
        args = build_parser().parse_args(shlex.split(command)[1:])
        assert args.workload == "mixed", command
        assert (args.concurrency, args.temperature, args.top_p, args.top_k, args.max_new_tokens, args.target,
                args.dtype) == ("1,2,4,8,16,32", 0.7, 0.9, 40, 64, "demo/target-tiny", "float32"), command


def test_reports_page_marks_a_partial_period_synthetic_data_and_a_small_sample(filled, tmp_path, monkeypatch):
    """A report written before its period ended, one over the generator's runs and one of two requests a mode:
    the list showed each as final measurements, though their summaries say otherwise (period_complete False,
    synthetic, small_sample), as the HTML report's notices do."""
    from datetime import timedelta

    import streamlit
    from synthetic import BASE_TIME

    from app.cli import main

    engine = open_store(filled)
    with Session(engine) as s:  # a generator's run two days after the measured pair
        make_run(s, "ar", workload="synthetic", started_at=BASE_TIME + timedelta(days=2),
                 requests=[Req(output_tokens=33, ttft_ms=100, e2e_ms=900) for _ in range(30)])
        s.commit()
    engine.dispose()
    out = str(tmp_path / "out")
    assert main(["report", "--db", filled, "--out", out, "--period", "daily", "--since", "2026-11-02"]) == 0
    # a period that ends long after now: its report is partial
    assert main(["report", "--db", filled, "--out", out, "--period", "custom", "--since", "2026-11-04",
                 "--until", "2099-01-01"]) == 0
    streamlit.cache_data.clear()  # the page caches the list for a minute
    at = open_page(app_for(filled, monkeypatch), "views/reports.py")
    assert_clean(at)
    table = at.dataframe[0].value
    marks = dict(zip(table["id"], table["caveats"], strict=True))
    assert marks[1] == "small sample", marks
    assert "partial period" in marks[2] and "synthetic data" in marks[2] and "small sample" not in marks[2], marks
    at.selectbox(key="report_pick").set_value(2).run()
    assert_clean(at)
    said = [w.value for w in at.warning]
    assert any(w.startswith("Report #2: partial period") for w in said), said


def test_runs_page_compares_a_comparable_completed_pair_by_default(sqlite_url, monkeypatch):
    """The default pair was the newest run of each mode whatever they were: a spec code run at temperature 0.7
    on node-b against a killed AR chat run still 'running'. It is now a pair of one comparable group (one bench's,
    where there is one) whose runs completed, and the comparison says each run's status."""
    from datetime import timedelta

    from synthetic import BASE_TIME

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        pair = [make_run(s, mode, requests=[Req(33, 100, 900) if mode == "ar" else
                                            spec_req(33, k=4, accepted=24, ttft_ms=100, e2e_ms=500)])
                for mode in ("ar", "spec")]  # runs 1 and 2: one bench, code at temperature 0, completed
        for run in pair:
            run.invocation_id = "0f0f0f0f-0000-4000-8000-000000000001"
        later = BASE_TIME + timedelta(hours=1)
        make_run(s, "spec", node_id="node-b", temperature=0.7, started_at=later,
                 requests=[spec_req(33, k=4, accepted=20, ttft_ms=100, e2e_ms=600)])  # run 3
        make_run(s, "ar", workload="chat", status="running", started_at=later,
                 requests=[Req(33, 100, 1000)])  # run 4: killed, never ended
        s.commit()
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Runs"])
    assert_clean(at)
    compare = at.dataframe[1].value.set_index("figure")
    assert list(compare.columns) == ["run #2", "run #1"], list(compare.columns)
    assert list(compare.loc["status"]) == ["completed", "completed"]
    at.selectbox(key="cmp_b").set_value(4).run()
    assert list(at.dataframe[1].value.set_index("figure").loc["status"]) == ["completed", "running"]


def test_the_reports_page_shows_no_banner_of_the_sidebars_runs(filled, monkeypatch):
    """The sidebar's runs include a generator's: the pages they filter say so; the Reports page, which they do not
    filter, said it too, of runs none of its reports need hold (each report's row marks its own)."""
    engine = open_store(filled)
    with Session(engine) as s:
        make_run(s, "ar", workload="synthetic", requests=[Req(output_tokens=33, ttft_ms=100, e2e_ms=900)])
        s.commit()
    engine.dispose()
    at = open_page(app_for(filled, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    assert [w for w in at.warning if w.value.startswith("Synthetic data:")]
    at.switch_page("views/reports.py").run()
    assert_clean(at)
    assert not [w.value for w in at.warning if w.value.startswith("Synthetic data:")]


def _default_pair_before(runs):
    """default_pair as it was before it went linear: a group's runs filtered again for each of its invocations."""
    from collections import defaultdict

    from app.dashboard.views.runs import _ready
    from telemetry.queries import COMPARED_FIELDS, key_of

    def best(rs):
        return max(rs, key=lambda r: (_ready(r), r.run_id))

    groups: dict[tuple, dict[str, list]] = defaultdict(lambda: {"spec": [], "ar": []})
    for r in runs:
        if r.mode in ("spec", "ar"):
            groups[(*key_of(r, COMPARED_FIELDS), r.concurrency)][r.mode].append(r)
    pairs = []
    for g in groups.values():
        if g["spec"] and g["ar"]:
            pairs.append((best(g["spec"]), best(g["ar"])))
            for inv in {r.invocation_id for r in g["spec"]} & {r.invocation_id for r in g["ar"]} - {None}:
                pairs.append((best([r for r in g["spec"] if r.invocation_id == inv]),
                              best([r for r in g["ar"] if r.invocation_id == inv])))

    def rank(pair) -> tuple:
        spec, ar = pair
        ready = tuple(x and y for x, y in zip(_ready(spec), _ready(ar), strict=True))
        together = spec.invocation_id is not None and spec.invocation_id == ar.invocation_id
        return (*ready, together, max(spec.run_id, ar.run_id), min(spec.run_id, ar.run_id))

    return None if not pairs else tuple(r.run_id for r in max(pairs, key=rank))


class _CountedRun:
    """A run summary's fields default_pair reads, counting the reads of its invocation id."""

    reads = 0

    def __init__(self, invocation_id, **fields):
        self._invocation_id = invocation_id
        self.__dict__.update(fields)

    @property
    def invocation_id(self):
        _CountedRun.reads += 1
        return self._invocation_id


def _synthetic_runs(n: int, seed: int) -> list:
    import random
    from types import SimpleNamespace

    rnd = random.Random(seed)
    return [_CountedRun(rnd.choice([None, *(f"inv-{i}" for i in range(max(1, n // 3)))]),
                        run_id=i + 1, mode=rnd.choice(["spec", "ar", "spec", "ar", "other"]),
                        status=rnd.choice(["completed", "completed", "running", "failed"]),
                        stats=SimpleNamespace(output_tokens=rnd.choice([0, 33])), workload=rnd.choice(["code", "chat"]),
                        temperature=rnd.choice([0.0, 0.7]), kind="bench", target="t", device="cpu",
                        backend="torch", dtype="float32", top_p=1.0, top_k=0, max_new_tokens=128,
                        concurrency=rnd.choice([1, 4]))
            for i in range(n)]


def test_the_runs_pages_default_pair_is_the_same_and_reads_each_run_a_few_times():
    """default_pair filtered a comparable group's runs again for each of the group's invocations: a time quadratic
    in the runs (12 s for 16,000 runs, on every rerun of the Runs page). Its pair is the same as before on random
    stores, and it reads each run's invocation a bounded number of times (before: about n²/8 reads for n runs)."""
    from app.dashboard.views.runs import default_pair

    for n, seed in [(n, seed) for n in (0, 1, 2, 5, 12, 40) for seed in range(30)] + [(600, 1), (600, 2)]:
        runs = _synthetic_runs(n, seed)
        assert default_pair(runs) == _default_pair_before(runs), (n, seed)
    runs = _synthetic_runs(2_000, 3)
    _CountedRun.reads = 0
    default_pair(runs)
    assert _CountedRun.reads <= 3 * len(runs), _CountedRun.reads


def test_cost_page_warns_where_failed_requests_stretch_a_configurations_span(tmp_path, monkeypatch):
    """`project`'s caveat that a timed-out request at the end of run 1 lowers its capacity is on the Cost page."""
    from test_cost_cli import _failed_at_the_end

    url = f"sqlite:///{tmp_path / 'failed.db'}"
    _failed_at_the_end(url)
    at = open_page(app_for(url, monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)
    said = [w.value for w in at.warning if "failed or cancelled requests" in w.value]
    assert len(said) == 1 and said[0].startswith(
        "Projection: failed or cancelled requests of the AR configuration of run 1 (concurrency 1) add 60.7 s"), said

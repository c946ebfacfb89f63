"""What a browser audit of the dashboard found, each checked through AppTest (tests/test_dashboard_apptest.py's
store: run 1 AR, run 2 spec) or the function that writes it."""

from __future__ import annotations

import json
import re

from test_dashboard_apptest import PAGES, app_for, assert_clean, fill_store, open_page

from app.dashboard.common import prices_text, throughput
from telemetry import costing
from telemetry.labels import node_price_text
from telemetry.store import open_store

LEFT_OUT = "the sidebar's filters leave out the store's 1 speculative run; widen them"


def _infos(at) -> list[str]:
    return [i.value for i in at.info]


def test_pages_say_the_sidebar_leaves_out_the_stores_speculative_runs(sqlite_url, monkeypatch):
    """With the sidebar's Runs on the AR run alone, the Speculation page said the store needs `--mode spec` runs
    (it has one); Latency and Energy showed the speculative figures as "—" without a word. Each says what the
    Overview says: the filters leave the store's speculative run out."""
    at = open_page(app_for(fill_store(sqlite_url), monkeypatch), PAGES["Speculation"])
    at.sidebar.multiselect(key="f_runs").set_value([1]).run()
    assert_clean(at)
    infos = _infos(at)
    assert any(i.startswith(f"No speculative runs in view: {LEFT_OUT}") for i in infos), infos
    assert not any("--mode spec" in i for i in infos), infos
    for page in ("Latency", "Energy", "Overview"):
        at.switch_page(PAGES[page]).run()
        assert_clean(at)
        infos = _infos(at)
        assert any(i.startswith(f"No speculative runs in view: {LEFT_OUT} to compare") for i in infos), (page, infos)
    # nothing left out with both runs in view: no such line
    at.sidebar.multiselect(key="f_runs").set_value([]).run()
    at.switch_page(PAGES["Latency"]).run()
    assert not any("leave out" in i for i in _infos(at)), _infos(at)


def test_the_cost_page_and_the_projection_caveat_say_the_sidebar_leaves_out_the_stores_runs(sqlite_url, monkeypatch):
    """With the sidebar on the AR run alone, the Cost page showed the speculative costs and nodes as "—" without a
    word, and its and the Overview's projection warning said "the spec runs are missing (none in view) ... record
    both modes ... --mode both": the store has a speculative run, which the sidebar's filters leave out."""
    at = open_page(app_for(fill_store(sqlite_url), monkeypatch), PAGES["Cost & capacity"])
    at.sidebar.multiselect(key="f_runs").set_value([1]).run()
    for page in ("Cost & capacity", "Overview"):
        at.switch_page(PAGES[page]).run()
        assert_clean(at)
        assert f"No speculative runs in view: {LEFT_OUT} to compare." in _infos(at), (page, _infos(at))
        (caveat,) = [w.value for w in at.warning if "the spec runs are missing" in w.value]
        assert caveat.endswith(f"so AR is compared with nothing; {LEFT_OUT}."), (page, caveat)
        assert "--mode both" not in caveat and "record both modes" not in caveat, (page, caveat)


_BUCKET = re.compile(r" per \d+ (s|min|h|day|days)\b")


def test_charts_over_time_name_their_bucket(sqlite_url, monkeypatch):
    """"Power per device (mean per time bucket)", "Acceptance rate", "K proposed over time": the Latency page's
    charts say "per 5 min", these did not say how long a point is."""
    at = open_page(app_for(fill_store(sqlite_url), monkeypatch), PAGES["Speculation"])
    assert_clean(at)
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    over_time = [t for t in titles if t.startswith(("Acceptance rate", "Mean acceptance length", "Mean K proposed"))]
    assert len(over_time) == 3 and all(_BUCKET.search(t) for t in over_time), titles
    at.switch_page(PAGES["Energy"]).run()
    assert_clean(at)
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    (power,) = [t for t in titles if t.startswith("Power per device")]
    assert _BUCKET.search(power) and "time bucket" not in power, power


def test_a_custom_node_price_is_named_once(sqlite_url):
    """"node custom $10/h node at $10.00/h": the custom price's name holds its $/h already."""
    engine = open_store(fill_store(sqlite_url))
    run_costs, _ = costing.costs(engine, node_hourly_usd=10.0)
    text = prices_text(run_costs, {"node_hourly_usd": 10.0})
    assert text.startswith("node custom $10.00/h (your input); electricity "), text
    assert text.count("$10") == 1, text
    engine.dispose()


def test_a_custom_node_price_is_named_once_everywhere(sqlite_url, monkeypatch, capsys):
    """The Overview's projection caption read "priced as custom $12/h node ($12.00/h)", `cost`'s run rows
    "custom $10/h node ($10/h)", `project` "priced as custom $10/h node ($10/node-hour)": each names it once, as
    the Cost page does (labels.node_price_text), and a catalog price by its name and rate."""
    from app.cli import main

    assert node_price_text("custom $12/h node", 12.0, custom=True) == "custom $12.00/h"
    assert node_price_text("H100 x8", 55.04, custom=False) == "H100 x8 at $55.04/h"
    url = fill_store(sqlite_url)
    at = open_page(app_for(url, monkeypatch), PAGES["Cost & capacity"])
    at.selectbox(key="w_price").set_value("custom $/h per node").run()
    at.number_input(key="w_node_usd").set_value(12.0).run()
    at.switch_page(PAGES["Overview"]).run()
    assert_clean(at)
    (projection,) = [c.value for c in at.caption if c.value.startswith("Projection: ")]
    assert "priced as custom $12.00/h" in projection and projection.count("$12") == 1, projection
    assert main(["project", "--db", url, "--daily-tokens", "1e6", "--peak-factor", "2",
                 "--p95-tpot-sla-ms", "50", "--node-hourly-usd", "10"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("priced as ")]
    assert line.startswith("priced as custom $10.00/h") and line.count("$10") == 1, line
    assert main(["cost", "--db", url, "--node-hourly-usd", "10"]) == 0
    rows = [x for x in capsys.readouterr().out.splitlines() if x.endswith("/h")]
    assert len(rows) == 2 and all(x.endswith("  custom $10.00/h") for x in rows), rows


def test_throughput_keeps_three_significant_digits():
    """"Capacity AR 3.14" beside "Capacity spec 6.9": both to three significant digits."""
    assert [throughput(v) for v in (6.9, 3.14159, 43.2, 0.5, 99.94, 99.96, 1234.5, None)] == [
        "6.90", "3.14", "43.2", "0.500", "99.9", "100", "1,234", "—"]


def test_the_reports_page_marks_a_speedup_above_its_acceptance_length(sqlite_url, tmp_path, monkeypatch):
    """The report's summary flags the speedup (`speedups[i]["speedup_warning"]`) and `report` warns of it, its page
    says it above the tiles; the Reports page's caveats and warnings said nothing."""
    from datetime import timedelta

    from synthetic import BASE_TIME
    from test_paired_speedups import inflated_ar

    from app.dashboard.views.reports import SPEEDUP_ABOVE
    from telemetry import report_writer
    from telemetry.report import period_window

    inflated_ar(sqlite_url)
    engine = open_store(sqlite_url)
    result = report_writer.write_report(engine, period_window("daily", since=BASE_TIME.replace(hour=0)), tmp_path,
                                        now=BASE_TIME + timedelta(days=2), daily_tokens=1e9)
    engine.dispose()
    (row,) = result.summary["speedups"]
    at = open_page(app_for(sqlite_url, monkeypatch), "views/reports.py")
    assert_clean(at)
    (caveats,) = at.dataframe[0].value["caveats"]
    assert SPEEDUP_ABOVE in caveats, caveats
    warnings = [w.value for w in at.warning]
    assert any(w.startswith(f"Report #{result.report_id}: {SPEEDUP_ABOVE}: ") and row["speedup_warning"] in w
               and w.endswith("the projected node counts and savings rest on it.") for w in warnings), warnings


def _tile(at, label: str) -> str:
    (value,) = [m.value for m in at.metric if m.label == label]
    return value


def test_a_refused_cost_input_is_said_with_the_value_the_figures_use(sqlite_url, monkeypatch):
    """A number typed outside an input's bounds (a node at $99,999,999/h, -5 $/kWh, 0 tokens a day): the browser
    refused it without a word to the page, and the figures kept the value before it, silently. The page bounds the
    inputs itself: it names the input refused and the value its figures use (the last one accepted, else the
    default)."""
    at = open_page(app_for(fill_store(sqlite_url), monkeypatch), PAGES["Cost & capacity"])
    at.selectbox(key="w_price").set_value("custom $/h per node").run()
    at.number_input(key="w_node_usd").set_value(12.0).run()
    assert_clean(at)
    assert _tile(at, "Node price") == "$12.00/h"
    at.number_input(key="w_node_usd").set_value(99_999_999.0).run()
    assert_clean(at)
    warnings = [w.value for w in at.warning]
    assert ("Custom node $/h: 99,999,999 refused (it takes 0.01 to 10,000); the figures use $12.00/h, the last "
            "value accepted.") in warnings, warnings
    assert _tile(at, "Node price") == "$12.00/h"
    at.number_input(key="w_kwh").set_value(-5.0).run()
    at.number_input(key="w_daily").set_value(0.0).run()
    assert_clean(at)
    warnings = [w.value for w in at.warning]
    # never changed: their defaults, said as such
    assert any(w.startswith("$/kWh (0: $") and ": -5 refused (it takes 0 to 10); the figures use the default 0 (each "
               "run's recorded $/kWh, else the catalog's)." in w for w in warnings), warnings
    assert ("Tokens/day (M): 0 refused (it takes 0.001 to 100,000,000); the figures use the default 500M tokens a "
            "day.") in warnings, warnings
    # the Overview prices with the values accepted, not the refused ones
    at.switch_page(PAGES["Overview"]).run()
    assert_clean(at)
    # back in bounds: accepted, no warning
    at.switch_page(PAGES["Cost & capacity"]).run()
    for key, value in (("w_node_usd", 20.0), ("w_kwh", 0.0), ("w_daily", 1.0)):
        at.number_input(key=key).set_value(value).run()
    assert_clean(at)
    assert not [w.value for w in at.warning if "refused" in w.value], [w.value for w in at.warning]
    assert _tile(at, "Node price") == "$20.00/h"


def test_a_refused_input_falls_back_to_its_own_last_accepted_value_or_says_the_default(sqlite_url, monkeypatch):
    """Custom $25/h, then $99,999,999/h (refused), then the recorded price and back to custom: the shared
    assumptions hold no node price while the price is not custom, so the figures fell back to the default $10/h
    while the warning said "the last value accepted". Each input keeps its own last accepted value; one never
    changed falls back to its default, and says so."""
    at = open_page(app_for(fill_store(sqlite_url), monkeypatch), PAGES["Cost & capacity"])
    at.selectbox(key="w_price").set_value("custom $/h per node").run()
    at.number_input(key="w_node_usd").set_value(25.0).run()
    at.number_input(key="w_node_usd").set_value(99_999_999.0).run()
    refused = ("Custom node $/h: 99,999,999 refused (it takes 0.01 to 10,000); the figures use $25.00/h, the last "
               "value accepted.")
    assert refused in [w.value for w in at.warning]
    at.selectbox(key="w_price").set_value("runs' recorded price").run()
    assert_clean(at)
    assert not [w.value for w in at.warning if "refused" in w.value]  # a disabled box prices nothing
    at.selectbox(key="w_price").set_value("custom $/h per node").run()
    assert_clean(at)
    node = at.number_input(key="w_node_usd").value
    said = [w.value for w in at.warning if "refused" in w.value]
    assert _tile(at, "Node price") == "$25.00/h", (node, said)
    assert said == ([refused] if node == 99_999_999.0 else []), (node, said)
    # an input never changed falls back to its default, said as the default
    at.number_input(key="w_peak").set_value(50.0).run()
    assert ("Peak factor: 50 refused (it takes 1 to 20); the figures use the default x2."
            in [w.value for w in at.warning]), [w.value for w in at.warning]


def test_a_refused_time_range_is_said_with_the_range_the_figures_use(sqlite_url, monkeypatch):
    """A time range with only its start day picked, or ending before it starts: the figures used the store's whole
    range, silently. The sidebar says the range was refused and which range the figures cover."""
    from datetime import timedelta

    from synthetic import BASE_TIME
    from test_dashboard_edge_stores import add_pair

    add_pair(sqlite_url)
    add_pair(sqlite_url, started_at=BASE_TIME + timedelta(days=2))
    day = BASE_TIME.date()
    whole = f"the figures use the store's whole range, {day:%Y-%m-%d} to {day + timedelta(days=2):%Y-%m-%d}."
    at = app_for(sqlite_url, monkeypatch).run()
    at.switch_page("views/runs.py").run()
    assert not at.sidebar.warning
    for picked, why in (((day + timedelta(days=2),), f"only its start day ({day + timedelta(days=2):%Y-%m-%d}) is "
                                                     "picked: pick its last day too"),
                        ((day + timedelta(days=2), day), f"it ends ({day:%Y-%m-%d}) before it starts "
                                                         f"({day + timedelta(days=2):%Y-%m-%d}), refused")):
        at.sidebar.date_input(key="f_time").set_value(picked).run()
        assert_clean(at)
        assert [w.value for w in at.sidebar.warning] == [f"Time range: {why}; {whole}"]
        assert [s.value for s in at.subheader][0] == "Runs (4)"  # the whole range, as it says
    at.sidebar.date_input(key="f_time").set_value((day, day)).run()
    assert not at.sidebar.warning and [s.value for s in at.subheader][0] == "Runs (2)"

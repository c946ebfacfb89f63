"""The Cost & capacity page prices everything on it with its inputs, shows capacities with their digits, the
go/no-go figure never reads as meeting a line it misses, and partial energy is worded as the CLI words it.

Stores are written through tests/synthetic.py; the pages run in Streamlit's AppTest
(helpers from test_dashboard_apptest.py).
"""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy.orm import Session
from synthetic import Req, h100_runs_of_two_recorded_prices, make_run, spec_req
from test_dashboard_apptest import PAGES, app_for, assert_clean, fill_store, metrics, open_page

from app.dashboard.charts import go_text
from telemetry import costing
from telemetry.prices import energy_prices
from telemetry.store import open_store


def _energy_by_run(at) -> dict[int, float]:
    table = at.dataframe[0].value  # Cost per run: the first table on the page
    return dict(zip(table["run"], table["energy $/1M"], strict=True))


def test_cost_page_prices_the_measured_runs_with_its_electricity_inputs(sqlite_url, monkeypatch):
    """$1/kWh and PUE 1.5 reprice the chart and the per-run table, not only the fleet; their caption says
    whose prices they are. Left at 0, the runs keep their own (here: the catalog's) prices."""
    url = fill_store(sqlite_url)
    engine = open_store(url)
    kwh_cat, pue_cat = energy_prices(engine)
    assert (kwh_cat, pue_cat) != (1.0, 1.5)
    at = open_page(app_for(url, monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)
    runs, _ = costing.costs(engine)
    assert _energy_by_run(at) == pytest.approx({rc.run.run_id: rc.cost.energy_usd_per_1m for rc in runs})
    default_captions = [c.value for c in at.caption]

    at.number_input(key="w_kwh").set_value(1.0)
    at.number_input(key="w_pue").set_value(1.5).run()
    assert_clean(at)
    runs, modes = costing.costs(engine, usd_per_kwh=1.0, pue=1.5)
    energy = _energy_by_run(at)
    assert energy == pytest.approx({rc.run.run_id: rc.cost.energy_usd_per_1m for rc in runs})
    assert energy[1] == pytest.approx(50.0 * 2 / 3.6e6 * 1.5 * 1.0 / 66 * 1e6)  # run 1: 100 J over 66 tokens
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)  # the measured cost per 1M, stacked
    drawn = [y for trace in chart["data"] if trace["name"].startswith("energy") for y in trace["y"] if y is not None]
    assert sorted(drawn) == pytest.approx(sorted(m.cost.energy_usd_per_1m for m in modes))
    [prices] = [c.value for c in at.caption if c.value.startswith("Prices:")]
    assert "electricity $1/kWh (your input); PUE 1.5 (your input)" in prices, prices
    [prices] = [c for c in default_captions if c.startswith("Prices:")]
    assert f"electricity ${kwh_cat:g}/kWh (the catalog's); PUE {pue_cat:g} (the catalog's)" in prices, prices
    [fleet] = [c.value for c in at.caption if c.value.startswith("Fleet cost per 1M")]
    assert "energy at $1/kWh (your input) x PUE 1.5 (your input)" in fleet, fleet


def test_the_electricity_input_names_the_price_the_costs_use(sqlite_url, monkeypatch):
    """A store holding another entry of kind electricity (recorded before `prices set` refused one): the input's
    label showed its $0.02 while every cost used the entry named 'electricity'."""
    from telemetry.db import Price

    fill_store(sqlite_url)
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        s.add(Price(name="cheap-solar", kind="electricity", value=0.02, unit="usd_per_kwh", source="x", as_of=""))
        s.commit()
    kwh = energy_prices(engine)[0]
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)
    assert at.number_input(key="w_kwh").label == f"$/kWh (0: ${kwh:g})" and kwh != 0.02


def test_fleet_cost_of_any_size_reads_as_dollars_and_says_what_the_monthly_figures_hold(sqlite_url, monkeypatch):
    """At $10,000 a node-hour the fleet cost per 1M read "$1.622e+05"; it reads as `cost` writes dollars. Where
    energy is in it, the caption says the monthly costs and savings are node-hours only."""
    url = fill_store(sqlite_url)
    at = open_page(app_for(url, monkeypatch), PAGES["Cost & capacity"])
    at.selectbox(key="w_price").set_value("custom $/h per node").run()
    at.number_input(key="w_node_usd").set_value(10_000.0).run()
    assert_clean(at)
    [fleet] = [c.value for c in at.caption if c.value.startswith("Fleet cost per 1M")]
    assert "e+" not in fleet and re.search(r"AR \$\d{1,3}(,\d{3})+, spec \$\d{1,3}(,\d{3})+ ", fleet), fleet
    assert "The monthly costs and the annual savings above are node-hours only" in fleet


def test_cost_page_shows_capacity_with_its_significant_digits(sqlite_url, monkeypatch):
    """3.02 and 7.36 tokens/s per node, not "3" and "7": the node count is computed from them."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:  # 33 tokens in 10.927 s and 4.484 s: 3.02 and 7.36 tokens/s
        make_run(s, "ar", requests=[Req(output_tokens=33, ttft_ms=100, e2e_ms=10_927)])
        make_run(s, "spec", requests=[spec_req(33, k=4, accepted=24, ttft_ms=100, e2e_ms=4_484)])
        s.commit()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Cost & capacity"])
    at.number_input(key="w_sla").set_value(1000.0).run()
    assert_clean(at)
    sp = costing.project_from_store(engine, daily_tokens=5e8, peak_factor=2.0, sla_ms=1000.0)
    assert sp.projection.capacity_tokens_per_s_ar == pytest.approx(3.02, abs=5e-3)
    m = metrics(at)
    assert m["Capacity AR (tokens/s per node)"] == ["3.02"]
    assert m["Capacity spec (tokens/s per node)"] == ["7.36"]
    assert m["Nodes (AR baseline)"] == [f"{sp.projection.nodes_ar:,d}"]


def test_go_text_never_reads_as_meeting_a_line_it_misses():
    assert go_text(81 / 125) == "0.648"  # not "0.65" beside the 0.65 line
    assert go_text(0.6499999) == "0.649999"
    assert go_text(0.65) == "0.65" and go_text(0.651) == "0.65"  # meets, and reads as meeting
    assert go_text(0.75) == "0.75" and go_text(0.625) == "0.62"
    assert go_text(None) == "—"
    for v in (0.6449, 0.6450001, 0.64999999999, 0.65000000001):
        assert (float(go_text(v)) >= 0.65) == (v >= 0.65), v


def test_speculation_page_does_not_round_alpha_onto_the_go_line(sqlite_url, monkeypatch):
    """alpha 81/125 = 0.648 (44 steps, each stopped at a rejection): below the 0.65 line, and says 0.648."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(output_tokens=33, ttft_ms=100, e2e_ms=900)], with_events=True)
        make_run(s, "spec", requests=[spec_req(126, k=4, accepted=81, ttft_ms=100, e2e_ms=2000)],
                 with_events=True)
        s.commit()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Speculation"])
    assert_clean(at)
    below = [c.value for c in at.caption if c.value.startswith("Below the 0.65 go/no-go line")]
    assert below and "code (alpha 0.648)" in below[0], [c.value for c in at.caption]
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    diamonds = spec["data"][1]
    assert diamonds["y"] == pytest.approx([81 / 125]) and diamonds["text"] == ["0.648"]


@pytest.fixture
def partly_estimated(sqlite_url) -> str:
    """Per mode two runs, one with estimated energy and one without (`--power estimate` and `--power none`)."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for energy, source in ((40.0, "estimate"), (None, "none")):
            make_run(s, "ar", power_source=source,
                     requests=[Req(output_tokens=33, ttft_ms=100, e2e_ms=900, energy_j=energy)])
            make_run(s, "spec", power_source=source,
                     requests=[spec_req(33, k=4, accepted=24, ttft_ms=100, e2e_ms=500, energy_j=energy)])
        s.commit()
    engine.dispose()
    return sqlite_url


def test_cost_page_says_how_many_runs_have_energy_in_the_clis_words(partly_estimated, monkeypatch, capsys):
    from app.cli import main

    assert main(["cost", "--db", partly_estimated]) == 0
    cli = capsys.readouterr().out
    assert "estimated energy for 1 of 2 runs: hardware only" in cli, cli
    at = open_page(app_for(partly_estimated, monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)
    captions = [c.value for c in at.caption]
    assert "AR baseline: estimated energy for 1 of 2 runs: hardware only." in captions, captions
    assert "speculative: estimated energy for 1 of 2 runs: hardware only." in captions, captions
    assert not any("energy not measured" in c for c in captions), captions


def test_overview_cost_help_matches_a_hardware_only_total(partly_estimated, monkeypatch):
    """No energy is in the total: its help does not call an energy part an estimate, and says how many
    runs have energy, as `specfinops cost` does."""
    at = open_page(app_for(partly_estimated, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    tiles = [m for m in at.metric if m.label == "Cost per 1M tokens"]
    assert len(tiles) == 2  # neither total holds energy: no "(incl. estimated energy)" label
    for tile in tiles:
        assert "Hardware only: estimated energy for 1 of 2 runs" in tile.help, tile.help
        assert "Energy part is an estimate" not in tile.help, tile.help
    assert any("cost is hardware only (estimated energy for 1 of 2 runs" in c.value for c in at.caption)


def test_overview_says_measured_energy_was_left_out_not_that_it_was_not_measured(sqlite_url, monkeypatch):
    """Priced as another GPU on the Cost page, the runs' energy measured on their device is left out of the cost;
    the Overview said 'energy not measured' beside a measured J/token. It now gives the cost's own reason."""
    url = fill_store(sqlite_url)
    at = open_page(app_for(url, monkeypatch), PAGES["Cost & capacity"])
    other = next(o for o in at.selectbox(key="w_price").options if o.startswith("H100"))
    at.selectbox(key="w_price").set_value(other).run()
    assert_clean(at)
    at.switch_page(PAGES["Overview"]).run()
    assert_clean(at)
    said = " ".join(c.value for c in at.caption)
    assert "cost is hardware only (measured energy left out: priced as other hardware than measured)" in said, said
    # the spec run's power was estimated: its energy is not called measured
    assert "cost is hardware only (estimated energy left out: priced as other hardware than measured)" in said, said
    assert "energy not measured" not in said, said


def test_energy_page_names_a_partly_estimated_j_per_token_as_the_overview_does(sqlite_url, monkeypatch):
    """Spec runs metered by NVML and others estimated, pooled: the Energy page said '(estimate)' where the Overview
    says 'partly estimated'; and its caption promised dashed lines for estimates drawn as hollow points."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "spec", power_source="nvml", power_w=[250.0, 255.0],
                 requests=[spec_req(33, 4, 24, ttft_ms=100, e2e_ms=500, energy_j=30.0)])
        make_run(s, "spec", power_source="estimate", power_w=[300.0, 310.0],
                 requests=[spec_req(33, 4, 24, ttft_ms=100, e2e_ms=500, energy_j=40.0)])
        s.commit()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Energy"])
    assert_clean(at)
    [tile] = [m for m in at.metric if m.label.startswith("J/token — speculative")]
    assert tile.label == "J/token — speculative (partly estimated)", tile.label
    assert "run 1 measured by nvml, run 2 estimated" in tile.help, tile.help
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert any(m.label == "J/token (partly estimated)" for m in at.metric)
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Energy"])
    said = " ".join(c.value for c in at.caption)
    assert "drawn dashed with hollow markers" in said and "Dashed lines are estimates" not in said


def test_projection_over_runs_of_several_recorded_prices_says_how_to_price_them_in_the_pages_words(
        sqlite_url, monkeypatch):
    """Runs that recorded different node prices are projected at the catalog's, and `project` says so with its
    flags (--node-hourly-usd, --invocation); the Cost & capacity page and the Overview showed those flags: they
    name the Node price input and the sidebar's Invocation instead."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        h100_runs_of_two_recorded_prices(s)
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)
    for page in ("Cost & capacity", "Overview"):
        if page != "Cost & capacity":
            at.switch_page(PAGES[page]).run()
            assert_clean(at)
        warnings = " ".join(w.value for w in at.warning)
        assert "the runs recorded different node prices" in warnings, (page, warnings)
        assert "Node price on the Cost & capacity page" in warnings and "sidebar's Invocation" in warnings, warnings
        assert "--node-hourly-usd" not in warnings and "--invocation" not in warnings, (page, warnings)

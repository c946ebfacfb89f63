"""No fake numbers: a power or cost figure that rests on estimated power is labelled as an estimate wherever it
is shown (report, `cost`, dashboard), figures from different power sources are not compared as if they were
one, and a figure that covers only some requests says so."""

from __future__ import annotations

import csv
import json
import re
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from synthetic import BASE_TIME, Req, make_run, spec_req

from app.cli import main
from telemetry.db import Report
from telemetry.store import open_store

DAY = timedelta(days=1)
D0 = BASE_TIME.replace(hour=0)  # 2026-11-02 00:00 UTC


def add_day(engine, day, power: str, *, ar_j: float | None = 50.0, spec_j: float | None = 30.0) -> None:
    """One AR and one spec run at 09:00 of `day` with power source `power` (estimate, nvml, none)."""
    start = day.replace(hour=9)
    with Session(engine) as s:
        make_run(s, "ar", started_at=start, power_source=power, requests=[
            Req(33, ttft_ms=100, e2e_ms=900, start_s=0.0, energy_j=ar_j),
            Req(33, ttft_ms=100, e2e_ms=1700, start_s=0.2, energy_j=ar_j),
        ])  # fmt: skip
        make_run(s, "spec", started_at=start, power_source=power, requests=[
            spec_req(33, 4, 24, ttft_ms=100, e2e_ms=500, start_s=0.0, energy_j=spec_j),
            spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500, start_s=1.0, energy_j=spec_j),
        ])  # fmt: skip
        s.commit()


def report(url: str, out, *extra: str):
    """`specfinops report` of the day D0; (its summary, its CSV directory, its HTML page)."""
    args = ["report", "--db", url, "--out", str(out), "--period", "daily", "--since", "2026-11-02", *extra]
    assert main(args) == 0
    engine = open_store(url)
    with Session(engine) as s:
        rec = list(s.scalars(select(Report).order_by(Report.id)))[-1]
    engine.dispose()
    return rec.summary, rec.csv_dir, open(rec.html_path, encoding="utf-8").read()


def read_csv(directory: str, name: str) -> dict[str, dict]:
    with open(f"{directory}/{name}.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    key = "figure" if rows and "figure" in rows[0] else next(iter(rows[0]))
    return {r[key]: r for r in rows}


# ---- A: the change table and the bands do not compare estimated with metered energy ----------------------


def test_change_compares_hardware_parts_when_energy_is_metered_now_and_estimated_before(sqlite_url, tmp_path):
    engine = open_store(sqlite_url)
    add_day(engine, D0, "nvml", ar_j=200.0, spec_j=90.0)  # metered: far above the estimate
    add_day(engine, D0 - DAY, "estimate")
    summary, csv_dir, page = report(sqlite_url, tmp_path, "--history", "1")
    change = {c["figure"]: c for c in summary["change"]}
    basis = "hardware part only: energy measured in this period, estimated in the previous one"
    for mode in ("spec", "ar"):
        m = summary["modes"][mode]
        row = change[f"{'AR' if mode == 'ar' else 'spec'} cost per 1M tokens (USD)"]
        assert row["compared"] == basis
        assert row["this_period"] == pytest.approx(m["hardware_usd_per_1m"])
        assert row["change"] == pytest.approx(0)  # the same runs: the hardware part did not move
        assert row["estimated"] is None  # a hardware part holds no energy
    for figure in ("spec J/token", "AR J/token"):
        assert change[figure]["estimated"] == "previous period"
        assert change[figure]["this_period"] is not None and change[figure]["previous_period"] is not None
    bands = {b["metric"]: b for b in summary["anomalies"]}
    assert bands["AR cost per 1M tokens (USD)"]["compared"] == basis
    rows = read_csv(csv_dir, "change")
    assert rows["AR cost per 1M tokens (USD)"]["compared"] == basis
    assert rows["AR J/token"]["estimated"] == "previous period" and rows["output tokens"]["estimated"] == ""
    assert basis in page and "&#x27;estimated&#x27; names the periods" in page
    assert "<td>previous period</td>" in page  # the J/token rows of the change table


def test_change_of_totals_with_estimated_energy_on_both_sides_says_so(sqlite_url, tmp_path):
    engine = open_store(sqlite_url)
    for n in range(4):
        add_day(engine, D0 - n * DAY, "estimate")
    summary, csv_dir, page = report(sqlite_url, tmp_path, "--history", "3")
    change = {c["figure"]: c for c in summary["change"]}
    row = change["spec cost per 1M tokens (USD)"]
    assert row["compared"] == "total"  # the same basis in both: estimated energy
    assert row["estimated"] == "this period and previous period"
    assert change["spec acceptance rate"]["estimated"] is None
    band = {b["metric"]: b for b in summary["anomalies"]}["spec cost per 1M tokens (USD)"]
    assert band["status"] == "within band"
    assert band["estimated"] == "this period and 3 of the 3 previous periods with a value"
    assert read_csv(csv_dir, "anomalies")["spec cost per 1M tokens (USD)"]["estimated"] == band["estimated"]


def test_trend_chart_names_the_energy_bases_it_could_not_compare(sqlite_url, tmp_path):
    engine = open_store(sqlite_url)
    add_day(engine, D0, "nvml")
    add_day(engine, D0 - DAY, "estimate")
    _, _, page = report(sqlite_url, tmp_path, "--history", "1")
    assert "spec (hardware part)" in page
    # the chart's note wrapped in lines (report_html.chart_title: '</sub><br><sub>' between them, as the page's JSON
    # escapes it) read as one line
    page = re.sub(r"(\\u003c(\\u002f)?(sub|br)\\u003e)+", " ", page)
    assert ("hardware part only, the periods' energy is not on one basis (spec: energy measured in this period, "
            "estimated in the previous one; AR: energy measured in this period, estimated in the previous one)"
            in page)
    assert "energy is included in some periods and not in others" not in page


# ---- B: a total that includes estimated energy says so --------------------------------------------------


def test_cost_total_with_estimated_energy_is_labelled_in_the_table_and_the_mode_line(sqlite_url, capsys):
    engine = open_store(sqlite_url)
    add_day(engine, D0, "estimate")
    assert main(["cost", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out.splitlines()
    runs = [line for line in out if line.lstrip()[:1].isdigit()]
    assert len(runs) == 2 and all("(estimated)" in r and "(incl. estimated energy)" in r for r in runs)
    modes = [line for line in out if line.startswith(("spec ", "ar "))]
    assert len(modes) == 2
    assert all(line.endswith("(incl. estimated energy) per 1M tokens") for line in modes), modes


def test_cost_total_with_metered_energy_or_none_is_not_called_an_estimate(sqlite_url, capsys):
    engine = open_store(sqlite_url)
    add_day(engine, D0, "nvml")
    add_day(engine, D0 - DAY, "none", ar_j=None, spec_j=None)
    assert main(["cost", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert "estimated" not in out and "(hardware only)" in out


def test_overview_cost_tile_of_a_total_with_estimated_energy_says_so(sqlite_url, monkeypatch):
    from test_dashboard_apptest import PAGES, app_for, assert_clean, metrics, open_page

    engine = open_store(sqlite_url)
    add_day(engine, D0, "estimate")
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    m = metrics(at)
    assert len(m["Cost per 1M tokens (incl. estimated energy)"]) == 2 and "Cost per 1M tokens" not in m
    assert len(m["J/token (estimate)"]) == 2
    helps = [t.help for t in at.metric if t.label == "Cost per 1M tokens (incl. estimated energy)"]
    assert all("output tokens x 1e6. Energy part is an estimate. " in h for h in helps), helps
    # a tile's label is cut short in its narrow column ("Cost per 1M toke..."): the caption under it says it whole
    captions = [c.value for c in at.caption]
    assert sum(c.endswith(" · cost includes estimated energy · J/token is an estimate") for c in captions) == 2


# ---- C: the Cost & capacity page says "no energy measured" only where none was ---------------------------


def _cost_page(url: str, monkeypatch, sla_ms: float | None = None):
    from test_dashboard_apptest import PAGES, app_for, assert_clean, open_page

    at = open_page(app_for(url, monkeypatch), PAGES["Cost & capacity"])
    if sla_ms is not None:
        at.number_input(key="w_sla").set_value(sla_ms).run()
    assert_clean(at)
    return [c.value for c in at.caption]


def test_cost_page_with_estimated_energy_and_no_configuration_at_the_sla_says_why(sqlite_url, monkeypatch):
    engine = open_store(sqlite_url)
    add_day(engine, D0, "estimate")
    engine.dispose()
    captions = _cost_page(sqlite_url, monkeypatch, sla_ms=1.0)  # no run meets a 1 ms p95 TPOT
    assert not any("no energy measured" in c for c in captions), captions
    assert ("Note: energy is not in the fleet cost: no AR configuration meets the 1 ms SLA; no speculative "
            "configuration meets the 1 ms SLA.") in captions


def test_cost_page_names_the_capacity_configuration_whose_energy_is_incomplete(sqlite_url, monkeypatch):
    engine = open_store(sqlite_url)
    with Session(engine) as s:  # AR: one request of two has energy; spec: all of them
        make_run(s, "ar", power_source="nvml", requests=[Req(33, ttft_ms=100, e2e_ms=900, energy_j=50.0),
                                                        Req(33, ttft_ms=100, e2e_ms=900, start_s=1.0)])
        make_run(s, "spec", power_source="nvml", requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500,
                                                                    energy_j=30.0)])
        s.commit()
    engine.dispose()
    captions = _cost_page(sqlite_url, monkeypatch)
    assert not any("no energy measured" in c for c in captions), captions
    assert ("Note: energy is not in the fleet cost: the AR configuration that sets the capacity (run 1) has energy "
            "figures for only some of its requests.") in captions


def test_cost_page_without_any_energy_still_says_none_was_measured(sqlite_url, monkeypatch):
    engine = open_store(sqlite_url)
    add_day(engine, D0, "none", ar_j=None, spec_j=None)
    engine.dispose()
    captions = _cost_page(sqlite_url, monkeypatch, sla_ms=1.0)
    assert ("Note: no energy measured for these runs: the electricity price and PUE do not change the "
            "figures.") in captions


# ---- D: a J/token over only some requests says so, not "energy not measured" ------------------------------


def add_partial_day(engine, day) -> None:
    """Per mode: one run with estimated energy for every request, one run without energy."""
    add_day(engine, day, "estimate")
    add_day(engine, day, "none", ar_j=None, spec_j=None)


def test_report_says_j_per_token_covers_only_the_requests_with_energy(sqlite_url, tmp_path):
    engine = open_store(sqlite_url)
    add_partial_day(engine, D0)
    summary, csv_dir, page = report(sqlite_url, tmp_path)
    for mode in ("spec", "ar"):
        m = summary["modes"][mode]
        assert m["j_per_token"] is not None and m["energy_complete"] is False and m["energy_included"] is False
        assert "not measured" not in m["cost_note"]
        assert m["cost_note"].startswith("estimated energy for only some requests: hardware only")
    rows = {r["mode"]: r for r in read_csv(csv_dir, "modes").values()}
    assert rows["spec"]["energy complete"] == "False" and rows["spec"]["J/token"]
    assert "not measured" not in rows["spec"]["cost note"]
    assert "hardware only (energy not measured)" not in page  # the tiles (the runs without energy say it)
    assert "hardware only (energy for only some requests)" in page
    assert "(estimated, some requests only)" in page
    assert "Some spec and AR requests have no energy figure; J/token covers those that do" in page


def test_a_cost_note_of_energy_only_on_requests_without_tokens_names_no_none(sqlite_url, tmp_path):
    """The only spec energy is a metered request that answered nothing: no J/token (energy over 0 tokens), and the
    modes table's cost note read "None energy for only some requests: ... (J/token covers ...)"."""
    engine = open_store(sqlite_url)
    add_day(engine, D0, "none", ar_j=None, spec_j=None)
    with Session(engine) as s:
        make_run(s, "spec", started_at=D0.replace(hour=10), power_source="nvml",
                 requests=[Req(0, ttft_ms=None, e2e_ms=100, energy_j=5.0)])
        s.commit()
    summary, csv_dir, page = report(sqlite_url, tmp_path)
    spec = summary["modes"]["spec"]
    assert spec["j_per_token"] is None
    assert spec["cost_note"] == "measured energy for only some requests: hardware only", spec["cost_note"]
    assert read_csv(csv_dir, "modes")["spec"]["cost note"] == spec["cost_note"]
    assert "None energy" not in page


def test_report_with_energy_for_every_request_says_it_is_complete(sqlite_url, tmp_path):
    engine = open_store(sqlite_url)
    add_day(engine, D0, "nvml")
    summary, csv_dir, page = report(sqlite_url, tmp_path)
    assert summary["modes"]["spec"]["energy_complete"] is True
    assert read_csv(csv_dir, "modes")["spec"]["energy complete"] == "True"
    assert "some requests only" not in page and "have no energy figure" not in page


def test_overview_cost_caption_with_partial_energy_does_not_say_not_measured(sqlite_url, monkeypatch):
    from test_dashboard_apptest import PAGES, app_for, assert_clean, open_page

    engine = open_store(sqlite_url)
    add_partial_day(engine, D0)
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    captions = [c.value for c in at.caption]
    assert not any("not measured" in c for c in captions), captions
    # each mode: one run with estimated energy, one without: the CLI's words (costing.partial_energy_text, f740347)
    assert sum("cost is hardware only (estimated energy for 1 of 2 runs; J/token covers the requests with energy)"
               in c for c in captions) == 2, captions
    assert not any("not measured" in (m.help or "") for m in at.metric if m.label.startswith("Cost per 1M"))


# ---- E: estimated and metered energy pooled in one figure is "partly estimated", naming the runs ----------


def test_cost_mode_pooling_estimated_and_metered_energy_says_partly_estimated(sqlite_url, capsys):
    engine = open_store(sqlite_url)
    add_day(engine, D0, "estimate")  # runs 1 (ar), 2 (spec)
    add_day(engine, D0, "nvml")  # runs 3 (ar), 4 (spec)
    assert main(["cost", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    ar = next(line for line in out.splitlines() if line.startswith("ar "))
    assert "(partly estimated: run 1 estimated, run 3 measured by nvml)" in ar
    assert ar.endswith("(incl. partly estimated energy) per 1M tokens")
    runs = {line.split()[0]: line for line in out.splitlines() if line.lstrip()[:1].isdigit()}
    assert "(incl. estimated energy)" in runs["1"] and "estimated" not in runs["3"]  # each run as it is
    assert main(["cost", "--db", sqlite_url, "--json"]) == 0
    modes = {m["mode"]: m for m in json.loads(capsys.readouterr().out)["modes"]}
    assert modes["ar"]["energy_source"] == "partly estimated" and modes["ar"]["energy_estimated"] is True


def test_project_labels_a_pooled_estimate_as_partly_estimated(sqlite_url, capsys):
    """`cost` said "partly estimated" where `project` said "incl. energy (estimated)" for the same runs."""
    engine = open_store(sqlite_url)
    add_day(engine, D0, "estimate")
    add_day(engine, D0, "nvml")
    argv = ["project", "--db", sqlite_url, "--daily-tokens", "1e6", "--peak-factor", "1", "--p95-tpot-sla-ms", "1e4"]
    assert main(argv) == 0
    assert "AR $" in (out := capsys.readouterr().out) and "(incl. energy (partly estimated))" in out, out
    assert main([*argv, "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["assumptions"]
    assert a["energy_estimated_ar"] is True and a["energy_partly_estimated_ar"] is True
    engine = open_store(sqlite_url.replace("store.db", "one.db"))
    add_day(engine, D0, "estimate")  # every run estimated: "estimated", not "partly"
    assert main([*argv[:2], sqlite_url.replace("store.db", "one.db"), *argv[3:]]) == 0
    out = capsys.readouterr().out
    assert "(incl. energy (estimated))" in out and "partly" not in out, out


def test_cost_json_energy_source_of_one_kind(sqlite_url, capsys):
    engine = open_store(sqlite_url)
    add_day(engine, D0, "nvml")
    add_day(engine, D0 - DAY, "none", ar_j=None, spec_j=None)
    assert main(["cost", "--db", sqlite_url, "--json", "--run", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["modes"][0]["energy_source"] is None  # no energy: hardware only
    assert main(["cost", "--db", sqlite_url, "--json", "--run", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["modes"][0]["energy_source"] == "measured"


def test_report_mode_pooling_estimated_and_metered_energy_says_partly_estimated(sqlite_url, tmp_path):
    engine = open_store(sqlite_url)
    add_day(engine, D0, "estimate")
    add_day(engine, D0, "nvml")
    summary, csv_dir, page = report(sqlite_url, tmp_path)
    assert summary["modes"]["ar"]["energy_source"] == "partly estimated"
    assert {r["mode"]: r for r in read_csv(csv_dir, "modes").values()}["ar"]["energy source"] == "partly estimated"
    assert "not a power meter.</p>" not in page  # not "all of it comes from an estimated power source"
    assert "AR <b>partly estimated</b>: run 1 estimated, run 3 measured by nvml" in page
    assert "incl. energy (partly estimated)" in page and "AR 1.52 J (partly estimated)" in page


def test_report_with_every_run_estimated_keeps_the_estimated_sentence(sqlite_url, tmp_path):
    engine = open_store(sqlite_url)
    add_day(engine, D0, "estimate")
    summary, _, page = report(sqlite_url, tmp_path)
    assert summary["modes"]["spec"]["energy_source"] == "estimated"
    assert "comes from an <b>estimated</b> power source, not a power meter." in page
    assert "partly" not in page


def test_overview_labels_a_pooled_estimate_as_partly_estimated(sqlite_url, monkeypatch):
    from test_dashboard_apptest import PAGES, app_for, assert_clean, metrics, open_page

    engine = open_store(sqlite_url)
    add_day(engine, D0, "estimate")
    add_day(engine, D0, "nvml")
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    m = metrics(at)
    assert len(m["Cost per 1M tokens (incl. partly estimated energy)"]) == 2
    assert len(m["J/token (partly estimated)"]) == 2 and "J/token (estimate)" not in m
    # the help agrees with the label ("partly"), each part a sentence ("x 1e6 Energy part is an estimate." did not)
    helps = [t.help for t in at.metric if t.label == "Cost per 1M tokens (incl. partly estimated energy)"]
    assert all("output tokens x 1e6. Energy part is partly an estimate. " in h for h in helps), helps
    captions = [c.value for c in at.caption]
    assert any(c.endswith(" · cost includes partly estimated energy (run 1 estimated, run 3 measured by nvml) · "
                          "J/token partly estimated") for c in captions), captions
    # the Cost & capacity page's stacked bars name that energy as the tiles do (their legend read "estimate")
    import json

    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)
    bars = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert [t["name"] for t in bars["data"]][1:] == ["energy (partly estimated)"]


# ---- F: --tdp-w where it cannot take effect is refused, not ignored ---------------------------------------


@pytest.mark.parametrize("command", ["bench", "serve"])
@pytest.mark.parametrize("power", ["none", "nvml", "rapl"])
def test_tdp_w_with_a_power_source_that_ignores_it_is_one_line_exit_2(command, power, monkeypatch, capsys):
    import serving.server_setup
    import serving.worker

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(serving.worker, "load", no_load)
    monkeypatch.setattr(serving.server_setup, "load", no_load)
    argv = [command, "--no-telemetry", "--power", power, "--tdp-w", "65"]
    argv += ["--port", "0"] if command == "serve" else ["--limit", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "--tdp-w applies to --power estimate or auto" in err[0] and f"--power {power} does not use it" in err[0]


@pytest.mark.parametrize("power", ["estimate", "auto"])
def test_tdp_w_is_taken_where_it_has_an_effect(power):
    from app.commands._common import check_power_options

    check_power_options(power, 65.0)  # estimate uses it; auto falls back to it where no meter opens


# ---- G: wording that reads as what it is --------------------------------------------------------------------


@pytest.mark.parametrize(("power", "said"), [("estimate", "estimated"), ("nvml", "measured")])
def test_cost_mode_line_with_energy_for_some_runs_names_its_source_once(sqlite_url, capsys, power, said):
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "spec", power_source="none", requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500)])
        make_run(s, "spec", power_source=power,
                 requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500, energy_j=30.0)])
        s.commit()
    assert main(["cost", "--db", sqlite_url]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("spec  runs 1-2:"))
    assert f"; {said} energy for 1 of 2 runs: hardware only" in line
    assert "measured (estimated)" not in line and "not measured" not in line


def test_power_chart_names_an_estimate_once_and_a_meter_by_its_source():
    import pandas as pd

    from app.dashboard import charts

    t = pd.Timestamp("2026-11-02 09:00", tz="UTC")
    frame = pd.DataFrame([
        {"node_id": "vm", "device_index": 0, "source": "estimate", "t": t, "power_w": 40.0},
        {"node_id": "gpu-1", "device_index": 0, "source": "nvml", "t": t, "power_w": 250.0},
    ])  # fmt: skip
    fig = charts.power(frame)
    assert sorted(tr.name for tr in fig.data) == ["gpu-1 · device 0 · nvml", "vm · device 0 · estimate"]
    assert {tr.name: tr.line.dash for tr in fig.data}["vm · device 0 · estimate"] == "dash"


def test_runs_compare_shows_a_missing_j_per_token_as_a_dash_without_an_estimate_label(sqlite_url, monkeypatch):
    from test_dashboard_apptest import PAGES, app_for, assert_clean, open_page

    engine = open_store(sqlite_url)
    add_day(engine, D0, "estimate", spec_j=None)  # the spec run's power was estimated, its requests have none
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Runs"])
    assert_clean(at)
    compare = at.dataframe[1].value.set_index("figure")
    assert list(compare.columns) == ["run #2", "run #1"]
    assert compare.loc["J/token", "run #2"] == "—"
    assert compare.loc["J/token", "run #1"].endswith(" (estimate)")  # AR: an estimated figure, labelled


# ---- H: the projection's CSV says what its fleet cost holds ------------------------------------------------


def _downloads(url: str, monkeypatch, page: str) -> dict:
    """The frames behind the page's CSV download buttons, by key (the buttons build their CSV only on a click)."""
    from test_dashboard_apptest import PAGES, app_for, assert_clean, open_page

    import app.dashboard.common as common

    frames: dict = {}
    real = common.download_csv

    def keep(label, frame, file_name, key):
        frames[key] = frame
        real(label, frame, file_name, key)

    monkeypatch.setattr(common, "download_csv", keep)
    at = open_page(app_for(url, monkeypatch), PAGES[page])
    assert_clean(at)
    return frames


def test_projection_csv_says_whether_the_fleet_cost_holds_estimated_energy(sqlite_url, monkeypatch):
    engine = open_store(sqlite_url)
    add_day(engine, D0, "estimate")  # AR p95 TPOT 48.75 ms, spec 12.5 ms: both meet the default 50 ms SLA
    engine.dispose()
    table = _downloads(sqlite_url, monkeypatch, "Cost & capacity")["dl_projection"].set_index("figure")
    assert table.loc["energy included (fleet cost)"].tolist() == [True, True]
    assert table.loc["energy estimated (fleet cost)"].tolist() == [True, True]
    assert table.columns.tolist() == ["AR", "spec"]


def test_projection_csv_of_metered_energy_is_not_an_estimate(sqlite_url, monkeypatch):
    engine = open_store(sqlite_url)
    add_day(engine, D0, "nvml")
    engine.dispose()
    table = _downloads(sqlite_url, monkeypatch, "Cost & capacity")["dl_projection"].set_index("figure")
    assert table.loc["energy included (fleet cost)"].tolist() == [True, True]
    assert table.loc["energy estimated (fleet cost)"].tolist() == [False, False]


# ---- the Overview's spec-vs-AR cost delta compares like with like ------------------------------------------


def _cost_deltas(url: str, monkeypatch) -> dict[str, str]:
    """The cost tiles' deltas by label; the spec tile's (the first) where both share a label."""
    from test_dashboard_apptest import PAGES, app_for, assert_clean, open_page

    at = open_page(app_for(url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    out: dict[str, str] = {}
    for m in at.metric:
        if m.label.startswith("Cost per 1M tokens"):
            out.setdefault(m.label, m.delta)
    return out


def test_overview_cost_delta_of_estimated_against_metered_energy_is_on_the_hardware_parts(sqlite_url, monkeypatch):
    from telemetry.costing import costs

    engine = open_store(sqlite_url)
    with Session(engine) as s:  # spec: estimated power; AR: metered, 3x the energy
        make_run(s, "ar", started_at=BASE_TIME, power_source="nvml",
                 requests=[Req(33, ttft_ms=100, e2e_ms=900, energy_j=150.0)])
        make_run(s, "spec", started_at=BASE_TIME, power_source="estimate",
                 requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500, energy_j=30.0)])
        s.commit()
    c = {m.mode: m.cost for m in costs(engine)[1]}
    engine.dispose()
    change = (c["spec"].hardware_usd_per_1m - c["ar"].hardware_usd_per_1m) / c["ar"].hardware_usd_per_1m
    deltas = _cost_deltas(sqlite_url, monkeypatch)
    assert deltas["Cost per 1M tokens (incl. estimated energy)"] == f"{change:+.0%} vs AR (hardware parts)"


def test_overview_cost_delta_on_one_energy_basis_compares_totals(sqlite_url, monkeypatch):
    from telemetry.costing import costs

    engine = open_store(sqlite_url)
    add_day(engine, D0, "nvml")
    c = {m.mode: m.cost for m in costs(engine)[1]}
    engine.dispose()
    change = (c["spec"].total_usd_per_1m - c["ar"].total_usd_per_1m) / c["ar"].total_usd_per_1m
    deltas = _cost_deltas(sqlite_url, monkeypatch)
    assert deltas["Cost per 1M tokens"] == f"{change:+.0%} vs AR"


# ---- I: the report's e-mail and its fleet cost say what each figure holds, mode by mode -------------------


def _email_costs(summary: dict) -> dict[str, str]:
    """The e-mail's 'Cost per 1M tokens, <mode>: ...' lines, by mode."""
    from telemetry.delivery import email_text

    lines = email_text(summary)[1].splitlines()
    return {mode: next(line.split(": ", 1)[1] for line in lines if line.startswith(f"Cost per 1M tokens, {mode}:"))
            for mode in ("spec", "AR")}


def test_email_labels_each_cost_as_the_report_tiles_do(sqlite_url, tmp_path):
    """The e-mail said "(energy estimated)" only beside a total with energy in it: a hardware-only total (no
    power measured, energy for only some requests) read as the full cost, and a pooled estimate as a whole one."""
    for name, fill, said in (
        ("none", lambda e: add_day(e, D0, "none", ar_j=None, spec_j=None),
         {"spec": "hardware only (energy not measured)", "AR": "hardware only (energy not measured)"}),
        ("partial", lambda e: add_partial_day(e, D0),  # per mode one run estimated, one without energy
         {"spec": "hardware only (energy for only some requests)", "AR": "hardware only (energy for only some "
          "requests)"}),
        ("pooled", lambda e: (add_day(e, D0, "estimate"), add_day(e, D0, "nvml")),
         {"spec": "incl. energy (partly estimated)", "AR": "incl. energy (partly estimated)"}),
        ("metered", lambda e: add_day(e, D0, "nvml"), {"spec": "incl. energy", "AR": "incl. energy"}),
    ):
        url = sqlite_url.replace("store.db", f"{name}.db")
        fill(open_store(url))
        summary, _, page = report(url, tmp_path / name)
        costs = _email_costs(summary)
        for mode, label in said.items():
            value = summary["modes"][mode.lower()]["total_usd_per_1m"]
            assert costs[mode] == f"${value:,.4g}, {label}", (name, costs)
            assert f'<div class="s">{label}</div>' in page, (name, label)  # the tile's words
    # a mode with no runs: no figure, and why
    assert _email_costs({"modes": {"spec": {"total_usd_per_1m": None, "cost_note": "no runs of this mode"}}}) == {
        "spec": "—, no runs of this mode", "AR": "—"}


def test_report_fleet_cost_labels_each_mode_as_project_does(sqlite_url, tmp_path, capsys):
    """The assumptions list gave both fleet costs bare, then "(estimated power)" without saying whose: with AR
    metered and spec estimated, or with no energy at all (node price only), each figure now says what it holds."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:  # AR metered, spec estimated
        start = D0.replace(hour=9)
        make_run(s, "ar", started_at=start, power_source="nvml", requests=[
            Req(33, ttft_ms=100, e2e_ms=900, energy_j=50.0), Req(33, ttft_ms=100, e2e_ms=1700, start_s=0.2,
                                                                 energy_j=50.0)])  # fmt: skip
        make_run(s, "spec", started_at=start, power_source="estimate", requests=[
            spec_req(33, 4, 24, ttft_ms=100, e2e_ms=500, energy_j=30.0),
            spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500, start_s=1.0, energy_j=30.0)])  # fmt: skip
        s.commit()
    opts = ("--daily-tokens", "1e6", "--sla-ms", "1e4")
    summary, _, page = report(sqlite_url, tmp_path / "mixed", *opts)
    p = summary["projection"]
    assert (f"AR {_usd(p['cost_per_1m_tokens_ar_usd'])} (incl. energy), spec "
            f"{_usd(p['cost_per_1m_tokens_spec_usd'])} (incl. energy (estimated)) (") in page
    assert "(estimated power: spec)</li>" in page  # not AR's
    assert main(["project", "--db", sqlite_url, "--daily-tokens", "1e6", "--peak-factor", "1",
                 "--p95-tpot-sla-ms", "1e4"]) == 0
    assert "(incl. energy), spec $" in (out := capsys.readouterr().out) and "(incl. energy (estimated))" in out, out
    url = sqlite_url.replace("store.db", "none.db")
    add_day(open_store(url), D0, "none", ar_j=None, spec_j=None)
    summary, _, page = report(url, tmp_path / "none", *opts)
    p = summary["projection"]
    assert (f"AR {_usd(p['cost_per_1m_tokens_ar_usd'])} (node price only), spec "
            f"{_usd(p['cost_per_1m_tokens_spec_usd'])} (node price only)") in page
    assert "(estimated power" not in page


def _usd(value: float) -> str:
    from telemetry.report_html import usd

    return usd(value)

"""`specfinops report`: periods, the figures (the same as `specfinops cost`), the offline HTML page, the CSV
files, the record, anomaly bands, empty periods and bad input."""

from __future__ import annotations

import csv
import html
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session
from synthetic import BASE_TIME, Req, make_run, spec_req

from app.cli import main
from telemetry import costing, report_writer
from telemetry.costing import costs
from telemetry.db import Report
from telemetry.queries import Filters
from telemetry.report import band_check, period_window
from telemetry.store import open_store

DAY = timedelta(days=1)
D0 = BASE_TIME.replace(hour=0)  # 2026-11-02 00:00 UTC, a Monday


def add_day(engine, day: datetime, *, spec_e2e_ms: float = 500, workload: str = "code",
            energy: bool = True, power_source: str = "estimate") -> None:
    """One AR and one spec run starting at 09:00 of `day` (estimated power, or `power_source`; `energy=False`:
    no power source, no energy figures)."""
    start = day.replace(hour=9)
    power = power_source if energy else "none"
    ar_j, spec_j = (50.0, 30.0) if energy else (None, None)
    with Session(engine) as s:
        make_run(s, "ar", started_at=start, power_source=power, workload=workload, requests=[
            Req(33, ttft_ms=100, e2e_ms=900, start_s=0.0, energy_j=ar_j),
            Req(33, ttft_ms=100, e2e_ms=1700, start_s=0.2, energy_j=ar_j, domain="chat"),
        ])  # fmt: skip
        make_run(s, "spec", started_at=start, power_source=power, workload=workload, requests=[
            spec_req(33, 4, 24, ttft_ms=100, e2e_ms=spec_e2e_ms, start_s=0.0, energy_j=spec_j),
            spec_req(33, 4, 20, ttft_ms=100, e2e_ms=spec_e2e_ms, start_s=1.0, energy_j=spec_j, domain="chat"),
        ])  # fmt: skip
        s.commit()


@pytest.fixture
def store(sqlite_url):
    engine = open_store(sqlite_url)
    add_day(engine, D0)
    yield sqlite_url, engine
    engine.dispose()


def _report(url: str, out, *extra: str) -> list[str]:
    return ["report", "--db", url, "--out", str(out), *extra]


def _only_report(engine) -> Report:
    with Session(engine) as s:
        rows = list(s.scalars(select(Report)))
    assert len(rows) == 1
    return rows[0]


# ---- periods and bands ----------------------------------------------------------------------------------


def test_period_windows():
    now = datetime(2026, 11, 5, 13, 30, tzinfo=UTC)  # a Thursday
    w = period_window("daily", now=now)
    assert (w.since, w.until) == (datetime(2026, 11, 4, tzinfo=UTC), datetime(2026, 11, 5, tzinfo=UTC))
    w = period_window("weekly", now=now)
    assert (w.since, w.until) == (datetime(2026, 10, 26, tzinfo=UTC), datetime(2026, 11, 2, tzinfo=UTC))
    w = period_window("daily", since=datetime(2026, 11, 2, 6))  # naive = UTC
    assert (w.since, w.until) == (datetime(2026, 11, 2, 6, tzinfo=UTC), datetime(2026, 11, 3, 6, tzinfo=UTC))
    assert period_window("weekly", until=D0).since == D0 - 7 * DAY
    assert period_window("custom", since=D0, until=D0 + 2 * DAY).shifted(1).since == D0 - 2 * DAY


def test_monthly_periods_are_calendar_months():
    """`--period monthly` is the previous calendar month in UTC, and its history the calendar months before it,
    each of its own length (a custom month moved back by its own 31 days began on Aug 31)."""
    w = period_window("monthly", now=datetime(2026, 11, 15, 13, 30, tzinfo=UTC))
    assert (w.since, w.until) == (datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC))
    assert w.label() == "monthly October 2026 (2026-10-01 00:00 to 2026-11-01 00:00 UTC)"
    assert w.shifted(1).since == datetime(2026, 9, 1, tzinfo=UTC) and w.shifted(1).month_text() == "September 2026"
    assert period_window("monthly", since=datetime(2026, 10, 1)) == w  # a 1st anchors its month
    assert period_window("monthly", now=datetime(2026, 1, 1, tzinfo=UTC)).since == datetime(2025, 12, 1, tzinfo=UTC)
    april = period_window("monthly", until=datetime(2026, 4, 1, tzinfo=UTC))  # March, then Feb and Jan before it
    months = [april.shifted(n) for n in range(3)]
    assert [(m.since.month, m.length.days) for m in months] == [(3, 31), (2, 28), (1, 31)]
    assert [m.until for m in months[1:]] == [m.since for m in months[:-1]]  # no gap, no overlap
    assert period_window("monthly", until=datetime(2024, 3, 1)).length.days == 29  # a leap year's February
    # daily / weekly / custom move by their own length, as before
    assert period_window("custom", since=datetime(2026, 10, 1), until=datetime(2026, 11, 1)).shifted(1).since == \
        datetime(2026, 8, 31, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"period": "monthly", "since": datetime(2026, 10, 15)}, "--since of --period monthly must be the first"),
        ({"period": "monthly", "until": datetime(2026, 11, 1, 0, 30)}, "--until of --period monthly must be"),
        ({"period": "monthly", "since": datetime(2026, 10, 1), "until": datetime(2026, 11, 1)}, "not both"),
        ({"period": "hourly"}, "--period must be one of daily, weekly, monthly, custom"),
        ({"period": "custom", "since": D0}, "--period custom needs both --since and --until"),
        ({"period": "custom", "since": D0, "until": D0}, "must be before --until"),
        ({"period": "daily", "since": D0, "until": D0 + DAY}, "not both"),
    ],
)
def test_period_window_rejects(kwargs, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        period_window(**kwargs)


def test_band_check():
    assert band_check("x", 1.0, [1.0, None]).status == "not enough history"
    assert "1 of the previous 2 periods" in band_check("x", 1.0, [1.0, None]).note
    steady = [1.0, 1.1, 0.9, 1.0]
    assert band_check("x", 1.05, steady).status == "within band"
    b = band_check("x", 2.0, steady)
    assert b.status == "anomaly" and b.high == pytest.approx(1.0 + 3 * 0.08164965809277261)
    assert band_check("x", 1.0, [1.0, 1.0, 1.0]).status == "within band"  # constant history, same value
    assert band_check("x", 1.01, [1.0, 1.0, 1.0]).status == "anomaly"
    assert band_check("x", None, steady).status == "no value this period"


# ---- the report -----------------------------------------------------------------------------------------


def test_report_figures_equal_cost_command(store, tmp_path, capsys):
    url, engine = store
    add_day(engine, D0 - DAY, spec_e2e_ms=700)  # another day: the period filter must leave it out
    assert main(["cost", "--db", url, "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    since, until = (D0 - DAY).isoformat(), (D0 + DAY).isoformat()
    assert main(_report(url, tmp_path / "out", "--period", "custom", "--since", since, "--until", until)) == 0
    summary = _only_report(engine).summary
    for mode in whole["modes"]:
        got = summary["modes"][mode["mode"]]
        for key in ("hardware_usd_per_1m", "energy_usd_per_1m", "total_usd_per_1m", "energy_estimated"):
            assert got[key] == mode[key], (mode["mode"], key)
        assert got["output_tokens"] == mode["output_tokens"]
    # one day of the two: the same as the shared query for that window, and different from the whole store
    assert main(_report(url, tmp_path / "out", "--period", "daily", "--since", D0.isoformat())) == 0
    with Session(engine) as s:
        day = s.scalars(select(Report).where(Report.period == "daily")).one().summary
    _, mode_costs = costs(engine, Filters(since=D0, until=D0 + DAY))
    assert {m.mode: m.cost.total_usd_per_1m for m in mode_costs} == {
        k: v["total_usd_per_1m"] for k, v in day["modes"].items()
    }
    assert day["modes"]["spec"]["total_usd_per_1m"] != summary["modes"]["spec"]["total_usd_per_1m"]
    assert day["output_tokens"] == 132 and day["requests"] == 4


def test_report_files_record_and_offline_html(store, tmp_path, capsys):
    url, engine = store
    assert main(_report(url, tmp_path / "out", "--period", "daily", "--since", "2026-11-02", "--sla-ms", "40")) == 0
    out = capsys.readouterr().out
    rec = _only_report(engine)
    assert rec.period == "daily" and rec.delivery_status == "not requested" and rec.job_id is None
    assert f"report #{rec.id}" in out and rec.html_path in out
    page = open(rec.html_path, encoding="utf-8").read()
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.I)  # plotly.js is inline, nothing fetched
    assert page.count("<script") >= 2 and "Plotly.newPlot" in page
    assert "Cost per 1M tokens" in page and "go/no-go line 0.65" in page and "SLA 40 ms" in page
    assert "(estimated)" in page  # the power source was an estimate
    assert "Projected annual savings" in page and "peak-to-average factor 1" in page
    assert "not enough history" in page.lower()  # no earlier days in the store
    names = sorted(p.name for p in (tmp_path / "out").glob("report-*/*.csv"))
    assert names == sorted(f"{n}.csv" for n in (
        "modes", "acceptance_by_domain", "speedups", "runs_cost", "change", "anomalies", "projection",
        "nodes_by_sla"))  # fmt: skip
    assert rec.summary["csv_files"] and all(p.endswith(".csv") for p in rec.summary["csv_files"])
    with open(f"{rec.csv_dir}/modes.csv", encoding="utf-8", newline="") as fh:
        modes = {r["mode"]: r for r in csv.DictReader(fh)}
    assert modes["ar"]["acceptance rate"] == ""  # AR has no acceptance: empty cell, never 0
    assert float(modes["spec"]["p95 TPOT (ms)"]) == pytest.approx(12.5)
    assert modes["spec"]["meets SLA"] == "True" and modes["spec"]["energy estimated"] == "True"
    domains = {d["domain"]: d for d in rec.summary["acceptance_by_domain"]}
    assert domains["code"]["acceptance_rate"] == pytest.approx(24 / 32) and domains["code"]["meets_go_line"]
    assert domains["chat"]["acceptance_rate"] == pytest.approx(20 / 48) and not domains["chat"]["meets_go_line"]
    assert {d["go_line_judges"] for d in domains.values()} == {"acceptance rate"}  # no steps recorded here
    assert rec.summary["speedups"][0]["speedup"] == pytest.approx(44.0 / (66 / 1.9))
    assert rec.summary["projection"]["assumptions"]["p95_tpot_sla_ms"] == 40
    # the projection at every SLA where it can change: spec (p95 12.5 ms) meets SLAs AR does not
    with open(f"{rec.csv_dir}/nodes_by_sla.csv", encoding="utf-8", newline="") as fh:
        slas = list(csv.DictReader(fh))
    assert float(slas[0]["p95 TPOT SLA (ms)"]) == pytest.approx(12.5) and slas[0]["nodes AR"] == ""
    assert slas[0]["nodes spec"] != "" and "where the SLA matters" in page
    assert 'id="chart-sla"' in page and "Nodes needed by SLA" in page


def test_report_csv_cells_are_formula_safe(sqlite_url, tmp_path):
    engine = open_store(sqlite_url)
    add_day(engine, D0, workload="=HYPERLINK(1)")
    assert main(_report(sqlite_url, tmp_path, "--period", "daily", "--since", "2026-11-02")) == 0
    text = open(f"{_only_report(engine).csv_dir}/runs_cost.csv", encoding="utf-8").read()
    assert "'=HYPERLINK(1)" in text and ",=HYPERLINK" not in text


def test_anomaly_flagged_against_previous_days(store, tmp_path):
    url, engine = store  # D0: spec e2e 500 ms
    for n, e2e in enumerate((1500, 1520, 1480, 1510), start=1):
        add_day(engine, D0 - n * DAY, spec_e2e_ms=e2e)
    assert main(_report(url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--history", "4")) == 0
    bands = {a["metric"]: a for a in _only_report(engine).summary["anomalies"]}
    assert bands["spec cost per 1M tokens (USD)"]["status"] == "anomaly"  # much cheaper than its band
    assert bands["AR cost per 1M tokens (USD)"]["status"] == "within band"  # AR is the same every day
    assert bands["spec acceptance rate"]["history_periods"] == 4
    change = {c["figure"]: c for c in _only_report(engine).summary["change"]}
    assert change["output tokens"]["change"] == 0 and change["spec cost per 1M tokens (USD)"]["change"] < 0
    assert change["spec cost per 1M tokens (USD)"]["compared"] == "total"  # energy in every period
    assert bands["spec cost per 1M tokens (USD)"]["compared"] == "total"


def test_costs_compared_on_one_energy_basis(store, tmp_path):
    """The previous days had no energy figures, this one has estimated energy: its total against their
    hardware-only totals would count the energy as a rise in cost. The change, the bands and the chart
    compare the hardware parts, and say so."""
    url, engine = store  # D0: estimated energy; the four days before: none
    for n in range(1, 5):
        add_day(engine, D0 - n * DAY, energy=False)
    assert main(_report(url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--history", "4")) == 0
    rec = _only_report(engine)
    _, now = costs(engine, Filters(since=D0, until=D0 + DAY))
    _, before = costs(engine, Filters(since=D0 - DAY, until=D0))
    now, before = {m.mode: m.cost for m in now}, {m.mode: m.cost for m in before}
    assert now["spec"].energy_included and not before["spec"].energy_included
    assert now["spec"].total_usd_per_1m > now["spec"].hardware_usd_per_1m
    change = {c["figure"]: c for c in rec.summary["change"]}
    for mode, figure in (("spec", "spec cost per 1M tokens (USD)"), ("ar", "AR cost per 1M tokens (USD)")):
        row = change[figure]
        assert row["this_period"] == pytest.approx(now[mode].hardware_usd_per_1m)
        assert row["previous_period"] == pytest.approx(before[mode].hardware_usd_per_1m)
        assert row["change"] == pytest.approx(0)  # the same runs each day: the hardware part did not move
        assert row["compared"] == "hardware part only: energy included in this period only"
    band = {b["metric"]: b for b in rec.summary["anomalies"]}["spec cost per 1M tokens (USD)"]
    assert band["value"] == pytest.approx(now["spec"].hardware_usd_per_1m) and band["status"] == "within band"
    assert band["note"].startswith("hardware part only: energy included in 1 of the 5 periods with a cost")
    with open(f"{rec.csv_dir}/change.csv", encoding="utf-8", newline="") as fh:
        rows = {r["figure"]: r for r in csv.DictReader(fh)}
    assert rows["spec cost per 1M tokens (USD)"]["compared"].startswith("hardware part only")
    page = open(rec.html_path, encoding="utf-8").read()
    assert "spec (hardware part)" in page and "hardware part only: energy included in this period only" in page


def test_j_per_token_metered_before_and_estimated_now_is_not_compared(store, tmp_path):
    """The change table set an estimated J/token against a metered one (spec J/token 15.24 vs 1.58, +867%): the
    estimate's error shown as a change. Both values stand, the change is blank and says why, as for costs."""
    url, engine = store  # D0: estimated power; the day before: metered (NVML)
    add_day(engine, D0 - DAY, power_source="nvml")
    assert main(_report(url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--history", "1")) == 0
    rec = _only_report(engine)
    change = {c["figure"]: c for c in rec.summary["change"]}
    for figure in ("spec J/token", "AR J/token"):
        row = change[figure]
        assert row["this_period"] is not None and row["previous_period"] is not None
        assert row["change"] is None and row["change_pct"] is None
        assert row["compared"] == "not compared: energy estimated in this period, measured in the previous one"
        assert row["estimated"] == "this period"
    with open(f"{rec.csv_dir}/change.csv", encoding="utf-8", newline="") as fh:
        rows = {r["figure"]: r for r in csv.DictReader(fh)}
    assert rows["spec J/token"]["change"] == "" and rows["spec J/token"]["compared"].startswith("not compared")
    assert "not compared: energy estimated in this period, measured in the previous one" in open(
        rec.html_path, encoding="utf-8").read()


def test_j_per_token_on_the_same_kind_of_source_is_compared(store, tmp_path):
    url, engine = store  # D0 and the day before: estimated power, the same runs
    add_day(engine, D0 - DAY)
    assert main(_report(url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--history", "1")) == 0
    row = {c["figure"]: c for c in _only_report(engine).summary["change"]}["spec J/token"]
    assert row["change"] == pytest.approx(0) and row["compared"] is None and row["estimated"]


def test_empty_period_is_a_report_saying_no_traffic(store, tmp_path, capsys):
    url, engine = store
    assert main(_report(url, tmp_path, "--period", "daily", "--since", "2026-10-01")) == 0
    assert "no traffic in this period" in capsys.readouterr().out
    rec = _only_report(engine)
    assert rec.summary["traffic"] is False and rec.summary["projection"] is None
    assert rec.summary["modes"]["spec"]["total_usd_per_1m"] is None  # missing, never 0
    page = open(rec.html_path, encoding="utf-8").read()
    assert "No traffic in this period" in page and "Plotly.newPlot" not in page
    # every check has "no value this period": no green all-clear
    assert {b["status"] for b in rec.summary["anomalies"]} == {"no value this period"}
    assert "No figure outside its band" not in page and "class='ok'" not in page
    assert "Nothing to check: no traffic in this period." in page


def test_a_read_only_store_leaves_no_empty_out_folder(db_url, read_only_url, tmp_path, capsys):
    """A read-only store opens (its runs are read) and refuses only the report's record, after --out was made:
    the folders made for it were left behind, empty. They go again; a folder that was there stays."""
    engine = open_store(db_url)
    add_day(engine, D0)
    engine.dispose()
    period = ["--period", "custom", "--since", "2026-11-01", "--until", "2026-11-08"]
    (tmp_path / "kept").mkdir()
    for out in (tmp_path / "rep2" / "a" / "b", tmp_path / "kept" / "a"):
        assert main(_report(read_only_url(db_url), out, *period)) == 2
        err = capsys.readouterr().err
        assert "readonly database" in err or "read-only transaction" in err, err
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("store.db")) == ["kept"]
    assert list((tmp_path / "kept").iterdir()) == []
    assert main(_report(db_url, tmp_path / "rep2" / "a" / "b", *period)) == 0  # writable: written there
    assert len(list((tmp_path / "rep2" / "a" / "b").iterdir())) == 1


def test_empty_store_is_exit_2_with_the_fill_command(empty_store, tmp_path, capsys):
    assert main(_report(empty_store, tmp_path / "r", "--period", "daily")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no runs" in err and "specfinops bench" in err
    assert not (tmp_path / "r").exists()  # no empty report folder is left behind


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--period", "yearly"], "--period must be one of daily, weekly, monthly, custom"),
        (["--period", "monthly", "--since", "2026-10-15"],
         "--since of --period monthly must be the first of a month at 00:00 UTC (e.g. --since 2026-10-01), got "
         "2026-10-15 00:00:00 UTC"),
        (["--period", "monthly", "--until", "2026-11-01T06:00"], "--until of --period monthly must be the first"),
        (["--period", "custom", "--since", "2026-11-01"], "--period custom needs both --since and --until"),
        (["--period", "custom", "--since", "soon", "--until", "2026-11-01"], "--since must be an ISO date"),
        (["--period", "daily", "--sla-ms", "0"], "--sla-ms must be > 0"),
        (["--period", "daily", "--history", "2.5"], "--history"),
        (["--period", "daily", "--p95-tpot-sla-ms", "0"], "--sla-ms must be > 0"),  # project's name of it
        # the prices of `project`, checked as it checks them (a --gpu typo is named, not 'cost n/a' in the report)
        (["--period", "daily", "--gpu", "H1000"], "--gpu: unknown price name 'H1000'; known: A100-80GB"),
        (["--period", "daily", "--gpus-per-node", "8"], "--gpus-per-node needs --gpu NAME"),
        (["--period", "daily", "--gpu", "H100", "--gpus-per-node", "65"], "--gpus-per-node must be a whole number"),
        (["--period", "daily", "--gpu", "cpu-2core", "--gpus-per-node", "2"], "'cpu-2core' is a node price"),
        (["--period", "daily", "--gpu", "H100", "--node-hourly-usd", "44"], "either --gpu NAME or --node-hourly-usd"),
        (["--period", "daily", "--pue", "0.9"], "--pue must be >= 1"),
    ],
)
def test_bad_input_is_one_line_exit_2(store, tmp_path, capsys, extra, needle):
    url, engine = store
    assert main(_report(url, tmp_path, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err
    with Session(engine) as s:
        assert s.scalars(select(Report)).first() is None


PROJECT_TRAFFIC = ["--daily-tokens", "5e8", "--peak-factor", "2"]


@pytest.mark.parametrize("prices", [["--gpu", "H100", "--gpus-per-node", "8"],
                                    ["--node-hourly-usd", "44", "--usd-per-kwh", "0.2", "--pue", "1.5"]])
def test_a_report_priced_at_the_users_gpu_or_node_shows_what_project_and_cost_give(store, tmp_path, capsys, prices):
    """`report` took no --gpu / --gpus-per-node / --node-hourly-usd: its projection could not be the one
    `project` gives at the user's own hardware, short of editing the global catalog. Now it takes project's
    prices, and says in its page, its summary and its output what it priced at."""
    url, engine = store
    assert main(["project", "--db", url, *PROJECT_TRAFFIC, "--p95-tpot-sla-ms", "50", *prices, "--json"]) == 0
    projected = json.loads(capsys.readouterr().out)
    cost_prices = [a for a in prices if a not in ("--gpus-per-node", "8")]  # `cost` prices per GPU of a run
    assert main(["cost", "--db", url, *cost_prices, "--json"]) == 0
    costed = {m["mode"]: m for m in json.loads(capsys.readouterr().out)["modes"]}
    assert main(_report(url, tmp_path, "--period", "daily", "--since", "2026-11-02", *PROJECT_TRAFFIC,
                        "--sla-ms", "50", *prices)) == 0  # fmt: skip
    given = " ".join(prices).replace(" 44 ", " 44.0 ")  # every digit of a price given, as a float reads
    assert f"  priced at: {given} (every run's cost and the projection)" in capsys.readouterr().out
    rec = _only_report(engine)
    s = rec.summary
    assert s["priced_at"] == given
    assert s["pricing"] == {"gpu": "H100" if "--gpu" in prices else None,
                            "gpus_per_node": 8 if "--gpus-per-node" in prices else 1,
                            "node_hourly_usd": 44.0 if "--node-hourly-usd" in prices else None,
                            "usd_per_kwh": 0.2 if "--usd-per-kwh" in prices else None,
                            "pue": 1.5 if "--pue" in prices else None}
    for key in ("nodes_ar", "nodes_spec", "annual_savings_usd", "cost_per_1m_tokens_ar_usd",
                "cost_per_1m_tokens_spec_usd", "capacity_tokens_per_s_ar", "capacity_tokens_per_s_spec"):
        assert s["projection"][key] == projected[key], key
    for key in ("priced_as", "node_hourly_usd", "gpus_per_node", "replicas_per_node", "usd_per_kwh", "pue"):
        assert s["projection"]["assumptions"][key] == projected["assumptions"][key], key
    for mode, figures in s["modes"].items():
        for key in ("hardware_usd_per_1m", "energy_usd_per_1m", "total_usd_per_1m"):
            assert figures[key] == costed[mode][key], (mode, key)
    page = open(rec.html_path, encoding="utf-8").read()
    assert f"Priced at <code>{given}</code>, not at the prices the runs recorded" in page
    a = projected["assumptions"]
    # a node price named once: a custom one's name holds its $/h ("custom $44/h node at $44/node-hour" said it twice)
    named = "custom $44.00/h" if "--node-hourly-usd" in prices else "H100 x8 at $55.04/h"
    assert f"priced as {named} (given: {given})" in page
    assert "/node-hour" not in page and "/h node at" not in page
    if "--gpus-per-node" in prices:
        assert a["priced_as"] == "H100 x8" and "a node of 8 GPUs holds 8 replicas" in page


def test_a_report_without_prices_says_none_were_given(store, tmp_path, capsys):
    url, engine = store
    assert main(_report(url, tmp_path, "--period", "daily", "--since", "2026-11-02")) == 0
    assert "priced at" not in capsys.readouterr().out
    s = _only_report(engine).summary
    assert s["priced_at"] is None and s["pricing"]["gpu"] is None and s["pricing"]["gpus_per_node"] == 1
    assert "id='priced-at'" not in open(_only_report(engine).html_path, encoding="utf-8").read()


def test_report_and_project_take_either_name_of_the_sla(store, tmp_path, capsys):
    """The SLA was `project --p95-tpot-sla-ms` but `report --sla-ms`: each takes both now."""
    url, engine = store
    assert main(_report(url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--p95-tpot-sla-ms", "40")) == 0
    assert _only_report(engine).summary["p95_tpot_sla_ms"] == 40
    capsys.readouterr()
    outs = []
    for name in ("--p95-tpot-sla-ms", "--sla-ms"):
        assert main(["project", "--db", url, *PROJECT_TRAFFIC, name, "40", "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0] == outs[1] and outs[0]["assumptions"]["p95_tpot_sla_ms"] == 40


def test_unwritable_out_dir_is_exit_2(store, tmp_path, capsys):
    url, _ = store
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(_report(url, blocker / "reports", "--period", "daily")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a writable directory" in err and "a-file" in err


# ---- claims and failures ---------------------------------------------------------------------------------


def test_a_job_reports_a_period_once_and_failures_leave_nothing(db_url, tmp_path, monkeypatch):
    engine = open_store(db_url)  # SQLite and PostgreSQL: the unique (job_id, since) claim holds on both
    add_day(engine, D0)
    window = period_window("daily", since=D0)
    out = tmp_path / "out"
    first = report_writer.write_report(engine, window, out, job_id="report-daily")
    assert first is not None and first.html_path.is_file()
    assert report_writer.write_report(engine, window, out, job_id="report-daily") is None
    assert report_writer.write_report(engine, window, out, job_id="other-job") is not None
    assert len(list(out.iterdir())) == 2

    def broken(*_a, **_k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(report_writer, "render_html", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        report_writer.write_report(engine, period_window("daily", since=D0 - DAY), out, job_id="report-daily")
    with Session(engine) as s:
        assert len(list(s.scalars(select(Report)))) == 2  # the failed run's claim is gone
    assert len(list(out.iterdir())) == 2  # no folder (nor temporary folder) of the failed run
    engine.dispose()


# ---- dashboard Reports page -----------------------------------------------------------------------------


# A `specfinops report` that stops inside write_report (its claim made, its temporary folder and CSV files
# written) until it is signalled.
SLOW_REPORT = """
import sys, time
from telemetry import report_writer
def slow(*_a, **_k):
    print("writing", flush=True)
    time.sleep(120)
report_writer.render_html = slow
from app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _stopped_while_writing(url: str, out, sig: int):
    import signal  # noqa: F401 - the caller's signal numbers
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.Popen([sys.executable, "-c", SLOW_REPORT, *_report(url, out, "--period", "daily",
                                                                         "--since", D0.isoformat())],
                            cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "writing", proc.communicate()
        assert any(p.name.endswith(".tmp") for p in out.iterdir())  # what a cleanup has to remove
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def _reports(engine) -> list[Report]:
    with Session(engine) as s:
        return list(s.scalars(select(Report).order_by(Report.id)))


def test_sigterm_while_writing_cleans_up_as_ctrl_c(store, tmp_path):
    import signal

    url, engine = store
    out = tmp_path / "out"
    rc, err = _stopped_while_writing(url, out, signal.SIGTERM)
    assert rc == 130 and "interrupted" in err and "Traceback" not in err, err
    # no claim left 'generating', no hidden folder, and not the --out made for the report either
    assert _reports(engine) == [] and not out.exists()


def test_a_killed_reports_claim_and_folder_are_released_by_the_next_report(store, tmp_path, caplog):
    """SIGKILL runs no cleanup: the claim stays 'generating' (the Reports page said so forever). Once older than
    any report takes to write, the next report releases it and removes its temporary folder; a young claim (a
    report maybe being written now) and scheduled claims (the scheduler's to rewrite) are left alone."""
    import signal

    url, engine = store
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    rc, _ = _stopped_while_writing(url, out, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    [killed] = _reports(engine)
    leftover = out / f".{report_writer.report_dir_name(killed.id, period_window('daily', since=D0))}.tmp"
    assert killed.delivery_status == "generating" and leftover.is_dir()
    old = datetime.now(UTC) - timedelta(seconds=report_writer.STALE_AFTER_S + 60)
    with Session(engine) as s:
        for job_id, csv_dir in ((None, ""), ("report-daily", "")):  # an older version's claim (no folder), a job's
            s.add(Report(period="daily", since=D0 - DAY, until=D0, html_path="", csv_dir=csv_dir, job_id=job_id,
                         delivery_status="generating", created_at=old))  # fmt: skip
        s.commit()
    legacy, scheduled = (r.id for r in _reports(engine)[1:])
    legacy_tmp = elsewhere / f".{report_writer.report_dir_name(legacy, period_window('daily', since=D0 - DAY))}.tmp"
    legacy_tmp.mkdir(parents=True)

    assert main(_report(url, elsewhere, "--period", "daily", "--since", D0.isoformat())) == 0  # too young: kept
    assert [r.id for r in _reports(engine) if r.delivery_status == "generating"] == [killed.id, scheduled]
    assert leftover.is_dir() and not legacy_tmp.exists()  # the legacy claim's folder looked for in --out
    assert [m for m in caplog.messages if f"report #{legacy} " in m and "was killed" in m]
    caplog.clear()

    with engine.begin() as c:
        c.execute(update(Report).where(Report.id == killed.id).values(created_at=old))
    assert main(_report(url, elsewhere, "--period", "daily", "--since", D0.isoformat())) == 0
    assert [r.id for r in _reports(engine) if r.delivery_status == "generating"] == [scheduled]
    assert not leftover.exists() and list(out.iterdir()) == []  # found where the claim recorded, not in --out
    assert [m for m in caplog.messages if f"report #{killed.id} (daily 2026-11-02" in m]


def _reports_page(url: str, monkeypatch):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("SPECFINOPS_DB_URL", url)
    monkeypatch.syspath_prepend(str(root))
    at = AppTest.from_file(str(root / "app" / "dashboard" / "main.py"), default_timeout=120)
    at = at.run().switch_page("views/reports.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_dashboard_reports_page_lists_reports_with_downloads(store, tmp_path, monkeypatch):
    url, engine = store
    page_text = lambda at: " ".join(str(e.value) for e in (*at.info, *at.code, *at.markdown))  # noqa: E731
    at = _reports_page(url, monkeypatch)
    assert "No reports yet" in page_text(at) and "specfinops report --period daily" in page_text(at)
    assert main(_report(url, tmp_path / "out", "--period", "daily", "--since", "2026-11-02")) == 0
    import streamlit

    streamlit.cache_data.clear()  # the page caches the list for a minute
    at = _reports_page(url, monkeypatch)
    assert not at.error
    [frame] = at.dataframe
    assert list(frame.value["id"]) == [_only_report(engine).id]
    row = frame.value.iloc[0]
    # the period's output tokens (add_day: two runs of two 33-token requests), not a bare checkbox; no anomaly
    # found reads "none"; written by hand, not by a job
    assert row["output tokens"] == 4 * 33 and row["anomalies"] == "none" and row["job"] == "manual"
    assert row["runs"] == "all"
    labels = [b.proto.label for b in at.get("download_button")]
    # the HTML and one CSV per table
    assert labels[0].startswith("Download report (HTML") and "modes.csv" in labels and len(labels) == 9


def test_the_no_reports_commands_write_to_the_store_in_view(tmp_path, monkeypatch):
    """Copied from the page, `report` and `scheduler` write to the store viewed (--db, quoted for the shell),
    not to the default one."""
    import shlex

    folder = tmp_path / "my stores"
    folder.mkdir()
    url = f"sqlite:///{folder / 'store.db'}"
    engine = open_store(url)
    add_day(engine, D0)
    engine.dispose()
    at = _reports_page(url, monkeypatch)
    [code] = [c.value for c in at.code]
    db = f"--db {shlex.quote(url)}"
    assert code.splitlines() == [f"specfinops report --period daily --out reports/ {db}",
                                 f'specfinops scheduler --cron "0 6 * * *" --period daily --out reports/ {db}']
    assert f"'{url}'" in code  # the space in the path quoted


def test_a_monthly_report_compares_calendar_months(sqlite_url, tmp_path, capsys):
    """October against September 1-30, not against Aug 31 -> Oct 1 (the window moved back by its own 31 days):
    Aug 31's traffic is August's; the projection's traffic per day is October's tokens over its 31 days."""
    from telemetry.delivery import email_text

    engine = open_store(sqlite_url)
    for month, day in ((8, 31), (9, 15), (10, 10), (10, 20)):
        add_day(engine, datetime(2026, month, day, tzinfo=UTC))
    try:
        assert main(_report(sqlite_url, tmp_path / "out", "--period", "monthly", "--since", "2026-10-01")) == 0
        assert "monthly October 2026 (2026-10-01 00:00 to 2026-11-01 00:00 UTC)" in capsys.readouterr().out
        r = _only_report(engine)
        s = r.summary
        assert (s["month"], s["since"], s["until"]) == ("October 2026", "2026-10-01T00:00:00+00:00",
                                                       "2026-11-01T00:00:00+00:00")
        assert s["previous_period"] == {"since": "2026-09-01T00:00:00+00:00", "until": "2026-10-01T00:00:00+00:00"}
        change = {c["figure"]: c for c in s["change"]}
        assert (change["output tokens"]["this_period"], change["output tokens"]["previous_period"]) == (8 * 33, 4 * 33)
        assert s["projection"]["assumptions"]["daily_tokens"] == pytest.approx(8 * 33 / 31)
        assert r.csv_dir.endswith(f"report-{r.id}-monthly-2026-10")
        page = open(r.html_path, encoding="utf-8").read()
        assert "previous period September 2026 (2026-09-01 00:00 to 2026-10-01 00:00 UTC)" in page
        assert email_text({**s, "html_path": r.html_path})[0] == "specfinops monthly cost report October 2026"
    finally:
        engine.dispose()


def test_the_reports_page_names_a_monthly_reports_month():
    from app.dashboard.views.reports import _pick_text, period_name

    oct1, nov1 = datetime(2026, 10, 1), datetime(2026, 11, 1)  # naive, as SQLite hands them back
    assert period_name("monthly", oct1, nov1) == "monthly October 2026"
    assert period_name("daily", D0, D0 + DAY) == "daily"
    assert _pick_text({"id": 9, "period": "monthly October 2026", "since": oct1}) == "#9 monthly October 2026"
    assert _pick_text({"id": 3, "period": "daily", "since": D0}) == "#3 daily from 2026-11-02 00:00"


def test_the_reports_page_marks_a_partial_period_by_its_times_and_as_the_report_says_it():
    """A report written before its summary held `period_complete` was never marked, though it was written
    before its period ended (created_at < until); and one written before its period began was said to cover
    "the part that had passed", where the HTML report says what was recorded for it before it began."""
    from app.dashboard.views.reports import PARTIAL_PERIOD, report_notes

    naive = D0.replace(tzinfo=None)  # as SQLite hands the row's times back
    since, until = naive, naive + DAY
    old = report_notes({}, since=since, until=until, created_at=naive + DAY / 2)  # no flag: its times tell
    assert "the part that had passed" in old[PARTIAL_PERIOD] and "before its period ended" in old[PARTIAL_PERIOD]
    assert PARTIAL_PERIOD not in report_notes({}, since=since, until=until, created_at=naive + DAY)
    early = report_notes({"period_complete": False, "generated_at": (D0 - DAY / 4).isoformat()}, since=since,
                         until=until, created_at=naive - DAY / 4)
    assert "before its period began" in early[PARTIAL_PERIOD], early
    assert "what was recorded for it before it began" in early[PARTIAL_PERIOD], early
    assert "the part that had passed" not in early[PARTIAL_PERIOD], early
    assert PARTIAL_PERIOD not in report_notes({"period_complete": True}, since=since, until=until,
                                              created_at=naive + DAY / 2)  # the flag, where held, decides


# ---- the projection's figures: named for what they are, each once ---------------------------------------


def test_projection_cost_is_named_fleet_cost_and_each_figure_shows_once(store, tmp_path):
    """The projection's cost per 1M tokens (fleet sized for peak, whole nodes) is not the measured one of the
    tiles and modes.csv: it says so wherever it is shown; traffic figures are not repeated under JSON names."""
    url, engine = store
    assert main(_report(url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--sla-ms", "40",
                        "--daily-tokens", "5e8", "--peak-factor", "2")) == 0  # fmt: skip
    rec = _only_report(engine)
    with open(f"{rec.csv_dir}/projection.csv", encoding="utf-8", newline="") as fh:
        rows = [(r["figure"], r["value"]) for r in csv.DictReader(fh)]
    names = [n for n, _ in rows]
    assert len(names) == len(set(names))
    fleet = "fleet cost per 1M served tokens (sized for peak, whole nodes)"
    assert f"AR {fleet} (USD)" in names and f"spec {fleet} (USD)" in names
    assert not {"cost_per_1m_tokens_ar_usd", "daily_tokens", "peak_factor", "p95_tpot_sla_ms"} & set(names)
    values = dict(rows)
    assert float(values["daily output tokens"]) == 5e8 and float(values["peak-to-average factor"]) == 2
    assert float(values["p95 TPOT SLA (ms)"]) == 40
    assert sum(v == "500000000.0" or v == "5e+08" for _, v in rows) == 1  # the daily tokens once
    assert "cost_per_1m_tokens_basis" in rec.summary["projection"]["assumptions"]  # JSON keys stay, one added
    page = open(rec.html_path, encoding="utf-8").read()
    assert "Cost per 1M tokens, AR (measured runs)" in page and fleet in page


def test_project_cli_names_its_cost_the_fleet_cost(store, capsys):
    url, _ = store
    args = ["project", "--db", url, "--daily-tokens", "5e8", "--peak-factor", "2", "--p95-tpot-sla-ms", "50",
            "--gpu", "cpu-2core"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "fleet cost per 1M served tokens (sized for peak, whole nodes): AR $" in out
    assert not any(line.startswith("cost per 1M tokens") for line in out.splitlines())
    with pytest.raises(SystemExit):
        main(["project", "--help"])
    assert "fleet cost per 1M served tokens" in capsys.readouterr().out


def test_html_tables_show_money_and_counts_in_digits_and_speedup_first(store, tmp_path):
    """No 9.329e+04 or 5e+08 in the page's tables: money as $93,290, counts with thousands separators (the CSV
    files keep plain numbers); the speedup table leads with its figures, not the long model paths."""
    url, engine = store
    assert main(_report(url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--sla-ms", "50",
                        "--daily-tokens", "5e8", "--peak-factor", "2")) == 0  # fmt: skip
    rec = _only_report(engine)
    page = open(rec.html_path, encoding="utf-8").read()
    tables = re.sub(r"<script.*?</script>", "", page[page.index("<h2>Tables</h2>"):], flags=re.S)
    assert not re.search(r"\de[+-]\d", tables)
    nodes_ar, nodes_spec = rec.summary["projection"]["nodes_ar"], rec.summary["projection"]["nodes_spec"]
    savings = rec.summary["projection"]["annual_savings_usd"]
    assert savings > 10_000 and f"<td class=\"n\">${savings:,.0f}</td>" in tables
    assert "<td class=\"n\">500,000,000</td>" in tables and f"<td class=\"n\">{nodes_ar:,d}</td>" in tables
    assert nodes_spec < nodes_ar
    with open(f"{rec.csv_dir}/projection.csv", encoding="utf-8", newline="") as fh:
        values = {r["figure"]: r["value"] for r in csv.DictReader(fh)}
    assert float(values["annual savings (USD)"]) == pytest.approx(savings) and "$" not in values["annual savings (USD)"]
    speed = tables[tables.index("<h3>Speedup"):]
    heads = re.findall(r"<th>([^<]*)</th>", speed[:speed.index("</tr>")])
    assert heads[:3] == ["speedup", "spec tokens/s", "AR tokens/s"]
    with open(f"{rec.csv_dir}/speedups.csv", encoding="utf-8", newline="") as fh:
        row = next(csv.DictReader(fh))
    assert float(row["speedup"]) == pytest.approx(44.0 / (66 / 1.9)) and row["workload"] == "code"


def test_tpot_card_and_sla_line_stay_on_their_side_of_the_sla(sqlite_url, tmp_path, capsys):
    """Spec's p95 TPOT of 10.02 ms misses a 10 ms SLA: the card read "misses (best 10.0 ms)" and projection.csv
    "speculation needs fewer nodes ... at p95 TPOT SLAs of 10.0 ms and looser", both contradicting it."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", started_at=D0.replace(hour=9),
                 requests=[Req(33, ttft_ms=100, e2e_ms=100 + 32 * 40.0, start_s=i * 0.1) for i in range(2)])
        make_run(s, "spec", started_at=D0.replace(hour=9),
                 requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=100 + 32 * 10.02, start_s=i * 0.1)
                           for i in range(2)])
        s.commit()
    assert main(_report(sqlite_url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--sla-ms", "10",
                        "--daily-tokens", "5e8", "--peak-factor", "2")) == 0
    capsys.readouterr()
    rec = _only_report(engine)
    page = open(rec.html_path, encoding="utf-8").read()
    m = re.search(r'<div class="k">p95 TPOT vs SLA 10 ms</div><div class="v">([^<]*)</div>', page)
    assert m.group(1) == "spec misses (best 10.02 ms) / AR misses (best 40.0 ms)"
    with open(f"{rec.csv_dir}/projection.csv", encoding="utf-8", newline="") as fh:
        values = {r["figure"]: r["value"] for r in csv.DictReader(fh)}
    assert values["where the SLA matters"].startswith(
        "speculation needs fewer nodes than AR at p95 TPOT SLAs of 10.1 "), values["where the SLA matters"]


def test_a_period_with_one_mode_only_compares_nothing(sqlite_url, tmp_path, capsys):
    """A period of spec runs only read "speculation needs fewer nodes than AR at p95 TPOT SLAs of ... and looser"
    (no AR run to need any), its Speedup tile '—x' and its speedups.csv 'runs ' for the AR runs it has none of."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "spec", started_at=D0.replace(hour=9), requests=[spec_req(33, 4, 24, ttft_ms=100, e2e_ms=400)])
        s.commit()
    assert main(_report(sqlite_url, tmp_path, "--period", "daily", "--since", "2026-11-02")) == 0
    capsys.readouterr()
    rec = _only_report(engine)
    with open(f"{rec.csv_dir}/projection.csv", encoding="utf-8", newline="") as fh:
        values = {r["figure"]: r["value"] for r in csv.DictReader(fh)}
    assert values["where the SLA matters"] == "not compared: no AR configuration with a measured p95 TPOT"
    with open(f"{rec.csv_dir}/speedups.csv", encoding="utf-8", newline="") as fh:
        row = next(csv.DictReader(fh))
    assert (row["speedup"], row["spec runs"], row["AR runs"]) == ("", "run 1", "")
    page = open(rec.html_path, encoding="utf-8").read()
    assert "—x" not in page and "— ms" not in page and "fewer nodes than AR" not in page


def test_j_per_token_keeps_its_significant_trailing_zeros_in_the_report_and_the_dashboard(sqlite_url, tmp_path, capsys):
    """The J/token card read "spec 3.12 J / AR 1.5 J" ({j:.3g}), the dashboard "1.500" (.3f): both now write three
    significant digits with their trailing zeros, through one formatter."""
    from app.dashboard.views import energy, overview, runs
    from telemetry.labels import j_per_token_text

    assert [j_per_token_text(v) for v in (1.5, 3.12, 15.24, 0.0123, 9.996, 1234.0, 0.0, None)] == [
        "1.50", "3.12", "15.2", "0.0123", "10.0", "1,230", "0.00", "—"]
    assert all(m.j_per_token_text is j_per_token_text for m in (energy, overview, runs))
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", started_at=D0.replace(hour=9), requests=[Req(33, ttft_ms=100, e2e_ms=1380, energy_j=49.5)])
        make_run(s, "spec", started_at=D0.replace(hour=9),
                 requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=420, energy_j=33 * 3.12)])
        s.commit()
    assert main(_report(sqlite_url, tmp_path, "--period", "daily", "--since", "2026-11-02")) == 0
    capsys.readouterr()
    page = open(_only_report(engine).html_path, encoding="utf-8").read()
    m = re.search(r'<div class="k">J/token</div><div class="v">([^<]*)</div>', page)
    assert m.group(1).startswith("spec 3.12 J") and " / AR 1.50 J" in m.group(1), m.group(1)


def test_html_number_formats():
    from telemetry.report_html import number, usd

    assert (usd(93290.4), usd(-17492.4), usd(0.5948), usd(None)) == ("$93,290", "-$17,492", "$0.5948", "—")
    assert (usd(12.5), usd(8.546), usd(108.3), usd(0.0)) == ("$12.50", "$8.55", "$108.30", "$0")
    assert (usd(999.999), usd(0.99996)) == ("$1,000", "$1.00")
    assert (number(500_000_000.0), number(12345), number(38.864), number(2.0)) == (
        "500,000,000", "12,345", "38.86", "2")


def test_money_reads_the_same_in_the_report_the_cost_command_and_the_dashboard():
    """The report wrote $12.5 where `cost` and the dashboard wrote $12.50 (each had its own formatter)."""
    from app.commands.cost import _usd
    from app.dashboard.common import usd_amount
    from telemetry.report_html import usd

    for value in (162240.4, 1000.0, 999.999, 12.5, 1.0, 0.99996, 0.3412, 0.0006, -17492.4, -3.5):
        assert usd(value) == _usd(value) == usd_amount(value), value


def test_money_below_a_dollar_reads_as_a_number_in_cents_or_four_digits():
    """usd_amount wrote $4e-05 for a cost per token and $0.5 beside $12.50: below $1 it is four significant digits
    written out, never fewer than two decimals, in every place that shows money."""
    from app.commands.cost import _usd
    from app.dashboard.common import usd_amount
    from telemetry.report_html import usd

    cases = {4e-05: "$0.00004", 4.1234e-05: "$0.00004123", 1e-12: "$0.000000000001", 0.5: "$0.50", 0.1: "$0.10",
             0.05: "$0.05", 0.123456: "$0.1235", 0.999949: "$0.9999", -0.5: "-$0.50", -4e-05: "-$0.00004"}
    for value, shown in cases.items():
        assert usd(value) == _usd(value) == usd_amount(value) == shown, value


def test_report_writes_alpha_beside_the_go_line_to_three_decimals():
    """An alpha of 0.646 read "0.65" on the report's chart, beside the 0.65 line it does not meet (NO-GO): three
    decimals, as calibrate prints alpha and the dashboard's hover, and more where three would cross the line."""
    from types import SimpleNamespace as NS

    from telemetry.report_html import acceptance_chart

    domains = [NS(domain="chat", acceptance_rate=0.5, alpha=0.646), NS(domain="code", acceptance_rate=0.6, alpha=0.7),
               NS(domain="math", acceptance_rate=0.6, alpha=0.64999),
               NS(domain="misc", acceptance_rate=None, alpha=None)]
    (diamonds,) = [t for t in acceptance_chart(NS(domains=domains)).data if t.type == "scatter" and t.text]
    assert list(diamonds.text) == ["0.646", "0.700", "0.64999", ""]
    from telemetry.report import alpha_text

    assert [alpha_text(d.alpha) for d in domains] == ["0.646", "0.700", "0.64999", None]  # the table's column


def _card_sub(page: str, key: str) -> str:
    m = re.search(r'<div class="k">' + re.escape(key) + r'</div><div class="v">[^<]*</div><div class="s">([^<]*)</div>',
                  page)
    assert m, key
    return m.group(1)


def test_savings_tile_says_when_the_traffic_is_the_periods_own(store, tmp_path):
    """Without --daily-tokens the projection's traffic is the period's measured tokens (132 a day here): both
    modes fit on one node and the savings read $0 beside a speedup; the tile says why."""
    url, engine = store
    assert main(_report(url, tmp_path / "a", "--period", "daily", "--since", "2026-11-02")) == 0
    page = open(_only_report(engine).html_path, encoding="utf-8").read()
    assert _card_sub(page, "Projected annual savings") == (
        "at 132 output tokens/day, the period&#x27;s own traffic, both modes fit on 1 node; pass --daily-tokens "
        "for your traffic")
    assert main(_report(url, tmp_path / "b", "--period", "daily", "--since", "2026-11-02", "--daily-tokens", "5e8",
                        "--peak-factor", "2", "--sla-ms", "50")) == 0  # fmt: skip
    with Session(engine) as s:
        rec = s.scalars(select(Report).order_by(Report.id.desc())).first()
    page = open(rec.html_path, encoding="utf-8").read()
    assert _card_sub(page, "Projected annual savings") == "nodes AR - nodes spec, x node $/h x 8,760 h"


def test_html_view_of_the_cost_per_run_table(store, tmp_path):
    """The page's per-run table: figures first under readable headers, times to the second, the device and
    the model directory shortened and last; runs_cost.csv keeps its columns and full values."""
    from telemetry.export import COST_HEADER
    from telemetry.report import short_device, short_model, to_the_second

    assert short_model("/root/.cache/specfinops/models/smollm2-135m-instruct/") == "smollm2-135m-instruct"
    assert short_model("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"
    # a Hugging Face cache snapshot by its hub id, not its commit hash
    hub = "/root/.cache/huggingface/hub/models--HuggingFaceTB--SmolLM2-135M/snapshots/9f8e7d6c5b4a3928"
    assert short_model(hub) == short_model(hub + "/") == "HuggingFaceTB/SmolLM2-135M"
    assert short_model("/hf/models--gpt2/snapshots/9f8e7d6c") == "gpt2"
    assert short_model("/data/snapshots/9f8e7d6c") == "9f8e7d6c"  # a folder named snapshots elsewhere: as it is
    assert short_device("cpu: Intel(R) Xeon(R) Processor (2 threads)") == "cpu: Intel Xeon (2 threads)"
    assert short_device("NVIDIA H200") == "NVIDIA H200"
    assert to_the_second(datetime(2026, 12, 5, 1, 6, 52, 256879)) == "2026-12-05 01:06:52"
    url, engine = store
    assert main(_report(url, tmp_path, "--period", "daily", "--since", "2026-11-02")) == 0
    rec = _only_report(engine)
    page = open(rec.html_path, encoding="utf-8").read()
    runs = page[page.index("<h3>Cost per run</h3>"):]
    runs = runs[:runs.index("</table>")]
    heads = re.findall(r"<th>([^<]*)</th>", runs)
    assert heads[:7] == ["run", "mode", "output tokens", "tokens/s", "hardware $/1M", "energy $/1M", "total $/1M"]
    assert heads[-2:] == ["device", "target"] and not [h for h in heads if "_" in h]
    assert "2026-11-02 09:00:00<" in runs and "09:00:00." not in runs
    with open(f"{rec.csv_dir}/runs_cost.csv", encoding="utf-8", newline="") as fh:
        assert next(csv.reader(fh)) == COST_HEADER
    assert "@media print { .scroll { overflow: visible } }" in page


def test_report_times_are_shown_in_utc_whatever_the_session_timezone():
    """'started (UTC)' of the report: a PostgreSQL session west of UTC hands back 19:36-08:00 for a run
    that started at 03:36 UTC the next day; the report shows the UTC time, as on SQLite."""
    from datetime import datetime, timedelta, timezone

    from telemetry.report import to_the_second

    pacific = timezone(timedelta(hours=-8))
    aware = datetime(2026, 12, 4, 19, 36, 1, 630000, tzinfo=pacific)
    assert to_the_second(aware) == "2026-12-05 03:36:01"
    assert to_the_second("2026-12-04T19:36:01.63-08:00") == "2026-12-05 03:36:01"
    assert to_the_second("2026-12-05T03:36:01.63+00:00") == "2026-12-05 03:36:01"
    assert to_the_second(datetime(2026, 12, 5, 3, 36, 1, 5)) == "2026-12-05 03:36:01"  # naive: stored as UTC
    assert to_the_second("not a time") == "not a time"


def test_report_names_the_runs_that_did_not_complete(sqlite_url, tmp_path):
    """A run left 'running' by a killed bench or 'cancelled' by Ctrl-C: the report counts its finished
    requests and says so, in its JSON and on its page."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session
    from synthetic import BASE_TIME, Req, make_run

    from app.cli import main
    from telemetry.db import Report
    from telemetry.store import open_store

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", started_at=BASE_TIME, requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        make_run(s, "ar", status="running", started_at=BASE_TIME, requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        s.commit()
    assert main(["report", "--db", sqlite_url, "--out", str(tmp_path), "--period", "daily",
                 "--since", BASE_TIME.strftime("%Y-%m-%d")]) == 0
    with Session(engine) as s:
        rec = list(s.scalars(select(Report).order_by(Report.id)))[-1]
    engine.dispose()
    assert rec.summary["incomplete_runs"] == [{"run_id": 2, "mode": "ar", "status": "running"}]
    page = open(rec.html_path, encoding="utf-8").read()
    assert "Not every run completed: run 2 running (in progress, or its process was killed)" in page


def test_tpot_card_judges_the_configurations_the_projection_sizes(sqlite_url, tmp_path):
    """The p95 TPOT card judged the p95 of all of a mode's requests pooled ('misses') beside savings that size
    both modes on configurations that meet the SLA. It now shows the p95 of the configuration the projection
    sizes each mode on (and says so, with the pooled p95 beside it); the summary carries both."""
    engine = open_store(sqlite_url)
    start = D0.replace(hour=9)

    def reqs(mode: str, tpot_ms: float, n: int) -> list:
        e2e = 100 + 32 * tpot_ms
        return [Req(33, ttft_ms=100, e2e_ms=e2e, start_s=i * 0.1) if mode == "ar"
                else spec_req(33, 4, 20, ttft_ms=100, e2e_ms=e2e, start_s=i * 0.1) for i in range(n)]

    with Session(engine) as s:  # one stream meets a 50 ms SLA; four streams miss it, with more requests
        make_run(s, "ar", started_at=start, concurrency=1, requests=reqs("ar", 40, 2))
        make_run(s, "spec", started_at=start, concurrency=1, requests=reqs("spec", 10, 2))
        make_run(s, "ar", started_at=start, concurrency=4, requests=reqs("ar", 90, 8))
        make_run(s, "spec", started_at=start, concurrency=4, requests=reqs("spec", 80, 8))
        s.commit()
    assert main(_report(sqlite_url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--sla-ms", "50",
                        "--daily-tokens", "5e8", "--peak-factor", "2")) == 0
    rec = _only_report(engine)
    modes = rec.summary["modes"]
    assert modes["spec"]["meets_sla"] is False and modes["ar"]["meets_sla"] is False  # pooled: 80 and 90 ms
    assert modes["spec"]["projection_meets_sla"] is True and modes["spec"]["projection_runs"] == [2]
    assert modes["spec"]["projection_tpot_p95_ms"] == pytest.approx(10.0)
    assert modes["ar"]["projection_tpot_p95_ms"] == pytest.approx(40.0) and modes["ar"]["projection_runs"] == [1]
    assert rec.summary["projection"]["annual_savings_usd"] is not None
    page = open(rec.html_path, encoding="utf-8").read()
    m = re.search(r'<div class="k">p95 TPOT vs SLA 50 ms</div><div class="v">([^<]*)</div>', page)
    assert m.group(1) == "spec 10.0 ms (meets) / AR 40.0 ms (meets)"
    sub = _card_sub(page, "p95 TPOT vs SLA 50 ms")
    assert sub.startswith("p95 of the configuration the projected savings size each mode on at workload code, "
                          "temperature 0, bench runs (spec run 2; AR run 1); all requests of the period pooled: spec ")
    with open(f"{rec.csv_dir}/modes.csv", encoding="utf-8", newline="") as fh:
        rows = {r["mode"]: r for r in csv.DictReader(fh)}
    assert rows["spec"]["meets SLA"] == "False" and rows["spec"]["projection meets SLA"] == "True"
    with open(f"{rec.csv_dir}/speedups.csv", encoding="utf-8", newline="") as fh:
        speedups = list(csv.DictReader(fh))
    assert {(r["concurrency"], r["temperature"], r["run kind"], r["prompts"]) for r in speedups} == {
        ("1", "0.0", "bench", "prompts not matched (the runs recorded no prompt ids)"),
        ("4", "0.0", "bench", "prompts not matched (the runs recorded no prompt ids)")}
    assert rec.summary["speedups"][0]["temperature"] == 0.0 and rec.summary["speedups"][0]["run_kind"] == "bench"


def _narrowed_like_cost(url: str, engine, tmp_path, capsys, chosen: list[str], said_as: str) -> Report:
    """A daily report of D0 narrowed by the run filters `chosen`: its label says `said_as`, it holds the 2 requests
    (66 tokens) the test's chosen runs have, and each mode costs what `specfinops cost` gives for those filters."""
    assert main(["cost", "--db", url, "--json", *chosen]) == 0
    narrowed = {m["mode"]: m for m in json.loads(capsys.readouterr().out)["modes"]}
    assert main(_report(url, tmp_path, "--period", "daily", "--since", "2026-11-02", *chosen)) == 0
    said = capsys.readouterr().out
    assert f"daily 2026-11-02 00:00 to 2026-11-03 00:00 UTC ({said_as} only)" in said, said
    rec = _only_report(engine)
    assert rec.summary["output_tokens"] == 66 and rec.summary["requests"] == 2  # not the other runs'
    for mode, got in rec.summary["modes"].items():
        assert got["total_usd_per_1m"] == narrowed[mode]["total_usd_per_1m"], mode
    return rec


def test_a_report_of_one_temperature_and_run_kind_has_the_figures_cost_gives_for_them(sqlite_url, tmp_path, capsys):
    """--temperature / --run-kind narrow every figure of the report (and its previous periods, cost table and
    projection) to those runs, as they narrow `specfinops cost`; the label, the page and the summary say so."""
    engine = open_store(sqlite_url)
    start = D0.replace(hour=9)
    with Session(engine) as s:  # temperature 0: spec fast; temperature 0.8: spec slow; and a load test at 0
        for t, spec_ms in ((0.0, 400), (0.8, 2500)):
            make_run(s, "ar", started_at=start, temperature=t, requests=[Req(33, ttft_ms=100, e2e_ms=1500)])
            make_run(s, "spec", started_at=start, temperature=t,
                     requests=[spec_req(33, 4, 24, ttft_ms=100, e2e_ms=spec_ms)])
        make_run(s, "spec", started_at=start, temperature=0.0, kind="loadtest",
                 requests=[spec_req(33, 4, 24, ttft_ms=100, e2e_ms=900)])
        s.commit()
    rec = _narrowed_like_cost(sqlite_url, engine, tmp_path, capsys, ["--temperature", "0", "--run-kind", "bench"],
                              "temperature 0, bench runs")
    assert rec.summary["temperature"] == 0.0 and rec.summary["run_kind"] == "bench"
    assert [(s["temperature"], s["run_kind"]) for s in rec.summary["speedups"]] == [(0.0, "bench")]
    page = open(rec.html_path, encoding="utf-8").read()
    assert "(temperature 0, bench runs only)" in page
    with open(f"{rec.csv_dir}/runs_cost.csv", encoding="utf-8", newline="") as fh:
        assert sorted(int(r["run_id"]) for r in csv.DictReader(fh)) == [1, 2]
    # bad values are refused before anything is written
    assert main(_report(sqlite_url, tmp_path, "--period", "daily", "--since", "2026-11-02",
                        "--temperature", "-1")) == 2
    assert "--temperature must be >= 0" in capsys.readouterr().err
    assert len(_reports(engine)) == 1


def test_a_report_of_one_workload_and_target_has_the_figures_cost_gives_for_them(sqlite_url, tmp_path, capsys):
    """--workload / --target narrow the report's runs as they narrow `specfinops cost`; the label, the page and
    the summary say so. A name no run ever recorded (a typo: every period would say 'no traffic') is refused with
    the names the store has, and nothing is written."""
    engine = open_store(sqlite_url)
    start = D0.replace(hour=9)
    with Session(engine) as s:  # the same workload on two targets, and a second workload on the first
        for target, workload, spec_ms in (("m/big", "code", 400), ("m/small", "code", 2500), ("m/big", "chat", 900)):
            make_run(s, "ar", started_at=start, target=target, workload=workload,
                     requests=[Req(33, ttft_ms=100, e2e_ms=1500)])
            make_run(s, "spec", started_at=start, target=target, workload=workload,
                     requests=[spec_req(33, 4, 24, ttft_ms=100, e2e_ms=spec_ms)])
        s.commit()
    rec = _narrowed_like_cost(sqlite_url, engine, tmp_path, capsys, ["--workload", "code", "--target", "m/big"],
                              "workload 'code', target 'm/big'")
    assert rec.summary["workload"] == "code" and rec.summary["target"] == "m/big"
    assert [(s["workload"], s["target"]) for s in rec.summary["speedups"]] == [("code", "m/big")]
    page = open(rec.html_path, encoding="utf-8").read()
    assert "(workload &#x27;code&#x27;, target &#x27;m/big&#x27; only)" in page
    with open(f"{rec.csv_dir}/runs_cost.csv", encoding="utf-8", newline="") as fh:
        assert sorted(int(r["run_id"]) for r in csv.DictReader(fh)) == [1, 2]
    # a workload alone keeps both targets' runs
    assert main(_report(sqlite_url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--workload", "code")) == 0
    capsys.readouterr()
    assert max(_reports(engine), key=lambda r: r.id).summary["requests"] == 4
    # names no run recorded, and an empty one, are refused before anything is written
    # ('big' alone is the name of m/big's folder: it selects m/big, as `cost --target big` does)
    assert main(_report(sqlite_url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--target", "bi")) == 2
    assert "no runs with target 'bi' (targets in the store: m/big, m/small)" in capsys.readouterr().err
    assert main(_report(sqlite_url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--workload", "chat",
                        "--target", "m/small")) == 2
    assert "no run has workload 'chat' and target 'm/small' together" in capsys.readouterr().err
    assert main(_report(sqlite_url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--workload", "")) == 2
    assert "--workload must name a workload, got ''" in capsys.readouterr().err
    assert len(_reports(engine)) == 2


def test_a_report_of_one_invocation_covers_its_runs_over_its_own_span(sqlite_url, tmp_path, capsys):
    """--invocation narrows a report to one bench's runs as it narrows `specfinops cost`; with --period custom and
    no dates the period is that bench's own span, to the second (first run's start to last run's end). An
    invocation no run has, or one whose runs lack the other filters' names, is refused and nothing is written."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:  # two benches of one day: a fast spec one in the morning, a slow one at 15:10
        for inv, hour, spec_ms in (("a" * 32, 9, 400), ("b" * 32, 15, 2500)):
            start = D0.replace(hour=hour, minute=10, second=30)
            make_run(s, "ar", started_at=start, requests=[Req(33, ttft_ms=100, e2e_ms=1500)]).invocation_id = inv
            make_run(s, "spec", started_at=start, requests=[spec_req(33, 4, 24, ttft_ms=100, e2e_ms=spec_ms)],
                     ).invocation_id = inv
        s.commit()
    rec = _narrowed_like_cost(sqlite_url, engine, tmp_path, capsys, ["--invocation", "bbbb"], "invocation bbbbbbbb")
    assert rec.summary["invocation_id"] == "b" * 32
    assert [s["invocation_ids"] for s in rec.summary["speedups"]] == [["b" * 32]]
    with open(f"{rec.csv_dir}/runs_cost.csv", encoding="utf-8", newline="") as fh:
        assert sorted(int(r["run_id"]) for r in csv.DictReader(fh)) == [3, 4]
    # the bench's own span: its runs started 09:10:30 and the last ended 1.5 s later
    assert main(_report(sqlite_url, tmp_path, "--period", "custom", "--invocation", "aaaa")) == 0
    assert "custom 2026-11-02 09:10:30 to 2026-11-02 09:10:32 UTC (invocation aaaaaaaa only)" in capsys.readouterr().out
    rec = max(_reports(engine), key=lambda r: r.id)
    assert (rec.since.replace(tzinfo=UTC), rec.until.replace(tzinfo=UTC)) == (
        D0.replace(hour=9, minute=10, second=30), D0.replace(hour=9, minute=10, second=32))
    assert rec.summary["requests"] == 2 and rec.summary["output_tokens"] == 66
    assert "previous period 2026-11-02 09:10:28 to 2026-11-02 09:10:30 UTC" in open(rec.html_path).read()
    # the period before one bench holds none of its runs: no change reads as 66 tokens against 0
    changes = {c["figure"]: c for c in rec.summary["change"]}
    assert changes["output tokens"]["this_period"] == 66
    assert all(c["previous_period"] is None and c["change"] is None and "one invocation" in c["compared"]
               for c in changes.values())
    # ... nor do the tiles: the previous period's count is missing there, not 0
    page = open(rec.html_path, encoding="utf-8").read()
    assert page.count("previous period — (not compared: one invocation") == 2 and "previous period 0" not in page
    # a bench's own 66 tokens in 2 s are not 2.9M tokens of daily traffic: no fleet is sized on them unless given
    assert rec.summary["projection"] is None and "give --daily-tokens" in rec.summary["projection_note"]
    # a --since given is kept; the end is still the bench's
    assert main(_report(sqlite_url, tmp_path, "--period", "custom", "--invocation", "a" * 32, "--since",
                        "2026-11-02T09:00")) == 0
    assert "custom 2026-11-02 09:00:00 to 2026-11-02 09:10:32 UTC" in capsys.readouterr().out
    # refused before anything is written: an id no run has, a malformed one, a workload the bench never ran, and
    # a period that holds none of it (it wrote a report of 'no traffic')
    for extra, said in ((["--invocation", "cccc"], "no invocation id starts with 'cccc'"),
                        (["--invocation", "zz"], "--invocation must be 'latest' or an invocation id"),
                        (["--invocation", "aaaa", "--workload", "chat"], "no runs with workload 'chat'"),
                        (["--invocation", "aaaa", "--since", "2026-11-02T10:00"],
                         "--invocation aaaa: it ran from 2026-11-02 09:10:30 to 2026-11-02 09:10:32 UTC; --since "
                         "2026-11-02T10:00 leaves no time of it to report")):
        assert main(_report(sqlite_url, tmp_path, "--period", "custom", *extra)) == 2, extra
        assert said in capsys.readouterr().err, extra
    assert main(_report(sqlite_url, tmp_path, "--period", "daily", "--since", "2026-11-03", "--invocation", "aaaa")) == 2
    assert ("it ran from 2026-11-02 09:10:30 to 2026-11-02 09:10:32 UTC, outside the period (daily 2026-11-03 00:00 "
            "to 2026-11-04 00:00 UTC") in capsys.readouterr().err
    assert len(_reports(engine)) == 3
    # a schedule reports the periods to come: it takes no --invocation
    with pytest.raises(SystemExit):
        main(["scheduler", "--db", sqlite_url, "--cron", "0 6 * * *", "--out", str(tmp_path), "--invocation", "aaaa"])
    assert "unrecognized arguments: --invocation aaaa" in capsys.readouterr().err


def test_the_reports_page_says_which_runs_a_report_covers(store, tmp_path, monkeypatch):
    import streamlit

    url, engine = store
    assert main(_report(url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--run-kind", "loadtest")) == 0
    streamlit.cache_data.clear()
    [frame] = _reports_page(url, monkeypatch).dataframe
    assert frame.value.iloc[0]["runs"] == "loadtest runs"


def test_the_reports_page_stays_when_the_sidebar_filters_match_no_run(store, tmp_path, monkeypatch):
    """The page says the sidebar filters do not apply to it, yet a choice matching no run replaced its table and
    downloads with 'No runs match these filters'."""
    import streamlit

    url, engine = store
    with Session(engine) as s:  # a sampled load test beside the day's greedy bench runs
        make_run(s, "spec", started_at=D0.replace(hour=10), temperature=0.8, kind="loadtest",
                 requests=[spec_req(33, 4, 24, ttft_ms=100, e2e_ms=900)])
        s.commit()
    assert main(_report(url, tmp_path, "--period", "daily", "--since", "2026-11-02")) == 0
    streamlit.cache_data.clear()
    at = _reports_page(url, monkeypatch)
    at.sidebar.selectbox(key="f_temperature").set_value(0.8).run()
    at.sidebar.selectbox(key="f_kind").set_value("bench").run()  # no bench run at 0.8
    assert not at.exception, [e.value for e in at.exception]
    assert not any("No runs match" in i.value for i in at.info), [i.value for i in at.info]
    [frame] = at.dataframe
    assert len(frame.value) == 1


@pytest.mark.parametrize("power", ["nvml", "estimate"])
def test_cost_card_gives_the_costs_own_reason_as_the_table_does(sqlite_url, tmp_path, power):
    """Runs measured on a CPU but priced (their snapshot) as an H100: their energy is left out of the cost. The
    card said 'hardware only (energy not measured)' beside a measured J/token, and for estimated-power runs too;
    it now gives the reason the Spec vs AR table and its CSV give."""
    engine = open_store(sqlite_url)
    h100 = {"name": "H100", "node_hourly_usd": 55.04}
    with Session(engine) as s:
        for mode, req in (("ar", Req(33, ttft_ms=100, e2e_ms=900, energy_j=50.0)),
                          ("spec", spec_req(33, 4, 24, ttft_ms=100, e2e_ms=500, energy_j=30.0))):
            make_run(s, mode, power_source=power, price_snapshot=h100, requests=[req])
        s.commit()
    assert main(_report(sqlite_url, tmp_path, "--period", "daily", "--since", "2026-11-02")) == 0
    r = _only_report(engine)
    page = open(r.html_path, encoding="utf-8").read()
    for mode, name in (("spec", "spec"), ("ar", "AR")):
        note = r.summary["modes"][mode]["cost_note"]
        # estimated energy is not called measured (it was, whatever the run's power source)
        assert note == f"{'estimated' if power == 'estimate' else 'measured'} energy left out: priced as other " \
                       "hardware than measured"
        with open(f"{r.csv_dir}/modes.csv", encoding="utf-8") as fh:
            assert {row["mode"]: row["cost note"] for row in csv.DictReader(fh)}[mode] == note
        sub = _card_sub(page, f"Cost per 1M tokens, {name} (measured runs)")
        assert sub == f"hardware only ({note})" and "not measured" not in sub
    engine.dispose()


def test_a_period_that_had_not_ended_is_written_with_a_note_a_notice_and_period_complete_false(store, tmp_path,
                                                                                               capsys):
    """A report of today (or of a future window) was written without a word, though its projection divides part
    of a day's tokens by a whole day and generating it again later gives other numbers. It is still written."""
    url, engine = store
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    assert main(_report(url, tmp_path / "today", "--period", "daily", "--since", today)) == 0
    out, err = capsys.readouterr()
    assert out.startswith("report #1: daily ") and err.count("\n") == 1
    assert err.startswith("note: the period had not ended when this report was generated (")
    assert f"it ends {today[:8]}" in err and "cover only the part that had passed" in err
    r = _only_report(engine)
    assert r.summary["period_complete"] is False
    page = open(r.html_path, encoding="utf-8").read()
    assert "<p class='notice' id='period-incomplete'>The period had not ended when this report was generated" in page

    assert main(_report(url, tmp_path / "future", "--period", "custom", "--since", "2099-01-01",
                        "--until", "2099-01-02")) == 0  # fmt: skip
    assert "note: the period had not begun when this report was generated" in capsys.readouterr().err

    assert main(_report(url, tmp_path / "past", "--period", "daily", "--since", "2026-11-02")) == 0
    out, err = capsys.readouterr()
    assert "note:" not in err and "had not" not in err  # (2 requests a mode: warned of as too few, apart)
    with Session(engine) as s:
        last = s.scalars(select(Report).order_by(Report.id.desc())).first()
    assert last.summary["period_complete"] is True
    assert "period-incomplete" not in open(last.html_path, encoding="utf-8").read()


def test_a_part_of_a_period_says_its_projection_spreads_that_part_over_the_whole_period(store, tmp_path):
    url, engine = store
    window = period_window("daily", since=D0)
    result = report_writer.write_report(engine, window, tmp_path, now=D0 + timedelta(hours=12))
    assert result.summary["period_complete"] is False
    assert result.incomplete_period == (
        "the period had not ended when this report was generated (2026-11-02 12:00 UTC; it ends 2026-11-03 00:00 "
        "UTC): its figures cover only the part that had passed, and the projection's traffic per day divides that "
        "part's output tokens by the whole period; generated again after the period ends, the report will give "
        "other numbers")
    assert report_writer.write_report(engine, window, tmp_path, now=D0 + DAY).summary["period_complete"] is True


def test_lift_common_moves_only_liftable_columns_every_row_shares():
    from dataclasses import replace

    from telemetry.report import Column, Table, lift_common

    cols = (Column("figure", "x"), Column("where", "w", str.upper), Column("note", "n"), Column("fixed", "f"))
    t = Table("t", "T", ("x", "w", "n", "f"), ((1, "a", "", "k"), (2, "a", "", "k")), cols,
              frozenset({"where", "note"}))
    shown, common = lift_common(t)
    # 'where' is the same in both rows (as shown); 'note' is empty (stays); 'fixed' is not liftable
    assert [c.header for c in shown.html_columns] == ["figure", "note", "fixed"] and common == [("where", "A")]
    assert shown.rows == t.rows and shown.header == t.header  # the CSV's view is untouched
    one = replace(t, rows=t.rows[:1])
    assert lift_common(one) == (one, [])  # one row: its columns stay where they are
    differ = replace(t, rows=((1, "a", "", "k"), (2, "b", "", "k")))
    assert lift_common(differ) == (differ, [])


def test_a_period_whose_runs_have_no_price_has_no_cost_and_says_why(store, tmp_path, capsys):
    """Runs on a device no catalog entry prices, the day before the report's: the whole report failed (and so
    did every scheduled run whose history held that day), naming flags `report` does not have."""
    url, engine = store
    with Session(engine) as s:
        make_run(s, "ar", device="Google TPU v5e", started_at=D0 - timedelta(days=1),
                 requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        s.commit()
    assert main(_report(url, tmp_path / "a", "--period", "daily", "--since", f"{D0:%Y-%m-%d}")) == 0, \
        capsys.readouterr().err
    summary = _only_report(engine).summary
    assert summary["modes"]["ar"]["total_usd_per_1m"] is not None  # this day's runs are priced
    # the report of the unpriced day: written, its cost missing and why, every other figure there
    assert main(_report(url, tmp_path / "b", "--period", "daily", "--since",
                        f"{D0 - timedelta(days=1):%Y-%m-%d}")) == 0, capsys.readouterr().err
    with Session(engine) as s:
        latest = s.scalars(select(Report).order_by(Report.id.desc())).first().summary
    ar = latest["modes"]["ar"]
    assert ar["total_usd_per_1m"] is None and ar["output_tokens"] == 33
    assert ar["cost_note"].startswith("cost n/a: no price for run") and "'Google TPU v5e'" in ar["cost_note"]
    assert "--gpu" not in ar["cost_note"] and "prices set" in ar["cost_note"]


def test_a_period_with_one_unpriced_run_keeps_the_priced_runs_costs_and_says_which_it_leaves_out(store, tmp_path):
    """A run on a device no price covers beside priced runs of the same day: the report dropped every cost of
    the period ('cost n/a' in both modes, an empty cost per run table). As `cost` does, the priced runs keep
    their costs, the AR figure says it is over 1 of its 2 runs and names the other, whose costs are missing."""
    url, engine = store  # D0: an AR and a spec run on the CPU, priced
    with Session(engine) as s:
        tpu = make_run(s, "ar", device="Google TPU v5e", started_at=D0.replace(hour=10),
                       requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        s.commit()
        tpu = tpu.id
    assert main(_report(url, tmp_path, "--period", "daily", "--since", f"{D0:%Y-%m-%d}")) == 0
    rec = _only_report(engine)
    priced, modes, unpriced = costing.costs_and_unpriced(engine, Filters(since=D0, until=D0 + DAY))
    assert [r.run_id for r in unpriced] == [tpu]
    by_mode = {m.mode: m.cost for m in modes}
    ar, spec = rec.summary["modes"]["ar"], rec.summary["modes"]["spec"]
    assert ar["total_usd_per_1m"] == pytest.approx(by_mode["ar"].total_usd_per_1m)  # over the priced AR run
    assert spec["total_usd_per_1m"] == pytest.approx(by_mode["spec"].total_usd_per_1m)
    said = f"over 1 of 2 runs; run {tpu} (device 'Google TPU v5e') has no price"
    assert ar["cost_priced_over"] == said and spec["cost_priced_over"] is None
    assert ar["output_tokens"] == 99  # every figure but the cost counts the unpriced run
    with open(f"{rec.csv_dir}/modes.csv", encoding="utf-8", newline="") as fh:
        table = {r["mode"]: r for r in csv.DictReader(fh)}
    assert table["ar"]["cost priced over"] == said and table["ar"]["total $/1M"] != ""
    with open(f"{rec.csv_dir}/runs_cost.csv", encoding="utf-8", newline="") as fh:
        runs = {int(r["run_id"]): r for r in csv.DictReader(fh)}
    assert set(runs) == {rc.run.run_id for rc in priced} | {tpu}
    assert runs[tpu]["total_usd_per_1m"] == "" and "no price" in runs[tpu]["note"]  # missing, never 0
    assert all(runs[rc.run.run_id]["total_usd_per_1m"] != "" for rc in priced)
    with open(f"{rec.csv_dir}/change.csv", encoding="utf-8", newline="") as fh:
        change = {r["figure"]: r for r in csv.DictReader(fh)}
    assert f"this period's {said}" in change["AR cost per 1M tokens (USD)"]["compared"]
    assert "no price" not in change["spec cost per 1M tokens (USD)"]["compared"]
    page = open(rec.html_path, encoding="utf-8").read()
    assert said.replace("'", "&#x27;") in page
    from telemetry.delivery import email_text

    (line,) = [x for x in email_text(rec.summary)[1].splitlines() if x.startswith("Cost per 1M tokens, AR: $")]
    assert line.endswith(f"; {said}"), line  # the e-mail's figure says it leaves a run out too


def test_a_report_into_a_folder_the_terminal_cannot_spell_is_written_and_said_once(store, tmp_path):
    """With an ASCII-only stdout (LC_ALL=C, PYTHONIOENCODING=ascii) and a non-ASCII --out, `report` wrote its
    report and record, then failed (exit 2) printing the path: the user ran it again and got it twice. The
    line is printed with the path's characters escaped."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    url, engine = store
    out = tmp_path / "rép"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "app.cli", *_report(url, out, "--period", "daily", "--since",
                                                                      "2026-11-02")],
                          cwd=root, capture_output=True, env={**os.environ, "PYTHONPATH": str(root),
                                                              "PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0, proc.stderr.decode()[-400:]
    assert b"r\\xe9p" in proc.stdout and len(list(out.iterdir())) == 1
    assert len(_reports(engine)) == 1


def test_year_1_dates_are_written_with_four_digit_years(store, tmp_path, capsys):
    """glibc's strftime writes %Y as the year is: a report of year 1 said '1-01-08 00:00' and its folder was
    'report-1-daily-10108T0000Z', not the ISO '0001-01-08' the options take."""
    url, engine = store
    daily = period_window("daily", since=datetime(1, 1, 8, tzinfo=UTC))
    assert daily.span_text() == "0001-01-08 00:00 to 0001-01-09 00:00 UTC"
    assert daily.point_text() == "0001-01-08 00:00"
    assert report_writer.report_dir_name(3, daily) == "report-3-daily-00010108T0000Z"
    month = period_window("monthly", since=datetime(1, 2, 1, tzinfo=UTC))
    assert (month.month_text(), month.point_text()) == ("February 0001", "0001-02")
    assert report_writer.report_dir_name(4, month) == "report-4-monthly-0001-02"
    out = tmp_path / "r"
    assert main(_report(url, out, "--period", "daily", "--since", "0001-01-08", "--history", "1")) == 0
    said = capsys.readouterr().out
    assert "0001-01-08 00:00 to 0001-01-09 00:00 UTC" in said and " 1-01-08" not in said
    [folder] = out.iterdir()
    assert folder.name.endswith("-daily-00010108T0000Z")
    page = (folder / "report.html").read_text()
    assert "0001-01-08 00:00 to 0001-01-09 00:00 UTC" in page and " 1-01-08" not in page


def test_the_reports_cost_per_run_rows_are_priced_as_its_modes_table(store, tmp_path):
    """`report --node-hourly-usd 8.8` priced its modes table at $8.8 a node-hour, while its cost per run table
    used each run's catalog price, and named a run on a device the catalog does not know 'no price' though the
    modes table had priced it."""
    url, engine = store
    with Session(engine) as s:
        tpu = make_run(s, "ar", device="Google TPU v5e", started_at=D0.replace(hour=10),
                       requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        s.commit()
        tpu = tpu.id
    assert main(_report(url, tmp_path, "--period", "daily", "--since", f"{D0:%Y-%m-%d}",
                        "--node-hourly-usd", "8.8")) == 0
    rec = _only_report(engine)
    with open(f"{rec.csv_dir}/runs_cost.csv", encoding="utf-8", newline="") as fh:
        runs = {int(r["run_id"]): r for r in csv.DictReader(fh)}
    assert tpu in runs and all(float(r["node_usd_per_hour"]) == 8.8 for r in runs.values()), runs
    assert runs[tpu]["total_usd_per_1m"] != ""
    assert rec.summary["modes"]["ar"]["cost_priced_over"] is None  # every run priced, by the flag


def test_a_modes_j_per_token_label_covers_its_unpriced_runs_as_the_figure_does(sqlite_url, tmp_path):
    """A spec run with estimated power on a device no price covers, beside a metered priced one: the J/token pools
    both, but its label came from the priced runs only: 'measured' in the summary and modes.csv, no 'estimated'
    on the J/token tile, while the mode's energy was flagged estimated."""
    engine = open_store(sqlite_url)
    try:
        add_day(engine, D0, power_source="nvml")  # priced, metered
        with Session(engine) as s:
            make_run(s, "spec", device="Acme TPU X9", started_at=D0.replace(hour=11), power_source="estimate",
                     requests=[spec_req(33, 4, 24, ttft_ms=100, e2e_ms=500, energy_j=30.0)])
            s.commit()
        assert main(_report(sqlite_url, tmp_path, "--period", "daily", "--since", f"{D0:%Y-%m-%d}")) == 0
        rec = _only_report(engine)
    finally:
        engine.dispose()
    spec = rec.summary["modes"]["spec"]
    assert spec["energy_estimated"] and spec["energy_source"] == "partly estimated"
    assert rec.summary["modes"]["ar"]["energy_source"] == "measured"
    with open(f"{rec.csv_dir}/modes.csv", encoding="utf-8", newline="") as fh:
        table = {r["mode"]: r for r in csv.DictReader(fh)}
    assert table["spec"]["energy source"] == "partly estimated", table["spec"]
    page = open(rec.html_path, encoding="utf-8").read()
    assert re.search(r"spec [0-9.]+ J \(partly estimated\)", page), page


def test_a_report_of_synthetic_runs_says_so_as_the_dashboard_does(store, tmp_path, capsys):
    """The dashboard warns 'Synthetic data ... not measurements'; the report of the same runs said nothing."""
    from telemetry.delivery import email_text

    url, engine = store
    assert main(_report(url, tmp_path / "real", "--period", "daily", "--since", f"{D0:%Y-%m-%d}")) == 0
    real = _only_report(engine)
    assert real.summary["synthetic"] == 0 and "id='synthetic'" not in open(real.html_path, encoding="utf-8").read()
    assert "synthetic" not in capsys.readouterr().err.lower()
    with Session(engine) as s:
        make_run(s, "ar", workload="synthetic", hostname="synthetic-generator", started_at=D0.replace(hour=12),
                 requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        s.commit()
    assert main(_report(url, tmp_path / "synth", "--period", "daily", "--since", f"{D0:%Y-%m-%d}")) == 0
    err = capsys.readouterr().err
    with Session(engine) as s:
        rec = s.scalars(select(Report).order_by(Report.id.desc())).first()
    assert rec.summary["synthetic"] == 1
    said = ("ynthetic data: 1 of the 3 runs in this period were made by the benchmark generator (workload "
            "'synthetic', host 'synthetic-generator'); their figures are not measurements")
    assert f"warning: s{said}" in err, err
    page = open(rec.html_path, encoding="utf-8").read()
    assert "<p class='notice' id='synthetic'>S" + html.escape(said) in page
    assert "Synthetic data: 1 of the period's runs" in email_text(rec.summary)[1]


def test_a_report_on_too_few_requests_warns_as_cost_does(store, tmp_path, capsys):
    """`cost` warns that 2 spec and 2 AR requests are too few for stable figures; the report of the same runs
    said so only inside its projection's assumptions (and not at all without a projection)."""
    url, engine = store  # D0: 2 spec and 2 AR requests
    assert main(_report(url, tmp_path / "few", "--period", "daily", "--since", f"{D0:%Y-%m-%d}")) == 0
    err = capsys.readouterr().err
    rec = _only_report(engine)
    said = ("based on 2 spec and 2 AR requests: too few for a tokens/s and a cost per 1M tokens to be stable (under "
            "20 per mode)")
    assert rec.summary["small_sample"].startswith(said) and f"warning: {said}" in err, err
    assert "<p class='notice' id='small-sample'>B" + html.escape(said[1:]) in open(rec.html_path, encoding="utf-8").read()
    day = D0 + DAY  # a day with enough requests of each mode: no warning
    with Session(engine) as s:
        for mode in ("ar", "spec"):
            reqs = [Req(33, ttft_ms=100, e2e_ms=900, start_s=i * 0.1) if mode == "ar" else
                    spec_req(33, 4, 24, ttft_ms=100, e2e_ms=500, start_s=i * 0.1) for i in range(20)]
            make_run(s, mode, started_at=day.replace(hour=9), requests=reqs)
        s.commit()
    assert main(_report(url, tmp_path / "enough", "--period", "daily", "--since", f"{day:%Y-%m-%d}")) == 0
    assert "too few" not in capsys.readouterr().err
    with Session(engine) as s:
        rec = s.scalars(select(Report).order_by(Report.id.desc())).first()
    assert rec.summary["small_sample"] is None
    assert "id='small-sample'" not in open(rec.html_path, encoding="utf-8").read()


def test_report_charts_have_no_mode_bar_and_titles_wrapped_within_their_width(store, tmp_path):
    """Plotly's mode bar was drawn over the chart titles at 1280 px, and the long titles were cut at 820 px:
    Plotly never wraps a title. No mode bar; each title short, its detail in a wrapped subtitle, the top
    margin holding its lines."""
    from telemetry.report import build_report
    from telemetry.report_html import (
        CHART_CONFIG,
        SUBTITLE_CHARS,
        TITLE_CHARS,
        cost_chart,
        sla_chart,
        tpot_chart,
        trend_chart,
    )

    url, engine = store
    add_day(engine, D0 - DAY, power_source="nvml")  # the trend's periods on two energy bases: its longest subtitle
    data = build_report(engine, period_window("daily", since=D0))
    figures = [cost_chart(data), tpot_chart(data), trend_chart(data), sla_chart(data, data.projection.sla_curve)]
    for fig in figures:
        lines = fig.layout.title.text.split("<br>")
        head = [x for x in lines if not x.startswith("<sub>")]
        subs = [x.removeprefix("<sub>").removesuffix("</sub>") for x in lines if x.startswith("<sub>")]
        assert subs and all(len(x) <= TITLE_CHARS for x in head) and all(len(x) <= SUBTITLE_CHARS for x in subs)
        assert fig.layout.margin.t >= 30 + 22 * len(head) + 16 * len(subs), fig.layout.title.text
    assert any(len(fig.layout.title.text.split("<br>")) > 2 for fig in figures)  # a long subtitle, wrapped
    assert CHART_CONFIG["displayModeBar"] is False
    assert main(_report(url, tmp_path, "--period", "daily", "--since", f"{D0:%Y-%m-%d}")) == 0
    page = open(_only_report(engine).html_path, encoding="utf-8").read()
    assert page.count('"displayModeBar": false') == page.count('class="plotly-graph-div"') > 0


def test_a_period_that_had_not_ended_compares_its_rates_not_its_totals(store, tmp_path):
    """A report of a period that had not ended set its part against the whole previous period: change.csv read
    a drop in output tokens with an empty `compared` cell. A total (output tokens, requests) keeps both values
    and has no change, `compared` says why; a rate (cost per 1M tokens, acceptance, TPOT, J/token) is comparable
    mid-period: it has its change and its band verdict (a cost spike mid-period is flagged in the summary, the
    page, the e-mail and the dashboard's list), with a note that the period had not ended."""
    from telemetry.report import NOT_ENDED, RATE_SO_FAR

    url, engine = store  # D0, and four whole days before it
    for n in range(1, 5):
        add_day(engine, D0 - n * DAY, spec_e2e_ms=1500)
    window = period_window("daily", since=D0)
    result = report_writer.write_report(engine, window, tmp_path, now=D0 + timedelta(hours=12), history=4)
    change = {c["figure"]: c for c in result.summary["change"]}
    tokens = change["output tokens"]
    assert tokens["this_period"] == tokens["previous_period"] == 132
    assert tokens["change"] is None and tokens["change_pct"] is None and tokens["compared"] == NOT_ENDED
    assert change["requests"]["change"] is None and change["requests"]["compared"] == NOT_ENDED
    cost = change["spec cost per 1M tokens (USD)"]
    assert cost["change"] is not None and cost["change"] < 0 and cost["compared"] == f"total; {RATE_SO_FAR}"
    tpot = change["spec p95 TPOT (ms)"]
    assert tpot["change"] is not None and tpot["compared"] == RATE_SO_FAR
    with open(result.csv_dir / "change.csv", encoding="utf-8") as fh:
        rows = {r["figure"]: r for r in csv.DictReader(fh)}
    assert (rows["output tokens"]["change"], rows["output tokens"]["change %"]) == ("", "")
    assert rows["output tokens"]["compared"] == NOT_ENDED and rows["spec p95 TPOT (ms)"]["change"] != ""
    bands = {b["metric"]: b for b in result.summary["anomalies"]}
    spec = bands["spec cost per 1M tokens (USD)"]  # far below its band: an anomaly, the period whole or not
    assert spec["status"] == "anomaly" and spec["note"].startswith(f"{RATE_SO_FAR}; band = mean")
    page = open(result.html_path, encoding="utf-8").read()
    assert "spec cost per 1M tokens (USD): " in page and "is outside its band" in page and RATE_SO_FAR in page
    assert "Not checked against their bands" not in page
    from telemetry.delivery import email_text

    assert "Anomalies: spec cost per 1M tokens (USD) (this period had not ended)\n" in email_text(result.summary)[1]
    import streamlit

    from app.dashboard.views.reports import reports

    streamlit.cache_data.clear()
    assert [r["anomalies"] for r in reports(url)] == ["spec cost per 1M tokens (USD)"]
    whole = report_writer.write_report(engine, window, tmp_path / "later", now=D0 + DAY, history=4)
    assert {b["metric"]: b for b in whole.summary["anomalies"]}["spec cost per 1M tokens (USD)"]["status"] == "anomaly"
    change = {c["figure"]: c for c in whole.summary["change"]}
    assert change["output tokens"]["compared"] is None and change["output tokens"]["change"] == 0
    assert change["spec cost per 1M tokens (USD)"]["compared"] == "total"


def test_mid_period_bands_say_not_checked_only_where_no_band_was_checked():
    """The e-mail and the dashboard's list said 'not checked' of a mid-period report whenever one band was (a
    total's); a rate's verdict there is a verdict: 'none' (with the note) where all checked bands are within."""
    from telemetry.delivery import email_text

    within = {"metric": "spec acceptance rate", "status": "within band"}
    total = {"metric": "output tokens", "status": "not checked"}
    summary = {"anomalies": [within, total], "period_complete": False}
    assert "Anomalies: none (this period had not ended)\n" in email_text(summary)[1]
    assert "Anomalies: not checked (this period had not ended)\n" in email_text(
        {"anomalies": [total], "period_complete": False})[1]


def test_a_mid_period_or_first_period_cost_keeps_its_estimated_label(store, tmp_path):
    """The change list's `estimated` of a cost was empty where `compared` said why there is no change (a period
    that had not ended, no previous period): its energy rests on estimated power all the same."""
    url, engine = store  # D0, estimated power
    first = report_writer.write_report(engine, period_window("daily", since=D0), tmp_path / "first",
                                       now=D0 + 10 * DAY)
    cost = {c["figure"]: c for c in first.summary["change"]}["spec cost per 1M tokens (USD)"]
    assert cost["compared"] == "not compared: no value in the previous period"
    assert cost["estimated"] == "this period"
    add_day(engine, D0 - DAY)
    mid = report_writer.write_report(engine, period_window("daily", since=D0), tmp_path / "mid",
                                     now=D0 + timedelta(hours=12))
    cost = {c["figure"]: c for c in mid.summary["change"]}["spec cost per 1M tokens (USD)"]
    assert cost["estimated"] == "this period and previous period"
    with open(mid.csv_dir / "change.csv", encoding="utf-8") as fh:
        row = {r["figure"]: r for r in csv.DictReader(fh)}["AR cost per 1M tokens (USD)"]
    assert row["estimated"] == "this period and previous period"


def test_reasons_not_to_compare_share_one_prefix(store, tmp_path):
    """A mid-period J/token metered before and estimated now read "not compared: this period had not ended; not
    compared: energy estimated in this period, ...": the prefix once, the reasons joined under it."""
    url, engine = store  # D0 estimated, the day before metered
    add_day(engine, D0 - DAY, power_source="nvml")
    mid = report_writer.write_report(engine, period_window("daily", since=D0), tmp_path, now=D0 + timedelta(hours=12))
    for c in mid.summary["change"]:
        assert (c["compared"] or "").count("not compared") <= 1, c
    row = {c["figure"]: c for c in mid.summary["change"]}["spec J/token"]
    assert row["compared"] == "not compared: energy estimated in this period, measured in the previous one"
    assert row["change"] is None


def test_change_names_a_basis_only_where_both_periods_have_a_value(store, tmp_path):
    """An empty period's change.csv said compared "total" for the costs, though neither period had one."""
    url, engine = store  # D0 only: the day before is empty
    empty = report_writer.write_report(engine, period_window("daily", since=D0 + 5 * DAY), tmp_path / "empty",
                                       now=D0 + 10 * DAY)
    change = {c["figure"]: c for c in empty.summary["change"]}
    assert change["spec cost per 1M tokens (USD)"]["compared"] == "not compared: no value in either period"
    assert change["spec acceptance rate"]["compared"] == "not compared: no value in either period"
    first = report_writer.write_report(engine, period_window("daily", since=D0), tmp_path / "first",
                                       now=D0 + 10 * DAY)
    change = {c["figure"]: c for c in first.summary["change"]}
    assert change["spec cost per 1M tokens (USD)"]["compared"] == "not compared: no value in the previous period"
    after = report_writer.write_report(engine, period_window("daily", since=D0 + DAY), tmp_path / "after",
                                       now=D0 + 10 * DAY)
    change = {c["figure"]: c for c in after.summary["change"]}
    assert change["AR cost per 1M tokens (USD)"]["compared"] == "not compared: no value in this period"
    add_day(engine, D0 + DAY)
    both = report_writer.write_report(engine, period_window("daily", since=D0 + DAY), tmp_path / "both",
                                      now=D0 + 10 * DAY)
    assert {c["figure"]: c for c in both.summary["change"]}["AR cost per 1M tokens (USD)"]["compared"] == "total"


def test_the_daily_tokens_basis_spells_out_the_sum(store, tmp_path):
    """projection.csv read "this period's measured output tokens (94,266) per day" beside 13466.57."""
    url, engine = store  # 132 output tokens on D0
    weekly = report_writer.write_report(engine, period_window("weekly", since=D0), tmp_path / "w", now=D0 + 10 * DAY)
    said = "this period's 132 output tokens over 7 days = 18.9 per day"
    assert weekly.summary["projection_daily_tokens_basis"] == said
    with open(weekly.csv_dir / "projection.csv", encoding="utf-8") as fh:
        assert {r["figure"]: r["value"] for r in csv.DictReader(fh)}["daily tokens basis"] == said
    assert html.escape(said) in open(weekly.html_path, encoding="utf-8").read()
    daily = report_writer.write_report(engine, period_window("daily", since=D0), tmp_path / "d", now=D0 + 10 * DAY)
    assert daily.summary["projection_daily_tokens_basis"] == "this period's 132 output tokens over 1 day = 132 per day"


def test_a_window_says_how_far_its_priced_spans_reach_past_its_edges(store, tmp_path):
    """A window prices a run from its requests' first start to their last end, past the window's end: two adjacent
    windows priced the same node-seconds twice, unsaid. The AR run of D0 09:00 serves 0-0.9 s and 0.2-1.9 s, the
    spec run 0-0.5 s and 1.0-1.5 s; cut at 09:00:00.1, the first window's spans run 0.80 s and 0.40 s past the cut
    and the second's begin at 0.2 s and 1.0 s: the windows' wall times overlap by 0.7 s (AR) and 0 s (spec). The
    export's note, a report's notice and summary say it; the whole day says nothing."""
    url, engine = store
    cut = D0.replace(hour=9) + timedelta(milliseconds=100)
    out = tmp_path / "before.csv"
    assert main(["export", "--db", url, "--what", "cost", "--until", cut.isoformat(), "--out", str(out)]) == 0
    with open(out, encoding="utf-8") as fh:
        before = {r["mode"]: r for r in csv.DictReader(fh)}
    assert float(before["ar"]["wall_s"]) == pytest.approx(0.9)
    assert before["ar"]["note"].endswith("priced span runs 0.80 s past the window's end (2026-11-02 09:00:00 UTC): "
                                         "requests in flight there; a window starting at that end prices up to that "
                                         "much of the same node time again (adjacent windows' costs overlap by up to "
                                         "that)")
    assert "0.40 s past the window's end" in before["spec"]["note"]
    out = tmp_path / "after.csv"
    assert main(["export", "--db", url, "--what", "cost", "--since", cut.isoformat(), "--out", str(out)]) == 0
    with open(out, encoding="utf-8") as fh:
        after = {r["mode"]: r for r in csv.DictReader(fh)}
    assert float(after["ar"]["wall_s"]) == pytest.approx(1.7)  # 0.9 + 1.7 = 2.6 s against the run's 1.9
    assert "requests started before the window's start (2026-11-02 09:00:00 UTC) ran 0.80 s into it" in \
        after["ar"]["note"]
    window = period_window("custom", since=D0, until=cut)
    result = report_writer.write_report(engine, window, tmp_path / "r", now=D0 + DAY)
    said = result.summary["window_overlap"]
    assert said.startswith("runs 1-2: the priced span (wall_s: first request start to last end) runs up to 0.80 s "
                           "past the window's end (2026-11-02 09:00:00 UTC; run 1 0.80 s, run 2 0.40 s)")
    assert "adjacent windows' costs overlap by up to that" in said
    assert "id='window-overlap'" in open(result.html_path, encoding="utf-8").read()
    with open(result.csv_dir / "runs_cost.csv", encoding="utf-8") as fh:
        assert all("past the window's end" in r["note"] for r in csv.DictReader(fh))
    whole = report_writer.write_report(engine, period_window("daily", since=D0), tmp_path / "d", now=D0 + DAY)
    assert whole.summary["window_overlap"] is None
    assert "window-overlap" not in open(whole.html_path, encoding="utf-8").read()


def test_change_table_writes_j_per_token_as_the_card_does(sqlite_url, tmp_path, capsys):
    """The card said 'AR 1.50 J' while the period-change table beside it read 'AR J/token 1.5' (report_html.number):
    its J/token rows now go through labels.j_per_token_text too. The CSV keeps raw numbers, as its other rows do."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for day, ar_j in ((D0, 49.5), (D0 - DAY, 39.6)):  # AR 1.50 J/token this period, 1.20 the one before
            make_run(s, "ar", started_at=day.replace(hour=9),
                     requests=[Req(33, ttft_ms=100, e2e_ms=1380, energy_j=ar_j)])
            make_run(s, "spec", started_at=day.replace(hour=9),
                     requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=420, energy_j=33 * 3.12)])
        s.commit()
    assert main(_report(sqlite_url, tmp_path, "--period", "daily", "--since", "2026-11-02", "--history", "1")) == 0
    capsys.readouterr()
    rec = _only_report(engine)
    page = open(rec.html_path, encoding="utf-8").read()
    cells = dict(re.findall(r'<tr><td>((?:AR|spec) J/token)</td>((?:<td class="n">[^<]*</td>){3})', page))
    shown = {k: re.findall(r'<td class="n">([^<]*)</td>', v) for k, v in cells.items()}
    assert shown == {"spec J/token": ["3.12", "3.12", "0.00"], "AR J/token": ["1.50", "1.20", "0.300"]}, shown
    with open(f"{rec.csv_dir}/change.csv", encoding="utf-8", newline="") as fh:
        rows = {r["figure"]: r for r in csv.DictReader(fh)}
    # raw numbers, as the other rows (a cost without its '$', a change unrounded)
    assert (rows["AR J/token"]["this period"], rows["AR J/token"]["previous period"]) == ("1.5", "1.2")
    assert float(rows["AR cost per 1M tokens (USD)"]["this period"]) > 0
    engine.dispose()


def test_a_report_reads_its_window_spills_once_and_not_a_long_run_whole(store, tmp_path, monkeypatch):
    """`report` read window_spills twice (the notice, then the runs_cost table), each reading the span bounds
    again, and the into-the-start part read every request of the runs before the window (a long server run
    whole). Once, the past-the-end part from the bounds the wall times were read from, the earlier requests only
    as far back as the runs' longest e2e; the figures as before."""
    from telemetry import queries, window_spans
    from telemetry.db import Request, Run

    url, engine = store  # the AR run of D0 09:00 serves 0-0.9 s and 0.2-1.9 s
    with Session(engine) as s:  # the same run's request ten days earlier: its span is none of the window's
        run_id = s.scalars(select(Request.run_id).join(Run).where(Run.mode == "ar")).first()
        s.add(Request(run_id=run_id, started_at=D0 - 10 * DAY, prompt_tokens=8, output_tokens=4, ttft_ms=10,
                      e2e_ms=20, status="ok"))
        s.commit()
    reads, spills = [], []
    bounds, spill = queries._span_bounds, window_spans.window_spills
    monkeypatch.setattr(queries, "_span_bounds", lambda c, e, f, *x: reads.append(f) or bounds(c, e, f, *x))
    monkeypatch.setattr(window_spans, "window_spills", lambda *a, **k: spills.append(a) or spill(*a, **k))
    cut = D0.replace(hour=9) + timedelta(milliseconds=100)  # the spec run serves 0-0.5 s and 1.0-1.5 s
    window = period_window("custom", since=cut, until=cut + timedelta(milliseconds=1100))
    with queries.reuse_collections():
        result = report_writer.write_report(engine, window, tmp_path, now=D0 + DAY, history=1)
    said = result.summary["window_overlap"]
    assert "0.70 s past the window's end (2026-11-02 09:00:01 UTC; run 1 0.70 s, run 2 0.30 s)" in said
    assert "ran up to 0.80 s into it (run 1 0.80 s, run 2 0.40 s)" in said
    assert len(spills) == 1
    current = [f for f in reads if f.since == window.since and f.until == window.until]
    assert len(current) == 1, current  # the wall times' read; window_spills reads it again no more
    before = [f for f in reads if f.until == window.since and f.run_ids is not None]
    assert len(before) == 1 and before[0].since is not None and before[0].since > D0 - DAY

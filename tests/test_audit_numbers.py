"""Audit of the figures: the per-run "energy estimated" of runs whose energy is left out of the cost, the
synthetic store's price snapshot, upper bounds on prices, and export's run selectors that match no run."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from app.cli import main
from scripts.synth_store import generate
from telemetry import costing
from telemetry.db import PowerSample, Run
from telemetry.prices import (
    MAX_PUE,
    MAX_USD_PER_HOUR,
    MAX_USD_PER_KWH,
    check_price,
    latest_today,
    load_catalog,
)
from telemetry.store import open_store

OLD_SNAPSHOT = {"node_hourly_usd": 55.04, "name": "H100 x8"}  # a whole node's price on a one-GPU device


@pytest.fixture
def synth(sqlite_url):
    engine = open_store(sqlite_url)
    generate(engine, 4_000, log=lambda *_: None)
    return engine, sqlite_url


def _export_cost(url: str, capsys, *argv: str) -> list[dict]:
    assert main(["export", "--db", url, "--what", "cost", "--out", "-", *argv]) == 0
    return list(csv.DictReader(io.StringIO(capsys.readouterr().out)))


# ---- 1. energy estimated per run ------------------------------------------------------------------------------

def test_energy_left_out_of_the_cost_is_still_said_to_be_estimated(synth, capsys):
    engine, url = synth
    with engine.begin() as c:  # priced as other hardware than measured: the energy is left out of every cost
        c.execute(update(Run).values(price_snapshot=OLD_SNAPSHOT))
    with engine.connect() as c:
        source = dict(c.execute(Run.__table__.select().with_only_columns(Run.id, Run.power_source)).all())
    rows = _export_cost(url, capsys)
    assert rows and {r["energy_included"] for r in rows} == {"False"}
    estimated = {int(r["run_id"]) for r in rows if r["energy_estimated"] == "True"}
    assert estimated == {i for i, s in source.items() if s == "estimate"} and estimated  # runs 5, 6, 11, 12, ...
    assert {5, 6, 11, 12} <= estimated


def test_cost_json_says_per_run_what_export_says(synth, capsys):
    """`cost --json` gave a run's energy_estimated from its cost (False where the energy is left out), export
    and the report from the run's power: the same runs now get the same answer everywhere."""
    engine, url = synth
    with engine.begin() as c:
        c.execute(update(Run).values(price_snapshot=OLD_SNAPSHOT))
    exported = {int(r["run_id"]): r["energy_estimated"] == "True" for r in _export_cost(url, capsys)}
    assert main(["cost", "--db", url, "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert {r["run_id"]: r["energy_estimated"] for r in runs} == exported
    assert any(exported.values()) and not any(r["energy_included"] for r in runs)


def test_run_energy_estimated_follows_the_power_source_not_the_cost(synth):
    engine, _ = synth
    run_costs, _ = costing.costs(engine)
    for rc in run_costs:
        assert costing.run_energy_estimated(rc.run) == (rc.run.power_source == "estimate")


def test_report_runs_cost_table_agrees_with_the_modes_table(synth, tmp_path, capsys):
    engine, url = synth
    with engine.begin() as c:
        c.execute(update(Run).values(price_snapshot=OLD_SNAPSHOT))
    since, until = (latest_today() - timedelta(days=20)).isoformat(), (latest_today() + timedelta(days=1)).isoformat()
    assert main(["report", "--db", url, "--period", "custom", "--since", since, "--until", until, "--history", "1",
                 "--out", str(tmp_path)]) == 0
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    runs = list(csv.DictReader((folder / "runs_cost.csv").open()))
    assert {int(r["run_id"]) for r in runs if r["energy_estimated"] == "True"} >= {5, 6, 11, 12}
    assert all(r["energy_included"] == "False" for r in runs)
    modes = list(csv.DictReader((folder / "modes.csv").open()))
    assert modes and all(m["energy estimated"] == "True" for m in modes)
    html = (folder / "report.html").read_text()
    assert "energy estimated" in html


# ---- 2. the synthetic store prices what it "measured" ------------------------------------------------------------

def test_synthetic_runs_are_priced_as_their_one_gpu_and_keep_their_energy(synth):
    engine, _ = synth
    h100 = load_catalog(engine).get("H100").value
    run_costs, _ = costing.costs(engine)
    assert run_costs
    for rc in run_costs:
        assert rc.run.price_snapshot["name"] == "H100" and rc.run.price_snapshot["node_hourly_usd"] == h100
        assert not rc.priced_differs and rc.cost.energy_included, rc.run.run_id
        assert not costing.is_energy_other_hardware(rc.cost.reason)


# ---- 3. price bounds ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "flag"), [
    (["cost", "--node-hourly-usd", "1e308"], "--node-hourly-usd"),
    (["cost", "--usd-per-kwh", str(MAX_USD_PER_KWH * 2)], "--usd-per-kwh"),
    (["cost", "--pue", str(MAX_PUE + 1)], "--pue"),
    (["project", "--node-hourly-usd", "1e308", "--daily-tokens", "1e8", "--peak-factor", "1",
      "--p95-tpot-sla-ms", "50"], "--node-hourly-usd"),
])
def test_absurd_price_options_are_refused_naming_the_flag(synth, capsys, argv, flag):
    _, url = synth
    assert main([*argv, "--db", url]) == 2
    err = capsys.readouterr().err
    assert flag in err and "at most" in err and argv[argv.index(flag) + 1] in err and "inf" not in err


def test_a_price_at_the_bound_is_accepted(synth, capsys):
    _, url = synth
    assert main(["cost", "--db", url, "--node-hourly-usd", f"{MAX_USD_PER_HOUR:g}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"]


@pytest.mark.parametrize(("name", "value", "kind"), [
    ("cpu-2core", 1e308, None), ("H100", MAX_USD_PER_HOUR * 2, None), ("pue", MAX_PUE + 1, None),
    ("electricity", MAX_USD_PER_KWH + 1, None), ("my-node", MAX_USD_PER_HOUR + 1, "node"),
    ("custom", MAX_USD_PER_HOUR + 1, None),
])
def test_check_price_bounds_values(name, value, kind):
    with pytest.raises(ValueError, match="at most"):
        check_price(name, value, source="x", kind=kind)


def test_prices_set_refuses_an_absurd_value_and_a_future_date(synth, capsys):
    engine, url = synth
    before = load_catalog(engine).get("cpu-2core").value
    assert main(["prices", "set", "cpu-2core", "1e308", "--source", "x", "--db", url]) == 2
    assert "cpu-2core" in capsys.readouterr().err and load_catalog(engine).get("cpu-2core").value == before
    assert main(["prices", "set", "mine", "1", "--kind", "node", "--source", "x", "--db", url]) == 0
    assert main(["prices", "set", "mine", "20000", "--source", "x", "--db", url]) == 2
    future = (latest_today() + timedelta(days=1)).isoformat()
    assert main(["prices", "set", "H100", "3", "--source", "x", "--as-of", future, "--db", url]) == 2
    assert "future" in capsys.readouterr().err and load_catalog(engine).get("H100").value != 3
    assert main(["prices", "set", "H100", "3", "--source", "x", "--as-of", "2026-01-01", "--db", url]) == 0


# ---- 4. export: a run selector matching no run ---------------------------------------------------------------

@pytest.mark.parametrize("what", ["cost", "requests", "power"])
@pytest.mark.parametrize(("flag", "name"), [("--workload", "workload"), ("--node", "node"), ("--target", "target")])
def test_export_fails_where_a_run_selector_matches_no_run(synth, tmp_path, capsys, what, flag, name):
    _, url = synth
    out = tmp_path / "keep.csv"
    out.write_text("as it was\n")
    assert main(["export", "--db", url, "--what", what, "--out", str(out), flag, "nosuch"]) == 2
    err = capsys.readouterr().err
    assert f"no runs with {name} 'nosuch'" in err and "in the store:" in err
    assert out.read_text() == "as it was\n"
    assert main(["export", "--db", url, "--what", what, "--out", "-", flag, "nosuch"]) == 2
    assert capsys.readouterr().out == ""


def test_export_of_matching_runs_without_rows_stays_a_note(synth, tmp_path, capsys):
    engine, url = synth
    with engine.begin() as c:
        c.execute(update(Run).where(Run.node_id == "synthetic-node-a").values(power_source="none"))
    with engine.begin() as c:
        c.execute(PowerSample.__table__.delete().where(PowerSample.run_id.in_(
            Run.__table__.select().with_only_columns(Run.id).where(Run.node_id == "synthetic-node-a"))))
    out = tmp_path / "power.csv"
    assert main(["export", "--db", url, "--what", "power", "--node", "synthetic-node-a", "--out", str(out)]) == 0
    assert "measured no power" in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == 1
    assert main(["export", "--db", url, "--what", "cost", "--since", "2000-01-01", "--until", "2000-01-02",
                 "--workload", "synthetic", "--out", "-"]) == 0


def test_the_dashboard_inputs_stop_at_the_same_bounds():
    from app.dashboard.views import cost as view  # noqa: PLC0415 - streamlit only for this test

    assert (view.MAX_NODE_USD, view.MAX_USD_PER_KWH, view.MAX_PUE) == (MAX_USD_PER_HOUR, MAX_USD_PER_KWH, MAX_PUE)


def test_a_bench_can_record_into_a_synthetic_store(db_url):
    """The synthetic store inserts its ids by hand: on PostgreSQL the id sequences stayed at 1, and the next run
    recorded there failed with a duplicate key on pk_runs."""
    from telemetry.recorder import Recorder
    from tests.recorder_child import run_info

    engine = open_store(db_url)
    generate(engine, 2_000, log=lambda *_: None)
    with Recorder(engine) as rec:
        run_id = rec.start_run(run_info())
        rec.end_run(run_id)
    with engine.connect() as c:
        assert c.scalar(select(func.max(Run.id))) == run_id == 49
    engine.dispose()


def test_a_synthetic_postgresql_store_is_analysed(pg_url):
    """The synthetic store is bulk-loaded: without ANALYZE PostgreSQL planned its first queries for empty tables
    (an export of one run's token events, read through a cursor, took 21 s instead of 1.8 s on 1.5M rows)."""
    engine = open_store(pg_url)
    generate(engine, 2_000, log=lambda *_: None)
    with engine.connect() as c:  # reltuples: -1 for a table never analysed (or vacuumed), else its row estimate
        planned = dict(c.exec_driver_sql(
            "SELECT relname, reltuples FROM pg_class WHERE relname IN "
            "('runs', 'requests', 'steps', 'token_events', 'power_samples')").all())
        analysed = dict(c.exec_driver_sql(
            "SELECT tablename, count(*) FROM pg_stats WHERE tablename IN ('requests', 'token_events') GROUP BY 1").all())
    assert len(planned) == 5 and min(planned.values()) > 0, planned
    assert planned["token_events"] >= 2_000, planned
    assert set(analysed) == {"requests", "token_events"}, analysed  # column statistics: started_at, request_id
    engine.dispose()

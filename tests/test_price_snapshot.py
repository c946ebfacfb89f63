"""Every run records the catalog prices in force when it starts (runs.price_snapshot), and is costed at them:
editing the catalog (`prices set`) prices the runs started after the edit, never the ones recorded before."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from recorder_child import run_info
from sqlalchemy import select

from app.cli import main
from telemetry.db import Run
from telemetry.prices import load_catalog, price_snapshot, resolve_node_price, set_price
from telemetry.recorder import Recorder
from telemetry.store import open_store
from telemetry.synthetic import synthetic_request

CPU = "cpu (2 cores)"


def _bench_like_run(engine, info=None) -> int:
    """A run as bench records it: start_run, requests with energy, end_run."""
    info = info or replace(run_info(), device=CPU, power_source="estimate")
    rng = random.Random(11)
    with Recorder(engine, flush_interval_s=0.02) as rec:
        run_id = rec.start_run(info)
        t0 = datetime.now(UTC)
        for i in range(3):
            r = synthetic_request(rng, 40)
            r.started_at = t0 + timedelta(seconds=i)
            r.energy_j = 25.0
            rec.record_request(run_id, r)
        rec.end_run(run_id)
    return run_id


def _snapshot(engine, run_id: int) -> dict | None:
    with engine.connect() as c:
        return c.execute(select(Run.price_snapshot).where(Run.id == run_id)).scalar_one()


def _run_costs(url: str, capsys) -> dict[int, dict]:
    assert main(["cost", "--db", url, "--json"]) == 0
    return {r["run_id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}


def test_a_recorded_run_carries_the_catalog_prices_in_force_when_it_started(db_url):
    engine = open_store(db_url)
    set_price(engine, "cpu-2core", 0.25, source="quote")
    set_price(engine, "electricity", 0.31, source="tariff")
    before = datetime.now(UTC)
    run_id = _bench_like_run(engine)
    snap = _snapshot(engine, run_id)
    assert {k: snap[k] for k in ("name", "node_hourly_usd", "usd_per_kwh")} == {
        "name": "cpu-2core", "node_hourly_usd": 0.25, "usd_per_kwh": 0.31,
    }  # fmt: skip
    assert snap["pue"] == load_catalog(engine).get("pue").value
    taken_at = datetime.fromisoformat(snap["taken_at"])
    assert taken_at.tzinfo is not None and before <= taken_at <= datetime.now(UTC)
    engine.dispose()


def test_prices_set_keeps_recorded_runs_at_their_prices_and_prices_later_runs_at_the_new(sqlite_url, capsys):
    engine = open_store(sqlite_url)
    catalog = load_catalog(engine)
    old_node, (old_kwh, old_pue) = catalog.get("cpu-2core").value, catalog.energy_prices()
    first = _bench_like_run(engine)
    before = _run_costs(sqlite_url, capsys)[first]
    assert before["node_hourly_usd"] == old_node and before["energy_included"]

    for name, value in (("cpu-2core", 0.5), ("electricity", 0.4), ("pue", 1.7)):
        assert main(["prices", "set", name, str(value), "--source", "new contract", "--db", sqlite_url]) == 0
        out = capsys.readouterr().out.strip().splitlines()
        assert len(out) == 2 and "keep the prices they recorded" in out[1] and "--usd-per-kwh" in out[1]
    edited = load_catalog(engine)
    assert [edited.get(name).value for name in ("cpu-2core", "electricity", "pue")] == [0.5, 0.4, 1.7]
    second = _bench_like_run(engine)

    costs = _run_costs(sqlite_url, capsys)
    assert costs[first] == before  # measured before the edit: its cost did not move
    prices = {run: (rc["node_hourly_usd"], rc["usd_per_kwh"], rc["pue"]) for run, rc in costs.items()}
    assert prices == {first: (old_node, old_kwh, old_pue), second: (0.5, 0.4, 1.7)}
    assert costs[second]["total_usd_per_1m"] > costs[first]["total_usd_per_1m"]
    for rc in costs.values():  # the device's own catalog entry, as recorded: not "priced as other hardware"
        assert rc["priced_as"] == "run price snapshot (cpu-2core)"
        assert rc["priced_differs_from_measured"] is False

    assert main(["cost", "--db", sqlite_url]) == 0
    text = capsys.readouterr().out
    assert f"run price snapshot (cpu-2core) at ${old_node:g}/h" in text
    assert "run price snapshot (cpu-2core) at $0.5/h" in text and "measured on" not in text

    # flags still price recorded runs at other prices
    assert main(["cost", "--db", sqlite_url, "--json", "--node-hourly-usd", "2", "--usd-per-kwh", "0.2"]) == 0
    flagged = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert {(r["node_hourly_usd"], r["usd_per_kwh"]) for r in flagged.values()} == {(2.0, 0.2)}
    engine.dispose()


def test_a_run_info_with_its_own_snapshot_keeps_it(sqlite_url):
    engine = open_store(sqlite_url)
    own = {"name": "H100 x8", "node_hourly_usd": 55.04, "usd_per_kwh": 0.12, "pue": 1.3}
    run_id = _bench_like_run(engine, replace(run_info(), device=CPU, price_snapshot=own))
    assert _snapshot(engine, run_id) == own
    engine.dispose()


def test_a_device_the_catalog_does_not_price_records_the_energy_prices_only(empty_store):
    engine = open_store(empty_store)
    set_price(engine, "electricity", 0.0, source="own solar")  # $0/kWh is a price, recorded as such
    catalog = load_catalog(engine)
    snap = price_snapshot(catalog, "TPU v5e", datetime(2026, 3, 1, 12, tzinfo=UTC))
    pue = catalog.get("pue").value
    assert snap == {"usd_per_kwh": 0.0, "pue": pue, "taken_at": "2026-03-01T12:00:00+00:00"}
    with pytest.raises(ValueError, match="no catalog price matches device 'TPU v5e'"):  # asks for a flag
        resolve_node_price(engine, device="TPU v5e", price_snapshot=snap, catalog=catalog)
    h100 = price_snapshot(catalog, "NVIDIA H100 80GB HBM3")
    assert (h100["name"], h100["node_hourly_usd"]) == ("H100", catalog.get("H100").value)
    price = resolve_node_price(engine, device="NVIDIA H100 80GB HBM3", price_snapshot=h100, catalog=catalog)
    assert price.origin == "snapshot" and not price.differs_from("NVIDIA H100 80GB HBM3")
    engine.dispose()


def test_prices_set_counts_the_recorded_runs_it_prices_because_they_recorded_no_node_price(sqlite_url, capsys):
    """A run on a device no entry priced when it started recorded no node price (only $/kWh and PUE): the entry
    added later prices it, and each edit of that entry re-prices it. `prices set` said every recorded run keeps
    its price; it now counts those it prices. Runs that recorded a node price are not counted."""
    from sqlalchemy.orm import Session
    from synthetic import Req, make_run

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for _ in range(2):
            make_run(s, "ar", device="Google TPU v5e", price_snapshot={"usd_per_kwh": 0.1, "pue": 1.5},
                     requests=[Req(100, e2e_ms=10_000)])
        make_run(s, "ar", device="Google TPU v5e", price_snapshot={"name": "TPU v5e", "node_hourly_usd": 1.0},
                 requests=[Req(100, e2e_ms=10_000)])
        s.commit()
    said = "note: 2 runs recorded without a node price for Google TPU v5e are priced by this entry"
    assert main(["prices", "set", "TPU v5e", "1.2", "--kind", "gpu", "--source", "list", "--db", sqlite_url]) == 0
    assert said in capsys.readouterr().out
    first = _run_costs(sqlite_url, capsys)
    assert main(["prices", "set", "TPU v5e", "2.4", "--source", "list", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert said + " (and by later edits of it)" in out, out
    then = _run_costs(sqlite_url, capsys)
    assert then[1]["hardware_usd_per_1m"] == pytest.approx(2 * first[1]["hardware_usd_per_1m"])  # as it says
    assert then[3]["hardware_usd_per_1m"] == first[3]["hardware_usd_per_1m"]  # recorded its own: kept
    assert main(["prices", "set", "electricity", "0.2", "--source", "list", "--db", sqlite_url]) == 0
    assert "recorded without a node price" not in capsys.readouterr().out  # not a node price

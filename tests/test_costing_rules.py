"""Costing rules the audit of session 36 found broken: recorded energy prices ($0/kWh is a price), projections
that compare spec and AR only within comparable configurations, speedups keyed on temperature and run kind."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session
from synthetic import Req, make_run, spec_req

from app.cli import main
from telemetry.costing import costs, project_from_store
from telemetry.store import open_store


def _snap_run(s, mode: str, snap: dict) -> None:
    req = (Req(33, ttft_ms=100, e2e_ms=900, energy_j=50.0) if mode == "ar"
           else spec_req(33, 4, 24, ttft_ms=100, e2e_ms=500, energy_j=30.0))
    make_run(s, mode, power_source="nvml", price_snapshot=snap, requests=[req])


def test_recorded_free_electricity_prices_the_runs_and_the_projection(sqlite_url, capsys):
    """$0/kWh is a price (own solar, a flat lease): a run that recorded it is costed at it (it was ignored as
    <= 0); a PUE below 1 is not one. The projection prices energy at the runs' recorded prices when they all
    agree (it used the catalog's), and says which it used."""
    engine = open_store(sqlite_url)
    snap = {"name": "cpu-2core", "node_hourly_usd": 0.0832, "usd_per_kwh": 0.0, "pue": 1.5}
    with Session(engine) as s:
        _snap_run(s, "ar", snap)
        _snap_run(s, "spec", snap)
        s.commit()
    run_costs, modes = costs(engine)
    assert {(rc.usd_per_kwh, rc.pue) for rc in run_costs} == {(0.0, 1.5)}
    assert all(mc.cost.energy_included and mc.cost.energy_usd_per_1m == 0.0 for mc in modes)
    kw = {"daily_tokens": 1e6, "peak_factor": 1.0, "sla_ms": 100.0}
    sp = project_from_store(engine, **kw)
    assert (sp.usd_per_kwh, sp.pue) == (0.0, 1.5)
    assert sp.energy_prices_from == "$/kWh recorded by the runs; PUE recorded by the runs"
    assert sp.projection.cost_per_1m_tokens_ar_usd == pytest.approx(1 * 0.0832 * 24 / 1e6 * 1e6)  # no energy $
    sp = project_from_store(engine, usd_per_kwh=0.2, **kw)
    assert sp.usd_per_kwh == 0.2 and sp.energy_prices_from.startswith("$/kWh given (--usd-per-kwh)")
    assert main(["project", "--db", sqlite_url, "--daily-tokens", "1e6", "--peak-factor", "1",
                 "--p95-tpot-sla-ms", "100"]) == 0
    assert "PUE 1.5, $0/kWh ($/kWh recorded by the runs; PUE recorded by the runs)" in capsys.readouterr().out

    with Session(engine) as s:  # a third run recorded other prices, one of them not a PUE: the catalog's
        _snap_run(s, "ar", {**snap, "usd_per_kwh": 0.3, "pue": 0.5})
        s.commit()
    run_costs, _ = costs(engine)
    assert (run_costs[-1].usd_per_kwh, run_costs[-1].pue) == (0.3, 1.2)  # PUE 0.5 ignored: the catalog's 1.2
    sp = project_from_store(engine, **kw)
    assert (sp.usd_per_kwh, sp.pue) == (0.13, 1.2)
    assert sp.energy_prices_from == ("$/kWh from the catalog (the runs recorded different ones); PUE from the "
                                     "catalog (not every run recorded a valid one)")

"""`specfinops cost`, `project` and `prices` through app.cli.main: output, JSON contract, one-line errors."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.orm import Session
from synthetic import Req, make_run, spec_req

from app.cli import main
from telemetry.costing import costs
from telemetry.queries import Filters
from telemetry.store import open_store

PROJECT_KEYS = {
    "nodes_ar",
    "nodes_spec",
    "cost_per_1m_tokens_ar_usd",
    "cost_per_1m_tokens_spec_usd",
    "annual_savings_usd",
    "capacity_tokens_per_s_ar",
    "capacity_tokens_per_s_spec",
    "monthly_cost_ar_usd",  # added: the monthly cost the text prints
    "monthly_cost_spec_usd",
    # added: the fleet cost per 1M served tokens under a name that says so (cost_per_1m_tokens_* hold the same)
    "fleet_cost_per_1m_served_tokens_ar_usd",
    "fleet_cost_per_1m_served_tokens_spec_usd",
    "assumptions",
}


@pytest.fixture
def filled(sqlite_url) -> str:
    """AR 66 tokens over 1.9 s (p95 TPOT 48.75 ms), spec 66 tokens over 1.5 s (p95 TPOT 12.5 ms), both
    on the 2-core CPU with an estimated power source."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(
            s,
            "ar",
            power_source="estimate",
            requests=[
                Req(33, ttft_ms=100, e2e_ms=900, start_s=0.0, energy_j=50.0),
                Req(33, ttft_ms=100, e2e_ms=1700, start_s=0.2, energy_j=50.0),
            ],
        )
        make_run(
            s,
            "spec",
            power_source="estimate",
            requests=[
                spec_req(33, 4, 24, ttft_ms=100, e2e_ms=500, start_s=0.0, energy_j=30.0),
                spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500, start_s=1.0, energy_j=30.0),
            ],
        )
        s.commit()
    return sqlite_url


def _project(url: str, *extra: str) -> list[str]:
    return [
        "project",
        "--db",
        url,
        "--daily-tokens",
        "8.64e6",
        "--peak-factor",
        "1.5",
        "--p95-tpot-sla-ms",
        "50",
        *extra,
    ]


def test_project_json_contract(filled, capsys):
    assert main([*_project(filled, "--node-hourly-usd", "2.5"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == PROJECT_KEYS
    a = out["assumptions"]
    for key in (
        "node_hourly_usd",
        "daily_tokens",
        "peak_factor",
        "p95_tpot_sla_ms",
        "priced_as",
        "measured_on",
        "pue",
        "usd_per_kwh",
    ):
        assert key in a
    assert a["node_hourly_usd"] == 2.5 and a["daily_tokens"] == 8.64e6 and a["peak_factor"] == 1.5
    # 100 tokens/s average x 1.5 peak = 150 tokens/s; AR 66/1.9 = 34.7 -> 5 nodes; spec 66/1.5 = 44 -> 4
    assert out["capacity_tokens_per_s_ar"] == pytest.approx(66 / 1.9)
    assert out["capacity_tokens_per_s_spec"] == pytest.approx(44.0)
    assert (out["nodes_ar"], out["nodes_spec"]) == (5, 4)
    assert out["annual_savings_usd"] == pytest.approx(1 * 2.5 * 8760)
    # a custom price is the measured hardware's: its energy (100 J / 66 tokens, PUE 1.2, $0.13/kWh) stays in
    energy = 100 / 66 * 1e6 / 3.6e6 * 1.2 * 0.13
    assert out["cost_per_1m_tokens_ar_usd"] == pytest.approx(5 * 2.5 * 24 / 8.64e6 * 1e6 + energy)
    # the old keys hold the fleet cost per 1M served tokens (peak-sized, whole nodes), as the new keys name it
    assert out["fleet_cost_per_1m_served_tokens_ar_usd"] == out["cost_per_1m_tokens_ar_usd"]
    assert out["fleet_cost_per_1m_served_tokens_spec_usd"] == out["cost_per_1m_tokens_spec_usd"]


def test_project_gpu_pricing_says_priced_as_and_measured_on(filled, capsys):
    assert main(_project(filled, "--gpu", "h100")) == 0
    out = capsys.readouterr().out
    assert "priced as H100 at $6.88/h, measured on cpu (2 cores)" in out
    assert "nodes needed: AR 5, spec 4" in out
    assert "annual savings: $60,269" in out  # 1 node x $6.88 x 8760
    assert "replicas" not in out


def test_gpus_per_node_multiplies_the_node_capacity_as_well_as_its_price(sqlite_url, capsys):
    """A node of N GPUs is N replicas of the measured device: N x the price and N x the measured tokens/s,
    so the node count shrinks by N (it used to stay put, pricing one measured device as N GPUs)."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:  # AR 10 tokens/s, spec 20 tokens/s, each over 10 s
        make_run(s, "ar", requests=[Req(100, ttft_ms=100, e2e_ms=10_000)])
        make_run(s, "spec", requests=[spec_req(200, 4, 150, ttft_ms=100, e2e_ms=10_000)])
        s.commit()
    # 8.64e6 tokens/day = 100 tokens/s average, x 1.6 peak = 160 tokens/s
    args = ["project", "--db", sqlite_url, "--daily-tokens", "8.64e6", "--peak-factor", "1.6",
            "--p95-tpot-sla-ms", "200", "--gpu", "H100"]
    got = {}
    for n in ("1", "2", "8"):
        assert main([*args, "--gpus-per-node", n, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        got[n] = (out["nodes_ar"], out["nodes_spec"], out["capacity_tokens_per_s_ar"])
        assert out["assumptions"]["gpus_per_node"] == int(n)
    assert got["1"] == (16, 8, pytest.approx(10.0))
    assert got["2"] == (8, 4, pytest.approx(20.0))
    assert got["8"] == (2, 1, pytest.approx(80.0))
    assert main([*args, "--gpus-per-node", "8"]) == 0
    out = capsys.readouterr().out
    assert "capacity per node = 8 x the measured device" in out and "nodes needed: AR 2, spec 1" in out


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--gpu", "H100", "--gpus-per-node", "1e30"], "--gpus-per-node must be a whole number in 1..64"),
        (["--gpu", "H100", "--gpus-per-node", "65"], "--gpus-per-node must be a whole number in 1..64"),
        (["--gpu", "H100", "--gpus-per-node", "2.5"], "--gpus-per-node must be a whole number in 1..64"),
        (["--gpu", "cpu-2core", "--gpus-per-node", "2"], "'cpu-2core' is a node price"),
        (["--gpu", "cpu-2core", "--gpus-per-node", "1"], "'cpu-2core' is a node price"),
        (["--node-hourly-usd", "3", "--gpus-per-node", "2"], "--gpus-per-node needs --gpu NAME"),
    ],
)
def test_gpus_per_node_is_bounded_and_only_for_gpu_prices(filled, capsys, extra, needle):
    assert main(_project(filled, *extra)) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and captured.out == ""


def test_project_from_store_guards_gpus_per_node(filled):
    from telemetry.costing import project_from_store

    engine = open_store(filled)
    kw = {"daily_tokens": 1e6, "peak_factor": 1.0, "sla_ms": 50.0}
    for bad in (0, 65, 10**30, 2.0, True):
        with pytest.raises(ValueError, match="1..64"):
            project_from_store(engine, gpu="H100", gpus_per_node=bad, **kw)
    with pytest.raises(ValueError, match="node price"):
        project_from_store(engine, gpu="cpu-2core", gpus_per_node=2, **kw)


def test_project_says_where_the_sla_matters_and_signs_dollars_before_the_symbol(filled, capsys):
    """Spec's p95 TPOT (12.5 ms) meets SLAs AR's (48.75 ms) does not, and it delivers more: speculation needs
    fewer nodes from 12.5 ms on. A loss reads -$X, not $-X."""
    assert main(_project(filled, "--gpu", "h100")) == 0
    out = capsys.readouterr().out
    assert "where the SLA matters: speculation needs fewer nodes than AR at p95 TPOT SLAs of 12.5 ms and looser" in out
    from app.commands.cost import _usd

    assert (_usd(-17492.4), _usd(-0.25), _usd(-12.5), _usd(3.0)) == ("-$17,492", "-$0.25", "-$12.50", "$3.00")


def test_project_says_what_a_month_of_its_monthly_cost_is(filled, capsys):
    """The monthly cost is node-hours x 730; the line says so (nowhere a user read it was it defined)."""
    assert main(_project(filled, "--node-hourly-usd", "2")) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("monthly cost:")]
    assert line.endswith("(nodes x node $/h x 730 hours a month (8,760 a year / 12); node-hours only)"), line


def test_project_json_has_the_monthly_cost_the_text_prints(filled, capsys):
    """`project` printed a monthly cost per mode that --json did not have."""
    assert main(_project(filled, "--node-hourly-usd", "2")) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("monthly cost:")]
    assert main([*_project(filled, "--node-hourly-usd", "2"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    from app.commands.cost import _usd

    # 5 and 4 nodes x $2/h x 730 h
    assert (out["monthly_cost_ar_usd"], out["monthly_cost_spec_usd"]) == pytest.approx((5 * 2 * 730, 4 * 2 * 730))
    assert line.startswith(f"monthly cost: AR {_usd(out['monthly_cost_ar_usd'])}, "
                           f"spec {_usd(out['monthly_cost_spec_usd'])} (")
    assert out["assumptions"]["monthly_cost_basis"] == (
        "nodes x node $/h x 730 hours a month (8,760 a year / 12); node-hours only")


def _cpu_priced_tpu_unpriced(sqlite_url, tpu_ar_tokens: int = 100):
    """(engine, (cpu AR run, TPU AR run, TPU spec run)): the CPU run priced by the catalog, the TPU ones by none."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        cpu = make_run(s, "ar", device="cpu (2 cores)", requests=[Req(100, ttft_ms=100, e2e_ms=10_000)]).id
        tpu_ar = make_run(s, "ar", device="Google TPU v5e",
                          requests=[Req(tpu_ar_tokens, ttft_ms=100, e2e_ms=10_000)]).id
        tpu_spec = make_run(s, "spec", device="Google TPU v5e",
                            requests=[spec_req(100, 4, 60, ttft_ms=100, e2e_ms=5_000)]).id
        s.commit()
    return engine, (cpu, tpu_ar, tpu_spec)


def test_cost_shows_the_priced_runs_and_names_the_unpriced_with_their_costs_missing(sqlite_url, capsys):
    """One run on a device no price covers failed `cost` as a whole: the priced runs' costs are shown, the
    others' are missing ("—", null in --json, never 0), and a warning names them and how to price them."""
    engine, (cpu, tpu_ar, tpu_spec) = _cpu_priced_tpu_unpriced(sqlite_url)
    priced, _ = costs(engine, Filters(run_ids=(cpu,)))
    assert main(["cost", "--db", sqlite_url]) == 0  # some runs priced: the figures are shown
    out = capsys.readouterr().out
    rows = {int(line.split()[0]): line for line in out.splitlines() if line.split() and line.split()[0].isdigit()}
    assert set(rows) == {cpu, tpu_ar, tpu_spec}
    assert priced[0].node_price.priced_as in rows[cpu] and "—" not in rows[cpu]
    for run in (tpu_ar, tpu_spec):
        assert rows[run].split()[6:9] == ["—", "—", "—"] and "$0" not in rows[run], rows[run]
        assert rows[run].endswith("no price (device Google TPU v5e)"), rows[run]
    [warning] = [x for x in out.splitlines() if x.startswith("warning: no price for")]
    assert f"runs {tpu_ar}-{tpu_spec} (device 'Google TPU v5e')" in warning
    assert "`specfinops prices set NAME X --kind gpu|node --source ...`" in warning and "--gpu NAME" in warning
    assert f"spec  run {tpu_spec}: cost — (no price; see the warning)" in out
    assert f"left out: run {tpu_ar} (no price; see the warning)" in out

    assert main(["cost", "--db", sqlite_url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_run = {r["run_id"]: r for r in doc["runs"]}
    assert by_run[cpu]["priced"] is True and by_run[cpu]["total_usd_per_1m"] == pytest.approx(
        priced[0].cost.total_usd_per_1m)
    for run in (tpu_ar, tpu_spec):
        r = by_run[run]
        assert r["priced"] is False and r["measured_on"] == "Google TPU v5e" and r["output_tokens"] == 100
        assert all(r[k] is None for k in ("hardware_usd_per_1m", "energy_usd_per_1m", "total_usd_per_1m",
                                           "node_hourly_usd", "priced_as")), r
    assert doc["unpriced"] == [{"device": "Google TPU v5e", "run_ids": [tpu_ar, tpu_spec]}]
    # spec has no priced run: it is listed with its figures null (test_cost_json_modes_say_how_many_runs_...)
    assert [m["mode"] for m in doc["modes"]] == ["spec", "ar"] and doc["modes"][1]["run_ids"] == [cpu]
    assert any(n.startswith("no price for runs") and "prices set" in n for n in doc["notes"])


COST_FIGURES = ("hardware_usd_per_1m", "energy_usd_per_1m", "total_usd_per_1m")


def test_cost_json_modes_say_how_many_runs_their_cost_covers(sqlite_url, capsys):
    """`cost` said "left out" of a mode's figure over only some of its runs, but --json's modes did not: a
    consumer read AR's cost per 1M tokens as the whole mode's. Each mode says how many of its runs the figure
    covers (num_priced_runs of num_runs) and which it leaves out; a mode none of whose runs is priced is listed
    with its figures null, never 0 (it was missing from modes altogether)."""
    engine, (cpu, tpu_ar, tpu_spec) = _cpu_priced_tpu_unpriced(sqlite_url, tpu_ar_tokens=300)
    [priced], _ = costs(engine, Filters(run_ids=(cpu,)))
    assert main(["cost", "--db", sqlite_url, "--json"]) == 0
    modes = {m["mode"]: m for m in json.loads(capsys.readouterr().out)["modes"]}
    ar, spec = modes["ar"], modes["spec"]
    assert (ar["num_priced_runs"], ar["num_runs"]) == (1, 2)
    assert ar["run_ids"] == [cpu] and ar["unpriced_run_ids"] == [tpu_ar]
    assert ar["cost_priced_over"] == f"over 1 of 2 runs; run {tpu_ar} (device 'Google TPU v5e') has no price"
    # the figure is the priced run's alone: the unpriced run's 300 tokens are not in it
    assert ar["output_tokens"] == 100
    assert ar["total_usd_per_1m"] == pytest.approx(priced.cost.total_usd_per_1m)

    assert set(spec) == set(ar)  # the same keys as a priced mode's
    assert (spec["num_priced_runs"], spec["num_runs"]) == (0, 1)
    assert spec["run_ids"] == [] and spec["unpriced_run_ids"] == [tpu_spec]
    assert spec["cost_priced_over"] == (f"no price for any of its 1 run: run {tpu_spec} (device 'Google TPU v5e') "
                                        "has none")
    assert all(spec[k] is None for k in (*COST_FIGURES, "tokens_per_s", "wall_s", "output_tokens")), spec
    assert spec["reason"] == "no price for device 'Google TPU v5e'"


def test_export_of_costs_refuses_runs_no_price_covers(sqlite_url, tmp_path, capsys):
    """Unlike `cost`, `export --what cost` (one row per run, no per-mode figure) refuses a selection holding a
    run no price covers, naming it, and writes no file: a CSV never holds a run with its costs missing."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", device="cpu (2 cores)", requests=[Req(100, ttft_ms=100, e2e_ms=10_000)])
        tpu = make_run(s, "ar", device="Google TPU v5e", requests=[Req(100, ttft_ms=100, e2e_ms=10_000)]).id
        s.commit()
    out = tmp_path / "cost.csv"
    assert main(["export", "--db", sqlite_url, "--what", "cost", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"run {tpu} (device 'Google TPU v5e')" in err and "prices set" in err
    assert not out.exists()


def test_cost_json_modes_of_only_priced_runs_cover_all_of_them(filled, capsys):
    assert main(["cost", "--db", filled, "--json"]) == 0
    modes = json.loads(capsys.readouterr().out)["modes"]
    assert [(m["mode"], m["num_priced_runs"], m["num_runs"]) for m in modes] == [("spec", 1, 1), ("ar", 1, 1)]
    assert all(m["unpriced_run_ids"] == [] and m["cost_priced_over"] is None for m in modes)
    assert all(m[k] is not None for m in modes for k in COST_FIGURES)


def test_project_prices_every_run_of_its_group_or_none(sqlite_url, capsys):
    """`project` prices its whole comparable group at one node price: never over some of its runs, as `cost`'s
    modes may be. Where one run recorded a price, another none and no catalog entry covers the device it
    refuses, saying that only some recorded one (it said "the runs recorded no price"); a flag prices them all."""
    engine = open_store(sqlite_url)
    snap = {"node_hourly_usd": 3.0, "name": "our-node"}
    with Session(engine) as s:
        for priced in (snap, None):
            make_run(s, "ar", device="mystery", price_snapshot=priced, requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        make_run(s, "spec", device="mystery", price_snapshot=snap,
                 requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500)])
        s.commit()
    assert main([*_project(sqlite_url), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [err] = captured.err.strip().splitlines()
    assert "only some of the runs recorded a price ($3/h)" in err and "'mystery'" in err
    assert "--node-hourly-usd X" in err
    assert main([*_project(sqlite_url, "--node-hourly-usd", "3"), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["assumptions"]
    assert a["capacity_runs_ar"] == [1, 2] and a["node_hourly_usd"] == 3.0


def test_project_says_the_savings_in_nodes(filled, capsys):
    """A negative dollar figure alone left a reader to work out that speculation costs more: the savings line
    says which mode needs fewer nodes and by how many."""
    assert main(_project(filled, "--node-hourly-usd", "2")) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("annual savings:")]
    assert line.endswith("fewer nodes than AR)") or line.endswith("fewer node than AR)"), line
    from telemetry.finops import nodes_verdict

    assert nodes_verdict(10, 12) == "speculation needs 2 more nodes than AR: it costs more than it saves here"
    assert nodes_verdict(399, 251) == "speculation needs 148 fewer nodes than AR"
    assert nodes_verdict(1, 1) == "both modes need 1 node: speculation saves no node"
    assert nodes_verdict(None, 3) is None and nodes_verdict(3, None) is None


def test_project_unreachable_sla_is_null_with_message(filled, capsys):
    args = [
        "project",
        "--db",
        filled,
        "--daily-tokens",
        "1e6",
        "--peak-factor",
        "1",
        "--p95-tpot-sla-ms",
        "5",
        "--node-hourly-usd",
        "1",
    ]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nodes_ar"] is None and out["nodes_spec"] is None and out["annual_savings_usd"] is None
    assert any("not attainable" in n for n in out["assumptions"]["notes"])
    assert main(args) == 0
    assert "nodes needed: AR not attainable, spec not attainable" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--daily-tokens", "0", "--peak-factor", "1", "--p95-tpot-sla-ms", "50", "--gpu", "H100"],
            "--daily-tokens",
        ),
        (
            ["--daily-tokens", "-5", "--peak-factor", "1", "--p95-tpot-sla-ms", "50", "--gpu", "H100"],
            "--daily-tokens",
        ),
        (
            ["--daily-tokens", "lots", "--peak-factor", "1", "--p95-tpot-sla-ms", "50", "--gpu", "H100"],
            "--daily-tokens",
        ),
        (
            ["--daily-tokens", "1e6", "--peak-factor", "0.5", "--p95-tpot-sla-ms", "50", "--gpu", "H100"],
            "--peak-factor",
        ),
        (
            ["--daily-tokens", "1e6", "--peak-factor", "1", "--p95-tpot-sla-ms", "0", "--gpu", "H100"],
            "--p95-tpot-sla-ms",
        ),
        (["--daily-tokens", "1e6", "--peak-factor", "1", "--p95-tpot-sla-ms", "50", "--gpu", "B200"], "B200"),
        (
            [
                "--daily-tokens",
                "1e6",
                "--peak-factor",
                "1",
                "--p95-tpot-sla-ms",
                "50",
                "--gpu",
                "H100",
                "--node-hourly-usd",
                "3",
            ],
            "not both",
        ),
        (
            [
                "--daily-tokens",
                "1e6",
                "--peak-factor",
                "1",
                "--p95-tpot-sla-ms",
                "50",
                "--gpu",
                "H100",
                "--gpus-per-node",
                "0",
            ],
            "--gpus-per-node",
        ),
        (["--peak-factor", "1", "--p95-tpot-sla-ms", "50", "--gpu", "H100"], "--daily-tokens"),
    ],
)
def test_project_bad_input_is_one_line_exit_2(filled, capsys, args, needle):
    assert main(["project", "--db", filled, *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("specfinops project: error:")
    assert captured.out == ""


def test_empty_store_names_the_command_that_fills_it(sqlite_url, capsys):
    assert (
        main(
            [
                "project",
                "--db",
                sqlite_url,
                "--daily-tokens",
                "1e6",
                "--peak-factor",
                "1",
                "--p95-tpot-sla-ms",
                "50",
                "--node-hourly-usd",
                "1",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "specfinops bench" in err[0]
    assert main(["cost", "--db", sqlite_url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "specfinops bench" in err[0]


def test_cost_text_labels_estimated_energy_and_price_origin(filled, capsys):
    assert main(["cost", "--db", filled]) == 0
    out = capsys.readouterr().out
    assert "(estimated)" in out and "cpu-2core" in out
    assert "measured on" not in out  # the catalog price of the measured device
    assert main(["cost", "--db", filled, "--gpu", "H100"]) == 0
    assert "priced as H100, measured on cpu (2 cores)" in capsys.readouterr().out


def test_cost_json_matches_the_query_functions(filled, capsys):
    assert main(["cost", "--db", filled, "--json", "--node-hourly-usd", "3.6"]) == 0
    out = json.loads(capsys.readouterr().out)
    runs, modes = costs(open_store(filled), node_hourly_usd=3.6)
    assert [r["run_id"] for r in out["runs"]] == [rc.run.run_id for rc in runs]
    spec = next(m for m in out["modes"] if m["mode"] == "spec")
    assert spec["tokens_per_s"] == pytest.approx(44.0)
    assert spec["hardware_usd_per_1m"] == pytest.approx(3.6 * 1.5 / 3600 / 66 * 1e6)
    assert spec["energy_estimated"] is True and spec["energy_usd_per_1m"] is not None
    assert spec["total_usd_per_1m"] == pytest.approx(
        next(m for m in modes if m.mode == "spec").cost.total_usd_per_1m
    )


def test_cost_single_run_and_unknown_run(filled, capsys):
    assert main(["cost", "--db", filled, "--run", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in out["runs"]] == [2] and [m["mode"] for m in out["modes"]] == ["spec"]
    assert main(["cost", "--db", filled, "--run", "77"]) == 2
    assert "--run 77" in capsys.readouterr().err


def test_prices_list_and_set(sqlite_url, capsys):
    assert main(["prices", "--db", sqlite_url, "--json"]) == 0
    entries = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    assert entries["H100"]["value"] == 6.88 and "p5.48xlarge" in entries["H100"]["source"]
    assert {"cpu-2core", "electricity", "pue", "L4", "A100-80GB", "A100-80GB-lambda", "H100-SXM"} <= set(
        entries
    )
    assert all(e["source"] and e["as_of"] for e in entries.values())

    assert main(["prices", "set", "h100", "5.5", "--source", "our EDP rate", "--db", sqlite_url]) == 0
    capsys.readouterr()
    assert main(["prices", "list", "--json", "--db", sqlite_url]) == 0
    entries = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    assert entries["H100"]["value"] == 5.5 and entries["H100"]["source"] == "our EDP rate"

    assert (
        main(["prices", "set", "my-node", "12", "--kind", "node", "--source", "TCO", "--db", sqlite_url]) == 0
    )
    capsys.readouterr()
    for bad, needle in (
        (["set", "H100", "0", "--source", "x"], "must be > 0"),
        (["set", "H100", "4"], "--source"),
        (["set", "new-gpu", "4", "--source", "x"], "kind"),
        (["set", "pue", "0.8", "--source", "x"], "PUE"),
        (["frobnicate"], "action"),
    ):
        assert main(["prices", "--db", sqlite_url, *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0]


def test_prices_table_has_a_header(sqlite_url, capsys):
    assert main(["prices", "--db", sqlite_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["name", "kind", "value", "unit"] and lines[0].rstrip().endswith("source")
    assert any(line.startswith("H100 ") for line in lines[1:])


@pytest.fixture
def mixed_energy(sqlite_url) -> str:
    """One configuration per mode, pooled from an estimated run with energy on every request and a measured
    (nvml) run with one request missing its energy: `cost` calls that energy not measured."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for mode in ("ar", "spec"):
            req = (lambda **kw: Req(33, ttft_ms=100, e2e_ms=900, **kw)) if mode == "ar" else (
                lambda **kw: spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500, **kw))
            make_run(s, mode, power_source="estimate", requests=[req(energy_j=40.0)])
            make_run(s, mode, power_source="nvml", requests=[req(energy_j=40.0), req(start_s=1.0, energy_j=None)])
        s.commit()
    return sqlite_url


def test_project_leaves_out_energy_that_cost_calls_not_measured(mixed_energy, capsys):
    _, modes = costs(open_store(mixed_energy), gpu="cpu-2core")
    assert all(not mc.cost.energy_included for mc in modes)
    assert main([*_project(mixed_energy, "--gpu", "cpu-2core"), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["assumptions"]
    assert a["energy_included_ar"] is False and a["energy_included_spec"] is False
    assert a["energy_estimated"] is False
    assert main(_project(mixed_energy, "--gpu", "cpu-2core")) == 0
    out = capsys.readouterr().out
    assert "incl. energy" not in out and "AR $" in out and "(node price only)" in out


def test_project_labels_energy_of_mixed_sources_estimated_per_mode(sqlite_url, capsys):
    """AR pools an estimated and a measured run, both complete: its energy is labelled estimated; spec's is
    measured only and is not."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", power_source="estimate", requests=[Req(33, ttft_ms=100, e2e_ms=900, energy_j=40.0)])
        make_run(s, "ar", power_source="nvml", requests=[Req(33, ttft_ms=100, e2e_ms=900, energy_j=40.0)])
        make_run(s, "spec", power_source="nvml", requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500,
                                                                    energy_j=30.0)])
        s.commit()
    assert main([*_project(sqlite_url, "--gpu", "cpu-2core"), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["assumptions"]
    assert a["energy_included_ar"] and a["energy_included_spec"]
    assert (a["energy_estimated_ar"], a["energy_estimated_spec"], a["energy_estimated"]) == (True, False, True)
    assert main(_project(sqlite_url, "--gpu", "cpu-2core")) == 0
    out = capsys.readouterr().out
    # AR pools an estimated and a metered run: partly estimated, as `cost` says it
    assert "(incl. energy (partly estimated)), spec" in out and out.rstrip().count("estimated)") == 1


def test_cost_priced_as_other_hardware_is_one_line_naming_the_runs(filled, capsys):
    with Session(open_store(filled)) as s:
        for _ in range(3):
            make_run(s, "ar", requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        s.commit()
    assert main(["cost", "--db", filled, "--gpu", "H100"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "measured on" in line]
    # runs 1-2 estimated their energy (the others have none): it is not called measured
    assert lines == ["runs 1-5: priced as H100, measured on cpu (2 cores); the energy estimated there is not that "
                     "hardware's: left out (hardware only)"]
    from telemetry.costing import ids_text

    assert (ids_text([7]), ids_text([1, 2, 4, 6, 7, 8])) == ("run 7", "runs 1-2, 4, 6-8")


def test_filters_matching_nothing_name_the_filter_and_the_values_in_the_store(filled, capsys):
    """A filter that matches nothing is not an empty store: say which filter and what the store holds."""
    for args, needle in (
        (["--workload", "nosuch"], "no runs with workload 'nosuch' (workloads in the store: code)"),
        (["--target", "nosuch"], "no runs with target 'nosuch' (targets in the store: demo/target-tiny)"),
        (["--node", "nosuch"], "no runs with node 'nosuch' (nodes in the store: node-a)"),
        (["--run", "1", "--workload", "chat"], "--run 1: run 1 has workload 'code', not 'chat'"),
        (["--run", "77"], "--run 77: no run 77 in the store (runs in the store: 1, 2)"),
    ):
        assert main(["cost", "--db", filled, *args]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0] and "specfinops bench" not in err[0], (args, err)
    assert main([*_project(filled, "--node-hourly-usd", "1"), "--workload", "nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no runs with workload 'nosuch' (workloads in the store: code)" in err[0]
    with Session(open_store(filled)) as s:
        make_run(s, "ar", workload="chat", node_id="node-b", requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        make_run(s, "ar", workload="chat", requests=[])
        s.commit()
    assert main(["cost", "--db", filled, "--workload", "code", "--node", "node-b"]) == 2
    assert "no run has workload 'code' and node 'node-b' together" in capsys.readouterr().err
    assert main(["cost", "--db", filled, "--run", "4"]) == 2
    assert "--run 4: run 4 has no requests" in capsys.readouterr().err


def test_gpus_per_node_of_the_measured_gpu_keeps_the_energy_part(sqlite_url, capsys):
    """N replicas of the measured H100 use the measured J/token: the energy part stays in, per mode."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        h100 = "NVIDIA H100 80GB HBM3"
        make_run(s, "ar", device=h100, power_source="nvml",
                 requests=[Req(100, ttft_ms=100, e2e_ms=10_000, energy_j=500.0)])
        make_run(s, "spec", device=h100, power_source="nvml",
                 requests=[spec_req(200, 4, 150, ttft_ms=100, e2e_ms=10_000, energy_j=600.0)])
        s.commit()
    args = ["project", "--db", sqlite_url, "--daily-tokens", "8.64e6", "--peak-factor", "1.6",
            "--p95-tpot-sla-ms", "200", "--gpu", "H100", "--json"]
    for n in ("1", "8"):
        assert main([*args, "--gpus-per-node", n]) == 0
        a = json.loads(capsys.readouterr().out)["assumptions"]
        assert a["energy_included_ar"] and a["energy_included_spec"] and not a["priced_differs_from_measured"]


def test_cost_mode_lines_name_their_runs_not_a_count(filled, capsys):
    """'spec  runs 2: ...' read as two runs; it is run id 2."""
    with Session(open_store(filled)) as s:
        for _ in range(3):
            make_run(s, "ar", requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        s.commit()
    assert main(["cost", "--db", filled]) == 0
    out = capsys.readouterr().out
    assert "\nspec  run 2: 66 tokens" in out
    assert "\nar    runs 1, 3-5: 165 tokens" in out


def test_cost_mode_line_says_how_many_runs_have_energy(sqlite_url, capsys):
    """A mode with one run's energy estimated and one run without energy: the total is hardware only, and the
    line says so without claiming that energy was not measured at all."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "spec", power_source="none", requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500)])
        make_run(s, "spec", power_source="estimate",
                 requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500, energy_j=30.0)])
        s.commit()
    assert main(["cost", "--db", sqlite_url]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("spec  runs 1-2:"))
    assert "estimated energy for 1 of 2 runs: hardware only" in line
    assert "not measured" not in line


def test_project_prices_like_cost_without_pricing_flags(filled, capsys):
    """No --gpu / --node-hourly-usd: the catalog price of the measured device, as `cost` and `report` do (it
    refused with 'node pricing missing')."""
    assert main([*_project(filled), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["assumptions"]
    assert a["priced_as"] == "cpu-2core" and a["priced_differs_from_measured"] is False
    _, modes = costs(open_store(filled))
    assert {mc.priced_as for mc in modes} == {("cpu-2core",)}


def test_project_uses_the_runs_recorded_price(sqlite_url, capsys):
    engine = open_store(sqlite_url)
    snap = {"node_hourly_usd": 3.0, "name": "our-node"}
    with Session(engine) as s:
        make_run(s, "ar", price_snapshot=snap, requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        make_run(s, "spec", price_snapshot=snap, requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500)])
        s.commit()
    assert main([*_project(sqlite_url), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["assumptions"]
    assert a["node_hourly_usd"] == 3.0 and "our-node" in a["priced_as"]


def test_project_without_any_price_names_the_flags(sqlite_url, capsys):
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", device="mystery-accelerator", requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        s.commit()
    assert main(_project(sqlite_url)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'mystery-accelerator'" in err[0]
    assert "--gpu NAME [--gpus-per-node N] or --node-hourly-usd X" in err[0]


def test_project_help_says_how_the_node_is_priced(capsys):
    with pytest.raises(SystemExit):
        main(["project", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "the catalog price of the measured device" in out and "--gpu NAME [--gpus-per-node N]" in out


def test_cost_names_the_runs_that_did_not_complete(sqlite_url, capsys):
    """A bench killed or interrupted leaves its run 'running' or 'cancelled'; its finished requests still
    count, but cost says which runs were cut short (table and JSON) instead of pricing them silently."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        make_run(s, "ar", status="cancelled", requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        make_run(s, "spec", status="running", requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500)])
        s.commit()
    engine.dispose()
    assert main(["cost", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert "not every run completed: run 2 cancelled; run 3 running (in progress, or its process was killed)" in out
    assert main(["cost", "--db", sqlite_url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in doc["runs"]] == ["completed", "cancelled", "running"]
    assert {m["mode"]: m["incomplete_run_ids"] for m in doc["modes"]} == {"ar": [2], "spec": [3]}


def test_cost_of_completed_runs_only_says_nothing_about_incomplete_ones(filled, capsys):
    assert main(["cost", "--db", filled]) == 0
    assert "not every run completed" not in capsys.readouterr().out


def test_a_time_window_that_matches_nothing_is_named_in_utc(filled):
    """The reason (the dashboard's caption, report and export errors) names the window's bounds as UTC
    minutes in a sentence, not as Python datetimes after 'with'."""
    from datetime import UTC, datetime, timedelta, timezone

    from telemetry.costing import no_runs_reason
    from telemetry.queries import Filters

    engine = open_store(filled, must_exist=True)
    west = timezone(timedelta(hours=-8))
    f = Filters(since=datetime(2030, 1, 1, tzinfo=UTC), until=datetime(2030, 1, 1, 16, tzinfo=west), domain="code")
    reason = no_runs_reason(engine, f)
    assert reason.endswith("no requests in domain 'code' started between 2030-01-01 00:00 UTC and "
                           "2030-01-02 00:00 UTC"), reason


def test_cost_json_mode_reason_says_how_many_runs_have_energy_and_where_it_comes_from(sqlite_url, capsys):
    """The mode's JSON said "energy not measured" when only some runs had (estimated) energy: it now gives the
    CLI's words. energy_estimated and energy_source say where the mode's energy figures come from, in its total
    or not (energy_included says which), as its runs' fields and a report's modes say it: the mode's said false
    and null where a report of the same runs said true and 'estimated'. A run without energy is not 'estimated'."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "spec", power_source="estimate", requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500)])
        make_run(s, "spec", power_source="estimate",
                 requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500, energy_j=30.0)])
        make_run(s, "ar", power_source="estimate", requests=[Req(33, ttft_ms=100, e2e_ms=900, energy_j=50.0)])
        s.commit()
    assert main(["cost", "--db", sqlite_url, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    modes = {m["mode"]: m for m in out["modes"]}
    spec = modes["spec"]
    assert spec["reason"] == "estimated energy for 1 of 2 runs: hardware only"
    assert spec["energy_included"] is False and spec["total_usd_per_1m"] == spec["hardware_usd_per_1m"]
    assert spec["energy_estimated"] is True and spec["energy_source"] == "estimated"  # the 1 run's energy figure
    ar = modes["ar"]  # estimated energy in the total: still labelled so
    assert ar["energy_included"] is True and ar["energy_estimated"] is True and ar["reason"] is None
    assert ar["energy_source"] == "estimated"
    run1 = next(r for r in out["runs"] if r["run_id"] == 1)
    assert run1["reason"] == "energy not measured" and run1["energy_estimated"] is False


def test_energy_of_only_some_requests_is_said_so_not_said_unmeasured(sqlite_url, capsys):
    """A run whose meter read some of its requests only: the run's JSON said so, while its row, its mode's line and
    the mode's JSON said "not measured"."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "spec", power_source="nvml", requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500, energy_j=30.0),
                                                            spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500)])
        s.commit()
    assert main(["cost", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert "partial (some requests)" in out and "not measured" not in out, out
    assert main(["cost", "--db", sqlite_url, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["runs"][0]["reason"] == "measured energy for only some requests: hardware only"
    [spec] = got["modes"]
    assert spec["reason"] == "measured energy for only some requests (1 of 1 runs): hardware only"
    assert spec["energy_included"] is False and spec["energy_usd_per_1m"] is None


def test_a_price_of_the_same_chip_elsewhere_keeps_the_measured_energy(sqlite_url, capsys):
    """Runs measured on an H100 priced at Lambda's H100-SXM, or at a user's own H100 contract: the same chip, so
    its measured energy stays in the cost and no 'other hardware' is said. Only the device's own catalog entry
    (H100) counted as that hardware; an L4 price still does not."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for mode in ("ar", "spec"):
            make_run(s, mode, device="NVIDIA H100 80GB HBM3", power_source="nvml",
                     requests=[Req(33, ttft_ms=100, e2e_ms=900, energy_j=50.0)])
        s.commit()
    assert main(["prices", "set", "my-h100-reserved", "4.1", "--kind", "gpu", "--source", "contract",
                 "--db", sqlite_url]) == 0
    capsys.readouterr()
    for gpu in ("H100-SXM", "my-h100-reserved"):
        assert main(["cost", "--db", sqlite_url, "--gpu", gpu, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert all(r["energy_included"] and not r["priced_differs_from_measured"] for r in out["runs"]), gpu
        assert main(_project(sqlite_url, "--gpu", gpu)) == 0
        assert "not that hardware's" not in capsys.readouterr().out
    for other in ("L4", "H100 x8"):  # another chip; eight of them
        if other == "H100 x8":
            assert main(["prices", "set", other, "55.04", "--kind", "node", "--source", "p5", "--db", sqlite_url]) == 0
            capsys.readouterr()
        assert main(["cost", "--db", sqlite_url, "--gpu", other, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert all(not r["energy_included"] and r["priced_differs_from_measured"] for r in out["runs"]), other


def test_a_cpu_node_of_another_size_is_other_hardware(sqlite_url, capsys):
    """cpu-64core priced runs measured on a 2-core CPU as that CPU: energy kept, no warning (a family match)."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for mode in ("ar", "spec"):
            make_run(s, mode, power_source="rapl", requests=[Req(33, ttft_ms=100, e2e_ms=900, energy_j=5.0)])
        s.commit()
    assert main(["prices", "set", "cpu-64core", "2.448", "--kind", "node", "--source", "t", "--db", sqlite_url]) == 0
    capsys.readouterr()
    assert main(["cost", "--db", sqlite_url, "--gpu", "cpu-64core", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(not r["energy_included"] and r["priced_differs_from_measured"] for r in out["runs"])
    assert main(["project", "--db", sqlite_url, "--daily-tokens", "1e6", "--peak-factor", "1", "--p95-tpot-sla-ms",
                 "5000", "--gpu", "cpu-64core", "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["assumptions"]
    assert a["energy_left_out_other_hardware"] and a["energy_left_out_source"] == "measured", a  # RAPL: measured
    assert main(["cost", "--db", sqlite_url, "--gpu", "cpu-2core", "--json"]) == 0  # its own entry: the same
    out = json.loads(capsys.readouterr().out)
    assert all(r["energy_included"] and not r["priced_differs_from_measured"] for r in out["runs"])


def test_cost_and_project_agree_on_energy_under_another_price(filled, capsys):
    """One rule for both: --gpu NAME of other hardware leaves the energy measured on this device out (cost added
    it, project dropped it), and says so; a custom --node-hourly-usd is the measured hardware's price, so the
    energy stays in (project dropped it and said 'measured on ...', cost kept it)."""
    assert main(["cost", "--db", filled, "--gpu", "H100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for item in out["runs"] + out["modes"]:
        assert item["energy_included"] is False and item["energy_usd_per_1m"] is None
        # the runs' power was estimated (`filled`): their energy is not called measured
        assert item["reason"] == "estimated energy left out: priced as other hardware than measured"
    assert all(r["priced_differs_from_measured"] for r in out["runs"])
    assert main([*_project(filled, "--gpu", "H100"), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["assumptions"]
    assert a["priced_differs_from_measured"] and a["energy_left_out_other_hardware"]
    assert a["energy_left_out_source"] == "estimated"  # where the energy left out came from (`filled`: estimated)
    assert not a["energy_included_ar"] and not a["energy_included_spec"]
    assert main(_project(filled, "--gpu", "H100")) == 0
    assert "measured on cpu (2 cores); the energy estimated there is not that hardware's: left out (node price " \
           "only)" in capsys.readouterr().out

    # the catalog's own price given as a custom one: the same figures as the catalog price, energy included
    assert main(["cost", "--db", filled, "--json", "--node-hourly-usd", "0.0832"]) == 0
    custom = json.loads(capsys.readouterr().out)
    assert main(["cost", "--db", filled, "--json"]) == 0
    catalog = json.loads(capsys.readouterr().out)
    for got, want in zip(custom["modes"], catalog["modes"], strict=True):
        assert got["energy_included"] is True and got["total_usd_per_1m"] == pytest.approx(want["total_usd_per_1m"])
    assert not any(r["priced_differs_from_measured"] for r in custom["runs"])
    assert main([*_project(filled, "--node-hourly-usd", "0.0832"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert main([*_project(filled), "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert got["assumptions"]["energy_included_ar"] and got["assumptions"]["energy_included_spec"]
    assert got["assumptions"]["energy_left_out_source"] is None  # nothing left out
    assert not got["assumptions"]["priced_differs_from_measured"]
    assert got["cost_per_1m_tokens_ar_usd"] == pytest.approx(want["cost_per_1m_tokens_ar_usd"])
    assert main(_project(filled, "--node-hourly-usd", "0.0832")) == 0
    text = capsys.readouterr().out
    assert "measured on" not in text and "incl. energy (estimated)" in text
    assert "a custom price is taken as the measured hardware's price per node-hour" in text


def test_target_by_its_name_selects_every_folder_of_that_model(db_url, capsys):
    """Runs record the target's path on their own node (~/.cache/specfinops/models/x here, /models/x there), while
    `models list`, `invocations` and the pages show the name: `--target x` found no runs. A bare name now selects
    every folder of that name (and only that name: not m10, not a LIKE wildcard); a path only itself."""
    engine = open_store(db_url)
    with Session(engine) as s:
        for target in ("/root/.cache/specfinops/models/m_1", "/models/m_1", "/models/m_10", "/models/mx1",
                       "/models/M_1"):  # another model on a case-sensitive file system: not m_1 (SQLite's LIKE)
            make_run(s, "spec", target=target, requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500)])
        s.commit()
    engine.dispose()

    def runs(*argv: str) -> list[int]:
        assert main(["cost", "--db", db_url, "--json", *argv]) == 0
        return sorted(r["run_id"] for r in json.loads(capsys.readouterr().out)["runs"])

    assert runs("--target", "m_1") == [1, 2]
    assert runs("--target", "M_1") == [5]
    assert runs("--target", "/models/m_1") == [2]
    assert runs("--target", "/models/m_1/") == [2]
    assert main(["cost", "--db", db_url, "--target", "m"]) == 2
    assert "no runs with target 'm' (targets in the store: /models/M_1, /models/m_1, /models/m_10," \
        in capsys.readouterr().err
    assert main(["export", "--db", db_url, "--what", "cost", "--out", "-", "--target", "m_1", "--run", "2"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2  # header + run 2
    assert main(["export", "--db", db_url, "--what", "cost", "--out", "-", "--target", "m_1", "--run", "3"]) == 0
    assert "run 3 does not match the selection" in capsys.readouterr().err


def test_a_run_without_output_tokens_has_no_energy_figure_not_an_unmeasured_one(sqlite_url, capsys):
    """A spec run cancelled before its first token, recorded with estimated power, read 'energy not measured':
    its power was measured (estimated); there are no tokens to spread it over."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        make_run(s, "spec", power_source="estimate", status="cancelled", power_w=[50.0, 50.0],
                 requests=[Req(0, ttft_ms=None, e2e_ms=None, status="cancelled")])
        s.commit()
    assert main(["cost", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert "spec  run 2: 0 tokens, n/a tokens/s, hardware n/a + energy n/a = n/a (no output tokens)" in out, out
    assert "energy not measured = $" in out  # the AR run, which measured no power, still says so


def test_a_run_without_a_span_reads_its_energy_na_not_unmeasured(sqlite_url, capsys):
    """A metered run whose one request has no duration: its energy was measured (1 J), only its hours cannot
    be priced; the table said "not measured"."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", power_source="nvml", requests=[Req(5, ttft_ms=0, e2e_ms=0, energy_j=1.0)])
        s.commit()
    assert main(["cost", "--db", sqlite_url]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("1 ")]
    assert row and "n/a (wall unknown)" in row[0] and "not measured" not in row[0], row


def test_project_with_db_ignores_a_malformed_database_variable(filled, monkeypatch, capsys):
    """--db beats SPECFINOPS_DB_URL: a malformed variable failed `project --db X` all the same ("SPECFINOPS_DB_URL:
    the port must be ..."), read while the projection's bench hint was written; that hint now names --db X."""
    monkeypatch.setenv("SPECFINOPS_DB_URL", "postgresql://h:abc/x")
    assert main(_project(filled, "--node-hourly-usd", "2.5")) == 0
    out = capsys.readouterr()
    assert "SPECFINOPS_DB_URL" not in out.err, out.err


def test_an_unknown_gpu_lists_only_the_hourly_prices_it_takes(filled, tmp_path, capsys):
    """`project --gpu h10` listed "known: ..., electricity, ..., pue", names --gpu then refuses ("names the pue
    price (ratio), not an hourly GPU or node price"): `cost`, `project` and `report` list the GPU and node
    entries only, a user's among them; an energy entry named is refused as before."""
    assert main(["prices", "set", "my-node", "12", "--kind", "node", "--source", "TCO", "--db", filled]) == 0
    capsys.readouterr()
    project = ["project", "--daily-tokens", "5e8", "--peak-factor", "2", "--sla-ms", "50"]
    report = ["report", "--period", "daily", "--out", str(tmp_path / "reports")]
    for argv in (["cost"], project, report):
        assert main([*argv, "--gpu", "h10", "--db", filled]) == 2
        [err] = capsys.readouterr().err.strip().splitlines()
        assert "--gpu: unknown price name 'h10'; known: A100-80GB" in err, err
        known = err.split("known: ", 1)[1].split(", ")
        assert "H100" in known and "cpu-2core" in known and "my-node" in known, err
        assert "electricity" not in known and "pue" not in known, err
        assert main([*argv, "--gpu", "pue", "--db", filled]) == 2
        assert "--gpu 'pue' names the pue price (ratio), not an hourly GPU or node price" in capsys.readouterr().err


def test_project_says_why_a_fleet_cost_is_missing_not_what_it_would_hold(filled, capsys, tmp_path):
    """A missing fleet cost read "AR n/a (node price only)": an inclusion label on nothing. It now says why it is
    missing: no run meets the SLA, or no runs of the mode."""
    # AR's p95 TPOT (48.75 ms) misses a 20 ms SLA; spec's (12.5 ms) meets it
    assert main(_project(filled, "--p95-tpot-sla-ms", "20")) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("fleet cost per 1M"))
    assert "AR n/a (not attainable: no AR run meets the SLA), spec $" in line, line
    assert "n/a (node price only)" not in line and "n/a (incl." not in line, line
    # a store of AR runs only
    url = f"sqlite:///{tmp_path / 'ar_only.db'}"
    engine = open_store(url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(33, ttft_ms=100, e2e_ms=900, start_s=0.0)])
        s.commit()
    engine.dispose()
    assert main(_project(url, "--node-hourly-usd", "2.5")) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("fleet cost per 1M"))
    assert line.endswith("(node price only), spec n/a (not measured: no spec runs in view)"), line


def _failed_at_the_end(url: str) -> None:
    """AR run 1: two 3 s requests (0-3.1 s, 3.2-6.3 s, 202 tokens) and one that failed after 60 s (7-67 s), and one
    that failed inside the span (1-2 s: adds nothing); spec run 2: two 1 s requests, no failure."""
    engine = open_store(url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[
            Req(101, ttft_ms=100, e2e_ms=3100, start_s=0.0),
            Req(101, ttft_ms=100, e2e_ms=3100, start_s=3.2),
            Req(0, ttft_ms=None, e2e_ms=1000, start_s=1.0, status="error"),
            Req(0, ttft_ms=None, e2e_ms=60000, start_s=7.0, status="error"),
        ])
        make_run(s, "spec", requests=[spec_req(101, 4, 60, ttft_ms=100, e2e_ms=1100, start_s=0.0),
                                      spec_req(101, 4, 60, ttft_ms=100, e2e_ms=1100, start_s=1.2)])
        s.commit()
    engine.dispose()


def test_project_warns_where_failed_requests_stretch_a_configurations_span(db_url, capsys):
    """A timed-out request at the end of a run stretches its span (6.3 s -> 67 s) and so lowers its tokens/s and
    the capacity `project` sizes on (3.0 instead of 32 tokens/s). The span counts it on purpose (the node was
    paid), but `project` now says so, naming the run and the seconds its failures add."""
    from telemetry.queries import failed_span_s

    url = db_url  # SQLite and PostgreSQL
    _failed_at_the_end(url)
    assert failed_span_s(open_store(url), Filters(), [1, 2]) == {1: (67.0, 6.3)}
    args = ["--daily-tokens", "1e9", "--peak-factor", "2", "--p95-tpot-sla-ms", "1000", "--node-hourly-usd", "2"]
    assert main(["project", "--db", url, *args]) == 0
    out = capsys.readouterr().out
    assert out.count("warning: failed or cancelled requests") == 1, out  # AR's, not spec's
    assert ("warning: failed or cancelled requests of the AR configuration of run 1 (concurrency 1) add 60.7 s to its "
            "67.0 s of wall time (91%): its measured 3.01 tokens/s, and the capacity taken from it, count that time, "
            "as the node was paid for it, 32.1 tokens/s over its ok requests' span alone") in out, out
    assert "capacity per node at the SLA: AR 3.0 tokens/s (run 1)" in out  # the arithmetic is unchanged
    assert main(["project", "--db", url, *args, "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["assumptions"]["notes"]
    assert sum(n.startswith("failed or cancelled requests of the AR configuration of run 1") for n in notes) == 1


def test_project_says_nothing_of_failures_that_add_little_to_a_span(tmp_path, capsys):
    """A failed request inside the span (or one adding under 10% to it) changes no capacity: no warning."""
    url = f"sqlite:///{tmp_path / 'inside.db'}"
    engine = open_store(url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(101, ttft_ms=100, e2e_ms=3100, start_s=0.0),
                                    Req(101, ttft_ms=100, e2e_ms=3100, start_s=3.2),
                                    Req(0, ttft_ms=None, e2e_ms=1000, start_s=1.0, status="error"),
                                    Req(0, ttft_ms=None, e2e_ms=600, start_s=6.0, status="cancelled")])  # +0.3 s
        make_run(s, "spec", requests=[spec_req(101, 4, 60, ttft_ms=100, e2e_ms=1100, start_s=0.0)])
        s.commit()
    assert main(["project", "--db", url, "--daily-tokens", "1e9", "--peak-factor", "2", "--p95-tpot-sla-ms", "1000",
                 "--node-hourly-usd", "2"]) == 0
    out = capsys.readouterr().out
    assert "failed or cancelled requests" not in out, out


class _CountingConnection:
    """A connection that hands back each result as a list and counts the rows it read into Python."""

    def __init__(self, c):
        self.c, self.rows = c, 0

    def execute(self, *args, **kwargs):
        rows = list(self.c.execute(*args, **kwargs))
        self.rows += len(rows)
        return rows


def test_failed_span_s_computes_both_spans_in_sql(db_url, monkeypatch):
    """failed_span_s read every request of a run with a timed failure into Python (on a 500k store `project` took
    9 s -> 15 s, +57 MB); both spans are SQL's now (`_spans`, the second over the ok requests), with the same
    figures: a few rows a run come back, not its requests."""
    from contextlib import contextmanager

    import telemetry.queries as queries

    engine = open_store(db_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[*(Req(11, ttft_ms=100, e2e_ms=1100, start_s=0.5 * i) for i in range(60)),
                                    Req(0, ttft_ms=None, e2e_ms=1000, start_s=3.0, status="error"),
                                    Req(0, ttft_ms=None, e2e_ms=60000, start_s=40.0, status="cancelled")])
        s.commit()
    real, opened = queries.read_snapshot, []

    @contextmanager
    def counting(e):
        with real(e) as c:
            opened.append(_CountingConnection(c))
            yield opened[-1]

    monkeypatch.setattr(queries, "read_snapshot", counting)
    assert queries.failed_span_s(engine, Filters(), [1]) == {1: (100.0, 30.6)}  # 0-100 s, ok 0-30.6 s
    assert sum(c.rows for c in opened) <= 6, [c.rows for c in opened]
    engine.dispose()


def test_failed_span_s_keeps_its_figures(db_url):
    from telemetry.queries import failed_span_s

    _failed_at_the_end(db_url)
    engine = open_store(db_url)
    assert failed_span_s(engine, Filters(), [1, 2]) == {1: (67.0, 6.3)}
    assert failed_span_s(engine, Filters(mode="spec"), [1, 2]) == {}
    engine.dispose()


def test_project_says_nothing_of_a_run_with_only_failed_requests(db_url, capsys):
    """A run of a configuration with no ok tokens (a lone timeout, 30 s) adds no wall time to the pooled figure
    (`_pool` leaves it out: 10 s over run 1), so its failure stretches nothing; `project` warned it added 30 s
    (300%)."""
    from datetime import timedelta

    from synthetic import BASE_TIME

    from telemetry.queries import failed_span_s

    engine = open_store(db_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(500, ttft_ms=100, e2e_ms=10000, start_s=0.0)])
        make_run(s, "ar", started_at=BASE_TIME + timedelta(hours=1),
                 requests=[Req(0, ttft_ms=None, e2e_ms=30000, start_s=0.0, status="error")])
        make_run(s, "spec", requests=[spec_req(101, 4, 60, ttft_ms=100, e2e_ms=1100, start_s=0.0)])
        s.commit()
    assert failed_span_s(engine, Filters(), [1, 2, 3]) == {}
    engine.dispose()
    assert main(["project", "--db", db_url, "--daily-tokens", "1e9", "--peak-factor", "2", "--p95-tpot-sla-ms",
                 "1000", "--node-hourly-usd", "2"]) == 0
    out = capsys.readouterr().out
    assert "failed or cancelled requests" not in out, out


def test_failed_span_caveat_says_nothing_under_a_domain_filter(db_url):
    """Under a domain filter a run's wall time is the domain's share of its time (`_Share`: 10 s of code here), but
    the caveat took the raw span difference (20 s - 10 s) and said the failure added 100%: no figure rather than a
    wrong one. A time window keeps it."""
    from datetime import timedelta

    from synthetic import BASE_TIME

    from telemetry.costing import project_from_store
    from telemetry.queries import failed_span_s

    engine = open_store(db_url)
    with Session(engine) as s:
        make_run(s, "ar", concurrency=2, requests=[
            Req(500, ttft_ms=100, e2e_ms=10000, start_s=0.0, domain="code"),
            Req(500, ttft_ms=100, e2e_ms=10000, start_s=0.0, domain="chat"),
            Req(500, ttft_ms=100, e2e_ms=10000, start_s=10.0, domain="chat"),
            Req(0, ttft_ms=None, e2e_ms=10000, start_s=10.0, domain="code", status="error")])
        make_run(s, "spec", concurrency=2, requests=[spec_req(101, 4, 60, ttft_ms=100, e2e_ms=1100, start_s=0.0,
                                                              domain="code")])
        s.commit()
    assert failed_span_s(engine, Filters(domain="code"), [1, 2]) == {}
    assert failed_span_s(engine, Filters(prompt_ids=("p0",)), [1, 2]) == {}
    projected = project_from_store(engine, Filters(domain="code"), daily_tokens=1e9, peak_factor=2, sla_ms=1000,
                                   node_hourly_usd=2)
    assert not [c for c in projected.caveats if "failed or cancelled" in c], projected.caveats
    assert failed_span_s(engine, Filters(), [1, 2]) == {1: (20.0, 20.0)}  # in the middle: adds nothing
    late = Filters(since=BASE_TIME + timedelta(seconds=5))
    assert failed_span_s(engine, late, [1, 2]) == {1: (10.0, 10.0)}
    engine.dispose()


def _failed_beside_the_capacity(url: str) -> None:
    """AR at concurrency 1: 101 tokens at ~30 ms TPOT, no failure (run 1); AR at concurrency 4: ~300 ms TPOT and a
    60 s failed request after its ok one (run 2); spec run 3."""
    from datetime import timedelta

    from synthetic import BASE_TIME

    engine = open_store(url)
    with Session(engine) as s:
        make_run(s, "ar", concurrency=1, requests=[Req(101, ttft_ms=100, e2e_ms=3100, start_s=0.0)])
        make_run(s, "ar", concurrency=4, started_at=BASE_TIME + timedelta(hours=1), requests=[
            Req(101, ttft_ms=100, e2e_ms=30100, start_s=0.0),
            Req(0, ttft_ms=None, e2e_ms=60000, start_s=31.0, status="error")])
        make_run(s, "spec", concurrency=1, requests=[spec_req(101, 4, 60, ttft_ms=100, e2e_ms=1100, start_s=0.0)])
        s.commit()
    engine.dispose()


def test_project_warns_of_failures_only_where_a_capacity_could_come_from(db_url, capsys):
    """The caveat was given for every configuration of the compared group, one missing the SLA (no capacity can
    come from it) included, and said 'the capacity taken from it' of each. Now: only configurations meeting the
    SLA, and that phrase only for the one the capacity comes from."""
    _failed_beside_the_capacity(db_url)
    args = ["--daily-tokens", "1e9", "--peak-factor", "2", "--node-hourly-usd", "2"]
    assert main(["project", "--db", db_url, *args, "--p95-tpot-sla-ms", "100"]) == 0  # concurrency 4 misses it
    out = capsys.readouterr().out
    assert "capacity per node at the SLA: AR 32.6 tokens/s (run 1)" in out, out
    assert "failed or cancelled requests" not in out, out
    assert main(["project", "--db", db_url, *args, "--p95-tpot-sla-ms", "1000"]) == 0  # both meet; run 1 is faster
    out = capsys.readouterr().out
    assert "capacity per node at the SLA: AR 32.6 tokens/s (run 1)" in out, out
    said = [ln for ln in out.splitlines() if "failed or cancelled requests" in ln]
    assert len(said) == 1 and said[0].startswith(
        "warning: failed or cancelled requests of the AR configuration of run 2 (concurrency 4) add 60.9 s to its "
        "91.0 s of wall time (67%): its measured 1.11 tokens/s counts that time, as the node was paid for it, "
        "3.36 tokens/s over its ok requests' span alone"), said
    assert "capacity taken from it" not in said[0]
